package cli

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/outboxtable"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/replay"
)

// validateSlotLoss checks the --on-slot-loss flags.
func (r *RunCmd) validateSlotLoss() error {
	if r.OnSlotLoss == "backfill" && r.BackfillMargin <= 0 {
		return flagError("backfill-margin", "must be more than 0 with --on-slot-loss=backfill: it covers transactions that inserted their rows before they committed")
	}
	if r.ColumnCreatedAt == "" {
		return flagError("column-created-at", "must name the outbox's insert-time column")
	}
	return nil
}

// setBackfill installs the on-slot-loss=backfill policy in cfg: republish the
// outbox rows created since a time through a replay (recorded in the replay
// history of the dead-letter tables, migration 005) marked with the header
// replay.HeaderBackfill, producing as the relay does. pool is the relay's
// (cfg.Pool).
func (r *RunCmd) setBackfill(cfg *relay.Config, pool *pgxpool.Pool, log zerolog.Logger) {
	if r.OnSlotLoss != "backfill" {
		return
	}
	rp := r.republisher(cfg, pool, log, "backfill", "cdc-relay run "+cfg.RelayName+" (on-slot-loss=backfill)")
	cfg.Backfill = func(ctx context.Context, since time.Time, kind string) (int, error) {
		return rp.Republish(ctx, pool, nil, since, outbox.Header{Key: replay.HeaderBackfill, Value: []byte(kind)})
	}
}

// setSnapshot installs --snapshot initial in cfg: when the relay creates its
// slot, publish the rows of the exported snapshot through a replay (recorded
// like a backfill's) marked with the header replay.HeaderSnapshot. pool is
// the relay's (cfg.Pool).
func (r *RunCmd) setSnapshot(cfg *relay.Config, pool *pgxpool.Pool, log zerolog.Logger) {
	if r.Snapshot != "initial" {
		return
	}
	rp := r.republisher(cfg, pool, log, "snapshot", "cdc-relay run "+cfg.RelayName+" (snapshot=initial)")
	cfg.Snapshot = func(ctx context.Context, tx pgx.Tx) (int, error) {
		return rp.Republish(ctx, tx, nil, time.Time{}, outbox.Header{Key: replay.HeaderSnapshot, Value: []byte("initial")})
	}
}

// setJoin installs in cfg the publishing of the rows of outbox tables that
// join the publication of an existing slot (relay.Config.Join): a replay
// recorded like a backfill's, which the relay marks with the header
// replay.HeaderSnapshot: join; and what it publishes (--join). pool is the
// relay's (cfg.Pool).
func (r *RunCmd) setJoin(cfg *relay.Config, pool *pgxpool.Pool, log zerolog.Logger) {
	cfg.JoinMode = r.Join
	if cfg.Decoder.Table == "" {
		return // a message outbox alone: no table joins
	}
	cfg.Join = r.republisher(cfg, pool, log, "join", "cdc-relay run "+cfg.RelayName+" (a table joins the publication)")
}

// republisher returns the republishing of outbox rows the relay's backfill,
// initial snapshot and join share, for cfg's outbox tables (each with its
// own columns and topic where the configuration file gives it some,
// tables.go), recording in the dead-letter tables over pool.
func (r *RunCmd) republisher(cfg *relay.Config, pool *pgxpool.Pool, log zerolog.Logger, component, actor string) outboxtable.Republisher {
	rp := outboxtable.Republisher{DeadLetterStore: deadletter.NewStore(pool, r.DLQTable), Sink: cfg.Sink, Wait: r.KafkaStartTimeout,
		Component: component, Actor: actor, Log: log, Metrics: cfg.Metrics, Names: cfg.Names}
	rp.Sink.Names, rp.Sink.DecoderNames = cfg.Names.Within("Sink"), cfg.Names.Within("Decoder")
	for _, d := range append([]decoder.Config{cfg.Decoder}, cfg.Decoder.Also...) {
		if d.Table == "" {
			continue
		}
		d.Names = cfg.Names.Within("Decoder")
		t := outboxtable.TableReplay{Table: decoder.TableName{Schema: d.Schema, Table: d.Table}, Columns: outboxtable.ColumnsOf(d),
			Topic: cfg.Topic, TopicRegex: cfg.TopicRegex}
		if tr, ok := cfg.TableRoutes[t.Table]; ok {
			t.Topic, t.TopicRegex = tr.Topic, tr.Regex
		}
		rp.Tables = append(rp.Tables, t)
	}
	return rp
}
