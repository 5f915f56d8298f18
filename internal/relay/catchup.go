package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// The catch-up path (Config.CatchUpThreshold): before each stream starts, a
// slot further behind than the threshold is read in batches through
// pg_logical_slot_peek_binary_changes on a connection of Config.Pool, fed to
// the same handler as the stream (same decoder, tracker, gate and committer),
// and moved with pg_replication_slot_advance only once Kafka acknowledged
// the batch and its checkpoint is persisted: peek → produce → ack → persist
// → advance, one batch at a time, since a peek before the advance would read
// the batch again. The stream then starts from the watermark, where the last
// batch ended: no gap, and nothing read twice.

// catchUpReadyAfter bounds how long a batch waits for the standby the slot
// is on to replay the checkpoint that moves it; past it the relay streams.
const catchUpReadyAfter = 30 * time.Second

// errCatchUpFallback ends a catch-up that cannot go on for a reason the
// stream does not share; the relay streams instead.
var errCatchUpFallback = errors.New("catch-up not possible")

// catchUp drains the slot's backlog in batches when it is behind by more
// than Config.CatchUpThreshold, and returns nil once the stream should take
// over (caught up, not behind, or catch-up unusable here: logged).
// It returns replication.ErrStopped once stop was closed and what it read
// is confirmed, replication.ErrSlotBusy when another process holds the slot,
// and otherwise the error that ended it, as a stream's.
func (r *Relay) catchUp(ctx context.Context, stop <-chan struct{}, h *handler, k health, ck *checkpoint.Committer, first bool) (armed bool, err error) {
	threshold := r.cfg.CatchUpThreshold
	if threshold <= 0 || r.noCatchUp {
		return false, nil
	}
	lag, err := replication.ReadSlotLag(ctx, r.pool, r.cfg.Slot)
	if err != nil {
		// The stream's start says what is wrong, and the gap checks judge
		// it: a slot missing after a promotion stops the relay
		// (slot_missing) instead of a catch-up retrying.
		r.log.Debug().Err(err).Msg("catch-up skipped: cannot read the slot's lag")
		return false, nil
	}
	if lag.Behind() < uint64(threshold) || lag.Active {
		// Held by another relay (or by the walsender of this one's last
		// stream, still exiting): the stream's start decides, and waits.
		return false, nil
	}

	conn, err := replication.ConnectSQL(ctx, r.cfg.PGURL, r.cfg.Names)
	if err != nil {
		return false, fmt.Errorf("catch up: %w", err)
	}
	defer conn.Close(context.Background())

	// A save that failed while Postgres shut down before this catch-up
	// left its error; this catch-up's own statements fail if it still is.
	select {
	case <-ck.ServerDown():
	default:
	}

	// The batch stops when the relay halts, a gap check fails or Postgres
	// shuts down, as the stream does (runStream).
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			r.readyWhileProducing(k)
			select {
			case <-done:
				return
			case <-h.halted:
				cancel(h.err())
				return
			case err := <-r.fatal:
				cancel(err)
				return
			case err := <-ck.ServerDown():
				cancel(fmt.Errorf("postgres is shutting down: %w", err))
				return
			case <-t.C:
			}
		}
	}()
	defer func() {
		close(done)
		wg.Wait()
		r.setReady(false, "not streaming: the catch-up ended")
	}()

	r.log.Info().Uint64("lag_bytes", lag.Behind()).Str("confirmed_lsn", lag.Confirmed.String()).Str("wal_lsn", lag.End.String()).
		Int64("threshold_bytes", threshold).Int("batch", r.cfg.CatchUpBatch).
		Msgf("slot is %d MiB behind: catching up in batches (source.catch_up_threshold_mib)", lag.Behind()>>20)
	r.m.CatchUpSwitches.WithLabelValues(metrics.CatchUpTo).Inc()
	r.m.CatchingUp.Set(1)
	r.m.SetState(metrics.StateStreaming)
	defer r.m.CatchingUp.Set(0)

	c := catchUpRun{r: r, h: h, ck: ck, conn: conn}
	start := time.Now()
	batches, txns0 := 0, h.tracker.Delivered()
	var reason string
	err = c.run(cctx, stop, &lag, first, &armed, &batches, &reason)
	if cause := context.Cause(cctx); cause != nil && ctx.Err() == nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	switch {
	case err == nil:
	case errors.Is(err, errCatchUpFallback):
		r.m.CatchUpSwitches.WithLabelValues(metrics.StreamTo).Inc()
		r.log.Warn().Err(err).Int("batches", batches).Str("lsn", h.tracker.Watermark().String()).
			Msg("catch-up stopped: switching to streaming, and streaming only until the relay restarts")
		r.noCatchUp = true
		return armed, nil
	case errors.Is(err, replication.ErrStopped):
		return armed, err
	default:
		r.log.Warn().Err(err).Int("batches", batches).Msg("catch-up failed")
		return armed, err
	}
	r.m.CatchUpSwitches.WithLabelValues(metrics.StreamTo).Inc()
	r.log.Info().Int("batches", batches).Uint64("transactions", h.tracker.Delivered()-txns0).
		Int64("duration_ms", time.Since(start).Milliseconds()).Uint64("lag_bytes", lag.Behind()).Str("lsn", h.tracker.Watermark().String()).
		Str("reason", reason).Msg("caught up: switching to streaming")
	return armed, nil
}

