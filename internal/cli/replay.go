package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/connectjson"
	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/outboxtable"
	"github.com/cdc-relay/cdc-relay/internal/report"
)

// ReplayCmd is "cdc-relay replay": publish rows still in the outbox table again.
type ReplayCmd struct {
	// In the order of their help groups (help.go).
	PGFlags            `embed:"" group:"postgres" set:"table_default=" kong:"set='table_note= (default public.outbox_events; with --messages-prefix alone none, and replay refuses)'"`
	messagesFlag       `embed:"" group:"postgres"`
	outboxColumnFlags  `embed:"" group:"postgres"`
	createdAtFlag      `embed:"" group:"postgres" set:"created_at_note= (for --since, --until and the order)"`
	dlqStoreFlags      `embed:"" group:"postgres"`
	KafkaFlags         `embed:"" set:"kafka_brokers_note= unless --dry-run"` // its --topic flags are in group routing
	headerColumnFlags  `embed:"" group:"routing"`
	formatFlags        `embed:"" group:"routing"`
	payloadFormatFlags `embed:"" group:"routing"` // --content-type, --column-tracing

	Since       string   `group:"selection" help:"Required. Replay rows created at or after this time: RFC 3339 (2024-05-01T10:00:00Z), a date (2024-05-01, UTC) or a duration ago (30m, 2h, 7d)." placeholder:"TIME"`
	Until       string   `group:"selection" help:"Replay rows created before this time (same forms as --since; default: now)." placeholder:"TIME"`
	AggregateID string   `group:"selection" help:"Only rows of this aggregate id." placeholder:"ID"`
	EventType   string   `group:"selection" help:"Only rows of this event type." placeholder:"TYPE"`
	ID          []string `name:"id" group:"selection" help:"Only these event ids (repeat the flag or separate with commas)." placeholder:"EVENT-ID"`
	Limit       int      `group:"selection" help:"Replay at most this many rows (0: all)."`

	publishFlags `embed:"" group:"replay"`

	since, until time.Time         `kong:"-"`
	headers      map[string]string `kong:"-"`
}

// Validate checks the flags and parses the times.
func (r *ReplayCmd) Validate() error {
	if err := requirePG(&r.PGFlags); err != nil {
		return err
	}
	r.resolveTable(&r.Table)
	table, err := oneTable("replay", r.Table)
	if err != nil {
		return err
	}
	if table == "" {
		return flagError("messages-prefix", "is set without --table: replay republishes rows still in the outbox table, and a message outbox has none (its events exist only in the WAL, docs/message-outbox.md); give --table to replay the table's rows, or republish dead letters with cdc-relay dlq replay")
	}
	if _, _, err := splitTable(table); err != nil {
		return flagError("table", err.Error())
	}
	if err := r.dlqStoreFlags.validate(); err != nil {
		return err
	}
	if err := r.publishFlags.validate(); err != nil {
		return err
	}
	if err := r.checkKafka(&r.KafkaBrokers, &r.KafkaSecurityFlags); err != nil {
		return err
	}
	if err := r.validateTopic(); err != nil {
		return err
	}
	headers, err := r.headerColumns()
	if err != nil {
		return err
	}
	r.headers = headers
	if err := r.payloadFormatFlags.validate(); err != nil {
		return err
	}
	if r.TombstoneOnEmptyPayload && len(r.EnvelopeColumns) > 0 && r.ValueEncoding == connectjson.NameRaw {
		return flagError("envelope-columns", "cannot be combined with --tombstone-on-empty-payload when --value-encoding is raw: the raw envelope is never empty (with a JSON encoding, a NULL or blank payload is a tombstone, as in Debezium)")
	}
	if _, err := r.jsonOptions(firstTable(r.Table), r.Topic, r.TombstoneOnEmptyPayload); err != nil {
		return err
	}
	if err := r.formatFlags.validate(); err != nil {
		return err
	}
	if strings.TrimSpace(r.Since) == "" {
		return flagError("since", "is required: the time to replay from, "+timeHelp)
	}
	now := time.Now()
	if r.since, err = parseTime(r.Since, now); err != nil {
		return flagError("since", err.Error())
	}
	if r.until, err = parseTime(r.Until, now); err != nil {
		return flagError("until", err.Error())
	}
	if !r.until.IsZero() && !r.until.After(r.since) {
		return flagError("until", fmt.Sprintf("(%s) must be after --since (%s)", r.until.Format(time.RFC3339), r.since.Format(time.RFC3339)))
	}
	if r.Limit < 0 {
		return flagError("limit", "must be 0 (all) or more")
	}
	return nil
}

// Run publishes the selected rows and prints what the replay did.
func (r *ReplayCmd) Run(ctx context.Context, env Env) error {
	pool, err := connect(ctx, r.PGURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := deadletter.NewStore(pool, r.DLQTable)
	if err := store.Ensure(ctx); err != nil {
		return err
	}
	format, err := r.recordFormat(r.PGURL, firstTable(r.Table))
	if err != nil {
		return err
	}
	pub, done, err := r.replayPublisher(ctx, r.KafkaBrokers, &r.KafkaSecurityFlags, format, env.Stderr)
	if err != nil {
		return err
	}
	defer done()
	cols := outboxtable.Columns{Columns: r.columns(), CreatedAt: r.ColumnCreatedAt, Headers: r.headers,
		ContentType: r.ContentType, Tracing: r.ColumnTracing, Timestamp: r.ColumnTimestamp, Partition: r.ColumnPartition,
		Names: runNames.Within("Decoder")}
	if cols.Envelope, err = r.envelope(); err != nil {
		return err
	}
	if cols.JSON, err = r.jsonOptions(firstTable(r.Table), r.Topic, r.TombstoneOnEmptyPayload); err != nil {
		return err
	}
	cols.SchemaVersion, cols.RouteByEventType = r.ColumnSchemaVersion, routeByEventType(r.Topic, r.topicRegex())
	res, err := outboxtable.Replay(ctx, pool, store.History(), firstTable(r.Table), cols, pub, outboxtable.ReplayOptions{
		Since: r.since, Until: r.until, AggregateID: r.AggregateID, EventType: r.EventType, IDs: r.ID,
		Limit: r.Limit, Topic: r.Topic, TopicRegex: r.topicRegex(), Rate: r.Rate, BatchSize: r.BatchSize, DryRun: r.DryRun, Actor: r.actor(),
		// Before the first row: which order, and what it can misorder.
		OnOrder: func(o outboxtable.Ordering) {
			fmt.Fprintf(env.Stderr, "replay: reading %s in %s order: %s\n", firstTable(r.Table), o, o.Caveat())
		},
	})
	return reportReplay(env.Stdout, report.ReplaySummary{Kind: "outbox", Actor: r.actor(), DryRun: r.DryRun, Result: res}, err)
}
