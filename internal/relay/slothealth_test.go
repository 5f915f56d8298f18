package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/cli"
	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// safeWALWarnFraction is the threshold of the CdcRelaySlotSafeWALSizeLow
// warning in deploy/prometheus/alerts.yml: safe_wal_size below this fraction
// of max_slot_wal_keep_size.
const safeWALWarnFraction = 0.2

// gauge returns the value of the unlabelled gauge name in the env's
// registry, and whether it has a series.
func (e *env) gauge(name string, labels ...string) (float64, bool) {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				if !found {
					continue metric
				}
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestSlotHealthBeforeLoss is issue 29's test 4: with max_slot_wal_keep_size
// set, a running relay whose slot falls behind (a long transaction holds its
// restart_lsn back) exports safe_wal_size crossing the warning threshold
// while wal_status is still fine; then, with the relay stopped, the slot
// exceeds the limit and is lost, and the relay refuses to start with the
// recovery steps at once, never retrying.
func TestSlotHealthBeforeLoss(t *testing.T) {
	testenv.RequireLocal(t, pg)
	e := newEnv(t)
	e.cfgHook = func(c *relay.Config) { c.MonitorInterval = 100 * time.Millisecond }
	ctx := context.Background()
	setConf := func(sql string) {
		t.Helper()
		if _, err := e.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		if _, err := e.pool.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			t.Fatal(err)
		}
	}
	// Two 16MB segments: the slot may fall up to 32MB behind.
	setConf("ALTER SYSTEM SET max_slot_wal_keep_size = '32MB'")
	t.Cleanup(func() { setConf("ALTER SYSTEM RESET max_slot_wal_keep_size") })
	e.exec("CREATE TABLE wal_filler (b text)")

	e.start()
	e.exec(`INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'k', 'before', '{}')`)
	e.waitRecords(1)
	var keep float64
	testenv.Eventually(t, 10*time.Second, func() error {
		var ok bool
		if keep, ok = e.gauge("cdc_relay_slot_wal_keep_size_bytes"); !ok || keep != 32<<20 {
			return fmt.Errorf("cdc_relay_slot_wal_keep_size_bytes = %v (present %v), want %d", keep, ok, 32<<20)
		}
		if _, ok := e.gauge("cdc_relay_slot_safe_wal_size_bytes"); !ok {
			return errors.New("no cdc_relay_slot_safe_wal_size_bytes")
		}
		return nil
	})
	start, _ := e.gauge("cdc_relay_slot_safe_wal_size_bytes")

	// A transaction that stays open holds the slot's restart_lsn: the relay
	// keeps confirming, but the server must keep the WAL since its start.
	hold, err := pgx.Connect(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close(ctx)
	tx, err := hold.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "INSERT INTO wal_filler VALUES ('held')"); err != nil {
		t.Fatal(err)
	}

	// Write WAL until the exported safe_wal_size is below the warning
	// threshold; wal_status must not be past the limit yet (the warning
	// comes before the critical alert).
	threshold := safeWALWarnFraction * keep
	var safe float64
	var chunks int
	testenv.Eventually(t, 120*time.Second, func() error {
		safe, _ = e.gauge("cdc_relay_slot_safe_wal_size_bytes")
		if safe < threshold {
			return nil
		}
		e.exec("INSERT INTO wal_filler SELECT repeat('x', 1000) FROM generate_series(1, 1000)")
		chunks++
		return fmt.Errorf("safe_wal_size %.0f not below %.0f yet", safe, threshold)
	})
	for _, status := range []string{"unreserved", "lost"} {
		if v, _ := e.gauge("cdc_relay_slot_wal_status", "status", status); v != 0 {
			t.Errorf("wal_status %s when safe_wal_size first crossed the warning threshold", status)
		}
	}
	t.Logf("safe_wal_size: %.0f bytes at start, %.0f after %d chunks of ~1MB (warning threshold %.0f = %.0f%% of max_slot_wal_keep_size %.0f)",
		start, safe, chunks, threshold, 100*safeWALWarnFraction, keep)

	// The relay stops; the slot exceeds the limit and is lost.
	if err := e.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	e.loseSlotWAL()

	// Restart: refused with the recovery steps, at once.
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	logged := len(e.logs.String())
	began := time.Now()
	err = e.runCLI(rctx, new(atomic.Pointer[relay.Relay]))
	took := time.Since(began)
	if rctx.Err() != nil {
		t.Fatalf("the relay kept going for %v on a lost slot (a retry loop?): %v", took, err)
	}
	var gap *gaps.GapError
	if !errors.As(err, &gap) || gap.Kind != gaps.SlotLost {
		t.Fatalf("restart on a lost slot = %v, want a slot_lost gap error\n%s", err, e.logs.String())
	}
	if code := cli.ExitCode(err); code == 0 {
		t.Errorf("exit code %d, want non-zero", code)
	}
	for _, want := range []string{
		"wal_status 'lost'", "max_slot_wal_keep_size", "pg_drop_replication_slot('" + e.slot + "')",
		"cdc-relay replay --since", "--on-slot-loss=backfill",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal lacks %q:\n%v", want, err)
		}
	}
	if n := strings.Count(e.logs.String()[logged:], "reconnect"); n > 0 {
		t.Errorf("%d reconnect log lines on a lost slot, want none", n)
	}
	t.Logf("restart refused after %v with exit code %d", took.Round(time.Millisecond), cli.ExitCode(err))
}

