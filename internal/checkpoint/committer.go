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
	// Standbys, when set, reads where the WAL of the server the store writes
	// to ends and how far the standbys that a failover may promote have
	// flushed it: the slot is a failover slot on that same server (a
	// checkpoint table on the primary). A standby's synchronized copy of the
	// slot reaches a position once the standby has flushed that position,
	// which may be before it has the write of the checkpoint covering it;
	// promoted then, it would hold a slot ahead of its checkpoint. Flushed is
	// therefore only a persisted LSN whose write those standbys had flushed.
	// Nil otherwise; never with Replica (no failover slot on a standby).
	Standbys func(ctx context.Context) (StandbyFlush, error)
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

// StandbyFlush is what CommitterConfig.Standbys reads, in one query.
type StandbyFlush struct {
	// WALEnd is the server's WAL insert position: past the write of every
	// checkpoint saved before the read.
	WALEnd pglogrepl.LSN
	// Slots names the standbys that must hold a checkpoint before the slot
	// is confirmed up to it (synchronized_standby_slots); "" when none must,
	// and Flushed means nothing.
	Slots string
	// Flushed is how far every one of them has flushed the WAL; 0 when one
	// has nothing or is missing.
	Flushed pglogrepl.LSN
}

// written is a persisted LSN whose checkpoint write ended before end.
type written struct{ lsn, end pglogrepl.LSN }

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
// is not behind the slot either; with Standbys (a failover slot), only what
// the standbys a promotion may choose have flushed of the store, so a
// promoted standby holds a checkpoint no older than its copy of the slot.
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
	standbys   func(context.Context) (StandbyFlush, error)
	// confirmable is what Flushed returns when replica or standbys is set:
	// the persisted LSN that replica holds too, or whose write the standbys
	// have flushed (0 until first read). It only grows (raise).
	confirmable atomic.Uint64
	// ungated: the last read of standbys named none, so a save is
	// confirmable at once.
	ungated  atomic.Bool
	rmu      sync.Mutex // serializes reads of replica or standbys, guards the fields below
	rfailing bool
	// waiting are persisted LSNs whose write the standbys had not flushed
	// at the last read, oldest first: at most two, the oldest and the
	// newest (each newer save replaces the second), so that the slot
	// advances in steps while the standbys lag, however long.
	waiting []written
	// heldSince is when the standbys began holding a save back; heldLogged
	// whether that was logged (after standbyHoldWarning).
	heldSince  time.Time
	heldLogged bool

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
		serverDown: make(chan error, 1), replica: cfg.Replica, standbys: cfg.Standbys,
	}
	c.persisted.Store(uint64(cfg.Start))
	return c
}

// Tracker returns the acknowledgement tracker the stream and the producer's
// acknowledgements feed (Begin, Add, Commit, Ack, Idle).
func (c *Committer) Tracker() *Tracker { return c.tracker }

// Flushed returns the only LSN the relay may confirm to the slot: the newest
// persisted watermark; with a Replica the newest one the replica holds too;
// with Standbys the newest one whose write the standbys had flushed (0,
// which confirms nothing, until Refresh first read them).
func (c *Committer) Flushed() pglogrepl.LSN {
	if c.replica != nil || c.standbys != nil {
		return pglogrepl.LSN(c.confirmable.Load())
	}
	return c.stored()
}

// raise moves confirmable up to lsn, never down: saves and reads of the
// standbys may race, and a slot is never confirmed backwards.
func (c *Committer) raise(lsn pglogrepl.LSN) {
	for {
		old := c.confirmable.Load()
		if uint64(lsn) <= old || c.confirmable.CompareAndSwap(old, uint64(lsn)) {
			return
		}
	}
}

// stored returns the newest persisted watermark.
func (c *Committer) stored() pglogrepl.LSN { return pglogrepl.LSN(c.persisted.Load()) }

// replicaReadTimeout bounds one read of the replica's checkpoint or of the
// standbys' flush position: a server that does not answer holds Flushed,
// it does not hold Run.
const replicaReadTimeout = 5 * time.Second

// standbyHoldWarning is how long the standbys may hold a save back before
// the relay says so: they flush within milliseconds while they stream.
const standbyHoldWarning = 10 * time.Second

// Refresh reads what CommitterConfig.Replica holds for the slot, or how far
// CommitterConfig.Standbys have flushed, and moves Flushed up to what that
// allows, never past what was persisted. Run refreshes at each tick; the
// relay calls it before it streams, so the first confirmation is no later
// than the replica or the standbys. A failed read keeps Flushed where it
// is: it is logged on the first failure and counted, and returned.
func (c *Committer) Refresh(ctx context.Context) error {
	if c.standbys != nil {
		return c.refreshStandbys(ctx)
	}
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
	c.raise(min(cp.LSN, c.stored()))
	return nil
}

