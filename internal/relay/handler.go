package relay

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jackc/pglogrepl"
	"go.opentelemetry.io/otel/trace"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/dedup"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// handler is the per-event path: it decodes pgoutput messages, accounts each
// event with the committer's tracker before handing it to the producer, and
// applies the failure policy to events that fail for good. It implements
// replication.Handler. Its fields other than the atomics and the halt state are
// used only by the stream's goroutine.
type handler struct {
	// published caches the published counter of the last event's table
	// (metrics.TableEvents): events mostly come from one table at a time.
	published tableCounter
	dec       *decoder.Decoder
	router    *route.Router
	// routers route the events of the outbox tables with topics of their
	// own (Config.TableRoutes); halts are the tables whose permanent
	// failures halt (Config.HaltTables).
	routers  map[decoder.TableName]*route.Router
	halts    map[decoder.TableName]bool
	producer producer
	pause    pauser
	ck       *checkpoint.Committer
	tracker  *checkpoint.Tracker // ck.Tracker()
	relay    *Relay
	m        *metrics.Metrics
	// deadLetter stores events that failed for good (outbox.on_error dlq); nil halts.
	deadLetter DeadLetterFunc
	// ctx bounds the dead-letter writes of delivered; cutPolicy ends it.
	ctx       context.Context
	cutPolicy context.CancelFunc
	// records holds the per-event records of events no longer in flight,
	// for reuse (see pending).
	records sync.Pool
	// spans records the relay's trace span of each event (Config.Spans); nil
	// when spans are not exported.
	spans Spans

	seq   uint64
	inTxn bool

	// Effectively-once delivery (nil with delivery at-least-once): origin
	// is the stream's, given to the sink beside each event so that its record
	// carries the event's source position; gate skips replayed events already
	// in Kafka; ledger records where Kafka stored each one for the checkpoints.
	origin *outbox.Origin
	gate   *dedup.Gate
	ledger *dedup.Ledger

	max      int64
	inFlight atomic.Int64 // bytes of the events in flight (inFlightBytes)
	room     chan struct{}
	// lastAckCommit is the commit time (UnixNano) of the newest acknowledged event.
	lastAckCommit atomic.Int64

	// nonTxnOnce logs the first non-transactional outbox message.
	nonTxnOnce sync.Once

	haltOnce sync.Once
	haltErr  error
	halted   chan struct{} // closed when the failure policy halted the relay
}

var _ replication.Handler = (*handler)(nil)

func (h *handler) HandleData(ctx context.Context, _ pglogrepl.LSN, data []byte) error {
	msg, err := h.dec.DecodeContext(ctx, data)
	if err != nil {
		return fmt.Errorf("decode pgoutput message: %w", err)
	}
	switch msg.Kind {
	case decoder.KindBegin:
		h.seq = h.tracker.BeginAt(msg.CommitTime)
		h.inTxn = true
	case decoder.KindEvent:
		if !h.inTxn {
			return errors.New("decode pgoutput message: insert outside a transaction")
		}
		ev := msg.Event
		if msg.BadTrace != nil {
			h.badTrace(ev, msg.BadTrace)
		}
		// The event stays as the decoder made it: what the relay learns of
		// it travels beside it, in m (for the sink) and rec (its own).
		var topic string
		routeErr := msg.Failed // a message outbox's bad envelope: no topic
		if routeErr == nil {
			topic, routeErr = h.routerFor(ev).Topic(ev)
		}
		m := sink.Message{Topic: topic, Event: ev, Origin: h.origin}
		rec := h.record()
		rec.seq = h.seq
		if h.spans != nil {
			rec.span, m.TraceParent = h.spans.Start(m)
		}
		rec.size = inFlightBytes(ev) + int64(len(m.TraceParent))
		h.tracker.Add(h.seq, 1)
		n := h.inFlight.Add(rec.size)
		h.m.InFlightBytes.Set(float64(n))
		if routeErr != nil {
			h.m.ProduceErrors.WithLabelValues("permanent").Inc()
			h.m.PermanentFailures.WithLabelValues(sink.Code(routeErr)).Inc()
			return h.settle(ctx, rec, m, sink.Stored{}, routeErr)
		}
		if h.gate != nil {
			at, present, err := h.gate.Check(ctx, m)
			if err != nil {
				h.abandon(rec, m, err)
				return err
			}
			if present {
				h.ledger.Acked(m, at)
				h.ack(rec, ev)
				h.dec.Recycle(ev)
				h.release(rec)
				return nil
			}
		}
		if err := h.producer.Produce(m, rec.done); err != nil {
			return err
		}
	case decoder.KindRelation:
		if msg.Former != nil {
			h.relay.logFormer(msg.Former)
		}
	case decoder.KindUpdate:
		return h.outboxUpdate(msg)
	case decoder.KindNonTransactional:
		h.nonTransactional()
	case decoder.KindCommit:
		h.tracker.Commit(h.seq, msg.EndLSN, msg.CommitTime)
		h.inTxn = false
	}
	return nil
}

