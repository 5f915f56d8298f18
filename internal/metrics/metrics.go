// Package metrics defines every Prometheus collector of cdc-relay in one place, so the
// names, labels and help texts that dashboards and alerts depend on are reviewed
// together. Collectors are registered on a caller-supplied registry; nothing is
// registered globally.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"strconv"
	"sync"
	"time"
)

const namespace = "cdc_relay"

// State values of the relay_state gauge.
const (
	StateStarting      = "starting"
	StateStreaming     = "streaming"
	StateBackpressured = "backpressured"
	StateRetrying      = "retrying"
	StateWaitingSlot   = "waiting_for_slot"
	StateStopping      = "stopping"
)

// Paths of the catch_up_switches_total counter: the relay switched to it.
const (
	CatchUpTo = "catch_up"
	StreamTo  = "stream"
)

// States lists every relay state, in the order they are exported.
var States = []string{StateStarting, StateStreaming, StateBackpressured, StateRetrying, StateWaitingSlot, StateStopping}

// WALStatuses lists the slot_wal_status values: pg_replication_slots.wal_status,
// and "missing" when the slot does not exist.
var WALStatuses = []string{"reserved", "extended", "unreserved", "lost", "missing"}

// SetWALStatus marks status as the slot's current wal_status.
func (m *Metrics) SetWALStatus(status string) {
	for _, s := range WALStatuses {
		v := 0.0
		if s == status {
			v = 1
		}
		m.SlotWALStatus.WithLabelValues(s).Set(v)
	}
}

// SlotHealth is what pg_replication_slots says of the slot's health beyond
// wal_status, as SetSlotHealth exports it; the zero value (nil pointers, ""
// and zero time) is "the server does not say".
type SlotHealth struct {
	// SafeWALSize is safe_wal_size: WAL that may still be written before the
	// slot needs more than max_slot_wal_keep_size keeps; nil without a limit.
	SafeWALSize *int64
	// WALKeepSize is max_slot_wal_keep_size in bytes, -1 when off.
	WALKeepSize int64
	// Conflicting is conflicting (PostgreSQL 16+); nil below.
	Conflicting *bool
	// InvalidReason is why Postgres invalidated the slot, "" while valid.
	InvalidReason string
	// InactiveSince is inactive_since (17+); zero while in use or below 17.
	InactiveSince time.Time
}

// SetSlotHealth exports h. A fact the server does not report (a column its
// version lacks, no WAL limit, a slot in use) has no series, rather than a
// value that would look like a measurement; the invalidation reason is one
// series set to 1 while the slot is invalidated, none while it is valid.
func (m *Metrics) SetSlotHealth(h SlotHealth) {
	set := func(g *prometheus.GaugeVec, ok bool, v float64) {
		if !ok {
			g.Reset()
			return
		}
		g.WithLabelValues().Set(v)
	}
	var safe float64
	if h.SafeWALSize != nil {
		safe = float64(*h.SafeWALSize)
	}
	set(m.SlotSafeWALSize, h.SafeWALSize != nil, safe)
	set(m.SlotWALKeepSize, h.WALKeepSize >= 0, float64(h.WALKeepSize))
	conflicting := 0.0
	if h.Conflicting != nil && *h.Conflicting {
		conflicting = 1
	}
	set(m.SlotConflicting, h.Conflicting != nil, conflicting)
	set(m.SlotInactiveSince, !h.InactiveSince.IsZero(), float64(h.InactiveSince.UnixNano())/1e9)
	m.SlotInvalidated.Reset()
	if h.InvalidReason != "" {
		m.SlotInvalidated.WithLabelValues(h.InvalidReason).Set(1)
	}
}

