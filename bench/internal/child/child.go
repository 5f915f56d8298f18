// Package child runs the benchmark's helper processes (the relay binary, the
// limit reader, the poller) and reports what the kernel accounted to them: user
// and system CPU time from wait4's rusage, and peak resident memory (VmHWM).
package child

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// stderrTailLines is how many lines of a child's stderr are kept for errors.
const stderrTailLines = 40

// Usage is what the kernel accounted to an exited child.
type Usage struct {
	User, System time.Duration
	// MaxRSS is the peak resident set size in bytes: the largest VmHWM seen in
	// /proc/<pid>/status, sampled every 100 ms and just before a stop. Not
	// ru_maxrss: Go starts children with vfork+exec, and Linux carries the
	// parent's peak RSS across that exec into the child's ru_maxrss.
	MaxRSS int64
}

// CPU returns user plus system time.
func (u Usage) CPU() time.Duration { return u.User + u.System }

// Options describe a child process.
type Options struct {
	Name string   // for messages, e.g. "relay"
	Path string   // executable
	Args []string // without the program name
	Dir  string   // working directory; "" is the current one
	// Stderr, when set, also receives everything the child writes to its
	// stderr (the last lines are kept for errors either way). It is written
	// from one goroutine at a time.
	Stderr io.Writer
}

// Process is a started child. Its stdout is delivered line by line on Lines;
// the last lines of its stderr are kept for error messages.
type Process struct {
	name    string
	cmd     *exec.Cmd
	started time.Time
	stderr  *tailBuffer
	lines   chan string
	done    chan struct{}
	waitErr error // valid once done is closed
	hwm     atomic.Int64
}

// Start starts the child in its own process group, so a Ctrl-C at the terminal
// reaches only the benchmark, which then stops its children in order. The
// kernel kills the child if the benchmark dies without doing so.
func Start(opts Options) (*Process, error) {
	cmd := exec.Command(opts.Path, opts.Args...)
	cmd.Dir = opts.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &Process{
		name:   opts.Name,
		cmd:    cmd,
		stderr: &tailBuffer{max: stderrTailLines},
		lines:  make(chan string, 64),
		done:   make(chan struct{}),
	}
	cmd.Stderr = p.stderr
	if opts.Stderr != nil {
		cmd.Stderr = io.MultiWriter(p.stderr, opts.Stderr)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", opts.Name, err)
	}
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", opts.Name, err)
	}
	go p.wait(stdout)
	go p.sampleRSS()
	return p, nil
}

// rssSampleInterval is how often the child's VmHWM is read.
const rssSampleInterval = 100 * time.Millisecond

// sampleRSS records the child's VmHWM until it exits.
func (p *Process) sampleRSS() {
	t := time.NewTicker(rssSampleInterval)
	defer t.Stop()
	for {
		p.readHWM()
		select {
		case <-p.done:
			return
		case <-t.C:
		}
	}
}

// readHWM reads VmHWM from /proc/<pid>/status and keeps the largest value.
func (p *Process) readHWM() {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status")
	if err != nil {
		return // exited
	}
	for _, line := range strings.Split(string(b), "\n") {
		v, ok := strings.CutPrefix(line, "VmHWM:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return
		}
		for {
			cur := p.hwm.Load()
			if kb*1024 <= cur || p.hwm.CompareAndSwap(cur, kb*1024) {
				return
			}
		}
	}
}

// wait reads stdout to its end, then reaps the child.
func (p *Process) wait(stdout io.Reader) {
	defer close(p.done)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		select {
		case p.lines <- sc.Text():
		default: // nobody listens; children print only a line or two
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	p.waitErr = p.cmd.Wait()
}

// Started returns when the process was started.
func (p *Process) Started() time.Time { return p.started }

// PID returns the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Lines delivers the child's stdout, one line at a time.
func (p *Process) Lines() <-chan string { return p.lines }

// Done is closed once the child has exited and was reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// StderrTail returns the last lines the child wrote to stderr.
func (p *Process) StderrTail() string { return p.stderr.String() }

// ExitError returns, after Done, nil for exit status 0 and otherwise an error
// naming the child and quoting the tail of its stderr.
func (p *Process) ExitError() error {
	if p.waitErr == nil {
		return nil
	}
	return fmt.Errorf("%s exited: %w%s", p.name, p.waitErr, p.quoteStderr())
}

func (p *Process) quoteStderr() string {
	tail := strings.TrimSpace(p.StderrTail())
	if tail == "" {
		return " (no stderr output)"
	}
	return "; last stderr lines:\n    " + strings.ReplaceAll(tail, "\n", "\n    ")
}

// Usage returns the child's CPU time and peak RSS; only valid after Done.
func (p *Process) Usage() Usage {
	st := p.cmd.ProcessState
	if st == nil {
		return Usage{}
	}
	return Usage{User: st.UserTime(), System: st.SystemTime(), MaxRSS: p.hwm.Load()}
}

// Stop sends SIGTERM, waits up to grace for the child to exit, then kills it.
// It returns the child's usage and its exit error (nil after a clean exit).
// Stopping an exited child only reports.
func (p *Process) Stop(grace time.Duration) (Usage, error) {
	select {
	case <-p.done:
		return p.Usage(), p.ExitError()
	default:
	}
	p.readHWM()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return Usage{}, fmt.Errorf("stop %s: %w", p.name, err)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return p.Usage(), p.ExitError()
	case <-t.C:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return p.Usage(), fmt.Errorf("%s did not stop within %s of SIGTERM and was killed%s", p.name, grace, p.quoteStderr())
}

// Kill sends SIGKILL (kill -9) and waits until the child was reaped; it
// returns the child's usage. Killing an exited child only reports.
func (p *Process) Kill() (Usage, error) {
	select {
	case <-p.done:
		return p.Usage(), nil
	default:
	}
	p.readHWM()
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return Usage{}, fmt.Errorf("kill %s: %w", p.name, err)
	}
	<-p.done
	return p.Usage(), nil
}

// Wait waits up to timeout for the child to exit by itself, then stops it as
// Stop does. It returns the child's usage and its exit error.
func (p *Process) Wait(timeout, grace time.Duration) (Usage, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.Usage(), p.ExitError()
	case <-t.C:
		return p.Stop(grace)
	}
}

// tailBuffer is an io.Writer keeping the last max lines written to it.
type tailBuffer struct {
	mu      sync.Mutex
	max     int
	lines   []string
	partial string
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.partial + string(b)
	parts := strings.Split(s, "\n")
	t.partial = parts[len(parts)-1]
	t.lines = append(t.lines, parts[:len(parts)-1]...)
	if over := len(t.lines) - t.max; over > 0 {
		t.lines = append(t.lines[:0], t.lines[over:]...)
	}
	return len(b), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := strings.Join(t.lines, "\n")
	if t.partial != "" {
		if out != "" {
			out += "\n"
		}
		out += t.partial
	}
	return out
}
