package deadletter

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// Extra headers FromEvent copies into their own columns when an event has them
// (see outbox.header_columns).
const (
	HeaderCorrelationID = "correlation_id"
	HeaderSchemaVersion = "schema_version"
)

// FromEvent returns the dead letter of ev, which failed permanently with cause
// on its way to topic. Headers holds every header the message carries (the
// sink's id, event_type, aggregate_type, commit_lsn and commit_time, and the
// event's extra headers), and PayloadType the event's, so a replay can
// publish the same message in every format. The error
// code is sink.Code(cause). RelayName is left for the caller. An event whose
// id is NULL or empty gets an EventID made from its content (see noIDEventID),
// so that it can be stored; its "id" header stays empty.
func FromEvent(ev *outbox.Event, topic string, cause error) Letter {
	h := make(map[string]string, 5+len(ev.Headers))
	for _, x := range ev.Headers {
		h[x.Key] = string(x.Value)
	}
	h[sink.HeaderID] = string(ev.ID)
	h[sink.HeaderEventType] = string(ev.EventType)
	h[sink.HeaderAggregateType] = string(ev.AggregateType)
	h[sink.HeaderCommitLSN] = ev.CommitLSN.String()
	if !ev.CommitTime.IsZero() {
		h[sink.HeaderCommitTime] = ev.CommitTime.UTC().Format(time.RFC3339Nano)
	}
	id := string(ev.ID)
	if id == "" {
		id = noIDEventID(ev)
	}
	l := Letter{
		EventID:       id,
		AggregateType: string(ev.AggregateType),
		AggregateID:   textOf(ev.AggregateID),
		EventType:     string(ev.EventType),
		Key:           bytes.Clone(ev.AggregateID),
		Payload:       bytes.Clone(ev.Payload),
		Headers:       h,
		PayloadType:   ev.PayloadType,
		Topic:         topic,
		ErrorCode:     sink.Code(cause),
		CorrelationID: h[HeaderCorrelationID],
		SchemaVersion: h[HeaderSchemaVersion],
		CommitLSN:     ev.CommitLSN,
		Status:        StatusPending,
	}
	if ev.Table != "" {
		l.SourceTable = ev.Schema + "." + ev.Table
	}
	if cause != nil {
		l.ErrorMessage = cause.Error()
	}
	return l
}

// textOf returns b as the text of a text column: b itself when it is valid
// UTF-8 without NUL bytes, otherwise (a bytea key's raw bytes) Postgres's hex
// form "\x…", which text accepts and operators can read and filter by. The
// message key itself is stored as bytes (Letter.Key) and replayed as such.
func textOf(b []byte) string {
	if utf8.Valid(b) && bytes.IndexByte(b, 0) < 0 {
		return string(b)
	}
	return `\x` + hex.EncodeToString(b)
}

// Recorder returns the function the relay's dlq failure policy calls for each
// event it gives up on: it stores the event's dead letter (FromEvent, with the
// topic the relay routed it to) for relay relayName and returns nil once it
// is committed. It is safe for concurrent use; its type is
// relay.DeadLetterFunc's.
func (s *Store) Recorder(relayName string) func(ctx context.Context, ev *outbox.Event, topic string, cause error) error {
	return func(ctx context.Context, ev *outbox.Event, topic string, cause error) error {
		l := FromEvent(ev, topic, cause)
		l.RelayName = relayName
		return s.Add(ctx, l)
	}
}

// noIDEventID names the dead letter of an event without an id: "no-id:" and
// the commit LSN, then a hash of everything else the event carries. It is the
// same when the event is delivered again after a crash (the letter is updated,
// not duplicated), and differs between events unless they are byte for byte
// the same and in one transaction (those share one letter, whose retry_count
// counts the copies).
func noIDEventID(ev *outbox.Event) string {
	h := sha256.New()
	field := func(b []byte) {
		n := int64(len(b))
		if b == nil {
			n = -1 // NULL differs from empty
		}
		_ = binary.Write(h, binary.BigEndian, n)
		h.Write(b)
	}
	for _, b := range [][]byte{ev.AggregateType, ev.AggregateID, ev.EventType, ev.Payload} {
		field(b)
	}
	for _, x := range ev.Headers {
		field([]byte(x.Key))
		field(x.Value)
	}
	return fmt.Sprintf("no-id:%s:%x", ev.CommitLSN, h.Sum(nil)[:8])
}
