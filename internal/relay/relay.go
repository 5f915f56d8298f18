// Package relay wires the replication stream, the pgoutput decoder, the topic
// router, the Kafka producer and the checkpoint committer into the running
// relay.
//
// It owns none of the invariants' arithmetic: the checkpoint package alone
// writes checkpoints and decides what may be confirmed and where streaming
// starts (checkpoint.Opening, then checkpoint.Committer: the stream confirms
// only its Flushed), gaps.Checker alone decides what is a gap to be loud
// about, the producer alone retries in order, the decoder alone decides what
// is an event. What the relay owns is the order of start-up (checks,
// reconcile, backfill: start.go), the per-event path (handler.go), the
// connection loop and the clean stop (stream.go), and the failure policy for
// events that fail for good (permanent, below).
//
// The relay is given its dependencies as values its caller built first: the
// pool to the source database (OpenPool), the checkpoint store, the
// dead-letter store and the functions that publish a backfill or a snapshot
// (Config). Run prepares the stores in its order of start-up (Ensure) and
// closes nothing it was given.
package relay

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/connectjson"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/dedup"
	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/outboxtable"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/setting"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/tracing"
)

// Store persists checkpoints (checkpoint.TableStore, checkpoint.FileStore).
// Ensure prepares the store (a table store creates its table when missing):
// Run calls it once, after the server checks, before the first Load. Load
// returns the stored checkpoint of slot and whether there is one; Save
// returns nil once c is durable. The relay never calls Save itself: every
// checkpoint goes through the checkpoint package (Opening, Committer).
type Store interface {
	Ensure(ctx context.Context) error
	checkpoint.Store
	checkpoint.JoinStore
}

// DeadLetterStore is the table behind the dlq failure policy
// (deadletter.Store), as the relay's start and its monitor use it. Ensure
// creates its tables when missing: Run calls it once, after the server checks
// and before Kafka is opened, so that Config.DeadLetter, the automatic
// retries and the monitor find them. StatusCounts returns the letters by
// status: the monitor reads it every MonitorInterval into the
// dead_letters_by_status metric and the dead_letter_backlog one (those not
// "completed").
type DeadLetterStore interface {
	Ensure(ctx context.Context) error
	StatusCounts(ctx context.Context) (map[string]int64, error)
}

// producer is where the relay hands events for Kafka (sink.Kafka). Produce
// queues m and reports its fate through done exactly once: nil only after
// Kafka acknowledged it with acks=all, in order per partition (with where
// Kafka stored it), or its permanent failure; a non-nil return from done
// halts the producer (see sink.Done). Produce returns an error only once the
// producer has halted.
type producer interface {
	Produce(m sink.Message, done sink.Done) error
}

// health is the producer's readiness: Healthy when the brokers answer and
// nothing is retrying; Retrying while some partition retries a failure.
type health interface {
	Healthy() bool
	Retrying() bool
}

// pauser is the producer's circuit breaker: CircuitClosed returns nil while
// Kafka accepts requests, and otherwise a channel closed once it does again.
type pauser interface {
	CircuitClosed() <-chan struct{}
}

// Producer is the relay's Kafka producer as Config.OpenProducer opens it in
// place of the built-in sink.Kafka (the benchmark runs another
// implementation beside it). Its contract is sink.Kafka's:
//
//   - Produce queues m for m.Topic without blocking on Kafka, on the
//     partition of its TargetPartition or else of the Java-compatible
//     murmur2 hash of its AggregateID, and reports its fate through done
//     exactly once, unless the producer was closed or halted first: nil
//     once Kafka acknowledged it with acks=all (with where Kafka stored it),
//     or its permanent failure as an *outbox.EventError whose Code says why.
//     Messages of one partition are reported in the order they were
//     produced and reach Kafka in that order, across retries; done calls
//     never overlap, except those made within Produce for a failure known
//     at once (an empty key). A non-nil return from done halts the
//     producer: nothing more is sent or reported, and Produce returns an
//     error from then on (see sink.Done). Transient failures are retried,
//     never reported. Records carry the headers and value sink.Kafka
//     writes (package sink's Header constants).
//   - Healthy and Retrying are the readiness the relay reports (health);
//     CircuitClosed is the circuit breaker it pauses reading on (pauser).
//   - PartitionCount, Ranges and Scan read what Kafka holds (dedup.Reader):
//     the effectively-once start-up reconciliation reads the relay's
//     records back through them, with the partitions Produce maps keys to.
//     A producer that also has sink.Kafka's Claim and Fence is fenced with
//     the stream's transactional id before the partitions are read, so a
//     killed run's last requests cannot land after the read; one without
//     them is read unfenced.
//   - Once done for m returned, the producer reads nothing of m.Event nor
//     of bytes it kept of it: the relay recycles the event at once
//     (inflight.release), and the next row decoded may fill the same
//     *outbox.Event and buffer. sinktest's EventLifetime case poisons every
//     event after its done; the relay's own tests poison every recycled
//     event (decoder.Config.PoisonRecycled).
//   - Close stops every goroutine of the producer; messages not reported
//     yet are abandoned (no done runs after Close returns). Run closes it
//     before it returns.
type Producer interface {
	producer
	health
	pauser
	dedup.Reader
	Close() error
}

// openKafka opens the built-in producer, sink.Kafka: Config.OpenProducer's
// default.
func openKafka(ctx context.Context, cfg sink.Config) (Producer, error) {
	k, err := sink.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return k, nil
}