// Metrics holds the relay's collectors. Components that are not given one use
// Discard().
type Metrics struct {
	EventsPublished *prometheus.CounterVec // by topic
	// TableEvents counts the events of each outbox table the relay is done
	// with, by table (schema.table; "" for message-outbox events) and
	// result (TableResultPublished, TableResultDeadLettered).
	TableEvents      *prometheus.CounterVec
	BytesPublished   *prometheus.CounterVec // by topic
	ProduceBatches   prometheus.Counter
	ProduceBatchSize prometheus.Histogram
	ProduceLatency   prometheus.Histogram
	EndToEndLatency  prometheus.Histogram
	// ReadLatency and QueueLatency split EndToEndLatency before the produce
	// request (ProduceLatency): commit → the event handed to the producer
	// (the walsender's decoding, the network, the relay's read and decode),
	// then → its produce request sent (batching, and waiting for the
	// partition's request in flight). Per batch, its oldest event.
	ReadLatency       prometheus.Histogram
	QueueLatency      prometheus.Histogram
	ProduceRetries    prometheus.Counter
	ProduceErrors     *prometheus.CounterVec // by class
	PermanentFailures *prometheus.CounterVec // by code
	ConfirmedLSN      prometheus.Gauge
	ReceivedLSN       prometheus.Gauge
	ServerWALEnd      prometheus.Gauge
	LagBytes          prometheus.Gauge
	LagSeconds        prometheus.Gauge
	InFlightEvents    prometheus.Gauge
	InFlightBytes     prometheus.Gauge
	// OldestUnrelayedAge is the age of the oldest committed outbox row
	// Kafka has not acknowledged yet (0 when nothing waits).
	OldestUnrelayedAge prometheus.Gauge
	// OutboxWait is the time from an outbox row's insert (its created-at
	// column, else its commit) to Kafka's acknowledgement, by event type; see
	// ObserveOutboxWait.
	OutboxWait *prometheus.HistogramVec
	waitTypes  *waitTypes
	Reconnects prometheus.Counter
	// CatchUpSwitches counts switches between the catch-up path (a backlog
	// read in batches through SQL) and the replication stream, by the path
	// switched to (CatchUpTo, StreamTo); CatchingUp is 1 while the relay
	// catches up; CatchUpBatches counts the batches; CatchUpRedecoded the
	// bytes of WAL the batches decoded again before their first row (from
	// the slot's restart point to its confirmed position).
	CatchUpSwitches  *prometheus.CounterVec
	CatchingUp       prometheus.Gauge
	CatchUpBatches   prometheus.Counter
	CatchUpRedecoded prometheus.Counter
	CheckpointSaves  prometheus.Counter
	CheckpointErrors prometheus.Counter
	// TrackerAnomalies counts acknowledgement-accounting misuse the tracker
	// ignored (checkpoint.Tracker.Anomalies): non-zero is a relay bug.
	TrackerAnomalies prometheus.Counter
	SlotProblems     *prometheus.CounterVec // by kind
	// DuplicatesSuppressed counts replayed events not sent again because the
	// same event from the same stream position is verifiably in Kafka.
	DuplicatesSuppressed prometheus.Counter
	// UnknownFateResent counts events re-sent after an attempt whose outcome is
	// unknown (timeout, connection lost): the idempotent producer makes the
	// broker drop the copy when the first attempt was appended.
	UnknownFateResent prometheus.Counter
	// OutOfOrderBehind counts batches the broker refused with
	// OUT_OF_ORDER_SEQUENCE_NUMBER because a batch before them was not
	// appended (it failed, or was refused and split): they are re-sent in
	// order behind it; not a failure of their own.
	OutOfOrderBehind prometheus.Counter
	// DeliveryFallbacks counts, by reason, the times effectively-once delivery
	// fell back to sending events it could not prove are in Kafka.
	DeliveryFallbacks *prometheus.CounterVec
	// ReconcileDuration is how long reading the partitions took before
	// (re)starting the stream.
	ReconcileDuration prometheus.Histogram
	BackfilledEvents  *prometheus.CounterVec // by kind of slot loss
	CircuitState      prometheus.Gauge       // 0 closed, 1 open, 2 half-open
	SlotRetainedWAL   prometheus.Gauge
	SlotWALStatus     *prometheus.GaugeVec // by status, 1 for the current one
	// SlotSafeWALSize, SlotWALKeepSize, SlotConflicting, SlotInactiveSince
	// (no labels) and SlotInvalidated (by reason) are set by SetSlotHealth.
	SlotSafeWALSize   *prometheus.GaugeVec
	SlotWALKeepSize   *prometheus.GaugeVec
	SlotConflicting   *prometheus.GaugeVec
	SlotInactiveSince *prometheus.GaugeVec
	SlotInvalidated   *prometheus.GaugeVec
	Heartbeats        *prometheus.CounterVec // by result
	DeadLetters       *prometheus.CounterVec // by code
	DeadLetterBacklog prometheus.Gauge
	// DeadLettersByStatus is the dead-letter table's letters by status
	// (deadletter.Statuses), read with the backlog.
	DeadLettersByStatus *prometheus.GaugeVec
	// DeadLetterRetries counts the attempts of the automatic retries
	// (dead_letters.auto_retry) by result: the status the letter went to
	// (DeadLetterRetryResults).
	DeadLetterRetries *prometheus.CounterVec
	// DeadLettersDead counts letters the automatic retries gave up on
	// (status dead): they need an operator.
	DeadLettersDead prometheus.Counter
	// TraceContextInvalid counts events whose tracing column held no valid
	// trace context: they went out without traceparent/tracestate headers.
	TraceContextInvalid prometheus.Counter
	// TraceSpans counts the relay's own spans (operations.otel_exporter otlp) by the
	// result of their export: exported (the receiver accepted them) or
	// failed (dropped after the exporter's retries, or rejected by the receiver).
	TraceSpans *prometheus.CounterVec
	// OutboxUpdates counts UPDATEs of outbox rows the relay saw with
	// delivery.on_outbox_update warn, error or fatal.
	OutboxUpdates prometheus.Counter
	// MessagesNonTransactional counts non-transactional logical decoding
	// messages with the message outbox's prefix: they escape rollbacks, so
	// the relay never publishes them.
	MessagesNonTransactional prometheus.Counter
	Replays                  *prometheus.CounterVec // by kind, result
	// ReplayHistoryEvents is the replay history's events by kind and
	// result: every replay's, whichever process ran it (cdc-relay replay and
	// dlq replay run in their own).
	ReplayHistoryEvents *prometheus.GaugeVec
	State               *prometheus.GaugeVec // by state, 1 for the current one
	// Source is 1 for the role of the server the relay decodes on
	// (primary or standby), 0 for the other.
	Source    *prometheus.GaugeVec
	BuildInfo *prometheus.GaugeVec // by version, goversion
}

