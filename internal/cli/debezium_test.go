package cli

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/route"
)

// minimalDbz is the least a connector config needs for cdc-relay.
const minimalDbz = `connector.class=io.debezium.connector.postgresql.PostgresConnector
database.hostname=db
database.user=relay
database.dbname=app
plugin.name=pgoutput
table.include.list=public.outbox
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
`

func TestParseConnectorConfig(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want map[string]string
	}{
		{"json with wrapper", `{"name": "orders", "config": {"connector.class": "x", "tasks.max": 1, "b": true, "n": null}}`,
			map[string]string{"name": "orders", "connector.class": "x", "tasks.max": "1", "b": "true"}},
		{"json wrapper name inside config wins", `{"name": "outer", "config": {"name": "inner"}}`, map[string]string{"name": "inner"}},
		{"json bare", ` {"connector.class": "x", "database.port": 5432}`, map[string]string{"connector.class": "x", "database.port": "5432"}},
		{"properties separators", "a=1\nb: 2\nc 3\nd   =   4  \ne=\n", map[string]string{"a": "1", "b": "2", "c": "3", "d": "4  ", "e": ""}},
		{"properties comments and blanks", "# c\n! c\n\n   \n  a = 1\n", map[string]string{"a": "1"}},
		{"properties continuation", "list=a,\\\n    b,\\\n    c\nnext=x\n", map[string]string{"list": "a,b,c", "next": "x"}},
		{"properties even backslashes do not continue", "a=x\\\\\nb=y\n", map[string]string{"a": `x\`, "b": "y"}},
		{"properties escapes", `k\=ey\:x=t\tn\u00e9\\ \= z` + "\n", map[string]string{"k=ey:x": "t\tné\\ = z"}},
		{"properties escaped space in key", `a\ b=c` + "\n", map[string]string{"a b": "c"}},
		{"properties crlf and last wins", "a=1\r\na=2\r\n", map[string]string{"a": "2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseConnectorConfig([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestParseConnectorConfigErrors(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"bad json", `{"a": `, "not valid JSON"},
		{"config not object", `{"config": "x"}`, `"config" must be an object`},
		{"stray key", `{"name": "n", "config": {}, "tasks": []}`, `unexpected key "tasks"`},
		{"nested value", `{"a": {"b": 1}}`, "property a: want a string"},
		{"bad unicode escape", "a=\\u12\n", "line 1: property a: malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConnectorConfig([]byte(tt.in))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestResolveIndirections(t *testing.T) {
	dir := t.TempDir()
	secrets := filepath.Join(dir, "secrets.properties")
	if err := os.WriteFile(secrets, []byte("password=s3cr:et\nuser = relay\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"PGHOST": "db.internal"}
	getenv := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	tests := []struct {
		name    string
		in      map[string]string
		want    map[string]string
		wantErr string
	}{
		{"file and env", map[string]string{"p": "${file:" + secrets + ":password}", "h": "${env:PGHOST}:5432", "u": "${file:" + secrets + ":user}"},
			map[string]string{"p": "s3cr:et", "h": "db.internal:5432", "u": "relay"}, ""},
		{"routedByValue is not an indirection", map[string]string{"r": "outbox.event.${routedByValue}"}, map[string]string{"r": "outbox.event.${routedByValue}"}, ""},
		{"unset env", map[string]string{"database.password": "${env:NOPE}"}, nil, "property database.password: cannot resolve ${env:NOPE}: environment variable NOPE is not set"},
		{"missing key", map[string]string{"database.user": "${file:" + secrets + ":nope}"}, nil, `property database.user: cannot resolve`},
		{"missing file", map[string]string{"database.user": "${file:/nonexistent/x.properties:a}"}, nil, "property database.user: cannot resolve ${file:/nonexistent/x.properties:a}: read /nonexistent"},
		{"unknown provider", map[string]string{"x": "${vault:secret/db:pw}"}, nil, `property x: cannot resolve ${vault:secret/db:pw}: config provider "vault"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := resolveIndirections(tt.in, getenv)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(tt.in, tt.want) {
				t.Errorf("got %q, want %q", tt.in, tt.want)
			}
		})
	}
}