var (
	_ Producer = (*sink.Kafka)(nil)
	_ producer = (*sink.Kafka)(nil)
	_ health   = (*sink.Kafka)(nil)
	_ pauser   = (*sink.Kafka)(nil)
	_ Spans    = (*tracing.Spans)(nil)
	_ Store    = (*checkpoint.TableStore)(nil)
	_ Store    = (*checkpoint.FileStore)(nil)
)

// Spans records the relay's own trace span of each event it streams
// (tracing.Spans). Start is called once per event, when it is read and
// routed (m.Topic set, "" when routing failed) but before it is sized or
// produced; it returns the event's span (nil: none) and the traceparent the
// record carries instead of the event's (nil: the event's own), which the
// relay gives the sink beside the event (sink.Message.TraceParent). End is
// called once the event is settled, with Start's span: err nil when Kafka
// acknowledged it (at says where Kafka stored it), otherwise its permanent
// failure, with deadLetter true when it was stored as a dead letter and
// false when it halted the relay. An event skipped as already in Kafka gets
// no End.
type Spans interface {
	Start(m sink.Message) (span trace.Span, traceParent []byte)
	End(m sink.Message, span trace.Span, at sink.Stored, err error, deadLetter bool)
}

// DeadLetterFunc stores ev, which failed permanently with cause on its way to
// topic, and returns nil once the dead letter is committed: only then is the
// event counted as done, so the checkpoint never moves past an event that is
// neither in Kafka nor in the dead-letter store. topic is the one the relay
// routed ev to, or, when the template could not name one (cause says why),
// the template itself (Config.Topic), so the letter shows what to fix. It is
// called from the producer's goroutine and the stream's, so it must be safe
// for concurrent use (deadletter.Store.Recorder is).
type DeadLetterFunc func(ctx context.Context, ev *outbox.Event, topic string, cause error) error

