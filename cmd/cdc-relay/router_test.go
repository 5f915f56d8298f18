package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestColumnTimestamp runs the built relay with --column-timestamp over
// columns of each supported type and checks with franz-go that every
// record's timestamp is its row's (to the millisecond), that a NULL leaves
// the send time, and that cdc-relay replay stamps the same timestamps.
func TestColumnTimestamp(t *testing.T) {
	for _, tc := range []struct {
		name, typ, value string
	}{
		{"timestamptz", "timestamptz", "'2021-03-04 05:06:07.891+02'"},
		{"timestamp", "timestamp", "'2021-03-04 03:06:07.891'"},
		{"bigint", "bigint", "1614827167891"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := time.Date(2021, 3, 4, 3, 6, 7, 891e6, time.UTC)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			f := newFixture(t, sharedPG, t.Name(), true)
			conn, err := pgx.Connect(ctx, f.url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			if _, err := conn.Exec(ctx, "ALTER TABLE outbox_events ADD COLUMN occurred_at "+tc.typ); err != nil {
				t.Fatal(err)
			}
			r := newRelay(t, f.relayArgs("--column-timestamp", "occurred_at"))
			r.Start()
			r.WaitReady(30 * time.Second)
			before := time.Now().Add(-time.Second)
			if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, occurred_at)
				VALUES ('order', 'o-1', 'Placed', '{}', `+tc.value+`), ('order', 'o-1', 'Paid', '{}', NULL)`); err != nil {
				t.Fatal(err)
			}
			f.waitRecords(ctx, t, 2, 30*time.Second)
			r.Stop(10 * time.Second)
			checkTimestamps(t, f.read(ctx, t), want, before)

			out, err := exec.CommandContext(ctx, relayBin, "replay", "--pg-url", f.url, "--kafka-brokers", strings.Join(f.brokers, ","),
				"--topic", f.topic, "--since", "1h", "--column-timestamp", "occurred_at").CombinedOutput()
			if err != nil {
				t.Fatalf("cdc-relay replay: %v\n%s", err, out)
			}
			recs := f.read(ctx, t)
			if len(recs) != 4 {
				t.Fatalf("%d records after the replay, want 4", len(recs))
			}
			checkTimestamps(t, recs[2:], want, before)
		})
	}
}

// checkTimestamps checks recs, a Placed and a Paid record: Placed has the
// row's timestamp want, Paid (a NULL column) a send time after before.
func checkTimestamps(t *testing.T, recs []sandbox.Record, want, before time.Time) {
	t.Helper()
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	for _, rec := range recs {
		switch rec.Headers["event_type"] {
		case "Placed":
			if !rec.Timestamp.Equal(want) {
				t.Errorf("Placed record timestamp %s, want the column's %s", rec.Timestamp.UTC(), want)
			}
		case "Paid":
			if rec.Timestamp.Before(before) {
				t.Errorf("Paid record (NULL column) timestamp %s, want the send time (after %s)", rec.Timestamp.UTC(), before.UTC())
			}
		default:
			t.Errorf("unexpected record %v", rec.Headers)
		}
	}
}

// TestOnOutboxUpdate runs the built relay with each --on-outbox-update
// policy against a real UPDATE (and DELETE) of an outbox row: ignore says
// nothing, warn and error log at their level and count the update, fatal
// stops the relay with an error naming the flag before the next event. A
// DELETE is ignored by every policy.
func TestOnOutboxUpdate(t *testing.T) {
	const logMsg = "an outbox row was updated"
	for _, tc := range []struct {
		policy string
		level  string // log level of the update's line; "" for none
	}{
		{"ignore", ""},
		{"warn", "warn"},
		{"error", "error"},
		{"fatal", ""},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			f := newFixture(t, sharedPG, t.Name(), true)
			r := newRelay(t, f.relayArgs("--on-outbox-update", tc.policy))
			r.Start()
			r.WaitReady(30 * time.Second)
			conn, err := pgx.Connect(ctx, f.url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'o-1', 'Placed', '{}')`); err != nil {
				t.Fatal(err)
			}
			f.waitRecords(ctx, t, 1, 30*time.Second)
			for _, sql := range []string{
				`UPDATE outbox_events SET payload = '{"changed": true}' WHERE event_type = 'Placed'`,
				`DELETE FROM outbox_events WHERE event_type = 'Placed'`,
				`INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'o-1', 'Paid', '{}')`,
			} {
				if _, err := conn.Exec(ctx, sql); err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
			}
			if tc.policy == "fatal" {
				code, exited := r.Wait(30 * time.Second)
				if !exited || code == 0 {
					t.Fatalf("relay exited=%v code %d, want a non-zero exit\n%s", exited, code, r.Logs())
				}
				if out := r.Logs(); !strings.Contains(out, "--on-outbox-update") || !strings.Contains(out, "updated a row of the outbox table") {
					t.Fatalf("the relay's output does not name --on-outbox-update and the update:\n%s", out)
				}
				recs := f.read(ctx, t)
				if len(recs) != 1 || recs[0].Headers["event_type"] != "Placed" {
					t.Fatalf("records %v, want only the insert before the update", recs)
				}
				return
			}
			f.waitRecords(ctx, t, 2, 30*time.Second)
			recs := f.read(ctx, t)
			if len(recs) != 2 || string(recs[0].Value) != "{}" {
				t.Fatalf("records %v, want the two inserts as inserted", recs)
			}
			// The Paid insert is after the update in the WAL: once it is in
			// Kafka, the update was handled.
			var lines []map[string]any
			for _, m := range r.LogRecords() {
				if msg, _ := m["message"].(string); strings.Contains(msg, logMsg) {
					lines = append(lines, m)
				}
			}
			want := 0.0
			if tc.level != "" {
				want = 1
				if len(lines) != 1 || lines[0]["level"] != tc.level {
					t.Fatalf("log lines about the update %v, want one at level %s", lines, tc.level)
				}
			} else if len(lines) != 0 {
				t.Fatalf("log lines about the update %v, want none", lines)
			}
			if got := r.Metric("cdc_relay_outbox_updates_total"); got != want {
				t.Errorf("cdc_relay_outbox_updates_total = %v, want %v", got, want)
			}
			r.Stop(10 * time.Second)
		})
	}
}

