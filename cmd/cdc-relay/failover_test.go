package main

// End-to-end test of a failover (issue 29, test 1): the built binary on a
// multi-host URL follows a promotion of a standby that synchronizes its
// failover slot (PostgreSQL 17+).

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestFailoverToPromotedStandby (PostgreSQL 17+): a primary and a hot
// standby that synchronizes slots, synchronized_standby_slots set, the relay
// and the writers on a multi-host URL with target_session_attrs=read-write.
// The primary is killed (pg_ctl -m immediate) mid-stream and the standby
// promoted: the relay follows, every outbox row the new primary has is in
// Kafka, nothing the new primary lacks is, each key's events are in order,
// and the only duplicates are those docs/guarantee.md names for a
// promotion: events of the old timeline sent again from the new one.
//
// With slot failover off the standby has no copy of the slot: the relay
// stops with slot_missing once it reaches the promoted server, and a
// restart takes the slot-loss path, never a silent skip.
func TestFailoverToPromotedStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("skip: starts two clusters")
	}
	t.Run("failover slot", func(t *testing.T) { testFailover(t, "auto") })
	t.Run("slot not synchronized", func(t *testing.T) { testFailover(t, "off") })
}

func testFailover(t *testing.T, mode string) {
	lost := mode == "off"
	primary := testenv.NewPostgres(t, sandbox.PGOptions{})
	testenv.RequireLocal(t, primary)
	if primary.Major() < 17 {
		t.Skipf("skip: needs PostgreSQL 17 or later (failover slots), the tests run %s: set %s to the bin directory of a 17+ server", primary.Describe(), sandbox.EnvPGBinDir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const db = "fo"
	primaryURL, err := primary.CreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	applyMigrations(t, primaryURL)
	standby, err := primary.StartStandby(ctx, sandbox.StandbyOptions{
		Slot: "sb1", Database: db,
		Settings: map[string]string{"sync_replication_slots": "on", "hot_standby_feedback": "on"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	for _, q := range []string{"ALTER SYSTEM SET synchronized_standby_slots = 'sb1'", "SELECT pg_reload_conf()"} {
		if err := primary.Exec(ctx, "postgres", q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// pg_reload_conf only signals: wait until new backends (the relay's
	// walsender) see the setting.
	testenv.Eventually(t, 10*time.Second, func() error {
		conn, err := pgx.Connect(ctx, primary.URL(db))
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		var v string
		if err := conn.QueryRow(ctx, "SHOW synchronized_standby_slots").Scan(&v); err != nil {
			return err
		}
		if v != "sb1" {
			return fmt.Errorf("synchronized_standby_slots = %q, want sb1", v)
		}
		return nil
	})
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		primary.Port(), standby.Port(), db)
	f := &fixture{pg: primary, db: db, url: url, slot: "fo_slot", topic: "outbox.e2e.failover"}
	f.kafka = testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4})
	f.brokers = f.kafka.Brokers()
	r := newRelay(t, f.relayArgs("--slot-failover", mode))
	r.Start()
	r.WaitReady(30 * time.Second)

	// The relay made a failover slot and says the failover is safe, or
	// warns that it is not one.
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var failover bool
	if err := pool.QueryRow(ctx, "SELECT failover FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&failover); err != nil || failover == lost {
		t.Fatalf("slot failover = %v (%v), want %v", failover, err, !lost)
	}
	line := "is a failover slot and the relay receives only WAL"
	if lost {
		line = "is not a failover slot (slot failover is off"
	}
	r.WaitLog(line, 10*time.Second)

	if !lost {
		// The standby's copy of the slot is persistent (synced, not temporary).
		sconn, err := pgx.Connect(ctx, standby.URL(db))
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		testenv.Eventually(t, 60*time.Second, func() error {
			// A running-transactions record lets the standby make its copy
			// consistent now rather than at the next checkpoint.
			if _, err := pool.Exec(ctx, "SELECT pg_log_standby_snapshot()"); err != nil {
				return fmt.Errorf("log a standby snapshot: %w", err)
			}
			var synced, temporary bool
			err := sconn.QueryRow(ctx, "SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&synced, &temporary)
			if err != nil {
				return fmt.Errorf("read the standby's slot: %w", err)
			}
			if !synced || temporary {
				return fmt.Errorf("standby slot synced %v temporary %v", synced, temporary)
			}
			return nil
		})
		sconn.Close(ctx)
		t.Logf("the standby's copy of the slot was persistent after %s", time.Since(began).Round(time.Millisecond))
	}

	// Writers: one key per writer, a sequence number per attempt, so rows
	// of one key are in sequence order whichever attempts committed.
	wctx, stopWriters := context.WithCancel(ctx)
	defer stopWriters()
	var committed atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("agg-%d", w)
			for seq := 0; wctx.Err() == nil; seq++ {
				payload := fmt.Sprintf(`{"key":%q,"seq":%d}`, key, seq)
				_, err := pool.Exec(wctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'e', $2)`, key, payload)
				if err != nil {
					select { // the primary is gone: wait before trying again
					case <-wctx.Done():
					case <-time.After(50 * time.Millisecond):
					}
					continue
				}
				committed.Add(1)
				select { // a steady stream, not a flood
				case <-wctx.Done():
				case <-time.After(2 * time.Millisecond):
				}
			}
		}()
	}
	waitCommitted := func(n int64) {
		t.Helper()
		testenv.Eventually(t, 60*time.Second, func() error {
			if got := committed.Load(); got < n {
				return fmt.Errorf("%d inserts committed, want %d", got, n)
			}
			return nil
		})
	}
	waitCommitted(300)
	// Kill the primary mid-stream and promote the standby.
	if err := primary.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	before := committed.Load()
	began := time.Now()
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("promoted in %s", time.Since(began).Round(time.Millisecond))
	if lost {
		// The promoted server has no slot: the relay stops with the gap.
		code, exited := r.Wait(60 * time.Second)
		if !exited {
			t.Fatalf("relay still running 60s after the promotion of a server without its slot\n%s", relayproc.Tail(r.Logs(), 30))
		}
		t.Logf("the relay stopped (exit %d) %s after the promotion", code, time.Since(began).Round(time.Millisecond))
		if code == 0 || !strings.Contains(r.Logs(), "slot_missing") {
			t.Fatalf("relay exited %d, want a failure naming slot_missing\n%s", code, relayproc.Tail(r.Logs(), 30))
		}
		stopWriters()
		wg.Wait()
		// A restart takes the slot-loss path: it refuses with slot_missing.
		runs := r.Runs()
		r.Start()
		code, exited = r.Wait(60 * time.Second)
		out := r.Logs()
		if !exited || code == 0 || !strings.Contains(out, "does not exist, but the checkpoint store has LSN") {
			t.Fatalf("restarted relay (run %d): exit %d (exited %v), want the slot_missing refusal at start\n%s", runs+1, code, exited, relayproc.Tail(out, 30))
		}
		return
	}
	waitCommitted(before + 200)
	stopWriters()
	wg.Wait()

	// The new primary's outbox is the truth: every row of it in Kafka.
	nconn, err := pgx.Connect(ctx, standby.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer nconn.Close(ctx)
	rowsOn, recs, dups := checkPromoted(ctx, t, nconn, f)
	t.Logf("rows on the promoted server %d, records %d, duplicates %d (each re-sent from the new timeline), committed inserts %d (%d after the kill)",
		rowsOn, recs, dups, committed.Load(), committed.Load()-before)
	requireRunning(t, r, "after the failover")
	r.Stop(15 * time.Second)
}

// checkPromoted checks Kafka against the outbox of a promoted server (conn),
// the truth after a failover: every row of it in Kafka, nothing it lacks,
// each key's first deliveries in sequence order, and a duplicate only where
// the guarantee allows one after a promotion: sent again from the new
// timeline, its first copy from the old one. It returns the server's rows,
// the records and the duplicates.
func checkPromoted(ctx context.Context, t *testing.T, conn *pgx.Conn, f *fixture) (rowsOn, records, dups int) {
	t.Helper()
	rows, err := conn.Query(ctx, "SELECT id::text FROM outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	var recs []sandbox.Record
	testenv.Eventually(t, 60*time.Second, func() error {
		recs = f.read(ctx, t)
		got := map[string]bool{}
		for _, rec := range recs {
			got[rec.Headers["id"]] = true
		}
		missing := 0
		for id := range want {
			if !got[id] {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d rows of the promoted server not in Kafka yet (%d records)", missing, len(want), len(recs))
		}
		return nil
	})
	// A writer's last insert, cancelled when the writers stopped, may have
	// committed after the rows above were read: look such ids up again.
	var unknown []string
	for _, rec := range recs {
		if id := rec.Headers["id"]; !want[id] {
			unknown = append(unknown, id)
		}
	}
	if len(unknown) > 0 {
		rows, err := conn.Query(ctx, "SELECT id::text FROM outbox_events WHERE id = ANY($1::uuid[])", unknown)
		if err != nil {
			t.Fatal(err)
		}
		late, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range late {
			want[id] = true
		}
	}
	first := map[string]int{} // id → timeline of its first copy
	last := map[string]int{}
	for _, rec := range recs {
		id := rec.Headers["id"]
		if !want[id] {
			t.Errorf("Kafka has event %s (%s), which the promoted server does not have", id, rec.Value)
		}
		// system:timeline:slot:lsn:index (outbox.Origin)
		parts := strings.Split(rec.Headers[sink.HeaderSource], ":")
		if len(parts) != 5 {
			t.Fatalf("event %s: source position %q, want system:timeline:slot:lsn:index", id, rec.Headers[sink.HeaderSource])
		}
		timeline, err := strconv.Atoi(parts[1])
		if err != nil {
			t.Fatalf("event %s: source position %q: %v", id, rec.Headers[sink.HeaderSource], err)
		}
		if prev, seen := first[id]; seen {
			dups++
			if timeline <= prev {
				t.Errorf("event %s sent twice on timeline %d (first on %d): a duplicate the guarantee does not allow", id, timeline, prev)
			}
			continue
		}
		first[id] = timeline
		var p struct {
			Key string `json:"key"`
			Seq int    `json:"seq"`
		}
		if err := json.Unmarshal(rec.Value, &p); err != nil {
			t.Fatalf("payload %s: %v", rec.Value, err)
		}
		if prev, ok := last[p.Key]; ok && p.Seq <= prev {
			t.Errorf("key %s: seq %d after %d", p.Key, p.Seq, prev)
		}
		last[p.Key] = p.Seq
	}
	return len(want), len(recs), dups
}
