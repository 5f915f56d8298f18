package debezium

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/route"
)

// Debezium class names and defaults (connectors/postgresql.adoc,
// transformations/outbox-event-router.adoc).
const (
	postgresConnector = "io.debezium.connector.postgresql.PostgresConnector"
	eventRouter       = "io.debezium.transforms.outbox.EventRouter"
	defaultRegex      = "(?<routedByValue>.*)"
	routedByValue     = "${routedByValue}"
)

// translator carries one translation's state.
type translator struct {
	props    map[string]string
	consumed map[string]bool
	set      map[string]Setting // by key
	refused  []string           // "property: reason"
	ignored  []string           // properties that cannot change the output
	notes    []string           // other warnings
	// unresolved are the properties whose ${…} could not be resolved:
	// refused once for that, never again for the value they keep.
	unresolved map[string]string
}

// given reports whether the configuration has property, or for a family
// (database.*) one of its members.
func (t *translator) given(property string) bool {
	if prefix, ok := strings.CutSuffix(property, "*"); ok {
		for k := range t.props {
			if strings.HasPrefix(k, prefix) {
				return true
			}
		}
		return false
	}
	_, ok := t.props[property]
	return ok
}

// get returns a property's value and marks it handled.
func (t *translator) get(property string) (string, bool) {
	v, ok := t.props[property]
	if ok {
		t.consumed[property] = true
	}
	return v, ok
}

// getOr returns a property's value, or def when it is absent or empty.
func (t *translator) getOr(property, def string) string {
	if v, ok := t.get(property); ok && strings.TrimSpace(v) != "" {
		return strings.TrimSpace(v)
	}
	return def
}

// put sets the setting key to v (a string or a bool), from property.
func (t *translator) put(key string, v any, property string) {
	t.set[key] = Setting{Key: key, Value: v, Property: property}
}

// str returns the string value of the setting key, "" when unset.
func (t *translator) str(key string) string {
	s, _ := t.set[key].Value.(string)
	return s
}

func (t *translator) refuse(property, reason string) {
	t.consumed[property] = true
	if _, ok := t.unresolved[property]; ok {
		return // refused already: its value is the unresolved reference
	}
	t.refused = append(t.refused, property+": "+reason)
}

func (t *translator) connector() {
	switch c, ok := t.get("connector.class"); {
	case !ok:
		t.refuse("connector.class", "missing; want "+postgresConnector)
	case strings.TrimSpace(c) != postgresConnector:
		t.refuse("connector.class", fmt.Sprintf("%q is not supported; cdc-relay replaces %s only", c, postgresConnector))
	}
	if n := t.getOr("name", ""); n != "" {
		t.put("operations.relay_name", n, "name")
	}
	if _, ok := t.get("tasks.max"); ok {
		t.ignored = append(t.ignored, "tasks.max")
	}
	// topic.prefix names Debezium's default topics, which the Event Router
	// replaces, and the envelope's schema (eventRouterJSON).
	t.get("topic.prefix")
	if _, ok := t.get("database.server.name"); ok {
		t.ignored = append(t.ignored, "database.server.name")
	}
}

// database builds source.pg_url from database.*.
func (t *translator) database() {
	host := t.getOr("database.hostname", "")
	port := t.getOr("database.port", "5432")
	user := t.getOr("database.user", "")
	password, _ := t.get("database.password")
	db := t.getOr("database.dbname", "")
	if host == "" {
		t.refuse("database.hostname", "missing: the host of the database holding the outbox table")
	}
	if user == "" {
		t.refuse("database.user", "missing: the user cdc-relay connects as (it needs the REPLICATION attribute)")
	}
	if db == "" {
		t.refuse("database.dbname", "missing: the database holding the outbox table")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		t.refuse("database.port", fmt.Sprintf("%q: want a port number from 1 to 65535", port))
	}
	u := url.URL{Scheme: "postgres", Host: net.JoinHostPort(host, port), Path: "/" + db}
	if password != "" {
		u.User = url.UserPassword(user, password)
	} else {
		u.User = url.User(user)
	}
	q := url.Values{}
	for _, p := range []struct{ prop, param string }{
		{"database.sslmode", "sslmode"}, {"database.sslrootcert", "sslrootcert"},
		{"database.sslcert", "sslcert"}, {"database.sslkey", "sslkey"},
	} {
		if v := t.getOr(p.prop, ""); v != "" {
			q.Set(p.param, v)
		}
	}
	u.RawQuery = q.Encode()
	if host != "" && user != "" && db != "" {
		t.put("source.pg_url", u.String(), "database.*")
	}
}