// TestOnOutboxUpdateNeedsPublishedUpdates: with --on-outbox-update warn the
// relay refuses an existing publication that does not publish updates (it
// would never see one) and says how to fix it.
func TestOnOutboxUpdateNeedsPublishedUpdates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	conn := f.connect(ctx, t)
	if _, err := conn.Exec(ctx, `CREATE PUBLICATION cdc_relay_outbox FOR TABLE outbox_events WITH (publish = 'insert')`); err != nil {
		t.Fatal(err)
	}
	r := newRelay(t, f.relayArgs("--on-outbox-update", "warn"))
	r.Start()
	code, exited := r.Wait(30 * time.Second)
	if !exited || code == 0 {
		t.Fatalf("relay exited=%v code %d, want a non-zero exit\n%s", exited, code, r.Logs())
	}
	out := r.Logs()
	for _, want := range []string{"does not publish updates", "ALTER PUBLICATION", "--on-outbox-update"} {
		if !strings.Contains(out, want) {
			t.Errorf("the relay's output lacks %q:\n%s", want, out)
		}
	}
}

// TestTombstoneOnEmptyPayload runs the built relay, then cdc-relay replay,
// with --tombstone-on-empty-payload and reads the records back with
// franz-go: a NULL or empty payload is a null value (a tombstone) with its
// key and headers, any other payload the value as before.
func TestTombstoneOnEmptyPayload(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	conn := f.connect(ctx, t)
	if _, err := conn.Exec(ctx, `ALTER TABLE outbox_events ALTER COLUMN payload DROP NOT NULL, ALTER COLUMN payload TYPE text`); err != nil {
		t.Fatal(err)
	}
	r := newRelay(t, f.relayArgs("--tombstone-on-empty-payload"))
	r.Start()
	r.WaitReady(30 * time.Second)
	if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', 'o-1', 'Null', NULL), ('order', 'o-1', 'Empty', ''), ('order', 'o-1', 'Full', 'x')`); err != nil {
		t.Fatal(err)
	}
	f.waitRecords(ctx, t, 3, 30*time.Second)
	r.Stop(10 * time.Second)
	out, err := exec.CommandContext(ctx, relayBin, "replay", "--pg-url", f.url, "--kafka-brokers", strings.Join(f.brokers, ","),
		"--topic", f.topic, "--since", "1h", "--tombstone-on-empty-payload").CombinedOutput()
	if err != nil {
		t.Fatalf("cdc-relay replay: %v\n%s", err, out)
	}
	recs := f.read(ctx, t)
	if len(recs) != 6 {
		t.Fatalf("%d records, want 3 from the stream and 3 replayed", len(recs))
	}
	for _, rec := range recs {
		typ := rec.Headers["event_type"]
		wantNull := typ != "Full"
		if (rec.Value == nil) != wantNull || (!wantNull && string(rec.Value) != "x") {
			t.Errorf("%s record: value %q (null %v), want null %v", typ, rec.Value, rec.Value == nil, wantNull)
		}
		if string(rec.Key) != "o-1" || rec.Headers["id"] == "" {
			t.Errorf("%s record: key %q, headers %v: a tombstone keeps its key and headers", typ, rec.Key, rec.Headers)
		}
	}
}

