package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
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
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestStatus reads a real slot: healthy, lagging past the threshold, missing.
func TestStatus(t *testing.T) {
	pg := testenv.NewPostgres(t, sandbox.PGOptions{})
	ctx := context.Background()
	url, err := pg.CreateDatabase(ctx, "status_db")
	if err != nil {
		t.Fatal(err)
	}
	// The publication exists before the slot, as the relay makes it: pgoutput
	// reads publications as of the WAL it decodes.
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
	ckStore := checkpoint.NewTableStore(pool(t, url), "")
	if err := ckStore.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	offsets := checkpoint.Offsets{
		"orders":   {Partitions: 8, Next: map[int32]int64{0: 123, 1: 456, 7: 9}},
		"payments": {Partitions: 1, Next: map[int32]int64{0: 42}},
	}
	// saveCheckpoint stores a checkpoint at the slot's position: one behind
	// it is a gap (slot_ahead), which status reports.
	saveCheckpoint := func(o checkpoint.Offsets) func(t *testing.T) {
		return func(t *testing.T) {
			var lsn string
			if err := pool(t, url).QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'st_slot'").Scan(&lsn); err != nil {
				t.Fatal(err)
			}
			at, err := pglogrepl.ParseLSN(lsn)
			if err != nil {
				t.Fatal(err)
			}
			if err := ckStore.Save(ctx, checkpoint.Checkpoint{Slot: "st_slot", SystemID: "1", LSN: at, RelayName: "r", Offsets: o}); err != nil {
				t.Fatal(err)
			}
		}
	}
	p := pool(t, url)
	var version int
	if err := p.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		t.Fatal(err)
	}
	setKeep := func(size string) {
		t.Helper()
		for _, sql := range []string{"ALTER SYSTEM SET max_slot_wal_keep_size = '" + size + "'", "SELECT pg_reload_conf()"} {
			if _, err := p.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
	}
	tests := []struct {
		name     string
		setup    func(t *testing.T) // runs before status, in the order of the cases
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
				// Table w's rows are not the outbox's.
				if st.OldestUnrelayedAge == nil || *st.OldestUnrelayedAge != 0 || st.OldestUnrelayedSource != "slot" {
					t.Errorf("oldest unrelayed %v from %q (%s), want 0 from the slot", st.OldestUnrelayedAge, st.OldestUnrelayedSource, st.OldestUnrelayedError)
				}
			},
		},
		{
			name: "failover, json",
			args: []string{"--json"},
			check: func(t *testing.T, st Status, _ string) {
				f := st.Failover
				if f == nil {
					t.Fatal("status has no failover state")
				}
				if f.Supported != (pg.Major() >= 17) || !strings.HasPrefix(f.ServerVersion, fmt.Sprintf("%d.", pg.Major())) {
					t.Errorf("failover %+v on PostgreSQL %d", *f, pg.Major())
				}
				if pg.Major() < 17 {
					if len(st.Warnings) != 0 {
						t.Errorf("warnings %q below 17, want none", st.Warnings)
					}
					return
				}
				// pg_create_logical_replication_slot makes no failover slot.
				if f.SlotFailover || f.SlotSynced || f.SynchronizedStandbySlots != "" {
					t.Errorf("failover %+v, want a plain slot and no synchronized_standby_slots", *f)
				}
				if len(st.Warnings) != 1 || !strings.Contains(st.Warnings[0], "is not a failover slot") {
					t.Errorf("warnings %q, want one that the slot is not a failover slot", st.Warnings)
				}
			},
		},
		{
			name: "failover, text",
			check: func(t *testing.T, _ Status, out string) {
				want := regexp.MustCompile(`(?m)^failover +no failover slots on PostgreSQL 1[0-6]\.\d+ \(17\+\): a promotion loses the slot$`)
				if pg.Major() >= 17 {
					want = regexp.MustCompile(`(?m)^failover +failover slot no, synced no, synchronized_standby_slots unset \(PostgreSQL 1\d\.\d+\)$(?s).*^WARNING +replication slot "st_slot" is not a failover slot`)
				}
				if !want.MatchString(out) {
					t.Errorf("output does not match %s:\n%s", want, out)
				}
			},
		},
		{
			name: "unknown publication, json",
			args: []string{"--json", "--publication", "no_such_pub"},
			check: func(t *testing.T, st Status, _ string) {
				// Unknown, and no problem by itself (exit 0).
				if st.OldestUnrelayedAge != nil || !strings.Contains(st.OldestUnrelayedError, "no_such_pub") {
					t.Errorf("oldest unrelayed %v (%q), want unknown for a missing publication", st.OldestUnrelayedAge, st.OldestUnrelayedError)
				}
			},
		},
		{
			name: "oldest unrelayed from the slot, json",
			setup: func(t *testing.T) {
				if err := pg.Exec(ctx, "status_db", "INSERT INTO ob VALUES (1)"); err != nil {
					t.Fatal(err)
				}
				// status connects and decodes after the commit, so the age is > 0.
			},
			args: []string{"--json"},
			check: func(t *testing.T, st Status, _ string) {
				if st.OldestUnrelayedAge == nil || *st.OldestUnrelayedAge <= 0 || *st.OldestUnrelayedAge > 60 || st.OldestUnrelayedSource != "slot" {
					t.Errorf("oldest unrelayed %v from %q (%s), want the insert's age (0 to 60 s) from the slot",
						st.OldestUnrelayedAge, st.OldestUnrelayedSource, st.OldestUnrelayedError)
				}
			},
		},
		{
			name:     "lag above threshold",
			args:     []string{"--max-lag-bytes", "1000"},
			wantCode: statusProblem,
			check: func(t *testing.T, _ Status, out string) {
				if !regexp.MustCompile(`(?m)^PROBLEM +replication slot "st_slot" lags \d+ bytes behind the server's WAL end, more than the limit of 1000 bytes`).MatchString(out) {
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
		{
			name: "no checkpoint, text",
			check: func(t *testing.T, _ Status, out string) {
				wantLines(t, out, `stored checkpoint\s+none`,
					`kafka offsets\s+none stored \(at-least-once delivery, or no checkpoint with offsets yet\)`)
			},
		},
		{
			name:  "checkpoint without offsets, text",
			setup: saveCheckpoint(nil),
			check: func(t *testing.T, _ Status, out string) {
				wantLines(t, out, `stored checkpoint\s+[0-9A-F]+/[0-9A-F]+ \(.* ago, by r\)`,
					`kafka offsets\s+none stored \(at-least-once delivery, or no checkpoint with offsets yet\)`)
			},
		},
		{
			name: "checkpoint without offsets, json",
			args: []string{"--json"},
			check: func(t *testing.T, st Status, out string) {
				if st.Checkpoint == nil || st.Checkpoint.KafkaOffsets != nil || !strings.Contains(out, `"kafka_offsets": null`) {
					t.Errorf("status %+v: want a checkpoint with kafka_offsets null\n%s", st.Checkpoint, out)
				}
			},
		},
		{
			name:  "checkpoint with offsets, text",
			setup: saveCheckpoint(offsets),
			check: func(t *testing.T, _ Status, out string) {
				wantLines(t, out, `kafka offsets\s+orders \(8 partitions, 3 written\): 0=123 1=456 7=9`,
					`kafka offsets\s+payments \(1 partition\): 0=42`)
				if strings.Contains(out, "none stored") {
					t.Errorf("output says none stored:\n%s", out)
				}
			},
		},
		{
			name: "checkpoint with offsets, json",
			args: []string{"--json"},
			check: func(t *testing.T, st Status, out string) {
				if st.Checkpoint == nil || !reflect.DeepEqual(st.Checkpoint.KafkaOffsets, offsets) {
					t.Errorf("kafka_offsets = %+v, want %+v\n%s", st.Checkpoint, offsets, out)
				}
				if want := `"orders": {
        "partitions": 8,
        "next": {
          "0": 123,
          "1": 456,
          "7": 9
        }
      }`; !strings.Contains(out, want) {
					t.Errorf("JSON output lacks\n%s\nin\n%s", want, out)
				}
			},
		},
		{
			name:  "slot health under max_slot_wal_keep_size, json",
			setup: func(t *testing.T) { setKeep("32MB") },
			args:  []string{"--json"},
			check: func(t *testing.T, st Status, out string) {
				if st.WALKeepSizeBytes == nil || *st.WALKeepSizeBytes != 32<<20 || st.SafeWALSizeBytes == nil || *st.SafeWALSizeBytes <= 0 {
					t.Errorf("safe_wal_size %v under max_slot_wal_keep_size %v, want a positive size under 33554432\n%s", st.SafeWALSizeBytes, st.WALKeepSizeBytes, out)
				}
				if (st.Conflicting != nil) != (version >= 160000) || st.InvalidatedReason != "" || len(st.Problems) != 0 {
					t.Errorf("status %+v on server %d: want conflicting reported from 16 on, nothing invalidated, no problem", st, version)
				}
			},
		},
		{
			name: "slot health, text",
			check: func(t *testing.T, _ Status, out string) {
				wantLines(t, out, `safe wal size\s+[0-9.]+ [KM]iB of max_slot_wal_keep_size 32.0 MiB`)
			},
		},
		{
			name:     "slot lost, json",
			setup:    func(t *testing.T) { loseSlot(t, p, "st_slot") },
			args:     []string{"--json"},
			wantCode: statusProblem,
			check: func(t *testing.T, st Status, out string) {
				if st.WALStatus != "lost" || st.InvalidatedReason != "wal_removed" || len(st.Problems) != 1 || !strings.Contains(st.Problems[0], `slot_lost: replication slot "st_slot" is invalidated (wal_status 'lost'`) {
					t.Errorf("status %+v: want a lost slot, invalidated for wal_removed, as the one problem\n%s", st, out)
				}
				if version >= 170000 && st.InvalidationReason != "wal_removed" {
					t.Errorf("invalidation_reason %q on server %d, want wal_removed", st.InvalidationReason, version)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.setup != nil {
				tt.setup(t)
			}
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

// TestOffsetLines: how status prints stored Kafka offsets, one line per topic.
func TestOffsetLines(t *testing.T) {
	many := map[int32]int64{}
	for p := range int32(256) {
		many[p] = int64(p) * 1000
	}
	tests := []struct {
		name string
		in   checkpoint.Offsets
		want []string
	}{
		{"none stored", nil, []string{"none stored (at-least-once delivery, or no checkpoint with offsets yet)"}},
		{"stored empty", checkpoint.Offsets{}, []string{"stored, no records written yet"}},
		{"topics by name, partitions in numeric order", checkpoint.Offsets{
			"payments": {Partitions: 1, Next: map[int32]int64{0: 42}},
			"orders":   {Partitions: 12, Next: map[int32]int64{10: 1, 2: 20, 0: 0, 11: 3, 1: 5, 3: 4, 4: 4, 5: 5, 6: 6, 7: 7, 8: 8, 9: 9}},
		}, []string{
			"orders (12 partitions): 0=0 1=5 2=20 3=4 4=4 5=5 6=6 7=7 8=8 9=9 10=1 11=3",
			"payments (1 partition): 0=42",
		}},
		{"partitions not written", checkpoint.Offsets{
			"orders": {Partitions: 8, Next: map[int32]int64{5: 50}},
			"quiet":  {Partitions: 3},
		}, []string{
			"orders (8 partitions, 1 written): 5=50",
			"quiet (3 partitions, 0 written): no records written",
		}},
		{"many partitions stay one short line", checkpoint.Offsets{"orders": {Partitions: 256, Next: many}}, []string{
			"orders (256 partitions): 0=0 1=1000 2=2000 3=3000 4=4000 5=5000 6=6000 7=7000 8=8000 9=9000 " +
				"10=10000 11=11000 12=12000 13=13000 14=14000 15=15000 … 240 more (--json shows all)",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := offsetLines(tt.in); !slices.Equal(got, tt.want) {
				t.Errorf("offsetLines =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
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
				loseSlot(t, p, "words_lost")
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
			var st Status
			if err := json.Unmarshal(out.Bytes(), &st); err != nil {
				t.Fatalf("status --json output: %v\n%s", err, out.String())
			}
			if !slices.Contains(st.Problems, want) {
				t.Errorf("status problems\n%s\nlack the start-up check's verdict\n%s", strings.Join(st.Problems, "\n"), want)
			}
		})
	}
}

// loseSlot makes Postgres invalidate slot for removed WAL
// (max_slot_wal_keep_size 1MB, and WAL written past it).
func loseSlot(t *testing.T, p *pgxpool.Pool, slot string) {
	t.Helper()
	ctx := t.Context()
	for _, sql := range []string{"ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "SELECT pg_reload_conf()", "CREATE TABLE IF NOT EXISTS lose_wal (v text)"} {
		if _, err := p.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for i := 0; i < 20; i++ {
		var status string
		for _, sql := range []string{"INSERT INTO lose_wal SELECT repeat('x', 1000) FROM generate_series(1, 2000)", "SELECT pg_switch_wal()", "CHECKPOINT"} {
			if _, err := p.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		if err := p.QueryRow(ctx, "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if status == "lost" {
			return
		}
	}
	t.Fatalf("slot %s was not lost after 20 WAL switches and checkpoints", slot)
}
