package cli

import (
	"context"
	"fmt"
	"slices"
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
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/sink"
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
	republish := r.outboxReplayer(cfg, pool, log, "backfill", "cdc-relay run "+cfg.RelayName+" (on-slot-loss=backfill)")
	cfg.Backfill = func(ctx context.Context, since time.Time, kind string) (int, error) {
		return republish(ctx, pool, nil, since, outbox.Header{Key: replay.HeaderBackfill, Value: []byte(kind)})
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
	republish := r.outboxReplayer(cfg, pool, log, "snapshot", "cdc-relay run "+cfg.RelayName+" (snapshot=initial)")
	cfg.Snapshot = func(ctx context.Context, tx pgx.Tx) (int, error) {
		return republish(ctx, tx, nil, time.Time{}, outbox.Header{Key: replay.HeaderSnapshot, Value: []byte("initial")})
	}
}

// setJoin installs in cfg the publishing of the rows of outbox tables that
// join the publication of an existing slot (relay.Config.Join): every row tx
// sees in them, through a replay recorded like a backfill's, marked with the
// header replay.HeaderSnapshot: join. pool is the relay's (cfg.Pool).
func (r *RunCmd) setJoin(cfg *relay.Config, pool *pgxpool.Pool, log zerolog.Logger) {
	if cfg.Decoder.Table == "" {
		return // a message outbox alone: no table joins
	}
	republish := r.outboxReplayer(cfg, pool, log, "join", "cdc-relay run "+cfg.RelayName+" (a table joins the publication)")
	cfg.Join = func(ctx context.Context, tx pgx.Tx, tables []decoder.TableName) (int, error) {
		return republish(ctx, tx, tables, time.Time{}, outbox.Header{Key: replay.HeaderSnapshot, Value: []byte("join")})
	}
}

// replayFunc republishes the outbox rows db reads of the tables named (nil:
// every outbox table) that were created at or after since (zero: all), in
// the order outboxtable.Replay reads them (created_at, then as each transaction
// inserted them), each with header mark, and returns how many Kafka
// acknowledged.
type replayFunc func(ctx context.Context, db outboxtable.Querier, tables []decoder.TableName, since time.Time, mark outbox.Header) (int, error)

// outboxReplayer returns the replay the relay's backfill, initial snapshot and join
// share: rows read with outboxtable.Replay, recorded in the replay history of
// the dead-letter tables (migration 005) over pool, produced through a
// producer of cfg's sink configuration as the relay produces.
func (r *RunCmd) outboxReplayer(cfg *relay.Config, pool *pgxpool.Pool, log zerolog.Logger, component, actor string) replayFunc {
	// Each table as the relay reads it: its own columns and topic where
	// the configuration file gives it some (tables.go).
	type tableReplay struct {
		table       decoder.TableName
		name, topic string
		regex       route.Regex
		cols        outboxtable.Columns
	}
	var replays []tableReplay
	for _, d := range append([]decoder.Config{cfg.Decoder}, cfg.Decoder.Also...) {
		if d.Table == "" {
			continue
		}
		t := tableReplay{table: decoder.TableName{Schema: d.Schema, Table: d.Table}, name: d.Schema + "." + d.Table, topic: cfg.Topic, regex: cfg.TopicRegex,
			cols: outboxtable.Columns{Columns: d.Columns, CreatedAt: d.CreatedAtColumn, Headers: d.HeaderColumns,
				ContentType: d.ContentType, Tracing: d.TracingColumn, Timestamp: d.TimestampColumn,
				Partition: d.PartitionColumn, Envelope: d.EnvelopeColumns,
				JSON: d.JSON, SchemaVersion: d.SchemaVersionColumn, RouteByEventType: d.RouteByEventType, Names: cfg.Names.Within("Decoder")}}
		if tr, ok := cfg.TableRoutes[decoder.TableName{Schema: d.Schema, Table: d.Table}]; ok {
			t.topic, t.regex = tr.Topic, tr.Regex
		}
		replays = append(replays, t)
	}
	store := deadletter.NewStore(pool, r.DLQTable)
	dlqTable := r.DLQTable
	sinkCfg := cfg.Sink
	sinkCfg.Logger = log.With().Str("component", component).Logger()
	sinkCfg.Names = cfg.Names.Within("Sink")
	wait := r.KafkaStartTimeout
	m := cfg.Metrics
	return func(ctx context.Context, db outboxtable.Querier, tables []decoder.TableName, since time.Time, mark outbox.Header) (int, error) {
		if err := store.Ensure(ctx); err != nil {
			return 0, fmt.Errorf("open the replay history (--dlq-table %s): %w", dlqTable, err)
		}
		octx, cancel := context.WithTimeout(ctx, wait)
		p, err := sink.NewPublisher(octx, sinkCfg)
		cancel()
		if err != nil {
			return 0, err
		}
		defer p.Close()
		p.TopicWait = wait
		// Each outbox table in turn: each one's rows in their order; events
		// of different tables have none between them.
		published := 0
		for _, t := range replays {
			if tables != nil && !slices.Contains(tables, t.table) {
				continue
			}
			table := t.name
			res, err := outboxtable.Replay(ctx, db, store.History(), table, t.cols, p, outboxtable.ReplayOptions{
				Since:      since,
				Topic:      t.topic,
				TopicRegex: t.regex,
				Actor:      actor,
				Headers:    []outbox.Header{mark},
			})
			published += res.Published
			if m != nil {
				m.Replays.WithLabelValues(replay.KindOutbox, replay.ResultPublished).Add(float64(res.Published))
				m.Replays.WithLabelValues(replay.KindOutbox, replay.ResultSkipped).Add(float64(res.Skipped))
				m.Replays.WithLabelValues(replay.KindOutbox, replay.ResultFailed).Add(float64(res.Failed))
			}
			if err != nil {
				return published, err
			}
			if res.Failed > 0 {
				log.Error().Int64("replay_id", res.ReplayID).Int("failed", res.Failed).Str("table", table).
					Msgf("%s: some rows could not be published (they stay in the outbox table); see cdc-relay dlq history", component)
			}
		}
		return published, nil
	}
}