// Config configures a relay.
type Config struct {
	PGURL       string
	Slot        string
	Publication string
	Decoder     decoder.Config
	// Topic is the topic template, e.g. "outbox.events" or
	// "outbox.{aggregate_type}" (internal/route); a fixed topic must exist (or
	// be auto-created) before the relay starts.
	Topic string
	// TopicRegex, when its Pattern is set, is matched against one field of
	// each event, and Topic may refer to its groups (route.NewWithRegex).
	TopicRegex route.Regex
	// TableRoutes routes the events of some outbox tables (by name: the
	// first one or Decoder.Also's) by templates of their own instead of
	// Topic and TopicRegex.
	TableRoutes map[decoder.TableName]TableRoute
	// HaltTables names the outbox tables whose events, failing permanently,
	// halt the relay even when DeadLetter is set (a per-table failure
	// policy); the zero TableName stands for message-outbox events.
	HaltTables map[decoder.TableName]bool
	// Delivery is DeliveryEffectivelyOnce (the default) or DeliveryAtLeastOnce.
	Delivery string
	// OnOutboxUpdate is what an UPDATE of an outbox row does (an outbox is
	// insert-only; nothing is published for an update): OutboxUpdateIgnore
	// (or "", the default), OutboxUpdateWarn, OutboxUpdateError or
	// OutboxUpdateFatal. A DELETE is always ignored: deleting outbox rows
	// once inserted is how an outbox is kept small.
	OnOutboxUpdate string
	CreateSlot     bool
	// SlotFailover is whether the slot is a failover slot, synchronized to
	// standbys with sync_replication_slots on so that it survives a
	// promotion: replication.FailoverAuto (or "", the default) where the
	// server has failover slots (PostgreSQL 17+), replication.FailoverOn
	// (refuse to start below 17) or replication.FailoverOff. The relay
	// creates its slot so, and switches failover on for an existing slot
	// that lacks it; it never switches it off.
	SlotFailover string
	// CreatePublication lets the relay create a missing publication.
	CreatePublication bool
	Sink              sink.Config // Topics, Logger and Metrics are set by the relay
	// OpenProducer, when set, opens the relay's Kafka producer instead of
	// sink.Open: it is given what sink.Open would be, Sink with the fields
	// the relay sets (Topics, Logger, Names, Metrics, Idempotent, Verifier),
	// and ctx bounded by KafkaStartWait, and returns once the brokers answer
	// and Topics exist; the producer must keep Metrics' producer series as
	// sink.Kafka does (cdc_relay_events_published_total above all, which
	// the benchmark reads). Nil, as the cdc-relay command leaves it, is
	// sink.Open. The benchmark sets it to run another producer (see
	// Producer for the contract).
	OpenProducer func(ctx context.Context, cfg sink.Config) (Producer, error)

	// The values below are built by the caller before New, the stores over
	// Pool; Run checks that Pool and Checkpoints are set.

	// Pool reaches the database of PGURL for queries (checks, slot, monitor);
	// the caller opens it with OpenPool, builds the stores over it, and closes
	// it after Run returned. The replication connections use PGURL.
	Pool *pgxpool.Pool
	// PrimaryPool, required when PGURL names a hot standby (PostgreSQL 16+),
	// reaches the primary it replicates from: the slot, the stream and the
	// decoding stay on the standby, and the relay writes through PrimaryPool
	// (the publication, heartbeats, the running-transactions records that
	// creating a slot on a standby waits for). The caller builds the stores
	// over it. Unused when PGURL names a primary.
	PrimaryPool *pgxpool.Pool
	// Checkpoints persists the checkpoint: a checkpoint.TableStore over Pool
	// (it reconnects after restarts) or a checkpoint.FileStore.
	Checkpoints Store
	// StandbyCheckpoints, set with PrimaryPool when Checkpoints is a
	// checkpoint table, reads that table through Pool. When PGURL names a
	// hot standby, the relay confirms to the slot there only what the
	// standby holds of the checkpoint (what it has replayed of the
	// primary's): a promotion of the standby then finds a checkpoint no
	// older than its slot, never slot_ahead.
	StandbyCheckpoints checkpoint.Loader

	// DeadLetter, when set, is the dlq failure policy: an event that fails for
	// good is stored through it and the relay goes on. When nil the policy is
	// halt: a permanent failure stops the relay, and the slot is not confirmed
	// past the event.
	DeadLetter DeadLetterFunc
	// DeadLetterStore, when set, is the table DeadLetter writes to: Run
	// creates its tables before streaming and the monitor reads its counts.
	DeadLetterStore DeadLetterStore

	// Backfill, when set, is the on-slot-loss=backfill policy: when the slot
	// was dropped, lost its WAL (wal_status 'lost') or was moved past the stored
	// checkpoint, the relay drops a lost slot, creates a missing one, and calls
	// Backfill to republish the outbox rows created at or after since — the
	// stored checkpoint's commit time less BackfillMargin — marked with kind,
	// before it streams from the slot. It returns how many rows it published
	// (Kafka acknowledged every one). When nil the relay refuses to start with
	// the explanation (on-slot-loss=fail).
	Backfill func(ctx context.Context, since time.Time, kind string) (int, error)
	// Snapshot, when set, is the initial snapshot (delivery.snapshot initial): when the relay creates its
	// slot (there is no stored checkpoint and no slot), it creates it with
	// EXPORT_SNAPSHOT and calls Snapshot with a transaction that imported the
	// snapshot, to publish every outbox row tx sees, marked as snapshot rows
	// and without a source position, before it streams from the slot's
	// consistent point. Snapshot returns how many rows it published, once
	// Kafka acknowledged every one. A slot that already exists takes no
	// snapshot. See snapshot.go for restarts during the snapshot.
	Snapshot func(ctx context.Context, tx pgx.Tx) (int, error)
	// Join publishes the rows of outbox tables the relay adds to the
	// publication of a slot that exists (a table joins: join.go), marked as
	// snapshot rows (cdc_relay_snapshot: join) and without a source
	// position, whatever Snapshot is, after the change committed and before
	// the stream starts. Nil: a table that joins stops the relay, unless
	// JoinMode is JoinNone.
	Join Joiner
	// JoinMode is what a join publishes: JoinAll ("" too), JoinAfterCheckpoint
	// or JoinNone.
	JoinMode string

	// BackfillMargin is subtracted from the stored commit time: it covers
	// transactions that inserted their rows (created_at) that long before they
	// committed, and clock differences. Default 10 minutes.
	BackfillMargin time.Duration

	RelayName        string
	MaxInFlightBytes int64         // backpressure threshold (DefaultMaxInFlightBytes)
	StatusInterval   time.Duration // standby status period (DefaultStatusInterval)
	// ReadCoalesce is how long a read of the replication stream may wait for
	// more bytes before it wakes the relay (replication.StreamConfig); 0, the
	// zero value, wakes it for every message. The command line's default is
	// DefaultReadCoalesce.
	ReadCoalesce time.Duration
	// ReadBuffer is the replication connection's TCP receive buffer in bytes
	// (replication.StreamConfig); 0, the zero value, leaves it to the
	// kernel. The command line's default is DefaultReadBuffer.
	ReadBuffer int
	// CatchUpThreshold, when positive, is how far behind the slot may be, in
	// bytes of WAL between its confirmed position and the server's WAL, before
	// the relay reads the backlog in batches of CatchUpBatch pgoutput messages
	// through SQL instead of streaming it, switching to the stream once caught
	// up (catchup.go). 0, the zero value, always streams. The command line's
	// default is DefaultCatchUpThreshold.
	CatchUpThreshold int64
	// CatchUpBatch is how many pgoutput messages one catch-up batch asks for
	// (DefaultCatchUpBatch); Postgres returns whole transactions.
	CatchUpBatch int
	// PersistInterval bounds how long a watermark moved by acknowledged events
	// waits to be persisted; saves are coalesced to one per interval
	// (DefaultPersistInterval). A restart after a crash starts from the store,
	// so this is what bounds the redelivery.
	PersistInterval time.Duration
	IdleCheckpoint  time.Duration // how often an idle advance is persisted (DefaultIdleCheckpoint)
	ShutdownTimeout time.Duration // bound on a clean stop (DefaultShutdownTimeout)
	KafkaStartWait  time.Duration // how long to wait for Kafka at start (DefaultKafkaStartWait)
	MonitorInterval time.Duration // how often slot metrics are read (DefaultMonitorInterval)
	// Heartbeat, when positive, writes pg_logical_emit_message at that period so
	// an idle database's slot keeps moving while others write WAL; on the
	// primary when PGURL names a standby, where 0 means
	// DefaultStandbyHeartbeat.
	Heartbeat time.Duration
	// ReplayTotals, when set, is read every MonitorInterval into the
	// replay_history_events metric: the events of every replay in the
	// history, by kind and result, whichever process ran it.
	ReplayTotals func(context.Context) ([]ReplayTotal, error)
	// DeadLetterAutoRetry, when set, runs the automatic retries of dead
	// letters (dead_letters.auto_retry) until ctx ends; ready reports whether Kafka
	// accepts the relay's events now. The relay runs it in the background
	// from the start of streaming, stops it at shutdown, and calls it again,
	// with backoff, when it returns an error before.
	DeadLetterAutoRetry func(ctx context.Context, ready func() bool) error
	// DeadLetterRetention, when set, deletes dead letters older than the
	// configured age; it is called every MonitorInterval·60.
	DeadLetterRetention func(context.Context) (int64, error)
	Retry               backoff.Policy
	// Spans, when set, records a trace span per event (operations.otel_exporter
	// otlp); nil records none, at no cost per event. Its owner shuts it
	// down after Run returns.
	Spans Spans

	// Names names settings in errors and log lines (see package setting):
	// the fields of this Config; the relay hands each nested configuration
	// (Decoder, Sink) the Namer Within its field.
	Names setting.Namer

	Logger  zerolog.Logger
	Metrics *metrics.Metrics
}

