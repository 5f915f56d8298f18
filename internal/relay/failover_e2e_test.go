package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestFailoverToPromotedStandby (PostgreSQL 17+): a primary and a hot
// standby that synchronizes slots, synchronized_standby_slots set, the relay
// and the writers on a multi-host URL with target_session_attrs=read-write.
// The primary is killed (pg_ctl -m immediate) mid-stream and the standby
// promoted: the relay follows, and every outbox row the new primary has is
// in Kafka, nothing the new primary lacks is, and each key's events are in
// order.
//
// With slot failover off the standby has no copy of the slot: the relay
// stops with slot_missing once it reaches the promoted server, and a
// restart takes the slot-loss path, never a silent skip.
func TestFailoverToPromotedStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("skip: starts two clusters")
	}
	t.Run("failover slot", func(t *testing.T) { testFailover(t, replication.FailoverAuto) })
	t.Run("slot not synchronized", func(t *testing.T) { testFailover(t, replication.FailoverOff) })
}

func testFailover(t *testing.T, mode string) {
	lost := mode == replication.FailoverOff
	primary := testenv.NewPostgres(t, sandbox.PGOptions{})
	testenv.RequireLocal(t, primary)
	if primary.Major() < 17 {
		t.Skipf("skip: needs PostgreSQL 17 or later (failover slots), the tests run %s: set %s to the bin directory of a 17+ server", primary.Describe(), sandbox.EnvPGBinDir)
	}
	ctx := context.Background()
	const db = "fo"
	if _, err := primary.CreateDatabase(ctx, db); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"001_outbox.sql", "002_checkpoints.sql"} {
		sql, err := os.ReadFile(filepath.Join("..", "..", "migrations", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := primary.Exec(ctx, db, string(sql)); err != nil {
			t.Fatalf("apply %s: %v", f, err)
		}
	}
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

	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4})
	const topic, slot = "outbox.events", "fo_slot"
	logs := &sandbox.Buffer{}
	pool, err := relay.OpenPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	cfg := relay.Config{
		PGURL: url, Slot: slot, Publication: "cdc_relay_outbox",
		Decoder:    decoder.Config{Schema: "public", Table: "outbox_events", Columns: decoder.DefaultColumns()},
		Topic:      topic,
		CreateSlot: true, CreatePublication: true,
		Sink:            sink.Config{Brokers: kafka.Brokers()},
		Pool:            pool,
		Checkpoints:     checkpoint.NewTableStore(pool, "public.cdc_relay_checkpoints"),
		RelayName:       "failover",
		StatusInterval:  100 * time.Millisecond,
		IdleCheckpoint:  200 * time.Millisecond,
		ShutdownTimeout: 10 * time.Second,
		KafkaStartWait:  10 * time.Second,
		Retry:           backoff.Policy{Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond},
		Logger:          zerolog.New(logs).With().Timestamp().Logger(),
		Metrics:         metrics.New(prometheus.NewRegistry()),
		SlotFailover:    mode,
	}
	r := relay.New(cfg)
	rctx, stopRelay := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	var stopOnce sync.Once
	stop := func() error {
		var err error
		stopOnce.Do(func() {
			stopRelay()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				err = errors.New("relay did not stop within 30s")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop(); pool.Close() })
	testenv.Eventually(t, 30*time.Second, func() error {
		select {
		case err := <-done:
			t.Fatalf("relay stopped before it was ready: %v\n%s", err, logs.String())
		default:
		}
		if !r.Ready() {
			return errors.New("relay not ready")
		}
		return nil
	})
	// The relay made a failover slot and says the failover is safe, or
	// warns that it is not one.
	var failover bool
	if err := pool.QueryRow(ctx, "SELECT failover FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&failover); err != nil || failover == lost {
		t.Fatalf("slot failover = %v (%v), want %v", failover, err, !lost)
	}
	line := "is a failover slot and the relay receives only WAL"
	if lost {
		line = "is not a failover slot (slot failover is off"
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if !strings.Contains(logs.String(), line) {
			return fmt.Errorf("no log line %q", line)
		}
		return nil
	})

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
			err := sconn.QueryRow(ctx, "SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&synced, &temporary)
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
	wpool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer wpool.Close()
	var committed atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("agg-%d", w)
			for seq := 0; wctx.Err() == nil; seq++ {
				payload := fmt.Sprintf(`{"key":%q,"seq":%d}`, key, seq)
				_, err := wpool.Exec(wctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'e', $2)`, key, payload)
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
		var err error
		select {
		case err = <-done:
		case <-time.After(60 * time.Second):
			t.Fatalf("relay still running 60s after the promotion of a server without its slot\n%s", logs.String())
		}
		stopOnce.Do(stopRelay) // Run returned: nothing to wait for at cleanup
		t.Logf("the relay stopped %s after the promotion", time.Since(began).Round(time.Millisecond))
		var gap *gaps.GapError
		if !errors.As(err, &gap) || gap.Kind != gaps.SlotMissing {
			t.Fatalf("relay stopped with %v, want a slot_missing gap\n%s", err, logs.String())
		}
		stopWriters()
		wg.Wait()
		// A restart takes the slot-loss path: it refuses with slot_missing.
		cfg.Logger = zerolog.New(logs).With().Timestamp().Logger()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err = relay.New(cfg).Run(cctx)
		if !errors.As(err, &gap) || gap.Kind != gaps.SlotMissing || !strings.Contains(err.Error(), "does not exist, but the checkpoint store has LSN") {
			t.Fatalf("restarted relay: %v, want the slot_missing refusal at start", err)
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
	rows, err := nconn.Query(ctx, "SELECT id::text FROM outbox_events")
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
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var err error
		if recs, err = sandbox.ReadAll(rctx, kafka.Brokers(), topic); err != nil {
			return err
		}
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
			return fmt.Errorf("%d of %d rows of the new primary not in Kafka yet (%d records)\n%s", missing, len(want), len(recs), logs.String())
		}
		return nil
	})
	// Nothing the new primary lacks (synchronized_standby_slots), and each
	// key's first deliveries in sequence order.
	seen := map[string]bool{}
	last := map[string]int{}
	dups := 0
	for _, rec := range recs {
		id := rec.Headers["id"]
		if !want[id] {
			t.Errorf("Kafka has event %s (%s), which the promoted server does not have", id, rec.Value)
		}
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
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
	t.Logf("rows on the promoted server %d, records %d, duplicates %d, committed inserts %d (%d after the kill)",
		len(want), len(recs), dups, committed.Load(), committed.Load()-before)
	if err := stop(); err != nil {
		t.Fatalf("relay: %v\n%s", err, logs.String())
	}
}
