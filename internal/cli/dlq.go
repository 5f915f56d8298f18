package cli

import (
	"encoding/base64"
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
)

// DLQCmd is "cdc-relay dlq": the dead-letter store's commands.
type DLQCmd struct {
	List    DLQListCmd    `cmd:"" help:"List dead letters, with a summary per error code."`
	Show    DLQShowCmd    `cmd:"" help:"Show dead letters (by id or event id) with every field and their payload."`
	Replay  DLQReplayCmd  `cmd:"" help:"Publish dead letters again to their topic (or --topic), keeping their event id; concurrent replays never publish a letter twice."`
	Purge   DLQPurgeCmd   `cmd:"" help:"Delete old dead letters."`
	History DLQHistoryCmd `cmd:"" help:"List past replays (dlq and outbox), the results of one, or the letters' state transitions."`
}

// letterJSON is a dead letter in JSON output. Key and payload are strings or
// JSON when they can be, base64 otherwise.
type letterJSON struct {
	ID            int64             `json:"id"`
	EventID       string            `json:"event_id"`
	AggregateType string            `json:"aggregate_type"`
	AggregateID   string            `json:"aggregate_id"`
	EventType     string            `json:"event_type"`
	Key           *string           `json:"key"` // null: no key
	KeyBase64     string            `json:"key_base64,omitempty"`
	Payload       json.RawMessage   `json:"payload,omitempty"` // when it is JSON
	PayloadBase64 string            `json:"payload_base64,omitempty"`
	Headers       map[string]string `json:"headers"`
	Topic         string            `json:"topic"`
	ErrorCode     string            `json:"error_code"`
	ErrorMessage  string            `json:"error_message"`
	RetryCount    int               `json:"retry_count"`
	FirstFailedAt time.Time         `json:"first_failed_at"`
	LastFailedAt  time.Time         `json:"last_failed_at"`
	RelayName     string            `json:"relay_name"`
	CorrelationID string            `json:"correlation_id,omitempty"`
	SchemaVersion string            `json:"schema_version,omitempty"`
	CommitLSN     string            `json:"commit_lsn,omitempty"`
	SourceTable   string            `json:"source_table,omitempty"`
	Status        string            `json:"status"`
	ReplayedAt    *time.Time        `json:"replayed_at"`
	ReplayCount   int               `json:"replay_count"`
	Attempts      int               `json:"attempts"`
	NextAttemptAt *time.Time        `json:"next_attempt_at"`
	LastAttemptAt *time.Time        `json:"last_attempt_at"`
	LastError     string            `json:"last_attempt_error,omitempty"`
	ClaimedBy     string            `json:"claimed_by,omitempty"`
	ClaimedUntil  *time.Time        `json:"claimed_until"`
}

// toJSON is l as dlq list and dlq show print it with --json.
func toJSON(l deadletter.Letter) letterJSON {
	j := letterJSON{
		ID: l.ID, EventID: l.EventID, AggregateType: l.AggregateType, AggregateID: l.AggregateID,
		EventType: l.EventType, Headers: l.Headers, Topic: l.Topic, ErrorCode: l.ErrorCode,
		ErrorMessage: l.ErrorMessage, RetryCount: l.RetryCount, FirstFailedAt: l.FirstFailedAt.UTC(),
		LastFailedAt: l.LastFailedAt.UTC(), RelayName: l.RelayName, CorrelationID: l.CorrelationID,
		SchemaVersion: l.SchemaVersion, SourceTable: l.SourceTable, Status: l.Status, ReplayCount: l.ReplayCount,
		Attempts: l.Attempts, NextAttemptAt: utc(l.NextAttemptAt), LastAttemptAt: utc(l.LastAttemptAt),
		LastError: l.LastAttemptError, ClaimedBy: l.ClaimedBy, ClaimedUntil: utc(l.ClaimedUntil),
	}
	if l.Key != nil {
		if utf8.Valid(l.Key) {
			k := string(l.Key)
			j.Key = &k
		} else {
			j.KeyBase64 = base64.StdEncoding.EncodeToString(l.Key)
		}
	}
	if json.Valid(l.Payload) {
		j.Payload = json.RawMessage(l.Payload)
	} else {
		j.PayloadBase64 = base64.StdEncoding.EncodeToString(l.Payload)
	}
	if l.CommitLSN != 0 {
		j.CommitLSN = l.CommitLSN.String()
	}
	j.ReplayedAt = utc(l.ReplayedAt)
	if j.Headers == nil {
		j.Headers = map[string]string{}
	}
	return j
}

// utc is t in UTC, nil for nil.
func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
