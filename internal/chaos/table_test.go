package chaos

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestResultFailed(t *testing.T) {
	ok := Result{Scenario: "s", Faults: 3, MinFaults: 3, Committed: 10, Duplicated: 4}
	if ok.Failed() {
		t.Errorf("%+v failed, want ok: duplicates are allowed", ok)
	}
	for name, r := range map[string]Result{
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
		{Scenario: "sigkill-loop", Faults: 20, MinFaults: 20, Committed: 4535, Duplicated: 12, Duration: 12300 * time.Millisecond, Notes: []string{"a", "b"}},
		{Scenario: "pg-net-cut", Faults: 1, MinFaults: 3, Lost: 2, Err: errors.New("relay exited")},
		{Scenario: "pg-restart-fast", Skipped: "external"},
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want a header and 3 rows:\n%s", len(lines), b.String())
	}
	if f := strings.Fields(lines[0]); !slices.Equal(f, []string{"scenario", "faults", "committed", "lost", "duplicated", "order", "violations", "time", "notes"}) {
		t.Errorf("header %q", lines[0])
	}
	if f := strings.Fields(lines[1]); !slices.Equal(f[:7], []string{"sigkill-loop", "20", "4535", "0", "12", "0", "12.3s"}) || !strings.HasSuffix(lines[1], "a; b") {
		t.Errorf("row %q", lines[1])
	}
	if !strings.Contains(lines[2], "ERROR: relay exited") || !strings.Contains(lines[2], "FEWER FAULTS THAN PLANNED (3)") {
		t.Errorf("failed row %q does not say why", lines[2])
	}
	if !strings.Contains(lines[3], "skipped: external") {
		t.Errorf("skipped row %q", lines[3])
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
