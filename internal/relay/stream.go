package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// stream runs replication connections until ctx is done, reconnecting with
// backoff after failures, then stops cleanly.
func (r *Relay) stream(ctx context.Context, h *handler, k health, ck *checkpoint.Committer) error {
	// The stream keeps its own context so it can finish the current transaction
	// and confirm after ctx is done; it is cut after half the shutdown budget.
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	stop := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			b := r.stopping()
			r.logStop(b, h, k)
			close(stop)
			r.m.SetState(metrics.StateStopping)
			cut := time.NewTimer(time.Until(b.readBy()))
			defer cut.Stop()
			select {
			case <-cut.C:
				cancelRun()
				h.cutPolicy() // a dead letter still being retried must not hold the stop up
			case <-runCtx.Done():
			}
		case <-runCtx.Done():
		}
	}()

	streamCfg := replication.StreamConfig{
		URL: r.cfg.PGURL, Slot: r.cfg.Slot, Publication: r.cfg.Publication,
		StatusInterval: r.cfg.StatusInterval, ReadCoalesce: r.cfg.ReadCoalesce, ReadBuffer: r.cfg.ReadBuffer, Logger: r.log, Metrics: r.m,
		Messages: r.cfg.Decoder.MessagePrefix != "", Names: r.cfg.Names,
	}
	failing, connected := false, false
	for attempt := 0; ; attempt++ {
		if err := h.err(); err != nil {
			return r.finish(nil, ck, err)
		}
		var s *replication.Stream
		err := r.pendingFailover(runCtx)
		if err == nil {
			var armed bool
			armed, err = r.catchUp(runCtx, stop, h, k, ck, !connected)
			if armed {
				connected = true // the reconcile was logged; a stream after it is no reconnect
			}
			if errors.Is(err, replication.ErrStopped) || (err != nil && ctx.Err() != nil) {
				return r.finish(nil, ck, nil)
			}
			if herr := h.err(); herr != nil {
				return r.finish(nil, ck, herr)
			}
			if errors.Is(err, decoder.ErrMissingColumn) {
				return r.finish(nil, ck, &replication.ConfigError{Err: err})
			}
			if errors.As(err, new(*replication.ConfigError)) || errors.As(err, new(*gaps.GapError)) {
				return r.finish(nil, ck, err)
			}
		}
		// The stream starts where the catch-up left the watermark.
		from := h.tracker.Watermark()
		if err == nil {
			s, err = replication.Open(runCtx, streamCfg, from)
		}
		if gap := r.gaps.StreamError(err); gap != nil && s == nil {
			// The slot is gone (a promotion to a server without a copy):
			// no reconnect helps; the next start takes the slot-loss path.
			return r.finish(nil, ck, gap)
		}
		if err == nil {
			if err = r.arm(runCtx, h, from, !connected); err != nil {
				s.Close(context.Background())
			}
		}
		if err == nil {
			if failing && connected {
				r.log.Info().Msg("replication connection re-established")
				r.m.Reconnects.Inc()
			} else if failing {
				r.log.Info().Msg("slot acquired; streaming")
			}
			failing, connected = false, true
			attempt = 0
			err = r.runStream(runCtx, stop, s, h, k, ck)
			if errors.Is(err, replication.ErrStopped) || ctx.Err() != nil {
				return r.finish(s, ck, nil)
			}
			if herr := h.err(); herr != nil {
				return r.finish(s, ck, herr)
			}
			if errors.Is(err, errFellBehind) {
				// Ended at a transaction boundary: once Kafka has what was
				// sent and the walsender let the slot go, the loop's
				// catch-up reads the backlog in batches.
				s.Close(context.Background())
				if err := h.tracker.WaitDrained(runCtx); err != nil {
					return r.finish(nil, ck, nil)
				}
				r.waitReleased(runCtx)
				continue
			}
			if errors.Is(err, decoder.ErrMissingColumn) {
				// Reconnecting cannot help: the table no longer has a configured column.
				s.Close(context.Background())
				return r.finish(nil, ck, &replication.ConfigError{Err: err})
			}
			if gap := r.gaps.StreamError(err); gap != nil {
				err = gap
			}
			if errors.As(err, new(*replication.ConfigError)) || errors.As(err, new(*gaps.GapError)) {
				// Nor when the publication no longer streams the outbox, or the
				// slot was invalidated (gap checks).
				s.Close(context.Background())
				return r.finish(nil, ck, err)
			}
			s.Close(context.Background())
		} else if gap := r.gaps.StreamError(err); gap != nil {
			// START_REPLICATION refused for good (an invalidated slot).
			return r.finish(nil, ck, gap)
		}
		if ctx.Err() != nil {
			return r.finish(nil, ck, nil)
		}
		busy := errors.Is(err, replication.ErrSlotBusy)
		if busy {
			r.setReady(false, "not streaming: the slot is held by another process (this relay waits as a standby)")
		} else {
			r.setReady(false, "Postgres: the replication connection failed, reconnecting: "+oneLine(err))
		}
		if !failing {
			failing = true
			if busy {
				r.m.SetState(metrics.StateWaitingSlot)
				r.log.Warn().Err(err).Msg("slot is held by another process; waiting as a standby")
			} else {
				r.m.SetState(metrics.StateRetrying)
				r.log.Warn().Err(err).Msg("replication failed; reconnecting with backoff")
			}
		}
		// Events of a partly received transaction will be streamed again: wait
		// until Kafka acknowledged what was sent, then forget the open state.
		if err := h.tracker.WaitDrained(runCtx); err != nil {
			return r.finish(nil, ck, nil)
		}
		h.reset()
		retry := r.cfg.Retry
		if busy {
			// Poll a held slot quickly, so a standby takes over within seconds.
			retry = backoff.Policy{Base: 500 * time.Millisecond, Cap: 2 * time.Second}
		}
		// A gap the monitor found while no stream runs (an invalidated slot
		// refuses every reconnect) stops the relay, as it does a stream.
		wait := time.NewTimer(retry.Delay(attempt))
		select {
		case <-ctx.Done():
			wait.Stop()
			return r.finish(nil, ck, nil)
		case err := <-r.fatal:
			wait.Stop()
			return r.finish(nil, ck, err)
		case <-wait.C:
		}
	}
}

