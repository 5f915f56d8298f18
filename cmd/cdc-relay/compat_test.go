package main

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// The rows every Event Router case is fed: the Debezium documentation's
// example order (outbox-event-router.adoc, "Example outbox message"), the
// user of EventRouterTest.canExpandJsonPayloadIfConfigured, and a row with a
// NULL payload (EventRouterTest.canMarkAnEventAsDeleted).
const (
	idOrder   = "4d47e190-0402-4048-bc2c-89dd54343cdc"
	idUser    = "406c07f3-26f0-4eea-a50c-109940064b8f"
	idDeleted = "da8d6de6-3b77-45ff-8f44-57db55a7a06c"

	docOrderPayload = `{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}, {"id": 2, "item": "Debezium for Dummies", "status": "ENTERED", "quantity": 1, "totalPrice": 29.99}], "orderDate": "2019-01-31T12:13:01", "customerId": 123}`
	// jsonb orders keys by length, then bytes; Debezium reads the same text.
	userPayload = `{"age": 42, "pets": ["dog", "cat"], "rating": 4.9, "enabled": true, "fullName": "John Doe", "petObjects": [{"type": "dog"}, {"type": "cat"}]}`
)

// compatRows inserts the three rows, in one transaction.
const compatRows = `INSERT INTO public.outboxevent (id, aggregatetype, aggregateid, type, payload, occurred_at, part, schemaversion, tracingspancontext) VALUES
	('` + idOrder + `', 'order', '1', 'OrderCreated', '` + docOrderPayload + `', '2019-05-03 13:31:34.344+00', 3, 3,
	 E'traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\ntracestate=congo=t61rcWkgMzE'),
	('` + idUser + `', 'customer', '10711fa5', 'UserCreated', '{"fullName": "John Doe", "enabled": true, "rating": 4.9, "age": 42, "pets": ["dog", "cat"], "petObjects": [{"type": "dog"}, {"type": "cat"}]}', NULL, NULL, 1, NULL),
	('` + idDeleted + `', 'customer', '10711fa5', 'UserDeleted', NULL, NULL, NULL, NULL, NULL)`

// compatWant is what one row's Kafka record must be; empty fields are not
// checked.
type compatWant struct {
	topic     string
	key       *string // nil: not checked
	value     *string // nil: not checked
	nullValue bool    // the value is null (a tombstone)
	headers   map[string]string
	partition int32 // -1: not checked
	timestamp time.Time
}

func str(s string) *string { return &s }

