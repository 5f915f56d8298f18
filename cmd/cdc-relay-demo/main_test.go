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
