package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/user"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/config"
	"github.com/cdc-relay/cdc-relay/internal/connectjson"
	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/kafkaconn"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// The flag groups several commands share, each declared once and embedded
// where it is used; KafkaSecurityFlags (kafkasec.go) is one too. A flag whose
// help differs by command ends its help with a variable, e.g.
// ${dlq_table_note=...}, that the embedding command sets with a `set:` tag, so
// one declaration keeps each command's help as it was.

// PGFlags are the Postgres connection and outbox flags shared by subcommands.
type PGFlags struct {
	PGURL       string   `key:"source.pg_url" field:"PGURL,Pool" name:"pg-url" help:"Required (or --pg-url-file). Postgres URL of the database holding the outbox table (the relay adds replication=database itself)." placeholder:"URL"`
	PGURLFile   string   `key:"source.pg_url_file" name:"pg-url-file" type:"path" help:"Read --pg-url from this file (a mounted secret), keeping the password off the command line and out of the environment." placeholder:"FILE"`
	Slot        string   `key:"source.slot" field:"Slot" default:"cdc_relay" help:"Logical replication slot the relay streams (one relay per slot)."`
	Publication string   `key:"source.publication" field:"Publication" default:"cdc_relay_outbox" help:"Publication covering the outbox table."`
	Table       []string `key:"tables" field:"Decoder.Schema,Decoder.Table" default:"${table_default=public.outbox_events}" help:"Outbox table, schema-qualified${table_note=}." placeholder:"SCHEMA.TABLE"`
}

// defaultTable is --table's default where --messages-prefix may leave it
// out (run, replay; see messagesFlag).
const defaultTable = "public.outbox_events"

// messagesFlag is the message outbox (run, replay): with it, --table is
// optional, and without --table no table is read.
type messagesFlag struct {
	MessagesPrefix string `key:"messages.prefix" field:"Decoder.MessagePrefix" name:"messages-prefix" help:"Also publish transactional logical decoding messages with this prefix (pg_logical_emit_message(true, PREFIX, <JSON envelope>), e.g. migrations' outbox_emit) as outbox events: the message outbox, PostgreSQL 14+ (docs/message-outbox.md). --table is then optional: without it the relay reads no table." placeholder:"PREFIX"`
}

// resolveTable sets an unset --table: its default, unless --messages-prefix
// is set (then it stays empty: no table).
func (f messagesFlag) resolveTable(tables *[]string) {
	if len(*tables) == 0 && f.MessagesPrefix == "" {
		*tables = []string{defaultTable}
	}
}

// checkTables checks each --table and that none is given twice.
func checkTables(tables []string) error {
	seen := map[string]bool{}
	for _, t := range tables {
		schema, table, err := splitTable(t)
		if err != nil {
			return flagError("table", err.Error())
		}
		if seen[schema+"."+table] {
			return flagError("table", fmt.Sprintf("names %s twice: name each outbox table once", t))
		}
		seen[schema+"."+table] = true
	}
	return nil
}

// oneTable returns the one outbox table of a command that reads one ("" for
// none), or an error when several were given.
func oneTable(cmd string, tables []string) (string, error) {
	switch len(tables) {
	case 0:
		return "", nil
	case 1:
		return tables[0], nil
	}
	return "", flagError("table", fmt.Sprintf("is given %d times (%s), and %s reads one outbox table: run it once per table", len(tables), strings.Join(tables, ", "), cmd))
}

// firstTable is the first --table, "" for none: the one whose layout names
// what several tables share (the payload's format, the JSON schema's name).
func firstTable(tables []string) string {
	if len(tables) == 0 {
		return ""
	}
	return tables[0]
}

// outboxName is the outbox's name where formats need one (the JSON schema
// name, the CloudEvents source): the table, else the message prefix.
func (f messagesFlag) outboxName(table string) string {
	if table == "" {
		return f.MessagesPrefix
	}
	return table
}

