// Package route renders topic templates over outbox event columns into Kafka
// topic names, and checks names against Kafka's rules.
package route

import (
	"fmt"
	"strings"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

// MaxTopicLen is Kafka's limit on topic name length.
const MaxTopicLen = 249

// placeholder names a column value usable in a topic template.
type placeholder int

const (
	phAggregateType placeholder = iota
	phEventType
)

var placeholders = map[string]placeholder{
	"aggregate_type": phAggregateType,
	"event_type":     phEventType,
}

// Router renders a topic template such as "outbox.{aggregate_type}" for an event.
// A template without placeholders is a fixed topic. It is used from one goroutine.
type Router struct {
	parts  []string      // literal parts, len(ph)+1 of them
	ph     []placeholder // placeholders between the parts
	fixed  string
	cache  map[string]string // single-placeholder renderings, keyed by the value
	maxKey int
}

// New parses a topic template. Placeholders are {aggregate_type} and
// {event_type}; the rest must be legal in a Kafka topic name.
func New(template string) (*Router, error) {
	if template == "" {
		return nil, fmt.Errorf("topic template is empty")
	}
	r := &Router{cache: make(map[string]string), maxKey: 10000}
	rest := template
	var lit strings.Builder
	for {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			lit.WriteString(rest)
			break
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return nil, fmt.Errorf("topic template %q: unclosed '{'", template)
		}
		name := rest[i+1 : i+j]
		ph, ok := placeholders[name]
		if !ok {
			return nil, fmt.Errorf("topic template %q: unknown placeholder {%s} (use {aggregate_type} or {event_type})", template, name)
		}
		lit.WriteString(rest[:i])
		r.parts = append(r.parts, lit.String())
		lit.Reset()
		r.ph = append(r.ph, ph)
		rest = rest[i+j+1:]
	}
	r.parts = append(r.parts, lit.String())
	// Check the literal text with every placeholder as a legal sample value.
	sample := r.parts[0]
	for i := range r.ph {
		sample += "x" + r.parts[i+1]
	}
	if err := ValidTopic(sample); err != nil {
		return nil, fmt.Errorf("topic template %q: %w", template, err)
	}
	if len(r.ph) == 0 {
		r.fixed = template
	}
	return r, nil
}

// Fixed returns the topic when the template has no placeholders.
func (r *Router) Fixed() (string, bool) { return r.fixed, r.fixed != "" }

// Topic renders the topic of ev, or returns a permanent *outbox.EventError when the
// rendered name is not a legal Kafka topic.
func (r *Router) Topic(ev *outbox.Event) (string, error) {
	if r.fixed != "" {
		return r.fixed, nil
	}
	if len(r.ph) == 1 {
		v := r.value(ev, r.ph[0])
		if t, ok := r.cache[string(v)]; ok {
			return t, nil
		}
		t := r.parts[0] + string(v) + r.parts[1]
		if err := ValidTopic(t); err != nil {
			return "", &outbox.EventError{Code: "invalid_topic", Err: err}
		}
		if len(r.cache) >= r.maxKey {
			clear(r.cache)
		}
		r.cache[string(v)] = t
		return t, nil
	}
	var b strings.Builder
	b.WriteString(r.parts[0])
	for i, ph := range r.ph {
		b.Write(r.value(ev, ph))
		b.WriteString(r.parts[i+1])
	}
	t := b.String()
	if err := ValidTopic(t); err != nil {
		return "", &outbox.EventError{Code: "invalid_topic", Err: err}
	}
	return t, nil
}

func (r *Router) value(ev *outbox.Event, ph placeholder) []byte {
	if ph == phEventType {
		return ev.EventType
	}
	return ev.AggregateType
}

// ValidTopic reports whether name is a legal Kafka topic name: 1 to 249 characters
// of [a-zA-Z0-9._-], and not "." or "..".
func ValidTopic(name string) error {
	if name == "" {
		return fmt.Errorf("topic name is empty")
	}
	if len(name) > MaxTopicLen {
		return fmt.Errorf("topic name %.40q... is %d characters long, Kafka allows %d", name, len(name), MaxTopicLen)
	}
	if name == "." || name == ".." {
		return fmt.Errorf("topic name %q is not allowed", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic name %q has the character %q; Kafka allows only [a-zA-Z0-9._-]", name, c)
		}
	}
	return nil
}
