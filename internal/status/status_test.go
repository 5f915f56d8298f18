package status

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestRead reads a real slot: healthy, lagging past the threshold, missing,
// with and without a stored checkpoint, under a WAL limit, lost; each case
// checks the report as its JSON reads back and as text.
func TestRead(t *testing.T) {
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
	p := pool(t, url)
	ckStore := checkpoint.NewTableStore(p, "")
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
			if err := p.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'st_slot'").Scan(&lsn); err != nil {
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
	var version int
	if err := p.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		t.Fatal(err)
	}
	// setKeep sets max_slot_wal_keep_size and waits until a new connection,
	// as Read's, has it (the reload is asynchronous).
	setKeep := func(t *testing.T, size string) {
		t.Helper()
		for _, sql := range []string{"ALTER SYSTEM SET max_slot_wal_keep_size = '" + size + "'", "SELECT pg_reload_conf()"} {
			if _, err := p.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		testenv.Eventually(t, 30*time.Second, func() error {
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			var got string
			if err := conn.QueryRow(ctx, "SHOW max_slot_wal_keep_size").Scan(&got); err != nil {
				return err
			}
			if got != size {
				return fmt.Errorf("max_slot_wal_keep_size is %s, want %s", got, size)
			}
			return nil
		})
	}
	// The command's defaults.
	base := Config{Slot: "st_slot", Publication: "cdc_relay_outbox", MaxLagBytes: 1 << 30,
		Tables: []decoder.TableName{{Schema: "public", Table: "outbox_events"}}}
	tests := []struct {
		name        string
		setup       func(t *testing.T) // runs before Read, in the order of the cases
		cfg         func(c *Config)
		wantProblem bool
		// check gets the report as its JSON reads back, its JSON and its text.
		check func(t *testing.T, r Report, js, text string)
	}{
		{
			name: "healthy",
			check: func(t *testing.T, r Report, _, _ string) {
				if !r.SlotExists || r.WALStatus != "reserved" || r.LagBytes <= 0 || r.RetainedWALBytes <= 0 || r.Active {
					t.Errorf("status %+v: want an existing, inactive, reserved slot with some lag", r)
				}
				// Table w's rows are not the outbox's.
				if r.OldestUnrelayedAge == nil || *r.OldestUnrelayedAge != 0 || r.OldestUnrelayedSource != "slot" {
					t.Errorf("oldest unrelayed %v from %q (%s), want 0 from the slot", r.OldestUnrelayedAge, r.OldestUnrelayedSource, r.OldestUnrelayedError)
				}
			},
		},
		{
			name: "failover",
			check: func(t *testing.T, r Report, _, text string) {
				f := r.Failover
				if f == nil {
					t.Fatal("status has no failover state")
				}
				if f.Supported != (pg.Major() >= 17) || !strings.HasPrefix(f.ServerVersion, fmt.Sprintf("%d.", pg.Major())) {
					t.Errorf("failover %+v on PostgreSQL %d", *f, pg.Major())
				}
				want := regexp.MustCompile(`(?m)^failover +no failover slots on PostgreSQL 1[0-6]\.\d+ \(17\+\): a promotion loses the slot$`)
				if pg.Major() >= 17 {
					want = regexp.MustCompile(`(?m)^failover +failover slot no, synced no, synchronized_standby_slots unset \(PostgreSQL 1\d\.\d+\)$(?s).*^WARNING +replication slot "st_slot" is not a failover slot`)
				}
				if !want.MatchString(text) {
					t.Errorf("text does not match %s:\n%s", want, text)
				}
				if pg.Major() < 17 {
					if len(r.Warnings) != 0 {
						t.Errorf("warnings %q below 17, want none", r.Warnings)
					}
					return
				}
				// pg_create_logical_replication_slot makes no failover slot.
				if f.SlotFailover || f.SlotSynced || f.SynchronizedStandbySlots != "" {
					t.Errorf("failover %+v, want a plain slot and no synchronized_standby_slots", *f)
				}
				if len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "is not a failover slot") {
					t.Errorf("warnings %q, want one that the slot is not a failover slot", r.Warnings)
				}
			},
		},
		{
			name: "unknown publication",
			cfg:  func(c *Config) { c.Publication = "no_such_pub" },
			check: func(t *testing.T, r Report, _, text string) {
				// Unknown, and no problem by itself.
				if r.OldestUnrelayedAge != nil || !strings.Contains(r.OldestUnrelayedError, "no_such_pub") {
					t.Errorf("oldest unrelayed %v (%q), want unknown for a missing publication", r.OldestUnrelayedAge, r.OldestUnrelayedError)
				}
				wantLines(t, text, `oldest unrelayed\s+unknown: .*no_such_pub.*`)
			},
		},
		{
			name: "oldest unrelayed from the slot",
			setup: func(t *testing.T) {
				if err := pg.Exec(ctx, "status_db", "INSERT INTO ob VALUES (1)"); err != nil {
					t.Fatal(err)
				}
				// status connects and decodes after the commit, so the age is > 0.
			},
			check: func(t *testing.T, r Report, _, text string) {
				if r.OldestUnrelayedAge == nil || *r.OldestUnrelayedAge <= 0 || *r.OldestUnrelayedAge > 60 || r.OldestUnrelayedSource != "slot" {
					t.Errorf("oldest unrelayed %v from %q (%s), want the insert's age (0 to 60 s) from the slot",
						r.OldestUnrelayedAge, r.OldestUnrelayedSource, r.OldestUnrelayedError)
				}
				wantLines(t, text, `oldest unrelayed\s+[0-9.]+m?s \(from the slot\)`)
			},
		},
		{
			name:        "lag above threshold",
			cfg:         func(c *Config) { c.MaxLagBytes = 1000 },
			wantProblem: true,
			check: func(t *testing.T, _ Report, _, text string) {
				if !regexp.MustCompile(`(?m)^PROBLEM +replication slot "st_slot" lags \d+ bytes behind the server's WAL end, more than the limit of 1000 bytes`).MatchString(text) {
					t.Errorf("text lacks the lag problem:\n%s", text)
				}
			},
		},
		{
			name:        "slot missing",
			cfg:         func(c *Config) { c.Slot = "no_such_slot" },
			wantProblem: true,
			check: func(t *testing.T, r Report, _, text string) {
				if r.SlotExists || len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "does not exist") {
					t.Errorf("status %+v: want a missing-slot problem", r)
				}
				wantLines(t, text, `exists\s+no`)
			},
		},
		{
			name: "no checkpoint",
			check: func(t *testing.T, r Report, _, text string) {
				if r.Checkpoint != nil {
					t.Errorf("checkpoint %+v, want none", r.Checkpoint)
				}
				wantLines(t, text, `stored checkpoint\s+none`,
					`kafka offsets\s+none stored \(at-least-once delivery, or no checkpoint with offsets yet\)`)
			},
		},
		{
			name:  "checkpoint without offsets",
			setup: saveCheckpoint(nil),
			check: func(t *testing.T, r Report, js, text string) {
				if r.Checkpoint == nil || r.Checkpoint.KafkaOffsets != nil || !strings.Contains(js, `"kafka_offsets": null`) {
					t.Errorf("status %+v: want a checkpoint with kafka_offsets null\n%s", r.Checkpoint, js)
				}
				wantLines(t, text, `stored checkpoint\s+[0-9A-F]+/[0-9A-F]+ \(.* ago, by r\)`,
					`kafka offsets\s+none stored \(at-least-once delivery, or no checkpoint with offsets yet\)`)
			},
		},
		{
			name:  "checkpoint with offsets",
			setup: saveCheckpoint(offsets),
			check: func(t *testing.T, r Report, js, text string) {
				if r.Checkpoint == nil || !reflect.DeepEqual(r.Checkpoint.KafkaOffsets, offsets) {
					t.Errorf("kafka_offsets = %+v, want %+v\n%s", r.Checkpoint, offsets, js)
				}
				if want := `"orders": {
        "partitions": 8,
        "next": {
          "0": 123,
          "1": 456,
          "7": 9
        }
      }`; !strings.Contains(js, want) {
					t.Errorf("JSON lacks\n%s\nin\n%s", want, js)
				}
				wantLines(t, text, `kafka offsets\s+orders \(8 partitions, 3 written\): 0=123 1=456 7=9`,
					`kafka offsets\s+payments \(1 partition\): 0=42`)
				if strings.Contains(text, "none stored") {
					t.Errorf("text says none stored:\n%s", text)
				}
			},
		},
		{
			name:  "slot health under max_slot_wal_keep_size",
			setup: func(t *testing.T) { setKeep(t, "32MB") },
			check: func(t *testing.T, r Report, js, text string) {
				if r.WALKeepSizeBytes == nil || *r.WALKeepSizeBytes != 32<<20 || r.SafeWALSizeBytes == nil || *r.SafeWALSizeBytes <= 0 {
					t.Errorf("safe_wal_size %v under max_slot_wal_keep_size %v, want a positive size under 33554432\n%s", r.SafeWALSizeBytes, r.WALKeepSizeBytes, js)
				}
				if (r.Conflicting != nil) != (version >= 160000) || r.InvalidatedReason != "" || len(r.Problems) != 0 {
					t.Errorf("status %+v on server %d: want conflicting reported from 16 on, nothing invalidated, no problem", r, version)
				}
				wantLines(t, text, `safe wal size\s+[0-9.]+ [KM]iB of max_slot_wal_keep_size 32.0 MiB`)
			},
		},
		{
			name:        "slot lost",
			setup:       func(t *testing.T) { testenv.LoseSlot(t, p, "st_slot") },
			wantProblem: true,
			check: func(t *testing.T, r Report, js, text string) {
				if r.WALStatus != "lost" || r.InvalidatedReason != "wal_removed" || len(r.Problems) != 1 || !strings.Contains(r.Problems[0], `slot_lost: replication slot "st_slot" is invalidated (wal_status 'lost'`) {
					t.Errorf("status %+v: want a lost slot, invalidated for wal_removed, as the one problem\n%s", r, js)
				}
				if version >= 170000 && r.InvalidationReason != "wal_removed" {
					t.Errorf("invalidation_reason %q on server %d, want wal_removed", r.InvalidationReason, version)
				}
				wantLines(t, text, `invalidated\s+wal_removed`)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.setup != nil {
				tt.setup(t)
			}
			cfg := base
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			// A new pool, as each status command opens.
			read, err := Read(ctx, pool(t, url), cfg)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if got := read.Err() != nil; got != tt.wantProblem {
				t.Fatalf("problem %v (%v), want %t", got, read.Err(), tt.wantProblem)
			}
			var js, text bytes.Buffer
			if err := WriteJSON(&js, read); err != nil {
				t.Fatal(err)
			}
			if err := WriteText(&text, read, "--json shows all"); err != nil {
				t.Fatal(err)
			}
			var r Report
			if err := json.Unmarshal(js.Bytes(), &r); err != nil {
				t.Fatalf("status JSON: %v\n%s", err, js.String())
			}
			tt.check(t, r, js.String(), text.String())
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
