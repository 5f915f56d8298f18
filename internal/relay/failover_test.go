package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// slotFailover is pg_replication_slots.failover of the test's slot (17+).
func (e *env) slotFailover() bool {
	e.t.Helper()
	var on bool
	if err := e.pool.QueryRow(context.Background(), "SELECT failover FROM pg_replication_slots WHERE slot_name = $1", e.slot).Scan(&on); err != nil {
		e.t.Fatalf("read failover of slot %s: %v", e.slot, err)
	}
	return on
}

// waitLog waits for a log line containing want.
func (e *env) waitLog(want string) {
	e.t.Helper()
	testenv.Eventually(e.t, 10*time.Second, func() error {
		if !strings.Contains(e.logs.String(), want) {
			return fmt.Errorf("no log line contains %q:\n%s", want, e.logs.String())
		}
		return nil
	})
}

func requirePG17(t *testing.T) {
	t.Helper()
	if pg.Major() < 17 {
		t.Skipf("skip: needs PostgreSQL 17 or later (failover slots), the tests run %s: set %s to the bin directory of a 17+ server", pg.Describe(), sandbox.EnvPGBinDir)
	}
}

// TestSlotFailoverByVersion runs on whichever server the tests start: auto
// makes a failover slot on 17+ and says below 17 that a failover loses the
// slot; on is refused below 17 with the version and the setting.
func TestSlotFailoverByVersion(t *testing.T) {
	t.Run("auto", func(t *testing.T) {
		e := newEnv(t)
		e.start()
		if pg.Major() < 17 {
			e.waitLog("has no failover slots (they need 17 or later)")
			return
		}
		if !e.slotFailover() {
			t.Fatal("auto on PostgreSQL 17+ created a slot without failover")
		}
		e.waitLog("synchronized_standby_slots is empty")
	})
	t.Run("on", func(t *testing.T) {
		e := newEnv(t)
		e.cfgHook = func(c *relay.Config) { c.SlotFailover = replication.FailoverOn }
		if pg.Major() >= 17 {
			e.start()
			if !e.slotFailover() {
				t.Fatal("on created a slot without failover")
			}
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := relay.New(e.config()).Run(ctx)
		if err == nil {
			t.Fatal("relay started with failover on below PostgreSQL 17")
		}
		for _, w := range []string{fmt.Sprintf("the server is PostgreSQL %d.", pg.Major()), "need PostgreSQL 17 or later", "(setting SlotFailover)"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not mention %q", err, w)
			}
		}
		var n int
		if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", e.slot).Scan(&n); err != nil || n != 0 {
			t.Errorf("the refused relay left %d slots behind (%v)", n, err)
		}
	})
}

// TestSlotFailoverSwitchedOn: an existing slot without failover is switched
// on, with a log line, and one created with off stays so, with a warning.
func TestSlotFailoverSwitchedOn(t *testing.T) {
	requirePG17(t)
	t.Run("existing slot", func(t *testing.T) {
		e := newEnv(t)
		e.exec("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", e.slot)
		if e.slotFailover() {
			t.Fatal("pg_create_logical_replication_slot made a failover slot")
		}
		e.start()
		e.waitLog("switched failover on for the existing replication slot")
		if !e.slotFailover() {
			t.Fatal("the relay did not switch failover on")
		}
		id := ""
		e.tx(func(tx pgx.Tx) error {
			var err error
			id, err = insert(tx, "order", "o1", "created", `{"n":1}`)
			return err
		})
		recs := e.waitRecords(1)
		if got := recs[0].Headers["id"]; got != id {
			t.Fatalf("streamed event id %q, want %q", got, id)
		}
	})
	t.Run("off", func(t *testing.T) {
		e := newEnv(t)
		e.cfgHook = func(c *relay.Config) { c.SlotFailover = replication.FailoverOff }
		e.start()
		if e.slotFailover() {
			t.Fatal("off created a failover slot")
		}
		e.waitLog("is not a failover slot (slot failover is off")
	})
}

// TestWalsenderWaitsForAStandby (17+): a walsender of a failover slot holds
// back WAL its synchronized_standby_slots standbys have not received and
// warns, while one of them is down, on every wait. The relay logs that once
// and streams on, rather than reconnecting again and again while the standby
// is down, and it publishes what the walsender sends once the standby is
// back (here: once the setting no longer names it).
func TestWalsenderWaitsForAStandby(t *testing.T) {
	requirePG17(t)
	own := testenv.NewPostgres(t, sandbox.PGOptions{})
	testenv.RequireLocal(t, own)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	admin := func(q string) {
		t.Helper()
		if err := own.Exec(ctx, "postgres", q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// A physical slot whose standby never connects: it reserves WAL from
	// its creation on, so the walsender waits for it.
	admin("SELECT pg_create_physical_replication_slot('sb_down', true)")
	e := newEnvOn(t, own)
	e.start()
	add := func(n int) {
		t.Helper()
		e.tx(func(tx pgx.Tx) error {
			_, err := insert(tx, "order", "o1", "created", fmt.Sprintf(`{"n":%d}`, n))
			return err
		})
	}
	add(0)
	e.waitRecords(1)

	admin("ALTER SYSTEM SET synchronized_standby_slots = 'sb_down'")
	admin("SELECT pg_reload_conf()")
	// The walsender reads the setting at its next wake-up: rows until it
	// has warned the relay that it waits for the standby.
	inserted := 1
	const warning = "does not have active_pid"
	testenv.Eventually(t, 30*time.Second, func() error {
		add(inserted)
		inserted++
		if !strings.Contains(e.logs.String(), warning) {
			return fmt.Errorf("the relay logged no warning of the walsender (%q) after %d rows", warning, inserted)
		}
		return nil
	})
	admin("ALTER SYSTEM RESET synchronized_standby_slots")
	admin("SELECT pg_reload_conf()")
	e.waitRecords(inserted)
	logs := e.logs.String()
	if n := strings.Count(logs, "replication failed; reconnecting"); n > 0 {
		t.Errorf("the relay left the stream %d times while the walsender waited for the standby (%d reconnects), first:\n%s",
			n, strings.Count(logs, "replication connection re-established"), firstLine(logs, "replication failed; reconnecting"))
	}
	const waits = "the walsender waits for a standby of synchronized_standby_slots"
	if n := strings.Count(logs, waits); n != 1 {
		t.Errorf("%d log lines say %q, want 1", n, waits)
	}
}

// firstLine returns the first line of s that contains substr.
func firstLine(s, substr string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			return l
		}
	}
	return ""
}