// outboxUpdate applies Config.OnOutboxUpdate to an UPDATE of an outbox row.
func (h *handler) outboxUpdate(msg decoder.Message) error {
	policy := h.relay.cfg.OnOutboxUpdate
	if policy == "" || policy == OutboxUpdateIgnore {
		return nil
	}
	h.m.OutboxUpdates.Inc()
	const what = "an outbox row was updated; the outbox is insert-only, so nothing is published for it"
	switch policy {
	case OutboxUpdateWarn:
		h.relay.eventLog.Warn().Uint32("xid", msg.XID).Str("lsn", msg.CommitLSN.String()).Msg(what)
	case OutboxUpdateError:
		h.relay.eventLog.Error().Uint32("xid", msg.XID).Str("lsn", msg.CommitLSN.String()).Msg(what)
	case OutboxUpdateFatal:
		return &replication.ConfigError{Err: h.relay.cfg.Names.Errorf("OnOutboxUpdate",
			"transaction %d (commit LSN %s) updated a row of the outbox table %s.%s, which the relay treats as fatal: "+
				"fix the writer (the outbox is insert-only), or choose ignore, warn or error", msg.XID, msg.CommitLSN,
			h.relay.cfg.Decoder.Schema, h.relay.cfg.Decoder.Table)}
	}
	return nil
}

// nonTransactional counts a non-transactional logical decoding message with
// the message outbox's prefix, which is never published, and logs the first.
func (h *handler) nonTransactional() {
	h.m.MessagesNonTransactional.Inc()
	h.nonTxnOnce.Do(func() {
		h.relay.log.Warn().Str("prefix", h.relay.cfg.Decoder.MessagePrefix).
			Msg("a non-transactional logical decoding message has the message outbox's prefix: it is not published, " +
				"as it escapes rollbacks (write events with pg_logical_emit_message(true, …), e.g. migrations' outbox_emit); " +
				"cdc_relay_messages_non_transactional_total counts them, this line is logged once")
	})
}

// badTrace counts and logs (sampled) an event whose tracing column held no
// trace context; the event goes out without trace headers.
func (h *handler) badTrace(ev *outbox.Event, err error) {
	h.m.TraceContextInvalid.Inc()
	h.relay.eventLog.Warn().Err(err).Str("event_id", string(ev.ID)).Str("lsn", ev.CommitLSN.String()).
		Msg("tracing column holds no valid trace context; the event is published without traceparent/tracestate headers")
}

// pending is what the handler keeps beside one event while it is in flight:
// what it learned of the event, which the event itself does not carry.
// Records are pooled (handler.records): the hot path allocates none.
type pending struct {
	h    *handler
	seq  uint64 // the event's transaction, for the tracker
	size int64  // what the event counts against the read-ahead bound
	// span is the relay's trace span of the event (Config.Spans); nil when
	// none.
	span trace.Span
	// done is rec.delivered, bound once per record: a method value per
	// event would allocate.
	done sink.Done
}

// record returns a cleared per-event record, reused when one is free.
func (h *handler) record() *pending {
	if rec, ok := h.records.Get().(*pending); ok {
		return rec
	}
	rec := &pending{h: h}
	rec.done = rec.delivered
	return rec
}

// delivered is the producer's Done (see settle); dead letters it stores are
// bounded by h.ctx.
func (rec *pending) delivered(m sink.Message, at sink.Stored, err error) error {
	return rec.h.settle(rec.h.ctx, rec, m, at, err)
}

