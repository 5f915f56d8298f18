package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/verify"
)

// TestInitialSnapshot starts a relay with --snapshot initial on a database
// whose outbox already holds rows, while a writer keeps committing through
// the start, and requires every row, old and new, in Kafka in per-key order:
// exactly once after an uninterrupted start; at least once (nothing lost)
// when the first relay is killed or stopped during the snapshot and a second
// one takes it again. Rows of the snapshot carry cdc_relay_snapshot: initial.
// A relay that ends its snapshot over the catch-up threshold behind catches
// up in batches from the slot's start, with nothing lost or sent twice at
// either seam.
func TestInitialSnapshot(t *testing.T) {
	tests := []struct {
		name string
		// env sets --snapshot through CDC_RELAY_SNAPSHOT instead of the flag.
		env bool
		// interrupt, when set, is sent to the first relay once part of the
		// snapshot is in Kafka; produce requests are slowed until then so the
		// snapshot is still running.
		interrupt syscall.Signal
		// neverFirst starts a relay with --snapshot never after the
		// interruption, which must refuse to start.
		neverFirst bool
		// catchUp holds produce requests from the slot's creation until
		// over 2 MiB of WAL more has committed, so the relay finds itself
		// behind when the snapshot ends and catches up in batches.
		catchUp bool
	}{
		{name: "uninterrupted"},
		{name: "env", env: true},
		{name: "sigkill mid-snapshot", interrupt: syscall.SIGKILL, neverFirst: true},
		{name: "sigterm mid-snapshot", interrupt: syscall.SIGTERM},
		{name: "caught up after the snapshot", catchUp: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			f := newFixture(t, sharedPG, t.Name(), true)
			w := verify.NewWriter(f.url, "agg-", 20, 1)

			// Rows in the outbox before the relay ever ran.
			const before = 1500
			conn, err := pgx.Connect(ctx, f.url)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer conn.Close(context.Background())
			for i := range before {
				// One row per transaction: rows of one transaction share
				// created_at, so only separate ones have a created_at order.
				if err := w.CommitTxn(ctx, conn, []string{fmt.Sprintf("agg-%d", i%20)}); err != nil {
					t.Fatalf("insert row %d: %v", i, err)
				}
			}

			var slow atomic.Bool
			if tt.interrupt != 0 {
				slowProduce(f.kafka, &slow)
			}
			stop := make(chan struct{})
			werr := goWriteSingles(ctx, w, f.url, stop)

			release := func() {}
			if tt.catchUp {
				release, _ = testenv.HoldProduce(t, f.kafka, 0)
			}
			args := f.relayArgs("--batch-max-events", "20")
			if tt.catchUp {
				args = append(args, "--catch-up-threshold-mib", "1", "--catch-up-batch", "1500")
			}
			if !tt.env {
				args = append(args, "--snapshot", "initial")
			}
			r := newRelay(t, args)
			if tt.env {
				r.P.SetEnv(append(r.P.Env(), "CDC_RELAY_SNAPSHOT=initial"))
			}
			r.Start()
			if tt.catchUp {
				behind := writeBehindSlot(ctx, t, conn, w, f.slot, 2<<20)
				if r.HasLog("initial snapshot done") {
					t.Fatalf("the snapshot completed while Kafka held every produce request")
				}
				release()
				r.WaitLog("caught up: switching to streaming", 120*time.Second)
				if b := r.Metric("cdc_relay_catch_up_batches_total"); b < 2 {
					t.Errorf("catch_up_batches_total = %v after the snapshot, %d bytes of WAL behind, want 2 or more", b, behind)
				}
				if !strings.Contains(r.Logs()[strings.Index(r.Logs(), "initial snapshot done"):], "catching up in batches") {
					t.Errorf("the catch-up did not follow the snapshot")
				}
			}
			if tt.interrupt != 0 {
				f.waitRecords(ctx, t, 100, 30*time.Second)
				if r.HasLog("initial snapshot done") {
					t.Fatalf("the snapshot completed before the relay was interrupted; the test no longer interrupts it")
				}
				if tt.interrupt == syscall.SIGKILL {
					r.Kill()
				} else {
					r.Signal(tt.interrupt)
					if code, ok := r.Wait(15 * time.Second); !ok || code != 0 {
						t.Fatalf("relay stopped mid-snapshot with code %d (in time: %v), want 0", code, ok)
					}
				}
				slow.Store(false)
				if r.HasLog("initial snapshot done") {
					t.Fatalf("the snapshot completed before the relay was interrupted; the test no longer interrupts it")
				}
				if tt.neverFirst {
					never := newRelay(t, f.relayArgs("--snapshot", "never"))
					never.Start()
					if code, ok := never.Wait(30 * time.Second); !ok || code == 0 {
						t.Fatalf("relay with --snapshot never after an incomplete snapshot: exit code %d (exited: %v), want non-zero", code, ok)
					}
					if !strings.Contains(never.Logs(), "(--snapshot=initial / CDC_RELAY_SNAPSHOT=initial) to drop the slot and take the snapshot again") {
						t.Errorf("relay with --snapshot never did not say how to take the snapshot again")
					}
				}
				r.Start()
			}
			r.WaitReady(60 * time.Second)
			// Keep writing for a while after the relay streams.
			readyAt := w.Count()
			testenv.Eventually(t, 30*time.Second, func() error {
				if n := w.Count(); n < readyAt+200 {
					return fmt.Errorf("%d rows committed since the relay was ready, want 200", n-readyAt)
				}
				return nil
			})
			close(stop)
			if err := <-werr; err != nil {
				t.Fatal(err)
			}

			res, recs := f.waitDelivered(ctx, t, w.Committed, 30*time.Second)
			t.Logf("%s: %s", tt.name, res)
			requireComplete(t, res)
			if tt.interrupt == 0 && res.Duplicates > 0 {
				t.Errorf("%d duplicates after an uninterrupted snapshot, want none", res.Duplicates)
			}
			if tt.interrupt != 0 && !r.HasLog("the initial snapshot did not complete") {
				t.Errorf("the restarted relay did not say it takes the snapshot again")
			}
			snap := checkSnapshotHeaders(t, w.Committed()[:before], recs)
			t.Logf("%d records from the snapshot (%d rows were there before the writer started), %d streamed", snap, before, len(recs)-snap)
			if tt.interrupt == 0 {
				// The relay's replays count by result (this run's only).
				if got := r.Metric(`cdc_relay_replayed_events_total{kind="outbox",result="published"}`); got != float64(snap) {
					t.Errorf("replayed_events_total{published} = %v, want the %d snapshot records", got, snap)
				}
			}

			// A restart finds the slot: no new snapshot, nothing sent twice.
			r.Stop(10 * time.Second)
			n := len(recs)
			r.Start()
			r.WaitReady(30 * time.Second)
			if !r.HasLog("replication slot exists: no initial snapshot is taken") {
				t.Errorf("the restarted relay did not log that the slot exists")
			}
			if err := w.CommitTxn(ctx, conn, []string{"agg-0"}); err != nil {
				t.Fatal(err)
			}
			res, recs = f.waitDelivered(ctx, t, w.Committed, 30*time.Second)
			requireComplete(t, res)
			if got := len(recs); got != n+1 {
				t.Errorf("after a restart with an existing slot: %d records, want %d (one new row)", got, n+1)
			}
			r.Stop(10 * time.Second)
		})
	}
}

