package kgosink_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-relay/cdc-relay/bench/internal/kgosink"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestRecordLikeSink produces the same messages through sink.Kafka and the
// kgo producer, each to a topic of its own with seven partitions, and reads
// both back with a plain kgo consumer: each message is on the same
// partition (murmur2 of its key, or its target partition), with the same
// key, value (an empty payload non-null, a tombstone null) and headers, in
// the same order, null header values null; Done reports the same
// partitions and offsets. The record timestamp is compared where the event
// sets it (otherwise each producer stamps its own send time).
func TestRecordLikeSink(t *testing.T) {
	const viaSink, viaKgo = "like.sink", "like.kgo"
	b := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 7, Topics: []string{viaSink, viaKgo}})
	origin := outbox.NewOrigin("7301234567890123456", 1, "cdc_relay")
	var msgs []sink.Message
	for i := range 60 {
		ev := &outbox.Event{
			ID:            fmt.Appendf(nil, "ev-%02d", i),
			AggregateType: []byte("order"),
			AggregateID:   fmt.Appendf(nil, "order-%d", i%23),
			EventType:     []byte("order.updated"),
			Payload:       fmt.Appendf(nil, `{"n":%d}`, i),
			CommitLSN:     pglogrepl.LSN(0x16B3748 + uint64(i/3)*64),
			CommitTime:    time.Date(2026, 12, 5, 6, 0, 0, i*1000, time.UTC),
			Index:         uint32(i % 3),
		}
		m := sink.Message{Event: ev, Origin: origin}
		switch i % 10 {
		case 1:
			ev.Headers = []outbox.Header{{Key: "tenant", Value: []byte("acme")}, {Key: "nothing", Value: nil}, {Key: outbox.HeaderTraceParent, Value: []byte("00-aa-bb-01")}}
			m.TraceParent = []byte("00-cc-dd-01")
		case 2:
			ev.Payload = nil // an empty value, not a tombstone
		case 3:
			ev.HasTargetPartition, ev.TargetPartition = true, 5
		case 4:
			ev.Timestamp = time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC)
		case 5:
			m.Origin = nil // a replayed event: no source position
		}
		msgs = append(msgs, m)
	}
	cfg := sink.Config{Brokers: b.Brokers(), Idempotent: true, Logger: zerolog.Nop()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ours, err := sink.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open sink.Kafka: %v", err)
	}
	defer ours.Close()
	theirs, err := kgosink.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open the kgo producer: %v", err)
	}
	defer theirs.Close()

	stored := map[string]map[string]sink.Stored{viaSink: {}, viaKgo: {}}
	var mu sync.Mutex
	done := func(m sink.Message, at sink.Stored, err error) error {
		if err != nil {
			t.Errorf("%s to %s failed: %v", m.Event.ID, m.Topic, err)
		}
		mu.Lock()
		defer mu.Unlock()
		stored[m.Topic][string(m.Event.ID)] = at
		return nil
	}
	for _, p := range []struct {
		topic string
		p     relay.Producer
	}{{viaSink, ours}, {viaKgo, theirs}} {
		for _, m := range msgs {
			m.Topic = p.topic
			if err := p.p.Produce(m, done); err != nil {
				t.Fatalf("produce to %s: %v", p.topic, err)
			}
		}
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if n, k := len(stored[viaSink]), len(stored[viaKgo]); n < len(msgs) || k < len(msgs) {
			return fmt.Errorf("%d and %d of %d acknowledged", n, k, len(msgs))
		}
		return nil
	})
	recs := readBack(t, b, viaSink, viaKgo)
	for _, m := range msgs {
		id := string(m.Event.ID)
		a, k := recs[viaSink][id], recs[viaKgo][id]
		if a == nil || k == nil {
			t.Errorf("%s: read back from sink.Kafka's topic %v, from the kgo producer's %v", id, a != nil, k != nil)
			continue
		}
		if a.Partition != k.Partition || stored[viaSink][id] != stored[viaKgo][id] {
			t.Errorf("%s: sink.Kafka stored it at %d/%d (done %+v), the kgo producer at %d/%d (done %+v)", id, a.Partition, a.Offset, stored[viaSink][id], k.Partition, k.Offset, stored[viaKgo][id])
		}
		if !slices.Equal(a.Key, k.Key) || !slices.Equal(a.Value, k.Value) || (a.Value == nil) != (k.Value == nil) {
			t.Errorf("%s: key %q value %q (null %v) from sink.Kafka, key %q value %q (null %v) from the kgo producer", id, a.Key, a.Value, a.Value == nil, k.Key, k.Value, k.Value == nil)
		}
		if !slices.EqualFunc(a.Headers, k.Headers, func(x, y kgo.RecordHeader) bool {
			return x.Key == y.Key && slices.Equal(x.Value, y.Value) && (x.Value == nil) == (y.Value == nil)
		}) {
			t.Errorf("%s: headers differ:\n sink.Kafka %s\n kgo        %s", id, headers(a.Headers), headers(k.Headers))
		}
		if !m.Event.Timestamp.IsZero() && (!a.Timestamp.Equal(m.Event.Timestamp) || !k.Timestamp.Equal(m.Event.Timestamp)) {
			t.Errorf("%s: timestamp %v from sink.Kafka, %v from the kgo producer, want %v", id, a.Timestamp, k.Timestamp, m.Event.Timestamp)
		}
	}
}

// headers formats hs for a failure message, null values as <null>.
func headers(hs []kgo.RecordHeader) string {
	s := ""
	for _, h := range hs {
		v := fmt.Sprintf("%q", h.Value)
		if h.Value == nil {
			v = "<null>"
		}
		s += h.Key + "=" + v + " "
	}
	return s
}

// readBack reads every record of topics with a kgo consumer, by topic and
// id header.
func readBack(t *testing.T, b *sandbox.Kafka, topics ...string) map[string]map[string]*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want := len(testenv.MustReadAll(t, b, topics...))
	cl, err := kgo.NewClient(append(b.ClientOpts(), kgo.ConsumeTopics(topics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer cl.Close()
	out := map[string]map[string]*kgo.Record{}
	for n := 0; n < want; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read back %d of %d records: %v", n, want, err)
		}
		for _, e := range fs.Errors() {
			t.Fatalf("read back %s/%d: %v", e.Topic, e.Partition, e.Err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			n++
			for _, h := range r.Headers {
				if h.Key == sink.HeaderID {
					if out[r.Topic] == nil {
						out[r.Topic] = map[string]*kgo.Record{}
					}
					out[r.Topic][string(h.Value)] = r
				}
			}
		})
	}
	return out
}