// settle counts an acknowledged event (err nil; at says where Kafka stored
// it) as done, and puts one that failed for good through the failure policy.
// A non-nil return (halt) stops the producer and the relay. Once the event is
// done its record goes back to the pool.
func (h *handler) settle(ctx context.Context, rec *pending, m sink.Message, at sink.Stored, err error) error {
	ev := m.Event
	if err != nil {
		if herr := h.permanent(ctx, m, err); herr != nil {
			if h.spans != nil {
				h.spans.End(m, rec.span, at, err, false)
			}
			h.halt(herr)
			return herr
		}
	} else {
		if h.ledger != nil {
			h.ledger.Acked(m, at) // before the ack can move the watermark past it
		}
		h.published.get(h.m, ev, metrics.TableResultPublished).Inc()
	}
	if h.spans != nil {
		h.spans.End(m, rec.span, at, err, err != nil)
	}
	h.ack(rec, ev)
	// Nothing reads the event after this: the sink is done with it and
	// the dead letter, if any, is stored.
	h.dec.Recycle(ev)
	h.release(rec)
	return nil
}

// routerFor is the router of ev's table.
func (h *handler) routerFor(ev *outbox.Event) *route.Router {
	if len(h.routers) > 0 {
		if r := h.routers[decoder.TableName{Schema: ev.Schema, Table: ev.Table}]; r != nil {
			return r
		}
	}
	return h.router
}

// fixedTopics are the topics of the routers that have a fixed one: they
// must exist before the relay starts. Nil when no router has one.
func (h *handler) fixedTopics() []string {
	var topics []string
	for _, r := range append([]*route.Router{h.router}, slices.Collect(maps.Values(h.routers))...) {
		if t, fixed := r.Fixed(); fixed && !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	}
	return topics
}

// allFixed reports whether every event goes to a fixed topic: then
// fixedTopics are all the topics the relay writes.
func (h *handler) allFixed() bool {
	for _, r := range append([]*route.Router{h.router}, slices.Collect(maps.Values(h.routers))...) {
		if _, fixed := r.Fixed(); !fixed {
			return false
		}
	}
	return true
}

// tableCounter is the TableEvents counter of one table and result.
type tableCounter struct {
	schema, table string
	c             prometheus.Counter
}

// get returns the counter of ev's table and result, cached for the next
// event of the same table.
func (tc *tableCounter) get(m *metrics.Metrics, ev *outbox.Event, result string) prometheus.Counter {
	if tc.c == nil || tc.schema != ev.Schema || tc.table != ev.Table {
		name := ""
		if ev.Table != "" {
			name = ev.Schema + "." + ev.Table
		}
		tc.schema, tc.table, tc.c = ev.Schema, ev.Table, m.TableEvents.WithLabelValues(name, result)
	}
	return tc.c
}

// abandon gives up on an event counted in flight that never reached the
// sink (the gate failed, for instance Postgres went away while it stored a
// topic's offsets: the stream ends and reconnects).
// Its transaction gets no commit on this stream, so counting the event as
// done cannot move the watermark past it; left counted, it would never be
// acknowledged, and the reconnect, which waits until every event in flight
// is, would wait forever (and its bytes would bound reading ever after).
func (h *handler) abandon(rec *pending, m sink.Message, err error) {
	if h.spans != nil {
		h.spans.End(m, rec.span, sink.Stored{}, err, false)
	}
	h.untrack(rec)
	h.dec.Recycle(m.Event)
	h.release(rec)
}

// release clears rec and keeps it for a later event.
func (h *handler) release(rec *pending) {
	rec.seq, rec.size, rec.span = 0, 0, nil
	h.records.Put(rec)
}

// inFlightBytes is what ev counts against the read-ahead bound: the heap it
// costs until Kafka acknowledges it, its transaction's tracker entry and the
// handler's record of it.
func inFlightBytes(ev *outbox.Event) int64 {
	return int64(ev.Footprint()+checkpoint.TxnBytes) + int64(unsafe.Sizeof(pending{}))
}

