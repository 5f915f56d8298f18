package decoder

import (
	"crypto/md5"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

// oddDir holds the pgoutput stream of oddCaptureSQL (see testdata/README.md).
var oddDir = filepath.Join("testdata", "odd")

// oddCaptureSQL is odd data in an outbox: columns of many types (one generated,
// one dropped later), NULLs in every nullable column, unicode and control
// characters, payloads stored out of line compressed and uncompressed, and the
// table changed under the slot: TRUNCATE, a row deleted in its transaction, the
// table renamed away and a new one, with another column order, created and
// added to the publication in one transaction.
//
// The session's TimeZone is also the one pg_logical_slot_peek_binary_changes
// writes timestamptz values in, as a walsender uses its own session's.
var oddCaptureSQL = []string{
	`SET TimeZone = 'America/St_Johns'`,
	`CREATE TYPE mood AS ENUM ('sad', 'happy 😀')`,
	`CREATE DOMAIN positive_int AS int CHECK (VALUE > 0)`,
	`CREATE TYPE price AS (amount numeric, currency text)`,
	`CREATE TABLE outbox_events (
		id uuid, aggregate_type text, aggregate_id text, event_type text, payload jsonb,
		c_numeric numeric, c_bytea bytea, c_ints int[], c_enum mood, c_domain positive_int, c_json json,
		c_xml xml, c_ts timestamptz, c_interval interval, c_price price, c_float float8, c_text text,
		c_dropped text, c_generated text GENERATED ALWAYS AS (upper(aggregate_id)) STORED
	)`,
	`ALTER TABLE outbox_events REPLICA IDENTITY FULL`,
	`CREATE PUBLICATION pub FOR TABLE outbox_events WITH (publish = 'insert, update, delete, truncate')`,
	`SELECT pg_create_logical_replication_slot('slot', 'pgoutput')`,

	// 1: every extra column set, written in another time zone.
	`SET TimeZone = 'Pacific/Chatham'`,
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload, c_numeric, c_bytea, c_ints,
		c_enum, c_domain, c_json, c_xml, c_ts, c_interval, c_price, c_float, c_text, c_dropped)
	 VALUES ('00000000-0000-0000-0000-000000000001', 'order', 'o-1', 'Types', '{"b": [1, 2.50], "a": null}',
		'-0.000000000000000000000000000001', '\x00ff10', '{{1,NULL},{-3,4}}', 'happy 😀', 7,
		'{"b":1,   "a":[1,2], "b":2}', '<a x="1">t&amp;<b/></a>', '1900-01-01 00:00 Asia/Kolkata',
		'1 year 2 mons -3 days 04:05:06.789', ROW(12.50, 'EUR "x", €'), 1e-310, 'plain', 'gone soon')`,
	`SET TimeZone = 'America/St_Johns'`,

	// 2: NULL in every column but the id.
	`INSERT INTO outbox_events (id) VALUES ('00000000-0000-0000-0000-000000000002')`,

	// 3: unicode and control characters in the key, the payload and a header.
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload, c_text)
	 VALUES ('00000000-0000-0000-0000-000000000003', 'order', 'агрегат-🚀 שלום', 'Unicode',
		jsonb_build_object('name', 'Zoë — 日本語 🚀👩‍👩‍👧', 'rtl', 'مرحبا ' || chr(8238) || 'abc', 'ctl', chr(1) || chr(31) || chr(127)),
		'tab' || chr(9) || 'nl' || chr(10) || 'soh' || chr(1) || 'del' || chr(127) || 'ls' || chr(8232) || 'bom' || chr(65279) || 'end')`,

	// 4, 5: payloads stored out of line, compressed (half of it repeats) and not.
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
	 SELECT '00000000-0000-0000-0000-000000000004', 'order', 'o-4', 'ToastCompressed',
		jsonb_build_object('blob', string_agg(md5(i::text) || repeat('-', 32), '')) FROM generate_series(1, 1000) i`,
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
	 SELECT '00000000-0000-0000-0000-000000000005', 'order', 'o-5', 'ToastPlain',
		jsonb_build_object('blob', string_agg(md5(i::text), '')) FROM generate_series(1, 500) i`,

	// 6: after a column is dropped and another added: a new Relation message.
	`ALTER TABLE outbox_events DROP COLUMN c_dropped, ADD COLUMN c_late text DEFAULT 'late'`,
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
	 VALUES ('00000000-0000-0000-0000-000000000006', 'order', 'o-6', 'AfterDropColumn', '{}')`,

	// 7: deleted in its own transaction, then the table truncated.
	`BEGIN`,
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
	 VALUES ('00000000-0000-0000-0000-000000000007', 'order', 'o-7', 'InsertedThenDeleted', '{}')`,
	`DELETE FROM outbox_events WHERE id = '00000000-0000-0000-0000-000000000007'`,
	`COMMIT`,
	`TRUNCATE outbox_events`,

	// 8: the table renamed away (still published, no longer the outbox) and a new
	// one, columns in another order, published in the transaction creating it.
	`BEGIN`,
	`ALTER TABLE outbox_events RENAME TO outbox_old`,
	`CREATE TABLE outbox_events (payload jsonb, c_text text, event_type text, id uuid, aggregate_id text, aggregate_type text)`,
	`ALTER PUBLICATION pub ADD TABLE outbox_events`,
	`COMMIT`,
	`INSERT INTO outbox_old (id, aggregate_type, aggregate_id, event_type, payload)
	 VALUES ('00000000-0000-0000-0000-000000000009', 'order', 'o-9', 'IntoRenamedTable', '{}')`,
	`INSERT INTO outbox_events (payload, c_text, event_type, id, aggregate_id, aggregate_type)
	 VALUES ('{"new": true}', 'new table', 'Recreated', '00000000-0000-0000-0000-000000000008', 'o-8', 'order')`,
}

