package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
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

// relayProc runs the cdc-relay binary as a child process, possibly several
// times in a row with the same arguments, collecting the output of every run
// in one log. Its methods are safe for concurrent use.
type relayProc struct {
	bin  string
	args []string
	env  []string
	logs sandbox.Buffer

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd has exited
	state   *os.ProcessState
	metrics string // host:port of the current run's metrics server
	runs    int
}

func newRelayProc(bin string, args []string) *relayProc {
	return &relayProc{bin: bin, args: args, env: cleanEnv()}
}

// cleanEnv is our environment without CDC_RELAY_* variables, so a developer's
// settings cannot leak into the relay's configuration.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CDC_RELAY_") {
			env = append(env, kv)
		}
	}
	return env
}

// start starts the binary with a fresh metrics port. The previous run must
// have exited.
func (r *relayProc) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		select {
		case <-r.done:
		default:
			return errors.New("start relay: already running")
		}
	}
	port, err := sandbox.FreePort()
	if err != nil {
		return fmt.Errorf("start relay: %w", err)
	}
	r.metrics = "127.0.0.1:" + strconv.Itoa(port)
	r.runs++
	fmt.Fprintf(&r.logs, "----- run %d: %s -----\n", r.runs, time.Now().Format(time.TimeOnly+".000"))
	cmd := exec.Command(r.bin, append(append([]string(nil), r.args...), "--metrics-addr", r.metrics)...)
	cmd.Env = r.env
	cmd.Stdout = &r.logs
	cmd.Stderr = &r.logs
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start relay: %w", err)
	}
	done := make(chan struct{})
	r.cmd, r.done, r.state = cmd, done, nil
	go func() {
		_ = cmd.Wait() // the exit status is read from ProcessState
		r.mu.Lock()
		r.state = cmd.ProcessState
		r.mu.Unlock()
		close(done)
	}()
	return nil
}

func (r *relayProc) current() (*exec.Cmd, chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd, r.done
}

// running reports whether the last started process is still running.
func (r *relayProc) running() bool {
	_, done := r.current()
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

// exitCode returns the last run's exit code (-1 for a signal), or -2 while it
// runs or before the first run.
func (r *relayProc) exitCode() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == nil {
		return -2
	}
	return r.state.ExitCode()
}

// kill SIGKILLs the running process and waits for it to be gone. It reports
// whether there was a running process to kill.
func (r *relayProc) kill() bool {
	cmd, done := r.current()
	if cmd == nil || !r.running() {
		return false
	}
	_ = cmd.Process.Signal(syscall.SIGKILL) // fails only if it exited meanwhile
	<-done
	fmt.Fprintf(&r.logs, "----- run %d: SIGKILL at %s -----\n", r.runs, time.Now().Format(time.TimeOnly+".000"))
	return true
}

// stop sends SIGTERM and waits up to timeout for the exit, which must be 0.
// A process that does not exit in time is killed.
func (r *relayProc) stop(timeout time.Duration) error {
	cmd, done := r.current()
	if cmd == nil || !r.running() {
		return fmt.Errorf("stop relay: not running (last exit code %d)", r.exitCode())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop relay: %w", err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		r.kill()
		return fmt.Errorf("stop relay: no exit within %v of SIGTERM (killed)", timeout)
	}
	if code := r.exitCode(); code != 0 {
		return fmt.Errorf("stop relay: exit code %d after SIGTERM, want 0", code)
	}
	return nil
}

var httpClient = &http.Client{Timeout: time.Second}

func (r *relayProc) metricsAddr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.metrics
}

// ready reports whether /readyz answers 200.
func (r *relayProc) ready(ctx context.Context) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.metricsAddr()+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitReady waits until /readyz answers 200; it fails when the process exits
// first or timeout passes.
func (r *relayProc) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if r.ready(ctx) {
			return nil
		}
		if !r.running() {
			return fmt.Errorf("relay exited with code %d before it was ready", r.exitCode())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("relay not ready within %v: %w", timeout, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// scrape returns the current run's metrics: sample (name with labels, as
// exposed) to value.
func (r *relayProc) scrape(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.metricsAddr()+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("scrape relay metrics: %w", err)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape relay metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape relay metrics: status %s", resp.Status)
	}
	out := make(map[string]float64)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scrape relay metrics: %w", err)
	}
	return out, nil
}

// metric returns one sample of the current run's metrics, or 0 when it cannot
// be read.
func (r *relayProc) metric(ctx context.Context, sample string) float64 {
	m, err := r.scrape(ctx)
	if err != nil {
		return 0
	}
	return m[sample]
}

// output returns the output of all runs so far.
func (r *relayProc) output() string { return r.logs.String() }
