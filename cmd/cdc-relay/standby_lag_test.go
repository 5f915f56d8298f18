package main

// End-to-end tests of decoding on a hot standby that lags its primary
// (issue 36, parts 4 and 5): the start-up checks wait for the standby to
// replay the publication the relay made on the primary, and a promotion of
// that standby finds a checkpoint no older than its slot.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/verify"
)

// standbyPair starts a PostgreSQL 16+ primary with database db (the outbox
// and checkpoint migrations applied, no publication) and a hot standby of
// it with settings; it skips below 16. It returns the primary, the
// standby and the primary's URL of db.
func standbyPair(ctx context.Context, t *testing.T, db string, settings map[string]string) (*sandbox.Postgres, *sandbox.Postgres, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("skip: starts two clusters")
	}
	primary := testenv.NewPostgres(t, sandbox.PGOptions{})
	testenv.RequireLocal(t, primary)
	if primary.Major() < 16 {
		t.Skipf("skip: needs PostgreSQL 16 or later (logical decoding on a standby), the tests run %s: set %s to the bin directory of a 16+ server",
			primary.Describe(), sandbox.EnvPGBinDir)
	}
	url, err := primary.CreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	applyMigrations(t, url)
	all := map[string]string{"hot_standby_feedback": "on"}
	for k, v := range settings {
		all[k] = v
	}
	standby, err := primary.StartStandby(ctx, sandbox.StandbyOptions{Slot: "sb_phys", Database: db, Settings: all})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	return primary, standby, url
}

// TestLaggingStandbyPublication (issue 36, part 4): on a standby that
// applies the primary's commits 3 s late (recovery_min_apply_delay), the
// relay creates the publication on the primary and waits, saying so, until
// the standby has replayed it before it judges what the publication
// covers; then it relays.
func TestLaggingStandbyPublication(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const db = "sblag"
	_, standby, url := standbyPair(ctx, t, db, map[string]string{"recovery_min_apply_delay": "3s"})
	f := &fixture{db: db, url: standby.URL(db), slot: "lag_slot", topic: "outbox.e2e.lagging"}
	f.kafka = testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 2})
	f.brokers = f.kafka.Brokers()
	r := newRelay(t, f.relayArgs("--primary-pg-url", url))
	began := time.Now()
	r.Start()
	testenv.Eventually(t, 60*time.Second, func() error {
		if r.Exited() {
			code, _ := r.Wait(0)
			t.Fatalf("relay exited %d instead of waiting for the standby to replay its publication:\n%s", code, relayproc.Tail(r.Logs(), 20))
		}
		if r.Readyz() != 200 {
			return fmt.Errorf("not ready yet")
		}
		return nil
	})
	t.Logf("ready %s after start", time.Since(began).Round(time.Millisecond))
	if !r.HasLog("waiting for the standby to replay") {
		t.Errorf("no progress line while the standby replayed the publication:\n%s", relayproc.Tail(r.Logs(), 20))
	}
	w := verify.NewWriter(url, "agg-", 8, 36)
	stop := make(chan struct{})
	werr := w.GoRun(ctx, stop, 0, 100)
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := w.Count(); n < 100 {
			return fmt.Errorf("%d events committed, want 100", n)
		}
		return nil
	})
	close(stop)
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	res, _ := f.waitDelivered(ctx, t, w.Committed, 60*time.Second)
	requireComplete(t, res)
	r.Stop(15 * time.Second)
}

// TestPromoteDecodingStandby (issue 36, part 5): the relay decodes on a
// standby S of primary P, writing through a multi-host primary URL (P, S,
// target_session_attrs=read-write). S stops receiving P's WAL while P takes
// more checkpoints (a replication lag at its worst: P then dies), P is
// stopped and S promoted, while the relay runs on or after it was killed
// with SIGKILL. The slot on S must never be confirmed past the checkpoint S
// holds: the relay goes on, and restarts after a SIGKILL, without a
// slot_ahead refusal, every outbox row of S is in Kafka, each
// key's events are in order, and the only duplicates are those
// docs/guarantee.md names for a promotion (sent again from the new
// timeline).
func TestPromoteDecodingStandby(t *testing.T) {
	t.Run("relay killed before the promotion", func(t *testing.T) { testPromoteStandby(t, true) })
	t.Run("relay running through the promotion", func(t *testing.T) { testPromoteStandby(t, false) })
}

