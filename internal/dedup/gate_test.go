package dedup

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

var us = outbox.NewOrigin("7312345678901234567", 1, "cdc_relay")

// written is a record a test puts in Kafka before the gate reads it.
type written struct {
	part   int32
	id     string
	origin *outbox.Origin // nil: no source position header
	lsn    pglogrepl.LSN
	index  uint32
	noID   bool // no id header
}

func (w written) record(topic string) *kgo.Record {
	r := &kgo.Record{Topic: topic, Partition: w.part, Value: []byte(w.id)}
	if !w.noID {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: sink.HeaderID, Value: []byte(w.id)})
	}
	if w.origin != nil {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: sink.HeaderSource, Value: w.origin.AppendPosition(nil, w.lsn, w.index)})
	}
	return r
}

// event is the message of an event the relay read from its stream (us).
func event(id string, lsn pglogrepl.LSN, index uint32) sink.Message {
	return sink.Message{Event: &outbox.Event{ID: []byte(id), CommitLSN: lsn, Index: index}, Origin: us}
}

// in is m routed to topic.
func in(topic string, m sink.Message) sink.Message {
	m.Topic = topic
	return m
}

// env is a broker with a topic of two partitions and a producer reading it.
type env struct {
	kafka  *sandbox.Kafka
	reader *sink.Kafka
	client *kgo.Client
}