// TestDebeziumCompatibility feeds the same rows through each documented
// Event Router setting, by running the built relay with a Debezium
// connector configuration, and compares the Kafka records, read with
// franz-go, with the records Debezium's documentation and sources show for
// them (cited per case: the adoc's section, EventRouterTest's method, or the
// code that decides).
func TestDebeziumCompatibility(t *testing.T) {
	stringConv := map[string]string{
		"key.converter":   "org.apache.kafka.connect.storage.StringConverter",
		"value.converter": "org.apache.kafka.connect.storage.StringConverter",
	}
	jsonConv := func(schemas string, extra map[string]string) map[string]string {
		m := map[string]string{
			"key.converter": "org.apache.kafka.connect.json.JsonConverter", "key.converter.schemas.enable": schemas,
			"value.converter": "org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable": schemas,
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	const (
		orderTopic    = "outbox.event.order"
		customerTopic = "outbox.event.customer"
	)
	escapedOrder := `"` + strings.ReplaceAll(docOrderPayload, `"`, `\"`) + `"`
	compactOrder := `{"id":1,"lineItems":[{"id":1,"item":"Debezium in Action","status":"ENTERED","quantity":2,"totalPrice":39.98},{"id":2,"item":"Debezium for Dummies","status":"ENTERED","quantity":1,"totalPrice":29.99}],"orderDate":"2019-01-31T12:13:01","customerId":123}`

	tests := []struct {
		name   string
		cite   string
		props  map[string]string
		topics []string
		want   map[string]compatWant // by row id
		// replay: also republish the rows with cdc-relay replay over the
		// native YAML of config from-debezium, which must write the same bytes.
		replay bool
	}{
		{
			name: "defaults", cite: `adoc "Example outbox message" and "Basic outbox table": topic outbox.event.<aggregatetype>, key aggregateid, header id, value the payload column`,
			props: stringConv, topics: []string{orderTopic, customerTopic},
			want: map[string]compatWant{
				idOrder: {topic: orderTopic, key: str("1"), value: str(docOrderPayload), headers: map[string]string{"id": idOrder}, partition: -1},
				idUser:  {topic: customerTopic, key: str("10711fa5"), value: str(userPayload), headers: map[string]string{"id": idUser}, partition: -1},
			},
		},
		{
			name: "json string payload", cite: `adoc "Expanding escaped JSON String as JSON": without expansion the payload is an escaped JSON string; the key "1"`,
			props: jsonConv("false", nil), topics: []string{orderTopic, customerTopic},
			want: map[string]compatWant{
				idOrder: {topic: orderTopic, key: str(`"1"`), value: str(escapedOrder), partition: -1},
				// JsonConverter.fromConnectData: a null value with a schema is written as JSON null.
				idDeleted: {topic: customerTopic, key: str(`"10711fa5"`), value: str("null"), partition: -1},
			},
		},
		{
			name: "expanded payload", cite: `adoc "Expanding escaped JSON String as JSON": with table.expand.json.payload=true the value is the document itself`,
			props:  jsonConv("false", map[string]string{"transforms.outbox.table.expand.json.payload": "true"}),
			topics: []string{orderTopic, customerTopic},
			want: map[string]compatWant{
				idOrder: {topic: orderTopic, key: str(`"1"`), value: str(compactOrder), partition: -1},
				idUser: {topic: customerTopic, partition: -1,
					value: str(`{"age":42,"pets":["dog","cat"],"rating":4.9,"enabled":true,"fullName":"John Doe","petObjects":[{"type":"dog"},{"type":"cat"}]}`)},
			},
		},
		{
			name: "expanded payload with schemas", cite: "EventRouterTest.canExpandJsonPayloadIfConfigured (field types string, boolean, float64, int32, array; struct elements), written by JsonConverter with schemas.enable=true",
			props:  jsonConv("true", map[string]string{"transforms.outbox.table.expand.json.payload": "true"}),
			topics: []string{orderTopic, customerTopic},
			want: map[string]compatWant{
				idUser: {topic: customerTopic, partition: -1,
					key: str(`{"schema":{"type":"string","optional":false},"payload":"10711fa5"}`),
					value: str(`{"schema":{"type":"struct","fields":[{"type":"int32","optional":true,"field":"age"},{"type":"array","items":{"type":"string","optional":true},"optional":true,"field":"pets"},{"type":"double","optional":true,"field":"rating"},{"type":"boolean","optional":true,"field":"enabled"},{"type":"string","optional":true,"field":"fullName"},{"type":"array","items":{"type":"struct","fields":[{"type":"string","optional":true,"field":"type"}],"optional":true,"name":"payload.petObjects"},"optional":true,"field":"petObjects"}],"optional":true,"name":"payload"},` +
						`"payload":{"age":42,"pets":["dog","cat"],"rating":4.9,"enabled":true,"fullName":"John Doe","petObjects":[{"type":"dog"},{"type":"cat"}]}}`)},
				idDeleted: {topic: customerTopic, partition: -1,
					value: str(`{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":null}`)},
			},
		},
		{
			name: "header placement", cite: `adoc "Emitting messages with additional fields": column:header:alias is a header named alias`,
			props:  with(stringConv, "transforms.outbox.table.fields.additional.placement", "type:header:eventType"),
			topics: []string{orderTopic, customerTopic},
			want: map[string]compatWant{
				idOrder: {topic: orderTopic, headers: map[string]string{"id": idOrder, "eventType": "OrderCreated"}, partition: -1},
			},
		},
		{
			name: "envelope placement", cite: `adoc "Emitting messages with additional fields": column:envelope:alias puts the column beside the payload in the value`,
			props:  jsonConv("false", map[string]string{"transforms.outbox.table.fields.additional.placement": "type:envelope:eventType"}),
			topics: []string{orderTopic, customerTopic},
			want: map[string]compatWant{
				idOrder: {topic: orderTopic, value: str(`{"payload":` + escapedOrder + `,"eventType":"OrderCreated"}`), partition: -1},
			},
		},
		{
			name: "expanded envelope, replayed", cite: "canExpandJsonPayloadWithAdditionalFieldInEnvelope (the expanded payload inside the envelope); cdc-relay replay over config from-debezium's YAML writes the same bytes as the stream",
			props: jsonConv("true", map[string]string{"topic.prefix": "dbserver1",
				"transforms.outbox.table.fields.additional.placement": "type:envelope:eventType",
				"transforms.outbox.table.field.event.schema.version":  "schemaversion",
				"transforms.outbox.table.expand.json.payload":         "true"}),
			topics: []string{orderTopic, customerTopic}, replay: true,
			want: map[string]compatWant{
				idUser: {topic: customerTopic, partition: -1,
					value: str(`{"schema":{"type":"struct","fields":[{"type":"struct","fields":[{"type":"int32","optional":true,"field":"age"},{"type":"array","items":{"type":"string","optional":true},"optional":true,"field":"pets"},{"type":"double","optional":true,"field":"rating"},{"type":"boolean","optional":true,"field":"enabled"},{"type":"string","optional":true,"field":"fullName"},{"type":"array","items":{"type":"struct","fields":[{"type":"string","optional":true,"field":"type"}],"optional":true,"name":"payload.petObjects"},"optional":true,"field":"petObjects"}],"optional":true,"name":"payload","field":"payload"},{"type":"string","optional":false,"field":"eventType"}],"optional":false,"name":"dbserver1.public.outboxevent.customer.Value","version":1},` +
						`"payload":{"payload":{"age":42,"pets":["dog","cat"],"rating":4.9,"enabled":true,"fullName":"John Doe","petObjects":[{"type":"dog"},{"type":"cat"}]},"eventType":"UserCreated"}}`)},
			},
		},
		{
			name: "envelope with schema version", cite: "EventRouterTest.canSetSchemaVersionWhenMoreThanPayloadIsInEnvelope (the version column is the envelope schema's version); EventRouterDelegate.getSchemaName (<topic.prefix>.<schema>.<table>.<routed-by value>.Value)",
			props: jsonConv("true", map[string]string{"topic.prefix": "dbserver1",
				"transforms.outbox.table.fields.additional.placement": "type:envelope:eventType",
				"transforms.outbox.table.field.event.schema.version":  "schemaversion"}),
			topics: []string{orderTopic, customerTopic},
			want: map[string]compatWant{
				idOrder: {topic: orderTopic, partition: -1,
					value: str(`{"schema":{"type":"struct","fields":[{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"payload"},{"type":"string","optional":false,"field":"eventType"}],"optional":false,"name":"dbserver1.public.outboxevent.order.Value","version":3},"payload":{"payload":` + escapedOrder + `,"eventType":"OrderCreated"}}`)},
			},
		},
		{
			name: "partition placement", cite: `adoc "Emitting messages with additional fields": column:partition names the partition`,
			props:  with(stringConv, "transforms.outbox.table.fields.additional.placement", "part:partition"),
			topics: []string{orderTopic, customerTopic},
			want:   map[string]compatWant{idOrder: {topic: orderTopic, partition: 3}},
		},
		{
			name: "event timestamp", cite: `adoc "Configuration options", table.field.event.timestamp; EventRouterTest.canSetTimestampByUserDefinedConfiguration`,
			props:  with(stringConv, "transforms.outbox.table.field.event.timestamp", "occurred_at"),
			topics: []string{orderTopic, customerTopic},
			want:   map[string]compatWant{idOrder: {topic: orderTopic, partition: -1, timestamp: time.UnixMilli(1556890294344)}},
		},
		{
			name: "route by type", cite: `adoc "Configuration options", route.by.field and route.topic.replacement`,
			props: with(stringConv, "transforms.outbox.route.by.field", "type",
				"transforms.outbox.route.topic.replacement", "${routedByValue}.events"),
			topics: []string{"OrderCreated.events", "UserCreated.events", "UserDeleted.events"},
			want: map[string]compatWant{
				idOrder: {topic: "OrderCreated.events", key: str("1"), partition: -1},
				idUser:  {topic: "UserCreated.events", partition: -1},
			},
		},
		{
			name: "tombstone on empty payload", cite: `adoc "Configuration options", route.tombstone.on.empty.payload; EventRouterTest.canMarkAnEventAsDeleted (the key stays, the value is null)`,
			props:  jsonConv("false", map[string]string{"transforms.outbox.route.tombstone.on.empty.payload": "true"}),
			topics: []string{orderTopic, customerTopic},
			want: map[string]compatWant{
				idDeleted: {topic: customerTopic, key: str(`"10711fa5"`), nullValue: true, partition: -1},
				idOrder:   {topic: orderTopic, value: str(escapedOrder), partition: -1},
			},
		},
		{
			name: "trace context", cite: `adoc "Configuration options", tracing.span.context.field (default tracingspancontext, Java properties text)`,
			props: stringConv, topics: []string{orderTopic, customerTopic},
			want: map[string]compatWant{
				idOrder: {topic: orderTopic, partition: -1, headers: map[string]string{
					"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "congo=t61rcWkgMzE"}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Logf("expected records: %s", tc.cite)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			f := newFixture(t, sharedPG, t.Name(), true)
			conn := f.connect(ctx, t)
			if _, err := conn.Exec(ctx, `CREATE TABLE public.outboxevent (
				id uuid PRIMARY KEY,
				aggregatetype varchar(255) NOT NULL,
				aggregateid varchar(255) NOT NULL,
				type varchar(255) NOT NULL,
				payload jsonb,
				occurred_at timestamptz,
				part int,
				schemaversion int,
				tracingspancontext varchar(512),
				created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
				t.Fatal(err)
			}
			path := writeDebeziumProperties(t, f, tc.props)
			r := newRelay(t, []string{"run", "--debezium-config", path,
				"--kafka-brokers", strings.Join(f.brokers, ","),
				"--log-format", "json", "--status-interval", "200ms", "--retry-cap", "1s"})
			r.Start()
			r.WaitReady(30 * time.Second)
			if _, err := conn.Exec(ctx, compatRows); err != nil {
				t.Fatal(err)
			}
			wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
			defer wcancel()
			if _, err := sandbox.WaitForRecords(wctx, f.brokers, 3, tc.topics...); err != nil {
				t.Fatalf("wait for 3 records on %v: %v", tc.topics, err)
			}
			recs, err := sandbox.ReadAll(wctx, f.brokers, tc.topics...)
			if err != nil {
				t.Fatal(err)
			}
			r.Stop(10 * time.Second)
			if len(recs) != 3 {
				t.Fatalf("%d records on %v, want 3 (one per row)", len(recs), tc.topics)
			}
			byID := map[string]sandbox.Record{}
			for _, rec := range recs {
				byID[rec.Headers["id"]] = rec
			}
			ids := make([]string, 0, len(tc.want))
			for id := range tc.want {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			for _, id := range ids {
				checkCompat(t, id, byID, tc.want[id])
			}
			if tc.replay {
				checkReplaySameBytes(ctx, t, f, path, tc.topics, recs)
			}
		})
	}
}

// checkCompat compares the record of row id with want.
func checkCompat(t *testing.T, id string, byID map[string]sandbox.Record, want compatWant) {
	t.Helper()
	rec, ok := byID[id]
	if !ok {
		t.Errorf("row %s: no record with header id=%s", id, id)
		return
	}
	if rec.Topic != want.topic {
		t.Errorf("row %s: topic %q, want %q", id, rec.Topic, want.topic)
	}
	if want.key != nil && string(rec.Key) != *want.key {
		t.Errorf("row %s: key\n%s\nwant\n%s", id, rec.Key, *want.key)
	}
	if want.value != nil && string(rec.Value) != *want.value {
		t.Errorf("row %s: value\n%s\nwant\n%s", id, rec.Value, *want.value)
	}
	if want.nullValue && rec.Value != nil {
		t.Errorf("row %s: value %q, want null (a tombstone)", id, rec.Value)
	}
	for k, v := range want.headers {
		if rec.Headers[k] != v {
			t.Errorf("row %s: header %s = %q, want %q (headers %v)", id, k, rec.Headers[k], v, rec.Headers)
		}
	}
	if want.partition >= 0 && rec.Partition != want.partition {
		t.Errorf("row %s: partition %d, want %d", id, rec.Partition, want.partition)
	}
	if !want.timestamp.IsZero() && !rec.Timestamp.Equal(want.timestamp) {
		t.Errorf("row %s: timestamp %s, want %s", id, rec.Timestamp.UTC(), want.timestamp.UTC())
	}
}

// writeDebeziumProperties writes a Postgres connector configuration for f
// with the Outbox Event Router and props, as a .properties file.
func writeDebeziumProperties(t *testing.T, f *fixture, props map[string]string) string {
	t.Helper()
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	base := map[string]string{
		"connector.class":        "io.debezium.connector.postgresql.PostgresConnector",
		"database.hostname":      u.Hostname(),
		"database.port":          u.Port(),
		"database.user":          u.User.Username(),
		"database.password":      password,
		"database.dbname":        strings.TrimPrefix(u.Path, "/"),
		"database.sslmode":       u.Query().Get("sslmode"),
		"plugin.name":            "pgoutput",
		"slot.name":              f.slot,
		"snapshot.mode":          "no_data",
		"table.include.list":     "public.outboxevent",
		"transforms":             "outbox",
		"transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
	}
	for k, v := range props {
		base[k] = v
	}
	keys := make([]string, 0, len(base))
	for k := range base {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + "=" + strings.ReplaceAll(base[k], `\`, `\\`) + "\n")
	}
	path := filepath.Join(t.TempDir(), "connector.properties")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkReplaySameBytes converts the connector configuration at path with
// config from-debezium, republishes the rows with cdc-relay replay over
// that YAML, and checks that each replayed record has the streamed one's
// topic, key and value.
func checkReplaySameBytes(ctx context.Context, t *testing.T, f *fixture, path string, topics []string, streamed []sandbox.Record) {
	t.Helper()
	yaml, err := exec.CommandContext(ctx, relayBin, "config", "from-debezium", path).Output()
	if err != nil {
		t.Fatalf("cdc-relay config from-debezium: %v", err)
	}
	native := filepath.Join(t.TempDir(), "native.yaml")
	if err := os.WriteFile(native, yaml, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, relayBin, "replay", "--config", native, "--kafka-brokers", strings.Join(f.brokers, ","), "--since", "1h").CombinedOutput()
	if err != nil {
		t.Fatalf("cdc-relay replay --config (from-debezium YAML):\n%s\n%v\n%s", yaml, err, out)
	}
	recs, err := sandbox.ReadAll(ctx, f.brokers, topics...)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2*len(streamed) {
		t.Fatalf("%d records after the replay, want %d", len(recs), 2*len(streamed))
	}
	type rec struct{ topic, key, value string }
	want := map[string]rec{}
	for _, r := range streamed {
		want[r.Headers["id"]] = rec{r.Topic, string(r.Key), string(r.Value)}
	}
	replayed := 0
	for _, r := range recs {
		if r.Headers["cdc_relay_replay"] == "" && r.Headers["source_position"] != "" {
			continue // streamed
		}
		replayed++
		if got := (rec{r.Topic, string(r.Key), string(r.Value)}); got != want[r.Headers["id"]] {
			t.Errorf("replayed event %s:\n%+v\nstreamed:\n%+v", r.Headers["id"], got, want[r.Headers["id"]])
		}
	}
	if replayed != len(streamed) {
		t.Errorf("%d replayed records, want %d", replayed, len(streamed))
	}
}
