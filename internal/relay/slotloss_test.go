package relay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-relay/cdc-relay/internal/cli"
	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// runCLI runs "cdc-relay run" in process with the env's database, slot and
// broker plus extra flags, until ctx is done or it fails; rl holds the relay
// once it is made (see waitReady).
func (e *env) runCLI(ctx context.Context, rl *atomic.Pointer[relay.Relay], extra ...string) error {
	args := append([]string{"run",
		"--pg-url", e.url, "--slot", e.slot, "--kafka-brokers", strings.Join(e.kafka.Brokers(), ","),
		"--topic", e.topic, "--metrics-addr", "", "--log-format", "json", "--log-level", "info",
		"--status-interval", "100ms", "--retry-base", "50ms", "--retry-cap", "500ms",
	}, extra...)
	return cli.Run(ctx, args, cli.Env{Stdout: e.logs, Stderr: e.logs, Version: "test", OnRelay: rl.Store})
}

// dropSlot drops the env's slot once its walsender let go of it.
func (e *env) dropSlot() {
	e.t.Helper()
	testenv.Eventually(e.t, 10*time.Second, func() error {
		if _, err := e.pool.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", e.slot); err != nil {
			return fmt.Errorf("drop slot: %w", err)
		}
		return nil
	})
}

// loseSlotWAL makes Postgres invalidate the env's (inactive) slot: it caps the
// WAL kept for slots at 1MB, writes and switches WAL past it and checkpoints,
// until pg_replication_slots says wal_status = 'lost'. The cap is reset after.
func (e *env) loseSlotWAL() {
	e.t.Helper()
	ctx := context.Background()
	set := func(sql string) {
		e.t.Helper()
		if _, err := e.pool.Exec(ctx, sql); err != nil {
			e.t.Fatalf("%s: %v", sql, err)
		}
		if _, err := e.pool.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			e.t.Fatal(err)
		}
	}
	set("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
	e.t.Cleanup(func() { set("ALTER SYSTEM RESET max_slot_wal_keep_size") })
	e.exec("CREATE TABLE IF NOT EXISTS wal_filler (b text)")
	for i := 0; i < 20; i++ {
		e.exec("INSERT INTO wal_filler SELECT repeat('x', 1000) FROM generate_series(1, 2000)")
		e.exec("SELECT pg_switch_wal()")
		e.exec("CHECKPOINT")
		var status string
		if err := e.pool.QueryRow(ctx, "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1", e.slot).Scan(&status); err != nil {
			e.t.Fatal(err)
		}
		if status == "lost" {
			return
		}
	}
	e.t.Fatal("the slot's WAL was not lost after 20 WAL switches and checkpoints")
}