// pendingFailover switches failover on for the slot when the relay wants a
// failover slot and the slot was in use at start (checkFailover); it returns
// replication.ErrSlotBusy while it still is.
func (r *Relay) pendingFailover(ctx context.Context) error {
	if !r.enableFailover {
		return nil
	}
	if err := r.switchFailoverOn(ctx); err != nil {
		return err
	}
	r.enableFailover = false
	return nil
}

// arm prepares effectively-once delivery for a stream that starts at from:
// events committed before the server's current WAL position may be in Kafka
// already (sent by an earlier run, or before a reconnect), so the gate reads
// the partitions first. The first arm of a run logs what it found.
func (r *Relay) arm(ctx context.Context, h *handler, from pglogrepl.LSN, first bool) error {
	if h.gate == nil {
		return nil
	}
	cutoff, err := replication.CurrentWAL(ctx, r.pool)
	if err != nil {
		return fmt.Errorf("reconcile with Kafka: %w", err)
	}
	var topics []string
	if h.allFixed() {
		topics = h.fixedTopics()
	}
	sum, err := h.gate.Arm(ctx, from, cutoff, topics)
	if err != nil {
		return err
	}
	if first || sum.Partitions > 0 {
		later := ""
		if topics == nil && sum.Replay {
			later = "; the template's topics are read when their first replayed event comes"
		}
		r.log.Info().Int("partitions", sum.Partitions).Int64("duration_ms", sum.Took.Milliseconds()).
			Int("already_in_kafka", sum.Found).Str("lsn", from.String()).Str("cutoff", cutoff.String()).
			Msgf("reconciled %d partitions in %d ms, %d events already in Kafka%s", sum.Partitions, sum.Took.Milliseconds(), sum.Found, later)
	}
	return nil
}

// runStream runs one connection, marking the relay ready while it streams and
// the sink is not retrying.
func (r *Relay) runStream(ctx context.Context, stop <-chan struct{}, s *replication.Stream, h *handler, k health, ck *checkpoint.Committer) error {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			r.readyWhileProducing(k)
			if k.Retrying() {
				r.m.SetState(metrics.StateRetrying)
			}
			select {
			case <-done:
				r.setReady(false, "not streaming: the replication connection ended")
				return
			case <-t.C:
			}
		}
	}()
	defer func() {
		close(done)
		wg.Wait()
	}()
	// Run owns the connection: it is stopped through its context and closed
	// only after it returned (pgconn is not safe for concurrent use).
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The stream also ends at a transaction boundary when it falls behind
	// by the catch-up threshold (watchLag): batches drain the backlog.
	end, behind := make(chan struct{}), make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-stop:
		case <-behind:
		case <-done:
			return
		}
		close(end)
	}()
	if r.cfg.CatchUpThreshold > 0 && !r.noCatchUp {
		holdUntil := r.catchUpHoldUntil // set by the catch-up, on this goroutine
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.watchLag(sctx, h, s.Received, holdUntil, done, behind)
		}()
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Run(sctx, end, h) }()
	select {
	case err := <-errc:
		if errors.Is(err, replication.ErrStopped) && !closed(stop) && closed(behind) {
			return errFellBehind
		}
		return err
	case <-h.halted:
		// Halted on a permanent failure: stop reading at once.
		cancel()
		<-errc
		s.Close(context.Background())
		return h.err()
	case err := <-r.fatal:
		// A gap check found the publication no longer streams the outbox: stop.
		cancel()
		<-errc
		return err
	case err := <-ck.ServerDown():
		// Postgres is shutting down: its walsender waits for a confirmation of
		// everything it sent, which cannot be persisted first any more. Leave,
		// so the shutdown is not held up; nothing is confirmed past the store.
		cancel()
		<-errc
		s.Close(context.Background())
		return fmt.Errorf("postgres is shutting down: %w", err)
	}
}

