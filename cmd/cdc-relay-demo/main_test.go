package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// syncBuffer is a bytes.Buffer the test reads while a process writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// readmeInsert returns the shell block of README.md's walkthrough that
// inserts a row: the ```sh block that runs psql after the demo started.
func readmeInsert(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i := strings.Index(readme, "## Insert a row, see the Kafka message")
	if i < 0 {
		t.Fatal(`README.md has no section "Insert a row, see the Kafka message"`)
	}
	for _, block := range strings.Split(readme[i:], "```sh\n")[1:] {
		block = block[:strings.Index(block, "```")]
		if strings.HasPrefix(block, "psql ") {
			return block
		}
	}
	t.Fatal("README.md's walkthrough has no ```sh block starting with psql")
	return ""
}

// TestReadmeWalkthrough does what README.md's walkthrough says, verbatim:
// `make demo DEMOFLAGS='-events 0'`, then, in another shell at the
// repository's root, its psql block; the row arrives as a kafka line. Then
// Ctrl-C (SIGINT to make's process group, as a terminal sends it) stops the
// demo cleanly: the demo exits 0, so make prints no "make: ***" error. The demo is
// given its URL file in a temporary directory (bin/demo-pg-url there), where
// the psql block runs, so a demo of the developer's own is left alone.
func TestReadmeWalkthrough(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("skip: no make on PATH")
	}
	if _, err := exec.LookPath("psql"); err != nil {
		t.Skip("skip: no psql on PATH (README's walkthrough runs psql)")
	}
	insert := readmeInsert(t)
	dir := t.TempDir()
	urlFile := filepath.Join(dir, "bin", "demo-pg-url")
	demo := exec.Command("make", "--no-print-directory", "demo", "DEMOFLAGS=-events 0 -url-file "+urlFile)
	demo.Dir = filepath.Join("..", "..")
	demo.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out syncBuffer
	demo.Stdout, demo.Stderr = &out, &out
	if err := demo.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := demo.Process.Pid
	var waitErr error
	done := make(chan struct{})
	go func() { waitErr = demo.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-done
	})
	waitFor := func(what string, timeout time.Duration, ok func(string) bool) {
		t.Helper()
		testenv.Eventually(t, timeout, func() error {
			select {
			case <-done:
				t.Fatalf("make demo exited (%v) before %s:\n%s", waitErr, what, out.String())
			default:
			}
			if !ok(out.String()) {
				return fmt.Errorf("%s; make demo printed:\n%s", what, out.String())
			}
			return nil
		})
	}
	waitFor("the demo waits for rows", 4*time.Minute, func(s string) bool { return strings.Contains(s, "Ctrl-C stops the demo") })

	sh := exec.Command("sh", "-c", insert)
	sh.Dir = dir
	if b, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("README's psql block, run in a second shell: %v\n%s\n%s", err, b, insert)
	}
	waitFor("the row arrives in Kafka", 30*time.Second, func(s string) bool {
		return strings.Contains(s, "key=order-42") && strings.Contains(s, "type=OrderPlaced")
	})

	if err := syscall.Kill(-pgid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		// GNU make, interrupted, waits for the recipe and then dies of the
		// signal itself (a shell shows 130), saying nothing when the recipe
		// exited 0; "make: *** … Error 1" is what a failed recipe prints.
		var exit *exec.ExitError
		if waitErr != nil && !(errors.As(waitErr, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGINT) {
			t.Errorf("make demo after Ctrl-C: %v, want exit status 0 or make's own death by SIGINT:\n%s", waitErr, out.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("make demo still runs 60s after Ctrl-C:\n%s", out.String())
	}
	s := out.String()
	if strings.Contains(s, "make: ***") || !strings.Contains(s, "stopping the relay cleanly") {
		t.Errorf("make demo after Ctrl-C printed an error or no clean stop:\n%s", s)
	}
	if _, err := os.Stat(urlFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the demo left its URL file %s behind (stat: %v)", urlFile, err)
	}
}

// TestDemoShowsItself: make demo prints, beside the psql line, its metrics
// URL and a cdc-relay status line that work as pasted; stopping the demo's
// Postgres with the line it prints turns /readyz into a 503 naming
// Postgres, and status into a failure naming the connection (what README.md
// says of it).
func TestDemoShowsItself(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("skip: no make on PATH")
	}
	dir := t.TempDir()
	urlFile := filepath.Join(dir, "bin", "demo-pg-url")
	demo := exec.Command("make", "--no-print-directory", "demo", "DEMOFLAGS=-events 0 -url-file "+urlFile)
	demo.Dir = filepath.Join("..", "..")
	demo.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out syncBuffer
	demo.Stdout, demo.Stderr = &out, &out
	if err := demo.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := demo.Process.Pid
	done := make(chan struct{})
	go func() { _ = demo.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-pgid, syscall.SIGINT) // the demo removes its cluster on the way out
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-done
		}
	})
	line := func(prefix string) string {
		for _, l := range strings.Split(out.String(), "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(l), prefix); ok {
				return strings.TrimSpace(rest)
			}
		}
		return ""
	}
	testenv.Eventually(t, 4*time.Minute, func() error {
		select {
		case <-done:
			t.Fatalf("make demo exited:\n%s", out.String())
		default:
		}
		if line("status ") == "" || line("psql ") == "" || line("stop Postgres to see them change:") == "" {
			return fmt.Errorf("no look lines yet:\n%s", out.String())
		}
		return nil
	})
	metrics, ready := line("metrics "), line("ready ")
	readyURL := strings.Fields(strings.TrimPrefix(ready, "curl -s "))[0]
	sh := func(cmd string) (string, error) {
		c := exec.Command("sh", "-c", cmd)
		c.Dir = filepath.Join("..", "..")
		b, err := c.CombinedOutput()
		return string(b), err
	}
	if got, err := sh(metrics); err != nil || !strings.Contains(got, `cdc_relay_state{state="streaming"} 1`) {
		t.Errorf("the metrics line %q: %v\n%s", metrics, err, got)
	}
	if got, err := sh("curl -s " + readyURL); err != nil || strings.TrimSpace(got) != "ready" {
		t.Errorf("/readyz while streaming: %v %q", err, got)
	}
	status := line("status ")
	if got, err := sh(status); err != nil || !strings.Contains(got, "cdc_relay") {
		t.Errorf("the status line %q: %v\n%s", status, err, got)
	}

	if got, err := sh(line("stop Postgres to see them change:")); err != nil {
		t.Fatalf("the stop line: %v\n%s", err, got)
	}
	stopped := time.Now()
	var body string
	testenv.Eventually(t, 30*time.Second, func() error {
		body, _ = sh("curl -s " + readyURL)
		if !strings.HasPrefix(body, "not ready: Postgres") {
			return fmt.Errorf("/readyz says %q", body)
		}
		return nil
	})
	t.Logf("/readyz %s after Postgres stopped: %s", time.Since(stopped).Round(100*time.Millisecond), body)
	if got, _ := sh(metrics); !strings.Contains(got, `cdc_relay_state{state="retrying"} 1`) {
		t.Errorf("cdc_relay_state with Postgres stopped:\n%s", got)
	}
	got, err := sh(status)
	if err == nil || !strings.Contains(got, "connect to Postgres") {
		t.Errorf("status with Postgres stopped: %v, want a failure naming the connection:\n%s", err, got)
	}
	t.Logf("status with Postgres stopped: %v\n%s", err, got)

	// Ctrl-C still stops the demo.
	if err := syscall.Kill(-pgid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Errorf("the demo still runs 60s after Ctrl-C with its Postgres stopped:\n%s", out.String())
	}
}