// replication maps slot, publication, table, plugin, heartbeat, snapshot.
func (t *translator) replication() {
	t.put("source.slot", t.getOr("slot.name", "debezium"), "slot.name")
	t.put("source.publication", t.getOr("publication.name", "dbz_publication"), "publication.name")
	switch m := t.getOr("publication.autocreate.mode", "all_tables"); m {
	case "disabled":
		t.put("source.create_publication", false, "publication.autocreate.mode")
	case "filtered", "all_tables":
		t.put("source.create_publication", true, "publication.autocreate.mode")
		if m == "all_tables" {
			t.notes = append(t.notes, "publication.autocreate.mode all_tables: cdc-relay creates its publication for the outbox tables only (as filtered does)")
		}
	default:
		t.refuse("publication.autocreate.mode", fmt.Sprintf("%q: want disabled, filtered or all_tables", m))
	}
	switch list, ok := t.get("table.include.list"); {
	case !ok || strings.TrimSpace(list) == "":
		t.refuse("table.include.list", "missing: name the outbox tables, schema-qualified (public.outbox)")
	default:
		var tables, schemas []string
		for _, entry := range strings.Split(list, ",") {
			table := strings.ReplaceAll(strings.TrimSpace(entry), `\.`, ".")
			switch {
			case strings.ContainsAny(table, `\^$*+?()[]{}|`):
				t.refuse("table.include.list", fmt.Sprintf("%q is a pattern; cdc-relay needs each table's name, schema-qualified (public.outbox)", entry))
				continue
			case !strings.Contains(table, "."):
				t.refuse("table.include.list", fmt.Sprintf("%q: Debezium matches schema.table, so write the schema too (public.%s)", entry, table))
				continue
			}
			tables = append(tables, table)
			if schema, _, _ := strings.Cut(table, "."); !slices.Contains(schemas, schema) {
				schemas = append(schemas, schema)
			}
		}
		if len(tables) == 0 {
			break
		}
		t.put("tables", strings.Join(tables, ","), "table.include.list")
		if s, ok := t.get("schema.include.list"); ok {
			included := strings.Split(s, ",")
			for i := range included {
				included[i] = strings.TrimSpace(included[i])
			}
			for _, schema := range schemas {
				if !slices.Contains(included, schema) {
					t.refuse("schema.include.list", fmt.Sprintf("%q lacks schema %s of table.include.list: cdc-relay reads the tables of table.include.list; drop schema.include.list or name their schemas in it", s, schema))
					break
				}
			}
		}
	}
	switch p, ok := t.get("plugin.name"); {
	case !ok:
		t.notes = append(t.notes, "plugin.name is absent (Debezium's default is decoderbufs): cdc-relay reads pgoutput, which needs no server extension; the events are the same")
	case strings.TrimSpace(p) != "pgoutput":
		t.refuse("plugin.name", fmt.Sprintf("%q: cdc-relay reads pgoutput only (set plugin.name=pgoutput; it ships with PostgreSQL 10+)", p))
	}
	if v := t.getOr("heartbeat.interval.ms", ""); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 0 {
			t.refuse("heartbeat.interval.ms", fmt.Sprintf("%q: want milliseconds, 0 or more", v))
		} else {
			t.put("source.heartbeat_interval", millis(n), "heartbeat.interval.ms")
		}
	}
	switch m := t.getOr("snapshot.mode", "initial"); m {
	case "initial":
		t.put("delivery.snapshot", "initial", "snapshot.mode")
		t.notes = append(t.notes, "snapshot.mode initial (Debezium's default when absent) → delivery.snapshot: initial, which reads the table's rows in outbox.columns.created_at order (default created_at); "+
			"a Debezium outbox table often has no such column: set outbox.columns.created_at to its insert-time column, or snapshot.mode=no_data to stream only")
	case "never", "no_data":
		t.put("delivery.snapshot", "never", "snapshot.mode")
	default:
		t.refuse("snapshot.mode", fmt.Sprintf("%q is not supported: use initial (the rows in the table once, when the slot is created) or never/no_data", m))
	}
}

