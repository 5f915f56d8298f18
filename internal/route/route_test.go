package route

import (
	"errors"
	"strings"
	"testing"
	"unsafe"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/setting"
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
		noTable       bool // the event has no source table
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
		{name: "schema", template: "outbox.{schema}", aggregateType: "order", want: "outbox.billing"},
		{name: "table", template: "{table}", aggregateType: "order", want: "outbox_events"},
		{name: "schema, table and aggregate type", template: "{schema}.{table}.{aggregate_type}", aggregateType: "order", want: "billing.outbox_events.order"},
		{name: "no table: a message-outbox event", template: "outbox.{aggregate_type}{table}", aggregateType: "order", noTable: true, want: "outbox.order"},
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
			ev := routedEvent(tt.aggregateType, tt.eventType)
			if !tt.noTable {
				ev.Schema, ev.Table = "billing", "outbox_events"
			}
			for range 2 { // the second from the cache, where there is one
				got, err := r.Topic(ev)
				if err != nil {
					t.Fatalf("Topic: %v", err)
				}
				if got != tt.want {
					t.Fatalf("Topic = %q, want %q", got, tt.want)
				}
			}
		})
	}
}

// TestRouterTableCache: a template on the source table alone caches one
// topic per table, and events of another table get their own.
func TestRouterTableCache(t *testing.T) {
	r, err := New("outbox.{schema}")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ schema, want string }{{"billing", "outbox.billing"}, {"shipping", "outbox.shipping"}, {"billing", "outbox.billing"}} {
		ev := routedEvent("order", "created")
		ev.Schema, ev.Table = tc.schema, "outbox_events"
		if got, err := r.Topic(ev); err != nil || got != tc.want {
			t.Errorf("Topic(schema %s) = %q, %v; want %q", tc.schema, got, err, tc.want)
		}
	}
	if len(r.cache) != 2 {
		t.Errorf("%d cached topics, want 2: %v", len(r.cache), r.cache)
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

// TestRouterRegex routes with --topic-regex as Kafka Connect's RegexRouter
// does behind Debezium's route.topic.regex: a value the regex matches as a
// whole becomes the template rendered with the groups; any other value is the
// topic itself.
func TestRouterRegex(t *testing.T) {
	tests := []struct {
		name, regex, field, template string
		aggregateType, eventType     string
		want                         string
	}{
		{name: "Debezium's default", regex: "(?<routedByValue>.*)", template: "outbox.event.${routedByValue}", aggregateType: "order", want: "outbox.event.order"},
		{name: "Debezium's topic routing example", regex: "(.*)customers_shard(.*)", template: "$1customers_all_shards",
			aggregateType: "myserver.mydb.customers_shard1", want: "myserver.mydb.customers_all_shards"},
		{name: "named groups", regex: "(?<region>eu|us)-(?<kind>[a-z]+)", template: "${kind}.${region}", aggregateType: "eu-order", want: "order.eu"},
		{name: "no match: the value itself", regex: "(?<region>eu|us)-(?<kind>[a-z]+)", template: "${kind}.${region}", aggregateType: "apac-order", want: "apac-order"},
		{name: "a partial match is no match", regex: "order", template: "orders", aggregateType: "orders", want: "orders"},
		{name: "a whole match with no group", regex: "order|invoice", template: "billing", aggregateType: "invoice", want: "billing"},
		{name: "on the event type", regex: "(.*)Placed", field: FieldEventType, template: "placed.$1", aggregateType: "order", eventType: "OrderPlaced", want: "placed.Order"},
		{name: "event type not matching", regex: "(.*)Placed", field: FieldEventType, template: "placed.$1", aggregateType: "order", eventType: "OrderPaid", want: "OrderPaid"},
		{name: "groups and columns", regex: "v(\\d+)", template: "{event_type}.v$1", aggregateType: "v2", eventType: "Placed", want: "Placed.v2"},
		{name: "group that took no part", regex: "(a)|(b)", template: "x$1$2", aggregateType: "b", want: "xb"},
		{name: "$12 with one group is $1 then 2", regex: "(o)rder", template: "$12", aggregateType: "order", want: "o2"},
		{name: "${1} and $0", regex: "(o)rder", template: "${1}.$0.${0}", aggregateType: "order", want: "o.order.order"},
		{name: "case-insensitive flag", regex: "(?i)ORDER", template: "orders", aggregateType: "Order", want: "orders"},
		{name: "NUL-free bytes of the value", regex: "ü(.*)", template: "u$1", aggregateType: "über", want: "uber"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewWithRegex(tt.template, Regex{Pattern: tt.regex, Field: tt.field})
			if err != nil {
				t.Fatalf("NewWithRegex(%q, %q): %v", tt.template, tt.regex, err)
			}
			if fixed, ok := r.Fixed(); ok {
				t.Fatalf("Fixed() = %q: a template with a regex is never fixed", fixed)
			}
			for range 2 { // the second time from the cache, when there is one
				got, err := r.Topic(routedEvent(tt.aggregateType, tt.eventType))
				if err != nil || got != tt.want {
					t.Fatalf("Topic = %q, %v; want %q", got, err, tt.want)
				}
			}
		})
	}
}