// catchUpRun is one catch-up's batches.
type catchUpRun struct {
	r    *Relay
	h    *handler
	ck   *checkpoint.Committer
	conn *replication.SQLConn
}

func (c catchUpRun) run(ctx context.Context, stop <-chan struct{}, lag *replication.SlotLag, first bool, armed *bool, batches *int, reason *string) error {
	r, h := c.r, c.h
	// A reconnect may leave acknowledged events unpersisted, or the store
	// ahead of the slot: a peek starts at the slot, so it must be where the
	// watermark is.
	if err := c.confirm(ctx, lag); err != nil {
		return err
	}
	if err := r.arm(ctx, h, h.tracker.Watermark(), first); err != nil {
		return err
	}
	*armed = true
	threshold := uint64(r.cfg.CatchUpThreshold)
	cfg := replication.PeekConfig{Slot: r.cfg.Slot, Publication: r.cfg.Publication, Messages: r.cfg.Decoder.MessagePrefix != ""}
	limit, growing := r.cfg.CatchUpBatch, 0
	for {
		if lag.Behind() < threshold {
			*reason = "behind by less than the threshold"
			return nil
		}
		if redo := lag.Redecode(); redo > threshold && redo > (streamCost-1)*lag.Behind() {
			// The next batch would decode so much again, from the slot's
			// restart point (held back by the last running-transactions
			// record or by a long-running transaction), that the stream,
			// which decodes the rest once, costs Postgres less.
			*reason = fmt.Sprintf("a batch would decode %d KiB again from the slot's restart point %s, more than %d times the %d KiB left", redo>>10, lag.Restart, streamCost-1, lag.Behind()>>10)
			return nil
		}
		select {
		case <-stop:
			return replication.ErrStopped // what was read is confirmed
		default:
		}
		r.m.CatchUpBatches.Inc()
		r.m.CatchUpRedecoded.Add(float64(lag.Redecode()))
		*batches++
		upto := *lag
		began := time.Now()
		res, err := replication.Peek(ctx, c.conn, cfg, upto.End, limit, stop, h)
		if err != nil {
			return fmt.Errorf("catch up: %w", err)
		}
		read := time.Since(began)
		if err := h.tracker.WaitDrained(ctx); err != nil {
			return fmt.Errorf("catch up: %w", err)
		}
		if res.Complete && h.AtBoundary() {
			// Every transaction before upto.End was read and acknowledged:
			// the slot may move to it, as a keepalive moves an idle stream.
			h.tracker.Idle(upto.End, upto.Time)
		}
		if err := c.confirm(ctx, lag); err != nil {
			return err
		}
		r.log.Debug().Int("rows", res.Rows).Int("limit", limit).Int64("read_ms", read.Milliseconds()).Int64("total_ms", time.Since(began).Milliseconds()).
			Uint64("redecoded_bytes", upto.Redecode()).Str("lsn", lag.Confirmed.String()).Uint64("lag_bytes", lag.Behind()).Msg("catch-up batch")
		if res.Stopped {
			return replication.ErrStopped
		}
		if res.Complete {
			*reason = "caught up with the WAL"
			r.catchUpHold = 0
			return nil
		}
		// A batch that decoded more again than it moved the slot is mostly
		// re-decoding: the next asks for twice as much, up to
		// maxBatchGrowth times the setting, beyond which the stream,
		// which decodes once, is cheaper.
		moved := uint64(0)
		if lag.Confirmed > upto.Confirmed {
			moved = uint64(lag.Confirmed - upto.Confirmed)
		}
		if upto.Redecode() > moved {
			if limit >= r.cfg.CatchUpBatch*maxBatchGrowth {
				*reason = fmt.Sprintf("a batch of %d messages decoded %d KiB again from the slot's restart point to move it %d KiB", limit, upto.Redecode()>>10, moved>>10)
				return nil
			}
			limit *= 2
		}
		// Writers faster than the batches: the stream keeps up better.
		if lag.Behind() >= upto.Behind() {
			if growing++; growing >= notShrinking {
				*reason = fmt.Sprintf("the backlog did not shrink over %d batches (%d KiB)", notShrinking, lag.Behind()>>10)
				// Batches do no better than the stream here (writers, or
				// Kafka, as fast as either): a stream that falls behind
				// again is left alone for a while, growing each time.
				r.catchUpHold = min(max(2*r.catchUpHold, catchUpHoldFirst), catchUpHoldMax)
				r.catchUpHoldUntil = time.Now().Add(r.catchUpHold)
				return nil
			}
		} else {
			growing = 0
		}
	}
}

