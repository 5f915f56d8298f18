package relay_test

// Odd data in, exact bytes out: column types and NULLs, unicode, payloads
// around the broker's size limit and stored out of line (TOAST), and the outbox
// table or its publication changed under a running relay. In every case a
// committed outbox INSERT the relay can read is delivered or dead-lettered, the
// relay goes on (or stops with an error naming the fix), and nothing after it
// is held up. docs/dead-letters.md ("What the relay does with odd data") sums it up.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/setting"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// relayZone is the relay's session time zone in TestOddData. Postgres writes
// timestamptz values in the text form of the walsender's session, so a header
// over a timestamptz column is in this zone (with its odd offsets), whatever
// zone the writer used.
const relayZone = "America/St_Johns"

// oddSetupSQL gives the outbox nullable required columns, no primary key (so
// the id can be NULL) and an extra column of many types.
const oddSetupSQL = `
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy 😀');
CREATE DOMAIN positive_int AS int CHECK (VALUE > 0);
CREATE TYPE price AS (amount numeric, currency text);
ALTER TABLE outbox_events DROP CONSTRAINT outbox_events_pkey,
	ALTER COLUMN id DROP NOT NULL, ALTER COLUMN id DROP DEFAULT,
	ALTER COLUMN aggregate_type DROP NOT NULL, ALTER COLUMN aggregate_id DROP NOT NULL,
	ALTER COLUMN event_type DROP NOT NULL, ALTER COLUMN payload DROP NOT NULL,
	ADD COLUMN tag text NOT NULL,
	ADD COLUMN c_numeric numeric, ADD COLUMN c_bytea bytea, ADD COLUMN c_ints int[], ADD COLUMN c_texts text[],
	ADD COLUMN c_enum mood, ADD COLUMN c_domain positive_int, ADD COLUMN c_json json, ADD COLUMN c_xml xml,
	ADD COLUMN c_ts timestamptz, ADD COLUMN c_interval interval, ADD COLUMN c_uuid uuid, ADD COLUMN c_price price,
	ADD COLUMN c_float float8, ADD COLUMN c_range tstzrange, ADD COLUMN c_text text, ADD COLUMN c_dropped text,
	ADD COLUMN c_generated text GENERATED ALWAYS AS (upper(aggregate_id)) STORED`

// oddHeaders are the extra columns sent as headers; tag identifies the row.
var oddHeaders = []string{"c_numeric", "c_bytea", "c_ints", "c_texts", "c_enum", "c_domain", "c_json", "c_xml",
	"c_ts", "c_interval", "c_uuid", "c_price", "c_float", "c_range", "c_text"}

// topicMaxBytes is the topic's max.message.bytes in TestOddData.
const topicMaxBytes = 4 << 20

// oddRow is one outbox row: SQL expressions for its columns (the rest NULL).
type oddRow struct {
	tag  string
	cols map[string]string
	// dead is the error code of the dead letter expected instead of a message.
	dead string
}

// Columns every row has unless it says otherwise.
var oddDefaults = map[string]string{
	"id": "gen_random_uuid()", "aggregate_type": "'order'", "aggregate_id": "'o-1'", "event_type": "'E'", "payload": `'{"n": 1}'`,
}