// resolve reads --pg-url-file into PGURL (every command checks its Postgres
// flags through requirePG, which calls this first).
func (p *PGFlags) resolve() error {
	if p.PGURLFile == "" {
		return nil
	}
	if p.PGURL != "" {
		return flagError("pg-url-file", "and --pg-url (CDC_RELAY_PG_URL) are both set: use one")
	}
	b, err := os.ReadFile(p.PGURLFile)
	if err != nil {
		return flagError("pg-url-file", fmt.Sprintf("cannot be read: %v", err))
	}
	p.PGURL = strings.TrimSpace(string(b))
	if p.PGURL == "" {
		return flagError("pg-url-file", fmt.Sprintf("names %s, which is empty", p.PGURLFile))
	}
	p.PGURLFile = "" // read: a second resolve keeps the URL
	return nil
}

// requirePG checks --pg-url.
func requirePG(p *PGFlags) error {
	if err := p.resolve(); err != nil {
		return err
	}
	if strings.TrimSpace(p.PGURL) == "" {
		return flagError("pg-url", "is required: the Postgres URL of the database with the outbox table, e.g. postgres://user:pass@host:5432/db")
	}
	return nil
}

// connect opens a small pool and checks that Postgres answers.
func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, flagError("pg-url", "cannot be parsed: "+err.Error())
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		if err = pool.Ping(ctx); err != nil {
			pool.Close()
		}
	}
	if err != nil {
		return nil, replication.ConnectError(url, err, runNames)
	}
	return pool, nil
}

// KafkaFlags are the Kafka flags of the commands that publish to the
// relay's topic (run, replay).
type KafkaFlags struct {
	kafkaBrokerFlags `embed:"" group:"kafka"`
	Topic            string `key:"outbox.topic" field:"Topic,Sink.Topics" default:"outbox.events" group:"routing" help:"Topic, or a template over columns: {aggregate_type}, {event_type}, and over the source table: {schema}, {table} (several --table); with --topic-regex also over its groups: $${name}, $${1} or $$1."`
	// TopicRegex is Debezium's route.topic.regex (Kafka Connect's RegexRouter).
	TopicRegex      string `key:"outbox.topic_regex" field:"TopicRegex" group:"routing" help:"Regular expression (Go's RE2) matched against the whole of --topic-regex-field of each event: when it matches, the topic is --topic rendered with its groups; when not, the topic is that value itself (as Debezium's route.topic.regex)." placeholder:"REGEX"`
	TopicRegexField string `key:"outbox.topic_regex_field" default:"aggregate_type" group:"routing" enum:"aggregate_type,event_type" help:"The value --topic-regex is matched against: aggregate_type or event_type."`

	KafkaSecurityFlags `embed:"" group:"kafka"` // --kafka-tls*, --kafka-sasl-*: kafkasec.go
}

// topicRegex is --topic-regex and --topic-regex-field.
func (f *KafkaFlags) topicRegex() route.Regex {
	return route.Regex{Pattern: f.TopicRegex, Field: f.TopicRegexField, Names: runNames}
}

// validateTopic checks --topic-regex, then --topic with it.
func (f *KafkaFlags) validateTopic() error {
	if f.TopicRegex != "" {
		if err := route.CheckRegex(f.TopicRegex); err != nil {
			return flagError("topic-regex", err.Error())
		}
	}
	if _, err := route.NewWithRegex(f.Topic, f.topicRegex()); err != nil {
		return flagError("topic", err.Error())
	}
	return nil
}

// kafkaBrokerFlags is --kafka-brokers, apart from KafkaFlags for dlq replay,
// which has no --topic (a dead letter goes back to the topic stored with it).
type kafkaBrokerFlags struct {
	KafkaBrokers []string `key:"kafka.brokers" field:"Sink.Brokers" name:"kafka-brokers" sep:"," help:"Required${kafka_brokers_note=}. Kafka bootstrap brokers, comma-separated host:port." placeholder:"HOST:PORT"`
}