// readyWhileProducing marks the relay ready while Kafka accepts events:
// streaming and catching up are producing.
func (r *Relay) readyWhileProducing(k health) {
	if k.Healthy() {
		r.setReady(true, "")
	} else {
		r.setReady(false, "Kafka: not accepting events (produce requests failing, retrying)")
	}
}

// stopBudget splits Config.ShutdownTimeout from the moment a stop began, so
// that the relay exits within it whatever Kafka and Postgres do: reading
// ends by half of it (the stream finishes the transaction it is reading, or
// is cut), the wait for Kafka's acknowledgements by four fifths, saving and
// confirming the checkpoint by nine tenths; closing the producer, the
// connections and the metrics server takes the last tenth. Before, the
// wait for acknowledgements got a fresh half once reading had ended, and
// with Kafka not answering the relay exited just after the whole budget,
// saying nothing until then: a supervisor allowing that budget killed it
// (chaos seed 4244, --shutdown-timeout 10s against the schedule's 10 s).
type stopBudget struct {
	began time.Time
	total time.Duration
}

func (b stopBudget) readBy() time.Time  { return b.began.Add(b.total / 2) }
func (b stopBudget) drainBy() time.Time { return b.began.Add(b.total * 8 / 10) }
func (b stopBudget) saveBy() time.Time  { return b.began.Add(b.total * 9 / 10) }

// stopping returns the budget of the relay's stop, started at the first call.
func (r *Relay) stopping() stopBudget {
	r.stopOnce.Do(func() { r.stop = stopBudget{began: time.Now(), total: r.cfg.ShutdownTimeout} })
	return r.stop
}

// logStop says, as the stop begins, what it waits for and until when.
func (r *Relay) logStop(b stopBudget, h *handler, k health) {
	_, events := h.tracker.InFlight()
	kafka := ""
	switch {
	case h.pause.CircuitClosed() != nil:
		kafka = " (Kafka is not accepting events: the circuit is open)"
	case k.Retrying():
		kafka = " (Kafka is retrying failed requests)"
	}
	wait := "nothing is in flight"
	if events > 0 {
		wait = fmt.Sprintf("Kafka has until %s to acknowledge the %d events in flight%s, which are otherwise sent again after a restart",
			b.drainBy().Sub(b.began).Round(time.Millisecond), events, kafka)
	}
	r.log.Info().Int("events_in_flight", events).Int64("shutdown_timeout_ms", b.total.Milliseconds()).
		Msgf("stopping: reading ends with the transaction being read (within %s); %s; then the checkpoint is saved and confirmed; the relay exits within %s, its %s",
			b.readBy().Sub(b.began).Round(time.Millisecond), wait, b.total, r.cfg.Names.Name("ShutdownTimeout"))
}

// finish drains in-flight events (bounded) unless the relay halted, persists
// the final checkpoint and confirms it on s when there is a stream, all
// within the stop's budget.
func (r *Relay) finish(s *replication.Stream, ck *checkpoint.Committer, cause error) error {
	r.setReady(false, "stopping")
	r.m.SetState(metrics.StateStopping)
	b := r.stopping()
	ctx, cancel := context.WithDeadline(context.Background(), b.saveBy())
	defer cancel()
	var confirm func(context.Context, pglogrepl.LSN) error
	if s != nil && cause == nil {
		confirm = s.SendStatus
	}
	var drainBy time.Time
	if cause == nil {
		drainBy = b.drainBy()
	}
	lsn := ck.Finish(ctx, drainBy, confirm)
	if s != nil {
		s.Close(ctx)
	}
	r.log.Info().Str("lsn", lsn.String()).Msg("stopped")
	return cause
}

// oneLine is err's message on one line, for the /readyz body.
func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }
