package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/outboxtable"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// A table that joins.
//
// When the relay adds an outbox table to the publication of a slot that
// exists (the table was added to its list since the slot's position), the
// slot resumes from before the change, and Postgres decodes every change
// with the publication as it was when the change was written: the rows
// committed into the table before it joined are never streamed, whatever
// position the relay resumes from. So the relay publishes them itself.
//
// The join never holds up the application. replication.JoinTables locks the
// table for milliseconds: it adds it to the publication and reads the
// snapshot that holds exactly the rows the stream will never carry, and
// recordJoin stores both the checkpoint's table list and the join in progress
// (checkpoint.Join: tables, snapshot, mode) in that same transaction. Only
// after the commit does publishJoins read the rows visible in the snapshot,
// from the pool without a lock, and publish them before the stream starts, so
// a key's rows committed before the join come before those committed after.
// A Kafka outage then stops the relay, never the application's inserts.
//
// Crashes. The join in progress is durable from the commit that adds the
// table: a start that finds one publishes what is left of it, resuming after
// the position of the last batch Kafka acknowledged (stored after each
// batch), and only then removes it. The relay's own join never leads to
// table_joined: the checkpoint names the table from that commit on.
//
// What a join publishes is Config.JoinMode: all the rows the table holds
// (JoinAll, the default: the checkpoint does not say which rows committed
// after it, so the superset loses none); only those committed at or after the
// stored checkpoint's commit time, by their commit timestamps
// (JoinAfterCheckpoint, which needs track_commit_timestamp = on); or none
// (JoinNone: the documented gap, with a warning that counts the rows and
// says how to replay them).

// Join modes (Config.JoinMode).
const (
	// JoinAll publishes every row the joining table holds.
	JoinAll = "all"
	// JoinAfterCheckpoint publishes the rows whose transaction committed at
	// or after the stored checkpoint's commit time (pg_xact_commit_timestamp,
	// needs track_commit_timestamp = on), and those whose commit time is
	// unknown (committed before the setting was on).
	JoinAfterCheckpoint = "after-checkpoint"
	// JoinNone publishes none: the rows committed before the join never
	// reach Kafka unless replayed (cdc-relay replay).
	JoinNone = "none"
)

// Joiner publishes the rows of outbox tables that joined the publication
// (Config.Join); outboxtable.Republisher is the command line's.
type Joiner interface {
	// Count returns how many rows Publish would select with p.
	Count(ctx context.Context, db outboxtable.Querier, p outboxtable.Pass) (int64, error)
	// Publish publishes the rows p selects and returns how many Kafka
	// acknowledged, telling p.Progress each batch's position once it did.
	Publish(ctx context.Context, db outboxtable.Querier, p outboxtable.Pass) (int, error)
}

var _ Joiner = outboxtable.Republisher{}

// joinMode is Config.JoinMode, JoinAll when unset.
func (r *Relay) joinMode() string {
	if r.cfg.JoinMode == "" {
		return JoinAll
	}
	return r.cfg.JoinMode
}

// prepareJoin reads, before a table may join the publication of slot (which
// exists), what recordJoin stores with it: the stored checkpoint, or the one
// to insert at the slot's position when there is none. Read before the lock,
// so that the join holds it for as short as can be.
func (r *Relay) prepareJoin(ctx context.Context, slot replication.SlotState) error {
	store := r.cfg.Checkpoints
	if err := store.Ensure(ctx); err != nil {
		return err
	}
	stored, have, err := store.Load(ctx, r.cfg.Slot)
	if err != nil {
		return fmt.Errorf("load checkpoint of slot %q: %w", r.cfg.Slot, err)
	}
	r.join = joinBase{stored: stored, have: have}
	if have {
		return nil
	}
	// No checkpoint: the join is recorded in one at the slot's position,
	// where the stream starts anyway (Opening.StartFrom), with the tables
	// unknown as before.
	system, err := replication.IdentifySystem(ctx, r.cfg.PGURL, r.cfg.Names)
	if err != nil {
		return err
	}
	r.join.stored = checkpoint.Checkpoint{Slot: r.cfg.Slot, SystemID: system.SystemID, LSN: slot.ConfirmedFlush, RelayName: r.cfg.RelayName}
	if r.cfg.Delivery == DeliveryEffectivelyOnce {
		r.join.stored.Offsets = checkpoint.Offsets{} // nothing was sent from this slot: no checkpoint
	}
	return nil
}

// joinBase is what prepareJoin read for recordJoin.
type joinBase struct {
	stored checkpoint.Checkpoint
	have   bool
	// none are the joins of JoinNone, whose rows are counted once joined.
	none []checkpoint.Join
}

