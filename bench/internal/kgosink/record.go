package kgosink

// Records as sink.Kafka writes them, and the hooks kgo reports through.

import (
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// record returns m's record as sink.Kafka writes it in its default format
// (no CloudEvents): the key is the event's AggregateID, never null; the
// value its payload, null only for an empty payload with
// TombstoneOnEmptyPayload; the timestamp its Timestamp, or else the time
// kgo buffers it; the headers id, event_type, aggregate_type, commit_lsn,
// commit_time (RFC 3339 in UTC), then source_position for events read from
// the stream (m.Origin set), then the event's own, m.TraceParent replacing
// its traceparent. Partition is -1: the partitioner hashes the key.
//
// sink builds the same record into its own RecordBatch encoder (batch.go),
// which it does not export, so the few lines of what goes where are
// repeated here; TestRecordLikeSink compares the two on the wire.
func (k *Kafka) record(m sink.Message) *kgo.Record {
	ev := m.Event
	value := ev.Payload
	if len(value) == 0 {
		value = []byte{}
		if k.cfg.TombstoneOnEmptyPayload {
			value = nil
		}
	}
	hs := make([]kgo.RecordHeader, 0, 6+len(ev.Headers))
	hs = append(hs,
		kgo.RecordHeader{Key: sink.HeaderID, Value: ev.ID},
		kgo.RecordHeader{Key: sink.HeaderEventType, Value: ev.EventType},
		kgo.RecordHeader{Key: sink.HeaderAggregateType, Value: ev.AggregateType},
		kgo.RecordHeader{Key: sink.HeaderCommitLSN, Value: outbox.AppendLSN(nil, ev.CommitLSN)},
		kgo.RecordHeader{Key: sink.HeaderCommitTime, Value: ev.CommitTime.UTC().AppendFormat(nil, time.RFC3339Nano)},
	)
	if m.Origin != nil {
		hs = append(hs, kgo.RecordHeader{Key: sink.HeaderSource, Value: m.Origin.AppendPosition(nil, ev.CommitLSN, ev.Index)})
	}
	for _, h := range ev.Headers {
		v := h.Value
		if m.TraceParent != nil && h.Key == outbox.HeaderTraceParent {
			v = m.TraceParent
		}
		hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: v})
	}
	r := &kgo.Record{Topic: m.Topic, Key: ev.AggregateID, Value: value, Headers: hs, Partition: -1}
	if !ev.Timestamp.IsZero() {
		r.Timestamp = ev.Timestamp
	}
	return r
}

// partitioner places a record on its Partition when it is set (an event's
// TargetPartition; kgo fails a record whose partition the topic lacks),
// and otherwise as kgo's StickyKeyPartitioner does a keyed record: Kafka's
// Java murmur2 of the key, high bit masked, modulo the topic's partitions,
// which is what sink.Kafka's kafka.Murmur2Balancer{Consistent: true} picks.
type partitioner struct{ keyed kgo.Partitioner }

// ForTopic returns the partitioner of topic t.
func (p partitioner) ForTopic(t string) kgo.TopicPartitioner {
	return topicPartitioner{p.keyed.ForTopic(t)}
}

// topicPartitioner is partitioner for one topic.
type topicPartitioner struct{ keyed kgo.TopicPartitioner }

// RequiresConsistency is true: every record goes where its key says.
func (topicPartitioner) RequiresConsistency(*kgo.Record) bool { return true }

// Partition returns r's partition among n.
func (p topicPartitioner) Partition(r *kgo.Record, n int) int {
	if r.Partition >= 0 {
		return int(r.Partition)
	}
	return p.keyed.Partition(r, n)
}

// hooks feeds kgo's produce reports into the metrics and the circuit
// breaker.
type hooks struct{ k *Kafka }

var (
	_ kgo.HookProduceBatchWritten = hooks{}
	_ kgo.HookBrokerE2E           = hooks{}
)

// OnProduceBatchWritten counts a batch of a partition Kafka acknowledged.
func (h hooks) OnProduceBatchWritten(_ kgo.BrokerMetadata, _ string, _ int32, pm kgo.ProduceBatchMetrics) {
	h.k.m.ProduceBatches.Inc()
	h.k.m.ProduceBatchSize.Observe(float64(pm.NumRecords))
	h.k.breaker(true)
}

// OnBrokerE2E times each produce request, and counts one that failed (a
// connection lost, a timeout) as a retry.
func (h hooks) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e kgo.BrokerE2E) {
	if key != int16(kmsg.Produce) {
		return
	}
	if e.Err() != nil {
		h.k.m.ProduceErrors.WithLabelValues("transient").Inc()
		h.k.m.ProduceRetries.Inc()
		h.k.breaker(false)
		return
	}
	h.k.m.ProduceLatency.Observe(e.DurationE2E().Seconds())
}

// logger writes kgo's warnings and errors to the relay's log.
type logger struct{ log zerolog.Logger }

// Level is warnings and errors.
func (logger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

// Log writes one line of kgo's.
func (l logger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	e := l.log.Warn()
	if level == kgo.LogLevelError {
		e = l.log.Error()
	}
	e.Fields(keyvals).Msg("kgo: " + msg)
}
