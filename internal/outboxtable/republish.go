package outboxtable

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/setting"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// ColumnsOf returns the Columns of the outbox table d configures, read as the
// relay's decoder reads it, naming d's fields through d.Names.
func ColumnsOf(d decoder.Config) Columns {
	return Columns{Columns: d.Columns, CreatedAt: d.CreatedAtColumn, Headers: d.HeaderColumns,
		ContentType: d.ContentType, Tracing: d.TracingColumn, Timestamp: d.TimestampColumn,
		Partition: d.PartitionColumn, Envelope: d.EnvelopeColumns, JSON: d.JSON,
		SchemaVersion: d.SchemaVersionColumn, RouteByEventType: d.RouteByEventType, Names: d.Names}
}

// TableReplay is one outbox table a Republisher reads: its columns and its
// topic (ReplayOptions.Topic, TopicRegex), as the relay reads and routes it.
type TableReplay struct {
	Table      decoder.TableName
	Columns    Columns
	Topic      string
	TopicRegex route.Regex
}

// HistoryStore holds the replay history a Republisher records its replays in
// (*deadletter.Store: the history of the dead-letter tables).
type HistoryStore interface {
	// Ensure creates the history's tables when missing.
	Ensure(ctx context.Context) error
	History() *replay.History
	// Table names the store (the dead-letter table) in errors.
	Table() string
}

// Republisher republishes the rows still in the relay's outbox tables, as
// the relay's backfill after a slot loss, its initial snapshot and the join
// of a table to its publication do: each table's rows read with Replay,
// recorded in DeadLetterStore's replay history, produced with Sink as the
// relay produces.
type Republisher struct {
	Tables []TableReplay
	// DeadLetterStore keeps the replay history.
	DeadLetterStore HistoryStore
	// Sink configures the producer each Republish opens and closes; its
	// Logger is replaced by Log with Component. Wait bounds the wait for
	// the brokers and for each topic not yet produced to
	// (sink.Publisher.TopicWait).
	Sink sink.Config
	Wait time.Duration
	// Component names the republishing in log lines ("backfill"), Actor in
	// the replay history.
	Component, Actor string
	Log              zerolog.Logger
	Metrics          *metrics.Metrics // nil: counted nowhere
	// Names names the settings in errors and log lines as the relay's
	// (relay.Config.Names): DeadLetterStore is relay.Config's.
	Names setting.Namer
}

// Pass is what one republishing selects: the rows of Tables (nil: every one
// of the Republisher's) that Options' filters select (Since, Snapshot,
// CommittedSince), each table's read resuming at After (a position Progress
// was given), each event with Options.Headers. Options' Topic, TopicRegex,
// Actor and After are each table's, set by the Republisher.
type Pass struct {
	Tables  []decoder.TableName
	Options ReplayOptions
	// After is where each table's read resumes (ReplayOptions.After); a
	// table absent reads from its first row.
	After map[decoder.TableName]string
	// Progress, when not nil, is told after each batch Kafka acknowledged
	// the position up to which table's rows are done (ReplayOptions.Progress).
	Progress func(ctx context.Context, table decoder.TableName, pos string) error
}

// RepublishBatch is how many rows a Republisher publishes, records and
// moves its position by at once, unless Pass.Options.BatchSize says: ten
// times a replay's default, as nothing rate-limits it and each batch waits
// on Kafka and the history once.
const RepublishBatch = 1000

// options returns the ReplayOptions of t's read in p.
func (r Republisher) options(p Pass, t TableReplay) ReplayOptions {
	o := p.Options
	o.Topic, o.TopicRegex, o.Actor, o.After = t.Topic, t.TopicRegex, r.Actor, p.After[t.Table]
	if o.BatchSize == 0 {
		o.BatchSize = RepublishBatch
	}
	o.Progress = nil
	if p.Progress != nil {
		table := t.Table
		o.Progress = func(ctx context.Context, pos string) error { return p.Progress(ctx, table, pos) }
	}
	return o
}

// selected returns the Tables p reads, in the Republisher's order.
func (r Republisher) selected(p Pass) []TableReplay {
	var out []TableReplay
	for _, t := range r.Tables {
		if p.Tables == nil || slices.Contains(p.Tables, t.Table) {
			out = append(out, t)
		}
	}
	return out
}

// Count returns how many rows Publish would select with p, read through db.
func (r Republisher) Count(ctx context.Context, db Querier, p Pass) (int64, error) {
	var n int64
	for _, t := range r.selected(p) {
		c, err := Count(ctx, db, t.Table.String(), t.Columns, r.options(p, t))
		if err != nil {
			return n, err
		}
		n += c
	}
	return n, nil
}

// Republish republishes the outbox rows db reads (the pool, or a transaction
// that imported a snapshot) of the tables named (nil: every one of
// Tables) that were created at or after since (zero: all), each event with
// header mark: Publish of that Pass.
func (r Republisher) Republish(ctx context.Context, db Querier, tables []decoder.TableName, since time.Time, mark outbox.Header) (int, error) {
	return r.Publish(ctx, db, Pass{Tables: tables, Options: ReplayOptions{Since: since, Headers: []outbox.Header{mark}}})
}

// Publish republishes the outbox rows db reads (the pool, or a transaction
// that imported a snapshot) that p selects, table after table, each table's
// rows in Replay's order, each event with p.Options.Headers after
// replay.HeaderReplay, and returns how many Kafka acknowledged. Rows that
// fail stay in the outbox table: they are recorded in the history, counted
// and logged, and the others go on; an error stops the republishing.
func (r Republisher) Publish(ctx context.Context, db Querier, p Pass) (int, error) {
	if err := r.DeadLetterStore.Ensure(ctx); err != nil {
		return 0, fmt.Errorf("open the replay history in dead-letter table %s %s: %w", r.DeadLetterStore.Table(), r.Names.Name("DeadLetterStore"), err)
	}
	sinkCfg := r.Sink
	sinkCfg.Logger = r.Log.With().Str("component", r.Component).Logger()
	octx, cancel := context.WithTimeout(ctx, r.Wait)
	pub, err := sink.NewPublisher(octx, sinkCfg)
	cancel()
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	pub.TopicWait = r.Wait
	// Each outbox table in turn: each one's rows in their order; events of
	// different tables have none between them.
	published := 0
	for _, t := range r.selected(p) {
		table := t.Table.String()
		o := r.options(p, t)
		o.OnOrder = func(ord Ordering) {
			r.Log.Info().Str("table", table).Str("order", ord.String()).Str("insert_order_column", ord.Column).Msgf("%s: reading outbox table %s in %s order: %s", r.Component, table, ord, ord.Caveat())
		}
		res, err := Replay(ctx, db, r.DeadLetterStore.History(), table, t.Columns, pub, o)
		published += res.Published
		if m := r.Metrics; m != nil {
			m.Replays.WithLabelValues(replay.KindOutbox, replay.ResultPublished).Add(float64(res.Published))
			m.Replays.WithLabelValues(replay.KindOutbox, replay.ResultSkipped).Add(float64(res.Skipped))
			m.Replays.WithLabelValues(replay.KindOutbox, replay.ResultFailed).Add(float64(res.Failed))
		}
		if err != nil {
			return published, err
		}
		if res.Failed > 0 {
			r.Log.Error().Int64("replay_id", res.ReplayID).Int("failed", res.Failed).Str("table", table).
				Msgf("%s: some rows could not be published (they stay in the outbox table); see %s", r.Component, r.Names.Command("dlq history"))
		}
	}
	return published, nil
}