// translate maps minimalDbz plus extra properties lines.
func translate(t *testing.T, extra string) (*debeziumMapping, error) {
	t.Helper()
	base := minimalDbz
	if strings.Contains(extra, "transforms=") { // extra names its own router
		base = strings.Replace(base, "transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n", "", 1)
	}
	props, err := parseProperties(base + extra)
	if err != nil {
		t.Fatal(err)
	}
	return translateDebezium("c.properties", props)
}

func TestTranslateDebezium(t *testing.T) {
	tests := []struct {
		name  string
		extra string
		flag  string
		want  any
	}{
		// Debezium's defaults, for a minimal config.
		{"default slot", "", "slot", "debezium"},
		{"default publication", "", "publication", "dbz_publication"},
		{"default create publication", "", "create-publication", true},
		{"default snapshot initial", "", "snapshot", "initial"},
		{"default id column", "", "column-id", "id"},
		{"default key column", "", "column-aggregate-id", "aggregateid"},
		{"default payload column", "", "column-payload", "payload"},
		{"default route column", "", "column-aggregate-type", "aggregatetype"},
		// Debezium's router reads no event type column unless routed by it
		// (EventRouterConfigDefinition, 2.x: no table.field.event.type).
		{"no event type column by default", "", "column-event-type", ""},
		{"1.x event type column", "transforms.outbox.table.field.event.type=event_kind\n", "column-event-type", "event_kind"},
		{"event type column when routed by type", "transforms.outbox.route.by.field=type\n", "column-event-type", "type"},
		{"default topic", "", "topic", "outbox.event.{aggregate_type}"},
		{"default tracing column", "", "column-tracing", "tracingspancontext"},
		{"pg url", "", "pg-url", "postgres://relay@db:5432/app"},
		// Each property.
		{"name", "name=orders-outbox\n", "relay-name", "orders-outbox"},
		{"password escaped, port, ssl", "database.password=p@ss/w:rd%\ndatabase.port=6432\ndatabase.sslmode=verify-full\ndatabase.sslrootcert=/ca.pem\ndatabase.sslcert=/c.pem\ndatabase.sslkey=/k.pem\n",
			"pg-url", "postgres://relay:p%40ss%2Fw%3Ard%25@db:6432/app?sslcert=%2Fc.pem&sslkey=%2Fk.pem&sslmode=verify-full&sslrootcert=%2Fca.pem"},
		{"slot", "slot.name=orders\n", "slot", "orders"},
		{"publication", "publication.name=orders_pub\n", "publication", "orders_pub"},
		{"autocreate disabled", "publication.autocreate.mode=disabled\n", "create-publication", false},
		{"autocreate filtered", "publication.autocreate.mode=filtered\n", "create-publication", true},
		{"table escaped dot", `table.include.list=app\.outbox` + "\n", "table", "app.outbox"},
		{"schema list of the table's schema", "schema.include.list=public\n", "table", "public.outbox"},
		{"heartbeat", "heartbeat.interval.ms=1500\n", "heartbeat-interval", "1.5s"},
		{"heartbeat minutes", "heartbeat.interval.ms=60000\n", "heartbeat-interval", "1m"},
		{"snapshot never", "snapshot.mode=never\n", "snapshot", "never"},
		{"snapshot no_data", "snapshot.mode=no_data\n", "snapshot", "never"},
		{"event id", "transforms.outbox.table.field.event.id=event_id\n", "column-id", "event_id"},
		{"event key", "transforms.outbox.table.field.event.key=aggregate_id\n", "column-aggregate-id", "aggregate_id"},
		{"event payload", "transforms.outbox.table.field.event.payload=body\n", "column-payload", "body"},
		{"route by field", "transforms.outbox.route.by.field=kind\n", "column-aggregate-type", "kind"},
		{"route by type", "transforms.outbox.route.by.field=type\n", "topic", "outbox.event.{event_type}"},
		{"replacement", "transforms.outbox.route.topic.replacement=${routedByValue}.events\n", "topic", "{aggregate_type}.events"},
		{"fixed topic", "transforms.outbox.route.topic.replacement=all.events\n", "topic", "all.events"},
		{"default regex accepted", "transforms.outbox.route.topic.regex=(?<routedByValue>.*)\n", "topic", "outbox.event.{aggregate_type}"},
		{"placement", "transforms.outbox.table.fields.additional.placement=type:header:eventType,aggregatetype:header\n", "header-columns", "type=eventType,aggregatetype=aggregatetype"},
		{"tracing", "transforms.outbox.tracing.span.context.field=trace\n", "column-tracing", "trace"},
		{"timestamp column", "transforms.outbox.table.field.event.timestamp=ts\n", "column-timestamp", "ts"},
		{"default invalid op: warn", "", "on-outbox-update", "warn"},
		{"invalid op fatal", "transforms.outbox.table.op.invalid.behavior=fatal\n", "on-outbox-update", "fatal"},
		{"default no tombstones", "", "tombstone-on-empty-payload", false},
		{"tombstones", "transforms.outbox.route.tombstone.on.empty.payload=true\n", "tombstone-on-empty-payload", true},
		{"envelope placement", "transforms.outbox.table.fields.additional.placement=type:envelope:eventType,aggregatetype:header\n", "envelope-columns", "type=eventType"},
		{"partition placement", "transforms.outbox.table.fields.additional.placement=part:partition\n", "column-partition", "part"},
		{"router under another alias", "transforms=router\ntransforms.router.type=io.debezium.transforms.outbox.EventRouter\ntransforms.router.table.field.event.key=k\n", "column-aggregate-id", "k"},
		{"bytes converter", "value.converter=org.apache.kafka.connect.converters.ByteArrayConverter\n", "column-payload", "payload"},
		{"binary data converter", "value.converter=io.debezium.converters.BinaryDataConverter\n", "column-payload", "payload"},
		{"string converter is raw", "", "value-encoding", nil},
		{"json converter with schemas by default", "value.converter=org.apache.kafka.connect.json.JsonConverter\n", "value-encoding", "json-with-schema"},
		{"json converter without schemas", "value.converter=org.apache.kafka.connect.json.JsonConverter\nvalue.converter.schemas.enable=false\n", "value-encoding", "json"},
		{"json key converter", "key.converter=org.apache.kafka.connect.json.JsonConverter\nkey.converter.schemas.enable=false\n", "key-encoding", "json"},
		{"expand json payload", "value.converter=org.apache.kafka.connect.json.JsonConverter\ntransforms.outbox.table.expand.json.payload=true\n", "expand-json-payload", true},
		{"null behavior", "value.converter=org.apache.kafka.connect.json.JsonConverter\ntransforms.outbox.table.expand.json.payload=true\ntransforms.outbox.table.json.payload.null.behavior=optional_bytes\n", "json-null-fields", "optional-bytes"},
		{"null behavior without expansion", "value.converter=org.apache.kafka.connect.json.JsonConverter\ntransforms.outbox.table.json.payload.null.behavior=optional_bytes\n", "json-null-fields", nil},
		{"empty array behavior", "value.converter=org.apache.kafka.connect.json.JsonConverter\ntransforms.outbox.table.expand.json.payload=true\ntransforms.outbox.table.json.payload.empty.array.behavior=optional_string\n", "json-empty-arrays", "optional-string"},
		{"schema version", "value.converter=org.apache.kafka.connect.json.JsonConverter\ntransforms.outbox.table.fields.additional.placement=type:envelope\ntransforms.outbox.table.field.event.schema.version=v\n", "column-schema-version", "v"},
		{"schema version without envelope", "value.converter=org.apache.kafka.connect.json.JsonConverter\ntransforms.outbox.table.field.event.schema.version=v\n", "column-schema-version", nil},
		{"schema name from topic.prefix", "value.converter=org.apache.kafka.connect.json.JsonConverter\ntopic.prefix=dbserver1\ntransforms.outbox.table.fields.additional.placement=type:envelope\n", "json-schema-name", "dbserver1.public.outbox"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := translate(t, tt.extra)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := m.value(tt.flag)
			if tt.want == nil {
				if ok {
					t.Errorf("--%s = %#v, want it unset", tt.flag, got)
				}
				return
			}
			if !ok || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("--%s = %#v (set %v), want %#v", tt.flag, got, ok, tt.want)
			}
		})
	}
}

