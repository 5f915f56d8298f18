package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/verify"
)

// catchUpBacklog stops r, commits a backlog of at least 2 MiB of WAL with w
// on url's database, restarts r with the catch-up threshold at 1 MiB and
// waits until it caught up, switched to streaming and delivered every
// event exactly once in per-key order.
func catchUpBacklog(ctx context.Context, t *testing.T, f *fixture, r *relayProc, w *verify.Writer, writeURL string) {
	t.Helper()
	r.Stop(15 * time.Second)
	conn, err := pgx.Connect(ctx, writeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var start pglogrepl.LSN
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()").Scan(&start); err != nil {
		t.Fatal(err)
	}
	for {
		if err := w.Run(ctx, nil, w.Count()+2000, 1e9); err != nil {
			t.Fatal(err)
		}
		var now pglogrepl.LSN
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()").Scan(&now); err != nil {
			t.Fatal(err)
		}
		if now-start > 2<<20 {
			break
		}
	}
	r.Start()
	r.WaitLog("caught up: switching to streaming", 120*time.Second)
	r.WaitReady(60 * time.Second)
	res, _ := f.waitDelivered(ctx, t, w.Committed, 90*time.Second)
	t.Logf("catch-up of %d events: %s; %v batches", w.Count(), res, r.Metric("cdc_relay_catch_up_batches_total"))
	requireComplete(t, res)
	if res.Duplicates != 0 {
		t.Errorf("%d duplicates, want none (effectively-once)", res.Duplicates)
	}
	if b := r.Metric("cdc_relay_catch_up_batches_total"); b < 2 {
		t.Errorf("catch_up_batches_total = %v, want 2 or more", b)
	}
}

// TestCatchUpOnStandby (issue 44): the relay decoding on a hot standby
// (16+) catches up a backlog there in batches, the checkpoint written on
// the primary and the standby's slot advanced only past what the standby
// replayed of it; then it streams.
func TestCatchUpOnStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("skip: starts two clusters")
	}
	primary := testenv.NewPostgres(t, sandbox.PGOptions{})
	testenv.RequireLocal(t, primary)
	if primary.Major() < 16 {
		t.Skipf("skip: needs PostgreSQL 16 or later (logical decoding on a standby), the tests run %s: set %s to the bin directory of a 16+ server",
			primary.Describe(), sandbox.EnvPGBinDir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const db = "cusb"
	url, err := primary.CreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	applyMigrations(t, url)
	standby, err := primary.StartStandby(ctx, sandbox.StandbyOptions{
		Slot: "cusb_phys", Database: db,
		Settings: map[string]string{"hot_standby_feedback": "on"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	f := &fixture{pg: primary, db: db, url: url, slot: "cusb_slot", topic: "outbox.e2e.catchup.standby"}
	f.kafka = testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4})
	f.brokers = f.kafka.Brokers()
	args := f.relayArgs("--primary-pg-url", url, "--catch-up-threshold-mib", "1", "--catch-up-batch", "3000")
	for i, a := range args {
		if a == url && args[i-1] == "--pg-url" {
			args[i] = standby.URL(db)
		}
	}
	r := newRelay(t, args)
	r.Start()
	r.WaitReady(60 * time.Second)
	w := verify.NewWriter(url, "agg-", 40, 44)
	catchUpBacklog(ctx, t, f, r, w, url)
	if !r.HasLog(`"role":"standby"`) && r.Metric(`cdc_relay_source{role="standby"}`) != 1 {
		t.Errorf("the relay does not decode on the standby")
	}
	if err := w.Run(ctx, nil, w.Count()+200, 1e9); err != nil { // streamed
		t.Fatal(err)
	}
	res, _ := f.waitDelivered(ctx, t, w.Committed, 60*time.Second)
	requireComplete(t, res)
	r.Stop(15 * time.Second)
	if t.Failed() {
		t.Logf("relay logs:\n%s", relayproc.Tail(r.Logs(), 60))
	}
}

// TestCatchUpFailoverSlot (issue 44): on PostgreSQL 17+ the relay's failover
// slot, with synchronized_standby_slots naming a standby that synchronizes
// it, is caught up in batches (each peek waits, as the walsender does, until
// the standby has the WAL it returns) and advanced; the standby's synced
// copy follows the advances.
func TestCatchUpFailoverSlot(t *testing.T) {
	if testing.Short() {
		t.Skip("skip: starts two clusters")
	}
	primary := testenv.NewPostgres(t, sandbox.PGOptions{})
	testenv.RequireLocal(t, primary)
	if primary.Major() < 17 {
		t.Skipf("skip: needs PostgreSQL 17 or later (failover slots), the tests run %s: set %s to the bin directory of a 17+ server", primary.Describe(), sandbox.EnvPGBinDir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const db = "cufo"
	url, err := primary.CreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	applyMigrations(t, url)
	standby, err := primary.StartStandby(ctx, sandbox.StandbyOptions{
		Slot: "cufo_sb", Database: db,
		Settings: map[string]string{"sync_replication_slots": "on", "hot_standby_feedback": "on"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	for _, q := range []string{"ALTER SYSTEM SET synchronized_standby_slots = 'cufo_sb'", "SELECT pg_reload_conf()"} {
		if err := primary.Exec(ctx, "postgres", q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	f := &fixture{pg: primary, db: db, url: url, slot: "cufo_slot", topic: "outbox.e2e.catchup.failover"}
	f.kafka = testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4})
	f.brokers = f.kafka.Brokers()
	r := newRelay(t, f.relayArgs("--slot-failover", "on", "--catch-up-threshold-mib", "1", "--catch-up-batch", "3000"))
	r.Start()
	r.WaitReady(60 * time.Second)
	w := verify.NewWriter(url, "agg-", 40, 45)
	catchUpBacklog(ctx, t, f, r, w, url)

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var failover bool
	var confirmed pglogrepl.LSN
	if err := conn.QueryRow(ctx, "SELECT failover, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&failover, &confirmed); err != nil || !failover {
		t.Fatalf("slot failover = %v (%v), want a failover slot", failover, err)
	}
	sconn, err := pgx.Connect(ctx, standby.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close(context.Background())
	testenv.Eventually(t, 60*time.Second, func() error {
		if _, err := conn.Exec(ctx, "SELECT pg_log_standby_snapshot()"); err != nil {
			return err
		}
		var synced bool
		var at pglogrepl.LSN
		if err := sconn.QueryRow(ctx, "SELECT synced, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&synced, &at); err != nil {
			return fmt.Errorf("read the standby's copy of the slot: %w", err)
		}
		if !synced || at < confirmed {
			return fmt.Errorf("standby's copy synced %v at %s, want synced at or past %s", synced, at, confirmed)
		}
		return nil
	})
	r.Stop(15 * time.Second)
	if t.Failed() {
		t.Logf("relay logs:\n%s", relayproc.Tail(r.Logs(), 60))
	}
}
