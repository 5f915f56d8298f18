package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/trace"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// relaySpanParent is the traceparent spanRecorder gives traced events, longer
// than the row's (a version 01 context may carry more fields): the in-flight
// accounting must see it from the start.
const relaySpanParent = "01-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01-relay"

// spanEnd is one End call as spanRecorder saw it.
type spanEnd struct {
	code       string // "" for acknowledged
	deadLetter bool
	topic      string
	partition  int32
	offset     int64
}

// spanRecorder is a relay.Spans that records the relay's calls and, as
// tracing.Spans does, gives a traced event's record a traceparent of its own
// in Start.
type spanRecorder struct {
	mu     sync.Mutex
	starts map[string]int // by event id
	ends   map[string][]spanEnd
}

func newSpanRecorder() *spanRecorder {
	return &spanRecorder{starts: map[string]int{}, ends: map[string][]spanEnd{}}
}

func (s *spanRecorder) Start(m sink.Message) (trace.Span, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ev := m.Event
	s.starts[string(ev.ID)]++
	for i := range ev.Headers {
		if ev.Headers[i].Key == outbox.HeaderTraceParent {
			return nil, []byte(relaySpanParent)
		}
	}
	return nil, nil
}

func (s *spanRecorder) End(m sink.Message, _ trace.Span, at sink.Stored, err error, deadLetter bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := spanEnd{deadLetter: deadLetter, topic: m.Topic, partition: at.Partition, offset: at.Offset}
	if err != nil {
		e.code = "_OTHER"
		var ee *outbox.EventError
		if errors.As(err, &ee) {
			e.code = ee.Code
		}
	}
	s.ends[string(m.Event.ID)] = append(s.ends[string(m.Event.ID)], e)
}

func (s *spanRecorder) snapshot() (map[string]int, map[string][]spanEnd) {
	s.mu.Lock()
	defer s.mu.Unlock()
	starts, ends := map[string]int{}, map[string][]spanEnd{}
	for k, v := range s.starts {
		starts[k] = v
	}
	for k, v := range s.ends {
		ends[k] = append([]spanEnd(nil), v...)
	}
	return starts, ends
}

var _ relay.Spans = (*spanRecorder)(nil)

// TestSpansOfEvents checks how the relay drives Config.Spans: Start once per
// event before the record is encoded (the record carries the traceparent
// Start gave) and sized (the in-flight bytes return to 0 with a record
// traceparent of another length); End once per event, after Kafka's
// acknowledgement with the record's partition and offset, or with the code
// of a permanent failure and whether it went to the dead-letter table
// (routing failure, empty key) or halted the relay.
func TestSpansOfEvents(t *testing.T) {
	const traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	rows := func(e *env, list []struct{ typ, key, trace string }) map[string]string {
		ids := map[string]string{}
		e.tx(func(tx pgx.Tx) error {
			for _, r := range list {
				var trace any
				if r.trace != "" {
					trace = r.trace
				}
				var id string
				if err := tx.QueryRow(context.Background(), `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, tracingspancontext)
					VALUES ($1, $2, 'Placed', '{}', $3) RETURNING id::text`, r.typ, r.key, trace).Scan(&id); err != nil {
					return err
				}
				ids[r.typ+"/"+r.key] = id
			}
			return nil
		})
		return ids
	}

	t.Run("dlq", func(t *testing.T) {
		e := newEnv(t)
		e.exec(`ALTER TABLE outbox_events ADD COLUMN tracingspancontext text`)
		spans := newSpanRecorder()
		e.cfgHook = func(c *relay.Config) {
			c.Topic = "outbox.{aggregate_type}"
			c.Decoder.TracingColumn = decoder.DefaultTracingColumn
			c.Spans = spans
			c.DeadLetter = func(context.Context, *outbox.Event, string, error) error { return nil }
		}
		e.start()
		ids := rows(e, []struct{ typ, key, trace string }{
			{"order", "o-1", traced}, {"order", "o-2", ""}, {"orders/eu", "o-3", traced}, {"order", "", traced},
		})
		recs := e.waitRecords(2, "outbox.order")
		var starts map[string]int
		var ends map[string][]spanEnd
		testenv.Eventually(t, 10*time.Second, func() error {
			starts, ends = spans.snapshot()
			if len(ends) < 4 {
				return fmt.Errorf("End called for %d events, want 4", len(ends))
			}
			if n := testutil.ToFloat64(e.m.InFlightBytes); n != 0 {
				return fmt.Errorf("in_flight_bytes = %v after every event was settled, want 0", n)
			}
			return nil
		})
		for key, id := range ids {
			if starts[id] != 1 || len(ends[id]) != 1 {
				t.Errorf("%s: Start %d times, End %d times, want once each", key, starts[id], len(ends[id]))
			}
		}
		for _, rec := range recs {
			id := rec.Headers["id"]
			want := spanEnd{topic: "outbox.order", partition: rec.Partition, offset: rec.Offset}
			if got := ends[id]; len(got) != 1 || got[0] != want {
				t.Errorf("event %s: End %+v, want %+v (the record's)", id, got, want)
			}
			switch id {
			case ids["order/o-1"]:
				if rec.Headers["traceparent"] != relaySpanParent {
					t.Errorf("traced record: traceparent %q, want the one Start gave, %q", rec.Headers["traceparent"], relaySpanParent)
				}
			case ids["order/o-2"]:
				if tp, ok := rec.Headers["traceparent"]; ok {
					t.Errorf("untraced record: traceparent %q", tp)
				}
			}
		}
		for key, want := range map[string]spanEnd{
			"orders/eu/o-3": {code: "invalid_topic", deadLetter: true, partition: 0, offset: 0},
			"order/":        {code: "empty_key", deadLetter: true, topic: "outbox.order"},
		} {
			if got := ends[ids[key]]; len(got) != 1 || got[0] != want {
				t.Errorf("%s: End %+v, want %+v", key, got, want)
			}
		}
	})

	t.Run("halt", func(t *testing.T) {
		e := newEnv(t)
		e.exec(`ALTER TABLE outbox_events ADD COLUMN tracingspancontext text`)
		spans := newSpanRecorder()
		e.cfgHook = func(c *relay.Config) {
			c.Decoder.TracingColumn = decoder.DefaultTracingColumn
			c.Spans = spans
		}
		e.start()
		ids := rows(e, []struct{ typ, key, trace string }{{"order", "", traced}})
		select {
		case err := <-e.done:
			e.cancel = nil
			if err == nil || !strings.Contains(err.Error(), "empty_key") {
				t.Fatalf("Run = %v, want the empty_key halt", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("relay did not halt")
		}
		_, ends := spans.snapshot()
		if got, want := ends[ids["order/"]], (spanEnd{code: "empty_key", topic: e.topic}); len(got) != 1 || got[0] != want {
			t.Errorf("halting event: End %+v, want %+v (not a dead letter)", got, want)
		}
	})
}
