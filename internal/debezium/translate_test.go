package debezium

import (
	"errors"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/route"
)

// minimal is the least a connector config needs for cdc-relay.
const minimal = `connector.class=io.debezium.connector.postgresql.PostgresConnector
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

// translateMinimal maps minimal plus extra properties lines.
func translateMinimal(t *testing.T, extra string) (*Translation, error) {
	t.Helper()
	base := minimal
	if strings.Contains(extra, "transforms=") { // extra names its own router
		base = strings.Replace(base, "transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n", "", 1)
	}
	props, err := parseProperties(base + extra)
	if err != nil {
		t.Fatal(err)
	}
	return translate("c.properties", props, nil)
}

func TestTranslate(t *testing.T) {
	tests := []struct {
		name  string
		extra string
		key   string
		want  any
	}{
		// Debezium's defaults, for a minimal config.
		{"default slot", "", "source.slot", "debezium"},
		{"default publication", "", "source.publication", "dbz_publication"},
		{"default create publication", "", "source.create_publication", true},
		{"default snapshot initial", "", "delivery.snapshot", "initial"},
		{"default id column", "", "outbox.columns.id", "id"},
		{"default key column", "", "outbox.columns.aggregate_id", "aggregateid"},
		{"default payload column", "", "outbox.columns.payload", "payload"},
		{"default route column", "", "outbox.columns.aggregate_type", "aggregatetype"},
		// Debezium's router reads no event type column unless routed by it
		// (EventRouterConfigDefinition, 2.x: no table.field.event.type).
		{"no event type column by default", "", "outbox.columns.event_type", ""},
		{"1.x event type column", "transforms.outbox.table.field.event.type=event_kind\n", "outbox.columns.event_type", "event_kind"},
		{"event type column when routed by type", "transforms.outbox.route.by.field=type\n", "outbox.columns.event_type", "type"},
		{"default topic", "", "outbox.topic", "outbox.event.{aggregate_type}"},
		{"default tracing column", "", "outbox.columns.tracing", "tracingspancontext"},
		{"pg url", "", "source.pg_url", "postgres://relay@db:5432/app"},
		// Each property.
		{"name", "name=orders-outbox\n", "operations.relay_name", "orders-outbox"},
		{"password escaped, port, ssl", "database.password=p@ss/w:rd%\ndatabase.port=6432\ndatabase.sslmode=verify-full\ndatabase.sslrootcert=/ca.pem\ndatabase.sslcert=/c.pem\ndatabase.sslkey=/k.pem\n",
			"source.pg_url", "postgres://relay:p%40ss%2Fw%3Ard%25@db:6432/app?sslcert=%2Fc.pem&sslkey=%2Fk.pem&sslmode=verify-full&sslrootcert=%2Fca.pem"},
		{"slot", "slot.name=orders\n", "source.slot", "orders"},
		{"publication", "publication.name=orders_pub\n", "source.publication", "orders_pub"},
		{"autocreate disabled", "publication.autocreate.mode=disabled\n", "source.create_publication", false},
		{"autocreate filtered", "publication.autocreate.mode=filtered\n", "source.create_publication", true},
		{"table escaped dot", `table.include.list=app\.outbox` + "\n", "tables", "app.outbox"},
		{"schema list of the table's schema", "schema.include.list=public\n", "tables", "public.outbox"},
		{"heartbeat", "heartbeat.interval.ms=1500\n", "source.heartbeat_interval", "1.5s"},
		{"heartbeat minutes", "heartbeat.interval.ms=60000\n", "source.heartbeat_interval", "1m"},
		{"snapshot never", "snapshot.mode=never\n", "delivery.snapshot", "never"},
		{"snapshot no_data", "snapshot.mode=no_data\n", "delivery.snapshot", "never"},
		{"event id", "transforms.outbox.table.field.event.id=event_id\n", "outbox.columns.id", "event_id"},
		{"event key", "transforms.outbox.table.field.event.key=aggregate_id\n", "outbox.columns.aggregate_id", "aggregate_id"},
		{"event payload", "transforms.outbox.table.field.event.payload=body\n", "outbox.columns.payload", "body"},
		{"route by field", "transforms.outbox.route.by.field=kind\n", "outbox.columns.aggregate_type", "kind"},
		{"route by type", "transforms.outbox.route.by.field=type\n", "outbox.topic", "outbox.event.{event_type}"},
		{"replacement", "transforms.outbox.route.topic.replacement=${routedByValue}.events\n", "outbox.topic", "{aggregate_type}.events"},
		{"fixed topic", "transforms.outbox.route.topic.replacement=all.events\n", "outbox.topic", "all.events"},
		{"default regex accepted", "transforms.outbox.route.topic.regex=(?<routedByValue>.*)\n", "outbox.topic", "outbox.event.{aggregate_type}"},
		{"placement", "transforms.outbox.table.fields.additional.placement=type:header:eventType,aggregatetype:header\n", "outbox.header_columns", "type=eventType,aggregatetype=aggregatetype"},
		{"tracing", "transforms.outbox.tracing.span.context.field=trace\n", "outbox.columns.tracing", "trace"},
		{"timestamp column", "transforms.outbox.table.field.event.timestamp=ts\n", "outbox.columns.timestamp", "ts"},
		{"default invalid op: warn", "", "delivery.on_outbox_update", "warn"},
		{"invalid op fatal", "transforms.outbox.table.op.invalid.behavior=fatal\n", "delivery.on_outbox_update", "fatal"},
		{"default no tombstones", "", "format.tombstone_on_empty_payload", false},
		{"tombstones", "transforms.outbox.route.tombstone.on.empty.payload=true\n", "format.tombstone_on_empty_payload", true},
		{"envelope placement", "transforms.outbox.table.fields.additional.placement=type:envelope:eventType,aggregatetype:header\n", "outbox.envelope_columns", "type=eventType"},
		{"partition placement", "transforms.outbox.table.fields.additional.placement=part:partition\n", "outbox.columns.partition", "part"},
		{"router under another alias", "transforms=router\ntransforms.router.type=io.debezium.transforms.outbox.EventRouter\ntransforms.router.table.field.event.key=k\n", "outbox.columns.aggregate_id", "k"},
		{"bytes converter", "value.converter=org.apache.kafka.connect.converters.ByteArrayConverter\n", "outbox.columns.payload", "payload"},
		{"binary data converter", "value.converter=io.debezium.converters.BinaryDataConverter\n", "outbox.columns.payload", "payload"},
		{"string converter is raw", "", "outbox.value_encoding", nil},
		{"json converter with schemas by default", "value.converter=org.apache.kafka.connect.json.JsonConverter\n", "outbox.value_encoding", "json-with-schema"},
		{"json converter without schemas", "value.converter=org.apache.kafka.connect.json.JsonConverter\nvalue.converter.schemas.enable=false\n", "outbox.value_encoding", "json"},
		{"json key converter", "key.converter=org.apache.kafka.connect.json.JsonConverter\nkey.converter.schemas.enable=false\n", "outbox.key_encoding", "json"},
		{"expand json payload", "value.converter=org.apache.kafka.connect.json.JsonConverter\ntransforms.outbox.table.expand.json.payload=true\n", "format.expand_json_payload", true},
		{"null behavior", "value.converter=org.apache.kafka.connect.json.JsonConverter\ntransforms.outbox.table.expand.json.payload=true\ntransforms.outbox.table.json.payload.null.behavior=optional_bytes\n", "format.json_null_fields", "optional-bytes"},
		{"null behavior without expansion", "value.converter=org.apache.kafka.connect.json.JsonConverter\ntransforms.outbox.table.json.payload.null.behavior=optional_bytes\n", "format.json_null_fields", nil},
		{"empty array behavior", "value.converter=org.apache.kafka.connect.json.JsonConverter\ntransforms.outbox.table.expand.json.payload=true\ntransforms.outbox.table.json.payload.empty.array.behavior=optional_string\n", "format.json_empty_arrays", "optional-string"},
		{"schema version", "value.converter=org.apache.kafka.connect.json.JsonConverter\ntransforms.outbox.table.fields.additional.placement=type:envelope\ntransforms.outbox.table.field.event.schema.version=v\n", "outbox.columns.schema_version", "v"},
		{"schema version without envelope", "value.converter=org.apache.kafka.connect.json.JsonConverter\ntransforms.outbox.table.field.event.schema.version=v\n", "outbox.columns.schema_version", nil},
		{"schema name from topic.prefix", "value.converter=org.apache.kafka.connect.json.JsonConverter\ntopic.prefix=dbserver1\ntransforms.outbox.table.fields.additional.placement=type:envelope\n", "format.json_schema_name", "dbserver1.public.outbox"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := translateMinimal(t, tt.extra)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := m.Value(tt.key)
			if tt.want == nil {
				if ok {
					t.Errorf("%s = %#v, want it unset", tt.key, got)
				}
				return
			}
			if !ok || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("%s = %#v (set %v), want %#v", tt.key, got, ok, tt.want)
			}
		})
	}
}

// TestTranslatePublishedConfigs: router configs as users publish
// them, each translated whole. The expectations follow Debezium's router
// (debezium-core io/debezium/transforms/outbox: EventRouterConfigDefinition's
// defaults, EventRouterDelegate's reads) and its outbox documentation: the
// id, key and payload columns and the routed-by column are read, an event
// type column only when named or routed by, each placement by its own
// column name, under its alias.
func TestTranslatePublishedConfigs(t *testing.T) {
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
			"outbox.columns.aggregate_id": "message_key", "outbox.columns.aggregate_type": "topic", "outbox.topic": "{aggregate_type}",
			"outbox.columns.event_type": "", "outbox.header_columns": "id=ce_id,event_type=ce_type,content_type=content-type",
		},
	}, {
		name: "one fixed topic, event timestamp, type into the envelope",
		extra: "value.converter=org.apache.kafka.connect.json.JsonConverter\n" +
			"transforms.outbox.route.topic.replacement=domain.events\n" +
			"transforms.outbox.table.field.event.timestamp=occurred_at\n" +
			"transforms.outbox.table.fields.additional.placement=type:envelope:eventType\n",
		want: map[string]any{
			"outbox.topic": "domain.events", "outbox.columns.timestamp": "occurred_at", "outbox.envelope_columns": "type=eventType",
			"outbox.columns.event_type": "", "outbox.columns.aggregate_type": "aggregatetype", "outbox.value_encoding": "json-with-schema",
		},
	}, {
		name: "routed by the event type",
		extra: "transforms.outbox.route.by.field=type\n" +
			"transforms.outbox.route.topic.replacement=events.${routedByValue}\n",
		want: map[string]any{"outbox.topic": "events.{event_type}", "outbox.columns.event_type": "type", "outbox.columns.aggregate_type": "aggregatetype"},
	}, {
		name: "Debezium 1.x names its event type column",
		extra: "transforms.outbox.table.field.event.id=event_id\n" +
			"transforms.outbox.table.field.event.type=event_type\n" +
			"transforms.outbox.table.field.event.payload=event_payload\n",
		want: map[string]any{"outbox.columns.id": "event_id", "outbox.columns.event_type": "event_type", "outbox.columns.payload": "event_payload"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := translateMinimal(t, tt.extra)
			if err != nil {
				t.Fatal(err)
			}
			for key, want := range tt.want {
				if got, ok := m.Value(key); !ok || !reflect.DeepEqual(got, want) {
					t.Errorf("%s = %#v (set %v), want %#v", key, got, ok, want)
				}
			}
		})
	}
}

func TestTranslateRefuses(t *testing.T) {
	tests := []struct{ name, props, want string }{
		{"other connector", strings.Replace(minimal, "postgresql.PostgresConnector", "mysql.MySqlConnector", 1), `connector.class: "io.debezium.connector.mysql.MySqlConnector" is not supported`},
		{"no connector", strings.Replace(minimal, "connector.class", "#", 1), "connector.class: missing"},
		{"event type column beside routing by type", minimal + "transforms.outbox.route.by.field=type\ntransforms.outbox.table.field.event.type=kind\n", `table.field.event.type: "kind" with route.by.field=type`},
		{"decoderbufs", minimal + "plugin.name=decoderbufs\n", `plugin.name: "decoderbufs": cdc-relay reads pgoutput only`},
		{"pattern", minimal + "table.include.list=public.outbox.*\n", "is a pattern"},
		{"no schema", minimal + "table.include.list=outbox\n", "write the schema too"},
		{"snapshot mode", minimal + "snapshot.mode=when_needed\n", `snapshot.mode: "when_needed" is not supported`},
		{"regex with a lookahead", minimal + "transforms.outbox.route.topic.regex=(?<routedByValue>ord(?=er).*)\n", `transforms.outbox.route.topic.regex: topic regex "(?<routedByValue>ord(?=er).*)": "(?=e" is a lookaround`},
		{"json header converter", minimal + "header.converter=org.apache.kafka.connect.json.JsonConverter\n", "header.converter: JsonConverter headers are not produced"},
		{"json converter option", minimal + "value.converter=org.apache.kafka.connect.json.JsonConverter\nvalue.converter.bogus=1\n", "value.converter.bogus: JsonConverter option not implemented"},
		{"expand with string converter", minimal + "transforms.outbox.table.expand.json.payload=true\n", "table.expand.json.payload: needs value.converter="},
		{"error on missing bad", minimal + "transforms.outbox.table.fields.additional.error.on.missing=maybe\n", `error.on.missing: "maybe": want true or false`},
		{"bad null behavior", minimal + "transforms.outbox.table.json.payload.null.behavior=drop\n", `null.behavior: "drop": want ignore or optional_bytes`},
		{"no router", strings.Replace(minimal, "transforms=outbox", "transforms=", 1), "transforms: no io.debezium.transforms.outbox.EventRouter"},
		{"other schema list", minimal + "schema.include.list=app\n", `schema.include.list: "app" lacks schema public`},
		{"bad port", minimal + "database.port=x\n", `database.port: "x"`},
		{"no host", strings.Replace(minimal, "database.hostname=db", "", 1), "database.hostname: missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			props, err := parseProperties(tt.props)
			if err != nil {
				t.Fatal(err)
			}
			_, err = translate("c.properties", props, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), "debezium config c.properties") {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

// TestTranslateUnsupportedAtOnce: every property cdc-relay does not
// implement is named in one error.
func TestTranslateUnsupportedAtOnce(t *testing.T) {
	_, err := translateMinimal(t, `transforms.outbox.table.expand.json.payload=true
