package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
)

// Saver persists a checkpoint; it returns nil only once the checkpoint is
// durable (TableStore, FileStore).
type Saver interface {
	Save(ctx context.Context, c Checkpoint) error
}

// CommitterConfig configures a Committer.
type CommitterConfig struct {
	Store Saver
	// Base is copied into every saved checkpoint (slot, system id, relay name);
	// the Committer sets LSN, CommitTime, UpdatedAt and Offsets. Base's
	// CommitTime is that of the checkpoint at Start: Persist stores it again
	// while the watermark has not moved.
	Base Checkpoint
	// Offsets, when set, is called by every save once it has chosen the LSN to
	// persist, with that LSN, and its result is stored with it; nil stores none
	// (at-least-once delivery). It must return offsets valid for lsn: per
	// partition, the offset after the last record of an event at or before lsn,
	// none of a later event. It is called from the goroutine of Run or of
	// whoever calls Save or Finish, never concurrently with itself (saves are
	// serialised), with the Committer's lock held: it must not call Save or
	// Finish. The Committer keeps the returned value only until the store has
	// written it, but it must not be changed meanwhile (return a copy, e.g.
	// with Offsets.Clone).
	Offsets func(lsn pglogrepl.LSN) Offsets
	// Replica, when set, reads the checkpoint store as the server the slot
	// is on holds it: a hot standby whose checkpoint the relay writes on the
	// primary (Store) holds each checkpoint only once it has replayed its
	// write. Flushed is then never past the LSN Replica holds for the slot,
	// so that a promotion of the standby finds a checkpoint no older than
	// its slot. Nil when the slot and the store share a server, or the
	// store is a file.
	Replica Loader
	// Start is the position streaming starts from: already persisted, so it is
	// the first Flushed value and the Tracker's first watermark.
	Start pglogrepl.LSN
	// Every bounds how long a watermark moved by acknowledged events waits to
	// be persisted (saves are coalesced to one per Every); Idle how often an
	// advance with no new events (keepalives on an idle outbox) is persisted,
	// since each save writes WAL of its own. Both must be positive (the
	// relay's configuration holds their defaults).
	Every, Idle time.Duration
	Logger      zerolog.Logger
	Metrics     *metrics.Metrics
}

// Committer is the one owner of DESIGN invariant 1: it alone decides which LSN
// the relay may confirm, and with the Opening it is built from (start-up:
// snapshot marker, position after a snapshot or backfill, start position) it
// is the only writer of checkpoints. It holds the Tracker that turns Kafka
// acknowledgements into a watermark, persists that watermark to the store, and
// hands out only what it persisted (Flushed): the stream confirms nothing else
// to the slot, so the store is never behind the slot and nothing is confirmed
// past an event Kafka has not acknowledged. With a Replica (a slot on a hot
// standby, the store on its primary) it hands out only what the standby
// holds of the store too, so the store the standby keeps through a promotion
// is not behind the slot either.
type Committer struct {
	tracker *Tracker
	store   Saver
	base    Checkpoint
	// covered replaces base.Tables in a save at or past coveredAt
	// (Opening.CoverTables).
	covered   []string
	coveredAt pglogrepl.LSN
	offsets   func(pglogrepl.LSN) Offsets
	// commitTime is the CommitTime of the persisted checkpoint (Base's at
	// first), which Persist stores again when the watermark has not moved.
	commitTime time.Time
	log        zerolog.Logger
	m          *metrics.Metrics
	every      time.Duration
	idle       time.Duration
	persisted  atomic.Uint64
	replica    Loader
	// confirmable is what Flushed returns when replica is set: the
	// persisted LSN that replica holds too (0 until first read).
	confirmable atomic.Uint64
	rmu         sync.Mutex // serializes reads of replica
	rfailing    bool

	mu            sync.Mutex // serializes saves
	lastSave      time.Time
	lastDelivered uint64
	storedOldest  time.Time // the OldestUnrelayed of the last save
	failing       bool
	anomalies     uint64 // Tracker anomalies already reported
	serverDown    chan error
}

// NewCommitter returns a Committer whose Tracker and Flushed start at cfg.Start.
func NewCommitter(cfg CommitterConfig) *Committer {
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.Discard()
	}
	c := &Committer{
		tracker: NewTracker(cfg.Start), store: cfg.Store, base: cfg.Base, offsets: cfg.Offsets,
		commitTime: cfg.Base.CommitTime,
		log:        cfg.Logger, m: cfg.Metrics, every: cfg.Every, idle: cfg.Idle,
		serverDown: make(chan error, 1), replica: cfg.Replica,
	}
	c.persisted.Store(uint64(cfg.Start))
	return c
}