// checkSnapshotHeaders requires every row in pre (committed before the relay
// first started) to have arrived first with the header cdc_relay_snapshot:
// initial and no commit position, and every record without the header to
// carry one. It returns how many records carry the header.
func checkSnapshotHeaders(t *testing.T, pre []verify.Event, recs []sandbox.Record) int {
	t.Helper()
	n := 0
	first := map[string]sandbox.Record{}
	for _, rec := range recs { // in offset order per partition; a key stays on one
		if _, ok := first[rec.Headers["id"]]; !ok {
			first[rec.Headers["id"]] = rec
		}
		snap, marked := rec.Headers["cdc_relay_snapshot"]
		if marked {
			n++
		}
		switch {
		case marked && (snap != "initial" || rec.Headers["commit_lsn"] != "0/0"):
			t.Errorf("snapshot record %s: cdc_relay_snapshot %q, commit_lsn %q; want initial, 0/0", rec.Headers["id"], snap, rec.Headers["commit_lsn"])
		case !marked && rec.Headers["commit_lsn"] == "0/0":
			t.Errorf("streamed record %s has no commit position", rec.Headers["id"])
		}
	}
	for _, ev := range pre {
		if rec := first[ev.ID]; rec.Headers["cdc_relay_snapshot"] != "initial" {
			t.Fatalf("row %s, in the outbox before the first start, arrived without cdc_relay_snapshot: initial (headers %v)", ev.ID, rec.Headers)
		}
	}
	return n
}

// goWriteSingles commits one-row transactions on random aggregates of w, a
// few milliseconds apart, until stop is closed, and reports the first error.
func goWriteSingles(ctx context.Context, w *verify.Writer, url string, stop <-chan struct{}) <-chan error {
	errc := make(chan error, 1)
	go func() {
		errc <- func() error {
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				return fmt.Errorf("writer: connect: %w", err)
			}
			defer conn.Close(context.Background())
			tick := time.NewTicker(3 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				case <-tick.C:
				}
				if err := w.CommitTxn(ctx, conn, []string{fmt.Sprintf("agg-%d", rand.IntN(20))}); err != nil {
					return fmt.Errorf("writer: %w", err)
				}
			}
		}()
	}()
	return errc
}

// writeBehindSlot waits for slot to exist, then commits one-row transactions
// with w until the slot is over behind bytes of WAL behind, and returns how
// far behind it is. Its keys are its own (backlog-0…19): w numbers an
// event when it inserts it, so writers on one key would commit out of
// their order.
func writeBehindSlot(ctx context.Context, t *testing.T, conn *pgx.Conn, w *verify.Writer, slot string, behind int64) int64 {
	t.Helper()
	var got int64
	testenv.Eventually(t, 60*time.Second, func() (err error) {
		got, err = slotBehind(ctx, conn, slot)
		return err
	})
	for i := 0; got <= behind; i++ {
		if err := w.CommitTxn(ctx, conn, []string{fmt.Sprintf("backlog-%d", i%20)}); err != nil {
			t.Fatalf("commit a row of the backlog: %v", err)
		}
		if i%200 == 0 {
			var err error
			if got, err = slotBehind(ctx, conn, slot); err != nil {
				t.Fatal(err)
			}
		}
	}
	return got
}

// slotBehind returns how many bytes of WAL slot's confirmed position is
// behind the server's current one.
func slotBehind(ctx context.Context, conn *pgx.Conn, slot string) (int64, error) {
	var b int64
	err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&b)
	if err != nil {
		return 0, fmt.Errorf("read how far slot %s is behind: %w", slot, err)
	}
	return b, nil
}

// slowProduce delays every produce request of k by 50ms while slow is set
// (it is set here), so a snapshot takes seconds.
func slowProduce(k *sandbox.Kafka, slow *atomic.Bool) {
	c := k.Cluster()
	slow.Store(true)
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if slow.Load() {
			c.SleepControl(func() { time.Sleep(50 * time.Millisecond) })
		}
		return nil, nil, false
	})
}