// Converters that pass the outbox's bytes through as they are.
var rawConverters = []string{
	"org.apache.kafka.connect.storage.StringConverter",
	"org.apache.kafka.connect.converters.ByteArrayConverter",
	"io.debezium.converters.BinaryDataConverter",
}

// jsonConverterClass is Kafka Connect's JsonConverter.
const jsonConverterClass = "org.apache.kafka.connect.json.JsonConverter"

// jsonConverterIgnorable are JsonConverter settings that cannot change what
// it writes for an outbox record (no decimals, no defaults, a schema cache).
var jsonConverterIgnorable = []string{"schemas.cache.size", "decimal.format", "replace.null.with.default"}

// converters maps the key and value converters to outbox.key_encoding and
// outbox.value_encoding: raw for the converters that pass the bytes through,
// json or json-with-schema for JsonConverter (schemas.enable, true unless
// set, as JsonConverter's own default).
func (t *translator) converters() {
	for _, role := range []string{"key.converter", "value.converter", "header.converter"} {
		c, ok := t.get(role)
		c = strings.TrimSpace(c)
		raw := slices.Contains(rawConverters, c) || (role == "header.converter" && c == "org.apache.kafka.connect.storage.SimpleHeaderConverter")
		switch {
		case !ok && role != "header.converter":
			t.notes = append(t.notes, fmt.Sprintf("%s is absent: Debezium uses the Connect worker's default (often JsonConverter with schemas); cdc-relay writes the column's bytes as StringConverter does: set %s to be sure", role, role))
		case !ok || raw:
		case c == jsonConverterClass && role != "header.converter":
			t.jsonConverter(role, "outbox."+strings.TrimSuffix(role, ".converter")+"_encoding")
			continue
		case c == jsonConverterClass:
			t.refuse(role, "JsonConverter headers are not produced: cdc-relay writes header values as SimpleHeaderConverter does (the default); drop header.converter")
		default:
			t.refuse(role, fmt.Sprintf("%q is not supported: cdc-relay writes the column's bytes as StringConverter or ByteArrayConverter do, or JSON as JsonConverter does", c))
		}
		if ok && !raw {
			continue // the sub-properties are refused with the converter
		}
		for k := range t.props {
			if strings.HasPrefix(k, role+".") {
				t.consumed[k] = true
				t.ignored = append(t.ignored, k)
			}
		}
	}
}

// jsonConverter maps a JsonConverter key or value converter and its
// sub-properties.
func (t *translator) jsonConverter(role, key string) {
	enc := "json-with-schema"
	switch v := strings.ToLower(t.getOr(role+".schemas.enable", "true")); v {
	case "true":
	case "false":
		enc = "json"
	default:
		t.refuse(role+".schemas.enable", fmt.Sprintf("%q: want true or false", v))
	}
	t.put(key, enc, role)
	for k := range t.props {
		sub, ok := strings.CutPrefix(k, role+".")
		if !ok || t.consumed[k] {
			continue
		}
		t.consumed[k] = true
		if slices.Contains(jsonConverterIgnorable, sub) {
			t.ignored = append(t.ignored, k)
		} else {
			t.refuse(k, "JsonConverter option not implemented by cdc-relay")
		}
	}
}

// routerPrefix returns "transforms.<alias>." of the Outbox Event Router, or
// "" when the list has none (transforms refuses that).
func (t *translator) routerPrefix() string {
	list := t.props["transforms"]
	for _, alias := range strings.Split(list, ",") {
		p := "transforms." + strings.TrimSpace(alias) + "."
		if strings.TrimSpace(t.props[p+"type"]) == eventRouter {
			return p
		}
	}
	return ""
}

