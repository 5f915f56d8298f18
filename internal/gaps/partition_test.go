package gaps_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// TestCheckerPartitioned: the coverage checks of a partitioned outbox table
// accept a publication of the root (through it or under the partitions'
// names) and one listing every partition, and are loud, at start and while
// streaming, about a partition the publication does not stream.
func TestCheckerPartitioned(t *testing.T) {
	e := newPGEnv(t)
	tests := []struct {
		name string
		// pub is the publication's definition (after CREATE PUBLICATION <name>).
		pub string
		// change is run between the first and the second watch round.
		change    string
		wantStart string   // fatal check at start; "" for none
		wantWatch string   // fatal check of the second watch round; "" for none
		wantWarn  bool     // the start-up warning about partitions listed one by one
		want      []string // substrings of the error
		minMajor  int      // the oldest PostgreSQL major with this publication's syntax; 0 for any
	}{
		{
			name:   "through the root, partitions created and detached",
			pub:    "FOR TABLE p.outbox_events WITH (publish_via_partition_root = true)",
			change: "CREATE TABLE p.outbox_2026 PARTITION OF p.outbox_events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01'); ALTER TABLE p.outbox_events DETACH PARTITION p.outbox_2024",
		},
		{
			name:   "root under the partitions' names, a table attached",
			pub:    "FOR TABLE p.outbox_events",
			change: "CREATE TABLE p.attached (LIKE p.outbox_events); ALTER TABLE p.outbox_events ATTACH PARTITION p.attached FOR VALUES FROM ('2030-01-01') TO ('2031-01-01')",
		},
		{name: "all tables", pub: "FOR ALL TABLES"},
		{
			name:     "the schema",
			pub:      "FOR TABLES IN SCHEMA p",
			minMajor: 15, // FOR TABLES IN SCHEMA is new in 15
			change:   "CREATE TABLE p.outbox_2026 PARTITION OF p.outbox_events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')",
		},
		{
			name:      "every partition listed, one created later",
			pub:       "FOR TABLE p.outbox_2024, p.outbox_2025, p.outbox_default",
			change:    "CREATE TABLE p.outbox_2026 PARTITION OF p.outbox_events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')",
			wantWatch: gaps.CheckTableCovered,
			wantWarn:  true,
			want:      []string{"does not cover partitions p.outbox_2026 of the partitioned outbox table", `ADD TABLE "p"."outbox_events";`, "(command replay since="},
		},
		{
			name:      "the default partition not listed",
			pub:       "FOR TABLE p.outbox_2024, p.outbox_2025",
			wantStart: gaps.CheckTableCovered,
			want:      []string{"does not cover partitions p.outbox_default of the partitioned outbox table", `ADD TABLE "p"."outbox_events";`},
		},
		{
			name:      "another table only",
			pub:       "FOR TABLE other",
			wantStart: gaps.CheckTableCovered,
			want:      []string{"does not cover partitions p.outbox_2024, p.outbox_2025, p.outbox_default of"},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if e.pg.Major() < tt.minMajor {
				t.Skipf("PostgreSQL %d has no %q (new in %d)", e.pg.Major(), tt.pub, tt.minMajor)
			}
			e.exec(t, e.poolA, `DROP SCHEMA IF EXISTS p CASCADE; CREATE SCHEMA p;
				CREATE TABLE p.outbox_events (id uuid NOT NULL DEFAULT gen_random_uuid(), aggregate_id text, payload jsonb, created_at timestamptz NOT NULL DEFAULT now()) PARTITION BY RANGE (created_at);
				CREATE TABLE p.outbox_2024 PARTITION OF p.outbox_events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
				CREATE TABLE p.outbox_2025 PARTITION OF p.outbox_events FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
				CREATE TABLE p.outbox_default PARTITION OF p.outbox_events DEFAULT`)
			pub := "part_pub_" + string(rune('a'+i))
			e.exec(t, e.poolA, "CREATE PUBLICATION "+pub+" "+tt.pub)
			t.Cleanup(func() { _, _ = e.poolA.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+pub) })
			setup := replication.SetupConfig{Slot: "no_such_slot", Publication: pub, Schema: "p", Table: "outbox_events"}
			c, m, logs := newChecker(setup)
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
			if warned := strings.Contains(logs.String(), "lists the partitions of the outbox table"); warned != tt.wantWarn {
				t.Errorf("warned about partitions listed one by one: %v, want %v; logs:\n%s", warned, tt.wantWarn, logs)
			}
			if err := c.Watch(t.Context(), e.poolA); err != nil {
				t.Fatalf("first watch round: %v", err)
			}
			if tt.change != "" {
				e.exec(t, e.poolA, tt.change)
			}
			err = c.Watch(t.Context(), e.poolA)
			if tt.wantWatch == "" {
				if err != nil {
					t.Fatalf("second watch round: %v", err)
				}
				return
			}
			if err == nil || !errors.As(err, new(*replication.ConfigError)) {
				t.Fatalf("second watch round = %v, want a *replication.ConfigError", err)
			}
			if got := testutil.ToFloat64(m.SlotProblems.WithLabelValues(tt.wantWatch)); got != 1 {
				t.Errorf("slot_problems_total{kind=%s} = %v, want 1", tt.wantWatch, got)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestPartitionMembership: replication.ReadMembership, which the relay's
// decoder asks about each relation announced under another name than the
// outbox table's, against the catalog as Postgres holds it.
func TestPartitionMembership(t *testing.T) {
	e := newPGEnv(t)
	e.exec(t, e.poolA, `CREATE SCHEMA m;
		CREATE TABLE m.outbox_events (id uuid NOT NULL, aggregate_id text, payload jsonb, created_at timestamptz NOT NULL) PARTITION BY RANGE (created_at);
		CREATE TABLE m.sub PARTITION OF m.outbox_events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01') PARTITION BY RANGE (created_at);
		CREATE TABLE m.leaf PARTITION OF m.sub FOR VALUES FROM ('2024-01-01') TO ('2024-07-01');
		CREATE TABLE m.other_default PARTITION OF m.outbox_events DEFAULT;
		CREATE TABLE m.detached PARTITION OF m.outbox_events FOR VALUES FROM ('2023-01-01') TO ('2024-01-01');
		CREATE TABLE m.detached_listed PARTITION OF m.outbox_events FOR VALUES FROM ('2022-01-01') TO ('2023-01-01');
		CREATE TABLE m.dropped PARTITION OF m.outbox_events FOR VALUES FROM ('2021-01-01') TO ('2022-01-01');
		CREATE TABLE m.unrelated (id int);
		CREATE TABLE m.twin (created_at timestamptz NOT NULL, payload jsonb, aggregate_id text, id uuid NOT NULL);
		CREATE TABLE m.wider (LIKE m.outbox_events, note text);
		CREATE TABLE m.retyped (id text, aggregate_id text, payload jsonb, created_at timestamptz);
		CREATE PUBLICATION member_pub FOR TABLE m.outbox_events, m.unrelated, m.detached_listed, m.twin, m.wider, m.retyped`)
	oid := func(name string) uint32 {
		var o uint32
		if err := e.poolA.QueryRow(t.Context(), "SELECT $1::regclass::oid", name).Scan(&o); err != nil {
			t.Fatal(err)
		}
		return o
	}
	oids := map[string]uint32{}
	for _, n := range []string{"m.sub", "m.leaf", "m.other_default", "m.detached", "m.detached_listed", "m.dropped", "m.unrelated", "m.twin", "m.wider", "m.retyped"} {
		oids[n] = oid(n)
	}
	setup := replication.SetupConfig{Publication: "member_pub", Schema: "m", Table: "outbox_events"}
	// replication.ReadPartitions: what the decoder remembers of each
	// partition, every level, before some are detached or dropped.
	partitions := func(names ...string) {
		t.Helper()
		got, err := replication.ReadPartitions(t.Context(), e.poolA, setup)
		if err != nil {
			t.Fatal(err)
		}
		want := map[uint32]decoder.TableName{}
		for _, n := range names {
			want[oids[n]] = decoder.TableName{Schema: "m", Table: "outbox_events"}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("ReadPartitions = %v, want %v (%v)", got, want, names)
		}
	}
	partitions("m.sub", "m.leaf", "m.other_default", "m.detached", "m.detached_listed", "m.dropped")
	e.exec(t, e.poolA, `ALTER TABLE m.outbox_events DETACH PARTITION m.detached;
		ALTER TABLE m.outbox_events DETACH PARTITION m.detached_listed;
		DROP TABLE m.dropped`)
	partitions("m.sub", "m.leaf", "m.other_default")
	want := map[string]decoder.Member{
		"m.sub":             decoder.IsMember,
		"m.leaf":            decoder.IsMember, // a partition of a partition
		"m.other_default":   decoder.IsMember,
		"m.detached":        decoder.FormerMember, // nothing publishes it now: its streamed changes predate the detach
		"m.detached_listed": decoder.Lookalike,    // published on its own, with the table's columns: maybe a partition once
		"m.dropped":         decoder.FormerMember,
		"m.unrelated":       decoder.NotMember,
		"m.twin":            decoder.Lookalike, // the table's columns in another order: the catalog cannot tell it from a detached partition
		"m.wider":           decoder.NotMember, // one column more than the table: never its partition as it is
		"m.retyped":         decoder.NotMember, // a column of another type
	}
	for name, w := range want {
		schema, table, _ := strings.Cut(name, ".")
		got, parent, err := replication.ReadMembership(t.Context(), e.poolA, setup, decoder.Relation{ID: oids[name], Namespace: schema, Name: table})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got != w {
			t.Errorf("ReadMembership(%s) = %v, want %v", name, got, w)
		}
		if wantParent := (decoder.TableName{Schema: "m", Table: "outbox_events"}); (got == decoder.IsMember || got == decoder.Lookalike) && parent != wantParent {
			t.Errorf("ReadMembership(%s) names parent %v, want %v", name, parent, wantParent)
		}
	}
}