// maxBatchGrowth bounds how far a catch-up grows its batches past
// Config.CatchUpBatch when re-decoding dominates them (each batch is a
// temporary file on the server).
const maxBatchGrowth = 4

// streamCost is what streaming a byte of the backlog costs Postgres, in
// bytes a batch decodes: the walsender spends about three times what
// decoding alone does on a one-event transaction (bench, issue 44: 23-25
// µs/ev against 7.2), so a batch that decodes up to twice what is left
// again still costs less than streaming it.
const streamCost = 3

// notShrinking is how many batches in a row may end with the slot as far
// behind as before, or further, before the relay streams instead.
const notShrinking = 3

// confirm persists the watermark (every event before it acknowledged) and
// moves the slot to what the committer hands out, then reads the slot's lag
// into lag.
func (c catchUpRun) confirm(ctx context.Context, lag *replication.SlotLag) error {
	h, ck := c.h, c.ck
	if err := h.tracker.WaitDrained(ctx); err != nil {
		return fmt.Errorf("catch up: %w", err)
	}
	if _, err := ck.Save(ctx); err != nil {
		return fmt.Errorf("catch up: %w", err)
	}
	want := h.tracker.Watermark()
	if want > lag.Confirmed && ck.Flushed() < want {
		// On a standby the committer hands out only what the standby holds
		// of the checkpoint: wait until it has replayed it.
		wait := time.NewTimer(catchUpReadyAfter)
		defer wait.Stop()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for ck.Flushed() < want {
			_ = ck.Refresh(ctx) // a failure is logged; the wait bounds it
			select {
			case <-ctx.Done():
				return fmt.Errorf("catch up: %w", ctx.Err())
			case <-wait.C:
				return fmt.Errorf("%w: the checkpoint at %s is not on the server the slot is on after %v", errCatchUpFallback, want, catchUpReadyAfter)
			case <-tick.C:
			}
		}
	}
	to := ck.Flushed()
	if to > lag.Confirmed {
		if err := replication.AdvanceSlot(ctx, c.conn, c.r.cfg.Slot, to); err != nil {
			if fallback(err) {
				return fmt.Errorf("%w: %w", errCatchUpFallback, err)
			}
			return fmt.Errorf("catch up: %w", err)
		}
	}
	l, err := replication.ReadSlotLag(ctx, c.conn, c.r.cfg.Slot)
	if err != nil {
		return fmt.Errorf("catch up: %w", err)
	}
	*lag = l
	return nil
}