// eventRouterJSON maps the Event Router's JSON options: the expanded payload
// and its typing, the schema version, and the envelope schema's name.
func (t *translator) eventRouterJSON() {
	p := t.routerPrefix()
	if p == "" {
		return
	}
	valueEnc := t.str("outbox.value_encoding")
	switch v := strings.ToLower(t.getOr(p+"table.expand.json.payload", "false")); v {
	case "false":
	case "true":
		if valueEnc == "" {
			t.refuse(p+"table.expand.json.payload", "needs value.converter="+jsonConverterClass+" (with StringConverter Debezium writes the expanded Struct's toString())")
			break
		}
		t.put("format.expand_json_payload", true, p+"table.expand.json.payload")
	default:
		t.refuse(p+"table.expand.json.payload", fmt.Sprintf("%q: want true or false", v))
	}
	switch v := strings.ToLower(t.getOr(p+"table.json.payload.null.behavior", "ignore")); v {
	case "ignore":
	case "optional_bytes":
		t.put("format.json_null_fields", "optional-bytes", p+"table.json.payload.null.behavior")
	default:
		t.refuse(p+"table.json.payload.null.behavior", fmt.Sprintf("%q: want ignore or optional_bytes", v))
	}
	switch v := strings.ToLower(t.getOr(p+"table.json.payload.empty.array.behavior", "ignore")); v {
	case "ignore":
	case "optional_string":
		t.put("format.json_empty_arrays", "optional-string", p+"table.json.payload.empty.array.behavior")
	default:
		t.refuse(p+"table.json.payload.empty.array.behavior", fmt.Sprintf("%q: want ignore or optional_string", v))
	}
	if _, set := t.set["format.expand_json_payload"]; !set {
		// Without expansion these two cannot change the output.
		delete(t.set, "format.json_null_fields")
		delete(t.set, "format.json_empty_arrays")
	}
	envelope := strings.Contains(t.props[p+"table.fields.additional.placement"], ":envelope")
	if col := t.getOr(p+"table.field.event.schema.version", ""); col != "" {
		if valueEnc == "json-with-schema" && envelope {
			t.put("outbox.columns.schema_version", col, p+"table.field.event.schema.version")
		} else {
			t.notes = append(t.notes, p+"table.field.event.schema.version is ignored: only the envelope's schema has a version (JsonConverter with schemas and an envelope placement), as in Debezium")
		}
	}
	if valueEnc == "json-with-schema" && envelope {
		switch prefix, tables := t.getOr("topic.prefix", ""), t.str("tables"); {
		case prefix == "" || tables == "":
		case !strings.Contains(tables, ","):
			t.put("format.json_schema_name", prefix+"."+tables, "topic.prefix")
		default:
			// One name serves every table; Debezium names each table's.
			t.notes = append(t.notes, "topic.prefix is ignored for the envelope schema's name: with several tables cdc-relay names each table's <schema>.<table>, without Debezium's prefix (format.json_schema_name would name them all alike)")
		}
	}
	switch v := strings.ToLower(t.getOr(p+"table.fields.additional.error.on.missing", "true")); v {
	case "true":
	case "false":
		// Debezium skips a placed field an event lacks, which matters when
		// one router serves tables of different columns; cdc-relay checks
		// each table's columns at start.
		t.notes = append(t.notes, p+"table.fields.additional.error.on.missing=false: cdc-relay checks at start that each outbox table has every placed column; one a table lacks stops the relay with the column named (remove that placement, or give that table its own in a tables: entry)")
	default:
		t.refuse(p+"table.fields.additional.error.on.missing", fmt.Sprintf("%q: want true or false", v))
	}
}

// route maps the router's topic routing, properties prefixed p: the topic
// starts as the route.by.field column's value, which Kafka Connect's
// RegexRouter then rewrites with route.topic.regex and
// route.topic.replacement when the regex matches it whole. With the default
// regex and a replacement using only ${routedByValue}, that is a plain
// template ({aggregate_type} or {event_type} for the value); otherwise it is
// outbox.topic_regex over that field, outbox.topic the replacement in cdc-relay's
// template syntax (javaReplacement).
func (t *translator) route(p string) {
	byField := t.getOr(p+"route.by.field", "aggregatetype")
	regex := t.getOr(p+"route.topic.regex", defaultRegex)
	repl := t.getOr(p+"route.topic.replacement", "outbox.event."+routedByValue)
	placeholder, field := "{aggregate_type}", route.FieldAggregateType
	if byField == "type" {
		placeholder, field = "{event_type}", route.FieldEventType
		if col := t.getOr(p+"table.field.event.type", "type"); col != "type" {
			t.refuse(p+"table.field.event.type", fmt.Sprintf("%q with route.by.field=type: the relay routes by its event type column, which is then type; drop one of the two", col))
		}
		t.put("outbox.columns.event_type", "type", p+"route.by.field")
		// The relay still reads an aggregate type (a header); Debezium's
		// table has it in aggregatetype.
		t.put("outbox.columns.aggregate_type", "aggregatetype", "(Debezium's outbox column aggregatetype)")
	} else {
		t.put("outbox.columns.aggregate_type", byField, p+"route.by.field")
	}
	if regex == defaultRegex && !strings.ContainsAny(strings.ReplaceAll(repl, routedByValue, ""), `$\{}`) {
		t.put("outbox.topic", strings.ReplaceAll(repl, routedByValue, placeholder), p+"route.topic.replacement")
		return
	}
	if err := route.CheckRegex(regex); err != nil {
		t.refuse(p+"route.topic.regex", err.Error())
		return
	}
	topic, err := javaReplacement(repl)
	if err == nil {
		_, err = route.NewWithRegex(topic, route.Regex{Pattern: regex, Field: field})
	}
	if err != nil {
		t.refuse(p+"route.topic.replacement", fmt.Sprintf("%q: %v", repl, err))
		return
	}
	t.put("outbox.topic_regex", regex, p+"route.topic.regex")
	t.put("outbox.topic_regex_field", field, p+"route.by.field")
	t.put("outbox.topic", topic, p+"route.topic.replacement")
}