// Results of TableEvents.
const (
	TableResultPublished    = "published"
	TableResultDeadLettered = "dead_lettered"
)

// New creates the collectors and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		EventsPublished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_published_total",
			Help: "Outbox events acknowledged by Kafka (acks=all).",
		}, []string{"topic"}),
		TableEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "table_events_total",
			Help: "Events of each outbox table the relay is done with: published (acknowledged by Kafka) or dead_lettered; table is schema.table, empty for message-outbox events.",
		}, []string{"table", "result"}),
		BytesPublished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "bytes_published_total",
			Help: "Payload bytes of outbox events acknowledged by Kafka.",
		}, []string{"topic"}),
		ProduceBatches: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "produce_batches_total",
			Help: "Partition batches acknowledged by Kafka.",
		}),
		ProduceBatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "produce_batch_events",
			Help:    "Events per acknowledged partition batch.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9),
		}),
		ProduceLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "produce_latency_seconds",
			Help:    "Time from sending a produce request to its acknowledgement (successful attempts).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		EndToEndLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "end_to_end_latency_seconds",
			Help:    "Time from the Postgres commit of an event's transaction to Kafka's acknowledgement (per batch, oldest event).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		ReadLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "event_read_latency_seconds",
			Help:    "Time from the Postgres commit of an event's transaction to the relay handing the event to its producer: the walsender's decoding, the network, the relay's read and decode (per acknowledged batch, oldest event).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 17),
		}),
		QueueLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "event_queue_latency_seconds",
			Help:    "Time from the producer taking an event to sending the produce request that was acknowledged: batching, and waiting for the partition's request in flight and for retries (per acknowledged batch, oldest event).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 17),
		}),
		ProduceRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "produce_retries_total",
			Help: "Partition batches whose produce attempt failed transiently and were retried.",
		}),
		ProduceErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "produce_errors_total",
			Help: "Failed partition batches (transient) and events (permanent), by error class.",
		}, []string{"class"}),
		PermanentFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "permanent_failures_total",
			Help: "Events that failed permanently, by error code.",
		}, []string{"code"}),
		ConfirmedLSN: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "confirmed_lsn",
			Help: "LSN confirmed to the replication slot and the checkpoint store (as a number).",
		}),
		ReceivedLSN: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "received_lsn",
			Help: "Highest WAL position received from the replication stream.",
		}),
		ServerWALEnd: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "server_wal_end_lsn",
			Help: "Server WAL end reported by the last keepalive or data message.",
		}),
		LagBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "replication_lag_bytes",
			Help: "Server WAL end minus the confirmed LSN: WAL the slot retains for the relay.",
		}),
		LagSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "replication_lag_seconds",
			Help: "Now minus the commit time of the newest fully published transaction (0 when caught up and idle).",
		}),
		InFlightEvents: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "in_flight_events",
			Help: "Events read from the slot and not yet acknowledged by Kafka.",
		}),
		InFlightBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "in_flight_bytes",
			Help: "Bytes of events read from the slot and not yet acknowledged by Kafka.",
		}),
		OldestUnrelayedAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "oldest_unrelayed_event_age_seconds",
			Help: "Age of the oldest committed outbox row not yet acknowledged by Kafka (since its commit); 0 when nothing waits.",
		}),
		OutboxWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "outbox_wait_seconds",
			Help:    "Time from an outbox row's insert (outbox.columns.created_at, else its commit) to Kafka's acknowledgement, by event type (at most " + strconv.Itoa(MaxEventTypeLabels) + " types; the rest are \"" + OtherEventType + "\").",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
		}, []string{"event_type"}),
		waitTypes: &waitTypes{m: map[string]prometheus.Observer{}},
		Reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "replication_reconnects_total",
			Help: "Times the replication connection was re-established after a failure.",
		}),
		CatchUpSwitches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "catch_up_switches_total",
			Help: "Switches between reading a backlog in batches (to=\"catch_up\": pg_logical_slot_peek_binary_changes, source.catch_up_threshold_mib) and the replication stream (to=\"stream\").",
		}, []string{"to"}),
		CatchingUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "catching_up",
			Help: "1 while the relay reads a backlog in batches instead of streaming it, else 0.",
		}),
		CatchUpBatches: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "catch_up_batches_total",
			Help: "Batches of a backlog read through pg_logical_slot_peek_binary_changes.",
		}),
		CatchUpRedecoded: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "catch_up_redecoded_bytes_total",
			Help: "WAL the catch-up batches decoded again before their first row: each decodes from the slot's restart point, which moves only at running-transactions records and stays before the oldest open transaction.",
		}),
		CheckpointSaves: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "checkpoint_saves_total",
			Help: "Checkpoints persisted to the store.",
		}),
		CheckpointErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "checkpoint_errors_total",
			Help: "Failed attempts to persist a checkpoint.",
		}),
		TrackerAnomalies: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "tracker_anomalies_total",
			Help: "Acknowledgement-accounting misuse the checkpoint tracker ignored; non-zero is a relay bug (the watermark never moved past it).",
		}),
		DuplicatesSuppressed: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "duplicates_suppressed_total",
			Help: "Replayed events not sent again: the same event from the same source position is already in Kafka.",
		}),
		UnknownFateResent: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "unknown_fate_resent_total",
			Help: "Events re-sent after a produce attempt whose outcome was unknown (timeout, connection lost); the idempotent producer lets the broker drop a copy.",
		}),
		OutOfOrderBehind: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "produce_out_of_order_behind_total",
			Help: "Partition batches the broker answered OUT_OF_ORDER_SEQUENCE_NUMBER because a batch before them was not appended (failed, or refused and split); re-sent in order behind it, not counted as produce errors.",
		}),
		DeliveryFallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "delivery_fallbacks_total",
			Help: "Times effectively-once delivery fell back to at-least-once (sending events it could not prove are in Kafka), by reason.",
		}, []string{"reason"}),
		ReconcileDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "reconciliation_duration_seconds",
			Help:    "Time spent reading Kafka partitions to find events already delivered, before (re)starting the stream.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
		SlotProblems: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "slot_problems_total",
			Help: "Gaps that stop the relay, by the check that found them (internal/gaps): slot/checkpoint mismatches at start (slot missing, lost, ahead, system changed), a slot invalidated while streaming (slot_lost), a publication that no longer covers the outbox table.",
		}, []string{"kind"}),
		BackfilledEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "backfilled_events_total",
			Help: "Outbox rows republished by delivery.on_slot_loss=backfill after the slot was lost, dropped or moved, by kind.",
		}, []string{"kind"}),
		CircuitState: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "circuit_state",
			Help: "Kafka circuit breaker: 0 closed (producing), 1 open (replication reading paused), 2 half-open (probing).",
		}),
		SlotRetainedWAL: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "slot_retained_wal_bytes",
			Help: "WAL the server keeps for the slot: pg_current_wal_lsn() - restart_lsn (from pg_replication_slots).",
		}),
		SlotWALStatus: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "slot_wal_status",
			Help: "1 for the slot's wal_status (reserved, extended, unreserved, lost; missing when the slot is gone).",
		}, []string{"status"}),
		SlotSafeWALSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "slot_safe_wal_size_bytes",
			Help: "pg_replication_slots.safe_wal_size: WAL the server may still write before the slot needs more than max_slot_wal_keep_size keeps (negative past it, wal_status unreserved); absent without a limit.",
		}, nil),
		SlotWALKeepSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "slot_wal_keep_size_bytes",
			Help: "The server's max_slot_wal_keep_size in bytes; absent when it is -1 (no limit).",
		}, nil),
		SlotConflicting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "slot_conflicting",
			Help: "pg_replication_slots.conflicting: 1 when the logical slot was invalidated by a conflict with recovery on a standby; absent below PostgreSQL 16.",
		}, nil),
		SlotInactiveSince: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "slot_inactive_since_timestamp_seconds",
			Help: "pg_replication_slots.inactive_since as a Unix time: when the slot was last released; absent while it is in use and below PostgreSQL 17.",
		}, nil),
		SlotInvalidated: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "slot_invalidated",
			Help: "1 while Postgres has invalidated the slot, by reason (invalidation_reason on 17+: wal_removed, rows_removed, wal_level_insufficient, idle_timeout; wal_removed for wal_status lost and conflict for conflicting before); no series while the slot is valid.",
		}, []string{"reason"}),
		Heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "heartbeats_total",
			Help: "Heartbeat writes (pg_logical_emit_message) to keep an idle database's slot moving, by result.",
		}, []string{"result"}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "dead_letters_total",
			Help: "Events stored in the dead-letter table, by error code.",
		}, []string{"code"}),
		DeadLetterBacklog: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "dead_letter_backlog",
			Help: "Dead letters not completed yet (pending, processing, retry_wait or dead), read from the dead-letter table.",
		}),
		DeadLettersByStatus: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "dead_letters_by_status",
			Help: "Dead letters in the dead-letter table by status (pending, processing, retry_wait, completed, dead).",
		}, []string{"status"}),
		DeadLetterRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "dead_letter_retries_total",
			Help: "Attempts of the automatic dead-letter retries (dead_letters.auto_retry), by result: completed, retry_wait (failed, retried later) or dead (failed, budget spent).",
		}, []string{"result"}),
		DeadLettersDead: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "dead_letters_dead_total",
			Help: "Dead letters the automatic retries gave up on (status dead, after dead_letters.auto_retry.budget attempts or dead_letters.auto_retry.max_age); an operator must fix and replay or purge them.",
		}),
		TraceContextInvalid: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "trace_context_invalid_total",
			Help: "Events whose tracing column (outbox.columns.tracing) was neither a W3C traceparent nor Debezium's properties text; they were published without trace headers.",
		}),
		TraceSpans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "trace_spans_total",
			Help: "Spans of published events exported over OTLP with operations.otel_exporter=otlp, by result: exported (the receiver accepted them) or failed (dropped after the exporter's retries, or rejected by the receiver; the events are not affected).",
		}, []string{"result"}),
		OutboxUpdates: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "outbox_updates_total",
			Help: "UPDATEs of outbox rows seen with delivery.on_outbox_update warn, error or fatal; nothing is published for them.",
		}),
		MessagesNonTransactional: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "messages_non_transactional_total",
			Help: "Non-transactional logical decoding messages with the messages.prefix prefix; they escape rollbacks, so they are never published.",
		}),
		Replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "replayed_events_total",
			Help: "Events republished by replays, by kind (dlq, outbox) and result.",
		}, []string{"kind", "result"}),
		ReplayHistoryEvents: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "replay_history_events",
			Help: "Events of all replays in the replay history (cdc-relay replay, dlq replay, the relay's backfills and snapshots), by kind (dlq, outbox) and result (published, skipped, failed); it only grows while the history is kept.",
		}, []string{"kind", "result"}),
		State: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "state",
			Help: "1 for the relay's current state, 0 for the others.",
		}, []string{"state"}),
		Source: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "source",
			Help: "1 for the role of the server the relay decodes on (role: primary, or standby with source.primary_pg_url for writes), 0 for the other.",
		}, []string{"role"}),
		BuildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "build_info",
			Help: "Always 1; labels carry the relay version and Go version.",
		}, []string{"version", "goversion"}),
	}
	reg.MustRegister(
		m.EventsPublished, m.TableEvents, m.BytesPublished, m.ProduceBatches, m.ProduceBatchSize,
		m.ProduceLatency, m.EndToEndLatency, m.ReadLatency, m.QueueLatency, m.ProduceRetries, m.ProduceErrors,
		m.PermanentFailures, m.ConfirmedLSN, m.ReceivedLSN, m.ServerWALEnd, m.LagBytes,
		m.LagSeconds, m.InFlightEvents, m.InFlightBytes, m.Reconnects, m.CheckpointSaves,
		m.CatchUpSwitches, m.CatchingUp, m.CatchUpBatches, m.CatchUpRedecoded,
		m.CheckpointErrors, m.TrackerAnomalies, m.DuplicatesSuppressed, m.UnknownFateResent, m.OutOfOrderBehind,
		m.DeliveryFallbacks, m.ReconcileDuration, m.SlotProblems, m.BackfilledEvents, m.State, m.Source, m.BuildInfo,
		m.CircuitState, m.DeadLetters, m.DeadLetterBacklog, m.DeadLettersByStatus, m.DeadLetterRetries,
		m.DeadLettersDead, m.Replays, m.ReplayHistoryEvents,
		m.SlotRetainedWAL, m.SlotWALStatus, m.Heartbeats,
		m.SlotSafeWALSize, m.SlotWALKeepSize, m.SlotConflicting, m.SlotInactiveSince, m.SlotInvalidated, m.TraceContextInvalid, m.TraceSpans, m.OutboxUpdates, m.MessagesNonTransactional,
		m.OldestUnrelayedAge, m.OutboxWait,
	)
	for _, s := range States {
		m.State.WithLabelValues(s).Set(0)
	}
	for _, s := range WALStatuses {
		m.SlotWALStatus.WithLabelValues(s).Set(0)
	}
	m.Heartbeats.WithLabelValues("ok")
	m.Heartbeats.WithLabelValues("error")
	m.TraceSpans.WithLabelValues("exported")
	m.TraceSpans.WithLabelValues("failed")
	m.CatchUpSwitches.WithLabelValues(CatchUpTo)
	m.CatchUpSwitches.WithLabelValues(StreamTo)
	m.ProduceErrors.WithLabelValues("transient")
	m.ProduceErrors.WithLabelValues("permanent")
	for _, r := range DeadLetterRetryResults {
		m.DeadLetterRetries.WithLabelValues(r)
	}
	return m
}