// TestCaptureOddFixtures regenerates testdata/odd/*.bin, like TestCaptureFixtures.
//
//	go test ./internal/decoder -run TestCaptureOddFixtures -update
func TestCaptureOddFixtures(t *testing.T) {
	if !*update {
		t.Skip("run with -update to regenerate testdata/odd from PostgreSQL 15")
	}
	capture(t, oddCaptureSQL, oddDir)
}

// readFixturesIn returns dir/*.bin in stream order.
func readFixturesIn(tb testing.TB, dir string) []fixture {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.bin"))
	if err != nil {
		tb.Fatal(err)
	}
	if len(files) == 0 {
		tb.Fatalf("no %s/*.bin: regenerate them, see testdata/README.md", dir)
	}
	var fx []fixture
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		fx = append(fx, fixture{name: filepath.Base(f), data: data})
	}
	return fx
}

// oddHeaderColumns are the extra columns of oddCaptureSQL's table, as headers.
var oddHeaderColumns = []string{"c_numeric", "c_bytea", "c_ints", "c_enum", "c_domain", "c_json", "c_xml", "c_ts",
	"c_interval", "c_price", "c_float", "c_text"}

// TestOddFixtures decodes the stream of oddCaptureSQL: each value is Postgres'
// text output of its column, byte for byte (timestamptz in the decoding
// session's zone), NULL is nil and no header, TOASTed payloads arrive whole,
// the renamed old table's insert is not an event and the new table's is.
func TestOddFixtures(t *testing.T) {
	fx := readFixturesIn(t, oddDir)
	wantTypes := strings.Join([]string{
		"BYYYRIC", // types of mood, positive_int, price; the relation; the row of every type
		"BIC",     // NULLs
		"BIC",     // unicode
		"BIC",     // TOAST, compressed
		"BIC",     // TOAST, not compressed
		"BYYYRIC", // after DROP COLUMN: the relation again
		"BIDC",    // inserted then deleted
		"BYYYRTC", // TRUNCATE
		"BYYYRIC", // insert into the renamed table: its relation, new name
		"BRIC",    // the new table
	}, "")
	var gotTypes []byte
	for _, f := range fx {
		gotTypes = append(gotTypes, f.data[0])
	}
	if string(gotTypes) != wantTypes {
		t.Fatalf("fixture message types %s, want %s: was oddCaptureSQL changed?", gotTypes, wantTypes)
	}

	hdr := func(kv ...string) []outbox.Header {
		var h []outbox.Header
		for i := 0; i < len(kv); i += 2 {
			h = append(h, outbox.Header{Key: kv[i], Value: b(kv[i+1])})
		}
		return h
	}
	ev := func(n int, eventType, key, payload string, headers []outbox.Header) *outbox.Event {
		return &outbox.Event{ID: b(fmt.Sprintf("00000000-0000-0000-0000-%012d", n)), AggregateType: b("order"),
			AggregateID: b(key), EventType: b(eventType), Payload: b(payload), Headers: headers}
	}
	// The TOASTed payloads, computed here rather than read back.
	var compressed, plain strings.Builder
	for i := 1; i <= 1000; i++ {
		sum := fmt.Sprintf("%x", md5.Sum([]byte(strconv.Itoa(i))))
		compressed.WriteString(sum + strings.Repeat("-", 32))
		if i <= 500 {
			plain.WriteString(sum)
		}
	}
	wantEvents := []*outbox.Event{
		ev(1, "Types", "o-1", `{"a": null, "b": [1, 2.50]}`, hdr(
			"c_bytea", `\x00ff10`, "c_domain", "7", "c_enum", "happy 😀", "c_float", "1e-310",
			"c_interval", "1 year 2 mons -3 days +04:05:06.789", "c_ints", "{{1,NULL},{-3,4}}",
			"c_json", `{"b":1,   "a":[1,2], "b":2}`, "c_numeric", "-0.000000000000000000000000000001",
			"c_price", `(12.50,"EUR ""x"", €")`, "c_text", "plain",
			"c_ts", "1899-12-31 15:07:58-03:30:52", // Asia/Kolkata's 1900 offset, in America/St_Johns' of the time
			"c_xml", `<a x="1">t&amp;<b/></a>`)),
		{ID: b("00000000-0000-0000-0000-000000000002")}, // NULL: nil values, no headers
		ev(3, "Unicode", "агрегат-🚀 שלום",
			"{\"ctl\": \"\\u0001\\u001f\x7f\", \"rtl\": \"مرحبا \u202eabc\", \"name\": \"Zoë — 日本語 🚀👩\u200d👩\u200d👧\"}",
			hdr("c_text", "tab\tnl\nsoh\x01del\x7fls\u2028bom\ufeffend")),
		ev(4, "ToastCompressed", "o-4", `{"blob": "`+compressed.String()+`"}`, nil),
		ev(5, "ToastPlain", "o-5", `{"blob": "`+plain.String()+`"}`, nil),
		ev(6, "AfterDropColumn", "o-6", "{}", nil),
		ev(7, "InsertedThenDeleted", "o-7", "{}", nil),
		ev(8, "Recreated", "o-8", `{"new": true}`, hdr("c_text", "new table")),
	}

	headers := map[string]string{}
	for _, c := range oddHeaderColumns {
		headers[c] = c
	}
	d, err := New(withHeaders(headers))
	if err != nil {
		t.Fatal(err)
	}
	rels := relationFixtures(t, fx, "outbox_events")
	var events []*outbox.Event
	for i, f := range fx {
		m, err := d.Decode(f.data)
		if err != nil {
			// The new table has only c_text of the extra columns: go on with that.
			if !errors.Is(err, ErrMissingColumn) || i != rels[len(rels)-1] {
				t.Fatalf("%s: %v", f.name, err)
			}
			if d, err = New(withHeaders(map[string]string{"c_text": "c_text"})); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Decode(beginStep.in); err != nil {
				t.Fatal(err)
			}
			if m, err = d.Decode(f.data); err != nil {
				t.Fatalf("%s: %v", f.name, err)
			}
		}
		if m.Kind == KindEvent {
			events = append(events, m.Event)
		}
	}
	if len(events) != len(wantEvents) {
		for _, e := range events {
			t.Logf("got %s %s", e.ID, e.EventType)
		}
		t.Fatalf("%d events, want %d", len(events), len(wantEvents))
	}
	for i, want := range wantEvents {
		want.PayloadType = outbox.PayloadJSON // the table's payload column is jsonb
		got := *events[i]
		got.XID, got.CommitLSN, got.CommitTime = 0, 0, want.CommitTime
		if !equalMsg(eventMsg(&got), eventMsg(want)) {
			t.Errorf("event %d\n got %.600s\nwant %.600s", i, fmtMsg(eventMsg(&got)), fmtMsg(eventMsg(want)))
		}
	}
}

// TestOddFixturesMissingColumns: a generated column is not in the Relation
// message, nor a dropped one after the drop; naming either as a header stops
// the decoder at that relation, with the reason.
func TestOddFixturesMissingColumns(t *testing.T) {
	fx := readFixturesIn(t, oddDir)
	rels := relationFixtures(t, fx, "outbox_events")
	tests := []struct {
		column string
		failAt int // index in rels
	}{
		{"c_generated", 0},
		{"c_dropped", 1},
	}
	for _, tt := range tests {
		t.Run(tt.column, func(t *testing.T) {
			d, err := New(withHeaders(map[string]string{tt.column: tt.column}))
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range rels {
				_, err := d.Decode(fx[r].data)
				if i < tt.failAt {
					if err != nil {
						t.Fatalf("%s: %v", fx[r].name, err)
					}
					continue
				}
				if !errors.Is(err, ErrMissingColumn) || !strings.Contains(err.Error(), strconv.Quote(tt.column)) ||
					!strings.Contains(err.Error(), "generated columns are not replicated") {
					t.Fatalf("%s: error %v, want ErrMissingColumn naming %s and why", fx[r].name, err, tt.column)
				}
				return
			}
		})
	}
}
