package main

import (
	"context"
	"encoding/json"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// TestRunDebeziumConfig runs the built relay with Debezium connector configs
// as users publish them (the password through Connect's ${file:…}
// indirection) against Debezium-style outbox tables, unchanged (issue 31,
// test 3): an inserted row must arrive on the topic Debezium's router would
// pick, keyed by aggregateid, with header id and the headers the config
// places.
func TestRunDebeziumConfig(t *testing.T) {
	tests := []struct {
		name   string
		table  string            // the outbox table's columns
		insert string            // INSERT … RETURNING id::text
		config map[string]string // the router's properties beyond its type
		topic  string
		header map[string]string // headers the record must carry
	}{{
		// Debezium's outbox documentation: the event type placed in a header.
		name: "documented",
		table: `id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
			type varchar(255) NOT NULL, payload jsonb`,
		insert: `INSERT INTO public.outboxevent (id, aggregatetype, aggregateid, type, payload)
			VALUES (gen_random_uuid(), 'order', '123', 'OrderCreated', '{"id": 123, "total": 7}') RETURNING id::text`,
		config: map[string]string{"transforms.outbox.table.fields.additional.placement": "type:header:eventType"},
		topic:  "outbox.event.order",
		header: map[string]string{"eventType": "OrderCreated"},
	}, {
		// No type column and no table.field.event.type: the router never
		// reads one (EventRouterDelegate), so neither does the relay; a fixed
		// topic through route.topic.replacement.
		name: "no type column, fixed topic",
		table: `id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
			payload jsonb`,
		insert: `INSERT INTO public.outboxevent (id, aggregatetype, aggregateid, payload)
			VALUES (gen_random_uuid(), 'order', '123', '{"id": 123, "total": 7}') RETURNING id::text`,
		config: map[string]string{"transforms.outbox.route.topic.replacement": "orders.events"},
		topic:  "orders.events",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runDebeziumConfig(t, tt.table, tt.insert, tt.config, tt.topic, tt.header) })
	}
}

