package deadletter_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// TestFromEventWithoutID: an event whose id is NULL or empty gets a stored id
// made from its content, the same for a redelivered copy and different for a
// different event, so the store can keep it (it refuses an empty id).
func TestFromEventWithoutID(t *testing.T) {
	cause := &outbox.EventError{Code: "empty_key", Err: errors.New("no key")}
	ev := func(mod func(*outbox.Event)) *outbox.Event {
		e := &outbox.Event{AggregateType: []byte("order"), EventType: []byte("E"), Payload: []byte(`{}`), CommitLSN: 0x16B3748,
			Headers: []outbox.Header{{Key: "tenant", Value: []byte("acme")}}}
		if mod != nil {
			mod(e)
		}
		return e
	}
	base := deadletter.FromEvent(ev(nil), "t", cause)
	if !strings.HasPrefix(base.EventID, "no-id:0/16B3748:") || base.Headers[sink.HeaderID] != "" {
		t.Fatalf("EventID %q, id header %q; want no-id:0/16B3748:<hash> and an empty header", base.EventID, base.Headers[sink.HeaderID])
	}
	if again := deadletter.FromEvent(ev(nil), "t", cause); again.EventID != base.EventID {
		t.Errorf("a copy of the event got %q, want %q", again.EventID, base.EventID)
	}
	for name, mod := range map[string]func(*outbox.Event){
		"empty id":            func(e *outbox.Event) { e.ID = []byte{} },
		"other payload":       func(e *outbox.Event) { e.Payload = []byte(`{"n": 1}`) },
		"NULL payload":        func(e *outbox.Event) { e.Payload = nil },
		"empty payload":       func(e *outbox.Event) { e.Payload = []byte{} },
		"other header":        func(e *outbox.Event) { e.Headers[0].Value = []byte("other") },
		"other commit":        func(e *outbox.Event) { e.CommitLSN++ },
		"fields run into one": func(e *outbox.Event) { e.AggregateType, e.EventType = []byte("orderE"), []byte{} },
	} {
		got := deadletter.FromEvent(ev(mod), "t", cause).EventID
		if name == "empty id" {
			if got != base.EventID {
				t.Errorf("%s: %q, want %q (same as NULL)", name, got, base.EventID)
			}
			continue
		}
		if got == base.EventID {
			t.Errorf("%s: same id %q as the original event", name, got)
		}
	}
	if got := deadletter.FromEvent(ev(func(e *outbox.Event) { e.ID = []byte("ev-1") }), "t", cause).EventID; got != "ev-1" {
		t.Errorf("event with an id: EventID %q, want ev-1", got)
	}
}
