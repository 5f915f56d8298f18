// Package child runs the benchmark's helper processes (the relay binary, and
// the benchmark itself re-executed as the limit reader and the poller) and
// reports what the kernel accounted to them: user and system CPU time from
// wait4's rusage, and peak resident memory (VmHWM). Starting, stopping and
// reaping are the relay's process harness, internal/relayproc; this package
// adds the measurements and the child's stdout as lines.
package child

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
)

// stderrTailLines is how many lines of a child's stderr are kept for errors,
// of the last stderrKeep bytes.
const (
	stderrTailLines = 40
	stderrKeep      = 64 << 10
)

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
	name  string
	proc  *relayproc.Process
	lines chan string
	done  <-chan struct{}
	hwm   atomic.Int64
}

// Start starts the child in its own process group, so a Ctrl-C at the terminal
// reaches only the benchmark, which then stops its children in order. The
// kernel kills the child if the benchmark dies without doing so.
func Start(opts Options) (*Process, error) {
	p := &Process{name: opts.Name, lines: make(chan string, 64)}
	p.proc = relayproc.New(relayproc.Options{
		Name:        opts.Name,
		Path:        opts.Path,
		Args:        opts.Args,
		Dir:         opts.Dir,
		Env:         os.Environ(),
		Output:      opts.Stderr, // stdout goes to Stdout, so only stderr
		Stdout:      &lineWriter{lines: p.lines},
		LogLimit:    stderrKeep,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	})
	if err := p.proc.Start(); err != nil {
		return nil, err
	}
	p.done = p.proc.Done()
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
	hwm, err := relayproc.PeakRSS(p.PID())
	if err != nil {
		return // exited
	}
	for {
		cur := p.hwm.Load()
		if hwm <= cur || p.hwm.CompareAndSwap(cur, hwm) {
			return
		}
	}
}

// Started returns when the process was started.
func (p *Process) Started() time.Time { return p.proc.StartedAt() }

// PID returns the process id.
func (p *Process) PID() int { return p.proc.PID() }

// Lines delivers the child's stdout, one line at a time.
func (p *Process) Lines() <-chan string { return p.lines }

// Done is closed once the child has exited and was reaped, and every line of
// its stdout was offered on Lines.
func (p *Process) Done() <-chan struct{} { return p.done }

// StderrTail returns the last lines the child wrote to stderr.
func (p *Process) StderrTail() string {
	return relayproc.Tail(p.proc.Output(), stderrTailLines)
}

// ExitError returns, after Done, nil for exit status 0 and otherwise an error
// naming the child and quoting the tail of its stderr.
func (p *Process) ExitError() error {
	st := p.proc.ProcessState()
	if st == nil || st.Success() {
		return nil
	}
	return fmt.Errorf("%s exited: %s%s", p.name, st, p.quoteStderr())
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
	st := p.proc.ProcessState()
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
	if err := p.proc.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return Usage{}, fmt.Errorf("stop %s: %w", p.name, err)
	}
	if _, exited := p.proc.Wait(grace); exited {
		return p.Usage(), p.ExitError()
	}
	p.proc.Kill()
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
	p.proc.Kill()
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

// lineWriter is an io.Writer that offers every complete line written to it
// on lines, dropping it when nobody listens (children print only a line or
// two). exec writes to it from one goroutine.
type lineWriter struct {
	mu      sync.Mutex
	lines   chan<- string
	partial []byte
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.partial = append(w.partial, b...)
	for {
		i := strings.IndexByte(string(w.partial), '\n')
		if i < 0 {
			break
		}
		select {
		case w.lines <- string(w.partial[:i]):
		default:
		}
		w.partial = w.partial[i+1:]
	}
	if len(w.partial) > 1<<20 { // a line longer than bufio.Scanner's old limit
		w.partial = w.partial[:0]
	}
	return len(b), nil
}