func runDebeziumConfig(t *testing.T, table, insert string, router map[string]string, topic string, header map[string]string) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	conn := f.connect(ctx, t)
	if _, err := conn.Exec(ctx, `CREATE TABLE public.outboxevent (`+table+`)`); err != nil {
		t.Fatal(err)
	}

	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	password, _ := u.User.Password()
	if password == "" {
		password = "unused-with-trust-auth"
	}
	secrets := filepath.Join(dir, "secrets.properties")
	if err := os.WriteFile(secrets, []byte("password="+password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	props := map[string]string{
		"connector.class":        "io.debezium.connector.postgresql.PostgresConnector",
		"tasks.max":              "1",
		"database.hostname":      u.Hostname(),
		"database.port":          u.Port(),
		"database.user":          u.User.Username(),
		"database.password":      "${file:" + secrets + ":password}",
		"database.dbname":        strings.TrimPrefix(u.Path, "/"),
		"database.sslmode":       u.Query().Get("sslmode"),
		"topic.prefix":           "dbserver1",
		"plugin.name":            "pgoutput",
		"slot.name":              f.slot,
		"snapshot.mode":          "no_data",
		"table.include.list":     "public.outboxevent",
		"tombstones.on.delete":   "false",
		"key.converter":          "org.apache.kafka.connect.storage.StringConverter",
		"value.converter":        "org.apache.kafka.connect.storage.StringConverter",
		"transforms":             "outbox",
		"transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
	}
	maps.Copy(props, router)
	config := map[string]any{"name": "outbox-connector", "config": props}
	data, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "outbox-connector.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}

	r := newRelay(t, []string{"run", "--debezium-config", path,
		"--kafka-brokers", strings.Join(f.brokers, ","),
		"--log-format", "json", "--status-interval", "200ms", "--retry-cap", "1s"})
	r.Start()
	r.WaitReady(30 * time.Second)

	var id string
	if err := conn.QueryRow(ctx, insert).Scan(&id); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if _, err := sandbox.WaitForRecords(wctx, f.brokers, 1, topic); err != nil {
		t.Fatalf("wait for the event on %s: %v\nrelay log:\n%s", topic, err, r.Logs())
	}
	recs, err := sandbox.ReadAll(wctx, f.brokers, topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Fatalf("%d records on %s, want 1", len(recs), topic)
	}
	rec := recs[0]
	if string(rec.Key) != "123" {
		t.Errorf("key %q, want the aggregateid 123", rec.Key)
	}
	if rec.Headers["id"] != id {
		t.Errorf("header id %q, want %q (headers %v)", rec.Headers["id"], id, rec.Headers)
	}
	for k, v := range header {
		if rec.Headers[k] != v {
			t.Errorf("header %s %q, want %q (headers %v)", k, rec.Headers[k], v, rec.Headers)
		}
	}
	var payload map[string]any
	if err := json.Unmarshal(rec.Value, &payload); err != nil || payload["total"] != float64(7) {
		t.Errorf("value %q, want the payload column's JSON (%v)", rec.Value, err)
	}
	r.Stop(10 * time.Second)
}

// TestDebeziumSeveralTables converts, with the built binary, a connector
// whose table.include.list names two outbox tables (Debezium's own shape,
// in two schemas) into a --config file, runs the relay with that file
// alone (and the brokers), and sees a row of each table arrive on the
// topic Debezium's router would pick (issue 45 point 5).
func TestDebeziumSeveralTables(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	conn := f.connect(ctx, t)
	for _, schema := range []string{"public", "shipping"} {
		if _, err := conn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+schema+`; CREATE TABLE `+schema+`.outboxevent (
			id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL, payload jsonb)`); err != nil {
			t.Fatal(err)
		}
	}
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	props := map[string]string{
		"connector.class":   "io.debezium.connector.postgresql.PostgresConnector",
		"database.hostname": u.Hostname(), "database.port": u.Port(), "database.user": u.User.Username(),
		"database.dbname": strings.TrimPrefix(u.Path, "/"), "database.sslmode": u.Query().Get("sslmode"),
		"plugin.name": "pgoutput", "slot.name": f.slot, "snapshot.mode": "no_data",
		"table.include.list": "public.outboxevent,shipping.outboxevent",
		"key.converter":      "org.apache.kafka.connect.storage.StringConverter",
		"value.converter":    "org.apache.kafka.connect.storage.StringConverter",
		"transforms":         "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
	}
	if p, ok := u.User.Password(); ok {
		props["database.password"] = p
	}
	data, err := json.Marshal(map[string]any{"name": "outbox-connector", "config": props})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	connector := filepath.Join(dir, "connector.json")
	if err := os.WriteFile(connector, data, 0o600); err != nil {
		t.Fatal(err)
	}
	yaml, err := exec.CommandContext(ctx, relayBin, "config", "from-debezium", connector).Output()
	if err != nil {
		t.Fatalf("config from-debezium: %v", err)
	}
	if !strings.Contains(string(yaml), "tables: [public.outboxevent, shipping.outboxevent] # from table.include.list") {
		t.Fatalf("config from-debezium wrote no tables list:\n%s", yaml)
	}
	native := filepath.Join(dir, "relay.yaml")
	if err := os.WriteFile(native, yaml, 0o600); err != nil {
		t.Fatal(err)
	}

	r := newRelay(t, []string{"run", "--config", native, "--kafka-brokers", strings.Join(f.brokers, ","),
		"--log-format", "json", "--status-interval", "200ms", "--retry-cap", "1s"})
	r.Start()
	r.WaitReady(30 * time.Second)
	for schema, typ := range map[string]string{"public": "order", "shipping": "parcel"} {
		if _, err := conn.Exec(ctx, `INSERT INTO `+schema+`.outboxevent (id, aggregatetype, aggregateid, payload)
			VALUES (gen_random_uuid(), $1, $2, '{"n": 1}')`, typ, typ+"-1"); err != nil {
			t.Fatal(err)
		}
	}
	for _, topic := range []string{"outbox.event.order", "outbox.event.parcel"} {
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		recs, err := sandbox.WaitForRecords(wctx, f.brokers, 1, topic)
		wcancel()
		if err != nil {
			t.Fatalf("wait for the event on %s: %v\nrelay log:\n%s", topic, err, r.Logs())
		}
		if len(recs) != 1 || !strings.HasSuffix(string(recs[0].Key), "-1") {
			t.Errorf("%s: %d records (%v), want the one row keyed by its aggregateid", topic, len(recs), recs)
		}
	}
	r.Stop(10 * time.Second)
}