// fallback reports whether err says the server refuses to move the slot
// through SQL for a reason the stream does not share (a slot synchronized
// from the primary, privileges): the relay then streams.
func fallback(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "55006": // busy: the caller waits as for a stream
		return false
	case "55000", "42501", "0A000":
		return true
	}
	return false
}

// errFellBehind ends a stream that fell behind by the catch-up threshold, at
// a transaction boundary (watchLag); the stream loop then catches up.
var errFellBehind = errors.New("the stream fell behind: catching up in batches")

// lagPoll is how often a stream checks how far behind the WAL it is.
const lagPoll = 5 * time.Second

// catchUpHoldFirst and catchUpHoldMax bound how long a stream that falls
// behind is left alone after a catch-up whose batches did not gain on the
// backlog (the hold doubles each time, and ends with a catch-up that does).
const (
	catchUpHoldFirst = time.Minute
	catchUpHoldMax   = 16 * time.Minute
)

// watchLag closes behind when the stream has been further behind the WAL
// than Config.CatchUpThreshold (positive) at two checks in a row, lagPoll apart, and
// no less so at the second (a burst the stream absorbs does not end it),
// once holdUntil has passed.
// Behind is what the stream has not read yet: the server's readable WAL
// less where the stream is (the later of what it received and the
// watermark), so a large transaction being read gains on it. It returns
// when done is closed or ctx ends.
func (r *Relay) watchLag(ctx context.Context, h *handler, received func() pglogrepl.LSN, holdUntil time.Time, done <-chan struct{}, behind chan<- struct{}) {
	threshold := uint64(r.cfg.CatchUpThreshold)
	t := time.NewTicker(lagPoll)
	defer t.Stop()
	var last uint64
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, lagPoll)
		lag, err := replication.ReadSlotLag(qctx, r.pool, r.cfg.Slot)
		cancel()
		if err != nil {
			continue // the monitor reports a server that does not answer
		}
		var now uint64
		if at := max(received(), h.tracker.Watermark()); lag.End > at {
			now = uint64(lag.End - at)
		}
		if now >= threshold && last >= threshold && now >= last && time.Now().After(holdUntil) {
			r.log.Info().Uint64("lag_bytes", now).Int64("threshold_bytes", r.cfg.CatchUpThreshold).
				Msgf("the stream fell %d MiB behind the WAL and did not gain on it over %s: ending it at the next transaction boundary to catch up in batches", now>>20, lagPoll)
			close(behind)
			return
		}
		last = now
	}
}

// waitReleased waits, up to catchUpReleaseWait, until the walsender of the
// stream that just ended has let the slot go, so that the catch-up may move
// it (a slot in use is left to the stream).
func (r *Relay) waitReleased(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, catchUpReleaseWait)
	defer cancel()
	for {
		lag, err := replication.ReadSlotLag(ctx, r.pool, r.cfg.Slot)
		if err != nil || !lag.Active {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// catchUpReleaseWait bounds waitReleased: a walsender exits within
// milliseconds of its connection's end.
const catchUpReleaseWait = 5 * time.Second

// closed reports whether c is closed.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
