package dedup

import (
	"reflect"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// acked is an event of lsn acknowledged in topic at part/off.
func acked(topic string, part int32, off int64, lsn pglogrepl.LSN) (sink.Message, sink.Stored) {
	return sink.Message{Topic: topic, Event: &outbox.Event{CommitLSN: lsn}}, sink.Stored{Partition: part, Offset: off}
}

func TestLedger(t *testing.T) {
	type ack struct {
		part int32
		off  int64
		lsn  pglogrepl.LSN
	}
	tests := []struct {
		name     string
		stored   checkpoint.Offsets
		register []int64 // ends of topic "t" before the acks; nil: not registered
		acks     []ack
		at       pglogrepl.LSN // At and Covered are asked at this LSN
		want     map[int32]int64
		wantNone bool // no entry for "t"
	}{
		{
			name: "offsets after the last event before the lsn", register: []int64{10, 20},
			acks: []ack{{0, 10, 100}, {0, 11, 100}, {1, 20, 100}, {0, 12, 200}, {1, 21, 300}},
			at:   250, want: map[int32]int64{0: 13, 1: 21},
		},
		{
			name: "a transaction ending exactly at the lsn is not covered by its own commit lsn", register: []int64{0},
			acks: []ack{{0, 0, 100}, {0, 1, 200}},
			at:   200, want: map[int32]int64{0: 1},
		},
		{
			name: "nothing acked keeps the registered ends", register: []int64{5, 6, 7},
			at: 1000, want: map[int32]int64{0: 5, 1: 6, 2: 7},
		},
		{
			name: "stored offsets are the start", stored: checkpoint.Offsets{"t": {Partitions: 2, Next: map[int32]int64{0: 40, 1: 50}}},
			acks: []ack{{1, 50, 500}},
			at:   600, want: map[int32]int64{0: 40, 1: 51},
		},
		{
			name: "an offset never goes back", register: []int64{0},
			acks: []ack{{0, 9, 100}, {0, 3, 200}},
			at:   300, want: map[int32]int64{0: 10},
		},
		{
			name: "an older transaction after a newer one merges forward", register: []int64{0},
			acks: []ack{{0, 4, 200}, {0, 7, 100}},
			at:   150, want: map[int32]int64{0: 0},
		},
		{
			name: "unknown offsets are ignored", register: []int64{3},
			acks: []ack{{0, -1, 100}},
			at:   200, want: map[int32]int64{0: 3},
		},
		{
			name: "a topic never registered is not stored", acks: []ack{{0, 1, 100}},
			at: 200, wantNone: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, mode := range []string{"At", "Covered"} {
				l := NewLedger(tc.stored)
				if tc.register != nil {
					l.Register("t", tc.register)
				}
				for _, a := range tc.acks {
					l.Acked(acked("t", a.part, a.off, a.lsn))
				}
				var got checkpoint.Offsets
				if mode == "At" {
					got = l.At(tc.at)
				} else {
					got = l.Covered(tc.at)
				}
				to, ok := got["t"]
				if tc.wantNone {
					if ok {
						t.Fatalf("%s(%s) = %v, want no entry for t", mode, tc.at, to)
					}
					continue
				}
				if !ok || !reflect.DeepEqual(to.Next, tc.want) {
					t.Fatalf("%s(%s) = %v, want %v", mode, tc.at, to.Next, tc.want)
				}
				if to.Partitions != len(tc.want) {
					t.Fatalf("%s: partitions = %d, want %d", mode, to.Partitions, len(tc.want))
				}
			}
		})
	}
}

// Covered forgets what it covered, At does not; and what either returns is a
// copy the caller may keep.
func TestLedgerCoveredForgets(t *testing.T) {
	l := NewLedger(nil)
	l.Register("t", []int64{0})
	l.Acked(acked("t", 0, 0, 100))
	l.Acked(acked("t", 0, 1, 200))
	before := l.At(150)
	if got := before["t"].Next[0]; got != 1 {
		t.Fatalf("At(150) = %d, want 1", got)
	}
	before["t"].Next[0] = 99 // must not reach the ledger
	if got := l.Covered(150)["t"].Next[0]; got != 1 {
		t.Fatalf("Covered(150) = %d, want 1", got)
	}
	if got := l.At(250)["t"].Next[0]; got != 2 {
		t.Fatalf("At(250) after Covered(150) = %d, want 2", got)
	}
	if got := l.Covered(250)["t"].Next[0]; got != 2 {
		t.Fatalf("Covered(250) = %d, want 2", got)
	}
	if n := len(l.parts[tp{"t", 0}].entries); n != 0 {
		t.Fatalf("%d entries left after Covered past all of them", n)
	}
	// Registering a topic again (its partition count changed) starts it over.
	l.Register("t", []int64{5, 6, 7})
	if got := l.At(0)["t"]; got.Partitions != 3 || got.Next[2] != 7 {
		t.Fatalf("after re-register: %+v", got)
	}
}
