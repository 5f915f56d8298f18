// Package relay wires the replication stream, the pgoutput decoder, the Kafka sink
// and the checkpoint tracker and store into the running relay.
//
// The delivery promise lives here: an LSN is persisted to the checkpoint store,
// and only then confirmed to the slot, once every event of every transaction up
// to it has been acknowledged by Kafka (checkpoint.Tracker).
package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// Store persists checkpoints (checkpoint.TableStore, checkpoint.FileStore).
type Store interface {
	Load(ctx context.Context, slot string) (checkpoint.Checkpoint, bool, error)
	Save(ctx context.Context, c checkpoint.Checkpoint) error
}

// DeadLetterFunc stores ev, which failed permanently with cause, and returns
// nil once the dead letter is committed: only then is the event counted as
// done, so the checkpoint never moves past an event that is neither in Kafka
// nor in the dead-letter store.
type DeadLetterFunc func(ctx context.Context, ev *outbox.Event, cause error) error

// Config configures a relay.
type Config struct {
	PGURL       string
	Slot        string
	Publication string
	Decoder     decoder.Config
	CreateSlot  bool
	// CreatePublication lets the relay create a missing publication.
	CreatePublication bool
	Sink              sink.Config // callbacks are set by the relay
	// OpenStore builds the checkpoint store, given a connection pool to the
	// source database (which a table store uses; it reconnects after restarts).
	OpenStore func(ctx context.Context, pool *pgxpool.Pool) (Store, error)

	// OpenDeadLetters builds the dead-letter store of the dlq failure policy.
	// When nil the policy is halt: a permanent failure stops the relay, and the
	// slot is not confirmed past the event.
	OpenDeadLetters func(ctx context.Context, pool *pgxpool.Pool) (DeadLetterFunc, error)

	// Backfill, when set, is the on-slot-loss=backfill policy: when the slot
	// was dropped, lost its WAL (wal_status 'lost') or was moved past the stored
	// checkpoint, the relay drops a lost slot, creates a missing one, and calls
	// Backfill to republish the outbox rows created at or after since — the
	// stored checkpoint's commit time less BackfillMargin — marked with kind,
	// before it streams from the slot. It returns how many rows it published
	// (Kafka acknowledged every one). When nil the relay refuses to start with
	// the explanation (on-slot-loss=fail).
	Backfill func(ctx context.Context, pool *pgxpool.Pool, since time.Time, kind string) (int, error)
	// BackfillMargin is subtracted from the stored commit time: it covers
	// transactions that inserted their rows (created_at) that long before they
	// committed, and clock differences. Default 10 minutes.
	BackfillMargin time.Duration

	RelayName        string
	MaxInFlightBytes int64         // backpressure threshold, default 16 MiB
	StatusInterval   time.Duration // standby status / checkpoint period, default 1s
	IdleCheckpoint   time.Duration // how often an idle advance is persisted, default 10s
	ShutdownTimeout  time.Duration // bound on a clean stop, default 10s
	KafkaStartWait   time.Duration // how long to wait for Kafka at start, default 30s
	MonitorInterval  time.Duration // how often slot metrics are read, default 10s
	// Heartbeat, when positive, writes pg_logical_emit_message at that period so
	// an idle database's slot keeps moving while others write WAL.
	Heartbeat time.Duration
	// DeadLetterBacklog, when set, is read every MonitorInterval into the
	// dead_letter_backlog metric.
	DeadLetterBacklog func(context.Context) (int64, error)
	// DeadLetterRetention, when set, deletes dead letters older than the
	// configured age; it is called every MonitorInterval·60.
	DeadLetterRetention func(context.Context) (int64, error)
	Retry               backoff.Policy

	Logger  zerolog.Logger
	Metrics *metrics.Metrics
}

