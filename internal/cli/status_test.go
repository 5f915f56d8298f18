package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/status"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestStatus runs the command on a real slot: its flags reach the report
// (internal/status tests the report itself), --json prints the report as
// JSON, and a problem exits statusProblem.
func TestStatus(t *testing.T) {
	pg := testenv.NewPostgres(t, sandbox.PGOptions{})
	ctx := t.Context()
	url, err := pg.CreateDatabase(ctx, "status_db")
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, "status_db", "CREATE TABLE ob (v int); CREATE PUBLICATION cdc_relay_outbox FOR TABLE ob"); err != nil {
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
		check    func(t *testing.T, out string, err error)
	}{
		{
			name: "text",
			check: func(t *testing.T, out string, _ error) {
				wantLines(t, out, `slot\s+st_slot`, `active\s+no \(relay not connected\)`, `kafka offsets\s+none stored .*`)
			},
		},
		{
			name: "json",
			args: []string{"--json"},
			check: func(t *testing.T, out string, _ error) {
				var st status.Report
				if err := json.Unmarshal([]byte(out), &st); err != nil {
					t.Fatalf("status --json output: %v\n%s", err, out)
				}
				if st.Slot != "st_slot" || !st.SlotExists || st.LagBytes <= 0 || len(st.Problems) != 0 {
					t.Errorf("status %+v: want slot st_slot, existing, lagging, no problem", st)
				}
			},
		},
		{
			name:     "lag above --max-lag-bytes",
			args:     []string{"--max-lag-bytes", "1000"},
			wantCode: statusProblem,
			check: func(t *testing.T, out string, err error) {
				lag := `replication slot "st_slot" lags \d+ bytes behind the server's WAL end, more than the limit of 1000 bytes`
				if !regexp.MustCompile(`(?m)^PROBLEM +` + lag).MatchString(out) {
					t.Errorf("output lacks the lag problem:\n%s", out)
				}
				if !regexp.MustCompile(lag).MatchString(err.Error()) {
					t.Errorf("error %q lacks the lag problem", err)
				}
			},
		},
		{
			name:     "--slot missing, json",
			args:     []string{"--slot", "no_such_slot", "--json"},
			wantCode: statusProblem,
			check: func(t *testing.T, out string, _ error) {
				var st status.Report
				if err := json.Unmarshal([]byte(out), &st); err != nil {
					t.Fatalf("status --json output: %v\n%s", err, out)
				}
				if st.Slot != "no_such_slot" || st.SlotExists || len(st.Problems) != 1 || !strings.Contains(st.Problems[0], "does not exist") {
					t.Errorf("status %+v: want a missing-slot problem", st)
				}
			},
		},
		{
			name: "unknown --publication",
			args: []string{"--publication", "no_such_pub"},
			check: func(t *testing.T, out string, _ error) {
				wantLines(t, out, `oldest unrelayed\s+unknown: .*no_such_pub.*`)
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
			tt.check(t, out.String(), err)
		})
	}
}

// wantLines fails unless each pattern matches a whole line of out.
func wantLines(t *testing.T, out string, patterns ...string) {
	t.Helper()
	for _, p := range patterns {
		if !regexp.MustCompile(`(?m)^` + p + `$`).MatchString(out) {
			t.Errorf("no line matches %q in:\n%s", p, out)
		}
	}
}

