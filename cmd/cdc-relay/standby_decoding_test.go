package main

// End-to-end test of decoding on a hot standby (issue 29, test 2): the slot,
// the stream and the decoding on a PostgreSQL 16+ standby, the checkpoint
// and the heartbeats on the primary (--primary-pg-url).

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/verify"
)

// standbyKills is how many times TestDecodingOnStandby SIGKILLs the relay.
const standbyKills = 5

// TestDecodingOnStandby: writers commit outbox rows on the primary while the
// relay decodes on its hot standby and is killed with SIGKILL five times:
// every committed row reaches Kafka in per-key order, no logical slot
// exists on the primary, and the checkpoint is on the primary. Without
// --primary-pg-url the relay refuses to start and names the flag.
func TestDecodingOnStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("skip: starts two clusters")
	}
	primary := testenv.NewPostgres(t, sandbox.PGOptions{})
	testenv.RequireLocal(t, primary)
	if primary.Major() < 16 {
		t.Skipf("skip: needs PostgreSQL 16 or later (logical decoding on a standby), the tests run %s: set %s to the bin directory of a 16+ server",
			primary.Describe(), sandbox.EnvPGBinDir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const db = "sbdec"
	url, err := primary.CreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	applyMigrations(t, url)
	standby, err := primary.StartStandby(ctx, sandbox.StandbyOptions{
		Slot: "sb_phys", Database: db,
		Settings: map[string]string{"hot_standby_feedback": "on"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	standbyURL := standby.URL(db)

	f := &fixture{pg: primary, db: db, url: url, slot: "sb_slot", topic: "outbox.e2e.standby"}
	f.kafka = testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4})
	f.brokers = f.kafka.Brokers()
	args := f.relayArgs()
	for i, a := range args {
		if a == url {
			args[i] = standbyURL // --pg-url: the standby
		}
	}

	t.Run("refused without the primary URL", func(t *testing.T) {
		code, stdout, stderr := runCommand(ctx, t, 60*time.Second, append(args, "--kafka-start-timeout", "5s")...)
		out := stdout + stderr
		if code == 0 || !strings.Contains(out, "--primary-pg-url") || !strings.Contains(out, "hot standby") {
			t.Fatalf("exit %d, want a refusal naming --primary-pg-url:\n%s", code, out)
		}
	})

	r := newRelay(t, append(args, "--primary-pg-url", url))
	began := time.Now()
	r.Start()
	r.WaitReady(60 * time.Second)
	t.Logf("ready on the standby %v after start (the slot created there)", time.Since(began).Round(time.Millisecond))
	if v := r.Metric(`cdc_relay_source{role="standby"}`); v != 1 {
		t.Errorf(`cdc_relay_source{role="standby"} = %v, want 1`, v)
	}

	w := verify.NewWriter(url, "agg-", 40, 29)
	stopWriter := make(chan struct{})
	werr := w.GoRun(ctx, stopWriter, 0, 400)
	for i := 1; i <= standbyKills; i++ {
		before := w.Count()
		testenv.Eventually(t, 30*time.Second, func() error {
			if r.Exited() {
				t.Fatalf("relay exited by itself:\n%s", relayproc.Tail(r.Logs(), 30))
			}
			if n := w.Count(); n < before+300 {
				return fmt.Errorf("%d events committed since the last kill, want 300", n-before)
			}
			return nil
		})
		r.Kill()
		t.Logf("SIGKILL #%d: %d events committed so far", i, w.Count())
		r.Start()
		r.WaitReady(60 * time.Second)
	}
	close(stopWriter)
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	res, _ := f.waitDelivered(ctx, t, w.Committed, 90*time.Second)
	t.Logf("standby decoding, %d SIGKILLs: %s", standbyKills, res)
	requireComplete(t, res)

	pconn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Close(context.Background())
	var logical int
	if err := pconn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'").Scan(&logical); err != nil {
		t.Fatal(err)
	}
	if logical != 0 {
		t.Errorf("%d logical slots on the primary, want none: the slot belongs on the standby", logical)
	}
	var ckLSN string
	if err := pconn.QueryRow(ctx, "SELECT lsn::text FROM cdc_relay_checkpoints WHERE slot_name = $1", f.slot).Scan(&ckLSN); err != nil {
		t.Fatalf("read the checkpoint on the primary: %v", err)
	}
	sconn, err := pgx.Connect(ctx, standbyURL)
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close(context.Background())
	s, err := replication.ReadSlot(ctx, sconn, f.slot)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Exists || !s.InRecovery {
		t.Fatalf("slot on the standby: %+v, want it there", s)
	}

	// Idle WAL is released on the standby too: with nothing in flight the
	// slot's confirmed position passes the primary's WAL end of now.
	var end string
	if err := pconn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
		t.Fatal(err)
	}
	target, err := pglogrepl.ParseLSN(end)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		s, err := replication.ReadSlot(ctx, sconn, f.slot)
		if err != nil {
			return err
		}
		if s.ConfirmedFlush < target {
			return fmt.Errorf("the standby's slot is confirmed at %s, not yet past the primary's WAL end %s", s.ConfirmedFlush, target)
		}
		return nil
	})

	// status against the standby says so.
	code, stdout, stderr := runCommand(ctx, t, 30*time.Second, "status", "--pg-url", standbyURL, "--slot", f.slot, "--json")
	var st struct {
		Server     string `json:"server"`
		SlotExists bool   `json:"slot_exists"`
	}
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("status --json (exit %d): %v\n%s%s", code, err, stdout, stderr)
	}
	if st.Server != "standby" || !st.SlotExists {
		t.Errorf("status: server %q, slot exists %v; want standby, true:\n%s", st.Server, st.SlotExists, stdout)
	}
	r.Stop(15 * time.Second)
}