func (c *Config) setDefaults() {
	if c.MaxInFlightBytes <= 0 {
		c.MaxInFlightBytes = 16 << 20
	}
	if c.StatusInterval <= 0 {
		c.StatusInterval = time.Second
	}
	if c.IdleCheckpoint <= 0 {
		c.IdleCheckpoint = 10 * time.Second
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.KafkaStartWait <= 0 {
		c.KafkaStartWait = 30 * time.Second
	}
	if c.MonitorInterval <= 0 {
		c.MonitorInterval = 10 * time.Second
	}
	if c.BackfillMargin <= 0 {
		c.BackfillMargin = 10 * time.Minute
	}
	if c.Retry.Base <= 0 {
		c.Retry = backoff.Default
	}
	if c.Metrics == nil {
		c.Metrics = metrics.Discard()
	}
}

// Relay is one running relay. Create it with New and call Run once.
type Relay struct {
	cfg   Config
	log   zerolog.Logger
	m     *metrics.Metrics
	ready atomic.Bool
	// eventLog logs per-event failures: at most 10 lines a minute.
	eventLog zerolog.Logger
	// fatal carries a problem found while streaming that only an operator can
	// fix (pubWatch); the relay stops with it.
	fatal chan error
}

// New returns a relay for cfg.
func New(cfg Config) *Relay {
	cfg.setDefaults()
	log := cfg.Logger.With().Str("slot", cfg.Slot).Logger()
	return &Relay{
		cfg:      cfg,
		log:      log,
		m:        cfg.Metrics,
		eventLog: log.Sample(&zerolog.BurstSampler{Burst: 10, Period: time.Minute}),
		fatal:    make(chan error, 1),
	}
}

// Ready reports whether the relay is streaming and Kafka is accepting events.
func (r *Relay) Ready() bool { return r.ready.Load() }

// Run checks the configuration, then relays until ctx is done, and stops cleanly:
// it finishes the transaction it is reading, waits for Kafka to acknowledge what
// is in flight (up to ShutdownTimeout), persists and confirms the checkpoint.
// It returns nil after a clean stop, a *replication.ConfigError or
// *checkpoint.GapError for problems an operator must fix, or the error that
// halted the relay.
func (r *Relay) Run(ctx context.Context) error {
	r.m.SetState(metrics.StateStarting)
	cfg := r.cfg
	if !replication.ValidName(cfg.Slot) {
		return &replication.ConfigError{Msg: fmt.Sprintf("slot name %q is invalid: use lowercase letters, digits and underscores, at most 63 (--slot / CDC_RELAY_SLOT)", cfg.Slot)}
	}
	if !replication.ValidName(cfg.Publication) {
		return &replication.ConfigError{Msg: fmt.Sprintf("publication name %q is invalid: use lowercase letters, digits and underscores (--publication / CDC_RELAY_PUBLICATION)", cfg.Publication)}
	}
	dec, err := decoder.New(cfg.Decoder)
	if err != nil {
		return &replication.ConfigError{Msg: err.Error()}
	}

	// Postgres: server, table, publication, slot, stored checkpoint.
	poolCfg, err := pgxpool.ParseConfig(cfg.PGURL)
	if err != nil {
		return &replication.ConfigError{Msg: fmt.Sprintf("parse Postgres URL %s: %v (check --pg-url / CDC_RELAY_PG_URL)", replication.Redact(cfg.PGURL), err)}
	}
	poolCfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return replication.ConnectError(cfg.PGURL, err)
	}
	defer pool.Close()
	if err := r.checkServer(ctx, pool); err != nil {
		return err
	}

	// Kafka, before anything is created in Postgres: a relay that cannot reach
	// Kafka must not leave a new slot behind to retain WAL.
	h := &handler{
		dec:  dec,
		max:  cfg.MaxInFlightBytes,
		room: make(chan struct{}, 1),
		m:    r.m,
	}
	sinkCfg := cfg.Sink
	sinkCfg.Logger = r.log
	sinkCfg.Metrics = r.m
	sinkCfg.OnAck = h.ack
	var deadLetter DeadLetterFunc
	if cfg.OpenDeadLetters != nil {
		if deadLetter, err = cfg.OpenDeadLetters(ctx, pool); err != nil {
			return err
		}
	}
	sinkCfg.OnPermanent = func(ctx context.Context, ev *outbox.Event, err error) error {
		return r.permanent(ctx, h, deadLetter, ev, err)
	}
	kctx, cancel := context.WithTimeout(ctx, cfg.KafkaStartWait)
	k, err := sink.Open(kctx, sinkCfg)
	cancel()
	if err != nil {
		return err
	}
	defer k.Close()
	h.sink = k

	// Slot and stored checkpoint.
	system, start, store, err := r.prepareSlot(ctx, pool)
	if err != nil {
		return err
	}
	tracker := checkpoint.NewTracker(start)
	h.tracker = tracker

	// Checkpointer: persists the watermark, then lets the stream confirm it.
	ck := &checkpointer{
		store: store, tracker: tracker, h: h, log: r.log, m: r.m,
		base:  checkpoint.Checkpoint{Slot: cfg.Slot, SystemID: system.SystemID, RelayName: cfg.RelayName},
		every: cfg.StatusInterval, idle: cfg.IdleCheckpoint,
		serverDown: make(chan error, 1),
	}
	ck.persisted.Store(uint64(start))
	h.flushed = &ck.persisted
	ckCtx, stopCk := context.WithCancel(context.Background())
	mon := &monitor{
		pool: pool, slot: cfg.Slot, every: cfg.MonitorInterval, heartbeat: cfg.Heartbeat,
		backlog: cfg.DeadLetterBacklog, retention: cfg.DeadLetterRetention, h: h, log: r.log, m: r.m,
		pub: &pubWatch{pool: pool, cfg: r.setupConfig(), log: r.log, fatal: r.fatal},
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		ck.run(ckCtx)
	}()
	go func() {
		defer wg.Done()
		mon.run(ckCtx)
	}()
	defer func() {
		stopCk()
		wg.Wait()
	}()

	return r.stream(ctx, h, k, ck)
}

