package chaos

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The application names the schedule's connections carry, so that a writer
// waiting on a lock can be told waiting on the relay.
const (
	relayAppName  = "cdc-relay"
	writerAppName = "chaos-writer"
)

// withAppName returns the Postgres URL u with application_name set to name.
func withAppName(u, name string) (string, error) {
	p, err := url.Parse(u)
	if err != nil {
		return "", fmt.Errorf("set application_name of %s: %w", u, err)
	}
	q := p.Query()
	q.Set("application_name", name)
	p.RawQuery = q.Encode()
	return p.String(), nil
}

// lockPoll is how often the lock watch looks.
const lockPoll = 50 * time.Millisecond

// lockWatch samples which writers wait on a lock a connection of the relay
// holds, for how long: the way the relay could make the application's
// INSERTs wait (a join's lock held across I/O, issue 42). A writer's
// transaction time alone cannot tell it from a machine too busy to run
// Postgres, which a seed must not fail on.
type lockWatch struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	// longest is the longest a writer's transaction was seen blocked by
	// the relay, from the first sample to the last plus one poll; by is
	// what the relay ran then.
	longest time.Duration
	by      string
	err     error
	polls   int // samples taken, for a test to know the watch looked
}

// blockedByRelay lists the writers' transactions waiting on a lock that a
// relay connection holds.
const blockedByRelay = `SELECT w.pid, w.xact_start, string_agg(DISTINCT left(b.query, 120), '; ')
FROM pg_stat_activity w
CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS bp(pid)
JOIN pg_stat_activity b ON b.pid = bp.pid
WHERE w.application_name = $1 AND b.application_name = $2 AND w.wait_event_type = 'Lock'
GROUP BY w.pid, w.xact_start`

// watchLocks samples the database at pgURL until stop is called; a failing
// sample (Postgres restarted by a step) is retried at the next poll.
func watchLocks(ctx context.Context, pgURL string) *lockWatch {
	lw := &lockWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(lw.done)
		type txn struct {
			pid int32
			at  time.Time
		}
		first := map[txn]time.Time{}
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				_ = conn.Close(context.WithoutCancel(ctx))
			}
		}()
		t := time.NewTicker(lockPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-lw.stop:
				return
			case <-t.C:
			}
			if conn == nil || conn.IsClosed() {
				c, err := pgx.Connect(ctx, pgURL)
				if err != nil {
					continue
				}
				conn = c
			}
			rows, err := conn.Query(ctx, blockedByRelay, writerAppName, relayAppName)
			if err != nil {
				_ = conn.Close(ctx)
				conn = nil
				continue
			}
			now := time.Now()
			for rows.Next() {
				var k txn
				var query string
				if err := rows.Scan(&k.pid, &k.at, &query); err != nil {
					lw.setErr(err)
					break
				}
				if _, ok := first[k]; !ok {
					first[k] = now
				}
				lw.saw(now.Sub(first[k])+lockPoll, query)
			}
			rows.Close()
			lw.mu.Lock()
			lw.polls++
			lw.mu.Unlock()
		}
	}()
	return lw
}

// seen returns the longest wait seen so far and how many samples were taken.
func (lw *lockWatch) seen() (time.Duration, int) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.longest, lw.polls
}

func (lw *lockWatch) saw(d time.Duration, query string) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if d > lw.longest {
		lw.longest, lw.by = d, query
	}
}

func (lw *lockWatch) setErr(err error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.err == nil {
		lw.err = fmt.Errorf("watch the writers' locks: %w", err)
	}
}

// end stops the watch and returns the longest a writer was blocked by the
// relay and by what.
func (lw *lockWatch) end() (time.Duration, string, error) {
	close(lw.stop)
	<-lw.done
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.longest, lw.by, lw.err
}
