package main

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestPartitionDetachedAfterKill: the built relay is killed (SIGKILL) while
// Kafka refuses the rows of a partition the publication lists by name; the
// partition is detached and gets rows of its own before the relay starts
// again, which never knew it as a partition. The rows written while it was
// one are dead-lettered as unattributed_partition naming why, with the rows
// committed after the detach but before the relay met the table again;
// later rows are skipped as another table's. None is skipped silently.
func TestPartitionDetachedAfterKill(t *testing.T) {
	ctx := t.Context()
	f := newFixture(t, sharedPG, t.Name(), true)
	testenv.RequireLocalKafka(t, f.kafka)
	conn := f.connect(ctx, t)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`DROP TABLE outbox_events;
CREATE TABLE outbox_events (
    id             uuid        NOT NULL DEFAULT gen_random_uuid(),
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE TABLE outbox_2025 PARTITION OF outbox_events FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
CREATE TABLE outbox_default PARTITION OF outbox_events DEFAULT;
CREATE PUBLICATION cdc_relay_outbox FOR TABLE outbox_events, outbox_2025 WITH (publish = 'insert')`)
	rows := func(table, prefix, created string, n int) {
		t.Helper()
		exec(`INSERT INTO `+table+` (aggregate_type, aggregate_id, event_type, payload, created_at)
			SELECT 'order', $1 || g, 'Placed', '{}', $2::timestamptz FROM generate_series(0, $3 - 1) g`, prefix, created, n)
	}
	// confirmed waits until the relay confirmed the slot past everything committed.
	confirmed := func(r *relayProc) {
		t.Helper()
		var end string
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, func() error {
			requireRunning(t, r, "while it catches up")
			var done bool
			if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2", end, f.slot).Scan(&done); err != nil {
				t.Fatal(err)
			}
			if !done {
				return fmt.Errorf("slot not confirmed past %s", end)
			}
			return nil
		})
	}
	var broken atomic.Bool
	c := f.kafka.Cluster()
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !broken.Load() {
			return nil, nil, false
		}
		return testenv.ProduceError(kreq.(*kmsg.ProduceRequest), kerr.NotLeaderForPartition.Code), nil, true
	})

	r := newRelay(t, f.relayArgs("--max-in-flight-mib", "1"))
	r.Start()
	r.WaitReady(60 * time.Second)
	rows("outbox_events", "live-", "2031-01-01", 1)
	confirmed(r)

	broken.Store(true)
	rows("outbox_events", "k25-", "2025-06-01", 3) // into outbox_2025, which the relay knows as a partition
	r.Kill()
	exec(`ALTER TABLE outbox_events DETACH PARTITION outbox_2025`)
	rows("outbox_2025", "after-", "2025-06-01", 2) // not outbox rows, committed before the relay meets the table again
	broken.Store(false)
	r.Start()
	r.WaitReady(60 * time.Second)
	confirmed(r)
	rows("outbox_2025", "later-", "2025-06-01", 2) // another table's rows
	rows("outbox_events", "live2-", "2031-01-01", 1)
	confirmed(r)

	got := map[string]string{}
	for _, rec := range f.read(ctx, t) {
		got[string(rec.Key)] = "kafka"
	}
	store, _ := f.deadLetters(ctx, t)
	letters, err := store.List(ctx, deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range letters {
		if l.ErrorCode != decoder.CodeUnattributed || !strings.Contains(l.ErrorMessage, "cannot tell whether this row") {
			t.Errorf("dead letter of %s: %s: %s, want %s naming why", l.AggregateID, l.ErrorCode, l.ErrorMessage, decoder.CodeUnattributed)
		}
		got[l.AggregateID] = "dead letter"
	}
	want := map[string]string{"live-0": "kafka", "live2-0": "kafka"}
	for i := range 3 {
		want[fmt.Sprint("k25-", i)] = "dead letter"
	}
	for i := range 2 {
		want[fmt.Sprint("after-", i)] = "dead letter"
	}
	for key, w := range want {
		if got[key] != w {
			t.Errorf("row %s: %q, want %q", key, got[key], w)
		}
	}
	for key, g := range got {
		if _, ok := want[key]; !ok {
			t.Errorf("unexpected row %s in %s", key, g) // later-* are not outbox rows
		}
	}
	if !r.HasLog("has exactly the columns of an outbox table") {
		t.Errorf("no log line saying why the rows were dead-lettered")
	}
}
