// Package relayproc runs a built binary — usually cdc-relay — as a child
// process, again and again with the same arguments: start, wait for
// readiness (/readyz or a log line), stop cleanly with SIGTERM or kill with
// SIGKILL, restart, and report exit codes. The output of every run goes to
// one bounded log. It is the one process harness of the end-to-end tests
// (cmd/cdc-relay, examples/rewards) and of the chaos and bench tools, which
// are programs, not tests: this package does not import testing (relaytest
// binds a Process to a *testing.T).
package relayproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// Options describe the child process.
type Options struct {
	// Name names the process in errors and log markers ("cdc-relay").
	Name string
	// Path is the executable.
	Path string
	// Args are the arguments of every start, without the program name.
	Args []string
	// Env is the environment; nil is CleanEnv().
	Env []string
	// Dir is the working directory; "" is the current one.
	Dir string
	// AddMetricsAddr makes every start pick a free local port and append
	// --metrics-addr 127.0.0.1:PORT to Args, so that a restart never waits
	// for the previous run's port. Without it MetricsAddr, when set, is the
	// address Args (or a file they name) already give.
	AddMetricsAddr bool
	MetricsAddr    string
	// Output, when set, also receives everything the process writes.
	Output io.Writer
	// Stdout, when set, receives the process's stdout instead of the log and
	// Output (for a child whose stdout is data, not log lines).
	Stdout io.Writer
	// LogLimit is how many bytes of output the log keeps (the newest); 0 is
	// DefaultLogLimit.
	LogLimit int
	// SysProcAttr, when set, is used for every start (e.g. Setpgid and
	// Pdeathsig, so that the child dies with a program that does not stop it).
	SysProcAttr *syscall.SysProcAttr
}

// DefaultLogLimit is the log's default size: every line of a test's runs,
// and bounded for a long chaos run.
const DefaultLogLimit = 16 << 20

// Process is a child process that can be started again after it exited. Its
// methods are safe for concurrent use.
type Process struct {
	opts Options
	log  *Log

	mu      sync.Mutex
	args    []string
	env     []string
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd has exited
	state   *os.ProcessState
	metrics string // host:port of the current run's metrics server
	runs    int
	started time.Time
}

// New returns a Process for opts; it does not start it.
func New(opts Options) *Process {
	if opts.Name == "" {
		opts.Name = "cdc-relay"
	}
	env := opts.Env
	if env == nil {
		env = CleanEnv()
	}
	return &Process{
		opts:    opts,
		log:     NewLog(opts.LogLimit),
		args:    append([]string(nil), opts.Args...),
		env:     append([]string(nil), env...),
		metrics: opts.MetricsAddr,
	}
}

// CleanEnv is this process's environment without CDC_RELAY_* variables, so
// that a developer's settings cannot leak into the relay's configuration.
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CDC_RELAY_") {
			env = append(env, kv)
		}
	}
	return env
}

// Name returns the process's name.
func (p *Process) Name() string { return p.opts.Name }

// SetArgs sets the arguments of the next starts.
func (p *Process) SetArgs(args []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.args = append([]string(nil), args...)
}

// Env returns a copy of the environment of the next starts.
func (p *Process) Env() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.env...)
}

// SetEnv sets the environment of the next starts.
func (p *Process) SetEnv(env []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.env = append([]string(nil), env...)
}