// Tracker returns the acknowledgement tracker the stream and the producer's
// acknowledgements feed (Begin, Add, Commit, Ack, Idle).
func (c *Committer) Tracker() *Tracker { return c.tracker }

// Flushed returns the only LSN the relay may confirm to the slot: the newest
// persisted watermark, or with a Replica the newest one the replica holds
// too (0, which confirms nothing, until Refresh first read it).
func (c *Committer) Flushed() pglogrepl.LSN {
	if c.replica != nil {
		return pglogrepl.LSN(c.confirmable.Load())
	}
	return c.stored()
}

// stored returns the newest persisted watermark.
func (c *Committer) stored() pglogrepl.LSN { return pglogrepl.LSN(c.persisted.Load()) }

// replicaReadTimeout bounds one read of the replica's checkpoint: a standby
// that does not answer holds Flushed, it does not hold Run.
const replicaReadTimeout = 5 * time.Second

// Refresh reads what CommitterConfig.Replica holds for the slot and moves
// Flushed up to it, never past what was persisted. Run refreshes at each
// tick; the relay calls it before it streams, so the first confirmation
// is no later than the replica. A failed read keeps Flushed where it is: it
// is logged on the first failure and counted, and returned.
func (c *Committer) Refresh(ctx context.Context) error {
	if c.replica == nil {
		return nil
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, replicaReadTimeout)
	cp, have, err := c.replica.Load(lctx, c.base.Slot)
	cancel()
	if err != nil {
		c.m.CheckpointErrors.Inc()
		if !c.rfailing {
			c.rfailing = true
			c.log.Warn().Err(err).Str("confirmed_lsn", c.Flushed().String()).
				Msg("cannot read the checkpoint on the standby the slot is on: the slot is not confirmed further until it can (its WAL is retained meanwhile)")
		}
		return fmt.Errorf("read the checkpoint the standby holds: %w", err)
	}
	if c.rfailing {
		c.rfailing = false
		c.log.Info().Msg("reading the checkpoint on the standby again")
	}
	if !have {
		return nil
	}
	if held := min(cp.LSN, c.stored()); uint64(held) > c.confirmable.Load() {
		c.confirmable.Store(uint64(held))
	}
	return nil
}

// ServerDown receives the error of a save that failed because Postgres is
// shutting down: its walsender then waits for a confirmation that can no
// longer be persisted first, so the stream should leave.
func (c *Committer) ServerDown() <-chan error { return c.serverDown }

// Run persists the watermark within Every of its moving, until ctx is done,
// and reports tracker anomalies as they appear.
func (c *Committer) Run(ctx context.Context) {
	t := time.NewTicker(c.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, events := c.tracker.InFlight()
		c.m.InFlightEvents.Set(float64(events))
		oldest, waiting := c.tracker.OldestPending()
		age := 0.0
		if waiting {
			age = max(time.Since(oldest).Seconds(), 0)
		}
		c.m.OldestUnrelayedAge.Set(age)
		c.reportAnomalies()
		// cdc-relay status reads the oldest-unrelayed time from the stored
		// row: a new one is stored at this tick, so that status tells the age
		// within Every of the truth, also while stuck (a broker down).
		if !waiting {
			oldest = time.Time{}
		}
		c.mu.Lock()
		changed := !c.storedOldest.Equal(oldest)
		c.mu.Unlock()
		_ = c.Refresh(ctx) // a failure is logged and counted; the next tick retries
		if c.tracker.Watermark() <= c.stored() {
			// Stuck behind an unacknowledged event: store a new oldest time
			// at once, then refresh the row every Idle (the relay's
			// DefaultIdleCheckpoint).
			c.mu.Lock()
			stale := waiting && (changed || time.Since(c.lastSave) >= c.idle)
			c.mu.Unlock()
			if stale {
				_ = c.Persist(ctx) // a failure is logged and counted; the next tick retries
			}
			continue
		}
		// Advances with no new events (keepalives on an idle outbox) are saved
		// less often: each save writes WAL of its own.
		c.mu.Lock()
		quiet := c.tracker.Delivered() == c.lastDelivered && time.Since(c.lastSave) < c.idle && !changed
		c.mu.Unlock()
		if quiet {
			continue
		}
		_, _ = c.Save(ctx) // a failure is logged and counted; the next tick retries
	}
}

