package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// catchUpLine is what the relay logs when it starts catching up in batches.
const catchUpLine = "catching up in batches"

// drainTimeout bounds the wait for the slot to confirm a position before a
// table leaves the relay.
const drainTimeout = 30 * time.Second

// apply runs one step against the world.
func (r *schedRun) apply(ctx context.Context, s Step) error {
	switch s.Op {
	case "relay-kill", "relay-stop":
		if err := r.stopRelay(ctx, s.Mode); err != nil {
			return err
		}
		if r.plan.CatchUp {
			// A backlog over the threshold: the start catches up.
			if err := r.backlogBurst(ctx, r.currentStep()); err != nil {
				return err
			}
		}
		if err := sleep(ctx, s.Down); err != nil {
			return err
		}
		before := strings.Count(r.relay.Logs(), catchUpLine)
		if err := r.startRelay(ctx); err != nil {
			return err
		}
		if r.plan.CatchUp {
			r.note("step %d %s: caught up in batches %v", r.currentStep(), s.Op, strings.Count(r.relay.Logs(), catchUpLine) > before)
		}
		return nil
	case "table-join":
		if err := r.stopRelay(ctx, s.Mode); err != nil {
			return err
		}
		// Rows of outbox_b commit from now on: after the relay's last
		// checkpoint, before it adds the table to the publication.
		r.st.mu.Lock()
		r.st.bMember = true
		r.st.mu.Unlock()
		if err := sleep(ctx, s.Down); err != nil {
			return err
		}
		return r.startRelay(ctx)
	case "table-join-large":
		return r.joinLarge(ctx, s)
	case "table-leave":
		r.st.mu.Lock()
		r.st.bMember = false
		r.st.mu.Unlock()
		// Leave the supported way: once the relay relayed the table's rows.
		if err := r.drain(ctx); err != nil {
			return err
		}
		if err := r.stopRelay(ctx, "term"); err != nil {
			return err
		}
		return r.startRelay(ctx)
	case "partition-attach":
		return r.attach(ctx, s)
	case "partition-detach":
		return r.detach(ctx, s)
	case "partition-drop":
		return r.exec(ctx, "DROP TABLE public."+partitionName(s.Bucket))
	case "broker-restart":
		r.kafka.stop()
		serr := sleep(ctx, s.Down)
		if err := r.kafka.start(); err != nil {
			return err
		}
		if serr != nil {
			return serr
		}
		return r.relay.WaitReady(ctx, readyTimeout)
	case "broker-stops-reading":
		r.st.pad.Store(8 << 10)
		n := r.kafka.stopReading()
		err := sleep(ctx, s.Down)
		r.st.pad.Store(0)
		r.note("step broker-stops-reading: %d connections stuck", n)
		return err
	case "standby-lag":
		return r.standbyLag(ctx, s)
	case "replay":
		return r.replayBeside(ctx, r.currentStep())
	case "pg-restart":
		stopErr := r.env.pg.Stop(s.Mode)
		// Start even after a failed stop: the cluster is shared.
		if err := errors.Join(stopErr, r.env.pg.Start()); err != nil {
			return err
		}
		return r.relay.WaitReady(ctx, readyTimeout)
	}
	return fmt.Errorf("unknown operation %q", s.Op)
}

// currentStep is the step running (its number, from 1).
func (r *schedRun) currentStep() int {
	r.st.mu.RLock()
	defer r.st.mu.RUnlock()
	return r.st.step
}

// joinLargeTimeout bounds how long the relay takes to join a large table
// and be ready again after the broker came back.
const joinLargeTimeout = 90 * time.Second

// joinLarge stops the relay, writes s.Rows rows into outbox_b at once while
// the writers write it too, and starts the relay with outbox_b in its
// --table list; once the relay says the table joins, the broker stops for
// s.Down, mid-join, and starts again on its data.
func (r *schedRun) joinLarge(ctx context.Context, s Step) error {
	if err := r.stopRelay(ctx, s.Mode); err != nil {
		return err
	}
	r.st.mu.Lock()
	r.st.bMember = true
	r.st.mu.Unlock()
	if err := r.writeLarge(ctx, s.Rows, r.currentStep()); err != nil {
		return err
	}
	const joins = logJoinBegins
	before := strings.Count(r.relay.Logs(), joins)
	r.relay.SetArgs(r.relayArgs())
	if err := r.relay.Start(); err != nil {
		return err
	}
	began := time.Now()
	wctx, cancel := context.WithTimeout(ctx, joinLargeTimeout)
	defer cancel()
	for strings.Count(r.relay.Logs(), joins) == before {
		if !r.relay.Running() {
			return fmt.Errorf("the relay exited with code %d before outbox_b joined: %s", r.relay.ExitCode(), lastLines(r.relay.Logs(), 3))
		}
		if err := sleep(wctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("the relay did not say %q: %w: %s", joins, err, lastLines(r.relay.Logs(), 3))
		}
	}
	r.kafka.stop()
	serr := sleep(ctx, s.Down)
	if err := r.kafka.start(); err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	if err := r.relay.WaitReady(ctx, joinLargeTimeout); err != nil {
		return fmt.Errorf("%w: %s", err, lastLines(r.relay.Logs(), 3))
	}
	r.note("step %d table-join-large: the broker stopped %v after the join began; the relay ready %v after its start",
		r.currentStep(), s.Down, time.Since(began).Round(10*time.Millisecond))
	return nil
}