// Start starts the process. The previous run must have exited.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("start %s: already running", p.opts.Name)
		}
	}
	args := append([]string(nil), p.args...)
	if p.opts.AddMetricsAddr {
		port, err := sandbox.FreePort() // below the ephemeral range: see there
		if err != nil {
			return fmt.Errorf("start %s: %w", p.opts.Name, err)
		}
		p.metrics = "127.0.0.1:" + strconv.Itoa(port)
		args = append(args, "--metrics-addr", p.metrics)
	}
	p.runs++
	fmt.Fprintf(p.log, "----- %s run %d: %s -----\n", p.opts.Name, p.runs, time.Now().Format(time.TimeOnly+".000"))
	cmd := exec.Command(p.opts.Path, args...)
	cmd.Env = p.env
	cmd.Dir = p.opts.Dir
	cmd.SysProcAttr = p.opts.SysProcAttr
	var out io.Writer = p.log
	if p.opts.Output != nil {
		out = io.MultiWriter(p.log, p.opts.Output)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if p.opts.Stdout != nil {
		cmd.Stdout = p.opts.Stdout
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.opts.Name, err)
	}
	p.started = time.Now()
	done := make(chan struct{})
	p.cmd, p.done, p.state = cmd, done, nil
	go func() {
		_ = cmd.Wait() // the exit status is read from ProcessState
		p.mu.Lock()
		p.state = cmd.ProcessState
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Restart kills the process if it runs and starts it again.
func (p *Process) Restart() error {
	p.Kill()
	return p.Start()
}

func (p *Process) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.done
}

// Running reports whether the last started process is still running.
func (p *Process) Running() bool {
	_, done := p.current()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Done returns a channel closed when the last started process has exited
// (nil before the first start).
func (p *Process) Done() <-chan struct{} {
	_, done := p.current()
	return done
}

// PID returns the last started process's id, or 0 before the first start.
func (p *Process) PID() int {
	cmd, _ := p.current()
	if cmd == nil {
		return 0
	}
	return cmd.Process.Pid
}

// StartedAt returns when the last run was started.
func (p *Process) StartedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started
}

// Runs returns how many times the process was started.
func (p *Process) Runs() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runs
}

// ExitCode returns the last run's exit code (-1 for a signal), or -2 while
// it runs or before the first run.
func (p *Process) ExitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == nil {
		return -2
	}
	return p.state.ExitCode()
}

// ProcessState returns the last run's state once it has exited (its CPU
// times, its exit status), or nil.
func (p *Process) ProcessState() *os.ProcessState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// Wait waits up to timeout for the process to exit and returns its exit code
// (-1 for a signal) and whether it exited in time. Before the first start it
// returns -2, true.
func (p *Process) Wait(timeout time.Duration) (int, bool) {
	_, done := p.current()
	if done == nil {
		return -2, true
	}
	select {
	case <-done:
	default:
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			return 0, false
		}
	}
	return p.ExitCode(), true
}

// Signal sends sig to the running process.
func (p *Process) Signal(sig os.Signal) error {
	cmd, _ := p.current()
	if cmd == nil {
		return fmt.Errorf("signal %s: never started", p.opts.Name)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s with %v: %w", p.opts.Name, sig, err)
	}
	return nil
}

// Kill SIGKILLs the running process and waits until it was reaped. It
// reports whether there was a running process to kill.
func (p *Process) Kill() bool {
	cmd, done := p.current()
	if cmd == nil || !p.Running() {
		return false
	}
	_ = cmd.Process.Signal(syscall.SIGKILL) // fails only if it exited meanwhile
	<-done
	fmt.Fprintf(p.log, "----- %s run %d: SIGKILL at %s -----\n", p.opts.Name, p.Runs(), time.Now().Format(time.TimeOnly+".000"))
	return true
}

// Stop sends SIGTERM and waits up to timeout for the exit, which must be
// code 0. A process that does not exit in time is killed.
func (p *Process) Stop(timeout time.Duration) error {
	if !p.Running() {
		return fmt.Errorf("stop %s: not running (last exit code %d)", p.opts.Name, p.ExitCode())
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop %s: %w", p.opts.Name, err)
	}
	if _, ok := p.Wait(timeout); !ok {
		p.Kill()
		return fmt.Errorf("stop %s: no exit within %v of SIGTERM (killed)", p.opts.Name, timeout)
	}
	if code := p.ExitCode(); code != 0 {
		return fmt.Errorf("stop %s: exit code %d after SIGTERM, want 0", p.opts.Name, code)
	}
	return nil
}

// MetricsAddr returns host:port of the current run's metrics server ("" when
// unknown).
func (p *Process) MetricsAddr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.metrics
}

