package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
			r.start()
			r.waitReady(30 * time.Second)
			before := time.Now().Add(-time.Second)
			if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, occurred_at)
				VALUES ('order', 'o-1', 'Placed', '{}', `+tc.value+`), ('order', 'o-1', 'Paid', '{}', NULL)`); err != nil {
				t.Fatal(err)
			}
			f.waitRecords(ctx, t, 2, 30*time.Second)
			r.stop(10 * time.Second)
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
func checkTimestamps(t *testing.T, recs []testenv.Record, want, before time.Time) {
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
