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

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jackc/pglogrepl"

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
	// done is h.delivered, the Done of every event, bound once: a method
	// value per event would allocate. What the handler learned of an event
	// travels with its sink.Message (Tag: its transaction), not in a record
	// of its own beside it.
	done sink.Done
	// flight bounds the events between the stream and their settlement,
	// holds their spans, and recycles each (invariant 5, inflight.go).
	flight *inflight

	seq   uint64
	inTxn bool

	// Effectively-once delivery (nil with delivery at-least-once): origin
	// is the stream's, given to the sink beside each event so that its record
	// carries the event's source position; gate skips replayed events already
	// in Kafka; ledger records where Kafka stored each one for the checkpoints.
	origin *outbox.Origin
	gate   *dedup.Gate
	ledger *dedup.Ledger

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
		// it travels beside it, in m.
		var topic string
		routeErr := msg.Failed // a message outbox's bad envelope: no topic
		if routeErr == nil {
			topic, routeErr = h.routerFor(ev).Topic(ev)
		}
		m := h.flight.admit(sink.Message{Topic: topic, Event: ev, Origin: h.origin, Tag: h.seq})
		h.tracker.Add(h.seq, 1)
		if routeErr != nil {
			h.m.ProduceErrors.WithLabelValues("permanent").Inc()
			h.m.PermanentFailures.WithLabelValues(sink.Code(routeErr)).Inc()
			return h.settle(ctx, m, sink.Stored{}, routeErr)
		}
		if h.gate != nil {
			at, present, err := h.gate.Check(ctx, m)
			if err != nil {
				h.abandon(m, err)
				return err
			}
			if present {
				h.ledger.Acked(m, at)
				h.ack(m)
				h.flight.release(m, at, nil, false)
				return nil
			}
		}
		if err := h.producer.Produce(m, h.done); err != nil {
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

// delivered is the producer's Done of every event (see settle); dead
// letters it stores are bounded by h.ctx.
func (h *handler) delivered(m sink.Message, at sink.Stored, err error) error {
	return h.settle(h.ctx, m, at, err)
}

// settle counts an acknowledged event (err nil; at says where Kafka stored
// it) as done, and puts one that failed for good through the failure policy.
// A non-nil return (halt) stops the producer and the relay.
func (h *handler) settle(ctx context.Context, m sink.Message, at sink.Stored, err error) error {
	ev := m.Event
	if err != nil {
		if herr := h.permanent(ctx, m, err); herr != nil {
			h.flight.endSpan(m, at, err, false)
			h.halt(herr)
			return herr
		}
	} else {
		if h.ledger != nil {
			h.ledger.Acked(m, at) // before the ack can move the watermark past it
		}
		h.published.get(h.m, ev, metrics.TableResultPublished).Inc()
	}
	h.ack(m)
	// Nothing reads the event after this: the sink is done with it and
	// the dead letter, if any, is stored.
	h.flight.release(m, at, err, err != nil)
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
func (h *handler) abandon(m sink.Message, err error) {
	h.tracker.Ack(m.Tag, 1)
	h.flight.release(m, sink.Stored{}, err, false)
}

// ack counts m's event as done in its transaction (m.Tag): Kafka
// acknowledged it, or its dead letter is stored. The caller releases it
// after.
func (h *handler) ack(m sink.Message) {
	h.lastAckCommit.Store(m.Event.CommitTime.UnixNano())
	h.tracker.Ack(m.Tag, 1)
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
		log.Error().Err(cause).Msg("event failed permanently; halting without confirming past it, as dead letters are off " + r.cfg.Names.Name("DeadLetter"))
		return fmt.Errorf("event %s (aggregate %s, commit lsn %s) failed permanently: %w: fix the event or the broker limit and restart, or run with dead letters on %s; the slot was not confirmed past it",
			ev.ID, ev.AggregateID, ev.CommitLSN, cause, r.cfg.Names.Name("DeadLetter"))
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
	return h.flight.full()
}

func (h *handler) AtBoundary() bool { return !h.inTxn }

// reset forgets the decoder's relations and the tracker's open transactions
// after a reconnect; the caller has drained the producer.
func (h *handler) reset() {
	h.dec.Reset()
	h.inTxn = false
	h.tracker.Reset(h.tracker.Watermark())
}
