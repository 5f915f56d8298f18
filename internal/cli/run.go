package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/config"
	"github.com/cdc-relay/cdc-relay/internal/connectjson"
	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/kafkaconn"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/tracing"
)

// RunCmd is "cdc-relay run".
type RunCmd struct {
	// Each flag is in one help group (help.go), and the groups appear in the
	// order of their first flag here: Postgres, Kafka, routing and format,
	// delivery and failures, operations.
	PGFlags      `embed:"" group:"postgres" set:"table_default=" kong:"set='table_note= (default public.outbox_events; none with --messages-prefix alone). Repeat it, or separate with commas, for several behind one slot; an entry of the tables: list of the --config file may override the outbox settings of one table ({name: s.t, topic: …})'"`
	messagesFlag `embed:"" group:"postgres"`
	KafkaFlags   `embed:""` // its --topic flags are in group routing

	PrimaryPGURL      string `key:"source.primary_pg_url" field:"PrimaryPool" group:"postgres" name:"primary-pg-url" placeholder:"URL" help:"When --pg-url names a hot standby (PostgreSQL 16+, which decodes there): the primary's URL. The slot, the stream and the decoding stay on the standby; the checkpoint table, dead letters, heartbeats and the publication are written on the primary, which is also asked for the running-transactions record that creating a slot on a standby waits for. Required with a standby --pg-url; unused with a primary."`
	CreateSlot        bool   `key:"source.create_slot" field:"CreateSlot" default:"true" negatable:"" group:"postgres" help:"Create the slot when it is missing (--no-create-slot or --create-slot=false for locked-down databases)."`
	CreatePublication bool   `key:"source.create_publication" field:"CreatePublication" default:"true" negatable:"" group:"postgres" help:"Create the publication when it is missing."`
	SlotFailover      string `key:"source.slot_failover" field:"SlotFailover" default:"auto" enum:"auto,on,off" group:"postgres" help:"Make the slot a failover slot (PostgreSQL 17+), which standbys with sync_replication_slots = on keep a copy of, so the relay follows a promotion (with a multi-host --pg-url and target_session_attrs=read-write): auto where the server supports it, on (refuse to start below 17), off. An existing slot without it is switched on; docs/postgres.md#failover says what else a failover needs."`

	outboxColumnFlags  `embed:"" group:"postgres"`
	createdAtFlag      `embed:"" group:"postgres" set:"created_at_note= (for --on-slot-loss=backfill, --snapshot initial and the outbox wait time; a table without it measures the wait from the commit)"`
	headerColumnFlags  `embed:"" group:"routing"`
	formatFlags        `embed:"" group:"routing"`
	payloadFormatFlags `embed:"" group:"routing"` // --content-type, --column-tracing

	Delivery       string `key:"delivery.mode" field:"Delivery" group:"delivery" default:"${default_delivery}" enum:"effectively-once,at-least-once" help:"effectively-once: produce idempotently, stamp each message with its source position, store Kafka offsets with each checkpoint and, after a crash or restart, skip replayed events already in Kafka (docs/guarantee.md says when it degrades to at-least-once); at-least-once: send everything the slot replays again."`
	OnOutboxUpdate string `key:"delivery.on_outbox_update" field:"OnOutboxUpdate" group:"delivery" default:"ignore" enum:"ignore,warn,error,fatal" help:"What an UPDATE of an outbox row does (nothing is published for it; DELETEs are always ignored): ignore; warn or error log it (at most 10 lines a minute) at that level and count it in cdc_relay_outbox_updates_total; fatal stops the relay before confirming its transaction."`
	OnError        string `key:"outbox.on_error" field:"DeadLetter=dlq" group:"delivery" default:"dlq" enum:"dlq,halt" help:"What to do with an event that fails permanently (too large, invalid topic, no key): dlq stores it in the dead-letter table and goes on; halt stops without confirming past it."`
	dlqStoreFlags  `embed:"" group:"delivery" set:"dlq_table_note= (on-error=dlq)"`
	DLQRetention   time.Duration `key:"dead_letters.retention" check:"zero=keep" example:"168h" group:"delivery" name:"dlq-retention" default:"0s" help:"Delete dead letters whose last failure (and last replay) is older than this, checked every 10 minutes (0 keeps them; see also cdc-relay dlq purge)."`

	DLQAutoRetry         bool          `key:"dead_letters.auto_retry.enabled" group:"delivery" name:"dlq-auto-retry" help:"Retry dead letters whose error may pass (--dlq-auto-retry-codes) in the background, with backoff, until Kafka acknowledges them (completed) or --dlq-auto-retry-budget attempts failed (dead: metric cdc_relay_dead_letters_dead_total, alert CdcRelayDeadLetterDead). Needs --on-error=dlq."`
	DLQAutoRetryCodes    []string      `key:"dead_letters.auto_retry.codes" group:"delivery" name:"dlq-auto-retry-codes" sep:"," default:"${default_dlq_auto_retry_codes}" help:"Error codes the automatic retries take (docs/dead-letters.md says why these)." placeholder:"CODE,…"`
	DLQAutoRetryBudget   int           `key:"dead_letters.auto_retry.budget" group:"delivery" name:"dlq-auto-retry-budget" default:"${default_dlq_auto_retry_budget}" help:"Attempts after which an automatically retried letter is dead."`
	DLQAutoRetryMaxAge   time.Duration `key:"dead_letters.auto_retry.max_age" group:"delivery" name:"dlq-auto-retry-max-age" default:"0s" help:"A letter that first failed longer ago than this is dead at its next failed attempt, whatever the budget (0: no age limit)."`
	DLQAutoRetryBase     time.Duration `key:"dead_letters.auto_retry.base" group:"delivery" name:"dlq-auto-retry-base" default:"${default_dlq_auto_retry_base}" help:"Wait before a new dead letter's first automatic attempt; after the n-th failed one it waits rand(0, min(cap, base*2^(n-1)))."`
	DLQAutoRetryCap      time.Duration `key:"dead_letters.auto_retry.cap" group:"delivery" name:"dlq-auto-retry-cap" default:"${default_dlq_auto_retry_cap}" help:"Longest wait between automatic attempts."`
	DLQAutoRetryInterval time.Duration `key:"dead_letters.auto_retry.interval" group:"delivery" name:"dlq-auto-retry-interval" default:"${default_dlq_auto_retry_interval}" help:"How often the automatic retries look for letters that are due."`
	DLQAutoRetryTimeout  time.Duration `key:"dead_letters.auto_retry.timeout" group:"delivery" name:"dlq-auto-retry-timeout" default:"${default_dlq_auto_retry_timeout}" help:"An automatic attempt Kafka has not acknowledged within this counts as failed."`

	OnSlotLoss     string        `key:"delivery.on_slot_loss" field:"Backfill=backfill" group:"delivery" default:"fail" enum:"fail,backfill" help:"When the slot was dropped, lost its WAL (wal_status 'lost') or moved past the stored checkpoint: fail refuses to start and explains how to recover; backfill recreates the slot and republishes the outbox rows still in the table created since the checkpoint's commit time less --backfill-margin, with header cdc_relay_backfill (duplicates possible, nothing lost that is still in the table)."`
	BackfillMargin time.Duration `key:"delivery.backfill_margin" group:"delivery" default:"${default_backfill_margin}" help:"How far before the stored commit time a backfill starts (covers transactions that inserted rows before they committed, and clock differences)."`

	Snapshot string `key:"delivery.snapshot" field:"Snapshot=initial" group:"delivery" default:"never" enum:"initial,never" help:"initial: when the relay creates its slot, publish the rows already in the outbox table (read from the snapshot the slot exports, in --column-created-at order, one transaction's rows as it inserted them, with header cdc_relay_snapshot: initial) before streaming, so none is missed or sent twice at the seam; an existing slot takes no snapshot. never: stream only what commits after the slot is created."`

	Join string `key:"delivery.join" field:"JoinMode" group:"delivery" default:"all" enum:"all,after-checkpoint,none" help:"What the relay publishes when it adds an outbox table to the publication of an existing slot (the table was added to --table since): Postgres never streams the rows committed into it before, so the relay publishes them itself (header cdc_relay_snapshot: join) before streaming, read without a lock from the snapshot taken with the change. all: every row the table holds. after-checkpoint: only rows whose transaction committed at or after the stored checkpoint's commit time, and those whose commit time is unknown (needs track_commit_timestamp = on). none: no row; a warning counts them and says how to replay them."`

	CheckpointStore     string `key:"delivery.checkpoint.store" field:"Checkpoints" group:"delivery" default:"table" enum:"table,file" help:"Where the checkpoint is persisted: table (in the source database) or file."`
	checkpointTableFlag `embed:"" group:"delivery" set:"checkpoint_table_note= (checkpoint-store=table)"`
	CheckpointFile      string `key:"delivery.checkpoint.file" group:"delivery" default:"cdc-relay-checkpoint.json" help:"Checkpoint file (checkpoint-store=file)."`

	MaxInFlightMiB      int           `key:"delivery.max_in_flight_mib" check:"min=1" group:"operations" name:"max-in-flight-mib" default:"${default_max_in_flight_mib}" help:"Events read but not yet acknowledged by Kafka, in MiB of the memory they take (their values twice, as decoded and as encoded for Kafka, and their bookkeeping); reading pauses at this bound. The Go soft memory limit is set to twice this plus 12 MiB unless GOMEMLIMIT is set."`
	BatchMaxEvents      int           `key:"kafka.batch_max_events" check:"min=1" group:"kafka" default:"${default_batch_max_events}" help:"Most events in one produce request."`
	BatchMaxBytes       int           `key:"kafka.batch_max_bytes" check:"min=1024" group:"kafka" default:"${default_batch_max_bytes}" help:"Most bytes in one produce request (keep below the broker's message.max.bytes)."`
	MaxInFlightRequests int           `key:"kafka.max_in_flight_requests" field:"Sink.MaxInFlight" group:"kafka" name:"max-in-flight-requests" default:"${default_max_in_flight_requests}" help:"Produce requests in flight per broker, written back to back on one connection, and batches in flight per partition (1 to 5). With the idempotent producer (--delivery effectively-once) Kafka appends a partition's batches only in order, so a retry never lets a later event overtake an earlier one; without idempotence one request at a time is sent, whatever this says."`
	Compression         string        `key:"kafka.compression" group:"kafka" default:"none" enum:"none,gzip,snappy,lz4,zstd" help:"Produce compression."`
	StatusInterval      time.Duration `key:"source.status_interval" check:"positive" example:"500ms or 10s" group:"postgres" default:"${default_status_interval}" help:"How often the checkpointed position is confirmed to the slot (the checkpoint itself is persisted within 100ms of Kafka's acknowledgements)."`
	ReadCoalesce        time.Duration `key:"source.read_coalesce" check:"zero=wake for every message" example:"500us" group:"postgres" default:"${default_read_coalesce}" help:"Over TCP, how long a read of the replication stream may wait for more bytes before it wakes the relay: the kernel wakes it once a chunk sized from the recent byte rate has arrived (SO_RCVLOWAT), instead of for every message Postgres sends. Adds at most about this much latency; saves most of the relay's and much of the walsender's CPU at one event per transaction. 0 wakes for every message."`
	ReadBufferKiB       int           `key:"source.read_buffer_kib" check:"zero=the kernel's" example:"a size in KiB such as 32" group:"postgres" name:"read-buffer-kib" default:"${default_read_buffer_kib}" help:"Over TCP, the replication connection's receive buffer (SO_RCVBUF) in KiB. A small one (32), measured beside Postgres: one-event transactions cost the walsender less CPU per event and drain faster, but 10-event ones drain slower; it also bounds the stream to this much per network round trip (32 KiB per 1 ms is 32 MB/s). 0, the default, leaves it to the kernel."`
	CatchUpThresholdMiB int           `key:"source.catch_up_threshold_mib" field:"CatchUpThreshold" check:"zero=off" example:"64" group:"postgres" name:"catch-up-threshold-mib" default:"${default_catch_up_threshold_mib}" help:"When the slot is this many MiB of WAL behind (after a restart, an outage, a burst), read the backlog in batches through pg_logical_slot_peek_binary_changes, at Postgres' decode speed rather than the replication protocol's send speed, and stream once caught up. Each batch is acknowledged by Kafka and checkpointed before the slot is advanced past it. 0 always streams."`
	CatchUpBatch        int           `key:"source.catch_up_batch" field:"CatchUpBatch" check:"min=1" group:"postgres" name:"catch-up-batch" default:"${default_catch_up_batch}" help:"pgoutput messages one catch-up batch asks Postgres for (three per one-event transaction); Postgres returns whole transactions, decoded into its memory and spilled to disk past work_mem."`
	ShutdownTimeout     time.Duration `key:"operations.shutdown_timeout" field:"ShutdownTimeout" check:"positive" example:"500ms or 10s" group:"operations" default:"${default_shutdown_timeout}" help:"Bound on a clean stop (finish transaction, flush, confirm)."`
	kafkaStartFlag      `embed:""`
	RequestTimeout      time.Duration `key:"kafka.request_timeout" check:"positive" example:"500ms or 10s" group:"kafka" name:"request-timeout" default:"${default_request_timeout}" help:"How long a produce request may take, being written and answered, before it fails and is retried (as Kafka's request.timeout.ms): a broker that stops reading or answering is noticed after this."`
	RetryBase           time.Duration `key:"delivery.retry.base" check:"positive" example:"500ms or 10s" group:"delivery" default:"${default_retry_base}" help:"Backoff base: retry n waits rand(0, min(cap, base*2^n))."`
	RetryCap            time.Duration `key:"delivery.retry.cap" check:"positive" example:"500ms or 10s" group:"delivery" default:"${default_retry_cap}" help:"Backoff cap."`
	RelayName           string        `key:"operations.relay_name" group:"operations" help:"Name of this relay in checkpoints and logs (default: host name)."`
	HeartbeatInterval   time.Duration `key:"source.heartbeat_interval" check:"zero=off" example:"1m" group:"postgres" default:"0s" help:"Write a logical decoding message this often so the slot of an idle database keeps moving while others write WAL (0 disables)."`
	MonitorInterval     time.Duration `key:"operations.monitor_interval" check:"positive" example:"10s" group:"operations" default:"${default_monitor_interval}" help:"How often the slot's wal_status and retained WAL are read into metrics."`

	AdminFlags `embed:"" group:"operations"` // --metrics-addr, --metrics-token…: admin_flags.go

	LogLevel  string `key:"operations.log_level" group:"operations" default:"info" enum:"debug,info,warn,error" help:"Log level."`
	LogFormat string `key:"operations.log_format" group:"operations" default:"auto" enum:"auto,json,console" help:"Log format: auto is console on a terminal, JSON otherwise."`

	OtelExporter string `key:"operations.otel_exporter" group:"operations" name:"otel-exporter" default:"none" enum:"none,otlp" help:"none: the trace context of --column-tracing goes out as the row has it; otlp: also export one PRODUCER span per event that has one, as its child, over OTLP/HTTP with protobuf (OTEL_EXPORTER_OTLP_ENDPOINT, default http://localhost:4318, _HEADERS, … and OTEL_SERVICE_NAME, default cdc-relay), and send the relay's span as the traceparent header, so the consumer's span is the relay's child."`

	// tableEntries are the configuration file's table entries (BeforeApply),
	// configPath the file's path: per-table overrides (tables.go).
	tableEntries []config.TableEntry `kong:"-"`
	configPath   string              `kong:"-"`
}