// outboxColumnFlags are the outbox's column names, as the relay decodes them
// (run) and replay reads them.
type outboxColumnFlags struct {
	ColumnID            string `key:"outbox.columns.id" field:"Decoder.Columns.ID" default:"id" help:"Outbox column holding the event id (header 'id')."`
	ColumnAggregateType string `key:"outbox.columns.aggregate_type" field:"Decoder.Columns.AggregateType" default:"aggregate_type" help:"Outbox column holding the aggregate type."`
	ColumnAggregateID   string `key:"outbox.columns.aggregate_id" field:"Decoder.Columns.AggregateID" default:"aggregate_id" help:"Outbox column holding the aggregate id (the Kafka key)."`
	ColumnEventType     string `key:"outbox.columns.event_type" field:"Decoder.Columns.EventType" default:"event_type" help:"Outbox column holding the event type; empty when the table has none (a Debezium outbox table may not): the event_type header is then empty and the topic cannot route by it."`
	ColumnPayload       string `key:"outbox.columns.payload" field:"Decoder.Columns.Payload" default:"payload" help:"Outbox column holding the payload (the Kafka value)."`
}

func (f *outboxColumnFlags) columns() decoder.Columns {
	return decoder.Columns{
		ID: f.ColumnID, AggregateType: f.ColumnAggregateType, AggregateID: f.ColumnAggregateID,
		EventType: f.ColumnEventType, Payload: f.ColumnPayload,
	}
}

// createdAtFlag is the outbox's insert-time column (run's backfill, replay's
// time filters, prune).
type createdAtFlag struct {
	ColumnCreatedAt string `key:"outbox.columns.created_at" default:"created_at" help:"Outbox column holding the insert time${created_at_note=}."`
}

// headerColumnFlags map extra outbox columns to Kafka headers (run, replay).
type headerColumnFlags struct {
	HeaderColumns []string `key:"outbox.header_columns" field:"Decoder.HeaderColumns" sep:"," help:"Extra outbox columns sent as Kafka headers: column or column=header, comma-separated." placeholder:"COL[=HEADER]"`
}

// headerColumns parses --header-columns (decoder.ParseHeaderColumns).
func (f *headerColumnFlags) headerColumns() (map[string]string, error) {
	return decoder.ParseHeaderColumns(f.HeaderColumns, runNames.Within("Decoder"))
}