var httpClient = &http.Client{Timeout: time.Second}

// Readyz returns the status code of GET /readyz, or 0 when it does not answer.
func (p *Process) Readyz(ctx context.Context) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.MetricsAddr()+"/readyz", nil)
	if err != nil {
		return 0
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// pollInterval is how often WaitReady and WaitLog look again.
const pollInterval = 50 * time.Millisecond

// WaitReady waits until /readyz answers 200; it fails when the process exits
// first or timeout passes.
func (p *Process) WaitReady(ctx context.Context, timeout time.Duration) error {
	return p.poll(ctx, timeout, func() error {
		if code := p.Readyz(ctx); code != http.StatusOK {
			return fmt.Errorf("%s not ready (last /readyz: %d)", p.opts.Name, code)
		}
		return nil
	})
}

// WaitLog waits until a line of output contains substr (in its message, for
// a JSON log line) and returns the line; it fails when the process exits
// first or timeout passes.
func (p *Process) WaitLog(ctx context.Context, substr string, timeout time.Duration) (string, error) {
	var line string
	err := p.poll(ctx, timeout, func() error {
		var ok bool
		if line, ok = p.FindLog(substr); !ok {
			return fmt.Errorf("no line of %s with %q yet", p.opts.Name, substr)
		}
		return nil
	})
	return line, err
}

// poll calls cond until it returns nil, the process exits or timeout passes.
func (p *Process) poll(ctx context.Context, timeout time.Duration, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if !p.Running() {
			if err := cond(); err == nil { // its last words
				return nil
			}
			return fmt.Errorf("%s exited with code %d: %w", p.opts.Name, p.ExitCode(), err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %v: %w", timeout, err)
		case <-time.After(pollInterval):
		}
	}
}

// Scrape returns the current run's metrics: sample (name with labels, as
// exposed) to value.
func (p *Process) Scrape(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.MetricsAddr()+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s metrics: %w", p.opts.Name, err)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s metrics: %w", p.opts.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s metrics: status %s", p.opts.Name, resp.Status)
	}
	samples, err := ParseMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s metrics: %w", p.opts.Name, err)
	}
	out := make(map[string]float64, len(samples))
	for _, s := range samples {
		out[s.Key()] = s.Value
	}
	return out, nil
}

// Logs returns the output of all runs the log still holds.
func (p *Process) Logs() string { return p.log.String() }

// Output returns what the process wrote in all runs the log still holds,
// without the harness's marker lines (start, SIGKILL, dropped bytes).
func (p *Process) Output() string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(p.log.String(), "\n") {
		if !isMarker(line) {
			b.WriteString(line)
		}
	}
	return b.String()
}

// isMarker reports whether line is a marker the harness wrote into the log.
func isMarker(line string) bool {
	return strings.HasPrefix(line, "----- ") && strings.HasSuffix(strings.TrimSuffix(line, "\n"), " -----")
}

// LogRecords returns the JSON log records of all runs; other lines (run
// markers, plain-text errors) are skipped.
func (p *Process) LogRecords() []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(p.log.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// FindLog returns the first line of output containing substr — in its
// message, for a JSON log line.
func (p *Process) FindLog(substr string) (string, bool) {
	for _, l := range strings.Split(p.log.String(), "\n") {
		text := l
		var rec struct{ Message string }
		if json.Unmarshal([]byte(l), &rec) == nil {
			text = rec.Message
		}
		if strings.Contains(text, substr) {
			return l, true
		}
	}
	return "", false
}

// HasLog reports whether a JSON log record's message contains substr.
func (p *Process) HasLog(substr string) bool {
	for _, m := range p.LogRecords() {
		if msg, _ := m["message"].(string); strings.Contains(msg, substr) {
			return true
		}
	}
	return false
}

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// PeakRSS returns a running process's peak resident set size (VmHWM) in
// bytes.
func PeakRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("read peak RSS: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("read peak RSS: parse %q", line)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("read peak RSS: %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("read peak RSS: no VmHWM in /proc/<pid>/status")
}
