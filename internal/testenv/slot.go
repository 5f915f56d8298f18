package testenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// WaitStatusUpdates waits until the client streaming slot in database of p has
// sent n more standby status updates, as Postgres sees them: the reply_time
// of the slot's walsender in pg_stat_replication moved on n times since the
// call (the first move may be an update already on its way). It fails t
// when that takes longer than timeout.
//
// A relay reports the position it confirms in every status update. Tests use
// this to show that the relay went on well past the moment it would have
// confirmed something it must not (n chances to do it), instead of waiting a
// fixed time and hoping the relay was scheduled meanwhile.
func WaitStatusUpdates(t testing.TB, p *sandbox.Postgres, database, slot string, n int, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL(database))
	if err != nil {
		t.Fatalf("connect to database %q: %v", database, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// The zero time when the slot is not streamed or no update came yet.
	replyTime := func() (time.Time, error) {
		var at *time.Time
		err := conn.QueryRow(ctx, `SELECT r.reply_time FROM pg_replication_slots s
			JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1`, slot).Scan(&at)
		if errors.Is(err, pgx.ErrNoRows) || at == nil {
			return time.Time{}, nil
		}
		if err != nil {
			return time.Time{}, fmt.Errorf("read reply_time of slot %q: %w", slot, err)
		}
		return *at, nil
	}
	last, err := replyTime()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	Eventually(t, timeout, func() error {
		at, err := replyTime()
		if err != nil {
			return err
		}
		if at.After(last) {
			seen++
			last = at
		}
		if seen < n {
			return fmt.Errorf("slot %q: %d of %d status updates (last at %s)", slot, seen, n, last.Format(time.TimeOnly+".000000"))
		}
		return nil
	})
}