func pool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestStatusSameWordsAsStartUp: each problem status reports is the verdict
// the relay's start-up check (internal/gaps) gives on the same database, in
// the same words, as the run command prints it (settings named as flags).
func TestStatusSameWordsAsStartUp(t *testing.T) {
	pg := testenv.NewPostgres(t, sandbox.PGOptions{})
	testenv.RequireLocal(t, pg) // loses a slot through ALTER SYSTEM
	ctx := t.Context()
	url, err := pg.CreateDatabase(ctx, "words_db")
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, "words_db", "CREATE TABLE covered (v int); CREATE TABLE uncovered (v int); CREATE PUBLICATION words_pub FOR TABLE covered"); err != nil {
		t.Fatal(err)
	}
	p := pool(t, url)
	store := checkpoint.NewTableStore(p, "")
	if err := store.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	createSlot := func(t *testing.T, slot string) {
		t.Helper()
		if _, err := p.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = p.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
		})
	}
	// save stores a checkpoint for slot at lsn, or at the slot's confirmed
	// position when lsn is "".
	save := func(t *testing.T, slot, lsn string) {
		t.Helper()
		if lsn == "" {
			if err := p.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&lsn); err != nil {
				t.Fatal(err)
			}
		}
		at, err := pglogrepl.ParseLSN(lsn)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Save(ctx, checkpoint.Checkpoint{Slot: slot, LSN: at, RelayName: "r"}); err != nil {
			t.Fatal(err)
		}
	}
	setup := func(slot, table string) replication.SetupConfig {
		schema, name, _ := strings.Cut(table, ".")
		return replication.SetupConfig{Slot: slot, Publication: "words_pub", Schema: schema, Table: name, Names: runNames}
	}
	// slotVerdict is the start-up check of the slot against its stored checkpoint.
	slotVerdict := func(t *testing.T, slot, table string) error {
		stored, have, err := store.Load(ctx, slot)
		if err != nil || !have {
			t.Fatalf("load the checkpoint of %s: %v (stored %t)", slot, err, have)
		}
		_, r, err := gaps.New(gaps.Config{Setup: setup(slot, table), Logger: zerolog.Nop()}).
			Slot(ctx, p, gaps.SlotFacts{Stored: stored, HaveStored: have})
		if err == nil {
			t.Fatalf("the start-up check passed slot %s (findings %+v)", slot, r.Findings)
		}
		return err
	}
	tests := []struct {
		name, slot, table string
		setup             func(t *testing.T)
		startUp           func(t *testing.T) error // the start-up check's verdict
	}{
		{
			name: "table not covered", slot: "words_uncovered", table: "public.uncovered",
			setup: func(t *testing.T) { createSlot(t, "words_uncovered") },
			startUp: func(t *testing.T) error {
				return gaps.New(gaps.Config{Setup: setup("words_uncovered", "public.uncovered"), Logger: zerolog.Nop()}).Publication(ctx, p)
			},
		},
		{
			name: "slot missing", slot: "words_missing", table: "public.covered",
			setup:   func(t *testing.T) { save(t, "words_missing", "0/1000") },
			startUp: func(t *testing.T) error { return slotVerdict(t, "words_missing", "public.covered") },
		},
		{
			name: "slot past the checkpoint", slot: "words_ahead", table: "public.covered",
			setup: func(t *testing.T) {
				createSlot(t, "words_ahead")
				save(t, "words_ahead", "0/100")
			},
			startUp: func(t *testing.T) error { return slotVerdict(t, "words_ahead", "public.covered") },
		},
		{
			name: "slot lost", slot: "words_lost", table: "public.covered",
			setup: func(t *testing.T) {
				createSlot(t, "words_lost")
				save(t, "words_lost", "")
				testenv.LoseSlot(t, p, "words_lost")
			},
			startUp: func(t *testing.T) error { return slotVerdict(t, "words_lost", "public.covered") },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.setup(t)
			want := tt.startUp(t).Error()
			var out, errb bytes.Buffer
			err := Run(ctx, []string{"status", "--json", "--pg-url", url, "--slot", tt.slot, "--publication", "words_pub", "--table", tt.table},
				Env{Stdout: &out, Stderr: &errb, Version: "test"})
			var exit *ExitError
			if !errors.As(err, &exit) || exit.Code != statusProblem {
				t.Fatalf("status error %v, want exit code %d\n%s", err, statusProblem, out.String())
			}
			var st status.Report
			if err := json.Unmarshal(out.Bytes(), &st); err != nil {
				t.Fatalf("status --json output: %v\n%s", err, out.String())
			}
			if !slices.Contains(st.Problems, want) {
				t.Errorf("status problems\n%s\nlack the start-up check's verdict\n%s", strings.Join(st.Problems, "\n"), want)
			}
		})
	}
}