// TestTranslatePublishedDebeziumConfigs: router configs as users publish
// them, each translated whole. The expectations follow Debezium's router
// (debezium-core io/debezium/transforms/outbox: EventRouterConfigDefinition's
// defaults, EventRouterDelegate's reads) and its outbox documentation: the
// id, key and payload columns and the routed-by column are read, an event
// type column only when named or routed by, each placement by its own
// column name, under its alias.
func TestTranslatePublishedDebeziumConfigs(t *testing.T) {
	tests := []struct {
		name  string
		extra string
		want  map[string]any
	}{{
		name: "own column names, routed by a topic column, CloudEvents headers",
		extra: "transforms.outbox.table.field.event.key=message_key\n" +
			"transforms.outbox.route.by.field=topic\n" +
			"transforms.outbox.route.topic.replacement=${routedByValue}\n" +
			"transforms.outbox.table.fields.additional.placement=id:header:ce_id,event_type:header:ce_type,content_type:header:content-type\n",
		want: map[string]any{
			"column-aggregate-id": "message_key", "column-aggregate-type": "topic", "topic": "{aggregate_type}",
			"column-event-type": "", "header-columns": "id=ce_id,event_type=ce_type,content_type=content-type",
		},
	}, {
		name: "one fixed topic, event timestamp, type into the envelope",
		extra: "value.converter=org.apache.kafka.connect.json.JsonConverter\n" +
			"transforms.outbox.route.topic.replacement=domain.events\n" +
			"transforms.outbox.table.field.event.timestamp=occurred_at\n" +
			"transforms.outbox.table.fields.additional.placement=type:envelope:eventType\n",
		want: map[string]any{
			"topic": "domain.events", "column-timestamp": "occurred_at", "envelope-columns": "type=eventType",
			"column-event-type": "", "column-aggregate-type": "aggregatetype", "value-encoding": "json-with-schema",
		},
	}, {
		name: "routed by the event type",
		extra: "transforms.outbox.route.by.field=type\n" +
			"transforms.outbox.route.topic.replacement=events.${routedByValue}\n",
		want: map[string]any{"topic": "events.{event_type}", "column-event-type": "type", "column-aggregate-type": "aggregatetype"},
	}, {
		name: "Debezium 1.x names its event type column",
		extra: "transforms.outbox.table.field.event.id=event_id\n" +
			"transforms.outbox.table.field.event.type=event_type\n" +
			"transforms.outbox.table.field.event.payload=event_payload\n",
		want: map[string]any{"column-id": "event_id", "column-event-type": "event_type", "column-payload": "event_payload"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := translate(t, tt.extra)
			if err != nil {
				t.Fatal(err)
			}
			for flag, want := range tt.want {
				if got, ok := m.value(flag); !ok || !reflect.DeepEqual(got, want) {
					t.Errorf("--%s = %#v (set %v), want %#v", flag, got, ok, want)
				}
			}
		})
	}
}