// decoderConfig is Decoder, naming its settings Within "Decoder".
func (c Config) decoderConfig() decoder.Config {
	d := c.Decoder
	d.Names = c.Names.Within("Decoder")
	return d
}

// router returns the router of topic template and re, naming the settings
// in its errors as c's.
func (c Config) router(template string, re route.Regex) (*route.Router, error) {
	re.Names = c.Names
	return route.NewWithRegex(template, re)
}

// Delivery modes (Config.Delivery).
const (
	// DeliveryEffectivelyOnce produces idempotently, stamps every message with
	// its source position, stores Kafka offsets with each checkpoint and skips
	// replayed events already in Kafka (internal/dedup).
	DeliveryEffectivelyOnce = "effectively-once"
	// DeliveryAtLeastOnce sends everything the slot replays.
	DeliveryAtLeastOnce = "at-least-once"
)

// What an UPDATE of an outbox row does (Config.OnOutboxUpdate), as Debezium's
// table.op.invalid.behavior.
const (
	// OutboxUpdateIgnore skips it silently.
	OutboxUpdateIgnore = "ignore"
	// OutboxUpdateWarn logs a warning (at most 10 lines a minute) and counts
	// it in cdc_relay_outbox_updates_total.
	OutboxUpdateWarn = "warn"
	// OutboxUpdateError does the same at error level.
	OutboxUpdateError = "error"
	// OutboxUpdateFatal stops the relay with a *replication.ConfigError
	// before confirming the update's transaction; it is read again on restart.
	OutboxUpdateFatal = "fatal"
)

// Defaults of Config, stated once: the command line's flag defaults are these.
const (
	DefaultMaxInFlightBytes = 16 << 20
	DefaultStatusInterval   = time.Second
	DefaultReadCoalesce     = time.Millisecond
	// DefaultReadBuffer leaves the receive buffer to the kernel: a small one
	// (source.read_buffer_kib 32) made one-event transactions drain faster and
	// cost the walsender less, but 10-event ones drain slower (bench/README.md).
	DefaultReadBuffer      = 0
	DefaultPersistInterval = 100 * time.Millisecond
	// DefaultCatchUpThreshold is the command line's source.catch_up_threshold_mib:
	// 64 MiB, a backlog that takes the streaming protocol seconds at one
	// event per transaction (about 100,000 of them).
	DefaultCatchUpThreshold = 64 << 20
	// DefaultCatchUpBatch is a batch of about 330,000 one-event transactions
	// (three messages each). Each peek decodes again from the slot's restart
	// point, which moves only at running-transactions records (every 15 s
	// of writing): batches much smaller than what the writers wrote in 15 s
	// spend most of their time decoding again (bench, issue 44: 100,000
	// messages drained a 500,000-transaction backlog at 45k ev/s, one batch
	// of all of it at 97k). Postgres holds a batch in a tuplestore spilled
	// to a temporary file past work_mem: some 200 MB of disk at 300 B
	// payloads (estimated from the rows' sizes).
	DefaultCatchUpBatch    = 1_000_000
	DefaultIdleCheckpoint  = 10 * time.Second
	DefaultShutdownTimeout = 10 * time.Second
	DefaultKafkaStartWait  = 30 * time.Second
	DefaultMonitorInterval = 10 * time.Second
	DefaultBackfillMargin  = 10 * time.Minute
	// DefaultStandbyHeartbeat is the heartbeat on the primary when the relay
	// decodes on a standby and Heartbeat is 0: a standby's slot moves only
	// over WAL the primary writes, so an idle primary would hold it back.
	DefaultStandbyHeartbeat = 10 * time.Second
)