// TestColumnPartition runs the built relay, then cdc-relay replay, with
// --column-partition over a topic of 4 partitions: an event goes to the
// partition its row names, a NULL one to its key's, and one naming a
// partition the topic lacks (or a negative one) is dead-lettered as
// invalid_partition while the others go on.
func TestColumnPartition(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	conn := f.connect(ctx, t)
	if _, err := conn.Exec(ctx, `ALTER TABLE outbox_events ADD COLUMN kafka_partition integer`); err != nil {
		t.Fatal(err)
	}
	r := newRelay(t, f.relayArgs("--column-partition", "kafka_partition"))
	r.Start()
	r.WaitReady(30 * time.Second)
	// want maps an event type to its partition; -1 for the key's.
	want := map[string]int32{"p3": 3, "p0": 0, "null": -1}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, kafka_partition)
		VALUES ('order', 'o-1', 'p3', '{}', 3), ('order', 'o-1', 'bad7', '{}', 7), ('order', 'o-1', 'p0', '{}', 0),
		       ('order', 'o-1', 'bad-1', '{}', -1), ('order', 'o-1', 'null', '{}', NULL)`); err != nil {
		t.Fatal(err)
	}
	f.waitRecords(ctx, t, 3, 30*time.Second)
	var codes []string
	testenv.Eventually(t, 30*time.Second, func() error {
		codes = nil
		rows, err := conn.Query(ctx, `SELECT event_type || ':' || error_code FROM cdc_relay_dead_letters ORDER BY event_type`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var c string
			if err := rows.Scan(&c); err != nil {
				return err
			}
			codes = append(codes, c)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(codes) != 2 {
			recs := f.read(ctx, t)
			var got []string
			for _, r := range recs {
				got = append(got, fmt.Sprintf("%s@%d", r.Headers["event_type"], r.Partition))
			}
			return fmt.Errorf("dead letters %v, want 2 (records %v)", codes, got)
		}
		return nil
	})
	if strings.Join(codes, ",") != "bad-1:invalid_partition,bad7:invalid_partition" {
		t.Fatalf("dead letters %v, want bad-1 and bad7 as invalid_partition", codes)
	}
	r.Stop(10 * time.Second)
	check := func(recs []sandbox.Record) {
		t.Helper()
		keyPartition := int32(-1)
		for _, rec := range recs {
			typ := rec.Headers["event_type"]
			p, ok := want[typ]
			if !ok {
				t.Fatalf("unexpected record %s", typ)
			}
			if p >= 0 && rec.Partition != p {
				t.Errorf("%s record in partition %d, want %d", typ, rec.Partition, p)
			}
			if p < 0 {
				keyPartition = rec.Partition
			}
		}
		if keyPartition < 0 {
			t.Fatal("no record of the NULL partition row")
		}
	}
	recs := f.read(ctx, t)
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	check(recs)
	var nullPartition int32
	for _, rec := range recs {
		if rec.Headers["event_type"] == "null" {
			nullPartition = rec.Partition
		}
	}

	for _, typ := range []string{"p3", "p0", "null"} {
		out, err := exec.CommandContext(ctx, relayBin, "replay", "--pg-url", f.url, "--kafka-brokers", strings.Join(f.brokers, ","),
			"--topic", f.topic, "--since", "1h", "--event-type", typ, "--column-partition", "kafka_partition").CombinedOutput()
		if err != nil {
			t.Fatalf("cdc-relay replay: %v\n%s", err, out)
		}
	}
	recs = f.read(ctx, t)
	if len(recs) != 6 {
		t.Fatalf("%d records after the replays, want 6", len(recs))
	}
	check(recs)
	for _, rec := range recs {
		if rec.Headers["event_type"] == "null" && rec.Partition != nullPartition {
			t.Errorf("replayed NULL-partition record in partition %d, the stream's in %d: both go by key", rec.Partition, nullPartition)
		}
	}
}

// TestEnvelopeColumns runs the built relay, then cdc-relay replay, with
// --envelope-columns and checks the exact value a consumer reads: the jsonb
// payload as JSON under "payload", each column's text under its alias, NULL
// as null; and that combining it with --tombstone-on-empty-payload is refused
// naming the flag.
func TestEnvelopeColumns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	conn := f.connect(ctx, t)
	if _, err := conn.Exec(ctx, `ALTER TABLE outbox_events ADD COLUMN tenant text, ADD COLUMN version integer`); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCommand(ctx, t, 30*time.Second, f.relayArgs("--envelope-columns", "tenant", "--tombstone-on-empty-payload")...)
	if code == 0 || !strings.Contains(stderr, "--envelope-columns") || !strings.Contains(stderr, "--tombstone-on-empty-payload") {
		t.Fatalf("run with both flags: exit %d, stderr %s; want a refusal naming both", code, stderr)
	}
	r := newRelay(t, f.relayArgs("--envelope-columns", "tenant,version=schema_version"))
	r.Start()
	r.WaitReady(30 * time.Second)
	if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, tenant, version)
		VALUES ('order', 'o-1', 'Placed', '{"total": 7}', 'acme', NULL), ('order', 'o-1', 'Paid', '[]', NULL, 2)`); err != nil {
		t.Fatal(err)
	}
	f.waitRecords(ctx, t, 2, 30*time.Second)
	r.Stop(10 * time.Second)
	out, err := exec.CommandContext(ctx, relayBin, "replay", "--pg-url", f.url, "--kafka-brokers", strings.Join(f.brokers, ","),
		"--topic", f.topic, "--since", "1h", "--envelope-columns", "tenant,version=schema_version").CombinedOutput()
	if err != nil {
		t.Fatalf("cdc-relay replay: %v\n%s", err, out)
	}
	want := map[string]string{
		"Placed": `{"payload":{"total": 7},"tenant":"acme","schema_version":null}`,
		"Paid":   `{"payload":[],"tenant":null,"schema_version":"2"}`,
	}
	recs := f.read(ctx, t)
	if len(recs) != 4 {
		t.Fatalf("%d records, want 2 from the stream and 2 replayed", len(recs))
	}
	for _, rec := range recs {
		if w := want[rec.Headers["event_type"]]; string(rec.Value) != w {
			t.Errorf("%s value %s, want %s", rec.Headers["event_type"], rec.Value, w)
		}
	}
}

