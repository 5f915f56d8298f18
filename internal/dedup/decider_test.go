package dedup

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// TestDeciderRule runs the one rule of invariant 8 through both paths that
// ask it, on the same records: start-up reconciliation (a Gate armed for a
// replay of [0x400, 0x800), reading partition 0 from the stored offset) and a
// batch of unknown fate (Decider.Verify, reading partition 0 from the end of
// the last acknowledged batch, as the sink does). Records in before are
// written ahead of where each path reads; records in read are where it reads.
func TestDeciderRule(t *testing.T) {
	const start, cutoff = pglogrepl.LSN(0x400), pglogrepl.LSN(0x800)
	otherSlot := outbox.NewOrigin(us.SystemID, us.Timeline, "another_slot")
	otherDB := outbox.NewOrigin("1111111111111111111", us.Timeline, us.Slot)
	otherTimeline := outbox.NewOrigin(us.SystemID, us.Timeline+1, us.Slot) // restored onto a new timeline
	sameAsUs := outbox.NewOrigin(us.SystemID, us.Timeline, us.Slot)        // another value, the same stream
	type ev struct {
		id    string
		lsn   pglogrepl.LSN
		index uint32
		bare  bool           // not read from the stream: no Origin
		as    *outbox.Origin // its Origin, when not us
	}
	tests := []struct {
		name   string
		before []written // ahead of where both paths read
		read   []written // where both paths read (partition 0, from offset len(before))
		evs    []ev      // replayed events / the batch of unknown fate, in order
		// startup is Gate.Check's answer for each event; fate is Verify's
		// for the batch; at is the offset of the first event's record
		// when found (by Check, when startup[0]; by Verify, when held).
		startup []bool
		fate    sink.Fate
		at      int64
	}{
		{
			name:    "same id and same position: already in Kafka",
			read:    []written{{id: "a", origin: us, lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500}},
			startup: []bool{true}, fate: sink.FateHeld, at: 0,
		},
		{
			name:    "the same stream given as another Origin value",
			read:    []written{{id: "a", origin: us, lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500, as: sameAsUs}},
			startup: []bool{true}, fate: sink.FateHeld, at: 0,
		},
		{
			name:    "found after other records",
			read:    []written{{id: "x", lsn: 0x500}, {id: "y", origin: us, lsn: 0x480, index: 2}, {id: "a", origin: us, lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500}},
			startup: []bool{true}, fate: sink.FateHeld, at: 2,
		},
		{
			name:    "two copies: the first is where the event is",
			read:    []written{{id: "a", origin: us, lsn: 0x500, index: 1}, {id: "a", origin: us, lsn: 0x500, index: 1}},
			evs:     []ev{{id: "a", lsn: 0x500, index: 1}},
			startup: []bool{true}, fate: sink.FateHeld, at: 0,
		},
		{
			name:    "a whole batch, appended whole",
			read:    []written{{id: "a", origin: us, lsn: 0x500, index: 0}, {id: "b", origin: us, lsn: 0x500, index: 1}, {id: "c", origin: us, lsn: 0x600, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500}, {id: "b", lsn: 0x500, index: 1}, {id: "c", lsn: 0x600}},
			startup: []bool{true, true, true}, fate: sink.FateHeld, at: 0,
		},
		{
			name:    "part of a batch found: the batch cannot be proved",
			read:    []written{{id: "a", origin: us, lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500}, {id: "b", lsn: 0x500, index: 1}},
			startup: []bool{true, false}, fate: sink.FateUndecided, at: 0,
		},
		{
			name:    "same id at another position: a row re-inserted with its id",
			read:    []written{{id: "a", origin: us, lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x600, index: 0}},
			startup: []bool{false}, fate: sink.FateAbsent,
		},
		{
			name:    "same id at another index of the same transaction",
			read:    []written{{id: "a", origin: us, lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500, index: 1}},
			startup: []bool{false}, fate: sink.FateAbsent,
		},
		{
			name:    "same id without a source position: a replayed dead letter",
			read:    []written{{id: "a", lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500}},
			startup: []bool{false}, fate: sink.FateAbsent,
		},
		{
			name:    "same position without an id",
			read:    []written{{id: "a", noID: true, origin: us, lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500}},
			startup: []bool{false}, fate: sink.FateAbsent,
		},
		{
			name:    "same position, another id: LSNs reused after a restore",
			read:    []written{{id: "b", origin: us, lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500}},
			startup: []bool{false}, fate: sink.FateAbsent,
		},
		{
			name:    "another id first at the position, then the event",
			read:    []written{{id: "b", origin: us, lsn: 0x500, index: 0}, {id: "a", origin: us, lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500}},
			startup: []bool{true}, fate: sink.FateHeld, at: 1,
		},
		{
			name:    "another database (system identifier)",
			read:    []written{{id: "a", origin: otherDB, lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500}},
			startup: []bool{false}, fate: sink.FateAbsent,
		},
		{
			name:    "another slot of the same database",
			read:    []written{{id: "a", origin: otherSlot, lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500}},
			startup: []bool{false}, fate: sink.FateAbsent,
		},
		{
			name:    "another timeline of the same database",
			read:    []written{{id: "a", origin: otherTimeline, lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500}},
			startup: []bool{false}, fate: sink.FateAbsent,
		},
		{
			name:    "an event not read from the stream (no Origin) is never proved",
			read:    []written{{id: "a", origin: us, lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500, bare: true}},
			startup: []bool{false}, fate: sink.FateUndecided,
		},
		{
			name:    "a batch with one event not read from the stream",
			read:    []written{{id: "a", origin: us, lsn: 0x500, index: 0}, {id: "b", origin: us, lsn: 0x500, index: 1}},
			evs:     []ev{{id: "a", lsn: 0x500}, {id: "b", lsn: 0x500, index: 1, bare: true}},
			startup: []bool{true, false}, fate: sink.FateUndecided, at: 0,
		},
		{
			name:    "nothing in the partition",
			evs:     []ev{{id: "a", lsn: 0x500}},
			startup: []bool{false}, fate: sink.FateAbsent,
		},
		{
			// Outside the offsets window: the record is before where the
			// relay's records of these events can start.
			name:    "the record is before where the path reads",
			before:  []written{{id: "a", origin: us, lsn: 0x500, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x500}},
			startup: []bool{false}, fate: sink.FateAbsent,
		},
		{
			// Outside the replay window: start-up reconciliation only
			// vouches for events of the replay [start, cutoff); a batch of
			// unknown fate is its own window.
			name:    "committed before the replay's start",
			read:    []written{{id: "a", origin: us, lsn: 0x100, index: 0}},
			evs:     []ev{{id: "a", lsn: 0x100}},
			startup: []bool{false}, fate: sink.FateHeld, at: 0,
		},
		{
			name:    "committed at the cutoff: never sent before this stream",
			read:    []written{{id: "a", origin: us, lsn: cutoff, index: 0}},
			evs:     []ev{{id: "a", lsn: cutoff}},
			startup: []bool{false}, fate: sink.FateHeld, at: 0,
		},
	}
	topics := make([]string, len(tests))
	for i := range tests {
		topics[i] = fmt.Sprintf("rule%d", i)
	}
	e := newEnv(t, topics...)
	for i, tc := range tests {
		topic := topics[i]
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.startup) != len(tc.evs) {
				t.Fatalf("the case lists %d start-up answers for %d events", len(tc.startup), len(tc.evs))
			}
			e.write(t, topic, tc.before...)
			e.write(t, topic, tc.read...)
			from := int64(len(tc.before))
			events := func() []sink.Message {
				msgs := make([]sink.Message, len(tc.evs))
				for i, x := range tc.evs {
					msgs[i] = in(topic, event(x.id, x.lsn, x.index))
					if x.as != nil {
						msgs[i].Origin = x.as
					}
					if x.bare {
						msgs[i].Origin = nil
					}
				}
				return msgs
			}
			ctx := context.Background()

			t.Run("start-up", func(t *testing.T) {
				g, _, _ := e.gate(checkpoint.Offsets{topic: {Partitions: 2, Next: map[int32]int64{0: from, 1: 0}}}, true)
				if _, err := g.Arm(ctx, start, cutoff, []string{topic}); err != nil {
					t.Fatal(err)
				}
				for i, m := range events() {
					ev := m.Event
					at, held, err := g.Check(ctx, m)
					if err != nil {
						t.Fatal(err)
					}
					if held != tc.startup[i] {
						t.Errorf("Check(%s at %s:%d) = %v, want %v", ev.ID, ev.CommitLSN, ev.Index, held, tc.startup[i])
					}
					if held && i == 0 && (at.Partition != 0 || at.Offset != from+tc.at) {
						t.Errorf("Check(%s) found it at %d/%d, want 0/%d", ev.ID, at.Partition, at.Offset, from+tc.at)
					}
				}
			})

			t.Run("unknown fate", func(t *testing.T) {
				scans := 0
				scan := func(ctx context.Context, fn func(offset int64, id, source []byte) error) error {
					scans++
					ranges, err := e.reader.Ranges(ctx, topic, 1)
					if err != nil {
						return err
					}
					return e.reader.Scan(ctx, topic, 0, from, ranges[0].End, fn)
				}
				v, err := Decider{}.Verify(ctx, events(), scan)
				if err != nil {
					t.Fatal(err)
				}
				if v.Fate != tc.fate {
					t.Errorf("Verify = fate %d, want %d (undecided %d, absent %d, held %d)",
						v.Fate, tc.fate, sink.FateUndecided, sink.FateAbsent, sink.FateHeld)
				}
				if v.Fate == sink.FateHeld && v.Offset != from+tc.at {
					t.Errorf("Verify found the batch at offset %d, want %d", v.Offset, from+tc.at)
				}
				if scans > 1 {
					t.Errorf("Verify read the partition %d times, want at most once", scans)
				}
			})
		})
	}
}

// TestDeciderVerifyReturnsScanErrors: a partition that cannot be read is no
// verdict; the sink reads again later.
func TestDeciderVerifyReturnsScanErrors(t *testing.T) {
	boom := fmt.Errorf("broker gone")
	_, err := Decider{}.Verify(context.Background(), []sink.Message{event("a", 0x500, 0)},
		func(context.Context, func(int64, []byte, []byte) error) error { return boom })
	if err != boom {
		t.Fatalf("Verify error = %v, want the scan's %v", err, boom)
	}
}
