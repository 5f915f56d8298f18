package main

// End-to-end test of several outbox tables behind one relay (issue 31, test
// 1): two schemas' outbox tables, one slot, --topic outbox.{schema}.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestSeveralOutboxTables runs the built binary over billing.outbox_events,
// then restarts it with shipping.outbox_events added to --table:
//   - a relay that may not change the publication refuses, printing the
//     ALTER PUBLICATION to run; one that may extends it;
//   - each event reaches its schema's topic once, in per-key order;
//   - a poison event of shipping (no key) is dead-lettered, naming its
//     table, while billing's events committed after it keep flowing;
//   - cdc_relay_table_events_total counts each table's events by result.
func TestSeveralOutboxTables(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newFixture(t, sharedPG, "several_tables", true)
	conn := f.connect(ctx, t)
	for _, schema := range []string{"billing", "shipping"} {
		if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %[1]s; CREATE TABLE %[1]s.outbox_events (LIKE public.outbox_events INCLUDING ALL)`, schema)); err != nil {
			t.Fatal(err)
		}
	}
	common := []string{"run", "--pg-url", f.url, "--kafka-brokers", strings.Join(f.brokers, ","),
		"--topic", "outbox.{schema}", "--log-format", "json", "--status-interval", "200ms", "--retry-cap", "1s",
		"--slot", f.slot}
	args := func(extra ...string) []string {
		return append(append(slices.Clone(common), "--table", "billing.outbox_events"), extra...)
	}
	w := &tableWriter{seq: map[string]int{}}

	// One table first.
	r := newRelay(t, args())
	r.Start()
	r.WaitReady(30 * time.Second)
	w.write(ctx, t, conn, "billing", 20)
	waitTopic(ctx, t, f.brokers, "outbox.billing", 20)
	r.Stop(10 * time.Second)

	// shipping joins the list: refused without the right to change the
	// publication, with the statement to run.
	r = newRelay(t, args("--table", "shipping.outbox_events", "--no-create-publication"))
	r.Start()
	code, exited := r.Wait(60 * time.Second)
	out := r.Output()
	if !exited || code != 1 || !strings.Contains(out, `run ALTER PUBLICATION \"cdc_relay_outbox\" ADD TABLE \"shipping\".\"outbox_events\";`) {
		t.Fatalf("a relay that may not change the publication exited %v with code %d; want code 1 and the ALTER PUBLICATION to run:\n%s", exited, code, relayproc.Tail(out, 10))
	}

	// With the right, it extends the publication and reads both tables.
	r = newRelay(t, args("--table", "shipping.outbox_events"))
	r.Start()
	r.WaitReady(30 * time.Second)
	var published []string
	if err := conn.QueryRow(ctx, `SELECT array_agg(schemaname || '.' || tablename ORDER BY schemaname) FROM pg_publication_tables WHERE pubname = 'cdc_relay_outbox'`).Scan(&published); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(published) != "[billing.outbox_events shipping.outbox_events]" {
		t.Fatalf("publication covers %v, want both outbox tables", published)
	}
	var poison string
	if err := conn.QueryRow(ctx, `INSERT INTO shipping.outbox_events (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('parcel', '', 'NoKey', '{}') RETURNING id::text`).Scan(&poison); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		w.write(ctx, t, conn, "shipping", 15)
		w.write(ctx, t, conn, "billing", 15)
	}
	wantBilling, wantShipping := w.ids("billing"), w.ids("shipping")
	for topic, ids := range map[string][]string{"outbox.billing": wantBilling, "outbox.shipping": wantShipping} {
		recs := waitTopic(ctx, t, f.brokers, topic, len(ids))
		checkOrderedOnce(t, recs, ids, map[string]string{poison: "dead-lettered: it has no key"})
		if len(recs) != len(ids) {
			t.Errorf("%s holds %d records, want %d", topic, len(recs), len(ids))
		}
	}
	store, _ := f.deadLetters(ctx, t)
	testenv.Eventually(t, 30*time.Second, func() error {
		letters, err := store.List(ctx, deadletter.Filter{ErrorCode: "empty_key"})
		if err != nil {
			return err
		}
		if len(letters) != 1 || letters[0].EventID != poison || letters[0].Topic != "outbox.shipping" || letters[0].SourceTable != "shipping.outbox_events" {
			return fmt.Errorf("empty_key letters %+v; want one, event %s, topic outbox.shipping, source table shipping.outbox_events", letters, poison)
		}
		return nil
	})
	for table, want := range map[string]int{"shipping.outbox_events": 1, "billing.outbox_events": 0} {
		letters, err := store.List(ctx, deadletter.Filter{SourceTable: table})
		if err != nil {
			t.Fatal(err)
		}
		if len(letters) != want {
			t.Errorf("letters of source table %s: %d, want %d", table, len(letters), want)
		}
	}
	// status counts the letters by the table they came from.
	_, stdout, stderr := runCommand(ctx, t, 20*time.Second, "status", "--pg-url", f.url, "--slot", f.slot, "--json")
	var st struct {
		DeadLetters struct {
			BySourceTable map[string]int64 `json:"by_source_table"`
		} `json:"dead_letters"`
	}
	if err := json.Unmarshal([]byte(stdout), &st); err != nil || st.DeadLetters.BySourceTable["shipping.outbox_events"] != 1 || len(st.DeadLetters.BySourceTable) != 1 {
		t.Errorf("status --json: dead letters by source table %v (%v); want shipping.outbox_events: 1\n%s%s", st.DeadLetters.BySourceTable, err, stdout, stderr)
	}
	// The metrics count each table's events by result.
	for _, c := range []struct {
		sample string
		want   float64
	}{
		{`cdc_relay_table_events_total{result="published",table="billing.outbox_events"}`, float64(len(wantBilling) - 20)}, // this run's
		{`cdc_relay_table_events_total{result="published",table="shipping.outbox_events"}`, float64(len(wantShipping))},
		{`cdc_relay_table_events_total{result="dead_lettered",table="shipping.outbox_events"}`, 1},
	} {
		if got := r.Metric(c.sample); got != c.want {
			t.Errorf("%s = %v, want %v", c.sample, got, c.want)
		}
	}
	requireRunning(t, r, "after both tables' events")
	r.Stop(10 * time.Second)

	// A third table of another layout, configured in the file: its own key
	// column, header and topic.
	if _, err := conn.Exec(ctx, `CREATE TABLE shipping.parcels_outbox (LIKE public.outbox_events INCLUDING ALL);
		ALTER TABLE shipping.parcels_outbox RENAME COLUMN aggregate_id TO parcel_id;
		ALTER TABLE shipping.parcels_outbox ADD COLUMN carrier text`); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(config, []byte(`table:
  - billing.outbox_events
  - shipping.outbox_events
  - name: shipping.parcels_outbox
    column-aggregate-id: parcel_id
    header-columns: [carrier=x-carrier]
    topic: parcels.{aggregate_type}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	r = newRelay(t, append([]string{"--config", config}, common...))
	r.Start()
	r.WaitReady(30 * time.Second)
	var parcels []string
	for i := range 10 {
		var id string
		if err := conn.QueryRow(ctx, `INSERT INTO shipping.parcels_outbox (aggregate_type, parcel_id, event_type, payload, carrier)
			VALUES ('parcel', $1, 'Counted', jsonb_build_object('seq', $2::int), 'dhl') RETURNING id::text`, fmt.Sprint("p-", i%2), i/2+1).Scan(&id); err != nil {
			t.Fatal(err)
		}
		parcels = append(parcels, id)
	}
	recs := waitTopic(ctx, t, f.brokers, "parcels.parcel", len(parcels))
	checkOrderedOnce(t, recs, parcels, nil)
	for _, rec := range recs {
		if !strings.HasPrefix(string(rec.Key), "p-") || rec.Headers["x-carrier"] != "dhl" {
			t.Fatalf("parcel record: key %q, headers %v; want the parcel_id as key and x-carrier: dhl", rec.Key, rec.Headers)
		}
	}
	requireRunning(t, r, "after the parcels")
	r.Stop(10 * time.Second)

	// A backlog of over 2 MiB of WAL across the three tables, written while
	// no relay runs, one-row transactions taking turns between them (issue
	// 44): the restart catches it up in batches, each table's events reach
	// their topic once and in per-key order, and the relay streams after.
	var start pglogrepl.LSN
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()").Scan(&start); err != nil {
		t.Fatal(err)
	}
	now := start
	for i := 10; now-start < 2<<20; i++ {
		w.write(ctx, t, conn, "billing", 1)
		w.write(ctx, t, conn, "shipping", 1)
		var id string
		if err := conn.QueryRow(ctx, `INSERT INTO shipping.parcels_outbox (aggregate_type, parcel_id, event_type, payload, carrier)
			VALUES ('parcel', $1, 'Counted', jsonb_build_object('seq', $2::int, 'fill', repeat('x', 300)), 'dhl') RETURNING id::text`, fmt.Sprint("p-", i%2), i/2+1).Scan(&id); err != nil {
			t.Fatal(err)
		}
		parcels = append(parcels, id)
		if i%100 == 0 {
			if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()").Scan(&now); err != nil {
				t.Fatal(err)
			}
		}
	}
	r = newRelay(t, append(append([]string{"--config", config}, common...), "--catch-up-threshold-mib", "1", "--catch-up-batch", "1500"))
	r.Start()
	r.WaitLog("caught up: switching to streaming", 120*time.Second)
	r.WaitReady(60 * time.Second)
	w.write(ctx, t, conn, "billing", 5) // streamed
	for topic, ids := range map[string][]string{"outbox.billing": w.ids("billing"), "outbox.shipping": w.ids("shipping"), "parcels.parcel": parcels} {
		recs := waitTopic(ctx, t, f.brokers, topic, len(ids))
		checkOrderedOnce(t, recs, ids, map[string]string{poison: "dead-lettered: it has no key"})
	}
	if b := r.Metric("cdc_relay_catch_up_batches_total"); b < 2 {
		t.Errorf("catch_up_batches_total = %v after a backlog of %d bytes of WAL in batches of 500 transactions, want 2 or more", b, now-start)
	}
	t.Logf("caught up %d bytes of WAL over three tables in %v batches", now-start, r.Metric("cdc_relay_catch_up_batches_total"))
	requireRunning(t, r, "after the catch-up")
	r.Stop(10 * time.Second)
}

// tableWriter commits one-row transactions into the outbox tables of
// several schemas, over four keys per schema whose payloads count up.
type tableWriter struct {
	seq       map[string]int
	committed map[string][]string // schema → ids in commit order
}

func (w *tableWriter) write(ctx context.Context, t *testing.T, conn *pgx.Conn, schema string, n int) {
	t.Helper()
	if w.committed == nil {
		w.committed = map[string][]string{}
	}
	for i := range n {
		key := fmt.Sprintf("%s-%d", schema, i%4)
		w.seq[key]++
		payload, _ := json.Marshal(map[string]int{"seq": w.seq[key]})
		var id string
		if err := conn.QueryRow(ctx, fmt.Sprintf(`INSERT INTO %s.outbox_events (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', $1, 'Counted', $2::jsonb) RETURNING id::text`, schema), key, string(payload)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		w.committed[schema] = append(w.committed[schema], id)
	}
}

func (w *tableWriter) ids(schema string) []string { return w.committed[schema] }

// waitTopic waits until topic holds at least n records and returns them all.
func waitTopic(ctx context.Context, t *testing.T, brokers []string, topic string, n int) []sandbox.Record {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := sandbox.WaitForRecords(wctx, brokers, n, topic); err != nil {
		t.Fatalf("wait for %d records on %s: %v", n, topic, err)
	}
	recs, err := sandbox.ReadAll(wctx, brokers, topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		if rec.Headers[sink.HeaderID] == "" {
			t.Fatalf("record on %s without the id header: %+v", topic, rec.Headers)
		}
	}
	return recs
}
