package checkpoint

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"
)

// TestOpening follows the checkpoints of a start-up through an Opening: the
// snapshot marker, the position stored after the snapshot, where streaming
// starts, and the Committer that continues from it.
func TestOpening(t *testing.T) {
	ctx := context.Background()
	store := NewFileStore(filepath.Join(t.TempDir(), "cp.json"))
	base := Checkpoint{Slot: "s", SystemID: "sys1", RelayName: "r", LSN: 0x99, Offsets: Offsets{}} // LSN, Offsets ignored
	op, err := Open(ctx, store, base)
	if err != nil {
		t.Fatal(err)
	}
	if _, have := op.Stored(); have || op.SnapshotPending() {
		t.Fatalf("empty store: have %v, snapshot pending %v", have, op.SnapshotPending())
	}

	// The marker: LSN 0/0 with the slot, system and relay; pending on this
	// system only.
	if err := op.MarkSnapshot(ctx); err != nil {
		t.Fatal(err)
	}
	got, have, err := store.Load(ctx, "s")
	if err != nil || !have {
		t.Fatalf("Load after MarkSnapshot = %v, %v", have, err)
	}
	if got.LSN != 0 || got.SystemID != "sys1" || got.RelayName != "r" || got.Offsets != nil || got.UpdatedAt.IsZero() {
		t.Errorf("marker = %+v, want LSN 0 of sys1 by r, no offsets, a save time", got)
	}
	if !op.SnapshotPending() {
		t.Error("SnapshotPending after MarkSnapshot = false")
	}
	reopened, err := Open(ctx, store, Checkpoint{Slot: "s", SystemID: "sys1"})
	if err != nil {
		t.Fatal(err)
	}
	if !reopened.SnapshotPending() {
		t.Error("a new Opening does not see the marker")
	}
	other, err := Open(ctx, store, Checkpoint{Slot: "s", SystemID: "sys2"})
	if err != nil {
		t.Fatal(err)
	}
	if other.SnapshotPending() {
		t.Error("the marker of another system counts as pending here")
	}

	// The consistent point, once the snapshot is acknowledged.
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	point := pglogrepl.LSN(0x5000)
	if err := op.Reposition(ctx, point, at, Offsets{}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ = store.Load(ctx, "s"); got.LSN != point || !got.CommitTime.Equal(at) || got.Offsets == nil {
		t.Errorf("after Reposition = %+v, want LSN %s, commit time %s, empty offsets", got, point, at)
	}
	if op.SnapshotPending() {
		t.Error("SnapshotPending after Reposition = true")
	}

	// Streaming starts at the later of the slot's and the store's positions.
	for _, tt := range []struct{ confirmed, want pglogrepl.LSN }{
		{0x4000, point}, // the store is ahead: Kafka has acknowledged up to it
		{point, point},
		{0x6000, 0x6000},
	} {
		if got := op.StartFrom(tt.confirmed); got != tt.want {
			t.Errorf("StartFrom(%s) = %s, want %s", tt.confirmed, got, tt.want)
		}
	}

	// The Committer continues from the start with the stored commit time, and
	// writes to the same store.
	ck := op.Committer(point, CommitterConfig{Every: time.Hour, Idle: time.Hour, Logger: zerolog.Nop()})
	if ck.Flushed() != point {
		t.Errorf("Committer Flushed = %s, want %s", ck.Flushed(), point)
	}
	if err := ck.Persist(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _, _ = store.Load(ctx, "s"); got.LSN != point || !got.CommitTime.Equal(at) || got.SystemID != "sys1" || got.RelayName != "r" {
		t.Errorf("Committer's save = %+v, want LSN %s, commit time %s of sys1 by r", got, point, at)
	}
}

// TestOpeningSaveTables: SaveTables stores the stored checkpoint again, at
// its position, with the tables the relay reads now, only when they differ;
// it leaves a missing checkpoint and a snapshot marker alone.
func TestOpeningSaveTables(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	stored := Checkpoint{Slot: "s", SystemID: "sys1", RelayName: "old", LSN: 0x5000, CommitTime: at, UpdatedAt: at,
		Offsets: Offsets{"t": {Partitions: 1, Next: map[int32]int64{0: 3}}}, Tables: []string{"public.outbox_events"}}
	tests := []struct {
		name       string
		stored     *Checkpoint
		tables     []string
		wantSaved  bool
		wantTables []string
	}{
		{name: "a table joined", stored: &stored, tables: []string{"public.outbox_events", "billing.outbox_events"},
			wantSaved: true, wantTables: []string{"public.outbox_events", "billing.outbox_events"}},
		{name: "the same tables", stored: &stored, tables: []string{"public.outbox_events"}, wantTables: []string{"public.outbox_events"}},
		{name: "no checkpoint", tables: []string{"public.outbox_events"}},
		{name: "snapshot marker", stored: &Checkpoint{Slot: "s", SystemID: "sys1", UpdatedAt: at}, tables: []string{"public.outbox_events"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := NewFileStore(filepath.Join(t.TempDir(), "cp.json"))
			if tt.stored != nil {
				if err := store.Save(ctx, *tt.stored); err != nil {
					t.Fatal(err)
				}
			}
			op, err := Open(ctx, store, Checkpoint{Slot: "s", SystemID: "sys1", RelayName: "new", Tables: tt.tables})
			if err != nil {
				t.Fatal(err)
			}
			if err := op.SaveTables(ctx); err != nil {
				t.Fatal(err)
			}
			got, have, err := store.Load(ctx, "s")
			if err != nil {
				t.Fatal(err)
			}
			if !have {
				if tt.stored != nil || tt.wantSaved {
					t.Fatal("no checkpoint after SaveTables")
				}
				return
			}
			if saved := got.RelayName == "new"; saved != tt.wantSaved {
				t.Fatalf("saved %v (%+v), want %v", saved, got, tt.wantSaved)
			}
			if got.LSN != tt.stored.LSN || !got.CommitTime.Equal(tt.stored.CommitTime) || len(got.Offsets) != len(tt.stored.Offsets) {
				t.Errorf("checkpoint %+v, want the stored position %s, commit time and offsets kept", got, tt.stored.LSN)
			}
			if tt.stored.LSN != 0 && !slices.Equal(got.Tables, tt.wantTables) {
				t.Errorf("tables %q, want %q", got.Tables, tt.wantTables)
			}
			if cp, _ := op.Stored(); !slices.Equal(cp.Tables, got.Tables) {
				t.Errorf("Stored().Tables %q, want what the store holds, %q", cp.Tables, got.Tables)
			}
		})
	}
}

// TestOpeningCoverTables: after CoverTables, the stored checkpoint and every
// save before the position the publication was read at name the tables read,
// joined, or published and named by the stored checkpoint; saves from that
// position on name every published table. So a table that left the relay's
// list stays named while the publication keeps it, and one added to the
// publication by hand is never named at a position before the change.
func TestOpeningCoverTables(t *testing.T) {
	ctx := context.Background()
	const read = 0x6000 // where the publication was read
	stored := func(tables []string) *Checkpoint {
		return &Checkpoint{Slot: "s", SystemID: "sys1", RelayName: "old", LSN: 0x5000, UpdatedAt: time.Now(), Tables: tables}
	}
	tests := []struct {
		name                 string
		stored               *Checkpoint
		published            []string
		joined, reads        []string
		wantStored, wantThen []string // at the stored position, and at read
	}{
		{
			name:   "a table left the relay's list, the publication kept it; another was added by hand",
			stored: stored([]string{"public.outbox_b", "public.outbox_events"}), published: []string{"public.by_hand", "public.outbox_b", "public.outbox_events"},
			reads:      []string{"public.outbox_events"},
			wantStored: []string{"public.outbox_b", "public.outbox_events"}, wantThen: []string{"public.by_hand", "public.outbox_b", "public.outbox_events"},
		},
		{
			name:   "it comes back",
			stored: stored([]string{"public.outbox_b", "public.outbox_events"}), published: []string{"public.outbox_b", "public.outbox_events"},
			reads:      []string{"public.outbox_events", "public.outbox_b"},
			wantStored: []string{"public.outbox_b", "public.outbox_events"}, wantThen: []string{"public.outbox_b", "public.outbox_events"},
		},
		{
			name:   "a table left the publication",
			stored: stored([]string{"public.outbox_b", "public.outbox_events"}), published: []string{"public.outbox_events"},
			reads:      []string{"public.outbox_events"},
			wantStored: []string{"public.outbox_events"}, wantThen: []string{"public.outbox_events"},
		},
		{
			name:   "a table joined by the relay",
			stored: stored([]string{"public.outbox_events"}), published: []string{"billing.outbox_events", "public.outbox_events"},
			joined: []string{"billing.outbox_events"}, reads: []string{"public.outbox_events", "billing.outbox_events"},
			wantStored: []string{"billing.outbox_events", "public.outbox_events"}, wantThen: []string{"billing.outbox_events", "public.outbox_events"},
		},
		{
			name:   "an older checkpoint names none: the tables read",
			stored: stored(nil), published: []string{"public.by_hand", "public.outbox_events"},
			reads:      []string{"public.outbox_events"},
			wantStored: []string{"public.outbox_events"}, wantThen: []string{"public.by_hand", "public.outbox_events"},
		},
		{
			name:   "a partition read, published by its root",
			stored: stored([]string{"public.outbox_p_1"}), published: []string{"public.outbox_p"},
			reads:      []string{"public.outbox_p_1"},
			wantStored: []string{"public.outbox_p_1"}, wantThen: []string{"public.outbox_p", "public.outbox_p_1"},
		},
		{
			name: "no checkpoint", published: []string{"public.by_hand", "public.outbox_events"},
			reads:    []string{"public.outbox_events"},
			wantThen: []string{"public.by_hand", "public.outbox_events"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := NewFileStore(filepath.Join(t.TempDir(), "cp.json"))
			if tt.stored != nil {
				if err := store.Save(ctx, *tt.stored); err != nil {
					t.Fatal(err)
				}
			}
			op, err := Open(ctx, store, Checkpoint{Slot: "s", SystemID: "sys1", RelayName: "new", Tables: tt.reads})
			if err != nil {
				t.Fatal(err)
			}
			op.CoverTables(tt.published, read, tt.joined, tt.reads)
			if err := op.SaveTables(ctx); err != nil {
				t.Fatal(err)
			}
			load := func() Checkpoint {
				t.Helper()
				got, _, err := store.Load(ctx, "s")
				if err != nil {
					t.Fatal(err)
				}
				return got
			}
			if tt.stored != nil {
				if got := load(); got.LSN != tt.stored.LSN || !slices.Equal(got.Tables, tt.wantStored) {
					t.Errorf("stored checkpoint at %s names %q, want %s naming %q", got.LSN, got.Tables, tt.stored.LSN, tt.wantStored)
				}
			}
			c := op.Committer(op.StartFrom(0x5000), CommitterConfig{})
			tr := c.Tracker()
			for _, tc := range []struct {
				end  pglogrepl.LSN
				want []string
			}{{read - 0x10, tt.reads}, {read, tt.wantThen}} {
				if tt.stored != nil && tc.end < read {
					tc.want = tt.wantStored
				}
				seq := tr.Begin()
				tr.Commit(seq, tc.end, time.Now())
				if _, err := c.Save(ctx); err != nil {
					t.Fatal(err)
				}
				if got := load(); got.LSN != tc.end || !slices.Equal(got.Tables, tc.want) {
					t.Errorf("save at %s names %q (at %s), want %q", tc.end, got.Tables, got.LSN, tc.want)
				}
			}
		})
	}
}
