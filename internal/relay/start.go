package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/waitlog"
)

// checkServer runs the start-up checks of the server, table and publication,
// and resolves the slot's failover mode against the server's version.
// The first connection is awaited with a log line (waitlog) while it has
// not answered: a server that does not answer would otherwise keep the relay
// silent until the connection times out.
func (r *Relay) checkServer(ctx context.Context, pool *pgxpool.Pool) error {
	wait := waitlog.Start(r.log, "Postgres", pgAddress(pool.Config().ConnConfig),
		"check the Postgres URL "+r.cfg.Names.Name("PGURL")+"; connect_timeout=<seconds> in it bounds the wait")
	pc, err := pool.Acquire(ctx)
	if err != nil {
		wait.Failed(err)
		wait.Done(false)
		if wait.Logged() {
			err = fmt.Errorf("%s: %w", wait.Summary(), err)
		}
		return replication.ConnectError(r.cfg.PGURL, err, r.cfg.Names)
	}
	wait.Done(true)
	defer pc.Release()
	if err := r.checkSource(ctx, pc.Conn()); err != nil {
		return err
	}
	// The message outbox before anything is created.
	if version := r.source.Version; r.cfg.Decoder.MessagePrefix != "" && version < replication.MinMessagesVersion {
		return &replication.ConfigError{Err: r.cfg.Names.Errorf("Decoder.MessagePrefix",
			"the message outbox needs PostgreSQL 14 or later (pgoutput's messages option), but the server is PostgreSQL %s: "+
				"upgrade the server, or write the events to an outbox table instead", replication.VersionName(version))}
	}
	// The publication is created through the writer: on a standby, the
	// primary's catalog is the one replicated to the standby.
	check := pc.Conn()
	if r.source.InRecovery {
		wc, err := r.writer.Acquire(ctx)
		if err != nil {
			return replication.ConnectError(r.cfg.PGURL, fmt.Errorf("connect to the primary %s: %w", r.cfg.Names.Name("PrimaryPool"), err), r.cfg.Names)
		}
		defer wc.Release()
		check = wc.Conn()
	}
	setup := r.setupConfig()
	// A slot that exists resumes from a position before any table joins the
	// publication now: the rows of a joining table are published from the
	// snapshot taken with the change (join.go). A slot yet to be created
	// streams them all.
	slot, err := replication.ReadSlot(ctx, pc.Conn(), r.cfg.Slot)
	if err != nil {
		return err
	}
	if slot.Exists {
		setup.JoinSnapshot = r.recordJoin
		partial := setup.PartialCoverage
		setup.PartialCoverage = func(cfg replication.SetupConfig, covs []replication.Coverage) ([]decoder.TableName, error) {
			joining, err := partial(cfg, covs)
			if err == nil && len(joining) > 0 {
				err = r.prepareJoin(ctx, slot)
			}
			return joining, err
		}
	}
	if err := replication.CheckServer(ctx, check, setup); err != nil {
		return err
	}
	if r.source.InRecovery {
		// The gap checks below read the standby's catalog: judge the
		// publication only once the standby has replayed what was just
		// created or changed on the primary.
		if err := r.awaitReplay(ctx, "the publication", pc.Conn(), check); err != nil {
			return err
		}
	}
	// Whether the slot is to be a failover slot: before Kafka is reached, so
	// that slot failover on (source.slot_failover) below 17 is refused first.
	if r.failover, err = replication.WantFailover(r.cfg.SlotFailover, r.source.Version, r.cfg.Names); err != nil {
		return err
	}
	if r.source.InRecovery && r.failover {
		// Postgres creates no failover slot on a standby; a standby of a
		// standby takes over decoding after a promotion only with a slot of its own.
		if r.cfg.SlotFailover == replication.FailoverOn {
			return &replication.ConfigError{Msg: "a slot on a hot standby cannot be a failover slot (PostgreSQL synchronizes slots from a primary only): set the slot's failover to auto or off " + r.cfg.Names.Name("SlotFailover")}
		}
		r.failover = false
	}
	return r.gaps.Publication(ctx, pc.Conn())
}

