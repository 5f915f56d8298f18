package consumer

import (
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// Headers cdc-relay puts on every message, and the optional ones this package
// reads (the relay sets those from outbox columns mapped with
// --header-columns correlation_id,schema_version).
const (
	HeaderID            = "id" // the event id: the idempotency key
	HeaderEventType     = "event_type"
	HeaderAggregateType = "aggregate_type"
	HeaderCorrelationID = "correlation_id"
	HeaderSchemaVersion = "schema_version"
)

// Message is one Kafka record as the handler sees it.
type Message struct {
	// ID is the "id" header: the outbox event id, which the consumer claims
	// in processed_messages before calling the handler. Never empty in Run
	// (a record without one is dead-lettered with CodeMissingID).
	ID        string
	Topic     string
	Partition int
	Offset    int64
	Key       []byte // the aggregate id; nil for a null key
	Value     []byte // the outbox payload; nil for a null value (a tombstone)
	// Headers maps each header key to its value. Kafka allows a key more
	// than once; then the last value is here.
	Headers   map[string]string
	Timestamp time.Time // the record's timestamp (the relay's send time by default)
}

// Header returns the value of header key, "" when the message has none.
func (m Message) Header(key string) string { return m.Headers[key] }

// EventType returns the "event_type" header, e.g. "RewardGranted".
func (m Message) EventType() string { return m.Headers[HeaderEventType] }

// AggregateType returns the "aggregate_type" header, e.g. "player".
func (m Message) AggregateType() string { return m.Headers[HeaderAggregateType] }

// CorrelationID returns the "correlation_id" header, "" when the relay does
// not map such a column.
func (m Message) CorrelationID() string { return m.Headers[HeaderCorrelationID] }

// SchemaVersion returns the "schema_version" header, "" when the relay does
// not map such a column.
func (m Message) SchemaVersion() string { return m.Headers[HeaderSchemaVersion] }

// String names the message for logs: topic/partition@offset and the id.
func (m Message) String() string {
	return fmt.Sprintf("%s/%d@%d id=%q", m.Topic, m.Partition, m.Offset, m.ID)
}

// fromKafka converts a kafka-go message.
func fromKafka(km kafka.Message) Message {
	m := Message{
		Topic:     km.Topic,
		Partition: km.Partition,
		Offset:    km.Offset,
		Key:       km.Key,
		Value:     km.Value,
		Timestamp: km.Time,
	}
	if len(km.Headers) > 0 {
		m.Headers = make(map[string]string, len(km.Headers))
		for _, h := range km.Headers {
			m.Headers[h.Key] = string(h.Value)
		}
	}
	m.ID = m.Headers[HeaderID]
	return m
}

// claimID is the message_id the message is claimed and dead-lettered under:
// its ID (see claimKey), or for a message without one "no-id:" and its
// position, so that a redelivery of it finds the same dead letter.
func (m Message) claimID() string {
	if m.ID != "" {
		return claimKey(m.ID)
	}
	return claimKey(fmt.Sprintf("no-id:%s:%d:%d", m.Topic, m.Partition, m.Offset))
}