// recordJoin is replication.SetupConfig.JoinSnapshot: within tx, the
// transaction that adds tables to the publication holding their lock, it
// stores the join in progress with snapshot, and the tables in the
// checkpoint's list, so both commit with the change or neither does.
func (r *Relay) recordJoin(ctx context.Context, tx pgx.Tx, tables []decoder.TableName, snapshot string) error {
	var names []string
	for _, t := range tables {
		names = append(names, t.String())
	}
	mode := r.joinMode()
	if r.cfg.Join == nil && mode != JoinNone {
		return errors.New("the relay was built without a way to publish the rows of an outbox table that joins the publication (Config.Join)")
	}
	if mode == JoinAfterCheckpoint {
		var on bool
		if err := tx.QueryRow(ctx, "SELECT current_setting('track_commit_timestamp')::bool").Scan(&on); err != nil {
			return fmt.Errorf("read track_commit_timestamp: %w", err)
		}
		if !on {
			return &replication.ConfigError{Err: r.cfg.Names.Errorf("JoinMode",
				"outbox table %s joins the publication and after-checkpoint publishes its rows committed since the checkpoint by their commit timestamps, "+
					"but the server does not keep them: set track_commit_timestamp = on in postgresql.conf and restart Postgres (rows committed before are then published too, their commit time unknown), "+
					"or choose all or none", strings.Join(names, ", "))}
		}
	}
	j := checkpoint.Join{Tables: names, Snapshot: snapshot, Mode: mode}
	if err := tx.QueryRow(ctx, "SELECT txid_current()").Scan(&j.XID); err != nil {
		return fmt.Errorf("read the join's transaction id: %w", err)
	}
	if mode == JoinAfterCheckpoint {
		j.CommittedSince = r.joinSince()
	}
	cp := r.join.stored
	cp.Tables, cp.Joins = names, nil
	if mode == JoinNone {
		r.join.none = append(r.join.none, j)
	} else {
		cp.Joins = []checkpoint.Join{j}
	}
	r.log.Warn().Strs("tables", names).Str("publication", r.cfg.Publication).Str("mode", mode).
		Msgf("outbox table %s joins publication %q while the slot resumes from before the change, so Postgres never streams the rows committed into it until now: "+
			"the relay publishes what %s says of them (%s) before it streams, reading them without a lock from the snapshot taken with the change; "+
			"the stream carries those committed after",
			strings.Join(names, ", "), r.cfg.Publication, r.cfg.Names.Name("JoinMode"), mode)
	if err := r.cfg.Checkpoints.RecordJoin(ctx, tx, cp); err != nil {
		return err
	}
	r.joined = append(r.joined, names...)
	return nil
}

// joinSince is where JoinAfterCheckpoint starts: the stored checkpoint's
// commit time, which is no later than the commit of any transaction after
// its position and is read from the same commit records as
// pg_xact_commit_timestamp, so it needs no margin; for a checkpoint saved
// before commit times were stored, its save time less BackfillMargin. Zero
// (every row) without a checkpoint.
func (r *Relay) joinSince() time.Time {
	if !r.join.have {
		return time.Time{}
	}
	stored := r.join.stored
	if !stored.CommitTime.IsZero() {
		return stored.CommitTime
	}
	return stored.UpdatedAt.Add(-r.cfg.BackfillMargin)
}

// joinMark is the header of the rows a join publishes.
var joinMark = outbox.Header{Key: replay.HeaderSnapshot, Value: []byte("join")}