func TestTranslateDebeziumRefuses(t *testing.T) {
	tests := []struct{ name, props, want string }{
		{"other connector", strings.Replace(minimalDbz, "postgresql.PostgresConnector", "mysql.MySqlConnector", 1), `connector.class: "io.debezium.connector.mysql.MySqlConnector" is not supported`},
		{"no connector", strings.Replace(minimalDbz, "connector.class", "#", 1), "connector.class: missing"},
		{"event type column beside routing by type", minimalDbz + "transforms.outbox.route.by.field=type\ntransforms.outbox.table.field.event.type=kind\n", `table.field.event.type: "kind" with route.by.field=type`},
		{"decoderbufs", minimalDbz + "plugin.name=decoderbufs\n", `plugin.name: "decoderbufs": cdc-relay reads pgoutput only`},
		{"two tables", minimalDbz + "table.include.list=public.a,public.b\n", "lists 2 tables"},
		{"pattern", minimalDbz + "table.include.list=public.outbox.*\n", "is a pattern"},
		{"no schema", minimalDbz + "table.include.list=outbox\n", "write the schema too"},
		{"snapshot mode", minimalDbz + "snapshot.mode=when_needed\n", `snapshot.mode: "when_needed" is not supported`},
		{"regex with a lookahead", minimalDbz + "transforms.outbox.route.topic.regex=(?<routedByValue>ord(?=er).*)\n", `transforms.outbox.route.topic.regex: topic regex "(?<routedByValue>ord(?=er).*)": "(?=e" is a lookaround`},
		{"json header converter", minimalDbz + "header.converter=org.apache.kafka.connect.json.JsonConverter\n", "header.converter: JsonConverter headers are not produced"},
		{"json converter option", minimalDbz + "value.converter=org.apache.kafka.connect.json.JsonConverter\nvalue.converter.bogus=1\n", "value.converter.bogus: JsonConverter option not implemented"},
		{"expand with string converter", minimalDbz + "transforms.outbox.table.expand.json.payload=true\n", "table.expand.json.payload: needs value.converter="},
		{"error on missing bad", minimalDbz + "transforms.outbox.table.fields.additional.error.on.missing=maybe\n", `error.on.missing: "maybe": want true or false`},
		{"bad null behavior", minimalDbz + "transforms.outbox.table.json.payload.null.behavior=drop\n", `null.behavior: "drop": want ignore or optional_bytes`},
		{"no router", strings.Replace(minimalDbz, "transforms=outbox", "transforms=", 1), "transforms: no io.debezium.transforms.outbox.EventRouter"},
		{"other schema list", minimalDbz + "schema.include.list=app\n", `schema.include.list: "app"`},
		{"bad port", minimalDbz + "database.port=x\n", `database.port: "x"`},
		{"no host", strings.Replace(minimalDbz, "database.hostname=db", "", 1), "database.hostname: missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			props, err := parseProperties(tt.props)
			if err != nil {
				t.Fatal(err)
			}
			_, err = translateDebezium("c.properties", props)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), "debezium config c.properties") {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

// TestTranslateDebeziumUnsupportedAtOnce: every property cdc-relay does not
// implement is named in one error.
func TestTranslateDebeziumUnsupportedAtOnce(t *testing.T) {
	_, err := translate(t, `transforms.outbox.table.expand.json.payload=true
transforms.outbox.table.op.invalid.behavior=explode
transforms.outbox.route.tombstone.on.empty.payload=maybe
transforms.outbox.table.fields.additional.placement=type:value:eventType
column.exclude.list=public.outbox.secret
slot.drop.on.stop=true
`)
	var de *debeziumError
	if !errors.As(err, &de) {
		t.Fatalf("error %v, want a debeziumError", err)
	}
	for _, want := range []string{
		"transforms.outbox.table.expand.json.payload", `transforms.outbox.table.op.invalid.behavior: "explode"`,
		`transforms.outbox.route.tombstone.on.empty.payload: "maybe"`, `entry "type:value:eventType": placement value`,
		"column.exclude.list", "slot.drop.on.stop",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s:\n%v", want, err)
		}
	}
	if len(de.problems) != 6 {
		t.Errorf("%d problems, want 6:\n%v", len(de.problems), err)
	}
}

// TestTranslateDebeziumWarnings: what cannot change the output is named in
// one warning.
func TestTranslateDebeziumWarnings(t *testing.T) {
	m, err := translate(t, "tasks.max=1\nerrors.tolerance=all\noffset.flush.interval.ms=1000\nvalue.converter.schemas.enable=false\ntopic.prefix=dbserver1\ntransforms.outbox.table.fields.additional.error.on.missing=false\n")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(m.Warnings, "\n"), "error.on.missing=false: cdc-relay relays one table") {
		t.Errorf("no error.on.missing warning in %q", m.Warnings)
	}
	var ignored string
	for _, w := range m.Warnings {
		if strings.HasPrefix(w, "ignored") {
			if ignored != "" {
				t.Errorf("two ignored warnings: %q and %q", ignored, w)
			}
			ignored = w
		}
	}
	for _, p := range []string{"tasks.max", "errors.tolerance", "offset.flush.interval.ms", "value.converter.schemas.enable"} {
		if !strings.Contains(ignored, p) {
			t.Errorf("warning %q does not name %s", ignored, p)
		}
	}
}