// javaReplacement translates a replacement string of Java's Matcher
// (route.topic.replacement) to a topic template: the group references $n and
// ${name} are the template's own; a backslash makes the next character
// literal, which a topic name can hold only when it is one of [a-zA-Z0-9._-];
// braces, never legal in a topic name, would read as placeholders and are
// refused.
func javaReplacement(repl string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(repl); i++ {
		switch c := repl[i]; c {
		case '\\':
			if i+1 == len(repl) {
				return "", errors.New("ends in a backslash, which escapes nothing")
			}
			i++
			if route.ValidTopic(repl[i:i+1]) != nil && repl[i] != '.' {
				return "", fmt.Errorf(`\%c is a literal %q, which no Kafka topic name can hold`, repl[i], repl[i])
			}
			b.WriteByte(repl[i])
		case '$':
			if i+1 < len(repl) && repl[i+1] == '{' {
				end := strings.IndexByte(repl[i:], '}')
				if end < 0 {
					return "", errors.New("a ${ without its }")
				}
				if name := repl[i+2 : i+end]; name == "" || !isASCIILetter(name[0]) {
					return "", fmt.Errorf("${%s}: a group name starts with a letter", name)
				}
				b.WriteString(repl[i : i+end+1])
				i += end
				continue
			}
			if i+1 == len(repl) || repl[i+1] < '0' || repl[i+1] > '9' {
				return "", errors.New("a $ that is neither $n nor ${name} (write \\$ for a literal one, which a topic name cannot hold either)")
			}
			b.WriteByte(c)
		case '{', '}':
			return "", fmt.Errorf("%q is a literal %c, which no Kafka topic name can hold", repl, c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

func isASCIILetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// transforms maps the Outbox Event Router, under its alias.
func (t *translator) transforms() {
	list, _ := t.get("transforms")
	var router string
	for _, alias := range strings.Split(list, ",") {
		alias = strings.TrimSpace(alias)
		if alias == "" {
			continue
		}
		prefix := "transforms." + alias + "."
		if typ, _ := t.get(prefix + "type"); strings.TrimSpace(typ) == eventRouter && router == "" {
			router = alias
			continue
		}
		typ := t.props[prefix+"type"]
		t.refuse("transforms."+alias, fmt.Sprintf("transform %q is not supported (cdc-relay applies the Outbox Event Router only)", typ))
		for k := range t.props {
			if strings.HasPrefix(k, prefix) {
				t.consumed[k] = true
			}
		}
	}
	if router == "" {
		t.refuse("transforms", "no "+eventRouter+" in the list: cdc-relay produces what the Outbox Event Router does, not Debezium's change events")
		return
	}
	p := "transforms." + router + "."
	t.put("outbox.columns.id", t.getOr(p+"table.field.event.id", "id"), p+"table.field.event.id")
	t.put("outbox.columns.aggregate_id", t.getOr(p+"table.field.event.key", "aggregateid"), p+"table.field.event.key")
	t.put("outbox.columns.payload", t.getOr(p+"table.field.event.payload", "payload"), p+"table.field.event.payload")
	// Debezium's router reads no event type column of its own: since 2.0
	// (EventRouterConfigDefinition has no table.field.event.type any more)
	// a type reaches the message only through
	// table.fields.additional.placement, which names the column itself, or
	// as the routed-by field. So no event type column is required unless the
	// config names one (1.x's table.field.event.type) or routes by type
	// (route sets it then); the relay's event_type header is then empty.
	t.put("outbox.columns.event_type", t.getOr(p+"table.field.event.type", ""), p+"table.field.event.type")
	t.put("outbox.columns.tracing", t.getOr(p+"tracing.span.context.field", "tracingspancontext"), p+"tracing.span.context.field")

	t.route(p)

	if col := t.getOr(p+"table.field.event.timestamp", ""); col != "" {
		t.put("outbox.columns.timestamp", col, p+"table.field.event.timestamp")
	}
	switch op := t.getOr(p+"table.op.invalid.behavior", "warn"); op {
	case "warn", "error", "fatal":
		t.put("delivery.on_outbox_update", op, p+"table.op.invalid.behavior")
	default:
		t.refuse(p+"table.op.invalid.behavior", fmt.Sprintf("%q: want warn, error or fatal", op))
	}
	switch tomb := strings.ToLower(t.getOr(p+"route.tombstone.on.empty.payload", "false")); tomb {
	case "true", "false":
		t.put("format.tombstone_on_empty_payload", tomb == "true", p+"route.tombstone.on.empty.payload")
	default:
		t.refuse(p+"route.tombstone.on.empty.payload", fmt.Sprintf("%q: want true or false", tomb))
	}

	if pl := t.getOr(p+"table.fields.additional.placement", ""); pl != "" {
		var headers, envelope []string
		for _, e := range strings.Split(pl, ",") {
			parts := strings.Split(strings.TrimSpace(e), ":")
			if len(parts) < 2 || len(parts) > 3 || parts[0] == "" {
				t.refuse(p+"table.fields.additional.placement", fmt.Sprintf("entry %q: want column:header[:alias]", e))
				continue
			}
			alias := parts[0]
			if len(parts) == 3 && parts[2] != "" {
				alias = parts[2]
			}
			switch parts[1] {
			case "header":
				headers = append(headers, parts[0]+"="+alias)
			case "envelope":
				envelope = append(envelope, parts[0]+"="+alias)
			case "partition":
				t.put("outbox.columns.partition", parts[0], p+"table.fields.additional.placement")
			default:
				t.refuse(p+"table.fields.additional.placement", fmt.Sprintf("entry %q: placement %s is unknown (header, envelope or partition)", e, parts[1]))
			}
		}
		if len(headers) > 0 {
			t.put("outbox.header_columns", strings.Join(headers, ","), p+"table.fields.additional.placement")
		}
		if len(envelope) > 0 {
			t.put("outbox.envelope_columns", strings.Join(envelope, ","), p+"table.fields.additional.placement")
		}
	}
	for k := range t.props {
		if strings.HasPrefix(k, p) && !t.consumed[k] {
			switch strings.TrimPrefix(k, p) {
			case "predicate", "negate":
				t.refuse(k, "predicates are not supported: cdc-relay routes every row of the outbox table")
			default:
				t.refuse(k, "Event Router option not implemented by cdc-relay")
			}
		}
	}
}

// ignorable are properties that cannot change what cdc-relay produces:
// Connect's runtime, error tolerance, polling and buffer tuning.
var ignorable = regexp.MustCompile(`^(errors\..*|offset\.flush\.(interval|timeout)\.ms|poll\.interval\.ms|max\.batch\.size|max\.queue\.size(\.in\.bytes)?|status\.update\.interval\.ms|snapshot\.fetch\.size|database\.tcpKeepAlive|retriable\.restart\.connector\.wait\.ms|connect\.timeout\.ms|database\.initial\.statements|xmin\.fetch\.interval\.ms|provide\.transaction\.metadata|tombstones\.on\.delete|config\.action\.reload|notification\..*|signal\..*|incremental\.snapshot\..*)$`)

// rest classifies every property not handled yet.
func (t *translator) rest() {
	for k := range t.props {
		if t.consumed[k] {
			continue
		}
		if ignorable.MatchString(k) {
			t.ignored = append(t.ignored, k)
			continue
		}
		t.refuse(k, "not implemented by cdc-relay")
	}
}

// millis writes n milliseconds as a duration, without zero trailing units
// (1m, not 1m0s), as a person writes one.
func millis(n int64) string {
	s := (time.Duration(n) * time.Millisecond).String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
