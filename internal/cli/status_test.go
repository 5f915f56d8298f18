package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestStatus reads a real slot: healthy, lagging past the threshold, missing.
func TestStatus(t *testing.T) {
	pg := testenv.NewPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	url, err := pg.CreateDatabase(ctx, "status_db")
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, "status_db", "SELECT pg_create_logical_replication_slot('st_slot', 'pgoutput')"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = pg.Exec(context.Background(), "status_db", "SELECT pg_drop_replication_slot('st_slot') FROM pg_replication_slots WHERE slot_name = 'st_slot'")
	})
	if err := pg.Exec(ctx, "status_db", "CREATE TABLE w AS SELECT repeat('x', 1000) AS v FROM generate_series(1, 200)"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		wantCode int // 0: no error
		check    func(t *testing.T, st Status, out string)
	}{
		{
			name: "healthy, json",
			args: []string{"--json"},
			check: func(t *testing.T, st Status, _ string) {
				if !st.SlotExists || st.WALStatus != "reserved" || st.LagBytes <= 0 || st.RetainedWALBytes <= 0 || st.Active {
					t.Errorf("status %+v: want an existing, inactive, reserved slot with some lag", st)
				}
			},
		},
		{
			name:     "lag above threshold",
			args:     []string{"--max-lag-bytes", "1000"},
			wantCode: statusProblem,
			check: func(t *testing.T, _ Status, out string) {
				if !strings.Contains(out, "PROBLEM") || !strings.Contains(out, "--max-lag-bytes") {
					t.Errorf("output lacks the lag problem:\n%s", out)
				}
			},
		},
		{
			name:     "slot missing",
			args:     []string{"--slot", "no_such_slot", "--json"},
			wantCode: statusProblem,
			check: func(t *testing.T, st Status, _ string) {
				if st.SlotExists || len(st.Problems) != 1 || !strings.Contains(st.Problems[0], "does not exist") {
					t.Errorf("status %+v: want a missing-slot problem", st)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := append([]string{"status", "--pg-url", url, "--slot", "st_slot"}, tt.args...)
			err := Run(ctx, args, Env{Stdout: &out, Stderr: &errb, Version: "test"})
			var exit *ExitError
			switch {
			case tt.wantCode == 0 && err != nil:
				t.Fatalf("status: %v", err)
			case tt.wantCode != 0 && (!errors.As(err, &exit) || exit.Code != tt.wantCode):
				t.Fatalf("status error %v, want exit code %d", err, tt.wantCode)
			}
			var st Status
			if strings.Contains(strings.Join(tt.args, " "), "--json") {
				if err := json.Unmarshal(out.Bytes(), &st); err != nil {
					t.Fatalf("status --json output: %v\n%s", err, out.String())
				}
			}
			tt.check(t, st, out.String())
		})
	}
}
