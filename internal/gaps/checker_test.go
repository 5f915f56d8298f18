package gaps_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/setting"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// pgEnv is one Postgres cluster with two databases: "gaps_a" holds the outbox
// table, "gaps_b" is another database of the same cluster.
type pgEnv struct {
	pg       *sandbox.Postgres
	urlA     string
	poolA    *pgxpool.Pool
	poolB    *pgxpool.Pool
	systemID string
}

func newPGEnv(t *testing.T) *pgEnv {
	t.Helper()
	ctx := t.Context()
	pg := testenv.NewPostgres(t, sandbox.PGOptions{})
	e := &pgEnv{pg: pg}
	var err error
	if e.urlA, err = pg.CreateDatabase(ctx, "gaps_a"); err != nil {
		t.Fatal(err)
	}
	urlB, err := pg.CreateDatabase(ctx, "gaps_b")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		url  string
		pool **pgxpool.Pool
	}{{e.urlA, &e.poolA}, {urlB, &e.poolB}} {
		pool, err := pgxpool.New(ctx, p.url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		*p.pool = pool
	}
	e.exec(t, e.poolA, `CREATE TABLE outbox_events (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_id text, payload jsonb);
		CREATE TABLE other (id int)`)
	sys, err := replication.IdentifySystem(ctx, e.urlA, setting.Namer{})
	if err != nil {
		t.Fatal(err)
	}
	e.systemID = sys.SystemID
	return e
}