func (c *Config) setDefaults() {
	if c.MaxInFlightBytes <= 0 {
		c.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if c.StatusInterval <= 0 {
		c.StatusInterval = DefaultStatusInterval
	}
	if c.PersistInterval <= 0 {
		c.PersistInterval = DefaultPersistInterval
	}
	if c.CatchUpBatch <= 0 {
		c.CatchUpBatch = DefaultCatchUpBatch
	}
	if c.IdleCheckpoint <= 0 {
		c.IdleCheckpoint = DefaultIdleCheckpoint
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.KafkaStartWait <= 0 {
		c.KafkaStartWait = DefaultKafkaStartWait
	}
	if c.MonitorInterval <= 0 {
		c.MonitorInterval = DefaultMonitorInterval
	}
	if c.BackfillMargin <= 0 {
		c.BackfillMargin = DefaultBackfillMargin
	}
	if c.Retry.Base <= 0 {
		c.Retry = backoff.Default
	}
	if c.Delivery == "" {
		c.Delivery = DeliveryEffectivelyOnce
	}
	if c.Metrics == nil {
		c.Metrics = metrics.Discard()
	}
}

// CheckSettings checks the settings in c, those a configuration sets
// (what Validate checks but the values built over the database: Pool,
// Checkpoints, the snapshot and the backfill), and returns a
// *setting.FieldError naming the field to fix. cdc-relay config check calls
// it without connecting anywhere.
func (c Config) CheckSettings() error {
	if !replication.ValidName(c.Slot) {
		return c.Names.Errorf("Slot", "slot name %q is invalid: use lowercase letters, digits and underscores, at most 63", c.Slot)
	}
	if !replication.ValidName(c.Publication) {
		return c.Names.Errorf("Publication", "publication name %q is invalid: use lowercase letters, digits and underscores", c.Publication)
	}
	if _, err := pgxpool.ParseConfig(c.PGURL); err != nil {
		return c.Names.Errorf("PGURL", "parse Postgres URL %s: %v", replication.Redact(c.PGURL), err)
	}
	if _, err := decoder.New(c.decoderConfig()); err != nil {
		return err
	}
	if _, err := c.router(c.Topic, c.TopicRegex); err != nil {
		return c.Names.Errorf("Topic", "%w", err)
	}
	for t, tr := range c.TableRoutes {
		if _, err := c.router(tr.Topic, tr.Regex); err != nil {
			return c.Names.Errorf("Topic", "outbox table %s: %w", t, err)
		}
	}
	if c.Decoder.Columns.EventType == "" && (strings.Contains(c.Topic, "{event_type}") || (c.TopicRegex.Pattern != "" && c.TopicRegex.Field == route.FieldEventType)) {
		return c.Names.Errorf("Decoder.Columns.EventType", "the topic routes by the event type but no event type column is set: name the column, or route by another field")
	}
	switch c.Delivery {
	case "", DeliveryEffectivelyOnce, DeliveryAtLeastOnce:
	default:
		return c.Names.Errorf("Delivery", "delivery %q is unknown: use %s or %s", c.Delivery, DeliveryEffectivelyOnce, DeliveryAtLeastOnce)
	}
	switch c.OnOutboxUpdate {
	case "", OutboxUpdateIgnore, OutboxUpdateWarn, OutboxUpdateError, OutboxUpdateFatal:
	default:
		return c.Names.Errorf("OnOutboxUpdate", "%q is unknown: use %s, %s, %s or %s", c.OnOutboxUpdate,
			OutboxUpdateIgnore, OutboxUpdateWarn, OutboxUpdateError, OutboxUpdateFatal)
	}
	switch c.SlotFailover {
	case "", replication.FailoverAuto, replication.FailoverOn, replication.FailoverOff:
	default:
		return c.Names.Errorf("SlotFailover", "%q is unknown: use %s, %s or %s", c.SlotFailover,
			replication.FailoverAuto, replication.FailoverOn, replication.FailoverOff)
	}
	if len(c.Sink.Brokers) == 0 {
		return c.Names.Errorf("Sink.Brokers", "no Kafka brokers configured")
	}
	switch c.JoinMode {
	case "", JoinAll, JoinAfterCheckpoint, JoinNone:
	default:
		return c.Names.Errorf("JoinMode", "%q is not a join mode: %s, %s or %s", c.JoinMode, JoinAll, JoinAfterCheckpoint, JoinNone)
	}
	return nil
}

// Validate checks everything in c that can be checked without connecting,
// and returns a *setting.FieldError naming the field to fix. Run calls it
// first.
func (c Config) Validate() error {
	if err := c.CheckSettings(); err != nil {
		return err
	}
	if c.Pool == nil {
		return c.Names.Errorf("Pool", "no connection pool to the source database: open it with relay.OpenPool")
	}
	if got := c.Pool.Config().ConnString(); got != c.PGURL {
		return c.Names.Errorf("Pool", "the pool reaches %s, not PGURL %s: open it with relay.OpenPool(ctx, PGURL)",
			replication.Redact(got), replication.Redact(c.PGURL))
	}
	if c.Checkpoints == nil {
		return c.Names.Errorf("Checkpoints", "no checkpoint store configured")
	}
	if c.Decoder.Table == "" {
		// A message outbox alone: its events exist only in the WAL.
		if c.Snapshot != nil {
			return c.Names.Errorf("Snapshot", "an initial snapshot reads the outbox table, and a message outbox (Decoder.MessagePrefix) has none: its events exist only in the WAL; drop the snapshot or configure the table too")
		}
		if c.Backfill != nil {
			return c.Names.Errorf("Backfill", "a backfill reads the outbox table, and a message outbox (Decoder.MessagePrefix) has none: its events exist only in the WAL; drop the backfill or configure the table too")
		}
	}
	return nil
}

// OpenPool returns the pool of connections to the source database at pgURL
// that a relay (Config.Pool) and the stores built for it share: at most two
// connections, each opened when first needed, so OpenPool itself does not
// connect (Run's first check awaits and explains the first connection). The
// caller closes it once Run returned. names names the caller's settings (its
// PGURL, see Config) in errors.
func OpenPool(ctx context.Context, pgURL string, names setting.Namer) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		return nil, names.Errorf("PGURL", "parse Postgres URL %s: %v", replication.Redact(pgURL), err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, replication.ConnectError(pgURL, err, names)
	}
	return pool, nil
}

// TableRoute is the topic template of one outbox table's events (see
// Config.Topic and TopicRegex).
type TableRoute struct {
	Topic string
	Regex route.Regex
}

// Relay is one running relay. Create it with New and call Run once.
type Relay struct {
	cfg   Config
	log   zerolog.Logger
	m     *metrics.Metrics
	ready atomic.Bool
	// why says what keeps the relay from ready (NotReady), set with ready.
	why atomic.Pointer[string]
	// eventLog logs per-event failures: at most 10 lines a minute.
	eventLog zerolog.Logger
	// pool reaches the source database (Config.Pool, set by Run).
	pool *pgxpool.Pool
	// source is the server of PGURL, a primary or a standby, read by
	// checkServer; writer is where the relay writes: Config.PrimaryPool for a
	// standby, else Config.Pool.
	source replication.Source
	writer *pgxpool.Pool
	// fatal carries a problem found while streaming that only an operator can
	// fix (a gap check); the relay stops with it.
	fatal chan error
	// gaps runs every check of DESIGN invariant 6, at start and while streaming.
	gaps *gaps.Checker
	// failover: the slot is to be a failover slot (Config.SlotFailover
	// resolved against the server's version by checkServer).
	failover bool
	// enableFailover: the slot lacks failover and was in use when the relay
	// started; the stream switches it on before it first acquires the slot.
	enableFailover bool
	// noCatchUp: the catch-up path failed for a reason the stream does not
	// share (catchup.go); this run streams only.
	noCatchUp bool
	// catchUpHold is how long a stream that falls behind is left alone after
	// a catch-up that did not gain on the backlog, until catchUpHoldUntil
	// (catchup.go). Both are used on the stream's goroutine only.
	catchUpHold      time.Duration
	catchUpHoldUntil time.Time
	// slotFailover: the slot is a failover slot on a primary, or will be
	// once enableFailover switched it on (checkFailover).
	slotFailover bool
	// join is what a join this start makes stores with it (join.go).
	join joinBase
	// joined are the outbox tables (schema.table) this start added to the
	// publication, publishing their rows (join.go).
	joined []string
	// stopOnce starts the clock of a clean stop once (stopping).
	stopOnce sync.Once
	stop     stopBudget
}

// New returns a relay for cfg.
func New(cfg Config) *Relay {
	cfg.setDefaults()
	log := cfg.Logger.With().Str("slot", cfg.Slot).Logger()
	r := &Relay{
		cfg:      cfg,
		log:      log,
		m:        cfg.Metrics,
		eventLog: log.Sample(&zerolog.BurstSampler{Burst: 10, Period: time.Minute}),
		fatal:    make(chan error, 1),
	}
	r.gaps = gaps.New(gaps.Config{Setup: r.setupConfig(), Logger: log, Metrics: cfg.Metrics})
	return r
}

// Ready reports whether the relay is streaming and Kafka is accepting events.
func (r *Relay) Ready() bool { return r.ready.Load() }

// NotReady says what keeps the relay from ready, for /readyz: "" while it
// is ready, else which side is down (Postgres, Kafka) or that it is not
// streaming yet.
func (r *Relay) NotReady() string {
	if r.ready.Load() {
		return ""
	}
	if why := r.why.Load(); why != nil {
		return *why
	}
	return "not streaming yet: starting (connecting to Postgres and Kafka, checking the slot)"
}

// setReady records whether the relay is ready and, when not, why.
func (r *Relay) setReady(ready bool, why string) {
	r.why.Store(&why)
	r.ready.Store(ready)
}

// autoRetry runs the dead letters' automatic retries until ctx ends, again
// after a backoff whenever they fail.
func (r *Relay) autoRetry(ctx context.Context) {
	for attempt := 0; ; attempt++ {
		err := r.cfg.DeadLetterAutoRetry(ctx, r.Ready)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.log.Error().Err(err).Msg("automatic dead-letter retries failed; starting them again after a backoff")
		}
		if r.cfg.Retry.Sleep(ctx, attempt) != nil {
			return
		}
	}
}