// TestDebeziumPrecedence: flags > env > --config file > --debezium-config >
// defaults, and config print names the debezium source.
func TestDebeziumPrecedence(t *testing.T) {
	tests := []struct {
		name   string
		file   string // --config YAML, "" for none
		env    string
		args   []string
		want   string
		source string
	}{
		{"debezium over default", "", "", nil, "orders", sourceDebezium},
		{"file over debezium", "slot: from_file\n", "", nil, "from_file", sourceFile},
		{"env over debezium", "", "from_env", nil, "from_env", sourceEnv},
		{"flag over all", "slot: from_file\n", "from_env", []string{"--slot", "from_flag"}, "from_flag", sourceFlag},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			dir := t.TempDir()
			dbz := writeFile(t, dir, "c.properties", minimalDbz+"slot.name=orders\n")
			args := []string{"--debezium-config", dbz, "--kafka-brokers", "k:9092"}
			if tt.file != "" {
				args = append(args, "--config", writeFile(t, dir, "relay.yaml", tt.file))
			}
			if tt.env != "" {
				t.Setenv(envName("slot"), tt.env)
			}
			args = append(args, tt.args...)
			c, err := parseArgs(t, append([]string{"run"}, args...)...)
			if err != nil {
				t.Fatalf("run %q: %v", args, err)
			}
			if c.Run.Slot != tt.want {
				t.Errorf("--slot = %q, want %q", c.Run.Slot, tt.want)
			}
			if c.Run.Topic != "outbox.event.{aggregate_type}" || c.Run.ColumnAggregateType != "aggregatetype" {
				t.Errorf("topic %q, aggregate type column %q: the debezium file was not applied", c.Run.Topic, c.Run.ColumnAggregateType)
			}
			p := configPrint(t, args...)
			if got := p.source("slot"); got != tt.source {
				t.Errorf("config print: source of --slot = %q, want %q", got, tt.source)
			}
		})
	}
}