func (r oddRow) sql() string {
	cols := map[string]string{"tag": quote(r.tag)}
	for c, v := range oddDefaults {
		cols[c] = v
	}
	for c, v := range r.cols {
		cols[c] = v
	}
	var names, values []string
	for c, v := range cols {
		names, values = append(names, c), append(values, v)
	}
	return fmt.Sprintf("INSERT INTO outbox_events (%s) VALUES (%s)", strings.Join(names, ", "), strings.Join(values, ", "))
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// oddRows are inserted in order; the rows of a group share a transaction.
var oddRows = [][]oddRow{
	{{tag: "types", cols: map[string]string{
		"c_numeric": "'-0.000000000000000000000000000001'", "c_bytea": `'\x00ff10'::bytea`, "c_ints": "'{{1,NULL},{-3,4}}'",
		"c_texts": `ARRAY['a b', 'NULL', NULL, 'quo"te', 'back\slash', 'ünï', '']`, "c_enum": "'happy 😀'", "c_domain": "7",
		"c_json": `'{"b":1,   "a":[1,2], "b":2}'`, "c_xml": `'<a x="1">t&amp;<b/></a>'`,
		"c_ts": "'1900-01-01 00:00 Asia/Kolkata'", "c_interval": "'1 year 2 mons -3 days 04:05:06.789'",
		"c_uuid": "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "c_price": `ROW(12.50, 'EUR "x", €')`,
		"c_float": "1e-310", "c_range": "tstzrange('2024-03-10 02:30 America/New_York', 'infinity')",
		"c_text": "'plain'", "c_dropped": "'gone soon'",
	}}},
	{{tag: "odd values", cols: map[string]string{
		"c_numeric": "'NaN'", "c_bytea": `''::bytea`, "c_ints": "'{}'", "c_texts": "'{}'", "c_enum": "'sad'", "c_domain": "2147483647",
		"c_json": `'"just a string"'`, "c_xml": "'text only'", "c_ts": "'-infinity'", "c_interval": "'-178000000 years'",
		"c_price": "ROW(NULL, NULL)", "c_float": "'-0'", "c_range": "'empty'", "c_text": "''",
	}}},
	{{tag: "all optional NULL"}},
	// Unicode and control characters in the key, the payload and a header.
	{{tag: "unicode", cols: map[string]string{
		"aggregate_id": "'агрегат-🚀 שלום'", "event_type": "'Zoë‿Ångström'",
		"payload": `jsonb_build_object('name', 'Zoë Ångström — 日本語 🚀👩‍👩‍👧', 'rtl', 'مرحبا بالعالم ' || chr(8238) || 'abc', 'ctl', chr(1) || chr(9) || chr(31) || chr(127))`,
		"c_text":  "'tab' || chr(9) || 'nl' || chr(10) || 'cr' || chr(13) || 'soh' || chr(1) || 'del' || chr(127) || 'ls' || chr(8232) || 'zwj' || chr(8205) || 'bom' || chr(65279) || 'rlo' || chr(8238) || 'end'",
	}}},
	// NULLs and empties in the required columns, mixed in one transaction:
	// the event without a key is dead-lettered, the others delivered around it.
	{
		{tag: "NULL payload", cols: map[string]string{"payload": "NULL"}},
		{tag: "NULL aggregate_id", cols: map[string]string{"aggregate_id": "NULL"}, dead: "empty_key"},
		{tag: "NULL id", cols: map[string]string{"id": "NULL"}},
		{tag: "empty aggregate_id", cols: map[string]string{"aggregate_id": "''"}, dead: "empty_key"},
		{tag: "NULL event_type and aggregate_type", cols: map[string]string{"event_type": "NULL", "aggregate_type": "NULL"}},
		{tag: "NULL id and aggregate_id", cols: map[string]string{"id": "NULL", "aggregate_id": "NULL"}, dead: "empty_key"},
		{tag: "all NULL", cols: map[string]string{"id": "NULL", "aggregate_type": "NULL", "aggregate_id": "NULL", "event_type": "NULL", "payload": "NULL"}, dead: "empty_key"},
	},
	// Sizes: stored out of line, compressed and not; around the topic's limit.
	{{tag: "TOAST compressible", cols: map[string]string{"payload": "jsonb_build_object('blob', repeat('compressible ', 250000))"}}},
	{{tag: "TOAST incompressible", cols: map[string]string{"payload": "(SELECT jsonb_build_object('blob', string_agg(md5(random()::text), '')) FROM generate_series(1, 40000))"}}},
	{{tag: "just under the limit", cols: map[string]string{"payload": fmt.Sprintf("jsonb_build_object('p', repeat('u', %d))", topicMaxBytes-8<<10-9)}}},
	{{tag: "just over the limit", cols: map[string]string{"payload": fmt.Sprintf("jsonb_build_object('p', repeat('o', %d))", topicMaxBytes+1-9)}, dead: "message_too_large"}},
}

// afterAlter are inserted after a column is dropped and another added.
var afterAlter = []oddRow{{tag: "after DROP COLUMN", cols: map[string]string{"c_text": "'after'", "c_late": "'late'"}}}

// oddExpectSQL reads a row as Postgres writes it in text: what the message
// must carry, byte for byte.
var oddExpectSQL = `SELECT id::text, aggregate_type::text, aggregate_id::text, event_type::text, payload::text, ` +
	strings.Join(oddHeaders, "::text, ") + "::text FROM outbox_events WHERE tag = $1"

// want is a row's expected message: the text of each column, nil for NULL.
type want struct {
	id, aggType, key, evType, payload []byte
	headers                           map[string][]byte
	dead                              string
}

// TestOddData: odd column types, NULLs, unicode, TOASTed payloads and payloads
// around the broker's limit reach Kafka as Postgres' text output of the
// columns, or the dead-letter table when Kafka cannot take them; nothing after
// them is held up and the slot moves past all of them.
func TestOddData(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.exec(oddSetupSQL)
	if err := sandbox.CreateTopic(ctx, e.kafka.Brokers(), e.topic, 4); err != nil {
		t.Fatal(err)
	}
	setTopicConfig(t, e.kafka.Brokers(), e.topic, "max.message.bytes", fmt.Sprint(topicMaxBytes))
	headers := map[string]string{"tag": "x-tag", "c_late": "c_late"}
	for _, c := range oddHeaders {
		headers[c] = c
	}
	e.setRelayURL(withParam(e.url, "timezone", relayZone))
	store := e.withDeadLetters(func(c *relay.Config) {
		c.Decoder.HeaderColumns = headers
	})
	e.exec("ALTER TABLE outbox_events ADD COLUMN c_late text") // a header column from the start
	e.start()

	// Write from a session in another time zone: it does not matter.
	writer, err := pgx.Connect(ctx, withParam(e.url, "timezone", "Pacific/Chatham"))
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close(ctx)
	reader, err := pgx.Connect(ctx, withParam(e.url, "timezone", relayZone))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close(ctx)
	wants := map[string]want{}
	insert := func(rows []oddRow) {
		t.Helper()
		err := pgx.BeginFunc(ctx, writer, func(tx pgx.Tx) error {
			for _, r := range rows {
				if _, err := tx.Exec(ctx, r.sql()); err != nil {
					return fmt.Errorf("%s: %w", r.tag, err)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			wants[r.tag] = expect(t, reader, r)
		}
	}
	for _, rows := range oddRows {
		insert(rows)
	}
	// The big payloads are really stored out of line, compressed and not.
	// pg_column_compression is PostgreSQL 14+; on 13 the sizes alone say it.
	var serverVersion int
	if err := reader.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&serverVersion); err != nil {
		t.Fatal(err)
	}
	compression := "pg_column_compression(payload)"
	if serverVersion < 140000 {
		compression = "CASE WHEN pg_column_size(payload) <= octet_length(payload::text) / 4 THEN 'pglz' END"
	}
	for tag, compressed := range map[string]bool{"TOAST compressible": true, "TOAST incompressible": false} {
		var method *string
		var stored, raw int
		err := reader.QueryRow(ctx, "SELECT "+compression+", pg_column_size(payload), octet_length(payload::text) FROM outbox_events WHERE tag = $1", tag).
			Scan(&method, &stored, &raw)
		if err != nil || (method != nil) != compressed || stored < 4<<10 || compressed && stored > raw/4 {
			t.Fatalf("%s: compression %v, %d bytes stored for %d (%v): not the TOAST case the test wants", tag, method, stored, raw, err)
		}
	}
	// A column dropped and one added between events: a new Relation message.
	e.exec("ALTER TABLE outbox_events DROP COLUMN c_dropped, ALTER COLUMN c_late SET DEFAULT 'dflt'")
	insert(afterAlter)
	wants[afterAlter[0].tag].headers["c_late"] = []byte("late")
	insert([]oddRow{{tag: "marker"}})
	wants["marker"].headers["c_late"] = []byte("dflt")
	markerEnd := e.currentLSN()

	delivered := 0
	for _, w := range wants {
		if w.dead == "" {
			delivered++
		}
	}
	// Nothing is held up: the slot moves past the marker. Then Kafka has
	// acknowledged all the relay published: read all of it, anything more
	// than the rows delivered is a duplicate or an event that should not be
	// there.
	e.waitSlotConfirmed(markerEnd)
	recs := rawRecords(t, e.kafka.Brokers(), e.topic, max(delivered, len(e.readAll())))
	seen := map[string]bool{}
	for _, r := range recs {
		tag := header(r, "x-tag")
		w, ok := wants[string(tag)]
		if !ok || w.dead != "" || seen[string(tag)] {
			t.Errorf("unexpected message %q (dead-letter code %q, seen before %v)", tag, w.dead, seen[string(tag)])
			continue
		}
		seen[string(tag)] = true
		checkRecord(t, string(tag), r, w)
	}
	for tag, w := range wants {
		if w.dead == "" && !seen[tag] {
			t.Errorf("row %q not delivered", tag)
		}
	}

	// The rows Kafka could not take are dead letters, with their bytes.
	letters, err := store.List(ctx, deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	dead := map[string]deadletter.Letter{}
	for _, l := range letters {
		dead[l.Headers["x-tag"]] = l
	}
	for tag, w := range wants {
		l, ok := dead[tag]
		if (w.dead != "") != ok {
			t.Errorf("row %q: dead letter %v, want one with code %q", tag, ok, w.dead)
			continue
		}
		if !ok {
			continue
		}
		wantID := string(w.id)
		if w.id == nil {
			wantID = "no-id:" // made from the event's content, see deadletter.FromEvent
		}
		if l.ErrorCode != w.dead || !strings.HasPrefix(l.EventID, wantID) || !bytes.Equal(l.Payload, w.payload) ||
			!bytes.Equal(l.Key, w.key) || l.Headers["id"] != string(w.id) || l.Topic != e.topic {
			t.Errorf("row %q: dead letter %+v, want code %s, id %q, key %q and the payload (%d bytes)", tag, summarize(l), w.dead, wantID, w.key, len(w.payload))
		}
	}
	if len(letters) != len(dead) {
		t.Errorf("%d dead letters for %d rows", len(letters), len(dead))
	}

	if err := e.stop(); err != nil {
		t.Fatalf("clean stop: %v", err)
	}
}

// expect reads row r back in the relay's time zone.
func expect(t *testing.T, conn *pgx.Conn, r oddRow) want {
	t.Helper()
	vals := make([][]byte, 5+len(oddHeaders))
	ptrs := make([]any, len(vals))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := conn.QueryRow(context.Background(), oddExpectSQL, r.tag).Scan(ptrs...); err != nil {
		t.Fatalf("read back %q: %v", r.tag, err)
	}
	w := want{id: vals[0], aggType: vals[1], key: vals[2], evType: vals[3], payload: vals[4], dead: r.dead,
		headers: map[string][]byte{"x-tag": []byte(r.tag)}}
	for i, c := range oddHeaders {
		if v := vals[5+i]; v != nil {
			w.headers[c] = v
		}
	}
	if r.tag == "types" { // spot checks that the text is Postgres' and in the relay's zone
		for c, v := range map[string]string{"c_ts": "1899-12-31 15:07:58-03:30:52", "c_bytea": `\x00ff10`, "c_enum": "happy 😀",
			"c_json": `{"b":1,   "a":[1,2], "b":2}`, "c_price": `(12.50,"EUR ""x"", €")`} {
			if string(w.headers[c]) != v {
				t.Fatalf("%s reads back as %q, want %q: is the session's TimeZone %s?", c, w.headers[c], v, relayZone)
			}
		}
	}
	return w
}

// checkRecord compares a message with the row's text: the key, the value, and
// every header, NULL being a header with a null value (id, event_type,
// aggregate_type) or no header (extra columns).
func checkRecord(t *testing.T, tag string, r *kgo.Record, w want) {
	t.Helper()
	if !bytes.Equal(r.Key, w.key) {
		t.Errorf("%s: key %q, want %q", tag, r.Key, w.key)
	}
	// A NULL payload is an empty value, not a null one (a tombstone).
	if !bytes.Equal(r.Value, w.payload) || r.Value == nil {
		t.Errorf("%s: value of %d bytes %.80q (null %v), want %d bytes %.80q", tag, len(r.Value), r.Value, r.Value == nil, len(w.payload), w.payload)
	}
	got := map[string][]byte{}
	for _, h := range r.Headers {
		if _, dup := got[h.Key]; dup {
			t.Errorf("%s: header %s twice", tag, h.Key)
		}
		got[h.Key] = h.Value
	}
	for k, v := range map[string][]byte{"id": w.id, "event_type": w.evType, "aggregate_type": w.aggType} {
		if g, ok := got[k]; !ok || !bytes.Equal(g, v) || (g == nil) != (v == nil) {
			t.Errorf("%s: header %s = %q (present %v, null %v), want %q (null %v)", tag, k, g, ok, g == nil, v, v == nil)
		}
		delete(got, k)
	}
	delete(got, "commit_lsn")
	delete(got, "commit_time")
	if _, ok := got["source_position"]; !ok {
		t.Errorf("%s: no source_position header (effectively-once is the default)", tag)
	}
	delete(got, "source_position")
	for k, v := range w.headers {
		if !bytes.Equal(got[k], v) {
			t.Errorf("%s: header %s = %q, want %q", tag, k, got[k], v)
		}
		delete(got, k)
	}
	for k, v := range got {
		t.Errorf("%s: unexpected header %s = %q", tag, k, v)
	}
}

func header(r *kgo.Record, key string) []byte {
	for _, h := range r.Headers {
		if h.Key == key {
			return h.Value
		}
	}
	return nil
}

// rawRecords reads n records of topic with franz-go as they are, null header
// values included.
func rawRecords(t *testing.T, brokers []string, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.FetchMaxWait(250*time.Millisecond), kgo.FetchMaxPartitionBytes(16<<20), kgo.FetchMaxBytes(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d records of %s: got %d: %v", n, topic, len(out), ctx.Err())
		}
		fetches.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

// withParam adds a connection parameter to a Postgres URL.
func withParam(url, key, value string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + key + "=" + value
}

// withDeadLetters sets the dlq failure policy with the real store, and more.
func (e *env) withDeadLetters(more func(*relay.Config)) *deadletter.Store {
	e.t.Helper()
	store := deadletter.NewStore(e.relayPool, deadletter.DefaultTable)
	record := store.Recorder("test-relay")
	e.cfgHook = func(c *relay.Config) {
		c.DeadLetter = record
		c.DeadLetterStore = store
		c.MonitorInterval = 100 * time.Millisecond
		if more != nil {
			more(c)
		}
	}
	return store
}

// waitStopped waits for Run to return on its own.
func (e *env) waitStopped(within time.Duration) error {
	e.t.Helper()
	select {
	case err := <-e.done:
		e.cancel = nil
		return err
	case <-time.After(within):
		e.t.Fatalf("relay still running after %s\n%s", within, e.logs.String())
		return nil
	}
}

// wantConfigError checks err is a *replication.ConfigError containing every part.
func wantConfigError(t *testing.T, err error, parts ...string) {
	t.Helper()
	var ce *replication.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Run = %v (%T), want a *replication.ConfigError", err, err)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q\ndoes not mention %q", err, p)
		}
	}
}

// TestOutboxSchemaChanges changes the outbox under a running relay: TRUNCATE
// (published as a Truncate message the relay skips), a row deleted in the
// transaction that inserted it (still published), the table dropped and
// recreated with another column order and added to the publication in the same
// transaction (a new Relation message, mapped by name), and a header column
// dropped: the relay stops naming the flag, the event not confirmed, and a
// restart with the fixed configuration delivers it.
func TestOutboxSchemaChanges(t *testing.T) {
	e := newEnv(t)
	e.exec("ALTER TABLE outbox_events ADD COLUMN tenant text")
	e.exec("CREATE PUBLICATION cdc_relay_outbox FOR TABLE outbox_events WITH (publish = 'insert, update, delete, truncate')")
	e.cfgHook = func(c *relay.Config) {
		c.MonitorInterval = 100 * time.Millisecond
		c.Decoder.HeaderColumns = map[string]string{"tenant": "x-tenant"}
	}
	e.start()
	ins := func(typ string) {
		e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, tenant) VALUES ('t', 'k', $1, '{}', 'acme')", typ)
	}
	ins("A")
	e.tx(func(tx pgx.Tx) error {
		if _, err := insert(tx, "t", "k", "InsertedThenDeleted", "{}"); err != nil {
			return err
		}
		_, err := tx.Exec(context.Background(), "DELETE FROM outbox_events WHERE event_type = 'InsertedThenDeleted'")
		return err
	})
	e.exec("TRUNCATE outbox_events")
	ins("AfterTruncate")
	e.tx(func(tx pgx.Tx) error {
		for _, sql := range []string{
			"DROP TABLE outbox_events",
			`CREATE TABLE outbox_events (payload jsonb NOT NULL, tenant text, note text, event_type text NOT NULL,
				id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_id text NOT NULL, aggregate_type text NOT NULL)`,
			"ALTER PUBLICATION cdc_relay_outbox ADD TABLE outbox_events",
		} {
			if _, err := tx.Exec(context.Background(), sql); err != nil {
				return err
			}
		}
		return nil
	})
	e.exec(`INSERT INTO outbox_events (payload, tenant, note, event_type, aggregate_id, aggregate_type) VALUES ('{"r": 2}', 'new', 'x', 'Recreated', 'k2', 't2')`)
	recs := e.waitRecords(4)
	got := map[string]sandbox.Record{}
	for _, r := range recs {
		got[r.Headers["event_type"]] = r
	}
	for _, typ := range []string{"A", "InsertedThenDeleted", "AfterTruncate"} {
		if _, ok := got[typ]; !ok {
			t.Errorf("%s not delivered", typ)
		}
	}
	if r := got["Recreated"]; string(r.Key) != "k2" || string(r.Value) != `{"r": 2}` || r.Headers["aggregate_type"] != "t2" || r.Headers["x-tenant"] != "new" {
		t.Errorf("event of the recreated table: key %q value %q headers %v", r.Key, r.Value, r.Headers)
	}
	// The watch noticed the new table and says what may be missing.
	waitLog(t, e, "was dropped and recreated while the relay was streaming")

	// A header column dropped under the relay: stop, confirm nothing past it.
	e.exec("ALTER TABLE outbox_events DROP COLUMN tenant")
	e.exec(`INSERT INTO outbox_events (payload, note, event_type, aggregate_id, aggregate_type) VALUES ('{}', 'x', 'AfterDrop', 'k', 't')`)
	end := e.currentLSN()
	stopErr := e.waitStopped(20 * time.Second)
	wantConfigError(t, stopErr, `has no column "tenant" named in the header columns`, "(setting Decoder.HeaderColumns)")
	if f := setting.Fields(stopErr); len(f) != 1 || f[0].Field != "Decoder.HeaderColumns" {
		t.Errorf("error names %v, want the setting Decoder.HeaderColumns", f)
	}
	if got := e.slotConfirmed(); got >= end {
		t.Errorf("slot confirmed %s, past the event the relay could not decode (before %s)", got, end)
	}
	e.cfgHook = func(c *relay.Config) { c.MonitorInterval = 100 * time.Millisecond }
	e.start()
	for _, r := range e.waitRecords(5) {
		if r.Headers["event_type"] == "AfterDrop" {
			return
		}
	}
	t.Error("AfterDrop not delivered after the restart")
}

// TestGeneratedHeaderColumnRefused: Postgres does not replicate generated
// columns, so one named in --header-columns is refused at start.
func TestGeneratedHeaderColumnRefused(t *testing.T) {
	e := newEnv(t)
	e.exec("ALTER TABLE outbox_events ADD COLUMN agg_upper text GENERATED ALWAYS AS (upper(aggregate_id)) STORED")
	e.cfgHook = func(c *relay.Config) { c.Decoder.HeaderColumns = map[string]string{"agg_upper": "agg_upper"} }
	e.startNoWait()
	wantConfigError(t, e.waitStopped(20*time.Second), `"agg_upper"`, "generated column", "(setting Decoder.HeaderColumns)")
}

// TestPublicationChangesAreLoud: Postgres sends no INSERT made while the
// outbox is outside the publication, not even to a relay restarted from an
// earlier position. The relay notices and stops, naming the SQL to run and how
// to republish what it could not read; it never goes on silently.
func TestPublicationChangesAreLoud(t *testing.T) {
	tests := []struct {
		name   string
		change []string
		want   []string
	}{
		{
			name:   "table removed from the publication",
			change: []string{"ALTER PUBLICATION cdc_relay_outbox DROP TABLE outbox_events"},
			want:   []string{"no longer covers the outbox table", "ALTER PUBLICATION", "ADD TABLE", "(command replay since="},
		},
		{
			name:   "publish without insert",
			change: []string{"ALTER PUBLICATION cdc_relay_outbox SET (publish = 'update, delete')"},
			want:   []string{"stopped publishing inserts", "SET (publish = 'insert')", "(command replay since="},
		},
		{
			name:   "table dropped and recreated outside the publication",
			change: []string{"DROP TABLE outbox_events", "CREATE TABLE outbox_events (LIKE cdc_relay_checkpoints)"},
			want:   []string{"no longer covers the outbox table", "ADD TABLE", "(command replay since="},
		},
		{
			name:   "table dropped",
			change: []string{"DROP TABLE outbox_events"},
			want:   []string{"was dropped", "ADD TABLE", "(command replay since="},
		},
		{
			name:   "publication dropped",
			change: []string{"DROP PUBLICATION cdc_relay_outbox"},
			want:   []string{`publication "cdc_relay_outbox" was dropped`, "pg_replication_slot_advance", "(command replay since="},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.cfgHook = func(c *relay.Config) { c.MonitorInterval = 50 * time.Millisecond }
			e.start()
			e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'k', 'Before', '{}')")
			e.waitRecords(1)
			e.tx(func(tx pgx.Tx) error {
				for _, sql := range tt.change {
					if _, err := tx.Exec(context.Background(), sql); err != nil {
						return err
					}
				}
				return nil
			})
			wantConfigError(t, e.waitStopped(20*time.Second), tt.want...)
		})
	}

	// A dropped publication stays a problem after it is created again: the
	// walsender decodes the slot's WAL with the catalog of its time. The relay
	// stops with the fix instead of reconnecting forever.
	t.Run("publication dropped and created again", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.start()
		e.exec("DROP PUBLICATION cdc_relay_outbox")
		e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'k', 'During', '{}')")
		e.exec("CREATE PUBLICATION cdc_relay_outbox FOR TABLE outbox_events WITH (publish = 'insert')")
		e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'k', 'After', '{}')")
		wantConfigError(t, e.waitStopped(20*time.Second), "was dropped", "pg_replication_slot_advance")
		e.startNoWait()
		wantConfigError(t, e.waitStopped(20*time.Second), "was dropped", "pg_replication_slot_advance")
	})

	// Removed and added back between two checks (here: in one transaction):
	// the watch sees the new pg_publication_rel row, logs what may be missing,
	// and the relay goes on.
	t.Run("table removed and added back", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.cfgHook = func(c *relay.Config) { c.MonitorInterval = 50 * time.Millisecond }
		e.start()
		e.tx(func(tx pgx.Tx) error {
			for _, sql := range []string{
				"ALTER PUBLICATION cdc_relay_outbox DROP TABLE outbox_events",
				"INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'k', 'Outside', '{}')",
				"ALTER PUBLICATION cdc_relay_outbox ADD TABLE outbox_events",
			} {
				if _, err := tx.Exec(context.Background(), sql); err != nil {
					return err
				}
			}
			return nil
		})
		e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'k', 'After', '{}')")
		waitLog(t, e, "was removed from publication")
		// Postgres skips Outside (decoded with the catalog of its time).
		if recs := e.waitRecords(1); recs[len(recs)-1].Headers["event_type"] != "After" {
			t.Errorf("last event %s, want After", recs[len(recs)-1].Headers["event_type"])
		}
		if !e.relay.Ready() {
			t.Error("relay not streaming after the table was added back")
		}
	})
}

// waitLog waits until the relay's log contains s.
func waitLog(t *testing.T, e *env, s string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() error {
		if logs := e.logs.String(); !strings.Contains(logs, s) {
			return fmt.Errorf("relay log does not say %q:\n%s", s, logs)
		}
		return nil
	})
}