// checkSource reads whether conn's server, the Postgres URL's, is a hot
// standby, and if so checks that the relay can decode there and write
// through the primary; it sets the source metric and r.source and r.writer.
func (r *Relay) checkSource(ctx context.Context, conn *pgx.Conn) error {
	source, err := replication.ReadSource(ctx, conn)
	if err != nil {
		return err
	}
	r.source, r.writer = source, r.cfg.Pool
	var primary *replication.Source
	if source.InRecovery && r.cfg.PrimaryPool != nil {
		pc, err := r.cfg.PrimaryPool.Acquire(ctx)
		if err != nil {
			return replication.ConnectError(r.cfg.PrimaryPool.Config().ConnString(), fmt.Errorf("connect to the primary %s: %w", r.cfg.Names.Name("PrimaryPool"), err), r.cfg.Names)
		}
		p, err := replication.ReadSource(ctx, pc.Conn())
		pc.Release()
		if err != nil {
			return fmt.Errorf("primary %s: %w", r.cfg.Names.Name("PrimaryPool"), err)
		}
		primary = &p
		r.writer = r.cfg.PrimaryPool
	}
	if err := replication.CheckStandbySource(source, primary, r.cfg.Names); err != nil {
		return err
	}
	r.m.SetSource(source.Role())
	if !source.InRecovery && r.cfg.PrimaryPool != nil {
		// The caller built the stores over PrimaryPool: they write where it
		// points, which should be this same server now (e.g. a promoted standby).
		r.log.Warn().Str("primary", pgAddress(r.cfg.PrimaryPool.Config().ConnConfig)).
			Msg("the Postgres URL names a primary, yet a primary URL is set: the checkpoint and dead letters are written through the primary URL " +
				r.cfg.Names.Name("PrimaryPool") + "; drop it, or make sure it reaches this server")
	}
	if source.InRecovery {
		r.log.Info().Str("source", source.Role()).Str("primary", pgAddress(r.cfg.PrimaryPool.Config().ConnConfig)).
			Msg("decoding on a hot standby: the slot and the stream are on the standby; the checkpoint, dead letters, heartbeats and the publication are written on the primary")
	}
	return nil
}

// awaitReplay waits until the standby has replayed the primary's WAL as it
// is now, which holds what, logging progress every 5 seconds while it is
// behind.
func (r *Relay) awaitReplay(ctx context.Context, what string, standby, primary replication.QueryRower) error {
	return replication.WaitReplayed(ctx, standby, primary, 100*time.Millisecond, 5*time.Second, func(target, replayed pglogrepl.LSN, waited time.Duration) {
		r.log.Info().Str("target_lsn", target.String()).Str("replayed_lsn", replayed.String()).
			Uint64("behind_bytes", uint64(target-replayed)).Dur("waited", waited).
			Msgf("waiting for the standby to replay the primary's WAL up to %s, which holds %s as the primary has it (the standby lags its primary)", target, what)
	})
}

// creatingSlot runs create, which creates the relay's slot. On a standby,
// creating a slot waits for the primary's next running-transactions
// record, which an idle primary logs every 15 seconds at best: meanwhile the
// relay asks the primary for one every second.
func (r *Relay) creatingSlot(ctx context.Context, create func() error) error {
	if !r.source.InRecovery {
		return create()
	}
	nctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	var failing atomic.Bool
	go func() {
		defer close(done)
		replication.NudgeStandby(nctx, r.writer, time.Second, func(err error) {
			if failing.CompareAndSwap(false, true) {
				r.log.Warn().Err(err).Msg("creating the slot on the standby waits for the primary's next running-transactions record (up to 15 s on a busy primary, longer on an idle one)")
			}
		})
	}()
	defer func() {
		stop()
		<-done
	}()
	return create()
}

// pgAddress is where cfg connects: host:port, and its fallbacks, without
// user or password.
func pgAddress(cfg *pgx.ConnConfig) string {
	addr := func(host string, port uint16) string {
		if strings.HasPrefix(host, "/") { // a Unix socket directory
			return fmt.Sprintf("%s/.s.PGSQL.%d", host, port)
		}
		return net.JoinHostPort(host, strconv.Itoa(int(port)))
	}
	all := []string{addr(cfg.Host, cfg.Port)}
	for _, f := range cfg.Fallbacks {
		if a := addr(f.Host, f.Port); !slices.Contains(all, a) {
			all = append(all, a)
		}
	}
	return strings.Join(all, ",")
}

