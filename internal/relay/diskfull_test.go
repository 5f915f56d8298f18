package relay_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// smallDisk mounts a 64 KiB tmpfs for the test, or skips the test where
// mounting is not allowed (not root, no CAP_SYS_ADMIN).
func smallDisk(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("cannot mount a small tmpfs to fill (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a file until the disk is full and returns its path.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1024)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", dir, err)
			}
			return path
		}
	}
}

// TestFileCheckpointStoreDiskFull fills the disk of the file checkpoint store
// under a running relay: events keep flowing, nothing is confirmed past the
// last checkpoint that reached the disk, the file stays whole, and once space
// is back the checkpoint and the slot catch up.
func TestFileCheckpointStoreDiskFull(t *testing.T) {
	dir := smallDisk(t)
	path := filepath.Join(dir, "checkpoint.json")
	e := newEnv(t)
	e.cfgHook = func(c *relay.Config) {
		c.Checkpoints = checkpoint.NewFileStore(path)
	}
	e.start()
	insert := func(n int) {
		e.exec(`INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
SELECT 't', 'k' || (g % 3), 'E', jsonb_build_object('seq', g) FROM generate_series(1, $1::int) g`, n)
	}
	stored := func() pglogrepl.LSN {
		t.Helper()
		c, ok, err := checkpoint.NewFileStore(path).Load(context.Background(), e.slot)
		if err != nil || !ok {
			t.Fatalf("load checkpoint file: %v (found %v)", err, ok)
		}
		return c.LSN
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		testenv.Eventually(t, 15*time.Second, func() error {
			if !cond() {
				return fmt.Errorf("waiting for %s\n%s", what, e.logs.String())
			}
			return nil
		})
	}

	insert(10)
	e.waitRecords(10)
	afterFirst := e.currentLSN()
	waitFor("the first checkpoint on disk", func() bool {
		_, err := os.Stat(path)
		return err == nil && stored() >= afterFirst
	})

	filler := fill(t, dir)
	before := stored()
	insert(20)
	e.waitRecords(30) // Kafka still gets everything
	waitFor("checkpoint errors", func() bool { return testutil.ToFloat64(e.m.CheckpointErrors) >= 3 })
	if got := stored(); got != before {
		t.Errorf("checkpoint file moved from %s to %s on a full disk", before, got)
	}
	if got := e.slotConfirmed(); got > before {
		t.Errorf("slot confirmed %s, past the last checkpoint on disk %s", got, before)
	}
	if !strings.Contains(e.logs.String(), "no space left on device") {
		t.Errorf("the log does not say the disk is full:\n%s", e.logs.String())
	}
	// Space is back: the checkpoint and the slot catch up.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	end := e.currentLSN()
	waitFor("the checkpoint to catch up", func() bool { return stored() >= end })
	waitFor("the slot to catch up", func() bool { return e.slotConfirmed() >= end })
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	// Only now: while the relay runs, a save in progress has its temporary
	// file, and on the full disk it retried one save after another. Every
	// failed one must have removed its own.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range entries {
		if strings.Contains(de.Name(), ".tmp-") {
			t.Errorf("temporary file %s left behind", de.Name())
		}
	}
	if n := len(e.readAll()); n != 30 {
		t.Errorf("%d records in Kafka, want 30", n)
	}
}