// refreshStandbys is Refresh with Standbys: a save persisted before the
// read ended its write before the WALEnd read, so it is confirmable once
// the standbys have flushed that far, at this read or a later one.
func (c *Committer) refreshStandbys(ctx context.Context) error {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	persisted := c.stored()
	lctx, cancel := context.WithTimeout(ctx, replicaReadTimeout)
	sf, err := c.standbys(lctx)
	cancel()
	if err != nil {
		c.m.CheckpointErrors.Inc()
		if !c.rfailing {
			c.rfailing = true
			c.log.Warn().Err(err).Str("confirmed_lsn", c.Flushed().String()).
				Msg("cannot read how far the standbys of synchronized_standby_slots have flushed the checkpoint: the slot is not confirmed further until it can (its WAL is retained meanwhile)")
		}
		return fmt.Errorf("read how far the standbys have flushed the checkpoint: %w", err)
	}
	if c.rfailing {
		c.rfailing = false
		c.log.Info().Msg("reading how far the standbys have flushed the checkpoint again")
	}
	if sf.Slots == "" {
		// No standby must hold it: the walsender does not wait for one
		// either, and the relay warned at start that a failover may lose
		// events (gaps, synchronized_standby_slots_unset).
		c.ungated.Store(true)
		c.waiting = nil
		c.raise(c.stored())
		c.held(sf, false)
		return nil
	}
	c.ungated.Store(false)
	if n := len(c.waiting); uint64(persisted) > c.confirmable.Load() && (n == 0 || persisted > c.waiting[n-1].lsn) {
		w := written{lsn: persisted, end: sf.WALEnd}
		if n < 2 {
			c.waiting = append(c.waiting, w)
		} else {
			c.waiting[1] = w
		}
	}
	for i := len(c.waiting) - 1; i >= 0; i-- {
		if c.waiting[i].end <= sf.Flushed {
			c.raise(c.waiting[i].lsn)
			c.waiting = append(c.waiting[:0], c.waiting[i+1:]...)
			break
		}
	}
	c.held(sf, len(c.waiting) > 0)
	return nil
}

// held says once when the standbys have held a save back for
// standbyHoldWarning, and again when they no longer do. Called with rmu
// held.
func (c *Committer) held(sf StandbyFlush, holding bool) {
	switch {
	case !holding:
		if c.heldLogged {
			c.log.Info().Str("confirmed_lsn", c.Flushed().String()).
				Msg("the standbys of synchronized_standby_slots have flushed the checkpoint: the slot is confirmed again")
		}
		c.heldSince, c.heldLogged = time.Time{}, false
	case c.heldSince.IsZero():
		c.heldSince = time.Now()
	case !c.heldLogged && time.Since(c.heldSince) >= standbyHoldWarning:
		c.heldLogged = true
		w := c.waiting[0]
		c.log.Warn().Str("synchronized_standby_slots", sf.Slots).Str("standbys_flushed", sf.Flushed.String()).
			Str("checkpoint_lsn", w.lsn.String()).Str("checkpoint_written_before", w.end.String()).
			Str("confirmed_lsn", c.Flushed().String()).Dur("waited", time.Since(c.heldSince).Round(time.Second)).
			Msg("the standbys of synchronized_standby_slots have not flushed the relay's checkpoint: the slot is confirmed no further until they do " +
				"(a standby promoted without the checkpoint would hold a copy of the slot ahead of it), so the server retains WAL meanwhile; " +
				"check that they stream (pg_stat_replication, pg_replication_slots)")
	}
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
	if c.standbys != nil && c.ungated.Load() {
		c.raise(w)
	}
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
// it, or with Standbys what they have flushed of it: Finish waits up to
// standbyFinishWait for them), within ctx: the wait ends before ctx does, so
// that the save gets its share of the time left. It returns the persisted
// LSN. Failures are logged, not returned: the relay stops either way, and
// whatever was not confirmed is delivered again after a restart.
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
		c.settle(ctx, lsn)
		if err := confirm(ctx, c.Flushed()); err != nil {
			c.log.Warn().Err(err).Msg("confirm final position")
		}
	}
	return lsn
}

// standbyFinishWait bounds how long a stop waits for the standbys to flush
// the last checkpoint: a few milliseconds while they stream, and a standby
// that is down must not hold the stop up.
const standbyFinishWait = 2 * time.Second

// settle refreshes Flushed for the last confirmation of a run, at lsn; with
// Standbys it waits (within ctx and standbyFinishWait) until they have
// flushed its write, and says when they have not.
func (c *Committer) settle(ctx context.Context, lsn pglogrepl.LSN) {
	_ = c.Refresh(ctx) // a failure is logged; Flushed stays where it was
	if c.standbys == nil || c.Flushed() >= lsn {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, standbyFinishWait)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for c.Flushed() < lsn {
		select {
		case <-wctx.Done():
			c.log.Warn().Str("lsn", lsn.String()).Str("confirmed_lsn", c.Flushed().String()).
				Msg("stopping with the slot confirmed behind the checkpoint: the standbys of synchronized_standby_slots have not flushed its write; " +
					"the next start resumes from the checkpoint, and sends nothing again")
			return
		case <-t.C:
		}
		_ = c.Refresh(wctx)
	}
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
