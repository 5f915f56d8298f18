// Package outbox holds the domain type that flows through the relay: one committed
// row of the outbox table, decoded from the replication stream and published to Kafka.
package outbox

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/jackc/pglogrepl"
)

// Headers the relay derives from the outbox row itself (decoder.Format): they
// are reserved, as the sink's own headers are, and cannot be the target of a
// header column.
const (
	// HeaderContentType is the payload's MIME type (outbox.content_type).
	HeaderContentType = "content-type"
	// HeaderTraceParent and HeaderTraceState carry the W3C trace context of
	// the tracing column (outbox.columns.tracing).
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// Header is one extra Kafka header taken from an outbox column.
type Header struct {
	Key   string
	Value []byte
}

// PayloadType is what an event's payload bytes are.
type PayloadType uint8

// Payload types. The zero value is text, what any column type but those below
// gives.
const (
	// PayloadText is the text form of a column (text, varchar, xml, …).
	PayloadText PayloadType = iota
	// PayloadJSON is a JSON document: a json or jsonb column, or an envelope
	// (outbox.envelope_columns), which is always valid JSON.
	PayloadJSON
	// PayloadBinary is raw bytes: a bytea column, decoded.
	PayloadBinary
)

// String is the type's name: text, json or binary.
func (t PayloadType) String() string {
	switch t {
	case PayloadJSON:
		return "json"
	case PayloadBinary:
		return "binary"
	}
	return "text"
}

// ParsePayloadType reads a name String returns; anything else is text.
func ParsePayloadType(s string) PayloadType {
	switch s {
	case "json":
		return PayloadJSON
	case "binary":
		return PayloadBinary
	}
	return PayloadText
}

// Event is one committed INSERT into the outbox table, or one committed
// logical decoding message of the message outbox (MessagePrefix).
//
// The byte slices hold the text form of each column as Postgres sent it, except
// that a bytea payload or aggregate id holds its raw bytes (decoder.Format);
// nil means SQL NULL. They usually share one backing allocation owned by the Event, so a
// consumer must not append to them.
type Event struct {
	ID            []byte // event id: the downstream idempotency key
	AggregateType []byte
	AggregateID   []byte // Kafka message key
	EventType     []byte
	Payload       []byte // Kafka message value, as stored (JSON text for jsonb, raw bytes for bytea)
	Headers       []Header
	// Values is the buffer the decoder copied the row's values into, which
	// the byte slices above share unless something replaced them; nil for
	// events built elsewhere. decoder.(*Decoder).Recycle takes it back for
	// reuse once the event is done.
	Values []byte
	// PayloadType says what Payload holds, as its column's type tells
	// (decoder.Format); the structured CloudEvents format writes it
	// accordingly.
	PayloadType PayloadType

	// Timestamp is the Kafka record timestamp taken from the outbox row
	// (outbox.columns.timestamp); zero means none, and the record gets the time
	// the sink builds its batch.
	Timestamp time.Time
	// TargetPartition is the Kafka partition the outbox row names
	// (outbox.columns.partition), when HasTargetPartition; otherwise the sink
	// picks the partition by key. The sink fails an event whose partition
	// the topic does not have (code "invalid_partition").
	TargetPartition    int64
	HasTargetPartition bool

	XID        uint32
	CommitLSN  pglogrepl.LSN // LSN of the commit record of the event's transaction
	CommitTime time.Time
	// CreatedAt is the row's insert time (outbox.columns.created_at) when the
	// table has that column; zero otherwise. The outbox wait time is
	// measured from it (from CommitTime without it).
	CreatedAt time.Time

	// Index is the event's position among the inserts and messages of its
	// transaction that the stream carried, from 0: the decoder counts them as
	// it decodes the transaction, the inserts it skips included (rows of a
	// table the relay judges not an outbox's). So an event keeps its place
	// when a row before it is judged otherwise on a later run (a former
	// partition's row skipped on one run and dead-lettered on the next), and
	// the reconciler still finds it in Kafka. With a publication of outbox
	// tables only, it is the event's place among the outbox events. With CommitLSN it is the event's place in the source; a
	// sink writes that place beside the event (see Origin.AppendPosition),
	// with the Origin of the stream, which the decoder does not know. Events
	// built elsewhere (replays, backfills) leave it 0 and carry no position.
	Index uint32

	// Schema and Table name the outbox table the row was inserted into (the
	// partitioned table, when the row landed in one of its partitions), as
	// the relay was configured with it; "" for a message-outbox event and
	// for events built where no table is known.
	Schema, Table string

	// MessagePrefix is the prefix of the logical decoding message the event
	// came from (pg_logical_emit_message, messages.prefix), "" for an
	// outbox row. Such an event has no table: it exists only in the WAL, so
	// a snapshot, a backfill or a replay from the table never sees it.
	MessagePrefix string

	// Nothing below the decoder writes to an Event: what later stages learn
	// of it (the relay's transaction sequence, the topic, where Kafka stored
	// it, the trace span) they keep in their own values beside it
	// (sink.Message, sink.Stored, the relay's per-event record).
}

// Size is the number of bytes the event's values hold, plus a little: what
// it adds to a produce request (the sink's batch bounds count it).
func (e *Event) Size() int {
	n := len(e.ID) + len(e.AggregateType) + len(e.AggregateID) + len(e.EventType) + len(e.Payload)
	for _, h := range e.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n + 64
}

// Footprint is the heap the event costs while it is in flight: its values
// twice (as decoded, and encoded in a produce request until Kafka acknowledges
// it) and the Event itself with its headers. The relay's read-ahead bound
// counts it, so that delivery.max_in_flight_mib bounds memory, not only payload bytes.
func (e *Event) Footprint() int {
	// A reused value buffer may be somewhat larger than the values in it.
	slack := cap(e.Values) - len(e.Values)
	return 2*e.Size() + slack + int(unsafe.Sizeof(Event{})) + cap(e.Headers)*int(unsafe.Sizeof(Header{}))
}

// EventError is a permanent failure of one event (it will fail the same way on
// every retry), with a short stable code for metrics and dead letters.
type EventError struct {
	Code string // e.g. "message_too_large", "invalid_topic", "empty_key"
	Err  error
}

func (e *EventError) Error() string { return fmt.Sprintf("%s: %v", e.Code, e.Err) }
func (e *EventError) Unwrap() error { return e.Err }
