// Package route renders topic templates over outbox event columns into Kafka
// topic names, and checks names against Kafka's rules.
//
// A template is literal text with placeholders for an event's columns,
// {aggregate_type} and {event_type}. With a Regex (outbox.topic_regex), the
// template may also refer to the groups of that regular expression, which is
// matched against the whole of one of those columns, as Kafka Connect's
// RegexRouter (which Debezium's Outbox Event Router applies with
// route.topic.regex) does: when the value matches, the topic is the template
// rendered with the groups; when it does not, the topic is the value itself.
package route

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// MaxTopicLen is Kafka's limit on topic name length.
const MaxTopicLen = 249

// Fields a template and a Regex can take their values from: the names of
// its placeholders.
const (
	FieldAggregateType = "aggregate_type"
	FieldEventType     = "event_type"
)

// Placeholders of the source table, for templates only (a Regex cannot be
// matched against them): the outbox table an event's row was inserted into
// (outbox.Event.Schema and Table), so that one relay reading several outbox
// tables can route each to topics of its own. A message-outbox event has
// no table: they render as nothing.
const (
	FieldSchema = "schema"
	FieldTable  = "table"
)

// placeholder names a column value usable in a topic template.
type placeholder int

const (
	phAggregateType placeholder = iota
	phEventType
	phSchema
	phTable
)

var placeholders = map[string]placeholder{
	FieldAggregateType: phAggregateType,
	FieldEventType:     phEventType,
	FieldSchema:        phSchema,
	FieldTable:         phTable,
}

// Regex is the regular expression a Router matches one field of each event
// against (outbox.topic_regex), Go's RE2 syntax with Java's constructs that RE2
// reads differently refused (see CheckRegex). The zero Regex matches nothing
// and routes by the template alone.
type Regex struct {
	// Pattern is the expression; "" means none. It must match the whole
	// value (as Java's Matcher.matches), not a part of it.
	Pattern string
	// Field is the value it is matched against: FieldAggregateType ("" too)
	// or FieldEventType.
	Field string
	// Names names, in errors, the settings of the configuration that holds
	// the template and the regex; the regex is its "TopicRegex".
	Names setting.Namer
}

// segment is one piece of a template: literal text, a column's value or a
// group of the regex.
type segment struct {
	lit   string
	field placeholder
	group int // >= 0: a group of the regex; -1: lit or field
	isLit bool
}

// Router renders a topic template such as "outbox.{aggregate_type}" for an event.
// A template without placeholders is a fixed topic. It is used from one goroutine.
type Router struct {
	segs  []segment
	fixed string
	re    *regexp.Regexp // nil: no regex
	reSrc string         // re as given
	reOn  placeholder    // the field re is matched against
	names setting.Namer  // Regex.Names
	// key is the one field the topic depends on, when it depends on one,
	// so that renderings can be cached by its value; single says whether
	// it does.
	key    placeholder
	single bool
	cache  map[string]string // renderings, keyed by the key field's value
	maxKey int
}

// New parses a topic template. Placeholders are {aggregate_type},
// {event_type}, {schema} and {table}; the rest must be legal in a Kafka
// topic name.
func New(template string) (*Router, error) { return NewWithRegex(template, Regex{}) }

// NewWithRegex is New with re: the template may then also refer to re's
// groups, ${name}, ${n} or $n (the first digit after the $ always, the next
// ones while they make a group number re has, as Java's replacement syntax
// reads them), $0 or ${0} being the whole value. Literal text and groups
// must be able to render a legal topic name.
func NewWithRegex(template string, re Regex) (*Router, error) {
	if template == "" {
		return nil, fmt.Errorf("topic template is empty")
	}
	r := &Router{cache: make(map[string]string), maxKey: 10000, names: re.Names}
	if re.Pattern != "" {
		compiled, err := compileRegex(re.Pattern)
		if err != nil {
			return nil, err
		}
		switch re.Field {
		case "", FieldAggregateType:
			r.reOn = phAggregateType
		case FieldEventType:
			r.reOn = phEventType
		default:
			return nil, fmt.Errorf("topic regex field %q: want %s or %s", re.Field, FieldAggregateType, FieldEventType)
		}
		r.re, r.reSrc = compiled, re.Pattern
	}
	if err := r.parse(template); err != nil {
		return nil, err
	}
	// Check the literal text with every placeholder and group as a legal sample value.
	var sample strings.Builder
	deps := map[placeholder]bool{}
	if r.re != nil {
		deps[r.reOn] = true
	}
	for _, s := range r.segs {
		switch {
		case s.isLit:
			sample.WriteString(s.lit)
		case s.group >= 0:
			sample.WriteByte('x')
		default:
			sample.WriteByte('x')
			deps[s.field] = true
		}
	}
	if err := ValidTopic(sample.String()); err != nil {
		return nil, fmt.Errorf("topic template %q: %w", template, err)
	}
	switch len(deps) {
	case 0:
		r.fixed = template
	case 1:
		for ph := range deps {
			r.key, r.single = ph, true
		}
	}
	return r, nil
}