// Validate checks the run flags and returns an error naming the flag and its
// environment variable.
func (r *RunCmd) Validate() error {
	if err := requirePG(&r.PGFlags); err != nil {
		return err
	}
	brokers, err := kafkaconn.ParseBrokers(r.KafkaBrokers, runNames.Within("Sink"))
	if err != nil {
		return err
	}
	r.KafkaBrokers = brokers
	if err := r.resolveKafkaSecurity(); err != nil {
		return err
	}
	if err := r.validateTopic(); err != nil {
		return err
	}
	r.resolveTable(&r.Table)
	if len(r.Table) > 0 {
		if err := checkTables(r.Table); err != nil {
			return err
		}
		if err := r.checkTableOverrides(); err != nil {
			return err
		}
	} else {
		if r.Snapshot == "initial" {
			return flagError("snapshot", "initial reads the outbox table, and with --messages-prefix alone there is none: a message outbox's events exist only in the WAL (docs/message-outbox.md); use --snapshot never, or give --table too")
		}
		if r.OnSlotLoss == "backfill" {
			return flagError("on-slot-loss", "backfill republishes rows still in the outbox table, and with --messages-prefix alone there is none: a message outbox's events exist only in the WAL (docs/message-outbox.md); use --on-slot-loss fail, or give --table too")
		}
	}
	if _, err := r.headerColumns(); err != nil {
		return err
	}
	if err := r.payloadFormatFlags.validate(); err != nil {
		return err
	}
	if r.TombstoneOnEmptyPayload && len(r.EnvelopeColumns) > 0 && r.ValueEncoding == connectjson.NameRaw {
		return flagError("envelope-columns", "cannot be combined with --tombstone-on-empty-payload when --value-encoding is raw: the raw envelope is never empty (with a JSON encoding, a NULL or blank payload is a tombstone, as in Debezium)")
	}
	if _, err := r.jsonOptions(r.outboxName(firstTable(r.Table)), r.Topic, r.TombstoneOnEmptyPayload); err != nil {
		return err
	}
	if err := r.formatFlags.validate(); err != nil {
		return err
	}
	if err := config.Check(r, flagError); err != nil {
		return err
	}
	if err := r.validateSlotLoss(); err != nil {
		return err
	}
	if err := r.validateAutoRetry(); err != nil {
		return err
	}
	if r.MaxInFlightRequests < 1 || r.MaxInFlightRequests > sink.MaxInFlightLimit {
		return flagError("max-in-flight-requests", fmt.Sprintf("must be 1 to %d: Kafka keeps an idempotent producer's order across at most %d requests in flight", sink.MaxInFlightLimit, sink.MaxInFlightLimit))
	}
	if r.CheckpointStore == "file" && strings.TrimSpace(r.CheckpointFile) == "" {
		return flagError("checkpoint-file", "is required with --checkpoint-store=file")
	}
	return r.AdminFlags.validate()
}

