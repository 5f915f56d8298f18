// Package relaytest binds a relayproc.Process to a test: every method fails
// the test instead of returning an error, and the test's cleanup kills a
// running process and prints its output when the test failed (all of it, or
// always with CDC_RELAY_E2E_LOGS set).
package relaytest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
)

// EnvLogs, when set to anything, prints every process's output at the end of
// each test, passed or failed.
const EnvLogs = "CDC_RELAY_E2E_LOGS"

// Proc is a relayproc.Process bound to a test.
type Proc struct {
	t testing.TB
	// P is the process; use it where an error is expected.
	P *relayproc.Process
}

// New returns a Proc for opts, not started. When t ends, a running process
// is killed and, if t failed, its output is logged.
func New(t testing.TB, opts relayproc.Options) *Proc {
	p := &Proc{t: t, P: relayproc.New(opts)}
	t.Cleanup(func() {
		p.P.Kill()
		if t.Failed() || os.Getenv(EnvLogs) != "" {
			t.Logf("%s output (%d runs):\n%s", p.P.Name(), p.P.Runs(), p.P.Logs())
		}
	})
	return p
}

// Start starts the process; the previous run must have exited.
func (p *Proc) Start() {
	p.t.Helper()
	if err := p.P.Start(); err != nil {
		p.t.Fatal(err)
	}
}

// Restart kills the process if it runs and starts it again.
func (p *Proc) Restart() {
	p.t.Helper()
	if err := p.P.Restart(); err != nil {
		p.t.Fatal(err)
	}
}

// Kill SIGKILLs the running process, if any, and waits until it was reaped.
func (p *Proc) Kill() { p.P.Kill() }

// Signal sends sig to the running process.
func (p *Proc) Signal(sig os.Signal) {
	p.t.Helper()
	if err := p.P.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
}

// Stop sends SIGTERM and requires exit code 0 within timeout.
func (p *Proc) Stop(timeout time.Duration) {
	p.t.Helper()
	if err := p.P.Stop(timeout); err != nil {
		p.t.Fatalf("%v; last lines:\n%s", err, relayproc.Tail(p.P.Logs(), 30))
	}
}

// Wait waits up to timeout for the process to exit and returns its exit code
// (-1 for a signal) and whether it exited in time.
func (p *Proc) Wait(timeout time.Duration) (int, bool) { return p.P.Wait(timeout) }

// Exited reports whether the last started process has exited (true before
// the first start).
func (p *Proc) Exited() bool { return !p.P.Running() }

// WaitReady waits until /readyz answers 200; it fails the test when the
// process exits first or timeout passes.
func (p *Proc) WaitReady(timeout time.Duration) {
	p.t.Helper()
	if err := p.P.WaitReady(context.Background(), timeout); err != nil {
		p.t.Fatal(err)
	}
}

// WaitLog waits up to timeout for a line of output containing substr (in
// its message, for a JSON line) and returns it.
func (p *Proc) WaitLog(substr string, timeout time.Duration) string {
	p.t.Helper()
	line, err := p.P.WaitLog(context.Background(), substr, timeout)
	if err != nil {
		p.t.Fatal(err)
	}
	return line
}

// Readyz returns the status code of GET /readyz, or 0 when it does not answer.
func (p *Proc) Readyz() int { return p.P.Readyz(context.Background()) }

// Metric returns one sample (name{labels}, as exposed) of the running
// process's /metrics; it fails the test when the sample is missing.
func (p *Proc) Metric(sample string) float64 {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := p.P.Scrape(ctx)
	if err != nil {
		p.t.Fatal(err)
	}
	v, ok := m[sample]
	if !ok {
		p.t.Fatalf("/metrics has no %s", sample)
	}
	return v
}

// Logs returns the output of all runs.
func (p *Proc) Logs() string { return p.P.Logs() }

// Output returns what the process wrote in all runs, without the harness's
// marker lines.
func (p *Proc) Output() string { return p.P.Output() }

// LogRecords returns the JSON log records of all runs.
func (p *Proc) LogRecords() []map[string]any { return p.P.LogRecords() }

// HasLog reports whether a JSON log record's message contains substr.
func (p *Proc) HasLog(substr string) bool { return p.P.HasLog(substr) }

// PID returns the last started process's id.
func (p *Proc) PID() int { return p.P.PID() }

// Runs returns how many times the process was started.
func (p *Proc) Runs() int { return p.P.Runs() }