func testPromoteStandby(t *testing.T, killed bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const db = "sbpromo"
	primary, standby, _ := standbyPair(ctx, t, db, nil)
	multi := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		primary.Port(), standby.Port(), db)
	f := &fixture{db: db, url: standby.URL(db), slot: "promo_slot", topic: "outbox.e2e.promotion"}
	f.kafka = testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4})
	f.brokers = f.kafka.Brokers()
	r := newRelay(t, f.relayArgs("--primary-pg-url", multi))
	r.Start()
	r.WaitReady(60 * time.Second)

	pool, err := pgxpool.New(ctx, multi)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sconn, err := pgx.Connect(ctx, standby.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sconn.Close(context.Background()) }()

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
				pause := 5 * time.Millisecond
				if err != nil {
					pause = 50 * time.Millisecond // the primary is gone: wait before trying again
				} else {
					committed.Add(1)
				}
				select {
				case <-wctx.Done():
				case <-time.After(pause):
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

	// S stops receiving P's WAL: what P writes from now on (rows and the
	// relay's checkpoints) S never gets.
	for _, q := range []string{"ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"} {
		if _, err := sconn.Exec(ctx, q); err != nil {
			t.Fatalf("standby: %s: %v", q, err)
		}
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		var receivers int
		if err := sconn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_wal_receiver").Scan(&receivers); err != nil {
			return err
		}
		if receivers != 0 {
			return fmt.Errorf("the standby's WAL receiver still runs")
		}
		return nil
	})
	var replayed pglogrepl.LSN
	if err := sconn.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn()").Scan(&replayed); err != nil {
		t.Fatal(err)
	}
	readLSN := func(conn interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, what string) pglogrepl.LSN {
		t.Helper()
		var s string
		if err := conn.QueryRow(ctx, "SELECT lsn::text FROM cdc_relay_checkpoints WHERE slot_name = $1", f.slot).Scan(&s); err != nil {
			t.Fatalf("read the checkpoint %s: %v", what, err)
		}
		lsn, err := pglogrepl.ParseLSN(s)
		if err != nil {
			t.Fatal(err)
		}
		return lsn
	}
	// The relay persists on P everything S replayed: the checkpoint on P
	// passes S's replay position, the checkpoint S holds stays behind.
	var onPrimary pglogrepl.LSN
	testenv.Eventually(t, 60*time.Second, func() error {
		if onPrimary = readLSN(pool, "on the primary"); onPrimary < replayed {
			return fmt.Errorf("checkpoint on the primary %s, not yet at the standby's replay position %s", onPrimary, replayed)
		}
		return nil
	})
	onStandby := readLSN(sconn, "on the standby")
	t.Logf("the standby replayed up to %s; checkpoint on the primary %s, on the standby %s", replayed, onPrimary, onStandby)
	// The relay confirms every status interval (200 ms): within 25 of them
	// an unsafe confirmation shows. The slot on S may never pass the
	// checkpoint S holds, which is what S keeps when it is promoted.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		s, err := replication.ReadSlot(ctx, sconn, f.slot)
		if err != nil {
			t.Fatal(err)
		}
		if s.ConfirmedFlush > onStandby {
			t.Errorf("the standby's slot is confirmed at %s, past the checkpoint the standby holds (%s): a promotion now finds the slot ahead", s.ConfirmedFlush, onStandby)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Stop P, promote S (SIGKILL the relay first, or not); the writers go
	// on on S.
	if killed {
		r.Kill()
	}
	if err := primary.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	before := committed.Load()
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	restart := func() {
		t.Helper()
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
	}
	if killed {
		restart()
	}
	waitCommitted(before + 200)
	if !killed {
		// The relay that ran through the promotion left the promoted
		// server's slot and checkpoint consistent: a SIGKILL and restart
		// resumes.
		requireRunning(t, r, "through the promotion")
		r.Kill()
		restart()
		after := committed.Load()
		waitCommitted(after + 100)
	}
	stopWriters()
	wg.Wait()
	if strings.Contains(r.Logs(), "slot_ahead") {
		t.Errorf("the relay reported slot_ahead:\n%s", relayproc.Tail(r.Logs(), 20))
	}

	rowsOn, recs, dups := checkPromoted(ctx, t, sconn, f)
	t.Logf("rows on the promoted server %d, records %d, duplicates %d (each re-sent from the new timeline), committed inserts %d (%d after the promotion)",
		rowsOn, recs, dups, committed.Load(), committed.Load()-before)
	requireRunning(t, r, "after the promotion")
	r.Stop(15 * time.Second)
}