func (e *pgEnv) exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// createSlot creates a pgoutput slot in pool's database and returns its
// confirmed position.
func (e *pgEnv) createSlot(t *testing.T, pool *pgxpool.Pool, slot string) pglogrepl.LSN {
	t.Helper()
	var lsn string
	if err := pool.QueryRow(t.Context(), "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')", slot).Scan(&lsn); err != nil {
		t.Fatalf("create slot %s: %v", slot, err)
	}
	l, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// moveWAL writes some WAL, so a slot created after is ahead of one before.
func (e *pgEnv) moveWAL(t *testing.T) {
	t.Helper()
	e.exec(t, e.poolA, "INSERT INTO other SELECT generate_series(1, 100)")
	e.exec(t, e.poolA, "SELECT pg_switch_wal()")
}

func newChecker(setup replication.SetupConfig) (*gaps.Checker, *metrics.Metrics, *sandbox.Buffer) {
	m := metrics.New(prometheus.NewRegistry())
	logs := new(sandbox.Buffer)
	return gaps.New(gaps.Config{Setup: setup, Logger: zerolog.New(logs), Metrics: m}), m, logs
}

func setupFor(slot, pub string) replication.SetupConfig {
	return replication.SetupConfig{Slot: slot, Publication: pub, Schema: "public", Table: "outbox_events"}
}

// TestCheckerSlot runs the start-up slot checks against slots and stored
// checkpoints as Postgres and the store really hold them.
func TestCheckerSlot(t *testing.T) {
	e := newPGEnv(t)
	stored := func(slot string, lsn pglogrepl.LSN, system string) checkpoint.Checkpoint {
		return checkpoint.Checkpoint{Slot: slot, SystemID: system, LSN: lsn, UpdatedAt: time.Now(), CommitTime: time.Now()}
	}
	tests := []struct {
		name string
		// state makes the Postgres state of slot and returns the facts the
		// relay would bring (the stored checkpoint).
		state      func(t *testing.T, slot string) gaps.SlotFacts
		wantFailed string       // the fatal check; "" for none
		wantKind   gaps.GapKind // for a *GapError; 0 for a *replication.ConfigError
		wantRepair bool         // wantFailed is repaired by the caller: no error, not counted
		wantWarn   []string     // substrings of the logged warnings
		want       []string     // substrings of the error
	}{
		{
			name: "first run, no slot: nothing to say",
			state: func(t *testing.T, slot string) gaps.SlotFacts {
				return gaps.SlotFacts{SystemID: e.systemID}
			},
		},
		{
			name: "first run, slot exists: redelivery warning",
			state: func(t *testing.T, slot string) gaps.SlotFacts {
				e.createSlot(t, e.poolA, slot)
				return gaps.SlotFacts{SystemID: e.systemID}
			},
			wantWarn: []string{"no stored checkpoint for replication slot", "delivered again"},
		},
		{
			name: "checkpoint at the slot: nothing to say",
			state: func(t *testing.T, slot string) gaps.SlotFacts {
				lsn := e.createSlot(t, e.poolA, slot)
				return gaps.SlotFacts{SystemID: e.systemID, Stored: stored(slot, lsn, e.systemID), HaveStored: true}
			},
		},
		{
			name: "slot missing",
			state: func(t *testing.T, slot string) gaps.SlotFacts {
				return gaps.SlotFacts{SystemID: e.systemID, Stored: stored(slot, 0x1000000, e.systemID), HaveStored: true}
			},
			wantFailed: "slot_missing", wantKind: gaps.SlotMissing,
			want: []string{"does not exist", "DELETE FROM public.cdc_relay_checkpoints", "(command replay since="},
		},
		{
			name: "slot recreated: ahead of the checkpoint",
			state: func(t *testing.T, slot string) gaps.SlotFacts {
				lsn := e.createSlot(t, e.poolA, slot)
				e.exec(t, e.poolA, "SELECT pg_drop_replication_slot($1)", slot)
				e.moveWAL(t)
				e.createSlot(t, e.poolA, slot)
				return gaps.SlotFacts{SystemID: e.systemID, Stored: stored(slot, lsn, e.systemID), HaveStored: true}
			},
			wantFailed: "slot_ahead", wantKind: gaps.SlotAhead,
			want: []string{"past the stored checkpoint", "dropped and recreated", "UPDATE public.cdc_relay_checkpoints SET lsn"},
		},
		{
			name: "checkpoint ahead of the slot: redelivery warning",
			state: func(t *testing.T, slot string) gaps.SlotFacts {
				lsn := e.createSlot(t, e.poolA, slot)
				return gaps.SlotFacts{SystemID: e.systemID, Stored: stored(slot, lsn+0x100, e.systemID), HaveStored: true}
			},
			wantWarn: []string{"behind the stored checkpoint", "may be delivered again"},
		},
		{
			name: "other system identifier",
			state: func(t *testing.T, slot string) gaps.SlotFacts {
				lsn := e.createSlot(t, e.poolA, slot)
				return gaps.SlotFacts{SystemID: e.systemID, Stored: stored(slot, lsn, "6999999999999999999"), HaveStored: true}
			},
			wantFailed: "system_changed", wantKind: gaps.SystemChanged,
			want: []string{"6999999999999999999", e.systemID, "restored from a backup, cloned"},
		},
		{
			name: "slot of another database",
			state: func(t *testing.T, slot string) gaps.SlotFacts {
				e.createSlot(t, e.poolB, slot)
				return gaps.SlotFacts{SystemID: e.systemID}
			},
			wantFailed: gaps.CheckSlotDatabase,
			want:       []string{`belongs to database "gaps_b", not "gaps_a"`, setting.Namer{}.Name("Slot")},
		},
		{
			name: "slot with another plugin",
			state: func(t *testing.T, slot string) gaps.SlotFacts {
				e.exec(t, e.poolA, "SELECT pg_create_logical_replication_slot($1, 'test_decoding')", slot)
				return gaps.SlotFacts{SystemID: e.systemID}
			},
			wantFailed: "wrong_plugin", wantKind: gaps.WrongPlugin,
			want: []string{`"test_decoding"`, "give the relay its own slot name"},
		},
		{
			name: "initial snapshot marker",
			state: func(t *testing.T, slot string) gaps.SlotFacts {
				e.createSlot(t, e.poolA, slot)
				return gaps.SlotFacts{SystemID: e.systemID, Stored: stored(slot, 0, e.systemID), HaveStored: true, SnapshotPending: true}
			},
			wantFailed: gaps.CheckSnapshotIncomplete,
			want:       []string{"did not complete", setting.Namer{}.Name("Snapshot")},
		},
		{
			name: "initial snapshot marker, retaken",
			state: func(t *testing.T, slot string) gaps.SlotFacts {
				e.createSlot(t, e.poolA, slot)
				return gaps.SlotFacts{SystemID: e.systemID, Stored: stored(slot, 0, e.systemID), HaveStored: true,
					SnapshotPending: true, RetakeSnapshot: true}
			},
			wantFailed: gaps.CheckSnapshotIncomplete, wantRepair: true,
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			slot := "gap_slot_" + string(rune('a'+i))
			t.Cleanup(func() {
				for _, p := range []*pgxpool.Pool{e.poolA, e.poolB} {
					_, _ = p.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()", slot)
				}
			})
			sf := tt.state(t, slot)
			c, m, logs := newChecker(setupFor(slot, "p"))
			state, rep, err := c.Slot(t.Context(), e.poolA, sf)
			if rep.Failed != tt.wantFailed {
				t.Fatalf("failed check = %q, want %q (err %v)", rep.Failed, tt.wantFailed, err)
			}
			problems := testutil.ToFloat64(m.SlotProblems.WithLabelValues(tt.wantFailed))
			if tt.wantRepair {
				if err != nil || problems != 0 || logs.String() != "" {
					t.Errorf("repair: err %v, slot_problems_total %v, logs %q; want none", err, problems, logs)
				}
				return
			}
			if tt.wantFailed == "" {
				if err != nil {
					t.Fatalf("Slot: %v", err)
				}
				if !strings.Contains(e.pgSlots(t), slot) == state.Exists {
					t.Errorf("state.Exists = %v, but pg_replication_slots has %s", state.Exists, e.pgSlots(t))
				}
				if len(tt.wantWarn) == 0 && logs.String() != "" {
					t.Errorf("logged %s, want nothing", logs)
				}
				for _, w := range tt.wantWarn {
					if !strings.Contains(logs.String(), w) {
						t.Errorf("logs do not contain %q:\n%s", w, logs)
					}
				}
				return
			}
			if err == nil {
				t.Fatal("Slot returned no error with a failed check")
			}
			if problems != 1 {
				t.Errorf("slot_problems_total{kind=%s} = %v, want 1", tt.wantFailed, problems)
			}
			var gapErr *gaps.GapError
			var cfgErr *replication.ConfigError
			switch {
			case tt.wantKind != 0 && (!errors.As(err, &gapErr) || gapErr.Kind != tt.wantKind):
				t.Errorf("error %v, want a *GapError of kind %s", err, tt.wantKind)
			case tt.wantKind == 0 && !errors.As(err, &cfgErr):
				t.Errorf("error %v (%T), want a *replication.ConfigError", err, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
			if logs.String() != "" {
				t.Errorf("warnings logged with a fatal finding: %s", logs)
			}
		})
	}
}

func (e *pgEnv) pgSlots(t *testing.T) string {
	t.Helper()
	var names string
	if err := e.poolA.QueryRow(t.Context(), "SELECT coalesce(string_agg(slot_name, ','), '') FROM pg_replication_slots").Scan(&names); err != nil {
		t.Fatal(err)
	}
	return names
}

// TestCheckerPublication runs the publication checks, at start and while
// streaming, against publications as Postgres holds them.
func TestCheckerPublication(t *testing.T) {
	e := newPGEnv(t)
	tests := []struct {
		name string
		// before makes the state the first watch round sees (nil: the
		// publication covers the table); change what the second sees.
		before, change string
		wantStart      string   // fatal check at start; "" for none
		wantWatch      string   // fatal check of the second watch round; "" for none
		want           []string // substrings of the error or the logs
	}{
		{name: "covered", before: "", change: ""},
		{
			name:      "publication of another table",
			before:    "ALTER PUBLICATION %s SET TABLE other",
			wantStart: gaps.CheckTableCovered,
			want:      []string{"does not cover the outbox table", "ALTER PUBLICATION", `ADD TABLE "public"."outbox_events";`},
		},
		{
			name:      "publication without inserts",
			before:    "ALTER PUBLICATION %s SET (publish = 'update')",
			wantStart: gaps.CheckPublicationInserts,
			want:      []string{"does not publish inserts", "SET (publish = 'insert')"},
		},
		{
			name:      "table removed from the publication while streaming",
			change:    "ALTER PUBLICATION %s DROP TABLE outbox_events",
			wantWatch: gaps.CheckTableCovered,
			want:      []string{"no longer covers the outbox table", "ADD TABLE", "(command replay since="},
		},
		{
			name:      "publication dropped while streaming",
			change:    "DROP PUBLICATION %s",
			wantWatch: gaps.CheckPublicationDropped,
			want:      []string{"was dropped while the relay was streaming", "pg_replication_slot_advance"},
		},
		{
			name:   "table removed and added back between rounds",
			change: "ALTER PUBLICATION %[1]s DROP TABLE outbox_events; ALTER PUBLICATION %[1]s ADD TABLE outbox_events",
			want:   []string{"was removed from publication", "(command replay since="},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := "gap_pub_" + string(rune('a'+i))
			e.exec(t, e.poolA, "CREATE PUBLICATION "+pub+" FOR TABLE outbox_events")
			t.Cleanup(func() { _, _ = e.poolA.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+pub) })
			if tt.before != "" {
				e.exec(t, e.poolA, sprintf(tt.before, pub))
			}
			c, m, logs := newChecker(setupFor("no_such_slot", pub))
			err := c.Publication(t.Context(), e.poolA)
			if tt.wantStart != "" {
				if err == nil || !errors.As(err, new(*replication.ConfigError)) {
					t.Fatalf("Publication = %v, want a *replication.ConfigError", err)
				}
				if got := testutil.ToFloat64(m.SlotProblems.WithLabelValues(tt.wantStart)); got != 1 {
					t.Errorf("slot_problems_total{kind=%s} = %v, want 1", tt.wantStart, got)
				}
				for _, w := range tt.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error does not contain %q:\n%v", w, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Publication: %v", err)
			}
			// First round: the baseline (and the missing slot, loudly).
			if err := c.Watch(t.Context(), e.poolA); err != nil {
				t.Fatalf("first watch round: %v", err)
			}
			if got := testutil.ToFloat64(m.SlotWALStatus.WithLabelValues("missing")); got != 1 {
				t.Errorf(`slot_wal_status{status="missing"} = %v, want 1`, got)
			}
			if !strings.Contains(logs.String(), "replication slot wal_status changed") {
				t.Errorf("a missing slot was not logged:\n%s", logs)
			}
			if tt.change != "" {
				e.exec(t, e.poolA, sprintf(tt.change, pub))
			}
			err = c.Watch(t.Context(), e.poolA)
			if tt.wantWatch == "" {
				if err != nil {
					t.Fatalf("second watch round: %v", err)
				}
			} else {
				if err == nil || !errors.As(err, new(*replication.ConfigError)) {
					t.Fatalf("second watch round = %v, want a *replication.ConfigError", err)
				}
				if got := testutil.ToFloat64(m.SlotProblems.WithLabelValues(tt.wantWatch)); got != 1 {
					t.Errorf("slot_problems_total{kind=%s} = %v, want 1", tt.wantWatch, got)
				}
				if err := c.Watch(t.Context(), e.poolA); err != nil {
					t.Errorf("third watch round = %v, want the fatal finding reported once", err)
				}
			}
			all := logs.String()
			if err != nil {
				all += err.Error()
			}
			for _, w := range tt.want {
				if !strings.Contains(all, w) {
					t.Errorf("logs and error do not contain %q:\n%s", w, all)
				}
			}
		})
	}
}

