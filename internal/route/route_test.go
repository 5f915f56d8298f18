package route

import (
	"strings"
	"testing"
	"unsafe"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

func routedEvent(aggregateType, eventType string) *outbox.Event {
	return &outbox.Event{
		ID:            []byte("id-1"),
		AggregateType: []byte(aggregateType),
		AggregateID:   []byte("agg-1"),
		EventType:     []byte(eventType),
	}
}

func TestRouterTopic(t *testing.T) {
	tests := []struct {
		name          string
		template      string
		aggregateType string
		eventType     string
		want          string
		wantFixed     bool
	}{
		{name: "fixed topic", template: "outbox.events", aggregateType: "order", eventType: "created", want: "outbox.events", wantFixed: true},
		{name: "fixed topic ignores columns", template: "outbox.events", aggregateType: "bad/type", eventType: "", want: "outbox.events", wantFixed: true},
		{name: "aggregate_type", template: "outbox.{aggregate_type}", aggregateType: "order", eventType: "created", want: "outbox.order"},
		{name: "event_type", template: "{event_type}-v1", aggregateType: "order", eventType: "order_created", want: "order_created-v1"},
		{name: "placeholder only", template: "{aggregate_type}", aggregateType: "Invoice", want: "Invoice"},
		{name: "both", template: "cdc.{aggregate_type}.{event_type}", aggregateType: "order", eventType: "shipped", want: "cdc.order.shipped"},
		{name: "both adjacent", template: "{aggregate_type}{event_type}", aggregateType: "a", eventType: "b", want: "ab"},
		{name: "same placeholder twice", template: "{aggregate_type}.{aggregate_type}", aggregateType: "x", want: "x.x"},
		{name: "max length after rendering", template: strings.Repeat("t", 244) + ".{aggregate_type}", aggregateType: "abcd", want: strings.Repeat("t", 244) + ".abcd"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(tt.template)
			if err != nil {
				t.Fatalf("New(%q): %v", tt.template, err)
			}
			fixed, isFixed := r.Fixed()
			if isFixed != tt.wantFixed {
				t.Fatalf("Fixed() = %q, %v; want fixed=%v", fixed, isFixed, tt.wantFixed)
			}
			if isFixed && fixed != tt.want {
				t.Fatalf("Fixed() = %q, want %q", fixed, tt.want)
			}
			got, err := r.Topic(routedEvent(tt.aggregateType, tt.eventType))
			if err != nil {
				t.Fatalf("Topic: %v", err)
			}
			if got != tt.want {
				t.Fatalf("Topic = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestNewRejectsBadTemplates(t *testing.T) {
	tests := []struct {
		name     string
		template string
		wantErr  string // substring of the error
	}{
		{name: "empty", template: "", wantErr: "empty"},
		{name: "unknown placeholder", template: "outbox.{tenant}", wantErr: "unknown placeholder {tenant}"},
		{name: "empty placeholder", template: "outbox.{}", wantErr: "unknown placeholder {}"},
		{name: "placeholder with spaces", template: "outbox.{ aggregate_type }", wantErr: "unknown placeholder"},
		{name: "unclosed brace", template: "outbox.{aggregate_type", wantErr: "unclosed '{'"},
		{name: "unclosed second brace", template: "{aggregate_type}.{event_type", wantErr: "unclosed '{'"},
		{name: "stray closing brace", template: "outbox}", wantErr: "character '}'"},
		{name: "slash in literal", template: "outbox/{aggregate_type}", wantErr: "character '/'"},
		{name: "space in literal", template: "outbox events", wantErr: "character ' '"},
		{name: "non-ASCII literal", template: "outbox.é", wantErr: "Kafka allows only"},
		{name: "dot", template: ".", wantErr: "not allowed"},
		{name: "dot dot", template: "..", wantErr: "not allowed"},
		{name: "fixed topic too long", template: strings.Repeat("a", 250), wantErr: "Kafka allows 249"},
		{name: "literal leaves no room for the placeholder", template: strings.Repeat("a", 249) + "{aggregate_type}", wantErr: "Kafka allows 249"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(tt.template)
			if err == nil {
				t.Fatalf("New(%q) = %+v, want an error", tt.template, r)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New(%q) error %q does not mention %q", tt.template, err, tt.wantErr)
			}
		})
	}
}

func TestNewLengthLimit(t *testing.T) {
	if _, err := New(strings.Repeat("a", MaxTopicLen)); err != nil {
		t.Fatalf("a %d-character fixed topic must be accepted: %v", MaxTopicLen, err)
	}
	// 248 literal characters and a placeholder that renders to at least one.
	if _, err := New(strings.Repeat("a", MaxTopicLen-1) + "{event_type}"); err != nil {
		t.Fatalf("a template that can render %d characters must be accepted: %v", MaxTopicLen, err)
	}
}

// TestRouterRenderedInvalidTopic checks that a rendering Kafka would refuse is a
// permanent failure of that one event, with the code "invalid_topic".
func TestRouterCache(t *testing.T) {
	r, err := New("outbox.{aggregate_type}")
	if err != nil {
		t.Fatal(err)
	}
	first, err := r.Topic(routedEvent("order", "created"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := r.Topic(routedEvent("order", "deleted"))
	if err != nil {
		t.Fatal(err)
	}
	if first != "outbox.order" || second != first {
		t.Fatalf("topics = %q, %q; want outbox.order twice", first, second)
	}
	// The second rendering is the cached string, not a new allocation.
	if unsafe.StringData(first) != unsafe.StringData(second) {
		t.Fatal("second rendering of the same value was not served from the cache")
	}
	if len(r.cache) != 1 {
		t.Fatalf("cache holds %d entries, want 1", len(r.cache))
	}
	// The event's bytes may be reused by the caller: the cached key must not alias them.
	ev := routedEvent("invoice", "created")
	if got, _ := r.Topic(ev); got != "outbox.invoice" {
		t.Fatalf("Topic = %q", got)
	}
	copy(ev.AggregateType, "INVOICE")
	if got, _ := r.Topic(routedEvent("invoice", "x")); got != "outbox.invoice" {
		t.Fatalf("after mutating the event's bytes, Topic = %q, want outbox.invoice", got)
	}
	if got, _ := r.Topic(ev); got != "outbox.INVOICE" {
		t.Fatalf("Topic of mutated event = %q, want outbox.INVOICE", got)
	}

	// The cache is bounded: once full it starts over rather than growing.
	r.maxKey = 3
	clear(r.cache)
	for _, v := range []string{"a", "b", "c", "d", "e"} {
		got, err := r.Topic(routedEvent(v, ""))
		if err != nil || got != "outbox."+v {
			t.Fatalf("Topic(%q) = %q, %v", v, got, err)
		}
		if len(r.cache) > r.maxKey {
			t.Fatalf("cache grew to %d entries, limit %d", len(r.cache), r.maxKey)
		}
	}
	for _, v := range []string{"a", "e"} {
		if got, _ := r.Topic(routedEvent(v, "")); got != "outbox."+v {
			t.Fatalf("after eviction Topic(%q) = %q", v, got)
		}
	}
}

func TestValidTopic(t *testing.T) {
	tests := []struct {
		name  string
		topic string
		ok    bool
	}{
		{"simple", "outbox", true},
		{"all legal characters", "aZ09._-", true},
		{"one character", "a", true},
		{"dots inside", "a..b", true},
		{"leading dot", ".a", true},
		{"249 characters", strings.Repeat("x", 249), true},
		{"empty", "", false},
		{"dot", ".", false},
		{"dot dot", "..", false},
		{"250 characters", strings.Repeat("x", 250), false},
		{"slash", "a/b", false},
		{"colon", "a:b", false},
		{"space", "a b", false},
		{"plus", "a+b", false},
		{"NUL", "a\x00b", false},
		{"non-ASCII", "ü", false},
		{"brace", "{aggregate_type}", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidTopic(tt.topic)
			if (err == nil) != tt.ok {
				t.Fatalf("ValidTopic(%.20q) = %v, want ok=%v", tt.topic, err, tt.ok)
			}
		})
	}
}