// TestRouterRegexInvalidTopic: a value the regex leaves as the topic, or a
// rendering, that Kafka would refuse is a permanent invalid_topic failure.
func TestRouterRegexInvalidTopic(t *testing.T) {
	for _, tc := range []struct{ regex, template, value string }{
		{"(?<region>eu|us)-(.*)", "${region}.$2", "not/a topic"},
		{"(.*)", "x.$1", "bad value"},
		{"(.*)", "$1", ""},
	} {
		r, err := NewWithRegex(tc.template, Regex{Pattern: tc.regex})
		if err != nil {
			t.Fatal(err)
		}
		topic, err := r.Topic(routedEvent(tc.value, ""))
		var ee *outbox.EventError
		if !errors.As(err, &ee) || ee.Code != "invalid_topic" {
			t.Errorf("%q over %q: Topic = %q, %v; want an invalid_topic EventError", tc.regex, tc.value, topic, err)
		}
		if len(r.cache) != 0 {
			t.Errorf("a failed rendering was cached")
		}
	}
}

// TestRouterRegexCache: with a regex the topic depends on the regex's field
// (and the template's), and is cached when that is one field.
func TestRouterRegexCache(t *testing.T) {
	r, err := NewWithRegex("x.$1", Regex{Pattern: "(.*)"})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := r.Topic(routedEvent("order", "e1"))
	b, _ := r.Topic(routedEvent("order", "e2"))
	if a != "x.order" || unsafe.StringData(a) != unsafe.StringData(b) {
		t.Fatalf("topics %q, %q: want x.order once, then from the cache", a, b)
	}
	both, err := NewWithRegex("$1.{event_type}", Regex{Pattern: "(.*)"})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []string{"e1", "e2"} {
		if got, _ := both.Topic(routedEvent("order", ev)); got != "order."+ev {
			t.Fatalf("Topic = %q, want order.%s", got, ev)
		}
	}
	if len(both.cache) != 0 {
		t.Fatalf("a topic of two fields was cached by one")
	}
}

func TestNewWithRegexRejects(t *testing.T) {
	tests := []struct {
		name, regex, field, template, wantErr string
	}{
		{name: "group without regex", template: "x.$1", wantErr: setting.Namer{}.Name("TopicRegex") + ", which is not set"},
		{name: "unknown name", regex: "(?<a>.*)", template: "${b}", wantErr: `no group named "b"`},
		{name: "group beyond the regex's", regex: "(.*)", template: "$2", wantErr: "has 1 groups"},
		{name: "braced group beyond", regex: "(.*)", template: "${2}", wantErr: "has 1 groups"},
		{name: "dollar alone", regex: "(.*)", template: "x$", wantErr: "must start a group reference"},
		{name: "dollar letter", regex: "(.*)", template: "$x", wantErr: "must start a group reference"},
		{name: "unclosed ${", regex: "(.*)", template: "${1", wantErr: "unclosed '${'"},
		{name: "literal not a topic", regex: "(.*)", template: "a/$1", wantErr: "character '/'"},
		{name: "unknown field", regex: "(.*)", field: "tenant", template: "$1", wantErr: `field "tenant"`},
		{name: "lookahead", regex: "order(?=s)", template: "x", wantErr: "lookaround"},
		{name: "negative lookbehind", regex: "(?<!x)order", template: "x", wantErr: "lookaround"},
		{name: "backreference", regex: "(a)\\1", template: "x", wantErr: "backreference"},
		{name: "named backreference", regex: "(?<a>x)\\k<a>", template: "x", wantErr: "backreference"},
		{name: "possessive", regex: "a*+", template: "x", wantErr: "possessive"},
		{name: "atomic group", regex: "(?>a)", template: "x", wantErr: "atomic group"},
		{name: "flag U", regex: "(?U)a+", template: "x", wantErr: "flag U"},
		{name: "flag x", regex: "(?x) a", template: "x", wantErr: "flag x"},
		{name: "nested class", regex: "[a[b]]", template: "x", wantErr: "nested class"},
		{name: "intersection", regex: "[a-z&&[^e]]", template: "x", wantErr: "intersection"},
		{name: "intersection alone", regex: "[a-z&&b]", template: "x", wantErr: "intersection"},
		{name: "vertical whitespace", regex: "a\\vb", template: "x", wantErr: `\v`},
		{name: "octal", regex: "\\0101", template: "x", wantErr: "octal"},
		{name: "UTF-16 escape", regex: "\\u0041", template: "x", wantErr: `\x{hhhh}`},
		{name: "\\Z", regex: "a\\Z", template: "x", wantErr: `\Z is Java's`},
		{name: "Debezium's invalid regex test", regex: " [[a-z]", template: "x", wantErr: "topic regex"},
		{name: "unbalanced", regex: "(a", template: "x", wantErr: "missing closing )"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewWithRegex(tt.template, Regex{Pattern: tt.regex, Field: tt.field})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("NewWithRegex(%q, %q) = %v, %v; want an error with %q", tt.template, tt.regex, r, err, tt.wantErr)
			}
		})
	}
	// What both read alike passes: named groups, \Q…\E, classes, escapes.
	for _, ok := range []string{`(?<name>[a-z]+)\.(?P<v>\d+)`, `\Q$1(\E.*`, `[]a]`, `[^]a]+`, `\[x\]`, `a+?`, `(?i:x)`, `(?s).`, `\p{Lu}\w\d\s`} {
		if err := CheckRegex(ok); err != nil {
			t.Errorf("CheckRegex(%q): %v", ok, err)
		}
	}
}
