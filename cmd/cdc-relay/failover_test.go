package main

// End-to-end test of a failover (issue 29, test 1): the built binary on a
// multi-host URL follows a promotion of a standby that synchronizes its
// failover slot (PostgreSQL 17+).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
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
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const db = "fo"
	primary, standby := failoverPair(ctx, t, db, map[string]string{"sync_replication_slots": "on"})
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

	w := startWriters(ctx, t, pool)
	defer w.stop()
	committed, waitCommitted, stopWriters := &w.committed, w.waitCommitted, w.stop
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

// writers insert outbox rows through a pool until stopped: one key per
// writer, a sequence number per attempt, so rows of one key are in sequence
// order whichever attempts committed (checkPromoted). A failed insert (the
// primary is gone) is tried again after a pause.
type writers struct {
	t         *testing.T
	committed atomic.Int64
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

// startWriters starts four writers on pool.
func startWriters(ctx context.Context, t *testing.T, pool *pgxpool.Pool) *writers {
	wctx, cancel := context.WithCancel(ctx)
	w := &writers{t: t, cancel: cancel}
	for n := range 4 {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			key := fmt.Sprintf("agg-%d", n)
			for seq := 0; wctx.Err() == nil; seq++ {
				payload := fmt.Sprintf(`{"key":%q,"seq":%d}`, key, seq)
				_, err := pool.Exec(wctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'e', $2)`, key, payload)
				pause := 2 * time.Millisecond // a steady stream, not a flood
				if err != nil {
					pause = 50 * time.Millisecond // the primary is gone: wait before trying again
				} else {
					w.committed.Add(1)
				}
				select {
				case <-wctx.Done():
				case <-time.After(pause):
				}
			}
		}()
	}
	return w
}

// waitCommitted waits until n inserts committed.
func (w *writers) waitCommitted(n int64) {
	w.t.Helper()
	testenv.Eventually(w.t, 60*time.Second, func() error {
		if got := w.committed.Load(); got < n {
			return fmt.Errorf("%d inserts committed, want %d", got, n)
		}
		return nil
	})
}

// stop stops the writers and waits for them.
func (w *writers) stop() {
	w.cancel()
	w.wg.Wait()
}

// failoverPair starts a PostgreSQL 17+ primary with database db (the
// outbox and checkpoint migrations applied) and a hot standby of it with
// hot_standby_feedback on, settings and a physical slot sb1, which the
// primary's synchronized_standby_slots names; it skips below 17.
func failoverPair(ctx context.Context, t *testing.T, db string, settings map[string]string) (primary, standby *sandbox.Postgres) {
	t.Helper()
	primary = testenv.NewPostgres(t, sandbox.PGOptions{})
	testenv.RequireLocal(t, primary)
	if primary.Major() < 17 {
		t.Skipf("skip: needs PostgreSQL 17 or later (failover slots), the tests run %s: set %s to the bin directory of a 17+ server", primary.Describe(), sandbox.EnvPGBinDir)
	}
	primaryURL, err := primary.CreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	applyMigrations(t, primaryURL)
	all := map[string]string{"hot_standby_feedback": "on"}
	for k, v := range settings {
		all[k] = v
	}
	standby, err = primary.StartStandby(ctx, sandbox.StandbyOptions{Slot: "sb1", Database: db, Settings: all})
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
	return primary, standby
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

// TestPromotionWithoutTheLastCheckpoint (issue 43, point 1; PostgreSQL
// 17+): the standby stops receiving the primary's WAL while the relay goes on
// on the primary, then the standby synchronizes the failover slot from the
// primary and is promoted, and the relay is restarted against it. With the
// checkpoint table the primary's last checkpoint is written at a WAL position
// the standby never received, so the standby holds an older one; the slot
// it copies must not be ahead of it, or the restart refuses with slot_ahead
// where a promotion should go on (docs/postgres.md, Failover). With the
// checkpoint file nothing of the checkpoint is in the WAL. Either way the
// relay resumes: every outbox row of the promoted server in Kafka, in order
// per key, and only the duplicates docs/guarantee.md names for a promotion.
//
// The standby is cut off with pg_hba.conf (sandbox.RefuseReplication): its
// WAL receiver's connection is a physical replication connection, slot
// synchronization's an ordinary one, so the copy of the slot still follows
// the primary's (sync_replication_slots on). The relay is stopped before the
// promotion and the test waits until the copy is where the relay last
// confirmed the primary's slot.
func TestPromotionWithoutTheLastCheckpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("skip: starts two clusters")
	}
	t.Run("checkpoint table", func(t *testing.T) { testPromotionWithoutCheckpoint(t, false) })
	t.Run("checkpoint file", func(t *testing.T) { testPromotionWithoutCheckpoint(t, true) })
}

func testPromotionWithoutCheckpoint(t *testing.T, file bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const db = "fosync"
	primary, standby := failoverPair(ctx, t, db, map[string]string{"sync_replication_slots": "on"})
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		primary.Port(), standby.Port(), db)
	f := &fixture{pg: primary, db: db, url: url, slot: "fosync_slot", topic: "outbox.e2e.failover_sync"}
	f.kafka = testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4})
	f.brokers = f.kafka.Brokers()
	args := f.relayArgs()
	ckFile := filepath.Join(t.TempDir(), "checkpoint.json")
	if file {
		args = f.relayArgs("--checkpoint-store", "file", "--checkpoint-file", ckFile)
	}
	r := newRelay(t, args)
	r.Start()
	r.WaitReady(30 * time.Second)
	r.WaitLog("is a failover slot and the relay receives only WAL", 10*time.Second)

	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	pconn, err := pgx.Connect(ctx, primary.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { pconn.Close(context.Background()) }()
	sconn, err := pgx.Connect(ctx, standby.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sconn.Close(context.Background()) }()
	type rower interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}
	lsn := func(conn rower, what, q string, args ...any) pglogrepl.LSN {
		t.Helper()
		var s string
		if err := conn.QueryRow(ctx, q, args...).Scan(&s); err != nil {
			t.Fatalf("read %s: %v", what, err)
		}
		l, err := pglogrepl.ParseLSN(s)
		if err != nil {
			t.Fatalf("read %s: %v", what, err)
		}
		return l
	}
	slotLSN := func(conn rower, where string) pglogrepl.LSN {
		return lsn(conn, "the slot's confirmed_flush_lsn on the "+where, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", f.slot)
	}
	tableLSN := func(conn rower, where string) pglogrepl.LSN {
		return lsn(conn, "the checkpoint table on the "+where, "SELECT lsn::text FROM cdc_relay_checkpoints WHERE slot_name = $1", f.slot)
	}
	// The standby's copy of the slot becomes persistent.
	testenv.Eventually(t, 60*time.Second, func() error {
		// A running-transactions record lets the standby make its copy
		// consistent now rather than at the next checkpoint.
		if _, err := pool.Exec(ctx, "SELECT pg_log_standby_snapshot()"); err != nil {
			return fmt.Errorf("log a standby snapshot: %w", err)
		}
		var synced, temporary bool
		if err := sconn.QueryRow(ctx, "SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&synced, &temporary); err != nil {
			return fmt.Errorf("read the standby's slot: %w", err)
		}
		if !synced || temporary {
			return fmt.Errorf("standby slot synced %v temporary %v", synced, temporary)
		}
		return nil
	})

	w := startWriters(ctx, t, pool)
	defer w.stop()
	w.waitCommitted(300)

	// Cut the standby off: it keeps what it flushed, F. The relay receives
	// no WAL past F (synchronized_standby_slots), and every checkpoint it
	// writes from now on is WAL past F.
	if err := primary.RefuseReplication(ctx); err != nil {
		t.Fatal(err)
	}
	flushed := lsn(sconn, "the standby's flush position", "SELECT pg_last_wal_receive_lsn()::text")
	if !file {
		// The relay writes a checkpoint the standby does not get: one past
		// the checkpoint the standby holds (an idle advance writes one within
		// 10 s of the cut, the relay's DefaultIdleCheckpoint).
		// The relay receives no WAL past the cut, so it writes one only if it
		// had received a commit its last save before the cut did not cover.
		// Under load the last WAL before the cut can be that save itself
		// (seen once in the version matrix on 18): then the window this test
		// needs never opens, and waiting longer cannot open it.
		var onStandby pglogrepl.LSN
		if testenv.Within(60*time.Second, func() error {
			var onPrimary pglogrepl.LSN
			onPrimary, onStandby = tableLSN(pconn, "primary"), tableLSN(sconn, "standby")
			if onPrimary > onStandby {
				return nil
			}
			return errors.New("no checkpoint past the standby's yet")
		}) != nil {
			w.stop()
			r.Stop(15 * time.Second)
			t.Skipf("the relay wrote no checkpoint past the standby's (%s) within 60s of the cut: it had received nothing after its last save, so the window between the slot's sync and the checkpoint's write did not open", onStandby)
		}
	}
	// Stop the relay: its last confirmation is on the primary's slot.
	r.Stop(15 * time.Second)
	if !file && !r.HasLog("stopping with the slot confirmed behind the checkpoint") {
		t.Errorf("the relay stopped without saying that the standbys had not flushed its last checkpoint:\n%s", relayproc.Tail(r.Logs(), 10))
	}
	// Its walsender applies the last confirmation before it lets the slot
	// go, which may be after the relay exited.
	testenv.Eventually(t, 30*time.Second, func() error {
		var active bool
		if err := pconn.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&active); err != nil {
			return fmt.Errorf("read the primary's slot: %w", err)
		}
		if active {
			return fmt.Errorf("the walsender of the relay that stopped still holds the slot")
		}
		return nil
	})
	confirmed := slotLSN(pconn, "primary")
	// The standby synchronizes the slot as the primary has it now (its
	// slot sync worker naps up to 30 s while nothing changes). Twice in
	// about thirty runs on 17 its copy stayed where it was for over a
	// minute, with the standby's WAL past the primary's slot; the promotion
	// then goes on from the copy as it is, which is the relay's case too.
	var copied pglogrepl.LSN
	if testenv.Within(60*time.Second, func() error {
		if copied = slotLSN(sconn, "standby"); copied != confirmed {
			return errors.New("the standby's copy of the slot is behind")
		}
		return nil
	}) != nil {
		now := lsn(sconn, "the standby's flush position", "SELECT pg_last_wal_receive_lsn()::text")
		replayed := lsn(sconn, "the standby's replay position", "SELECT pg_last_wal_replay_lsn()::text")
		var waits string
		_ = sconn.QueryRow(ctx, "SELECT string_agg(backend_type || ': ' || coalesce(wait_event_type, '') || '/' || coalesce(wait_event, '') || ' ' || coalesce(left(query, 60), ''), '; ') FROM pg_stat_activity").Scan(&waits)
		t.Logf("the standby's copy of the slot stayed at %s for 60s, the primary's slot is at %s (the standby flushed up to %s, replayed %s; its processes: %s); the promotion goes on from the copy as it is; the standby's log on slot synchronization:\n%s",
			copied, confirmed, now, replayed, waits, grepLog(t, standby.LogFile(), "slot"))
	}
	if copied > confirmed {
		t.Fatalf("the standby's copy of the slot is at %s, past the primary's slot (%s)", copied, confirmed)
	}
	if now := lsn(sconn, "the standby's flush position", "SELECT pg_last_wal_receive_lsn()::text"); now != flushed {
		t.Fatalf("the standby flushed up to %s after it was cut off at %s: it still receives the primary's WAL", now, flushed)
	}
	var held pglogrepl.LSN
	if !file {
		held = tableLSN(sconn, "standby")
		t.Logf("the standby flushed up to %s; its checkpoint %s, its copy of the slot %s; the primary's slot %s, its checkpoint %s",
			flushed, held, copied, confirmed, tableLSN(pconn, "primary"))
		// The relay's side: it confirmed no further than the checkpoint
		// the standby holds, so no copy of the slot can pass it.
		if confirmed > held {
			t.Errorf("the primary's slot is confirmed at %s, past the checkpoint the standby holds (%s): a promotion after the standby's copy catches up finds the slot ahead of its checkpoint", confirmed, held)
		}
	}

	// Promote the standby; the writers go on on it; the relay restarts
	// against it.
	if err := primary.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	before := w.committed.Load()
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	runs := r.Runs()
	r.Start()
	testenv.Eventually(t, 60*time.Second, func() error {
		if r.Exited() {
			code, _ := r.Wait(0)
			t.Fatalf("restart %d after the promotion exited %d:\n%s", runs+1, code, relayproc.Tail(r.Logs(), 20))
		}
		if r.Readyz() != 200 {
			return fmt.Errorf("not ready yet")
		}
		return nil
	})
	if copied < held && !r.HasLog("behind the stored checkpoint") {
		t.Errorf("the restart does not say that the slot (%s) is behind the checkpoint (%s):\n%s", copied, held, relayproc.Tail(r.Logs(), 20))
	}
	w.waitCommitted(before + 200)
	w.stop()
	rowsOn, recs, dups := checkPromoted(ctx, t, sconn, f)
	t.Logf("rows on the promoted server %d, records %d, duplicates %d (each re-sent from the new timeline), committed inserts %d (%d after the promotion)",
		rowsOn, recs, dups, w.committed.Load(), w.committed.Load()-before)
	requireRunning(t, r, "after the promotion")
	r.Stop(15 * time.Second)
}

// grepLog returns the last 20 lines of the server log at path that contain
// sub, for a failure message.
func grepLog(t *testing.T, path, sub string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(read %s: %v)", path, err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, sub) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}