transforms.outbox.table.op.invalid.behavior=explode
transforms.outbox.route.tombstone.on.empty.payload=maybe
transforms.outbox.table.fields.additional.placement=type:value:eventType
column.exclude.list=public.outbox.secret
slot.drop.on.stop=true
`)
	var de *Refusal
	if !errors.As(err, &de) {
		t.Fatalf("error %v, want a refusal", err)
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

// TestTranslateWarnings: what cannot change the output is named in
// one warning.
func TestTranslateWarnings(t *testing.T) {
	m, err := translateMinimal(t, "tasks.max=1\nerrors.tolerance=all\noffset.flush.interval.ms=1000\nvalue.converter.schemas.enable=false\ntopic.prefix=dbserver1\ntransforms.outbox.table.fields.additional.error.on.missing=false\n")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(m.Warnings, "\n"), "error.on.missing=false: cdc-relay checks at start that each outbox table has every placed column") {
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

// TestTextsNameKeys: the warnings and refusals name cdc-relay's settings by
// key (delivery.snapshot), never by a flag (--snapshot), which is the
// command line's business.
func TestTextsNameKeys(t *testing.T) {
	m, err := translate("c.properties", map[string]string{ // Debezium's defaults: every note
		"connector.class": postgresConnector, "database.hostname": "db", "database.user": "relay", "database.dbname": "app",
		"table.include.list": "public.outbox", "transforms": "outbox", "transforms.outbox.type": eventRouter,
		"transforms.outbox.table.field.event.schema.version": "v", "transforms.outbox.table.fields.additional.error.on.missing": "false",
		"tasks.max": "1",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	texts := m.Warnings
	if len(texts) != 8 {
		t.Errorf("%d warnings, want 8:\n%s", len(texts), strings.Join(texts, "\n"))
	}
	_, err = translateMinimal(t, "slot.drop.on.stop=true\nsnapshot.mode=always\nvalue.converter=x\ntransforms.outbox.table.op.invalid.behavior=x\n")
	if err == nil {
		t.Fatal("no refusal")
	}
	texts = append(texts, err.Error())
	for _, text := range texts {
		if flag := regexp.MustCompile(`--[a-z]`).FindString(text); flag != "" {
			t.Errorf("names a flag (%s…): %s", flag, text)
		}
	}
	if all := strings.Join(texts, "\n"); !strings.Contains(all, "→ delivery.snapshot: initial") || !strings.Contains(all, "set outbox.columns.created_at to") {
		t.Errorf("the snapshot warning does not name delivery.snapshot and outbox.columns.created_at:\n%s", all)
	}
}

// TestTranslateReads: Translate reads either syntax, resolves through the
// caller's getenv, and names the file in every error.
func TestTranslateReads(t *testing.T) {
	getenv := func(k string) (string, bool) { return map[string]string{"PW": "s3cret"}[k], k == "PW" }
	asJSON := `{"name": "orders", "config": {"connector.class": "` + postgresConnector + `", "database.hostname": "db",
		"database.user": "relay", "database.password": "${env:PW}", "database.dbname": "app", "plugin.name": "pgoutput",
		"table.include.list": "public.outbox", "transforms": "outbox", "transforms.outbox.type": "` + eventRouter + `"}}`
	tests := []struct {
		name, data string
		key, want  string // a setting the translation holds
		wantErr    string
	}{
		{name: "json", data: asJSON, key: "source.pg_url", want: "postgres://relay:s3cret@db:5432/app"},
		{name: "json name", data: asJSON, key: "operations.relay_name", want: "orders"},
		{name: "properties", data: minimal + "database.password=${env:PW}\n", key: "source.pg_url", want: "postgres://relay:s3cret@db:5432/app"},
		{name: "unreadable", data: "{", wantErr: "debezium config c.conf: not valid JSON"},
		{name: "unresolved", data: minimal + "database.password=${env:NOPE}\n", wantErr: "debezium config c.conf: database.password: cannot resolve ${env:NOPE}"},
		{name: "refused", data: minimal + "plugin.name=decoderbufs\n", wantErr: `debezium config c.conf: plugin.name: "decoderbufs"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := Translate("c.conf", []byte(tt.data), getenv)
			if tt.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one starting %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := tr.Value(tt.key); got != tt.want {
				t.Errorf("%s = %#v, want %q", tt.key, got, tt.want)
			}
			if !slices.IsSortedFunc(tr.Settings, func(a, b Setting) int { return strings.Compare(a.Key, b.Key) }) {
				t.Errorf("settings not sorted by key: %v", tr.Settings)
			}
		})
	}
}