// publishJoins publishes, before the stream starts, what is left of the joins
// in progress the checkpoint store holds (this start's, or one a crash cut
// short), oldest first, from the pool without a lock: the rows visible in
// each join's snapshot, less those before its stored positions. Each batch
// Kafka acknowledged moves the stored position; a join done is removed. The
// joins of JoinNone are counted and warned about.
func (r *Relay) publishJoins(ctx context.Context) error {
	for _, j := range r.join.none {
		n, err := r.countJoin(ctx, j)
		if err != nil {
			return err
		}
		var replays []string
		for _, t := range j.Tables {
			replays = append(replays, "`"+r.cfg.Names.Command("replay", "table", t, "since", "<time>", "until", time.Now().UTC().Format(time.RFC3339))+"`")
		}
		r.log.Warn().Strs("tables", j.Tables).Str("mode", JoinNone).Int64("unpublished", n).
			Msgf("joined outbox table %s without publishing the %d rows committed into it before the join (%s none): the stream never carries them, so consumers miss them; "+
				"to publish them later, run %s",
				strings.Join(j.Tables, ", "), n, r.cfg.Names.Name("JoinMode"), strings.Join(replays, " "))
	}
	r.join.none = nil
	store := r.cfg.Checkpoints
	if err := store.Ensure(ctx); err != nil {
		return err
	}
	stored, have, err := store.Load(ctx, r.cfg.Slot)
	if err != nil {
		return fmt.Errorf("load checkpoint of slot %q: %w", r.cfg.Slot, err)
	}
	if !have || len(stored.Joins) == 0 {
		return nil
	}
	if r.cfg.Join == nil {
		return errors.New("the relay was built without a way to publish the rows of an outbox table that joins the publication (Config.Join)")
	}
	joins := stored.Joins
	for len(joins) > 0 {
		j := joins[0]
		resumed := len(j.After) > 0
		n, err := r.countJoin(ctx, j)
		if err != nil {
			return err
		}
		how := ""
		if resumed {
			how = ", resuming after the rows a start cut short had in Kafka"
		}
		r.log.Info().Strs("tables", j.Tables).Str("mode", j.Mode).Int64("events", n).Bool("resumed", resumed).Time("committed_since", j.CommittedSince).
			Msgf("join snapshot: publishing %d rows of outbox table %s committed before it joined the publication (%s %s%s), before streaming",
				n, strings.Join(j.Tables, ", "), r.cfg.Names.Name("JoinMode"), j.Mode, how)
		began := time.Now()
		p, err := r.joinPass(ctx, j)
		if err != nil {
			return err
		}
		p.Progress = func(ctx context.Context, table decoder.TableName, pos string) error {
			if joins[0].After == nil {
				joins[0].After = map[string]string{}
			}
			joins[0].After[table.String()] = pos
			return store.SaveJoins(ctx, r.cfg.Slot, joins)
		}
		published, err := r.cfg.Join.Publish(ctx, r.writer, p)
		if err != nil {
			return fmt.Errorf("publish the rows of the joining outbox table %s (%d published before the failure; the next start resumes after the last batch Kafka acknowledged): %w",
				strings.Join(j.Tables, ", "), published, err)
		}
		joins = joins[1:]
		if err := store.SaveJoins(ctx, r.cfg.Slot, joins); err != nil {
			return err
		}
		r.log.Info().Strs("tables", j.Tables).Int("events", published).Dur("took", time.Since(began)).
			Msg("join snapshot done: the table joined the publication, and the stream carries its rows committed after")
	}
	return nil
}

// joinPass is what j publishes: the rows visible in its snapshot (since its
// commit time for JoinAfterCheckpoint), after its stored positions.
func (r *Relay) joinPass(ctx context.Context, j checkpoint.Join) (outboxtable.Pass, error) {
	p := outboxtable.Pass{
		Options: outboxtable.ReplayOptions{Snapshot: j.Snapshot, CommittedSince: j.CommittedSince, Headers: []outbox.Header{joinMark}},
		After:   map[decoder.TableName]string{},
	}
	if j.XID != 0 {
		// With commit timestamps the join's own commit time ends the read:
		// a subtransaction of a writer in progress at the snapshot, which
		// the snapshot's text cannot exclude, commits after it.
		var at *time.Time
		if err := r.writer.QueryRow(ctx, `SELECT CASE WHEN current_setting('track_commit_timestamp')::bool
THEN pg_xact_commit_timestamp(($1::int8 % 4294967296)::text::xid) END`, j.XID).Scan(&at); err != nil {
			return p, fmt.Errorf("read the commit time of the join of %s: %w", strings.Join(j.Tables, ", "), err)
		}
		if at != nil {
			p.Options.Through = outboxtable.CommittedThrough(*at)
		}
	}
	for _, t := range j.Tables {
		schema, table, _ := strings.Cut(t, ".")
		name := decoder.TableName{Schema: schema, Table: table}
		p.Tables = append(p.Tables, name)
		if pos, ok := j.After[t]; ok {
			p.After[name] = pos
		}
	}
	return p, nil
}

// countJoin counts the rows j would publish, through the primary.
func (r *Relay) countJoin(ctx context.Context, j checkpoint.Join) (int64, error) {
	if r.cfg.Join == nil {
		return 0, errors.New("the relay was built without a way to read the rows of an outbox table that joins the publication (Config.Join)")
	}
	p, err := r.joinPass(ctx, j)
	if err != nil {
		return 0, err
	}
	n, err := r.cfg.Join.Count(ctx, r.writer, p)
	if err != nil {
		return 0, fmt.Errorf("count the rows of the joining outbox table %s: %w", strings.Join(j.Tables, ", "), err)
	}
	return n, nil
}

// tableNames are the outbox tables the relay reads, as schema.table; empty,
// not nil, for a message outbox alone.
func (r *Relay) tableNames() []string {
	names := []string{}
	for _, t := range r.setupConfig().PerTable() {
		if t.Table != "" {
			names = append(names, t.Schema+"."+t.Table)
		}
	}
	return names
}