// Run checks the configuration, then relays until ctx is done, and stops cleanly:
// it finishes the transaction it is reading, waits for Kafka to acknowledge what
// is in flight (up to ShutdownTimeout), persists and confirms the checkpoint.
// It returns nil after a clean stop, a *replication.ConfigError or
// *gaps.GapError for problems an operator must fix, or the error that
// halted the relay.
func (r *Relay) Run(ctx context.Context) error {
	r.m.SetState(metrics.StateStarting)
	cfg := r.cfg
	if err := cfg.Validate(); err != nil {
		return err
	}
	// A stop before the stream begins says so at once (the stream says
	// what its own stop waits for).
	streaming := make(chan struct{})
	var startupDone sync.Once
	endStartup := func() { startupDone.Do(func() { close(streaming) }) }
	defer endStartup()
	go func() {
		select {
		case <-ctx.Done():
			b := r.stopping()
			r.log.Info().Int64("shutdown_timeout_ms", b.total.Milliseconds()).
				Msgf("stopping during start-up: the step under way is abandoned (a table join or initial snapshot cut short goes on or starts again at the next start); the relay exits within %s, its %s",
					b.total, r.cfg.Names.Name("ShutdownTimeout"))
		case <-streaming:
		}
	}()
	dec, err := decoder.New(cfg.decoderConfig())
	if err != nil {
		return err
	}
	router, err := cfg.router(cfg.Topic, cfg.TopicRegex)
	if err != nil {
		return cfg.Names.Errorf("Topic", "%w", err)
	}
	routers := map[decoder.TableName]*route.Router{}
	for t, tr := range cfg.TableRoutes {
		if routers[t], err = cfg.router(tr.Topic, tr.Regex); err != nil {
			return cfg.Names.Errorf("Topic", "outbox table %s: %w", t, err)
		}
	}

	// Postgres: server, table, publication, slot, stored checkpoint.
	pool := cfg.Pool
	if err := r.checkServer(ctx, pool); err != nil {
		return err
	}
	if err := r.publishJoins(ctx); err != nil {
		return err
	}
	if cfg.Decoder.Table != "" {
		dec.SetMembership(r.membership(pool, dec))
		dec.SetWALEnd(func(ctx context.Context) (pglogrepl.LSN, error) {
			qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return replication.CurrentWAL(qctx, pool)
		})
		parts, err := replication.ReadPartitions(ctx, pool, r.setupConfig())
		if err != nil {
			return err
		}
		dec.RememberMembers(parts)
	}
	if j := cfg.Decoder.JSON; cfg.Decoder.Table != "" && (j.Key != connectjson.Raw || j.Value != connectjson.Raw) {
		notNull, err := outboxtable.NotNullColumns(ctx, pool, cfg.Decoder.Schema+"."+cfg.Decoder.Table, cfg.Names.Within("Decoder"))
		if err != nil {
			return fmt.Errorf("read the NOT NULL columns for the JSON schemas: %w", err)
		}
		dec.SetNotNull(notNull)
	}
	for _, t := range cfg.Decoder.Also {
		if t.JSON.Key == connectjson.Raw && t.JSON.Value == connectjson.Raw {
			continue
		}
		notNull, err := outboxtable.NotNullColumns(ctx, pool, t.Schema+"."+t.Table, cfg.Names.Within("Decoder"))
		if err != nil {
			return fmt.Errorf("read the NOT NULL columns of %s.%s for the JSON schemas: %w", t.Schema, t.Table, err)
		}
		dec.SetTableNotNull(decoder.TableName{Schema: t.Schema, Table: t.Table}, notNull)
	}

	// Kafka, before anything is created in Postgres: a relay that cannot reach
	// Kafka must not leave a new slot behind to retain WAL.
	h := &handler{
		dec:     dec,
		router:  router,
		routers: routers,
		halts:   cfg.HaltTables,
		flight:  newInflight(cfg.MaxInFlightBytes, r.m.InFlightBytes, cfg.Spans, dec.Recycle),
		halted:  make(chan struct{}),
		m:       r.m,
	}
	h.done = h.delivered
	if cfg.DeadLetterStore != nil {
		if err := cfg.DeadLetterStore.Ensure(ctx); err != nil {
			return err
		}
	}
	h.deadLetter = cfg.DeadLetter
	sinkCfg := cfg.Sink
	sinkCfg.Logger = r.log
	sinkCfg.Names, sinkCfg.DecoderNames = cfg.Names.Within("Sink"), cfg.Names.Within("Decoder")
	sinkCfg.Metrics = r.m
	sinkCfg.Idempotent = cfg.Delivery == DeliveryEffectivelyOnce
	if sinkCfg.Idempotent {
		// The one decider of what Kafka already holds, for batches of
		// unknown fate; the gate below applies its rule at start-up.
		sinkCfg.Verifier = dedup.Decider{}
	}
	sinkCfg.Topics = h.fixedTopics()
	open := cfg.OpenProducer
	if open == nil {
		open = openKafka
	}
	kctx, cancel := context.WithTimeout(ctx, cfg.KafkaStartWait)
	k, err := open(kctx, sinkCfg)
	cancel()
	if err != nil {
		return err
	}
	defer k.Close()
	// Dead letters are stored with this context, from the producer's goroutine
	// or from the stream's (a failure Produce reports at once); it ends when
	// the stream is cut at shutdown, or when Run returns (before the producer
	// closes).
	pctx, cancelPolicy := context.WithCancel(context.Background())
	defer cancelPolicy()
	h.ctx, h.cutPolicy, h.relay, h.producer, h.pause = pctx, cancelPolicy, r, k, k

	// Slot and stored checkpoint.
	system, op, start, err := r.prepareSlot(ctx, pool)
	if err != nil {
		return err
	}
	ckCfg := checkpoint.CommitterConfig{
		Every: cfg.PersistInterval, Idle: cfg.IdleCheckpoint, Logger: r.log, Metrics: r.m,
	}
	var stored bool
	if cfg.Delivery == DeliveryEffectivelyOnce {
		cp, have := op.Stored()
		// With no checkpoint nothing was sent from this slot yet; one without
		// offsets was written by an at-least-once run or an older relay.
		stored = !have || cp.Offsets != nil
		h.ledger = dedup.NewLedger(cp.Offsets)
		h.origin = outbox.NewOrigin(system.SystemID, system.Timeline, cfg.Slot)
		ckCfg.Offsets = h.ledger.Covered
	}
	if r.source.InRecovery {
		ckCfg.Replica = cfg.StandbyCheckpoints
	} else if _, table := cfg.Checkpoints.(*checkpoint.TableStore); table && r.slotFailover {
		ckCfg.Standbys = r.standbyFlush()
	}
	ck := op.Committer(start, ckCfg)
	h.ck, h.tracker = ck, ck.Tracker()
	if ckCfg.Replica != nil {
		// The first confirmation is no later than what the standby holds:
		// wait until it has replayed the checkpoint table and row the start
		// wrote or found on the primary, then read it.
		if err := r.awaitReplay(ctx, "the checkpoint", pool, r.writer); err != nil {
			return err
		}
		_ = ck.Refresh(ctx) // a failure is logged; the slot is confirmed once a read succeeds
	}
	if ckCfg.Standbys != nil {
		_ = ck.Refresh(ctx) // a failure is logged; the slot is confirmed once a read succeeds
	}
	if h.ledger != nil {
		h.gate = dedup.NewGate(dedup.GateConfig{
			Reader: k, Ledger: h.ledger, Origin: h.origin, Persist: ck.Persist, Stored: stored,
			Logger: r.log, Metrics: r.m,
		})
	}
	r.pool = pool
	bgCtx, stopBg := context.WithCancel(context.Background())
	mon := &monitor{
		pool: pool, writer: r.writer, every: cfg.MonitorInterval, heartbeat: r.heartbeat(),
		replayTotals: cfg.ReplayTotals, retention: cfg.DeadLetterRetention, h: h, log: r.log, m: r.m,
		gaps: r.gaps, fatal: r.fatal,
	}
	if cfg.DeadLetterStore != nil {
		mon.counts = cfg.DeadLetterStore.StatusCounts
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		ck.Run(bgCtx)
	}()
	go func() {
		defer wg.Done()
		mon.run(bgCtx)
	}()
	if cfg.DeadLetterAutoRetry != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.autoRetry(bgCtx)
		}()
	}
	defer func() {
		stopBg()
		wg.Wait()
	}()

	endStartup()
	return r.stream(ctx, h, k, ck)
}

