package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/dedup"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/setting"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// handler is the per-event path: it decodes pgoutput messages, accounts each
// event with the committer's tracker before handing it to the producer, and
// applies the failure policy to events that fail for good. It implements
// replication.Handler. Its fields other than the atomics and the halt state are
// used only by the stream's goroutine.
type handler struct {
	dec      *decoder.Decoder
	router   *route.Router
	producer producer
	pause    pauser
	ck       *checkpoint.Committer
	tracker  *checkpoint.Tracker // ck.Tracker()
	relay    *Relay
	m        *metrics.Metrics
	// deadLetter stores events that failed for good (--on-error=dlq); nil halts.
	deadLetter DeadLetterFunc
	// ctx bounds the dead-letter writes of delivered; cutPolicy ends it.
	ctx       context.Context
	cutPolicy context.CancelFunc
	// done is h.delivered, made once: a method value per event would allocate.
	done sink.Done
	// spans records the relay's trace span of each event (Config.Spans); nil
	// when spans are not exported.
	spans Spans

	seq   uint64
	inTxn bool
	index uint32 // of the next outbox event in the transaction

	// Effectively-once delivery (nil with --delivery at-least-once): origin
	// stamps stream events, gate skips replayed ones already in Kafka, ledger
	// records where Kafka stored each one for the checkpoints.
	origin *outbox.Origin
	gate   *dedup.Gate
	ledger *dedup.Ledger

	max      int64
	inFlight atomic.Int64
	room     chan struct{}
	// lastAckCommit is the commit time (UnixNano) of the newest acknowledged event.
	lastAckCommit atomic.Int64

	haltOnce sync.Once
	haltErr  error
	halted   chan struct{} // closed when the failure policy halted the relay
}

var _ replication.Handler = (*handler)(nil)

func (h *handler) HandleData(ctx context.Context, _ pglogrepl.LSN, data []byte) error {
	msg, err := h.dec.Decode(data)
	if err != nil {
		return fmt.Errorf("decode pgoutput message: %w", err)
	}
	switch msg.Kind {
	case decoder.KindBegin:
		h.seq = h.tracker.BeginAt(msg.CommitTime)
		h.inTxn = true
		h.index = 0
	case decoder.KindEvent:
		if !h.inTxn {
			return errors.New("decode pgoutput message: insert outside a transaction")
		}
		ev := msg.Event
		if msg.BadTrace != nil {
			h.badTrace(ev, msg.BadTrace)
		}
		ev.Seq = h.seq
		ev.Origin, ev.Index = h.origin, h.index
		h.index++
		topic, routeErr := h.router.Topic(ev)
		ev.Topic = topic
		if h.spans != nil {
			// Before the event is sized: Start may rewrite its traceparent.
			h.spans.Start(ev)
		}
		h.tracker.Add(h.seq, 1)
		n := h.inFlight.Add(inFlightBytes(ev))
		h.m.InFlightBytes.Set(float64(n))
		if routeErr != nil {
			h.m.ProduceErrors.WithLabelValues("permanent").Inc()
			h.m.PermanentFailures.WithLabelValues(sink.Code(routeErr)).Inc()
			return h.settle(ctx, ev, routeErr)
		}
		if h.gate != nil {
			present, err := h.gate.Check(ctx, topic, ev)
			if err != nil {
				return err
			}
			if present {
				h.ledger.Acked(ev)
				h.ack(ev)
				h.dec.Recycle(ev)
				return nil
			}
		}
		if err := h.producer.Produce(topic, ev, h.done); err != nil {
			return err
		}
	case decoder.KindUpdate:
		return h.outboxUpdate(msg)
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
		return &replication.ConfigError{Err: setting.Errorf("OnOutboxUpdate",
			"transaction %d (commit LSN %s) updated a row of the outbox table %s.%s, which the relay treats as fatal: "+
				"fix the writer (the outbox is insert-only), or choose ignore, warn or error", msg.XID, msg.CommitLSN,
			h.relay.cfg.Decoder.Schema, h.relay.cfg.Decoder.Table)}
	}
	return nil
}

// badTrace counts and logs (sampled) an event whose tracing column held no
// trace context; the event goes out without trace headers.
func (h *handler) badTrace(ev *outbox.Event, err error) {
	h.m.TraceContextInvalid.Inc()
	h.relay.eventLog.Warn().Err(err).Str("event_id", string(ev.ID)).Str("lsn", ev.CommitLSN.String()).
		Msg("tracing column holds no valid trace context; the event is published without traceparent/tracestate headers")
}

// delivered is the producer's Done (see settle); dead letters it stores are
// bounded by h.ctx.
func (h *handler) delivered(ev *outbox.Event, err error) error {
	return h.settle(h.ctx, ev, err)
}

// settle counts an acknowledged event (err nil) as done, and puts one that
// failed for good through the failure policy. A non-nil return (halt) stops
// the producer and the relay.
func (h *handler) settle(ctx context.Context, ev *outbox.Event, err error) error {
	if err != nil {
		if herr := h.permanent(ctx, ev, err); herr != nil {
			if h.spans != nil {
				h.spans.End(ev, err, false)
			}
			h.halt(herr)
			return herr
		}
	} else if h.ledger != nil {
		h.ledger.Acked(ev) // before the ack can move the watermark past it
	}
	if h.spans != nil {
		h.spans.End(ev, err, err != nil)
	}
	h.ack(ev)
	// Nothing reads the event after this: the sink is done with it and
	// the dead letter, if any, is stored.
	h.dec.Recycle(ev)
	return nil
}

// inFlightBytes is what ev counts against the read-ahead bound: the heap it
// costs until Kafka acknowledges it, and its transaction's tracker entry.
func inFlightBytes(ev *outbox.Event) int64 {
	return int64(ev.Footprint() + checkpoint.TxnBytes)
}

// ack counts ev as done: Kafka acknowledged it, or its dead letter is stored.
func (h *handler) ack(ev *outbox.Event) {
	h.lastAckCommit.Store(ev.CommitTime.UnixNano())
	h.tracker.Ack(ev.Seq, 1)
	size := inFlightBytes(ev)
	before := h.inFlight.Add(-size) + size
	h.m.InFlightBytes.Set(float64(before - size))
	if before >= h.max && before-size < h.max {
		select {
		case h.room <- struct{}{}:
		default:
		}
	}
}

// permanent applies the failure policy to an event that failed permanently:
// with dead letters, store it (retrying until the store commits it), after
// which the caller counts it as done; without, halt.
func (h *handler) permanent(ctx context.Context, ev *outbox.Event, cause error) error {
	r := h.relay
	code := sink.Code(cause)
	// Per-event lines are sampled: a burst of poison events (a topic template
	// gone wrong) must not flood the log; the metric counts every one.
	log := r.eventLog.With().Str("event_id", string(ev.ID)).Str("aggregate_id", string(ev.AggregateID)).
		Str("lsn", ev.CommitLSN.String()).Str("code", code).Logger()
	if h.deadLetter == nil {
		log.Error().Err(cause).Msg("event failed permanently; halting without confirming past it, as dead letters are off " + setting.Token("OpenDeadLetters"))
		return fmt.Errorf("event %s (aggregate %s, commit lsn %s) failed permanently: %w: fix the event or the broker limit and restart, or run with dead letters on %s; the slot was not confirmed past it",
			ev.ID, ev.AggregateID, ev.CommitLSN, cause, setting.Token("OpenDeadLetters"))
	}
	for attempt := 0; ; attempt++ {
		err := h.deadLetter(ctx, ev, cause)
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