// TestFromDebeziumRoundTrip: config from-debezium prints YAML that --config
// loads into the same run configuration as --debezium-config.
func TestFromDebeziumRoundTrip(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	dbz := writeFile(t, dir, "c.json", `{"name": "orders", "config": {
		"connector.class": "io.debezium.connector.postgresql.PostgresConnector",
		"database.hostname": "db", "database.port": "5433", "database.user": "relay",
		"database.password": "p@ss: \"x\"", "database.dbname": "app", "plugin.name": "pgoutput",
		"table.include.list": "public.outbox", "heartbeat.interval.ms": 30000,
		"publication.autocreate.mode": "disabled", "snapshot.mode": "never",
		"key.converter": "org.apache.kafka.connect.storage.StringConverter",
		"value.converter": "org.apache.kafka.connect.storage.StringConverter",
		"transforms": "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
		"transforms.outbox.table.fields.additional.placement": "type:header:eventType,aggregatetype:header:kind"}}`)
	err, out, _ := run(t, canceled(), "config", "from-debezium", dbz)
	if err != nil {
		t.Fatal(err)
	}
	yamlPath := writeFile(t, dir, "relay.yaml", out)
	fromYAML, err := parseArgs(t, "run", "--config", yamlPath, "--kafka-brokers", "k:9092")
	if err != nil {
		t.Fatalf("load printed YAML: %v\n%s", err, out)
	}
	fromDbz, err := parseArgs(t, "run", "--debezium-config", dbz, "--kafka-brokers", "k:9092")
	if err != nil {
		t.Fatal(err)
	}
	fromYAML.ConfigFile, fromDbz.DebeziumConfig = "", ""
	if !reflect.DeepEqual(fromYAML.Run, fromDbz.Run) {
		t.Errorf("run configurations differ:\nYAML     %+v\ndebezium %+v\nYAML file:\n%s", fromYAML.Run, fromDbz.Run, out)
	}
	if got := fromDbz.Run.HeaderColumns; !reflect.DeepEqual(got, []string{"type=eventType", "aggregatetype=kind"}) {
		t.Errorf("--header-columns = %q", got)
	}
	if fromDbz.Run.HeartbeatInterval.String() != "30s" || fromDbz.Run.CreatePublication || fromDbz.Run.RelayName != "orders" {
		t.Errorf("heartbeat %v, create-publication %v, relay-name %q", fromDbz.Run.HeartbeatInterval, fromDbz.Run.CreatePublication, fromDbz.Run.RelayName)
	}
}