// TestTopicRegex runs the built relay with --topic-regex: rows whose
// aggregate type the regex matches as a whole go to the topic the template
// renders from its groups, a row whose aggregate type it does not match goes
// to the topic named by that value itself (Debezium's route.topic.regex
// behaviour), and cdc-relay replay routes the same way.
func TestTopicRegex(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	routing := []string{"--topic-regex", `(?<region>eu|us)-(?<kind>[a-z]+)`, "--topic", "outbox.${region}.${kind}"}
	args := append(f.relayArgs(), routing...) // the later --topic wins
	r := newRelay(t, args)
	r.Start()
	r.WaitReady(30 * time.Second)
	conn := f.connect(ctx, t)
	if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('eu-order', 'o-1', 'Placed', '{}'), ('us-invoice', 'i-1', 'Paid', '{}'), ('legacy_orders', 'o-2', 'Placed', '{}')`); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"outbox.eu.order": "o-1", "outbox.us.invoice": "i-1", "legacy_orders": "o-2"}
	topics := []string{"outbox.eu.order", "outbox.us.invoice", "legacy_orders"}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if _, err := sandbox.WaitForRecords(wctx, f.brokers, len(want), topics...); err != nil {
		t.Fatalf("wait for the events on %v: %v", topics, err)
	}
	r.Stop(10 * time.Second)
	check := func(perTopic int) {
		t.Helper()
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		defer rcancel()
		recs, err := sandbox.ReadAll(rctx, f.brokers, topics...)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, rec := range recs {
			if want[rec.Topic] != string(rec.Key) {
				t.Errorf("record of %q on topic %s, want it on the topic of its aggregate type", rec.Key, rec.Topic)
			}
			got[rec.Topic]++
		}
		for _, topic := range topics {
			if got[topic] != perTopic {
				t.Errorf("topic %s has %d records, want %d (all: %v)", topic, got[topic], perTopic, got)
			}
		}
	}
	check(1)

	replay := append([]string{"replay", "--pg-url", f.url, "--kafka-brokers", strings.Join(f.brokers, ","), "--since", "1h"}, routing...)
	if out, err := exec.CommandContext(ctx, relayBin, replay...).CombinedOutput(); err != nil {
		t.Fatalf("cdc-relay replay: %v\n%s", err, out)
	}
	check(2)
}