// permanent applies the failure policy to an event that failed permanently:
// with dead letters, store it (retrying until the store commits it) and count it
// as done; without, halt.
func (r *Relay) permanent(ctx context.Context, h *handler, dead DeadLetterFunc, ev *outbox.Event, cause error) error {
	code := sink.Code(cause)
	// Per-event lines are sampled: a burst of poison events (a topic template
	// gone wrong) must not flood the log; the metric counts every one.
	log := r.eventLog.With().Str("event_id", string(ev.ID)).Str("aggregate_id", string(ev.AggregateID)).
		Str("lsn", ev.CommitLSN.String()).Str("code", code).Logger()
	if dead == nil {
		log.Error().Err(cause).Msg("event failed permanently; halting without confirming past it (--on-error=halt)")
		return fmt.Errorf("event %s (aggregate %s, commit lsn %s) failed permanently: %w: fix the event or the broker limit and restart, or run with --on-error=dlq; the slot was not confirmed past it",
			ev.ID, ev.AggregateID, ev.CommitLSN, cause)
	}
	for attempt := 0; ; attempt++ {
		err := dead(ctx, ev, cause)
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
	h.ack([]*outbox.Event{ev})
	return nil
}

// checkServer runs the start-up checks of the server, table and publication.
func (r *Relay) checkServer(ctx context.Context, pool *pgxpool.Pool) error {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return replication.ConnectError(r.cfg.PGURL, err)
	}
	defer pc.Release()
	return replication.CheckServer(ctx, pc.Conn(), r.setupConfig())
}

