// Package debezium translates a Debezium connector configuration, a Kafka
// Connect PostgresConnector with the Outbox Event Router, into cdc-relay
// settings named by key: a setting's path in cdc-relay's YAML configuration
// document (source.slot, outbox.columns.aggregate_id, delivery.snapshot …).
// Which flag or environment variable sets a key is the command line's
// business; nothing here names one.
//
// Defaults are Debezium's, so a minimal connector config maps to Debezium's
// column names (aggregatetype, aggregateid, payload), slot (debezium) and
// publication (dbz_publication). Whatever cdc-relay does not implement is
// refused, in one error naming every such property; what cannot change the
// output is named in one warning.
package debezium

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// Setting is one cdc-relay setting and the connector property it came from.
type Setting struct {
	// Key is the setting's path in cdc-relay's YAML document: source.slot.
	Key string
	// Value is a string or a bool, as the document writes it: a duration in
	// Go's syntax without zero trailing units (1.5s, 1m), a list as its items
	// joined by commas (type=eventType,aggregatetype=kind).
	Value any
	// Property names the Debezium property (slot.name), or properties
	// (database.*), the value came from.
	Property string
	// Given reports whether the connector configuration has Property: when
	// it does not, Value is Debezium's default for it.
	Given bool
}

// Translation is a connector configuration translated into settings.
type Translation struct {
	Settings []Setting // one per key, sorted by key
	Warnings []string  // one line each, naming settings by key
}

// Value returns the value of the setting key, and whether the translation
// sets it.
func (t *Translation) Value(key string) (any, bool) {
	for _, s := range t.Settings {
		if s.Key == key {
			return s.Value, true
		}
	}
	return nil, false
}

// Translate reads a connector configuration and translates it. data is the
// JSON POSTed to Kafka Connect ({"name": …, "config": {…}} or the bare config
// object) or a Java .properties file; Connect's ${env:NAME} indirections are
// resolved through getenv, ${file:/path:key} ones by reading the properties
// file. name names the configuration, its file, in every error and in
// nothing else.
//
// An error is either a configuration that cannot be read (naming the line)
// or a *Refusal naming every property cdc-relay cannot take (an indirection
// it cannot resolve, a property it does not implement), each with its
// reason; the error then holds no partial translation.
func Translate(name string, data []byte, getenv func(string) (string, bool)) (*Translation, error) {
	props, err := parseConnectorConfig(data)
	if err != nil {
		return nil, fmt.Errorf("debezium config %s: %w", name, err)
	}
	// An indirection that cannot be resolved is one refusal among the
	// others: the rest of the configuration is still checked.
	unresolved := resolveIndirections(props, getenv)
	return translate(name, props, unresolved)
}

// Refusal is a connector configuration cdc-relay cannot run as it is: every
// property at fault, each with its reason.
type Refusal struct {
	name     string
	problems []string // "property: reason", sorted
}

// Problems returns one line per property at fault, "property: reason",
// each naming the file.
func (e *Refusal) Problems() []string {
	out := make([]string, len(e.problems))
	for i, p := range e.problems {
		out[i] = fmt.Sprintf("debezium config %s: %s", e.name, p)
	}
	return out
}

// Error returns the refusal as one message: the one problem, or how many
// there are and each on a line of its own.
func (e *Refusal) Error() string {
	if len(e.problems) == 1 {
		return fmt.Sprintf("debezium config %s: %s (see docs/debezium.md)", e.name, e.problems[0])
	}
	return fmt.Sprintf("debezium config %s: %d properties cdc-relay does not implement or refuses (remove or change them; see docs/debezium.md):\n  %s",
		e.name, len(e.problems), strings.Join(e.problems, "\n  "))
}

// translate maps a connector's properties, indirections resolved, to
// settings. name names the file in errors; unresolved are the properties
// whose indirections could not be resolved, each with why (refused as
// such, and not again for the value they keep).
func translate(name string, props map[string]string, unresolved map[string]string) (*Translation, error) {
	t := &translator{props: props, consumed: map[string]bool{}, set: map[string]Setting{}, unresolved: unresolved}
	for _, prop := range slices.Sorted(maps.Keys(unresolved)) {
		t.refused = append(t.refused, prop+": "+unresolved[prop])
	}
	t.connector()
	t.database()
	t.replication()
	t.converters()
	t.eventRouterJSON()
	t.transforms()
	t.rest()
	if len(t.refused) > 0 {
		sort.Strings(t.refused)
		return nil, &Refusal{name: name, problems: t.refused}
	}
	tr := &Translation{}
	for _, s := range t.set {
		s.Given = t.given(s.Property)
		tr.Settings = append(tr.Settings, s)
	}
	sort.Slice(tr.Settings, func(i, j int) bool { return tr.Settings[i].Key < tr.Settings[j].Key })
	if len(t.ignored) > 0 {
		sort.Strings(t.ignored)
		tr.Warnings = append(tr.Warnings, "ignored, they cannot change what cdc-relay produces: "+strings.Join(t.ignored, ", "))
	}
	tr.Warnings = append(tr.Warnings, t.notes...)
	return tr, nil
}
