package route_test

// An external test: it checks the router's errors with the sink's classifier,
// which the relay applies to them.

import (
	"errors"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

func event(aggregateType, eventType string) *outbox.Event {
	return &outbox.Event{ID: []byte("id-1"), AggregateType: []byte(aggregateType), AggregateID: []byte("agg-1"), EventType: []byte(eventType)}
}

func TestRouterRenderedInvalidTopic(t *testing.T) {
	tests := []struct {
		name          string
		template      string
		aggregateType string
		eventType     string
	}{
		{name: "slash", template: "outbox.{aggregate_type}", aggregateType: "orders/eu"},
		{name: "space", template: "outbox.{aggregate_type}", aggregateType: "order line"},
		{name: "non-ASCII", template: "outbox.{aggregate_type}", aggregateType: "bestellung-ä"},
		{name: "NULL column renders to empty", template: "{aggregate_type}", aggregateType: ""},
		{name: "dot", template: "{aggregate_type}", aggregateType: "."},
		{name: "dot dot", template: "{event_type}", eventType: ".."},
		{name: "too long single", template: "outbox.{aggregate_type}", aggregateType: strings.Repeat("x", route.MaxTopicLen-len("outbox.")) + "y"},
		{name: "too long both", template: "{aggregate_type}.{event_type}", aggregateType: strings.Repeat("a", 124), eventType: strings.Repeat("e", 125)},
		{name: "bad second placeholder", template: "{aggregate_type}.{event_type}", aggregateType: "order", eventType: "created:v2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := route.New(tt.template)
			if err != nil {
				t.Fatalf("route.New(%q): %v", tt.template, err)
			}
			got, err := r.Topic(event(tt.aggregateType, tt.eventType))
			if err == nil {
				t.Fatalf("Topic = %q, want an error", got)
			}
			var ee *outbox.EventError
			if !errors.As(err, &ee) {
				t.Fatalf("Topic error %v (%T) is not an *outbox.EventError", err, err)
			}
			if ee.Code != "invalid_topic" {
				t.Fatalf("code = %q, want invalid_topic", ee.Code)
			}
			if sink.Classify(err) != sink.Permanent || sink.Code(err) != "invalid_topic" {
				t.Fatalf("Classify/Code = %v/%q, want permanent/invalid_topic", sink.Classify(err), sink.Code(err))
			}
			// A failed rendering is not cached: the next call fails again.
			if _, err := r.Topic(event(tt.aggregateType, tt.eventType)); err == nil {
				t.Fatal("second Topic call succeeded; invalid renderings must not be cached")
			}
		})
	}
}