// prepareSlot opens the checkpoint store and reconciles it with the slot,
// creating the slot when that is safe and allowed.
func (r *Relay) prepareSlot(ctx context.Context, pool *pgxpool.Pool) (pglogrepl.IdentifySystemResult, pglogrepl.LSN, Store, error) {
	var system pglogrepl.IdentifySystemResult
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return system, 0, nil, replication.ConnectError(r.cfg.PGURL, err)
	}
	defer pc.Release()
	conn := pc.Conn()
	if system, err = replication.IdentifySystem(ctx, r.cfg.PGURL); err != nil {
		return system, 0, nil, err
	}
	store, err := r.cfg.OpenStore(ctx, pool)
	if err != nil {
		return system, 0, nil, err
	}
	start, err := r.reconcile(ctx, pool, conn, store, system.SystemID)
	return system, start, store, err
}

func (r *Relay) setupConfig() replication.SetupConfig {
	d := r.cfg.Decoder
	cols := []replication.Column{
		{Name: d.Columns.ID, Flag: "--column-id"},
		{Name: d.Columns.AggregateType, Flag: "--column-aggregate-type"},
		{Name: d.Columns.AggregateID, Flag: "--column-aggregate-id"},
		{Name: d.Columns.EventType, Flag: "--column-event-type"},
		{Name: d.Columns.Payload, Flag: "--column-payload"},
	}
	for col := range d.HeaderColumns {
		cols = append(cols, replication.Column{Name: col, Flag: "--header-columns"})
	}
	return replication.SetupConfig{
		Slot: r.cfg.Slot, Publication: r.cfg.Publication,
		Schema: d.Schema, Table: d.Table, Columns: cols,
		CreatePublication: r.cfg.CreatePublication,
	}
}

// reconcile compares the stored checkpoint with the slot (DESIGN invariant 6),
// creates the slot when that is safe and allowed, and returns where to start.
func (r *Relay) reconcile(ctx context.Context, pool *pgxpool.Pool, conn *pgx.Conn, store Store, systemID string) (pglogrepl.LSN, error) {
	slot := r.cfg.Slot
	stored, haveStored, err := store.Load(ctx, slot)
	if err != nil {
		return 0, fmt.Errorf("load checkpoint of slot %q: %w", slot, err)
	}
	state, err := replication.ReadSlot(ctx, conn, slot)
	if err != nil {
		return 0, err
	}
	var dbName string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&dbName); err != nil {
		return 0, fmt.Errorf("read current database: %w", err)
	}
	if state.Exists && state.Database != dbName {
		return 0, &replication.ConfigError{Msg: fmt.Sprintf("replication slot %q belongs to database %q, not %q: choose another --slot / CDC_RELAY_SLOT or connect to %q", slot, state.Database, dbName, state.Database)}
	}
	dec, err := checkpoint.Reconcile(slot, systemID, stored, haveStored, state)
	if err != nil {
		var gap *checkpoint.GapError
		if !errors.As(err, &gap) {
			return 0, err
		}
		r.m.SlotProblems.WithLabelValues(gap.Kind.String()).Inc()
		if !backfillable(gap.Kind) {
			return 0, err
		}
		if r.cfg.Backfill == nil {
			return 0, fmt.Errorf("%w. Or restart with --on-slot-loss=backfill (CDC_RELAY_ON_SLOT_LOSS=backfill): "+
				"the relay then recreates the slot and republishes the outbox rows still in the table "+
				"that were created since %s", err, r.backfillSince(stored).UTC().Format(time.RFC3339))
		}
		r.log.Warn().Err(err).Msg("slot lost: backfilling (--on-slot-loss=backfill)")
		return r.backfill(ctx, pool, conn, store, stored, state, gap.Kind)
	}
	for _, w := range dec.Warnings {
		r.log.Warn().Msg(w)
	}
	if !state.Exists {
		if !r.cfg.CreateSlot {
			return 0, &replication.ConfigError{Msg: fmt.Sprintf("replication slot %q does not exist and --create-slot=false: run SELECT pg_create_logical_replication_slot('%s', 'pgoutput'); or allow the relay to create it", slot, slot)}
		}
		if err := replication.CreateSlot(ctx, r.cfg.PGURL, slot); err != nil {
			return 0, err
		}
		if state, err = replication.ReadSlot(ctx, conn, slot); err != nil {
			return 0, err
		}
		r.log.Info().Str("lsn", state.ConfirmedFlush.String()).Msg("created replication slot")
	}
	start := state.ConfirmedFlush
	// The store is written before the slot is confirmed, so a stored LSN ahead of
	// the slot marks events Kafka already acknowledged: start after them.
	if haveStored && stored.LSN > start {
		start = stored.LSN
	}
	return start, nil
}