// relayName defaults to the host name.
func relayName(name string) string {
	if name != "" {
		return name
	}
	if h, err := os.Hostname(); err == nil {
		return h
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "cdc-relay"
}

func (r *RunCmd) config(log zerolog.Logger, m *metrics.Metrics) (relay.Config, error) {
	conn, err := r.kafkaConn()
	if err != nil {
		return relay.Config{}, err
	}
	transport := conn.Transport()
	format, err := r.recordFormat(r.PGURL, r.outboxName(firstTable(r.Table)))
	if err != nil {
		return relay.Config{}, err
	}
	dc, err := r.decoderConfig("")
	if err != nil {
		return relay.Config{}, err
	}
	dc.MessagePrefix = r.MessagesPrefix
	var codec kafka.Compression // kafka-go's names are the flag's enum
	if err := codec.UnmarshalText([]byte(r.Compression)); err != nil {
		return relay.Config{}, flagError("compression", err.Error())
	}
	cfg := relay.Config{
		PGURL:             r.PGURL,
		Slot:              r.Slot,
		Publication:       r.Publication,
		Decoder:           dc,
		Topic:             r.Topic,
		TopicRegex:        r.topicRegex(),
		Delivery:          r.Delivery,
		OnOutboxUpdate:    r.OnOutboxUpdate,
		CreateSlot:        r.CreateSlot,
		SlotFailover:      r.SlotFailover,
		CreatePublication: r.CreatePublication,
		Sink: sink.Config{
			Brokers:        r.KafkaBrokers,
			BatchMaxEvents: r.BatchMaxEvents,
			BatchMaxBytes:  r.BatchMaxBytes,
			MaxInFlight:    r.MaxInFlightRequests,
			RequestTimeout: r.RequestTimeout,
			Compression:    codec,
			Retry:          backoff.Policy{Base: r.RetryBase, Cap: r.RetryCap},
			Transport:      transport,
		},
		RelayName:        relayName(r.RelayName),
		MaxInFlightBytes: int64(r.MaxInFlightMiB) << 20,
		StatusInterval:   r.StatusInterval,
		ReadCoalesce:     r.ReadCoalesce,
		ReadBuffer:       r.ReadBufferKiB << 10,
		CatchUpThreshold: int64(r.CatchUpThresholdMiB) << 20,
		CatchUpBatch:     r.CatchUpBatch,
		ShutdownTimeout:  r.ShutdownTimeout,
		KafkaStartWait:   r.KafkaStartTimeout,
		Heartbeat:        r.HeartbeatInterval,
		MonitorInterval:  r.MonitorInterval,
		Retry:            backoff.Policy{Base: r.RetryBase, Cap: r.RetryCap},
		Logger:           log,
		Metrics:          m,
		Names:            runNames,
	}
	format.apply(&cfg.Sink)
	if len(r.Table) > 0 {
		if err := r.tablesConfig(&cfg); err != nil {
			return relay.Config{}, err
		}
	}
	if r.OnSlotLoss == "backfill" {
		cfg.BackfillMargin = r.BackfillMargin
	}
	return cfg, nil
}

var _ relay.DeadLetterStore = (*deadletter.Store)(nil)

// wire builds the values the relay takes, over pool (relay.OpenPool of
// cfg.PGURL, which the caller closes after the relay's Run) or, with
// --primary-pg-url, over primary (the same, of that URL), and sets them in
// cfg, which config returned: the checkpoint store; with --on-error=dlq the
// dead-letter store, its recorder, gauges, retention and automatic retries;
// the backfill and snapshot publishers. Each value is built before anything
// that uses it, and none is assigned later: what a function set here calls
// exists when it is set.
func (r *RunCmd) wire(cfg *relay.Config, pool, primary *pgxpool.Pool, log zerolog.Logger) error {
	cfg.Pool, cfg.PrimaryPool = pool, primary
	// What the relay writes goes to the primary when --pg-url may name a
	// standby; the relay checks which it is when it starts.
	if primary != nil {
		if r.CheckpointStore != "file" {
			cfg.StandbyCheckpoints = checkpoint.NewTableStore(pool, r.CheckpointTable)
		}
		pool = primary
	}
	cfg.Checkpoints = r.checkpointStore(pool)
	if r.dlqNeeded() {
		store := deadletter.NewStore(pool, r.DLQTable)
		record := store.Recorder(cfg.RelayName)
		// The letter keeps the error as the operator will read it (dlq list,
		// dlq show): the libraries named the settings through cfg.Names.
		cfg.DeadLetter = func(ctx context.Context, ev *outbox.Event, topic string, cause error) error {
			return record(ctx, ev, topic, cause)
		}
		cfg.DeadLetterStore = store
		cfg.ReplayTotals = replayTotals(store.History())
		if keep := r.DLQRetention; keep > 0 {
			cfg.DeadLetterRetention = func(ctx context.Context) (int64, error) {
				return store.Purge(ctx, time.Now().Add(-keep), "")
			}
		}
		if r.DLQAutoRetry {
			cfg.DeadLetterAutoRetry = r.autoRetry(store, *cfg, log)
		}
	}
	r.setBackfill(cfg, pool, log)
	r.setSnapshot(cfg, pool, log)
	r.setJoin(cfg, pool, log)
	return nil
}

// checkpointStore is the store of --checkpoint-store: the checkpoint table
// over pool, or the checkpoint file.
func (r *RunCmd) checkpointStore(pool *pgxpool.Pool) relay.Store {
	if r.CheckpointStore == "file" {
		return checkpoint.NewFileStore(r.CheckpointFile)
	}
	return checkpoint.NewTableStore(pool, r.CheckpointTable)
}

// replayTotals reads the totals of replay history h as the relay's monitor
// takes them (relay.Config.ReplayTotals).
func replayTotals(h *replay.History) func(context.Context) ([]relay.ReplayTotal, error) {
	return func(ctx context.Context) ([]relay.ReplayTotal, error) {
		totals, err := h.Totals(ctx)
		out := make([]relay.ReplayTotal, len(totals))
		for i, t := range totals {
			out[i] = relay.ReplayTotal{Kind: t.Kind, Result: t.Result, Events: t.Events}
		}
		return out, err
	}
}

// startSpans starts exporting spans with --otel-exporter otlp, and logs where
// to; it returns nil for none.
func (r *RunCmd) startSpans(ctx context.Context, version string, log zerolog.Logger, m *metrics.Metrics) (*tracing.Spans, error) {
	if r.OtelExporter != tracing.ExporterOTLP {
		return nil, nil
	}
	spans, err := tracing.New(ctx, tracing.Config{ServiceVersion: version, Logger: log, Metrics: m})
	if err != nil {
		return nil, flagError("otel-exporter", "otlp: "+err.Error())
	}
	log.Info().Str("endpoint", spans.Endpoint()).Str("protocol", spans.Protocol()).
		Msg("exporting a span per event with a trace context over OTLP (--otel-exporter otlp); the traceparent header names the relay's span")
	return spans, nil
}

// stopSpans flushes the spans still queued, for at most tracing.FlushTimeout.
// A failure is logged, not returned: the relay's stop was clean all the same.
func stopSpans(spans *tracing.Spans, log zerolog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), tracing.FlushTimeout)
	defer cancel()
	if err := spans.Shutdown(ctx); err != nil {
		log.Warn().Err(err).Msg("trace spans not flushed")
	}
}

