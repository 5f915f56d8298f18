package deadletter

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// Extra headers FromEvent copies into their own columns when an event has them
// (see --header-columns).
const (
	HeaderCorrelationID = "correlation_id"
	HeaderSchemaVersion = "schema_version"
)

// HeaderReplay is the header a replay adds to every message it publishes: the
// replay's id in the history, so consumers and operators can tell a replay from
// the original delivery.
const HeaderReplay = "cdc_relay_replay"

// FromEvent returns the dead letter of ev, which failed permanently with cause
// on its way to topic. Headers holds every header the message carries (the
// sink's id, event_type, aggregate_type, commit_lsn and commit_time, and the
// event's extra headers), so a replay can publish the same message. The error
// code is sink.Code(cause). RelayName is left for the caller.
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
	l := Letter{
		EventID:       string(ev.ID),
		AggregateType: string(ev.AggregateType),
		AggregateID:   string(ev.AggregateID),
		EventType:     string(ev.EventType),
		Key:           bytes.Clone(ev.AggregateID),
		Payload:       bytes.Clone(ev.Payload),
		Headers:       h,
		Topic:         topic,
		ErrorCode:     sink.Code(cause),
		CorrelationID: h[HeaderCorrelationID],
		SchemaVersion: h[HeaderSchemaVersion],
		CommitLSN:     ev.CommitLSN,
		Status:        StatusPending,
	}
	if cause != nil {
		l.ErrorMessage = cause.Error()
	}
	return l
}

// Recorder returns the function the relay's dlq failure policy calls for each
// event it gives up on: it stores the event's dead letter (FromEvent, with the
// topic rendered from topicTemplate, or the template itself when the topic
// cannot be rendered) and returns nil once it is committed. It is safe for
// concurrent use; its type is relay.DeadLetterFunc's.
func (s *Store) Recorder(relayName, topicTemplate string) (func(ctx context.Context, ev *outbox.Event, cause error) error, error) {
	router, err := sink.NewRouter(topicTemplate)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex // a Router is used from one goroutine
	return func(ctx context.Context, ev *outbox.Event, cause error) error {
		mu.Lock()
		topic, err := router.Topic(ev)
		mu.Unlock()
		if err != nil {
			topic = topicTemplate
		}
		l := FromEvent(ev, topic, cause)
		l.RelayName = relayName
		return s.Add(ctx, l)
	}, nil
}