// payloadFormatFlags say what the relay derives from the payload column's type
// and the tracing column (run, replay; see docs/kafka.md#formats).
type payloadFormatFlags struct {
	ContentType   string `key:"outbox.content_type" field:"Decoder.ContentType" default:"auto" help:"Header content-type of every message: auto (application/json for a json or jsonb payload column, none for bytea and text), none, or a MIME type such as application/vnd.apache.avro+binary." placeholder:"auto|none|MIME"`
	ColumnTracing string `key:"outbox.columns.tracing" field:"Decoder.TracingColumn" default:"tracingspancontext" help:"Outbox column holding a trace context (a W3C traceparent, or Debezium's traceparent=/tracestate= properties text), sent as headers traceparent and tracestate; a table without it is fine (empty: never)." placeholder:"COLUMN"`
	// ColumnTimestamp is Debezium's table.field.event.timestamp.
	// EnvelopeColumns is Debezium's table.fields.additional.placement col:envelope:alias.
	EnvelopeColumns []string `key:"outbox.envelope_columns" field:"Decoder.EnvelopeColumns" help:"Wrap the value in a JSON object {\"payload\": <the payload: itself for json/jsonb, else a JSON string (bytea: base64)>, \"<alias>\": \"<column text>\", …} with these columns (column or column=alias; NULL is null), as Debezium's envelope placement with schemas.enable=false. Not with --tombstone-on-empty-payload." placeholder:"COLUMN[=ALIAS],…"`
	// ColumnPartition is Debezium's table.fields.additional.placement col:partition.
	ColumnPartition string `key:"outbox.columns.partition" field:"Decoder.PartitionColumn" help:"Outbox integer column naming each event's Kafka partition (NULL: by key, as without it); a partition the topic lacks fails the event (invalid_partition, see --on-error). Ordering per key is then yours to keep: give a key's events one partition." placeholder:"COLUMN"`
	ColumnTimestamp string `key:"outbox.columns.timestamp" field:"Decoder.TimestampColumn" help:"Outbox column whose value is the Kafka record timestamp: timestamptz or timestamp (UTC) to the millisecond, or bigint Unix milliseconds; NULL (or empty flag: always) means the time the relay sends the record." placeholder:"COLUMN"`
	// The JSON encodings are Kafka Connect's JsonConverter (key.converter,
	// value.converter and their schemas.enable) and the Event Router's
	// table.expand.json.payload, table.json.payload.null.behavior,
	// table.json.payload.empty.array.behavior and
	// table.field.event.schema.version.
	KeyEncoding         string `key:"outbox.key_encoding" field:"Decoder.JSON" default:"raw" enum:"raw,json,json-with-schema" help:"Record key: raw (the aggregate id column's bytes), json (as Kafka Connect's JsonConverter with schemas.enable=false: a JSON string for a text key), or json-with-schema ({\"schema\": …, \"payload\": …}, schemas.enable=true)."`
	ValueEncoding       string `key:"outbox.value_encoding" field:"Decoder.JSON" default:"raw" enum:"raw,json,json-with-schema" help:"Record value: raw (the payload column's bytes, or the envelope of --envelope-columns), json or json-with-schema: as Debezium's Outbox Event Router through JsonConverter writes it (a json/jsonb payload is then a JSON string unless --expand-json-payload; envelope columns typed as Debezium types them)."`
	ExpandJSONPayload   bool   `key:"format.expand_json_payload" name:"expand-json-payload" help:"With --value-encoding json or json-with-schema: write a JSON object payload as the JSON it holds, with an inferred schema (Debezium's table.expand.json.payload); one it cannot type stays a string."`
	JSONNullFields      string `key:"format.json_null_fields" name:"json-null-fields" default:"ignore" enum:"ignore,optional-bytes" help:"Null members of an expanded payload: ignore (left out of the schema and the value) or optional-bytes (kept, typed optional bytes)."`
	JSONEmptyArrays     string `key:"format.json_empty_arrays" name:"json-empty-arrays" default:"ignore" enum:"ignore,optional-string" help:"Empty arrays of an expanded payload: ignore (left out) or optional-string (kept, typed arrays of optional strings)."`
	JSONSchemaName      string `key:"format.json_schema_name" name:"json-schema-name" help:"With --value-encoding json-with-schema and --envelope-columns: the envelope schema is named <NAME>.<routed-by value>.Value (default: <schema>.<table> of the outbox; Debezium's is <topic.prefix>.<schema>.<table>)." placeholder:"NAME"`
	ColumnSchemaVersion string `key:"outbox.columns.schema_version" field:"Decoder.SchemaVersionColumn" help:"Integer outbox column holding the envelope schema's version (--value-encoding json-with-schema with --envelope-columns only)." placeholder:"COLUMN"`
}

// jsonOptions returns the JSON encoding of these flags for an outbox table
// and topic template.
func (f *payloadFormatFlags) jsonOptions(table, topic string, tombstones bool) (connectjson.Options, error) {
	var o connectjson.Options
	var err error
	if o.Key, err = connectjson.ParseEncoding(f.KeyEncoding); err != nil {
		return o, flagError("key-encoding", err.Error())
	}
	if o.Value, err = connectjson.ParseEncoding(f.ValueEncoding); err != nil {
		return o, flagError("value-encoding", err.Error())
	}
	o.ExpandPayload = f.ExpandJSONPayload
	o.NullFieldsAsBytes = f.JSONNullFields == "optional-bytes"
	o.EmptyArraysAsStrings = f.JSONEmptyArrays == "optional-string"
	o.Tombstones = tombstones && o.Value != connectjson.Raw
	o.SchemaName = f.JSONSchemaName
	if o.SchemaName == "" {
		o.SchemaName = table
		if !strings.Contains(table, ".") {
			o.SchemaName = "public." + table
		}
	}
	if err := o.Check(); err != nil {
		switch {
		case o.ExpandPayload && o.Value == connectjson.Raw:
			return o, flagError("expand-json-payload", "needs --value-encoding json or json-with-schema (a raw json/jsonb payload is already the JSON)")
		default:
			return o, flagError("json-null-fields", "--json-null-fields and --json-empty-arrays apply to --expand-json-payload only")
		}
	}
	if f.ColumnSchemaVersion != "" && (o.Value != connectjson.JSONWithSchema || len(f.EnvelopeColumns) == 0) {
		return o, flagError("column-schema-version", "needs --value-encoding json-with-schema and --envelope-columns: only the envelope's schema has a version")
	}
	return o, nil
}