// TestSlotLoss covers --on-slot-loss: a slot dropped, invalidated or recreated
// while the checkpoint store remembers an older position. fail refuses to start
// and names the flag; backfill recreates the slot and republishes the rows of
// the gap (marked), and at-least-once holds across it.
func TestSlotLoss(t *testing.T) {
	tests := []struct {
		kind gaps.GapKind
		lose func(e *env)
	}{
		{gaps.SlotMissing, func(e *env) { e.dropSlot() }},
		{gaps.SlotAhead, func(e *env) {
			e.dropSlot()
			e.exec("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", e.slot)
		}},
		{gaps.SlotLost, func(e *env) { testenv.RequireLocal(e.t, pg); e.loseSlotWAL() }},
	}
	for _, tt := range tests {
		t.Run(tt.kind.String(), func(t *testing.T) {
			e := newEnv(t)
			insertBatch := func(label string, n int) {
				e.exec(`INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
SELECT 't', 'k' || (g % 3), $1, jsonb_build_object('seq', g) FROM generate_series(1, $2::int) g`, label, n)
			}

			// Before: delivered and checkpointed.
			ctx, cancel := context.WithCancel(context.Background())
			rl := new(atomic.Pointer[relay.Relay])
			done := make(chan error, 1)
			go func(rl *atomic.Pointer[relay.Relay]) { done <- e.runCLI(ctx, rl) }(rl)
			waitReady(t, e, rl, done)
			insertBatch("before", 5)
			// A checkpoint save after the acks: stored past the batch's commit.
			e.waitStored(maxCommitLSN(t, e.waitRecords(5)) + 1)
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("first run: %v\n%s", err, e.logs.String())
			}

			// The gap: rows committed while the slot is gone, then the loss.
			if tt.kind == gaps.SlotLost {
				tt.lose(e)
				insertBatch("gap", 4)
			} else {
				insertBatch("gap", 4)
				tt.lose(e)
			}

			// fail (the default) refuses, explains, and names the way out.
			fctx, fcancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := e.runCLI(fctx, new(atomic.Pointer[relay.Relay]))
			fcancel()
			var gap *gaps.GapError
			if !errors.As(err, &gap) || gap.Kind != tt.kind {
				t.Fatalf("run with --on-slot-loss=fail = %v, want a %s gap error\n%s", err, tt.kind, e.logs.String())
			}
			if !strings.Contains(err.Error(), "--on-slot-loss=backfill") { // run through the CLI, which names the flag
				t.Errorf("the gap error does not mention --on-slot-loss=backfill: %v", err)
			}

			// backfill: the gap's rows arrive, marked; new rows stream after.
			ctx, cancel = context.WithCancel(context.Background())
			defer cancel()
			rl = new(atomic.Pointer[relay.Relay])
			done = make(chan error, 1)
			go func(rl *atomic.Pointer[relay.Relay]) { done <- e.runCLI(ctx, rl, "--on-slot-loss", "backfill") }(rl)
			waitReady(t, e, rl, done)
			insertBatch("after", 3)
			recs := e.waitRecords(5 + 5 + 4 + 3) // before, before again (backfill), gap, after
			byType := map[string]int{}
			for _, r := range recs {
				key := r.Headers["event_type"]
				if r.Headers[replay.HeaderBackfill] != "" {
					if got := r.Headers[replay.HeaderBackfill]; got != tt.kind.String() {
						t.Errorf("backfill header = %q, want %q", got, tt.kind)
					}
					key += "+backfill"
				}
				byType[key]++
			}
			want := map[string]int{"before": 5, "before+backfill": 5, "gap+backfill": 4, "after": 3}
			if fmt.Sprint(byType) != fmt.Sprint(want) {
				t.Errorf("records by event type = %v, want %v", byType, want)
			}
			if !strings.Contains(e.logs.String(), "backfill done") {
				t.Errorf("no 'backfill done' log line:\n%s", e.logs.String())
			}

			// The new position is stored: a restart backfills nothing more.
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("backfill run: %v\n%s", err, e.logs.String())
			}
			ctx, cancel = context.WithCancel(context.Background())
			rl = new(atomic.Pointer[relay.Relay])
			done = make(chan error, 1)
			go func(rl *atomic.Pointer[relay.Relay]) { done <- e.runCLI(ctx, rl, "--on-slot-loss", "backfill") }(rl)
			waitReady(t, e, rl, done)
			insertBatch("last", 1)
			recs = e.waitRecords(18)
			if len(recs) != 18 {
				t.Errorf("after a restart: %d records, want 18 (nothing backfilled again)", len(recs))
			}
			// Once the slot is confirmed past the last event, Kafka has
			// acknowledged all the relay sent before it.
			i := slices.IndexFunc(recs, func(r sandbox.Record) bool { return r.Headers["event_type"] == "last" })
			if i < 0 {
				t.Fatal("the event committed after the restart is not in Kafka")
			}
			e.waitSlotConfirmed(maxCommitLSN(t, recs[i:i+1]) + 1)
			if n := len(e.readAll()); n != 18 {
				t.Errorf("after a restart: %d records, want 18 (nothing backfilled again)", n)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("restart: %v", err)
			}
		})
	}
}

// waitReady waits until the relay runCLI stored in rl is ready, failing t
// when runCLI returns first.
func waitReady(t *testing.T, e *env, rl *atomic.Pointer[relay.Relay], done <-chan error) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func() error {
		select {
		case err := <-done:
			t.Fatalf("relay stopped before it was ready: %v\n%s", err, e.logs.String())
		default:
		}
		if r := rl.Load(); r == nil || !r.Ready() {
			return fmt.Errorf("relay not ready\n%s", e.logs.String())
		}
		return nil
	})
}

// waitStored waits until the checkpoint table holds a position of the env's
// slot at or past target.
func (e *env) waitStored(target pglogrepl.LSN) {
	e.t.Helper()
	testenv.Eventually(e.t, 30*time.Second, func() error {
		var stored string
		err := e.pool.QueryRow(context.Background(), "SELECT lsn::text FROM cdc_relay_checkpoints WHERE slot_name = $1", e.slot).Scan(&stored)
		if err != nil {
			return fmt.Errorf("read the stored checkpoint: %w", err)
		}
		if lsn, _ := pglogrepl.ParseLSN(stored); lsn < target {
			return fmt.Errorf("checkpoint stored at %s, want >= %s", stored, target)
		}
		return nil
	})
}

// maxCommitLSN returns the highest commit_lsn header of recs.
func maxCommitLSN(t *testing.T, recs []sandbox.Record) pglogrepl.LSN {
	t.Helper()
	var top pglogrepl.LSN
	for _, r := range recs {
		lsn, err := pglogrepl.ParseLSN(r.Headers["commit_lsn"])
		if err != nil {
			t.Fatalf("record %s: commit_lsn header %q: %v", r.Headers["id"], r.Headers["commit_lsn"], err)
		}
		top = max(top, lsn)
	}
	return top
}