// backfillable reports whether on-slot-loss=backfill applies to a gap: the slot
// is gone or moved on the same system. A changed system or a foreign slot is
// never repaired automatically.
func backfillable(k checkpoint.GapKind) bool {
	return k == checkpoint.SlotMissing || k == checkpoint.SlotLost || k == checkpoint.SlotAhead
}

// backfillSince is where a backfill starts: the stored commit time less the
// margin, or, for a checkpoint saved before commit times were stored, its save
// time less the margin.
func (r *Relay) backfillSince(stored checkpoint.Checkpoint) time.Time {
	at := stored.CommitTime
	if at.IsZero() {
		at = stored.UpdatedAt
	}
	return at.Add(-r.cfg.BackfillMargin)
}

// backfill repairs a lost slot (on-slot-loss=backfill): it drops a slot whose
// WAL is lost, creates a missing one, republishes the outbox rows that may have
// been committed in the gap, and only then stores the slot's position as the
// checkpoint, so a crash midway backfills again on the next start (the slot is
// then ahead of the store). Rows deleted from the outbox since cannot be
// republished: the log says so.
func (r *Relay) backfill(ctx context.Context, pool *pgxpool.Pool, conn *pgx.Conn, store Store, stored checkpoint.Checkpoint, state checkpoint.SlotState, kind checkpoint.GapKind) (pglogrepl.LSN, error) {
	slot := r.cfg.Slot
	since := r.backfillSince(stored)
	if stored.CommitTime.IsZero() {
		r.log.Warn().Time("saved_at", stored.UpdatedAt).Msg("the stored checkpoint has no commit time (saved by an older relay): " +
			"backfilling from its save time less the margin; if the relay lagged behind when it saved, " +
			"replay older rows with cdc-relay replay --since")
	}
	markTime := stored.CommitTime // a valid lower bound for commits after the new position
	if kind == checkpoint.SlotLost {
		if state.Active {
			return 0, fmt.Errorf("backfill slot %q: the lost slot is in use by process %d; stop that consumer first", slot, state.ActivePID)
		}
		if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
			return 0, fmt.Errorf("backfill slot %q: drop the lost slot: %w", slot, err)
		}
		r.log.Warn().Msg("dropped the replication slot whose WAL was lost")
		state = checkpoint.SlotState{}
	}
	if !state.Exists {
		if !r.cfg.CreateSlot {
			return 0, &replication.ConfigError{Msg: fmt.Sprintf("backfill slot %q: the slot must be recreated but --create-slot=false: run SELECT pg_create_logical_replication_slot('%s', 'pgoutput'); and restart", slot, slot)}
		}
		// Every transaction the new slot streams commits after this instant.
		if err := conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&markTime); err != nil {
			return 0, fmt.Errorf("backfill slot %q: read the server clock: %w", slot, err)
		}
		if err := replication.CreateSlot(ctx, r.cfg.PGURL, slot); err != nil {
			return 0, err
		}
		var err error
		if state, err = replication.ReadSlot(ctx, conn, slot); err != nil {
			return 0, err
		}
		r.log.Info().Str("lsn", state.ConfirmedFlush.String()).Msg("created replication slot")
	}
	r.log.Warn().Str("kind", kind.String()).Time("since", since).Str("stored_lsn", stored.LSN.String()).
		Str("slot_lsn", state.ConfirmedFlush.String()).Dur("margin", r.cfg.BackfillMargin).
		Msg("republishing outbox rows created since the stored checkpoint's commit time less the margin; " +
			"rows deleted from the outbox meanwhile cannot be republished")
	began := time.Now()
	n, err := r.cfg.Backfill(ctx, pool, since, kind.String())
	r.m.BackfilledEvents.WithLabelValues(kind.String()).Add(float64(n))
	if err != nil {
		return 0, fmt.Errorf("backfill slot %q from %s (%d rows republished before the failure; the next start backfills again): %w",
			slot, since.UTC().Format(time.RFC3339), n, err)
	}
	cp := checkpoint.Checkpoint{Slot: slot, SystemID: stored.SystemID, LSN: state.ConfirmedFlush,
		UpdatedAt: time.Now(), RelayName: r.cfg.RelayName, CommitTime: markTime}
	if err := store.Save(ctx, cp); err != nil {
		return 0, fmt.Errorf("backfill slot %q: store the new position %s: %w", slot, state.ConfirmedFlush, err)
	}
	r.log.Warn().Int("events", n).Dur("took", time.Since(began)).Str("lsn", state.ConfirmedFlush.String()).
		Msg("backfill done: streaming from the slot's position")
	return state.ConfirmedFlush, nil
}

