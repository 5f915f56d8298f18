package child

import (
	"strings"
	"testing"
	"time"
)

func TestLinesAndStderr(t *testing.T) {
	p, err := Start(Options{Name: "sh", Path: "/bin/sh", Args: []string{"-c",
		`echo out-1; echo err-1 >&2; echo out-2; echo err-2 >&2; exit 3`}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the child did not exit")
	}
	var lines []string
	for len(p.Lines()) > 0 {
		lines = append(lines, <-p.Lines())
	}
	if strings.Join(lines, ",") != "out-1,out-2" {
		t.Fatalf("Lines delivered %q, want stdout only", lines)
	}
	if tail := p.StderrTail(); tail != "err-1\nerr-2" {
		t.Fatalf("StderrTail = %q, want stderr only", tail)
	}
	err = p.ExitError()
	if err == nil || !strings.Contains(err.Error(), "sh exited: exit status 3") || !strings.Contains(err.Error(), "err-2") {
		t.Fatalf("ExitError = %v, want exit status 3 and the stderr tail", err)
	}
	if p.Started().IsZero() || p.PID() == 0 {
		t.Fatalf("Started %v, PID %d", p.Started(), p.PID())
	}
}

func TestStopAndKill(t *testing.T) {
	loop := `trap 'exit 0' TERM; echo up; while :; do sleep 0.05; done`
	p, err := Start(Options{Name: "sh", Path: "/bin/sh", Args: []string{"-c", loop}})
	if err != nil {
		t.Fatal(err)
	}
	<-p.Lines() // the trap is set
	u, err := p.Stop(10 * time.Second)
	if err != nil {
		t.Fatalf("Stop of a child that exits 0 on SIGTERM: %v", err)
	}
	if u.MaxRSS <= 0 {
		t.Errorf("MaxRSS %d, want the sampled VmHWM", u.MaxRSS)
	}
	// Ignores SIGTERM: killed after the grace period, and says so.
	p, err = Start(Options{Name: "sh", Path: "/bin/sh", Args: []string{"-c", `trap '' TERM; echo up; while :; do sleep 0.05; done`}})
	if err != nil {
		t.Fatal(err)
	}
	<-p.Lines() // the trap is set
	if _, err := p.Stop(200 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "was killed") {
		t.Fatalf("Stop of a child ignoring SIGTERM = %v, want it killed", err)
	}
	p, err = Start(Options{Name: "sh", Path: "/bin/sh", Args: []string{"-c", loop}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := p.ExitError(); err == nil || !strings.Contains(err.Error(), "signal: killed") {
		t.Fatalf("ExitError after Kill = %v, want signal: killed", err)
	}
}