// standbyFlush reads, for the Committer, how far the standbys of
// synchronized_standby_slots have flushed the WAL of the server the
// checkpoint table is written to: PrimaryPool when set (the caller built
// the store over it; it reaches this same primary, checkSource warns
// otherwise), else Pool.
func (r *Relay) standbyFlush() func(context.Context) (checkpoint.StandbyFlush, error) {
	pool := r.cfg.Pool
	if r.cfg.PrimaryPool != nil {
		pool = r.cfg.PrimaryPool
	}
	return func(ctx context.Context) (checkpoint.StandbyFlush, error) {
		sf, err := replication.ReadStandbyFlush(ctx, pool)
		return checkpoint.StandbyFlush{WALEnd: sf.WALEnd, Slots: sf.Slots, Flushed: sf.Flushed}, err
	}
}

// heartbeat is the heartbeat period: Config.Heartbeat, or
// DefaultStandbyHeartbeat on a standby when that is 0.
func (r *Relay) heartbeat() time.Duration {
	if r.cfg.Heartbeat == 0 && r.source.InRecovery {
		return DefaultStandbyHeartbeat
	}
	return r.cfg.Heartbeat
}

// membership tells the decoder which relations announced under another name
// than the outbox table's hold outbox rows: the partitions of a partitioned
// outbox table whose publication publishes them under their own names. It
// reads the catalog once per Relation message (replication.ReadMembership),
// and each time lets dec remember every partition the catalog lists then
// (replication.ReadPartitions), so that one detached or dropped before the
// relay reads its rows still has its table.
func (r *Relay) membership(pool *pgxpool.Pool, dec *decoder.Decoder) decoder.Membership {
	setup := r.setupConfig()
	return func(ctx context.Context, rel decoder.Relation) (decoder.Member, decoder.TableName, error) {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		parts, err := replication.ReadPartitions(qctx, pool, setup)
		if err != nil {
			return decoder.NotMember, decoder.TableName{}, err
		}
		dec.RememberMembers(parts)
		return replication.ReadMembership(qctx, pool, setup, rel)
	}
}