// parse splits template into segments.
func (r *Router) parse(template string) error {
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			r.segs = append(r.segs, segment{lit: lit.String(), isLit: true, group: -1})
			lit.Reset()
		}
	}
	for i := 0; i < len(template); {
		switch c := template[i]; c {
		case '{':
			j := strings.IndexByte(template[i:], '}')
			if j < 0 {
				return fmt.Errorf("topic template %q: unclosed '{'", template)
			}
			name := template[i+1 : i+j]
			ph, ok := placeholders[name]
			if !ok {
				return fmt.Errorf("topic template %q: unknown placeholder {%s} (use {aggregate_type}, {event_type}, {schema} or {table})", template, name)
			}
			flush()
			r.segs = append(r.segs, segment{field: ph, group: -1})
			i += j + 1
		case '$':
			g, n, err := r.groupRef(template[i:])
			if err != nil {
				return fmt.Errorf("topic template %q: %w", template, err)
			}
			flush()
			r.segs = append(r.segs, segment{group: g})
			i += n
		default:
			lit.WriteByte(c)
			i++
		}
	}
	flush()
	return nil
}

// groupRef reads the group reference at the start of s ("$…") and returns
// the group's number and the reference's length.
func (r *Router) groupRef(s string) (group, n int, err error) {
	if r.re == nil {
		return 0, 0, fmt.Errorf("%.20q refers to a group of the topic regex %s, which is not set", s, r.names.Name("TopicRegex"))
	}
	groups := r.re.NumSubexp()
	if len(s) > 1 && s[1] == '{' {
		end := strings.IndexByte(s, '}')
		if end < 0 {
			return 0, 0, fmt.Errorf("%.20q: unclosed '${'", s)
		}
		name := s[2:end]
		if g, ok := groupNumber(name); ok {
			if g > groups {
				return 0, 0, fmt.Errorf("${%s}: the regex has %d groups", name, groups)
			}
			return g, end + 1, nil
		}
		g := r.re.SubexpIndex(name)
		if g < 0 {
			return 0, 0, fmt.Errorf("${%s}: the regex has no group named %q", name, name)
		}
		return g, end + 1, nil
	}
	if len(s) < 2 || s[1] < '0' || s[1] > '9' {
		return 0, 0, fmt.Errorf("%.20q: a '$' must start a group reference, $n or ${name}", s)
	}
	g := int(s[1] - '0')
	if g > groups {
		return 0, 0, fmt.Errorf("$%d: the regex has %d groups", g, groups)
	}
	n = 2
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		next := g*10 + int(s[n]-'0')
		if next > groups {
			break
		}
		g = next
		n++
	}
	return g, n, nil
}

// groupNumber reads a decimal group number.
func groupNumber(s string) (int, bool) {
	if s == "" || len(s) > 3 {
		return 0, false
	}
	g := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		g = g*10 + int(s[i]-'0')
	}
	return g, true
}

// Fixed returns the topic when the template has no placeholders (and there
// is no regex).
func (r *Router) Fixed() (string, bool) { return r.fixed, r.fixed != "" }

// Topic renders the topic of ev, or returns a permanent *outbox.EventError when the
// rendered name is not a legal Kafka topic.
func (r *Router) Topic(ev *outbox.Event) (string, error) {
	if r.fixed != "" {
		return r.fixed, nil
	}
	if r.single {
		var k string
		switch r.key {
		case phSchema:
			k = ev.Schema
		case phTable:
			k = ev.Table
		default:
			v := r.value(ev, r.key)
			if t, ok := r.cache[string(v)]; ok {
				return t, nil
			}
			k = string(v)
		}
		if t, ok := r.cache[k]; ok {
			return t, nil
		}
		t, err := r.render(ev)
		if err != nil {
			return "", err
		}
		if len(r.cache) >= r.maxKey {
			clear(r.cache)
		}
		r.cache[k] = t
		return t, nil
	}
	return r.render(ev)
}

// render renders the topic of ev and checks it.
func (r *Router) render(ev *outbox.Event) (string, error) {
	var m []int
	var on []byte
	if r.re != nil {
		on = r.value(ev, r.reOn)
		if m = r.re.FindSubmatchIndex(on); m == nil {
			// No match: the topic stays the value, as RegexRouter leaves it.
			t := string(on)
			if err := ValidTopic(t); err != nil {
				return "", &outbox.EventError{Code: "invalid_topic", Err: fmt.Errorf("%s %q does not match the topic regex %q %s, so it is the topic: %w", fieldName(r.reOn), on, r.reSrc, r.names.Name("TopicRegex"), err)}
			}
			return t, nil
		}
	}
	var b strings.Builder
	for _, s := range r.segs {
		switch {
		case s.isLit:
			b.WriteString(s.lit)
		case s.group >= 0:
			if start := m[2*s.group]; start >= 0 { // a group that took no part renders as nothing
				b.Write(on[start:m[2*s.group+1]])
			}
		case s.field == phSchema:
			b.WriteString(ev.Schema)
		case s.field == phTable:
			b.WriteString(ev.Table)
		default:
			b.Write(r.value(ev, s.field))
		}
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

func fieldName(ph placeholder) string {
	if ph == phEventType {
		return FieldEventType
	}
	return FieldAggregateType
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