// prepareSlot prepares the checkpoint store and reconciles it with the slot,
// creating the slot when that is safe and allowed. It returns the checkpoint
// store opened for the slot, through which every checkpoint is written, and
// where streaming starts.
func (r *Relay) prepareSlot(ctx context.Context, pool *pgxpool.Pool) (pglogrepl.IdentifySystemResult, *checkpoint.Opening, pglogrepl.LSN, error) {
	var system pglogrepl.IdentifySystemResult
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return system, nil, 0, replication.ConnectError(r.cfg.PGURL, err, r.cfg.Names)
	}
	defer pc.Release()
	conn := pc.Conn()
	if system, err = replication.IdentifySystem(ctx, r.cfg.PGURL, r.cfg.Names); err != nil {
		return system, nil, 0, err
	}
	store := r.cfg.Checkpoints
	if err := store.Ensure(ctx); err != nil {
		return system, nil, 0, err
	}
	// Until the publication is read below (CoverTables), checkpoints (a
	// snapshot's marker and position, a backfill's) name the tables the
	// relay reads: covered from where the stream resumes on.
	op, err := checkpoint.Open(ctx, store, checkpoint.Checkpoint{Slot: r.cfg.Slot, SystemID: system.SystemID, RelayName: r.cfg.RelayName, Tables: r.tableNames()})
	if err != nil {
		return system, nil, 0, err
	}
	start, err := r.reconcile(ctx, conn, op, system.SystemID)
	if err != nil {
		return system, op, start, err
	}
	// Every checkpoint names the tables the publication covers at its
	// position (table_joined): the stored one too, now that the gap checks
	// passed or a snapshot or backfill published what they found missing,
	// so a table joined in this start counts at once. Read once per start,
	// never per checkpoint.
	published, at, err := replication.PublishedTables(ctx, conn, r.cfg.Publication)
	if err != nil {
		return system, op, start, err
	}
	op.CoverTables(published, at, r.joined, r.tableNames())
	if err := op.SaveTables(ctx); err != nil {
		return system, op, start, err
	}
	if err := r.checkFailover(ctx, conn); err != nil {
		return system, op, start, err
	}
	return system, op, start, nil
}

// checkFailover switches failover on for a slot that lacks it when the relay
// wants a failover slot, and has the gap checks say once what a failover of
// the server would do to the slot. A slot in use by another process (a relay
// still stopping, or this one is a standby relay) is switched on by the
// stream before it acquires the slot.
func (r *Relay) checkFailover(ctx context.Context, conn *pgx.Conn) error {
	mode := r.cfg.SlotFailover
	if mode == "" {
		mode = replication.FailoverAuto
	}
	if r.failover {
		s, err := replication.ReadFailover(ctx, conn, r.cfg.Slot)
		if err != nil {
			return err
		}
		if s.SlotExists && !s.SlotFailover && !s.InRecovery {
			err := r.switchFailoverOn(ctx)
			if errors.Is(err, replication.ErrSlotBusy) {
				r.enableFailover, r.slotFailover = true, true
				r.log.Info().Msg("replication slot is not a failover slot and is in use by another process: " +
					"failover is switched on when the relay acquires it " + r.cfg.Names.Name("SlotFailover"))
				return nil
			}
			if err != nil {
				return err
			}
		}
	}
	s, err := r.gaps.Failover(ctx, conn, mode)
	// A failover slot's copies follow confirmations the standbys may not
	// hold the checkpoint of yet: the Committer waits for them
	// (CommitterConfig.Standbys).
	r.slotFailover = err == nil && !s.InRecovery && s.SlotFailover
	return err
}