func newEnv(t *testing.T, topics ...string) *env {
	t.Helper()
	k := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 2, Topics: topics})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := sink.Open(ctx, sink.Config{Brokers: k.Brokers(), Topics: topics})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	cl, err := kgo.NewClient(append(k.ClientOpts(), kgo.SeedBrokers(k.Brokers()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &env{kafka: k, reader: r, client: cl}
}

func (e *env) write(t *testing.T, topic string, ws ...written) {
	t.Helper()
	for _, w := range ws {
		if err := e.client.ProduceSync(context.Background(), w.record(topic)).FirstErr(); err != nil {
			t.Fatalf("write %+v: %v", w, err)
		}
	}
}

// gate returns a gate over stored offsets, and a count of its Persist calls.
func (e *env) gate(stored checkpoint.Offsets, hadOffsets bool) (*Gate, *metrics.Metrics, *int) {
	m := metrics.Discard()
	persisted := new(int)
	g := NewGate(GateConfig{
		Reader: e.reader, Ledger: NewLedger(stored), Origin: us, Stored: hadOffsets, Metrics: m,
		Persist: func(context.Context) error { *persisted++; return nil },
	})
	return g, m, persisted
}

func TestGateSkipsOnlyWhatIsVerifiablyOurs(t *testing.T) {
	const topic = "orders"
	e := newEnv(t, topic)
	other := outbox.NewOrigin("7312345678901234567", 1, "another_slot")
	restored := outbox.NewOrigin("7312345678901234567", 2, "cdc_relay") // a new timeline
	foreign := outbox.NewOrigin("1111111111111111111", 1, "cdc_relay")
	e.write(t, topic,
		written{part: 0, id: "before-stored-offset", origin: us, lsn: 0x500, index: 0}, // offset 0
		written{part: 0, id: "a", origin: us, lsn: 0x500, index: 0},                    // offset 1
		written{part: 0, id: "replayed-copy", lsn: 0x500, index: 1},                    // no position: a replay
		written{part: 0, id: "b", origin: us, lsn: 0x500, index: 1},
		written{part: 1, id: "c", origin: us, lsn: 0x600, index: 0},
		written{part: 1, id: "other-slot", origin: other, lsn: 0x600, index: 1},
		written{part: 1, id: "other-timeline", origin: restored, lsn: 0x600, index: 2},
		written{part: 1, id: "other-db", origin: foreign, lsn: 0x600, index: 3},
		written{part: 1, id: "reused-lsn-new-id", origin: us, lsn: 0x700, index: 0},
		written{part: 1, id: "before-start", origin: us, lsn: 0x100, index: 0},
		written{part: 1, id: "past-cutoff", origin: us, lsn: 0x900, index: 0},
	)
	stored := checkpoint.Offsets{topic: {Partitions: 2, Next: map[int32]int64{0: 1, 1: 0}}}
	g, m, persisted := e.gate(stored, true)
	ctx := context.Background()
	sum, err := g.Arm(ctx, 0x400, 0x800, []string{topic})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Partitions != 2 || sum.Found != 4 {
		// a, b, c and reused-lsn-new-id; "before-stored-offset" is not read,
		// other-slot, other-timeline and other-db are of other origins,
		// before-start and past-cutoff outside the replay.
		t.Fatalf("Arm found %d records in %d partitions, want 4 in 2: %+v", sum.Found, sum.Partitions, sum)
	}
	if *persisted != 0 {
		t.Fatalf("a topic with fitting stored offsets was persisted again (%d)", *persisted)
	}
	tests := []struct {
		ev       sink.Message
		present  bool
		part     int32
		offset   int64
		scenario string
	}{
		{event("a", 0x500, 0), true, 0, 1, "our record after the stored offset"},
		{event("a", 0x500, 0), false, 0, 0, "the same event a second time (found once, skipped once)"},
		{event("b", 0x500, 1), true, 0, 3, "our record after a replay's copy"},
		{event("c", 0x600, 0), true, 1, 0, "another partition"},
		{event("other-slot", 0x600, 1), false, 0, 0, "same database, another slot"},
		{event("other-timeline", 0x600, 2), false, 0, 0, "a database restored onto a new timeline"},
		{event("other-db", 0x600, 3), false, 0, 0, "another database"},
		{event("new-id", 0x700, 0), false, 0, 0, "same position, another id (LSNs reused after a restore)"},
		{event("replayed-copy", 0x500, 2), false, 0, 0, "only a replay's copy is in Kafka"},
		{event("never-sent", 0x750, 0), false, 0, 0, "not in Kafka"},
		{event("past-cutoff", 0x900, 0), false, 0, 0, "committed after the cutoff: never checked"},
		{event("reused-lsn-new-id", 0x700, 0), false, 0, 0, "after the cutoff the gate is disarmed"},
	}
	for _, tc := range tests {
		at, got, err := g.Check(ctx, in(topic, tc.ev))
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.present {
			t.Fatalf("%s: Check(%s) = %v, want %v", tc.scenario, tc.ev.Event.ID, got, tc.present)
		}
		if got && (at.Partition != tc.part || at.Offset != tc.offset) {
			t.Fatalf("%s: found at %d/%d, want %d/%d", tc.scenario, at.Partition, at.Offset, tc.part, tc.offset)
		}
	}
	if n := testutil.ToFloat64(m.DuplicatesSuppressed); n != 3 {
		t.Fatalf("duplicates suppressed = %v, want 3", n)
	}
}

func TestGateFallsBackToSending(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name       string
		stored     func(topic string) checkpoint.Offsets
		hadOffsets bool
		reason     string // counted fallback; "" none
		persist    bool   // the topic's offsets are registered and persisted
	}{
		{
			name:   "a topic never written registers its ends first",
			stored: func(string) checkpoint.Offsets { return checkpoint.Offsets{} }, hadOffsets: true, persist: true,
		},
		{
			name:   "a checkpoint without offsets (at-least-once before)",
			stored: func(string) checkpoint.Offsets { return nil }, reason: "no_stored_offsets", persist: true,
		},
		{
			name: "partitions added while the relay was down",
			stored: func(topic string) checkpoint.Offsets {
				return checkpoint.Offsets{topic: {Partitions: 1, Next: map[int32]int64{0: 0}}}
			},
			hadOffsets: true, reason: "partitions_changed", persist: true,
		},
		{
			name: "a partition re-created while the relay was down",
			stored: func(topic string) checkpoint.Offsets {
				return checkpoint.Offsets{topic: {Partitions: 2, Next: map[int32]int64{0: 1000, 1: 0}}}
			},
			hadOffsets: true, reason: "partition_reset",
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			topic := fmt.Sprintf("fallback%d", i)
			e := newEnv(t, topic)
			e.write(t, topic, written{part: 0, id: "x", origin: us, lsn: 0x500, index: 0})
			g, m, persisted := e.gate(tc.stored(topic), tc.hadOffsets)
			if _, err := g.Arm(ctx, 0x400, 0x800, []string{topic}); err != nil {
				t.Fatal(err)
			}
			_, present, err := g.Check(ctx, in(topic, event("x", 0x500, 0)))
			if err != nil {
				t.Fatal(err)
			}
			if present {
				t.Fatal("an event was skipped although the gate could not trust the offsets")
			}
			if tc.reason != "" {
				if n := testutil.ToFloat64(m.DeliveryFallbacks.WithLabelValues(tc.reason)); n < 1 {
					t.Fatalf("fallback %q not counted", tc.reason)
				}
			}
			if tc.persist != (*persisted > 0) {
				t.Fatalf("persisted %d times, want persist=%v", *persisted, tc.persist)
			}
			if tc.persist {
				at := g.cfg.Ledger.At(0x400)[topic]
				if at.Partitions != 2 || at.Next[0] != 1 || at.Next[1] != 0 {
					t.Fatalf("registered offsets %+v, want the partitions' ends {0:1 1:0}", at)
				}
			}
		})
	}
}