// TestSlotInvalidatedWhileStreaming: Postgres invalidates the slot of a
// running relay (its walsender is terminated, every reconnect refused); the
// relay stops with the slot_lost gap and its recovery steps instead of
// reconnecting forever, and counts it: whichever sees it first, the
// monitor's watch or the refused reconnect, and with the monitor far from its
// next round, the refused reconnect alone.
func TestSlotInvalidatedWhileStreaming(t *testing.T) {
	testenv.RequireLocal(t, pg)
	for _, tt := range []struct {
		name    string
		monitor time.Duration
		want    string // what showed the invalidation
	}{
		{"monitor every 100ms", 100 * time.Millisecond, "max_slot_wal_keep_size allows"},
		{"monitor idle", time.Hour, "the server says: "},
	} {
		t.Run(tt.name, func(t *testing.T) { slotInvalidatedWhileStreaming(t, tt.monitor, tt.want) })
	}
}

func slotInvalidatedWhileStreaming(t *testing.T, monitor time.Duration, seen string) {
	e := newEnv(t)
	e.cfgHook = func(c *relay.Config) { c.MonitorInterval = monitor }
	ctx := context.Background()
	e.start()
	e.exec(`INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'k', 'before', '{}')`)
	e.waitRecords(1)

	// An open transaction holds restart_lsn, so the WAL switches below put
	// the active slot past a 1MB limit.
	e.exec("CREATE TABLE wal_filler (b text)")
	hold, err := pgx.Connect(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close(ctx)
	tx, err := hold.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "INSERT INTO wal_filler VALUES ('held')"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	e.loseSlotWAL()

	var runErr error
	select {
	case runErr = <-e.done:
		e.cancel = nil
	case <-time.After(30 * time.Second):
		t.Fatalf("the relay still runs 30s after its slot was invalidated (a retry loop?)\n%s", e.logs.String())
	}
	var gap *gaps.GapError
	if !errors.As(runErr, &gap) || gap.Kind != gaps.SlotLost {
		t.Fatalf("Run = %v, want a slot_lost gap error\n%s", runErr, e.logs.String())
	}
	for _, want := range []string{"invalidated while the relay was streaming", seen, "pg_drop_replication_slot('" + e.slot + "')", "(command replay since=", "max_slot_wal_keep_size"} {
		if !strings.Contains(runErr.Error(), want) {
			t.Errorf("the error lacks %q:\n%v", want, runErr)
		}
	}
	if v, _ := e.counter("cdc_relay_slot_problems_total", "kind", "slot_lost"); v < 1 {
		t.Errorf("slot_problems_total{kind=slot_lost} = %v, want at least 1", v)
	}
	t.Logf("stopped %v after the WAL was first switched past the limit: %v", time.Since(began).Round(time.Millisecond), runErr)
}

// counter returns the value of counter name with labels in the env's registry.
func (e *env) counter(name string, labels ...string) (float64, bool) {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				if !found {
					continue metric
				}
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}