// TestTranslateTopicRegex maps route.topic.regex and
// route.topic.replacement to outbox.topic_regex, outbox.topic_regex_field
// and outbox.topic,
// and routes events with the result as Kafka Connect's RegexRouter would:
// the replacement when the route.by.field value matches the regex as a
// whole, the value itself otherwise.
func TestTranslateTopicRegex(t *testing.T) {
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
			m, err := translateMinimal(t, tt.props)
			if err != nil {
				t.Fatal(err)
			}
			get := func(key string) string {
				v, _ := m.Value(key)
				s, _ := v.(string)
				return s
			}
			if get("outbox.topic") != tt.topic || get("outbox.topic_regex") != tt.regex || get("outbox.topic_regex_field") != tt.field {
				t.Fatalf("outbox.topic %q, topic_regex %q, topic_regex_field %q; want %q %q %q",
					get("outbox.topic"), get("outbox.topic_regex"), get("outbox.topic_regex_field"), tt.topic, tt.regex, tt.field)
			}
			r, err := route.NewWithRegex(get("outbox.topic"), route.Regex{Pattern: get("outbox.topic_regex"), Field: get("outbox.topic_regex_field")})
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

func TestTranslateTopicRegexRefuses(t *testing.T) {
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
			_, err := translateMinimal(t, tt.props)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestTranslateSeveralTables: table.include.list with several tables is
// the tables setting, a schema list must name each table's schema, and a
// pattern among them is refused by itself.
func TestTranslateSeveralTables(t *testing.T) {
	for _, tt := range []struct {
		name, extra, tables, refused string
	}{
		{"two tables", "table.include.list=public.outbox_events,shipping.parcels_outbox\n", "public.outbox_events,shipping.parcels_outbox", ""},
		{"spaces and escaped dots", "table.include.list=public\\\\.a, shipping\\\\.b\n", "public.a,shipping.b", ""},
		{"their schemas listed", "table.include.list=public.a,shipping.b\nschema.include.list=public,shipping\n", "public.a,shipping.b", ""},
		{"a schema missing", "table.include.list=public.a,shipping.b\nschema.include.list=public\n", "", `schema.include.list: "public" lacks schema shipping`},
		{"one a pattern", "table.include.list=public.a,shipping.*\n", "", `table.include.list: "shipping.*" is a pattern`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := strings.Replace(minimal, "table.include.list=public.outbox\n", "", 1)
			props, err := parseProperties(base + tt.extra)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := translate("c.properties", props, nil)
			if tt.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tt.refused) {
					t.Fatalf("error %v, want %q", err, tt.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if v, _ := tr.Value("tables"); v != tt.tables {
				t.Errorf("tables = %v, want %s", v, tt.tables)
			}
		})
	}
}

// TestUnresolvedKeepsChecking: an indirection that cannot be resolved is
// one refusal, and the other properties are still checked, each refusal
// on a line of its own.
func TestUnresolvedKeepsChecking(t *testing.T) {
	_, err := Translate("c.properties", []byte(minimal+"database.password=${file:/nonexistent/secrets.properties:pw}\ndatabase.port=${env:NOPE}\nsnapshot.mode=sometimes\n"),
		func(string) (string, bool) { return "", false })
	var r *Refusal
	if !errors.As(err, &r) {
		t.Fatalf("error %v, want a *Refusal", err)
	}
	want := []string{
		"debezium config c.properties: database.password: cannot resolve ${file:/nonexistent/secrets.properties:pw}: read /nonexistent/secrets.properties: open /nonexistent/secrets.properties: no such file or directory",
		"debezium config c.properties: database.port: cannot resolve ${env:NOPE}: environment variable NOPE is not set",
		`debezium config c.properties: snapshot.mode: "sometimes" is not supported: use initial (the rows in the table once, when the slot is created) or never/no_data`,
	}
	if got := r.Problems(); !slices.Equal(got, want) {
		t.Errorf("problems\n%q\nwant\n%q", got, want)
	}
}