// validateAutoRetry checks the --dlq-auto-retry-* flags.
func (r *RunCmd) validateAutoRetry() error {
	if !r.DLQAutoRetry {
		return nil
	}
	if r.OnError != "dlq" {
		return flagError("dlq-auto-retry", "needs --on-error=dlq: with halt there are no dead letters to retry")
	}
	var codes []string
	for _, c := range r.DLQAutoRetryCodes {
		if c = strings.TrimSpace(c); c != "" {
			codes = append(codes, c)
		}
	}
	if len(codes) == 0 {
		return flagError("dlq-auto-retry-codes", "is empty: name the error codes to retry, e.g. "+strings.Join(deadletter.DefaultRetryCodes, ","))
	}
	r.DLQAutoRetryCodes = codes
	if r.DLQAutoRetryBudget < 1 {
		return flagError("dlq-auto-retry-budget", "must be at least 1 attempt")
	}
	if r.DLQAutoRetryMaxAge < 0 {
		return flagError("dlq-auto-retry-max-age", "must be 0 (no limit) or a positive duration such as 24h")
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"dlq-auto-retry-base", r.DLQAutoRetryBase}, {"dlq-auto-retry-cap", r.DLQAutoRetryCap},
		{"dlq-auto-retry-interval", r.DLQAutoRetryInterval}, {"dlq-auto-retry-timeout", r.DLQAutoRetryTimeout}} {
		if d.v <= 0 {
			return flagError(d.flag, "must be a positive duration such as 10s or 1m")
		}
	}
	if r.DLQAutoRetryCap < r.DLQAutoRetryBase {
		return flagError("dlq-auto-retry-cap", fmt.Sprintf("is %s, less than --dlq-auto-retry-base (%s)", r.DLQAutoRetryCap, r.DLQAutoRetryBase))
	}
	return nil
}