// ack counts ev, of record rec, as done: Kafka acknowledged it, or its dead
// letter is stored.
func (h *handler) ack(rec *pending, ev *outbox.Event) {
	h.lastAckCommit.Store(ev.CommitTime.UnixNano())
	h.untrack(rec)
}

// untrack counts the event of record rec out of the tracker and the bytes
// in flight.
func (h *handler) untrack(rec *pending) {
	h.tracker.Ack(rec.seq, 1)
	size := rec.size
	before := h.inFlight.Add(-size) + size
	h.m.InFlightBytes.Set(float64(before - size))
	if before >= h.max && before-size < h.max {
		select {
		case h.room <- struct{}{}:
		default:
		}
	}
}

// permanent applies the failure policy to the event of m, which failed
// permanently: with dead letters, store it with the topic it was routed to
// (the template when routing failed), retrying until the store commits it,
// after which the caller counts it as done; without, halt.
func (h *handler) permanent(ctx context.Context, m sink.Message, cause error) error {
	r := h.relay
	ev := m.Event
	code := sink.Code(cause)
	// Per-event lines are sampled: a burst of poison events (a topic template
	// gone wrong) must not flood the log; the metric counts every one.
	log := r.eventLog.With().Str("event_id", string(ev.ID)).Str("aggregate_id", string(ev.AggregateID)).
		Str("lsn", ev.CommitLSN.String()).Str("code", code).Logger()
	if h.deadLetter == nil || h.halts[decoder.TableName{Schema: ev.Schema, Table: ev.Table}] {
		log.Error().Err(cause).Msg("event failed permanently; halting without confirming past it, as dead letters are off " + r.cfg.Names.Name("OpenDeadLetters"))
		return fmt.Errorf("event %s (aggregate %s, commit lsn %s) failed permanently: %w: fix the event or the broker limit and restart, or run with dead letters on %s; the slot was not confirmed past it",
			ev.ID, ev.AggregateID, ev.CommitLSN, cause, r.cfg.Names.Name("OpenDeadLetters"))
	}
	topic := m.Topic
	if topic == "" {
		topic = r.cfg.Topic // the router could not name one
	}
	for attempt := 0; ; attempt++ {
		err := h.deadLetter(ctx, ev, topic, cause)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("store dead letter for event %s: %w", ev.ID, err)
		}
		if attempt == 0 {
			log.Error().Err(err).Msg("cannot store the dead letter; retrying, nothing is confirmed past it meanwhile")
		}
		if err := r.cfg.Retry.Sleep(ctx, attempt); err != nil {
			return fmt.Errorf("store dead letter for event %s: %w", ev.ID, err)
		}
	}
	r.m.DeadLetters.WithLabelValues(code).Inc()
	var tc tableCounter
	tc.get(r.m, ev, metrics.TableResultDeadLettered).Inc()
	log.Warn().Err(cause).Msg("event failed permanently; stored in the dead-letter table, relaying goes on")
	return nil
}

// halt records the first error that halted the relay and closes halted.
func (h *handler) halt(err error) {
	h.haltOnce.Do(func() {
		h.haltErr = err
		close(h.halted)
	})
}

// err returns the error that halted the relay, or nil.
func (h *handler) err() error {
	select {
	case <-h.halted:
		return h.haltErr
	default:
		return nil
	}
}

func (h *handler) Keepalive(serverWALEnd pglogrepl.LSN, serverTime time.Time) {
	if !h.inTxn {
		h.tracker.Idle(serverWALEnd, serverTime)
	}
}

// Flushed is the committer's: the stream confirms only persisted positions.
func (h *handler) Flushed() pglogrepl.LSN { return h.ck.Flushed() }

func (h *handler) Backpressure() <-chan struct{} {
	if closed := h.pause.CircuitClosed(); closed != nil {
		// Kafka keeps failing: stop pulling from the slot until it recovers
		// (keepalives and status updates go on).
		return closed
	}
	if h.inFlight.Load() < h.max {
		return nil
	}
	return h.room
}

func (h *handler) AtBoundary() bool { return !h.inTxn }

// reset forgets the decoder's relations and the tracker's open transactions
// after a reconnect; the caller has drained the producer.
func (h *handler) reset() {
	h.dec.Reset()
	h.inTxn = false
	h.tracker.Reset(h.tracker.Watermark())
}