// TestTranslateDebeziumTopicRegex maps route.topic.regex and
// route.topic.replacement to --topic-regex, --topic-regex-field and --topic,
// and routes events with the result as Kafka Connect's RegexRouter would:
// the replacement when the route.by.field value matches the regex as a
// whole, the value itself otherwise.
func TestTranslateDebeziumTopicRegex(t *testing.T) {
	const p = "transforms.outbox."
	tests := []struct {
		name, props         string
		topic, regex, field string
		routes              map[[2]string]string // {aggregate type, event type} → topic
	}{
		{name: "default regex, default replacement: a plain template", props: "",
			topic: "outbox.event.{aggregate_type}", routes: map[[2]string]string{{"order", "Placed"}: "outbox.event.order"}},
		{name: "default regex with $1", props: p + "route.topic.replacement=events.$1\n",
			topic: "events.$1", regex: "(?<routedByValue>.*)", field: "aggregate_type",
			routes: map[[2]string]string{{"order", "Placed"}: "events.order"}},
		{name: "a regex over the aggregate type", props: p + "route.topic.regex=(?<region>eu|us)-(?<routedByValue>.*)\n" + p + "route.topic.replacement=outbox.${region}.${routedByValue}\n",
			topic: "outbox.${region}.${routedByValue}", regex: "(?<region>eu|us)-(?<routedByValue>.*)", field: "aggregate_type",
			routes: map[[2]string]string{{"eu-order", "Placed"}: "outbox.eu.order", {"us-invoice", "Paid"}: "outbox.us.invoice", {"apac-order", "Placed"}: "apac-order"}},
		{name: "Debezium's topic routing example", props: p + "route.topic.regex=(.*)customers_shard(.*)\n" + p + "route.topic.replacement=$1customers_all_shards\n",
			topic: "$1customers_all_shards", regex: "(.*)customers_shard(.*)", field: "aggregate_type",
			routes: map[[2]string]string{{"myserver.mydb.customers_shard1", ""}: "myserver.mydb.customers_all_shards", {"customers", ""}: "customers"}},
		{name: "route by type", props: p + "route.by.field=type\n" + p + "route.topic.regex=(.*)Placed\n" + p + "route.topic.replacement=placed.$1\n",
			topic: "placed.$1", regex: "(.*)Placed", field: "event_type",
			routes: map[[2]string]string{{"order", "OrderPlaced"}: "placed.Order", {"order", "OrderPaid"}: "OrderPaid"}},
		{name: "escaped dot", props: p + "route.topic.regex=(.*)\n" + p + "route.topic.replacement=outbox\\\\.$1\n",
			topic: "outbox.$1", regex: "(.*)", field: "aggregate_type", routes: map[[2]string]string{{"order", ""}: "outbox.order"}},
		{name: "a fixed replacement", props: p + "route.topic.regex=order|invoice\n" + p + "route.topic.replacement=billing\n",
			topic: "billing", regex: "order|invoice", field: "aggregate_type",
			routes: map[[2]string]string{{"invoice", ""}: "billing", {"customer", ""}: "customer"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := translate(t, tt.props)
			if err != nil {
				t.Fatal(err)
			}
			get := func(flag string) string {
				v, _ := m.value(flag)
				s, _ := v.(string)
				return s
			}
			if get("topic") != tt.topic || get("topic-regex") != tt.regex || get("topic-regex-field") != tt.field {
				t.Fatalf("--topic %q --topic-regex %q --topic-regex-field %q; want %q %q %q",
					get("topic"), get("topic-regex"), get("topic-regex-field"), tt.topic, tt.regex, tt.field)
			}
			r, err := route.NewWithRegex(get("topic"), route.Regex{Pattern: get("topic-regex"), Field: get("topic-regex-field")})
			if err != nil {
				t.Fatal(err)
			}
			for in, want := range tt.routes {
				got, err := r.Topic(&outbox.Event{AggregateType: []byte(in[0]), EventType: []byte(in[1])})
				if err != nil || got != want {
					t.Errorf("topic of %v = %q, %v; want %q", in, got, err, want)
				}
			}
		})
	}
}