// reportAnomalies adds new tracker anomalies to the metric and logs the first.
func (c *Committer) reportAnomalies() {
	n, last := c.tracker.Anomalies()
	c.mu.Lock()
	defer c.mu.Unlock()
	if n <= c.anomalies {
		return
	}
	if c.anomalies == 0 {
		c.log.Error().Err(last).Uint64("anomalies", n).
			Msg("acknowledgement accounting saw a misuse it ignored (a relay bug; the checkpoint never moves past it); please report it with this log")
	}
	c.m.TrackerAnomalies.Add(float64(n - c.anomalies))
	c.anomalies = n
}

// Save persists the current watermark, when it is ahead of what was
// persisted, with the offsets CommitterConfig.Offsets returns for it, and
// returns the persisted LSN.
func (c *Committer) Save(ctx context.Context) (pglogrepl.LSN, error) {
	return c.save(ctx, false)
}

// Persist saves a checkpoint now, even when the watermark has not moved, so
// that what CommitterConfig.Offsets returns is durable (a topic's offsets
// registered before the relay first writes to it).
func (c *Committer) Persist(ctx context.Context) error {
	_, err := c.save(ctx, true)
	return err
}

func (c *Committer) save(ctx context.Context, force bool) (pglogrepl.LSN, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delivered := c.tracker.Delivered()
	w, at := c.tracker.Position()
	if w <= c.stored() {
		if !force {
			return c.stored(), nil
		}
		w, at = c.stored(), c.commitTime
	}
	cp := c.base
	cp.LSN, cp.CommitTime = w, at
	if c.covered != nil && w >= c.coveredAt {
		cp.Tables = c.covered
	}
	cp.UpdatedAt = time.Now()
	cp.Offsets = nil // never Base's: offsets are only valid for the LSN they were taken at
	cp.OldestUnrelayed, _ = c.tracker.OldestPending()
	if c.offsets != nil {
		cp.Offsets = c.offsets(w)
	}
	if err := c.store.Save(ctx, cp); err != nil {
		c.m.CheckpointErrors.Inc()
		if !c.failing {
			c.failing = true
			c.log.Error().Err(err).Str("lsn", w.String()).Msg("persist checkpoint failed; the slot is not confirmed until it succeeds")
		}
		if serverShuttingDown(err) {
			select {
			case c.serverDown <- err:
			default:
			}
		}
		return c.stored(), fmt.Errorf("save checkpoint %s: %w", w, err)
	}
	if c.failing {
		c.failing = false
		c.log.Info().Str("lsn", w.String()).Msg("checkpoint persisted again")
	}
	c.m.CheckpointSaves.Inc()
	c.persisted.Store(uint64(w))
	c.commitTime = cp.CommitTime
	c.lastSave = cp.UpdatedAt
	c.lastDelivered = delivered
	c.storedOldest = cp.OldestUnrelayed
	return w, nil
}

// Finish ends a run: unless drainBy is zero it waits, until then (and within
// ctx), for Kafka to acknowledge every event in flight, then persists the
// watermark and, when that succeeded and confirm is not nil, confirms
// Flushed through it (the persisted LSN, or with a Replica what it holds of
// it), within ctx: the wait ends before ctx does, so that the save gets
// its share of the time left. It returns the persisted LSN. Failures are
// logged, not returned: the relay stops either way, and whatever was not
// confirmed is delivered again after a restart.
func (c *Committer) Finish(ctx context.Context, drainBy time.Time, confirm func(context.Context, pglogrepl.LSN) error) pglogrepl.LSN {
	if !drainBy.IsZero() {
		dctx, cancel := context.WithDeadline(ctx, drainBy)
		err := c.tracker.WaitDrained(dctx)
		cancel()
		if err != nil {
			_, events := c.tracker.InFlight()
			c.log.Warn().Int("events", events).Msg("stopping before Kafka acknowledged every event; they will be delivered again after restart")
		}
	}
	c.reportAnomalies()
	lsn, err := c.Save(ctx)
	if err != nil {
		c.log.Error().Err(err).Msg("persist final checkpoint")
		return lsn
	}
	if confirm != nil {
		_ = c.Refresh(ctx) // a failure is logged; Flushed stays where it was
		if err := confirm(ctx, c.Flushed()); err != nil {
			c.log.Warn().Err(err).Msg("confirm final position")
		}
	}
	return lsn
}

// serverShuttingDown reports whether err says the server is shutting down or
// refuses connections: admin_shutdown, crash_shutdown, cannot_connect_now, or a
// refused TCP connection.
func serverShuttingDown(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03":
			return true
		}
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}