// autoRetry returns the relay's DeadLetterAutoRetry: the automatic retries
// over store (whose tables the relay creates before it starts them),
// publishing through their own producer, configured as the relay's (cfg.Sink:
// brokers, security, format), so that their retries and the stream's never
// share a partition's sequence.
func (r *RunCmd) autoRetry(store *deadletter.Store, cfg relay.Config, log zerolog.Logger) func(context.Context, func() bool) error {
	log = log.With().Str("component", "dlq-auto-retry").Logger()
	m := cfg.Metrics
	pubCfg := cfg.Sink
	pubCfg.Logger = log
	pubCfg.Names, pubCfg.DecoderNames = cfg.Names.Within("Sink"), cfg.Names.Within("Decoder")
	topicWait := r.KafkaStartTimeout
	return func(ctx context.Context, ready func() bool) error {
		a := &deadletter.AutoRetry{
			Store: store,
			Open: func(ctx context.Context) (replay.Publisher, func() error, error) {
				p, err := sink.NewPublisher(ctx, pubCfg)
				if err != nil {
					return nil, nil, err
				}
				p.TopicWait = topicWait
				return p, p.Close, nil
			},
			Codes:          r.DLQAutoRetryCodes,
			Budget:         r.DLQAutoRetryBudget,
			MaxAge:         r.DLQAutoRetryMaxAge,
			Retry:          backoff.Policy{Base: r.DLQAutoRetryBase, Cap: r.DLQAutoRetryCap},
			Interval:       r.DLQAutoRetryInterval,
			AttemptTimeout: r.DLQAutoRetryTimeout,
			RelayName:      cfg.RelayName,
			Ready:          ready,
			Names:          cfg.Names,
			Logger:         log,
			Metrics:        m,
		}
		return a.Run(ctx)
	}
}