// routeByEventType reports whether the topic routes by the event type
// alone, so that the envelope schema is named after it (Debezium's
// route.by.field=type): a --topic-regex over the event type, or a template
// naming {event_type} and not {aggregate_type}.
func routeByEventType(topic string, re route.Regex) bool {
	if re.Pattern != "" {
		return re.Field == route.FieldEventType
	}
	return strings.Contains(topic, "{event_type}") && !strings.Contains(topic, "{aggregate_type}")
}

func (f *payloadFormatFlags) validate() error {
	if err := decoder.CheckContentType(f.ContentType); err != nil {
		return flagError("content-type", err.Error())
	}
	if _, err := f.envelope(); err != nil {
		return err
	}
	return nil
}

// envelope parses --envelope-columns (decoder.ParseEnvelopeColumns).
func (f *payloadFormatFlags) envelope() ([]decoder.EnvelopeColumn, error) {
	return decoder.ParseEnvelopeColumns(f.EnvelopeColumns, runNames.Within("Decoder"))
}

// formatFlags choose the record format (run, replay, dlq replay).
type formatFlags struct {
	Format            string `key:"format.kind" default:"native" enum:"native,cloudevents" help:"Record format: native (headers id, event_type, …), or cloudevents: also a CloudEvent of the Kafka protocol binding, in --cloudevents-mode (binary: ce_specversion, ce_id, ce_source, ce_type, ce_time headers, content-type from --content-type, the value unchanged)."`
	CloudEventsMode   string `key:"format.cloudevents_mode" name:"cloudevents-mode" default:"binary" enum:"binary,structured" help:"Content mode of --format cloudevents: binary (attributes as ce_ headers, the value the payload) or structured (the value the whole event as JSON, content-type application/cloudevents+json, the payload its data; the native headers stay)."`
	CloudEventsSource string `key:"format.cloudevents_source" name:"cloudevents-source" help:"CloudEvents source of --format cloudevents (default: /cdc-relay/<database>/<schema.table> of the outbox${cloudevents_source_note=})." placeholder:"URI-REF"`
	// TombstoneOnEmptyPayload is Debezium's route.tombstone.on.empty.payload.
	TombstoneOnEmptyPayload bool `key:"format.tombstone_on_empty_payload" help:"Send a NULL or empty payload as a null value (a Kafka tombstone, which log compaction acts on) instead of an empty value."`
}

// validate checks the flags that need no database: --cloudevents-mode.
func (f *formatFlags) validate() error {
	if f.CloudEventsMode != "structured" {
		return nil
	}
	if f.Format != "cloudevents" {
		return flagError("cloudevents-mode", "structured applies only with --format cloudevents")
	}
	if f.TombstoneOnEmptyPayload {
		return flagError("tombstone-on-empty-payload", "cannot be combined with --cloudevents-mode structured: a structured CloudEvent is always a value, never a tombstone (use --cloudevents-mode binary, where an event without data is one)")
	}
	return nil
}

// recordFormat is what formatFlags set on a sink: the CloudEvents source
// (see ceSource) and mode, and --tombstone-on-empty-payload.
type recordFormat struct {
	ceSource   string
	ceMode     sink.CloudEventsMode
	tombstones bool
}