// MaxEventTypeLabels bounds the event_type label values of OutboxWait, so
// that an outbox with ever-new event types cannot grow the metrics without
// bound; later types are counted as OtherEventType.
const MaxEventTypeLabels = 200

// OtherEventType is the event_type label of the types past MaxEventTypeLabels.
const OtherEventType = "_other"

// waitTypes caches OutboxWait's observer per event type.
type waitTypes struct {
	mu    sync.Mutex
	m     map[string]prometheus.Observer
	other prometheus.Observer
}

// ObserveOutboxWait records that an event of eventType waited d from its
// insert until Kafka acknowledged it (see OutboxWait).
func (m *Metrics) ObserveOutboxWait(eventType []byte, d time.Duration) {
	m.OutboxWaitOf(eventType).Observe(d.Seconds())
}

// OutboxWaitOf returns OutboxWait's observer of eventType's events: the
// first MaxEventTypeLabels types seen get a series each, later ones share
// OtherEventType's. A caller observing many events of one type looks it up
// once for them all.
func (m *Metrics) OutboxWaitOf(eventType []byte) prometheus.Observer {
	w := m.waitTypes
	w.mu.Lock()
	defer w.mu.Unlock()
	if o, ok := w.m[string(eventType)]; ok {
		return o
	}
	if len(w.m) < MaxEventTypeLabels {
		o := m.OutboxWait.WithLabelValues(string(eventType))
		w.m[string(eventType)] = o
		return o
	}
	if w.other == nil {
		w.other = m.OutboxWait.WithLabelValues(OtherEventType)
	}
	return w.other
}

// DeadLetterRetryResults are the result labels of dead_letter_retries_total:
// the status an attempt of the automatic retries left the letter in.
var DeadLetterRetryResults = []string{"completed", "retry_wait", "dead"}

// DeadLetterStatuses are the status labels of dead_letters_by_status, the
// statuses of deadletter's state model (metrics imports no other package).
var DeadLetterStatuses = []string{"pending", "processing", "retry_wait", "completed", "dead"}

// SetState marks state as the current relay state.
func (m *Metrics) SetState(state string) {
	for _, s := range States {
		v := 0.0
		if s == state {
			v = 1
		}
		m.State.WithLabelValues(s).Set(v)
	}
}

// SetSource marks role ("primary" or "standby") as the role of the server
// the relay decodes on.
func (m *Metrics) SetSource(role string) {
	for _, r := range []string{"primary", "standby"} {
		v := 0.0
		if r == role {
			v = 1
		}
		m.Source.WithLabelValues(r).Set(v)
	}
}

// Discard returns metrics registered on a private registry, for callers that do
// not export them.
func Discard() *Metrics { return New(prometheus.NewRegistry()) }