// switchFailoverOn switches failover on for the existing slot, with a log
// line.
func (r *Relay) switchFailoverOn(ctx context.Context) error {
	if err := replication.EnableFailover(ctx, r.cfg.PGURL, r.cfg.Slot, r.cfg.Names); err != nil {
		return err
	}
	r.log.Info().Msg("switched failover on for the existing replication slot (ALTER_REPLICATION_SLOT … (FAILOVER true)): " +
		"standbys with sync_replication_slots = on now keep a copy " + r.cfg.Names.Name("SlotFailover"))
	return nil
}

func (r *Relay) setupConfig() replication.SetupConfig {
	d := r.cfg.Decoder
	var also []replication.TableSetup
	for _, t := range d.Also {
		also = append(also, replication.TableSetup{Name: decoder.TableName{Schema: t.Schema, Table: t.Table}, Columns: setupColumns(t)})
	}
	return replication.SetupConfig{
		Slot: r.cfg.Slot, Publication: r.cfg.Publication,
		Schema: d.Schema, Table: d.Table, Also: also, TableField: "Decoder.Table", Columns: setupColumns(d),
		CreatePublication: r.cfg.CreatePublication,
		PublishUpdates:    r.cfg.OnOutboxUpdate != "" && r.cfg.OnOutboxUpdate != OutboxUpdateIgnore,
		Messages:          d.MessagePrefix != "",
		PartialCoverage:   gaps.PartialCoverage,
		Names:             r.cfg.Names,
	}
}

// setupColumns are the columns the start-up checks require of d's table.
func setupColumns(d decoder.Config) []replication.Column {
	cols := []replication.Column{
		{Name: d.Columns.ID, Field: "Decoder.Columns.ID"},
		{Name: d.Columns.AggregateType, Field: "Decoder.Columns.AggregateType"},
		{Name: d.Columns.AggregateID, Field: "Decoder.Columns.AggregateID"},
		{Name: d.Columns.Payload, Field: "Decoder.Columns.Payload"},
	}
	if d.Columns.EventType != "" { // optional: no event type column, no event_type
		cols = append(cols, replication.Column{Name: d.Columns.EventType, Field: "Decoder.Columns.EventType"})
	}
	for col := range d.HeaderColumns {
		cols = append(cols, replication.Column{Name: col, Field: "Decoder.HeaderColumns"})
	}
	return cols
}

// reconcile has the gap checks compare the stored checkpoint with the slot
// (DESIGN invariant 6), repairs what it is configured to repair (a backfill, a
// retaken snapshot), creates the slot when that is safe and allowed, and
// returns where to start.
func (r *Relay) reconcile(ctx context.Context, conn *pgx.Conn, op *checkpoint.Opening, systemID string) (pglogrepl.LSN, error) {
	slot := r.cfg.Slot
	stored, haveStored := op.Stored()
	state, rep, err := r.gaps.Slot(ctx, conn, gaps.SlotFacts{
		SystemID: systemID, Stored: stored, HaveStored: haveStored,
		SnapshotPending: op.SnapshotPending(), RetakeSnapshot: r.cfg.Snapshot != nil,
		Joined: r.joined,
	})
	if rep.Failed == gaps.CheckSnapshotIncomplete && err == nil {
		return r.retakeSnapshot(ctx, conn, op, stored, state)
	}
	if err != nil {
		var gap *gaps.GapError
		if !errors.As(err, &gap) || !backfillable(gap.Kind) {
			return 0, err
		}
		if r.cfg.Backfill == nil {
			return 0, fmt.Errorf("%w. Or restart with backfilling on "+r.cfg.Names.Name("Backfill")+": "+
				"the relay then recreates the slot and republishes the outbox rows still in the table "+
				"that were created since %s", err, r.backfillSince(stored).UTC().Format(time.RFC3339))
		}
		r.log.Warn().Err(err).Msg("slot lost: backfilling " + r.cfg.Names.Name("Backfill"))
		return r.backfill(ctx, conn, op, stored, state, gap.Kind)
	}
	if !state.Exists {
		if !r.cfg.CreateSlot {
			return 0, &replication.ConfigError{Msg: fmt.Sprintf("replication slot %q does not exist and the relay may not create it %s: run SELECT pg_create_logical_replication_slot('%s', 'pgoutput'); or allow the relay to create it", slot, r.cfg.Names.Name("CreateSlot"), slot)}
		}
		if r.cfg.Snapshot != nil {
			return r.initialSnapshot(ctx, conn, op)
		}
		if err := r.creatingSlot(ctx, func() error { return replication.CreateSlot(ctx, r.cfg.PGURL, slot, r.failover, r.cfg.Names) }); err != nil {
			return 0, err
		}
		if state, err = replication.ReadSlot(ctx, conn, slot); err != nil {
			return 0, err
		}
		r.log.Info().Str("lsn", state.ConfirmedFlush.String()).Msg("created replication slot")
	}
	if r.cfg.Snapshot != nil {
		r.log.Info().Msg("replication slot exists: no initial snapshot is taken (the initial snapshot " + r.cfg.Names.Name("Snapshot") + " is taken only when the relay creates the slot)")
	}
	return op.StartFrom(state.ConfirmedFlush), nil
}