// stream runs replication connections until ctx is done, reconnecting with
// backoff after failures, then stops cleanly.
func (r *Relay) stream(ctx context.Context, h *handler, k *sink.Kafka, ck *checkpointer) error {
	// The stream keeps its own context so it can finish the current transaction
	// and confirm after ctx is done; it is cut after half the shutdown budget.
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	stop := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			close(stop)
			r.m.SetState(metrics.StateStopping)
			select {
			case <-time.After(r.cfg.ShutdownTimeout / 2):
				cancelRun()
			case <-runCtx.Done():
			}
		case <-runCtx.Done():
		}
	}()

	streamCfg := replication.StreamConfig{
		URL: r.cfg.PGURL, Slot: r.cfg.Slot, Publication: r.cfg.Publication,
		StatusInterval: r.cfg.StatusInterval, Logger: r.log, Metrics: r.m,
	}
	failing, connected := false, false
	for attempt := 0; ; attempt++ {
		if err := k.Err(); err != nil {
			return r.finish(h, nil, ck, err)
		}
		s, err := replication.Open(runCtx, streamCfg, h.tracker.Watermark())
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
				return r.finish(h, s, ck, nil)
			}
			if kerr := k.Err(); kerr != nil {
				return r.finish(h, s, ck, kerr)
			}
			if errors.Is(err, decoder.ErrMissingColumn) {
				// Reconnecting cannot help: the table no longer has a configured column.
				s.Close(context.Background())
				return r.finish(h, nil, ck, &replication.ConfigError{Msg: err.Error()})
			}
			if publicationDropped(err) {
				err = &replication.ConfigError{Msg: publicationDroppedMsg(r.cfg.Publication, r.cfg.Slot, "")}
			}
			if errors.As(err, new(*replication.ConfigError)) {
				// Nor when the publication no longer streams the outbox (pubWatch).
				s.Close(context.Background())
				return r.finish(h, nil, ck, err)
			}
			s.Close(context.Background())
		}
		if ctx.Err() != nil {
			return r.finish(h, nil, ck, nil)
		}
		r.ready.Store(false)
		busy := errors.Is(err, replication.ErrSlotBusy)
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
			return r.finish(h, nil, ck, nil)
		}
		h.reset()
		retry := r.cfg.Retry
		if busy {
			// Poll a held slot quickly, so a standby takes over within seconds.
			retry = backoff.Policy{Base: 500 * time.Millisecond, Cap: 2 * time.Second}
		}
		if err := retry.Sleep(ctx, attempt); err != nil {
			return r.finish(h, nil, ck, nil)
		}
	}
}