// recordFormat checks the flags and returns the record format of a command
// publishing the outbox table of pgURL (table "" when the command has none;
// see ceSource).
func (f *formatFlags) recordFormat(pgURL, table string) (recordFormat, error) {
	if err := f.validate(); err != nil {
		return recordFormat{}, err
	}
	src, err := f.ceSource(pgURL, table)
	if err != nil {
		return recordFormat{}, err
	}
	rf := recordFormat{ceSource: src, tombstones: f.TombstoneOnEmptyPayload}
	if f.CloudEventsMode == "structured" {
		rf.ceMode = sink.CloudEventsStructured
	}
	return rf, nil
}

// apply sets the format on c.
func (rf recordFormat) apply(c *sink.Config) {
	c.CloudEventsSource = rf.ceSource
	c.CloudEventsMode = rf.ceMode
	c.TombstoneOnEmptyPayload = rf.tombstones
}

// ceSource returns the sink's CloudEventsSource: "" unless --format
// cloudevents, else --cloudevents-source or the default naming the database
// of pgURL and the outbox table (table "" when the command has none).
func (f *formatFlags) ceSource(pgURL, table string) (string, error) {
	if f.Format != "cloudevents" {
		if f.CloudEventsSource != "" {
			return "", flagError("cloudevents-source", "applies only with --format cloudevents")
		}
		return "", nil
	}
	if f.CloudEventsSource != "" {
		if strings.ContainsAny(f.CloudEventsSource, " \t\n") {
			return "", flagError("cloudevents-source", fmt.Sprintf("%q is not a URI reference (no spaces)", f.CloudEventsSource))
		}
		return f.CloudEventsSource, nil
	}
	if table == "" {
		return "", flagError("cloudevents-source", "is required with --format cloudevents here: give the ce_source the relay used, e.g. /cdc-relay/app/public.outbox_events")
	}
	cfg, err := pgconn.ParseConfig(pgURL)
	if err != nil || cfg.Database == "" {
		return "", flagError("cloudevents-source", "cannot be derived: no database name in --pg-url; set it")
	}
	schema, tbl, err := splitTable(table)
	if err != nil {
		return "", err
	}
	return "/cdc-relay/" + url.PathEscape(cfg.Database) + "/" + url.PathEscape(schema+"."+tbl), nil
}

// checkpointTableFlag names the checkpoint table (run, status).
type checkpointTableFlag struct {
	CheckpointTable string `key:"delivery.checkpoint.table" default:"public.cdc_relay_checkpoints" help:"Checkpoint table${checkpoint_table_note=}."`
}

// dlqStoreFlags name the dead-letter table (every command that reads or writes
// it; only the dlq commands and replay validate it).
type dlqStoreFlags struct {
	DLQTable string `key:"dead_letters.table" field:"DeadLetterStore" name:"dlq-table" default:"public.cdc_relay_dead_letters" help:"Dead-letter table${dlq_table_note=, schema-qualified (its history: <table>_replays, <table>_replay_events)}."`
}

func (f *dlqStoreFlags) validate() error {
	if _, _, err := splitTable(f.DLQTable); err != nil {
		return flagError("dlq-table", err.Error())
	}
	return nil
}

