package relay

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// inflight owns invariant 5, bounded memory (docs/architecture.md): the
// bytes of the events read from the stream and not yet settled, the room the
// stream waits for once they reach the bound, the trace spans of those
// events, and the one place an event is given back to the decoder for reuse.
//
// An event's life: admit counts it when the stream has read it; the
// producer holds it until its done; release (or abandon, when it never
// reached the producer) counts it off, ends its span and recycles it. After
// release nothing may read the event: the next one decoded may be the same
// *outbox.Event with another row's values (the relay.Producer contract).
//
// admit runs on the stream's goroutine; release where Kafka's answers
// arrive. The bytes are an atomic, the spans under mu.
type inflight struct {
	max     int64
	bytes   atomic.Int64
	room    chan struct{} // a token when the bytes fell below max
	gauge   prometheus.Gauge
	recycle func(*outbox.Event)

	spans  Spans // nil: spans are not recorded
	mu     sync.Mutex
	spanOf map[*outbox.Event]trace.Span
}

// newInflight bounds the events in flight to max bytes, shown in gauge;
// recycle takes an event back for reuse (decoder.Decoder.Recycle); spans,
// when not nil, records each event's span.
func newInflight(max int64, gauge prometheus.Gauge, spans Spans, recycle func(*outbox.Event)) *inflight {
	f := &inflight{max: max, room: make(chan struct{}, 1), gauge: gauge, recycle: recycle, spans: spans}
	if spans != nil {
		f.spanOf = make(map[*outbox.Event]trace.Span)
	}
	return f
}

// sizeOf is what m's event counts against the bound: the heap it costs
// until Kafka acknowledges it (with its traceparent) and its transaction's
// tracker entry. The event is not written to while in flight, so releasing
// it counts off what admitting it counted.
func sizeOf(m sink.Message) int64 {
	return int64(m.Event.Footprint()+checkpoint.TxnBytes) + int64(len(m.TraceParent))
}

// admit starts m's span, when spans are recorded, and counts its event in
// flight; it returns m with the traceparent the record carries.
func (f *inflight) admit(m sink.Message) sink.Message {
	if f.spans != nil {
		var span trace.Span
		span, m.TraceParent = f.spans.Start(m)
		f.mu.Lock()
		f.spanOf[m.Event] = span
		f.mu.Unlock()
	}
	f.gauge.Set(float64(f.bytes.Add(sizeOf(m))))
	return m
}

// endSpan ends the span of m's event, if spans are recorded: err nil when
// Kafka stored it at at, else its failure (deadLettered: stored as a dead
// letter).
func (f *inflight) endSpan(m sink.Message, at sink.Stored, err error, deadLettered bool) {
	if f.spans == nil {
		return
	}
	f.mu.Lock()
	span := f.spanOf[m.Event]
	delete(f.spanOf, m.Event)
	f.mu.Unlock()
	f.spans.End(m, span, at, err, deadLettered)
}

// release settles m's event: it ends its span, counts it off (waking the
// stream when that makes room) and recycles it. The caller reads nothing of
// the event after.
func (f *inflight) release(m sink.Message, at sink.Stored, err error, deadLettered bool) {
	f.endSpan(m, at, err, deadLettered)
	size := sizeOf(m)
	before := f.bytes.Add(-size) + size
	f.gauge.Set(float64(before - size))
	if before >= f.max && before-size < f.max {
		select {
		case f.room <- struct{}{}:
		default:
		}
	}
	f.recycle(m.Event)
}

// full returns nil while the events in flight are below the bound, and
// otherwise the channel that signals room.
func (f *inflight) full() <-chan struct{} {
	if f.bytes.Load() < f.max {
		return nil
	}
	return f.room
}