// memoryLimit is the soft memory limit "run" gives the Go runtime: room for
// the events in flight twice over (the garbage collector's headroom) plus what
// the relay needs besides them. The garbage collector works harder only when
// the heap nears it, so peak memory follows --max-in-flight-mib whatever the
// backlog.
func memoryLimit(maxInFlightMiB int) int64 {
	return int64(maxInFlightMiB)<<21 + 12<<20
}

// Run runs the relay until ctx ends (a clean stop, nil) or it fails. In JSON
// mode the failure is logged here, once, as the log's last line, and returned
// as reported; otherwise it is returned for main to print as one plain line.
func (r *RunCmd) Run(ctx context.Context, env Env) error {
	log := NewLogger(env.Stderr, r.LogLevel, r.LogFormat) // the relay adds the slot
	err := r.run(ctx, env, log)
	if err == nil || !logsJSON(env.Stderr, r.LogFormat) {
		return err
	}
	log.Error().Str("error", oneLineError(err)).Str("slot", r.Slot).Int("exit_code", ExitCode(err)).
		Msg("cdc-relay stopped with an error")
	return &reportedError{err}
}

// run is Run without the report of its failure.
func (r *RunCmd) run(ctx context.Context, env Env, log zerolog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)
	m.BuildInfo.WithLabelValues(env.Version, runtime.Version()).Set(1)
	cfg, err := r.config(log, m)
	if err != nil {
		return &usageError{err}
	}
	pool, err := relay.OpenPool(ctx, cfg.PGURL, cfg.Names)
	if err != nil {
		return err
	}
	defer pool.Close()
	var primary *pgxpool.Pool
	if r.PrimaryPGURL != "" {
		if primary, err = relay.OpenPool(ctx, r.PrimaryPGURL, cfg.Names); err != nil {
			return flagError("primary-pg-url", err.Error())
		}
		defer primary.Close()
	}
	if err := r.wire(&cfg, pool, primary, log); err != nil {
		return &usageError{err}
	}
	spans, err := r.startSpans(ctx, env.Version, log, m)
	if err != nil {
		return err
	}
	if spans != nil {
		cfg.Spans = spans // not a nil *tracing.Spans: a nil Spans costs nothing per event
		defer stopSpans(spans, log)
	}
	cfg.OpenProducer = env.OpenProducer
	rl := relay.New(cfg)
	if env.OnRelay != nil {
		env.OnRelay(rl)
	}
	srv, err := r.startAdmin(reg, rl.Ready, rl.NotReady, log)
	if err != nil {
		return err
	}
	getenv := env.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if env.SetMemoryLimit != nil && getenv("GOMEMLIMIT") == "" {
		limit := memoryLimit(r.MaxInFlightMiB)
		env.SetMemoryLimit(limit)
		log.Debug().Int64("bytes", limit).Msg("Go soft memory limit set from --max-in-flight-mib (GOMEMLIMIT overrides)")
	}
	log.Info().Str("version", env.Version).Str("slot", r.Slot).Strs("tables", r.Table).Str("messages_prefix", r.MessagesPrefix).Str("topic", r.Topic).
		Strs("brokers", r.KafkaBrokers).Msg("starting cdc-relay")
	r.conn.Log(log) // resolved by r.config
	runErr := r.conn.Explain(rl.Run(ctx))
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := srv.Shutdown(sctx); err != nil && runErr == nil {
			runErr = fmt.Errorf("stop metrics server: %w", err)
		}
		cancel()
	}
	if runErr != nil && errors.Is(runErr, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return runErr
}

// RelayConfig parses the flags of "cdc-relay run" (args without the program
// and command names), with the environment and any --config file as the
// command does, and returns the relay configuration the command would run,
// without connecting anywhere: its settings, without the values run builds
// over the source database (Pool, Checkpoints, dead letters, backfill and
// snapshot). The benchmark's limit reader reads a slot with exactly the
// relay's decoder, topic and status settings through it.
func RelayConfig(args []string) (relay.Config, error) {
	var c CLI
	exitCode := -1
	kctx, err := parse(&c, append([]string{"run"}, args...), io.Discard, io.Discard, func(code int) { exitCode = code })
	if exitCode >= 0 { // --help
		return relay.Config{}, errors.New("relay configuration: give the flags of cdc-relay run, not --help")
	}
	if err != nil {
		return relay.Config{}, err
	}
	if kctx.Command() != "run" {
		return relay.Config{}, fmt.Errorf("relay configuration: parsed command %q, not run", kctx.Command())
	}
	return c.Run.config(zerolog.Nop(), metrics.Discard())
}