// runStream runs one connection, marking the relay ready while it streams and
// the sink is not retrying.
func (r *Relay) runStream(ctx context.Context, stop <-chan struct{}, s *replication.Stream, h *handler, k *sink.Kafka, ck *checkpointer) error {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			r.ready.Store(k.Healthy())
			if k.Retrying() {
				r.m.SetState(metrics.StateRetrying)
			}
			select {
			case <-done:
				r.ready.Store(false)
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
	errc := make(chan error, 1)
	go func() { errc <- s.Run(sctx, stop, h) }()
	select {
	case err := <-errc:
		return err
	case <-k.Failed():
		// Halted on a permanent failure: stop reading at once.
		cancel()
		<-errc
		s.Close(context.Background())
		return k.Err()
	case err := <-r.fatal:
		// The publication no longer streams the outbox (pubWatch): stop.
		cancel()
		<-errc
		return err
	case err := <-ck.serverDown:
		// Postgres is shutting down: its walsender waits for a confirmation of
		// everything it sent, which cannot be persisted first any more. Leave,
		// so the shutdown is not held up; nothing is confirmed past the store.
		cancel()
		<-errc
		s.Close(context.Background())
		return fmt.Errorf("postgres is shutting down: %w", err)
	}
}

// finish drains in-flight events (bounded), persists the final checkpoint and
// confirms it on s when there is a stream.
func (r *Relay) finish(h *handler, s *replication.Stream, ck *checkpointer, cause error) error {
	r.ready.Store(false)
	r.m.SetState(metrics.StateStopping)
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ShutdownTimeout/2)
	defer cancel()
	if cause == nil {
		if err := h.tracker.WaitDrained(ctx); err != nil {
			_, events := h.tracker.InFlight()
			r.log.Warn().Int("events", events).Msg("stopping before Kafka acknowledged every event; they will be delivered again after restart")
		}
	}
	lsn, err := ck.save(ctx)
	if err != nil {
		r.log.Error().Err(err).Msg("persist final checkpoint")
	}
	if s != nil {
		if err == nil && cause == nil {
			if serr := s.SendStatus(ctx, lsn); serr != nil {
				r.log.Warn().Err(serr).Msg("confirm final position")
			}
		}
		s.Close(ctx)
	}
	r.log.Info().Str("lsn", lsn.String()).Msg("stopped")
	return cause
}

// handler feeds decoded events to the sink and accounts them; it implements
// replication.Handler. Its fields other than the atomics are used only by the
// stream's goroutine.
type handler struct {
	dec     *decoder.Decoder
	tracker *checkpoint.Tracker
	sink    *sink.Kafka
	flushed *atomic.Uint64
	m       *metrics.Metrics

	seq   uint64
	inTxn bool

	max      int64
	inFlight atomic.Int64
	room     chan struct{}
	// lastAckCommit is the commit time (UnixNano) of the newest acknowledged batch.
	lastAckCommit atomic.Int64
}

var _ replication.Handler = (*handler)(nil)

func (h *handler) HandleData(ctx context.Context, _ pglogrepl.LSN, data []byte) error {
	msg, err := h.dec.Decode(data)
	if err != nil {
		return fmt.Errorf("decode pgoutput message: %w", err)
	}
	switch msg.Kind {
	case decoder.KindBegin:
		h.seq = h.tracker.Begin()
		h.inTxn = true
	case decoder.KindEvent:
		if !h.inTxn {
			return errors.New("decode pgoutput message: insert outside a transaction")
		}
		ev := msg.Event
		ev.Seq = h.seq
		h.tracker.Add(h.seq, 1)
		n := h.inFlight.Add(int64(ev.Size()))
		h.m.InFlightBytes.Set(float64(n))
		if err := h.sink.Send(ctx, ev); err != nil {
			return err
		}
	case decoder.KindCommit:
		h.tracker.Commit(h.seq, msg.EndLSN, msg.CommitTime)
		h.inTxn = false
	}
	return nil
}