// withStore connects, brings tables of an older version up to date (creating
// none), runs fn with the dead-letter store, and closes the connection.
func withStore(ctx context.Context, url, table string, fn func(*deadletter.Store) error) error {
	pool, err := connect(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	s := deadletter.NewStore(pool, table)
	if err := s.Upgrade(ctx); err != nil {
		return err
	}
	return fn(s)
}

// letterFilterFlags select dead letters.
type letterFilterFlags struct {
	ErrorCode     string   `help:"Only letters with this error code, e.g. message_too_large." placeholder:"CODE"`
	Since         string   `help:"Only letters that last failed at or after this time: RFC 3339 (2024-05-01T10:00:00Z), a date (2024-05-01, UTC) or a duration ago (30m, 2h, 7d)." placeholder:"TIME"`
	Until         string   `help:"Only letters that last failed before this time (same forms as --since)." placeholder:"TIME"`
	AggregateID   string   `help:"Only letters of this aggregate id." placeholder:"ID"`
	AggregateType string   `help:"Only letters of this aggregate type." placeholder:"TYPE"`
	EventType     string   `help:"Only letters of this event type." placeholder:"TYPE"`
	EventID       []string `name:"event-id" help:"Only the letters of these event ids, as the relay logs them (event_id; repeat the flag or separate with commas)." placeholder:"ID"`
	Status        string   `help:"Only letters with this status: pending, processing, retry_wait, completed (replayed is the same) or dead." placeholder:"STATUS"`
	SourceTable   string   `name:"source-table" help:"Only letters of events from this outbox table (schema.table, as dlq show prints it; with several --table behind one relay)." placeholder:"SCHEMA.TABLE"`

	filter deadletter.Filter `kong:"-"`
}

// parse checks the filter flags and builds the filter.
func (f *letterFilterFlags) parse(now time.Time) error {
	since, err := parseTime(f.Since, now)
	if err != nil {
		return flagError("since", err.Error())
	}
	until, err := parseTime(f.Until, now)
	if err != nil {
		return flagError("until", err.Error())
	}
	if !since.IsZero() && !until.IsZero() && !until.After(since) {
		return flagError("until", fmt.Sprintf("is %s, not after --since (%s)", until.Format(time.RFC3339), since.Format(time.RFC3339)))
	}
	if err := checkStatusFlag(f.Status); err != nil {
		return err
	}
	var events []string
	for _, e := range f.EventID {
		if e = strings.TrimSpace(e); e != "" {
			events = append(events, e)
		}
	}
	f.filter = deadletter.Filter{
		EventIDs: events, ErrorCode: f.ErrorCode, AggregateID: f.AggregateID, AggregateType: f.AggregateType,
		EventType: f.EventType, Status: f.Status, Since: since, Until: until, SourceTable: f.SourceTable,
	}
	return nil
}

// checkStatusFlag checks a --status value.
func checkStatusFlag(status string) error {
	if deadletter.CheckStatus(status) != nil {
		return flagError("status", fmt.Sprintf("is %q: use %s (replayed, its former name, is completed)",
			status, strings.Join(deadletter.Statuses, ", ")))
	}
	return nil
}

// publishFlags pace a replay and say who runs it.
type publishFlags struct {
	DryRun         bool    `help:"Publish nothing: show and record what would be published."`
	Rate           float64 `default:"50" help:"Most events published per second (0: unlimited)."`
	BatchSize      int     `default:"100" help:"Events published at once (and the rate limiter's burst)."`
	Actor          string  `help:"Who runs the replay, for the history (default: the OS user)."`
	kafkaStartFlag `embed:""`
}

// kafkaStartFlag bounds the wait for Kafka (run, replay, dlq replay).
type kafkaStartFlag struct {
	KafkaStartTimeout time.Duration `key:"kafka.start_timeout" check:"positive" example:"500ms or 10s" default:"${default_kafka_start_timeout}" group:"kafka" help:"How long to wait for Kafka, and for a topic not used yet, before giving up."`
}

func (f *publishFlags) validate() error {
	if f.Rate < 0 {
		return flagError("rate", "must be 0 (unlimited) or a positive number of events per second")
	}
	if f.BatchSize < 1 {
		return flagError("batch-size", "must be at least 1")
	}
	if err := config.Check(&f.kafkaStartFlag, flagError); err != nil {
		return err
	}
	return nil
}

// checkKafka checks the brokers and the TLS/SASL flags a replay publishes
// with; a dry run needs neither.
func (f *publishFlags) checkKafka(brokers *[]string, sec *KafkaSecurityFlags) error {
	if f.DryRun {
		return nil
	}
	list, err := kafkaconn.ParseBrokers(*brokers, runNames.Within("Sink"))
	if errors.Is(err, kafkaconn.ErrNoBrokers) {
		return fmt.Errorf("%w, or use --dry-run", err)
	}
	if err != nil {
		return err
	}
	*brokers = list
	return sec.resolveKafkaSecurity()
}

// actor is --actor, or the OS user running the command.
func (f *publishFlags) actor() string {
	if f.Actor != "" {
		return f.Actor
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "unknown"
}

// publisher connects to Kafka for a replay, or returns nil for a dry run.
func (f *publishFlags) publisher(ctx context.Context, brokers []string, sec *KafkaSecurityFlags, rf recordFormat, stderr io.Writer) (*sink.Publisher, error) {
	if f.DryRun {
		return nil, nil
	}
	conn, err := sec.kafkaConn()
	if err != nil {
		return nil, err
	}
	transport := conn.Transport()
	log := NewLogger(stderr, "warn", "auto")
	conn.Log(log)
	octx, cancel := context.WithTimeout(ctx, f.KafkaStartTimeout)
	defer cancel()
	cfg := sink.Config{Brokers: brokers, Logger: log, Transport: transport, Names: runNames.Within("Sink"), DecoderNames: runNames.Within("Decoder")}
	rf.apply(&cfg)
	p, err := sink.NewPublisher(octx, cfg)
	if err != nil {
		return nil, conn.Explain(err)
	}
	p.TopicWait = f.KafkaStartTimeout
	return p, nil
}

// replayPublisher is publisher as the replay.Publisher a replay takes:
// nil for a dry run (not a nil *sink.Publisher, which is no nil interface),
// and done, which closes it.
func (f *publishFlags) replayPublisher(ctx context.Context, brokers []string, sec *KafkaSecurityFlags, rf recordFormat, stderr io.Writer) (pub replay.Publisher, done func(), err error) {
	p, err := f.publisher(ctx, brokers, sec, rf, stderr)
	if err != nil || p == nil {
		return nil, func() {}, err
	}
	return p, func() { p.Close() }, nil
}

// splitTable splits --table and the other table flags into schema and table.
func splitTable(t string) (schema, table string, err error) {
	parts := strings.Split(t, ".")
	switch {
	case len(parts) == 1 && parts[0] != "":
		return "public", parts[0], nil
	case len(parts) == 2 && parts[0] != "" && parts[1] != "":
		return parts[0], parts[1], nil
	}
	return "", "", fmt.Errorf("%q is not a table name: use schema.table, e.g. public.outbox_events", t)
}

// timeHelp describes the forms parseTime accepts, for flag help.
const timeHelp = "RFC 3339 (2024-05-01T10:00:00Z), a date (2024-05-01, UTC) or a duration ago (30m, 2h, 7d)"

// parseAge parses an age such as 7d, 1d12h, 36h or 30m: a whole or decimal number
// of days, optionally followed by what time.ParseDuration accepts, or only the
// latter. time.ParseDuration has no day unit (a calendar day is not always 24
// hours), but retention is said in days; here a day is 24 hours. A trailing
// " ago" is allowed. The age must be positive.
func parseAge(s string) (time.Duration, error) {
	in := s
	bad := fmt.Errorf("is %q, not an age: use e.g. 7d, 1d12h, 36h or 30m", in)
	s = strings.TrimSuffix(strings.TrimSpace(s), " ago")
	if strings.ContainsAny(s, "+-") {
		return 0, bad // an age is positive, and so is each of its parts
	}
	var d time.Duration
	if days, rest, ok := strings.Cut(s, "d"); ok {
		if !decimal.MatchString(days) {
			return 0, bad
		}
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || n > 100000 {
			return 0, bad
		}
		d = time.Duration(n * float64(24*time.Hour))
		s = rest
	}
	if s != "" || d == 0 {
		rest, err := time.ParseDuration(s)
		if err != nil {
			return 0, bad
		}
		d += rest
	}
	if d <= 0 {
		return 0, fmt.Errorf("is %q: an age must be positive, e.g. 7d, 1d12h, 36h or 30m", in)
	}
	return d, nil
}

var decimal = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// parseTime parses a time flag: RFC 3339, a date (midnight UTC), or an age
// before now (see parseAge). "" is the zero time (no bound).
func parseTime(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	age, err := parseAge(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("is %q, not a time: use %s", s, timeHelp)
	}
	return now.Add(-age), nil
}