// exec runs statements in the schedule's database, in order.
func (r *schedRun) exec(ctx context.Context, stmts ...string) error {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	for _, sql := range stmts {
		if err := r.env.pg.Exec(ctx, r.db, sql); err != nil {
			return err
		}
	}
	return nil
}

// attach creates the step's partition as a table of its own, adds it to a
// listed publication and attaches it; the writers then write to it.
func (r *schedRun) attach(ctx context.Context, s Step) error {
	name := "public." + partitionName(s.Bucket)
	cols := `id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL, event_type text NOT NULL,
		payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), bucket int NOT NULL`
	if s.Reorder {
		cols = `bucket int NOT NULL, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
			event_type text NOT NULL, aggregate_id text NOT NULL, aggregate_type text NOT NULL, id uuid NOT NULL`
	}
	stmts := []string{fmt.Sprintf("CREATE TABLE %s (%s, PRIMARY KEY (id, bucket))", name, cols)}
	if r.plan.Layout == "listed" {
		stmts = append(stmts, "ALTER PUBLICATION cdc_relay_outbox ADD TABLE "+name)
	}
	stmts = append(stmts, fmt.Sprintf("ALTER TABLE public.%s ATTACH PARTITION %s FOR VALUES IN (%d)", tableP, name, s.Bucket))
	if err := r.exec(ctx, stmts...); err != nil {
		return err
	}
	r.st.mu.Lock()
	r.st.buckets = append(r.st.buckets, s.Bucket)
	r.st.mu.Unlock()
	return nil
}

// detach stops writing the step's partition and detaches it (with the
// relay down when lagging, so it reads the partition's last rows only after
// the detach), dropping it too when the step says so.
func (r *schedRun) detach(ctx context.Context, s Step) error {
	r.st.mu.Lock()
	r.st.buckets = slices.DeleteFunc(r.st.buckets, func(b int) bool { return b == s.Bucket })
	r.st.mu.Unlock()
	if s.Lagging {
		if err := r.stopRelay(ctx, "kill"); err != nil {
			return err
		}
	}
	name := "public." + partitionName(s.Bucket)
	stmts := []string{fmt.Sprintf("ALTER TABLE public.%s DETACH PARTITION %s", tableP, name)}
	if s.Drop {
		stmts = append(stmts, "DROP TABLE "+name)
	}
	if err := r.exec(ctx, stmts...); err != nil {
		return err
	}
	if !s.Lagging {
		return nil
	}
	if err := sleep(ctx, s.Down); err != nil {
		return err
	}
	return r.startRelay(ctx)
}

// drain waits until the slot confirmed the WAL written so far.
func (r *schedRun) drain(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	var target string
	if err := queryRow(ctx, r.url, "SELECT pg_current_wal_lsn()::text", &target); err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	conn, err := pgx.Connect(ctx, r.slotURL)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var done bool
		err := conn.QueryRow(ctx, `SELECT coalesce(confirmed_flush_lsn >= $2::pg_lsn, false) FROM pg_replication_slots WHERE slot_name = $1`,
			r.slot, target).Scan(&done)
		if err != nil {
			return fmt.Errorf("drain: read slot: %w", err)
		}
		if done {
			return nil
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("drain: the slot did not confirm %s within %v: %w", target, drainTimeout, err)
		}
	}
}

// queryRow scans one row of sql, run on a new connection to url, into dst.
func queryRow(ctx context.Context, url, sql string, dst ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, sql).Scan(dst...)
}

// standbyLag delays the standby's replay by s.Mode for s.Down: the slot
// there sees the primary's commits that much later.
func (r *schedRun) standbyLag(ctx context.Context, s Step) error {
	set := func(sql string) error {
		ctx, cancel := context.WithTimeout(ctx, setupTimeout)
		defer cancel()
		if err := r.standby.Exec(ctx, "postgres", sql); err != nil {
			return err
		}
		return r.standby.Exec(ctx, "postgres", "SELECT pg_reload_conf()")
	}
	if err := set(fmt.Sprintf("ALTER SYSTEM SET recovery_min_apply_delay = '%s'", s.Mode)); err != nil {
		return err
	}
	serr := sleep(ctx, s.Down)
	if err := set("ALTER SYSTEM RESET recovery_min_apply_delay"); err != nil {
		return err
	}
	return serr
}