// ack is the sink's OnAck: it acknowledges runs of events of one transaction.
func (h *handler) ack(batch []*outbox.Event) {
	if len(batch) > 0 {
		h.lastAckCommit.Store(batch[len(batch)-1].CommitTime.UnixNano())
	}
	var size int64
	for i := 0; i < len(batch); {
		j := i + 1
		for j < len(batch) && batch[j].Seq == batch[i].Seq {
			j++
		}
		h.tracker.Ack(batch[i].Seq, j-i)
		for _, ev := range batch[i:j] {
			size += int64(ev.Size())
		}
		i = j
	}
	before := h.inFlight.Add(-size) + size
	h.m.InFlightBytes.Set(float64(before - size))
	if before >= h.max && before-size < h.max {
		select {
		case h.room <- struct{}{}:
		default:
		}
	}
}

func (h *handler) Keepalive(serverWALEnd pglogrepl.LSN, serverTime time.Time) {
	if !h.inTxn {
		h.tracker.Idle(serverWALEnd, serverTime)
	}
}

func (h *handler) Flushed() pglogrepl.LSN { return pglogrepl.LSN(h.flushed.Load()) }

func (h *handler) Backpressure() <-chan struct{} {
	if closed := h.sink.CircuitClosed(); closed != nil {
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
// after a reconnect; the caller has drained the sink.
func (h *handler) reset() {
	h.dec.Reset()
	h.inTxn = false
	h.tracker.Reset(h.tracker.Watermark())
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

// checkpointer persists the watermark to the store and publishes the persisted
// LSN, which is all the stream ever confirms.
type checkpointer struct {
	store     Store
	tracker   *checkpoint.Tracker
	h         *handler
	base      checkpoint.Checkpoint
	log       zerolog.Logger
	m         *metrics.Metrics
	every     time.Duration
	idle      time.Duration
	persisted atomic.Uint64

	mu            sync.Mutex
	lastSave      time.Time
	lastDelivered uint64
	failing       bool
	serverDown    chan error // a save failed because the server is shutting down
}

func (c *checkpointer) run(ctx context.Context) {
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
		w := c.tracker.Watermark()
		if uint64(w) <= c.persisted.Load() {
			continue
		}
		// Advances with no new events (keepalives on an idle outbox) are saved
		// less often: each save writes WAL of its own.
		if c.tracker.Delivered() == c.lastDeliveredLoad() && time.Since(c.lastSaveLoad()) < c.idle {
			continue
		}
		c.save(ctx)
	}
}

func (c *checkpointer) lastDeliveredLoad() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastDelivered
}

func (c *checkpointer) lastSaveLoad() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastSave
}

// save persists the current watermark and returns the persisted LSN.
func (c *checkpointer) save(ctx context.Context) (pglogrepl.LSN, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delivered := c.tracker.Delivered()
	w, at := c.tracker.Position()
	if uint64(w) <= c.persisted.Load() {
		return pglogrepl.LSN(c.persisted.Load()), nil
	}
	cp := c.base
	cp.LSN, cp.CommitTime = w, at
	cp.UpdatedAt = time.Now()
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
		return pglogrepl.LSN(c.persisted.Load()), fmt.Errorf("save checkpoint %s: %w", w, err)
	}
	if c.failing {
		c.failing = false
		c.log.Info().Str("lsn", w.String()).Msg("checkpoint persisted again")
	}
	c.m.CheckpointSaves.Inc()
	c.persisted.Store(uint64(w))
	c.lastSave = cp.UpdatedAt
	c.lastDelivered = delivered
	return w, nil
}