func sprintf(format, pub string) string {
	return strings.NewReplacer("%[1]s", pub, "%s", pub).Replace(format)
}

// TestStreamError: the walsender's "publication does not exist" (18: its
// warning "skipped loading publication") is a gap the
// relay stops on, explained and counted; any other error is not.
func TestStreamError(t *testing.T) {
	c, m, _ := newChecker(setupFor("s1", "pub1"))
	if err := c.StreamError(errors.New("connection reset")); err != nil {
		t.Errorf("StreamError(connection reset) = %v, want nil", err)
	}
	if err := c.StreamError(&pgconn.PgError{Code: "42704", Message: `type "x" does not exist`}); err != nil {
		t.Errorf("StreamError(another undefined object) = %v, want nil", err)
	}
	err := c.StreamError(fmt.Errorf("stream: %w", &pgconn.PgError{Code: "42704", Message: `publication "pub1" does not exist`}))
	if !errors.As(err, new(*replication.ConfigError)) {
		t.Fatalf("StreamError(publication does not exist) = %v, want a *replication.ConfigError", err)
	}
	for _, w := range []string{`publication "pub1" was dropped`, "pg_replication_slot_advance('s1'", "(command replay since=TIME)"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not contain %q: %v", w, err)
		}
	}
	// PostgreSQL 18 warns instead and decodes on without the publication.
	err = c.StreamError(fmt.Errorf("stream: %w", &pgconn.PgError{Severity: "WARNING", Code: "55000", Message: `skipped loading publication "pub1"`}))
	if !errors.As(err, new(*replication.ConfigError)) || !strings.Contains(err.Error(), `publication "pub1" was dropped`) {
		t.Fatalf("StreamError(skipped loading publication) = %v, want a *replication.ConfigError saying it was dropped", err)
	}
	if got := testutil.ToFloat64(m.SlotProblems.WithLabelValues(gaps.CheckPublicationDropped)); got != 2 {
		t.Errorf("slot_problems_total{kind=publication_dropped} = %v, want 2", got)
	}
}
