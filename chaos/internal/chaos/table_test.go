package chaos

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestResultFailed(t *testing.T) {
	for name, ok := range map[string]Result{
		"clean":              {Scenario: "s", Faults: 3, MinFaults: 3, Committed: 10},
		"explained":          {Scenario: "s", Faults: 3, MinFaults: 3, Committed: 10, Duplicated: 4, DuplicatesReason: "at-least-once"},
		"reason, no repeats": {Scenario: "s", Faults: 3, MinFaults: 3, Committed: 10, DuplicatesReason: "at-least-once"},
	} {
		if ok.Failed() {
			t.Errorf("%s: %+v failed, want ok", name, ok)
		}
	}
	for name, r := range map[string]Result{
		"duplicates":   {Faults: 3, MinFaults: 3, Duplicated: 1},
		"lost":         {Faults: 3, MinFaults: 3, Lost: 1},
		"order":        {Faults: 3, MinFaults: 3, OrderViolations: 1},
		"unexpected":   {Faults: 3, MinFaults: 3, Unexpected: 1},
		"fewer faults": {Faults: 2, MinFaults: 3},
		"error":        {Faults: 3, MinFaults: 3, Err: errors.New("hang")},
	} {
		if !r.Failed() {
			t.Errorf("%s: %+v did not fail", name, r)
		}
	}
	if (Result{Skipped: "external", Lost: 1}).Failed() {
		t.Errorf("a skipped scenario failed")
	}
}

func TestWriteTable(t *testing.T) {
	var b strings.Builder
	err := WriteTable(&b, []Result{
		{Scenario: "sigkill-loop", Faults: 20, MinFaults: 20, Committed: 4535, Duration: 12300 * time.Millisecond, Notes: []string{"a", "b"}},
		{Scenario: "pg-net-cut", Faults: 1, MinFaults: 3, Lost: 2, Err: errors.New("relay exited")},
		{Scenario: "pg-restart-fast", Skipped: "external"},
		{Scenario: "sigkill-loop-at-least-once", Faults: 20, MinFaults: 20, Committed: 4400, Duplicated: 900, DuplicatesReason: "at-least-once resends", Notes: []string{"c"}},
		{Scenario: "kafka-restart", Faults: 3, MinFaults: 3, Committed: 4000, Duplicated: 7},
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 6 {
		t.Fatalf("%d lines, want a header and 5 rows:\n%s", len(lines), b.String())
	}
	if f := strings.Fields(lines[0]); !slices.Equal(f, []string{"scenario", "faults", "committed", "lost", "duplicated", "order", "violations", "time", "notes"}) {
		t.Errorf("header %q", lines[0])
	}
	if f := strings.Fields(lines[1]); !slices.Equal(f[:7], []string{"sigkill-loop", "20", "4535", "0", "0", "0", "12.3s"}) || !strings.HasSuffix(lines[1], "a; b") {
		t.Errorf("row %q", lines[1])
	}
	if !strings.Contains(lines[2], "ERROR: relay exited") || !strings.Contains(lines[2], "FEWER FAULTS THAN PLANNED (3)") {
		t.Errorf("failed row %q does not say why", lines[2])
	}
	if !strings.Contains(lines[3], "skipped: external") {
		t.Errorf("skipped row %q", lines[3])
	}
	if f := strings.Fields(lines[4]); f[4] != "900" || !strings.HasSuffix(lines[4], "duplicates expected: at-least-once resends; c") {
		t.Errorf("explained duplicates row %q does not give the reason", lines[4])
	}
	if !strings.Contains(lines[5], "7 UNEXPLAINED DUPLICATES") {
		t.Errorf("unexplained duplicates row %q does not say so", lines[5])
	}
}

func TestRelayArgsOverride(t *testing.T) {
	r := &run{relayURL: "postgres://x/db", slot: "s", topic: "t", kafka: &kafkaEnv{brokers: []string{"a:1", "b:2"}},
		sc: Scenario{relayArgs: []string{"--status-interval", "1s", "--max-in-flight-mib", "1"}}}
	got := strings.Join(r.relayArgs(), " ")
	for _, want := range []string{"--kafka-brokers a:1,b:2", "--status-interval 1s", "--max-in-flight-mib 1", "--pg-url postgres://x/db"} {
		if !strings.Contains(got, want) {
			t.Errorf("args %q lack %q", got, want)
		}
	}
	if strings.Count(got, "--status-interval") != 1 {
		t.Errorf("args %q repeat a replaced flag", got)
	}
}

func TestFailureLine(t *testing.T) {
	for _, tt := range []struct {
		seed      uint64
		scenarios []string
		want      string
	}{
		{42, []string{"kafka-restart"}, "FAILED chaos scenario kafka-restart, seed 42"},
		{7, []string{"sigkill-loop", "pg-net-cut"}, "FAILED chaos scenario sigkill-loop, pg-net-cut, seed 7"},
	} {
		if got := FailureLine(tt.seed, tt.scenarios...); got != tt.want {
			t.Errorf("FailureLine(%d, %q) = %q, want %q", tt.seed, tt.scenarios, got, tt.want)
		}
	}
}