// A topic first used after the replay (a template routing to it) is
// registered before the relay writes to it, but not read.
func TestGateRegistersTopicsFirstUsedLater(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "first", "later")
	e.write(t, "later", written{part: 1, id: "y", origin: us, lsn: 0x900, index: 0})
	g, _, persisted := e.gate(checkpoint.Offsets{}, true)
	if _, err := g.Arm(ctx, 0x400, 0x800, nil); err != nil {
		t.Fatal(err)
	}
	if _, present, err := g.Check(ctx, in("first", event("z", 0x850, 0))); err != nil || present {
		t.Fatalf("Check past the cutoff = %v, %v", present, err)
	}
	if _, present, err := g.Check(ctx, in("later", event("y", 0x900, 0))); err != nil || present {
		t.Fatalf("Check past the cutoff = %v, %v", present, err)
	}
	if *persisted != 2 {
		t.Fatalf("persisted %d times, want once per new topic (2)", *persisted)
	}
	if got := g.cfg.Ledger.At(0)["later"]; got.Partitions != 2 || got.Next[1] != 1 {
		t.Fatalf("offsets of topic later = %+v, want its ends", got)
	}
	// Seen again: nothing more to do.
	if _, _, err := g.Check(ctx, in("first", event("z2", 0x860, 0))); err != nil || *persisted != 2 {
		t.Fatalf("a prepared topic was prepared again (%d persists, err %v)", *persisted, err)
	}
}

// A run that started from a checkpoint without offsets registers each topic
// on first use; a reconnect later finds them in the ledger and counts no
// further no_stored_offsets fallback.
func TestGateNoStoredOffsetsOncePerTopic(t *testing.T) {
	ctx := context.Background()
	const topic = "once"
	e := newEnv(t, topic)
	g, m, persisted := e.gate(nil, false)
	for arm := 1; arm <= 2; arm++ {
		if _, err := g.Arm(ctx, 0x400, 0x800, []string{topic}); err != nil {
			t.Fatal(err)
		}
		if _, present, err := g.Check(ctx, in(topic, event("x", 0x500, 0))); err != nil || present {
			t.Fatalf("arm %d: Check = %v, %v", arm, present, err)
		}
	}
	if n := testutil.ToFloat64(m.DeliveryFallbacks.WithLabelValues("no_stored_offsets")); n != 1 {
		t.Fatalf("no_stored_offsets counted %v times over two arms, want 1", n)
	}
	if *persisted != 1 {
		t.Fatalf("persisted %d times, want once (the topic's first use)", *persisted)
	}
}
