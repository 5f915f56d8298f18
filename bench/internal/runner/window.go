package runner

// Measurement windows: waiting for quiet, sampling Postgres and the machine, waiting for children.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/bench/internal/child"
	"github.com/cdc-relay/cdc-relay/bench/internal/hoststat"
	"github.com/cdc-relay/cdc-relay/bench/internal/pgstat"
	"github.com/cdc-relay/cdc-relay/bench/internal/results"
)

// drainLines returns the stdout lines of an exited child not read yet.
func drainLines(p *child.Process) []string {
	<-p.Done()
	var out []string
	for {
		select {
		case line := <-p.Lines():
			out = append(out, line)
		default:
			return out
		}
	}
}

// quietShare is the share of the machine's CPU that processes outside the
// benchmark may use for a measurement to start without waiting.
const quietShare = 0.10

// waitForQuietMachine samples, one second at a time, how much CPU processes
// outside the benchmark use, until that is below quietShare or
// Config.QuietWait has passed. It says so when it waits or gives up.
func (b *bench) waitForQuietMachine(ctx context.Context) error {
	if b.cfg.QuietWait <= 0 {
		return nil
	}
	deadline := time.Now().Add(b.cfg.QuietWait)
	said := false
	for {
		h0, err := hoststat.Take()
		if err != nil {
			return err
		}
		p0, err := b.cpu.Snapshot()
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
		h1, err := hoststat.Take()
		if err != nil {
			return err
		}
		p1, err := b.cpu.Snapshot()
		if err != nil {
			return err
		}
		hd := h1.Sub(h0)
		share := hd.Foreign(0, p1.Sub(p0)).Seconds() / hd.Capacity().Seconds()
		switch {
		case share < quietShare:
			return nil
		case time.Now().After(deadline):
			b.say("  other processes still use %.0f%% of the CPUs after %s; measuring anyway", 100*share, b.cfg.QuietWait)
			return nil
		case !said:
			said = true
			b.say("  other processes use %.0f%% of the CPUs; waiting up to %s for them to calm down", 100*share, b.cfg.QuietWait)
		}
	}
}

// window measures one drain: Postgres (CPU, WAL) and the machine.
type window struct {
	pg   *pgstat.Window
	host hoststat.Snapshot
}

// beginWindow waits until the database has no client sessions left from an
// earlier phase, then starts measuring.
func (b *bench) beginWindow(ctx context.Context, url string) (*window, error) {
	if err := waitQuiet(ctx, url); err != nil {
		return nil, err
	}
	if err := b.waitForQuietMachine(ctx); err != nil {
		return nil, err
	}
	pw, err := pgstat.Begin(ctx, b.cpu, url)
	if err != nil {
		return nil, err
	}
	host, err := hoststat.Take()
	if err != nil {
		pw.Close()
		return nil, err
	}
	return &window{pg: pw, host: host}, nil
}

// close releases the window without measuring (after an error).
func (w *window) close() { w.pg.Close() }

// endWindow waits until the measured client's sessions have ended (so their
// processes were reaped into the postmaster's counters) and stores what
// Postgres and the machine spent into d; child is the measured process's
// usage.
func (b *bench) endWindow(ctx context.Context, w *window, url string, child child.Usage, d *results.Drain) error {
	if err := waitQuiet(ctx, url); err != nil {
		return err
	}
	host, err := hoststat.Take()
	if err != nil {
		return err
	}
	u, err := w.pg.End(ctx)
	if err != nil {
		return err
	}
	hd := host.Sub(w.host)
	d.PGCPUSeconds, d.WALBytes = u.CPU.Seconds(), u.WALBytes
	d.CPUSeconds, d.PeakRSSBytes = child.CPU().Seconds(), child.MaxRSS
	d.WindowSeconds = hd.Wall.Seconds()
	d.BenchCPUSeconds = hd.Self.Seconds()
	foreign := hd.Foreign(child.CPU(), u.CPU)
	d.ForeignCPUSeconds = foreign.Seconds()
	d.ForeignShare = foreign.Seconds() / hd.Capacity().Seconds()
	d.CPUWaitShare = hd.WaitShare()
	return nil
}

// waitQuiet waits until no client or walsender session but the caller's is
// connected to the database of url, and a moment more for the postmaster to
// reap the exited processes.
func waitQuiet(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect to check sessions: %w", err)
	}
	defer conn.Close(context.Background())
	deadline := time.Now().Add(15 * time.Second)
	for {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()
			  AND backend_type IN ('client backend', 'walsender')
			  AND application_name <> $1`, pgstat.ApplicationName).Scan(&n)
		if err != nil {
			return fmt.Errorf("check sessions: %w", err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("check sessions: %d sessions still connected after 15s", n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(200 * time.Millisecond):
	}
	return nil
}

// waitDone waits for a child's DoneLine and returns when it arrived.
func waitDone(ctx context.Context, p *child.Process, timeout time.Duration) (time.Time, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case line := <-p.Lines():
			if strings.HasPrefix(line, DoneLine) {
				return time.Now(), nil
			}
		case <-p.Done():
			// The line may have been queued just before the exit.
			for {
				select {
				case line := <-p.Lines():
					if strings.HasPrefix(line, DoneLine) {
						return time.Now(), nil
					}
					continue
				default:
				}
				break
			}
			if err := p.ExitError(); err != nil {
				return time.Time{}, err
			}
			return time.Time{}, fmt.Errorf("child exited before finishing%s", stderrSuffix(p.StderrTail()))
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-t.C:
			return time.Time{}, fmt.Errorf("child not done within %s%s", timeout, stderrSuffix(p.StderrTail()))
		}
	}
}