func TestTranslateDebeziumTopicRegexRefuses(t *testing.T) {
	const p = "transforms.outbox."
	tests := []struct{ name, props, want string }{
		{"Debezium's invalid regex test", p + "route.topic.regex= [[a-z]\n", p + "route.topic.regex: topic regex"},
		{"backreference", p + "route.topic.regex=(a)\\\\1\n", "backreference"},
		{"possessive", p + "route.topic.regex=a*+\n", "possessive"},
		{"unknown group", p + "route.topic.regex=(.*)\n" + p + "route.topic.replacement=x.${nope}\n", p + `route.topic.replacement: "x.${nope}": topic template "x.${nope}": ${nope}: the regex has no group named "nope"`},
		{"other name with the default regex", p + "route.topic.replacement=x.${other}\n", `no group named "other"`},
		{"literal dollar", p + "route.topic.regex=(.*)\n" + p + "route.topic.replacement=a\\\\$1\n", `\$ is a literal '$'`},
		{"bare dollar", p + "route.topic.regex=(.*)\n" + p + "route.topic.replacement=a$\n", "neither $n nor ${name}"},
		{"trailing backslash", p + "route.topic.regex=(.*)\n" + p + "route.topic.replacement=a\\\\\n", "ends in a backslash"},
		{"braces", p + "route.topic.regex=(.*)\n" + p + "route.topic.replacement=outbox.{aggregate_type}\n", "literal {"},
		{"numbered braces", p + "route.topic.regex=(.*)\n" + p + "route.topic.replacement=x${1}\n", "starts with a letter"},
		{"group beyond the regex", p + "route.topic.regex=(.*)\n" + p + "route.topic.replacement=x$2\n", "the regex has 1 groups"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := translate(t, tt.props)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}
