package chaos

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestLockWatch: a writer waiting on a lock the relay's connection holds is
// seen for as long as it waits, with what the relay ran; a writer waiting
// on another writer's lock is not the relay's doing.
func TestLockWatch(t *testing.T) {
	ctx := t.Context()
	u, err := testenv.NewPostgres(t, sandbox.PGOptions{}).CreateDatabase(ctx, "chaos_lockwatch")
	if err != nil {
		t.Fatal(err)
	}
	conn := func(app string) *pgx.Conn {
		au, err := withAppName(u, app)
		if err != nil {
			t.Fatal(err)
		}
		c, err := pgx.Connect(ctx, au)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	setup := conn("setup")
	if _, err := setup.Exec(ctx, "CREATE TABLE t (x int)"); err != nil {
		t.Fatal(err)
	}
	// holds takes the table's lock under app, blocks a writer on it until
	// the watch saw it blocked for want (0: until the watch looked polls
	// times), and returns what the watch saw.
	const polls = 6
	holds := func(app string, want time.Duration) (time.Duration, string) {
		lw := watchLocks(ctx, u)
		holder, writer := conn(app), conn(writerAppName)
		tx, err := holder.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE t IN SHARE MODE"); err != nil {
			t.Fatal(err)
		}
		inserted := make(chan error, 1)
		go func() {
			_, err := writer.Exec(ctx, "INSERT INTO t VALUES (1)")
			inserted <- err
		}()
		testenv.Eventually(t, 10*time.Second, func() error {
			var n int
			if err := setup.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", writerAppName).Scan(&n); err != nil {
				return err
			}
			if n != 1 {
				return fmt.Errorf("%d writers wait on a lock, want 1", n)
			}
			return nil
		})
		// Hold the lock until the watch has seen the writer blocked for
		// want, or, when it must see nothing, has looked polls more times.
		_, from := lw.seen()
		testenv.Eventually(t, 30*time.Second, func() error {
			d, n := lw.seen()
			if want > 0 && d < want {
				return fmt.Errorf("the watch saw the writer blocked %v, holding until %v", d, want)
			}
			if want == 0 && n < from+polls {
				return fmt.Errorf("the watch looked %d times while the writer waited, holding until %d", n-from, polls)
			}
			return nil
		})
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-inserted; err != nil {
			t.Fatal(err)
		}
		d, by, err := lw.end()
		if err != nil {
			t.Fatal(err)
		}
		return d, by
	}
	if d, by := holds(relayAppName, time.Second); d < time.Second || !strings.Contains(by, "LOCK TABLE t") {
		t.Errorf("a writer held by the relay's lock until the watch saw 1s: the watch saw %v (%q), want at least 1s and the relay's statement", d, by)
	}
	if d, by := holds("someone-else", 0); d != 0 {
		t.Errorf("a writer held by another session's lock counted as the relay's: %v (%q)", d, by)
	}
}