// backfillable reports whether on-slot-loss=backfill applies to a gap: the slot
// is gone or moved on the same system. A changed system or a foreign slot is
// never repaired automatically.
func backfillable(k gaps.GapKind) bool {
	return k == gaps.SlotMissing || k == gaps.SlotLost || k == gaps.SlotAhead
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
func (r *Relay) backfill(ctx context.Context, conn *pgx.Conn, op *checkpoint.Opening, stored checkpoint.Checkpoint, state replication.SlotState, kind gaps.GapKind) (pglogrepl.LSN, error) {
	slot := r.cfg.Slot
	since := r.backfillSince(stored)
	if stored.CommitTime.IsZero() {
		r.log.Warn().Time("saved_at", stored.UpdatedAt).Msg("the stored checkpoint has no commit time (saved by an older relay): " +
			"backfilling from its save time less the margin; if the relay lagged behind when it saved, " +
			"replay older rows with " + r.cfg.Names.Command("replay", "since", "<time>"))
	}
	markTime := stored.CommitTime // a valid lower bound for commits after the new position
	if kind == gaps.SlotLost {
		if state.Active {
			return 0, fmt.Errorf("backfill slot %q: the lost slot is in use by process %d; stop that consumer first", slot, state.ActivePID)
		}
		if err := replication.DropSlot(ctx, conn, slot); err != nil {
			return 0, fmt.Errorf("backfill slot %q: drop the lost slot: %w", slot, err)
		}
		r.log.Warn().Msg("dropped the replication slot whose WAL was lost")
		state = replication.SlotState{}
	}
	if !state.Exists {
		if !r.cfg.CreateSlot {
			return 0, &replication.ConfigError{Msg: fmt.Sprintf("backfill slot %q: the slot must be recreated but the relay may not create it %s: run SELECT pg_create_logical_replication_slot('%s', 'pgoutput'); and restart", slot, r.cfg.Names.Name("CreateSlot"), slot)}
		}
		// Every transaction the new slot streams commits after this instant.
		var err error
		if markTime, err = replication.ServerClock(ctx, conn); err != nil {
			return 0, fmt.Errorf("backfill slot %q: %w", slot, err)
		}
		if err := r.creatingSlot(ctx, func() error { return replication.CreateSlot(ctx, r.cfg.PGURL, slot, r.failover, r.cfg.Names) }); err != nil {
			return 0, err
		}
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
	n, err := r.cfg.Backfill(ctx, since, kind.String())
	r.m.BackfilledEvents.WithLabelValues(kind.String()).Add(float64(n))
	if err != nil {
		return 0, fmt.Errorf("backfill slot %q from %s (%d rows republished before the failure; the next start backfills again): %w",
			slot, since.UTC().Format(time.RFC3339), n, err)
	}
	// Kafka acknowledged every republished row, so the slot's position may be
	// stored: the rows of the gap are in Kafka and the slot streams what follows.
	if err := op.Reposition(ctx, state.ConfirmedFlush, markTime, stored.Offsets); err != nil {
		return 0, fmt.Errorf("backfill slot %q: %w", slot, err)
	}
	r.log.Warn().Int("events", n).Dur("took", time.Since(began)).Str("lsn", state.ConfirmedFlush.String()).
		Msg("backfill done: streaming from the slot's position")
	return state.ConfirmedFlush, nil
}