// logFormer says how the rows of a former partition the stream announces
// are relayed (decoder.Former).
func (r *Relay) logFormer(f *decoder.Former) {
	const what = "the stream announces a relation that is no longer a partition of an outbox table and that the publication does not publish on its own: " +
		"its changes in the stream were written while it was one (detached or dropped since)"
	log := r.log.Warn().Str("relation", f.Rel.Namespace+"."+f.Rel.Name).Uint32("oid", f.Rel.ID)
	switch {
	case f.Until != 0 && f.By == "":
		// A Lookalike: the relay cannot tell a partition detached while it
		// was stopped from a table that never was one, so it says how to
		// make it stop asking.
		drop := fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE %s;", pgx.Identifier{r.cfg.Publication}.Sanitize(), pgx.Identifier{f.Rel.Namespace, f.Rel.Name}.Sanitize())
		log.Str("table", f.Table.String()).Str("until", f.Until.String()).Str("publication", r.cfg.Publication).Str("sql", drop).
			Msg("the stream announces a relation published on its own that has exactly the columns of an outbox table but is not its partition, and the relay never saw it as one: " +
				"it may be a partition detached while the relay was stopped, so its inserts committed before " + f.Until.String() + " may be outbox rows, and are dead-lettered as unattributed_partition; later ones are skipped as another table's. " +
				"Replay the dead letters that are outbox rows, purge the others; if the table is not an outbox partition, run " + drop)
	case f.Until != 0:
		log.Str("table", f.Table.String()).Str("until", f.Until.String()).
			Msg("the stream announces a relation the relay saw as a partition of an outbox table that is detached now and published on its own: " +
				"its inserts committed before " + f.Until.String() + " may have been written before the detach, and are dead-lettered as unattributed_partition; later ones are skipped as another table's")
	case f.OnItsOwn:
		fits := make([]string, len(f.Fits))
		for i, t := range f.Fits {
			fits[i] = t.String()
		}
		log.Strs("fits", fits).Str("publication", r.cfg.Publication).
			Msg("the stream announces a relation published on its own that has the columns reading an outbox table needs but not exactly that table's columns, and the relay never saw it as its partition: " +
				"it is taken for another table and its inserts are skipped. If it was a partition detached while the relay was stopped and its columns or the table's changed since, " +
				"the rows it got while it was one are not relayed: insert them into the outbox table again; if it is not an outbox partition, remove it from the publication to silence this")
	case f.Failed != nil:
		fits := make([]string, len(f.Fits))
		for i, t := range f.Fits {
			fits[i] = t.String()
		}
		log.Err(f.Failed).Str("code", decoder.CodeUnattributed).Strs("fits", fits).
			Msg(what + ", but the relay cannot tell which outbox table it belonged to: each insert the stream carries under its name is dead-lettered as unattributed_partition")
	case f.Table == (decoder.TableName{}):
		log.Msg(what + ", or a table removed from the publication since; it has no outbox table's columns, so it is another table and its inserts are skipped")
	default:
		log.Str("table", f.Table.String()).Str("attributed_by", f.By).
			Msg(what + ", so inserts the stream carries under its name are relayed as outbox events of the table it belonged to")
	}
}
