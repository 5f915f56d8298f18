package checkpoint

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// joinStore is a store that keeps joins in progress.
type joinStore interface {
	store
	JoinStore
}

// testJoinStoreContract: RecordJoin inserts a checkpoint when there is none
// and otherwise adds the tables to a known list and the join to those in
// progress; Save leaves them; SaveJoins replaces them. begin runs fn in a
// transaction of the store's database (nil for a FileStore) and commits it
// when fn returns nil.
func testJoinStoreContract(t *testing.T, s joinStore, begin func(ctx context.Context, fn func(tx pgx.Tx) error) error) {
	ctx := t.Context()
	at := time.Date(2024, 5, 17, 10, 30, 0, 0, time.UTC)
	j1 := Join{Tables: []string{"public.b"}, Snapshot: "100:105:101,103", Mode: "all"}
	j2 := Join{Tables: []string{"public.c"}, Snapshot: "200:200:", Mode: "after-checkpoint", CommittedSince: at,
		After: map[string]string{"public.c": "pos"}}
	record := func(cp Checkpoint) {
		t.Helper()
		if err := begin(ctx, func(tx pgx.Tx) error { return s.RecordJoin(ctx, tx, cp) }); err != nil {
			t.Fatalf("RecordJoin: %v", err)
		}
	}
	load := func(slot string) Checkpoint {
		t.Helper()
		c, ok, err := s.Load(ctx, slot)
		if err != nil || !ok {
			t.Fatalf("Load(%q) = %v, %v", slot, ok, err)
		}
		return c
	}
	joinsEqual := func(got, want []Join) bool {
		if len(got) != len(want) {
			return false
		}
		for i := range got {
			g, w := got[i], want[i]
			if !g.CommittedSince.Equal(w.CommittedSince) {
				return false
			}
			g.CommittedSince, w.CommittedSince = time.Time{}, time.Time{}
			if !reflect.DeepEqual(g, w) {
				return false
			}
		}
		return true
	}

	// No checkpoint: one is inserted at the given position, tables unknown.
	record(Checkpoint{Slot: "new", SystemID: "7", LSN: 0x500, RelayName: "r", Tables: []string{"public.b"}, Joins: []Join{j1}})
	if c := load("new"); c.LSN != 0x500 || c.SystemID != "7" || c.Tables != nil || !joinsEqual(c.Joins, []Join{j1}) {
		t.Errorf("after RecordJoin on no checkpoint: %+v", c)
	}

	mustSave(t, ctx, s, Checkpoint{Slot: "s", SystemID: "7", LSN: 0x100, UpdatedAt: at, RelayName: "r", Tables: []string{"public.a"}})
	record(Checkpoint{Slot: "s", Tables: []string{"public.b"}, Joins: []Join{j1}})
	c := load("s")
	if c.LSN != 0x100 || !reflect.DeepEqual(c.Tables, []string{"public.a", "public.b"}) || !joinsEqual(c.Joins, []Join{j1}) {
		t.Errorf("after RecordJoin: %+v", c)
	}
	// The Committer's saves leave the joins.
	mustSave(t, ctx, s, Checkpoint{Slot: "s", SystemID: "7", LSN: 0x200, UpdatedAt: at, RelayName: "r", Tables: c.Tables})
	record(Checkpoint{Slot: "s", Tables: []string{"public.c"}, Joins: []Join{j2}})
	if c := load("s"); c.LSN != 0x200 || !joinsEqual(c.Joins, []Join{j1, j2}) || len(c.Tables) != 3 {
		t.Errorf("after Save and a second RecordJoin: %+v", c)
	}
	if err := s.SaveJoins(ctx, "s", []Join{j2}); err != nil {
		t.Fatal(err)
	}
	if c := load("s"); !joinsEqual(c.Joins, []Join{j2}) {
		t.Errorf("after SaveJoins: %+v", c.Joins)
	}
	if err := s.SaveJoins(ctx, "s", nil); err != nil {
		t.Fatal(err)
	}
	if c := load("s"); c.Joins != nil || c.LSN != 0x200 {
		t.Errorf("after SaveJoins(nil): %+v", c)
	}
}

func TestFileStoreJoins(t *testing.T) {
	s := NewFileStore(filepath.Join(t.TempDir(), "checkpoints.json"))
	testJoinStoreContract(t, s, func(_ context.Context, fn func(tx pgx.Tx) error) error { return fn(nil) })

	// The file is written before the change commits: a change that failed
	// leaves a join the next start's join of the same table replaces.
	ctx := t.Context()
	failed := Join{Tables: []string{"public.e"}, Snapshot: "300:300:", Mode: "all"}
	again := Join{Tables: []string{"public.e"}, Snapshot: "310:310:", Mode: "all"}
	for _, j := range []Join{failed, again} {
		if err := s.RecordJoin(ctx, nil, Checkpoint{Slot: "s", Tables: j.Tables, Joins: []Join{j}}); err != nil {
			t.Fatal(err)
		}
	}
	if c, _, err := s.Load(ctx, "s"); err != nil || len(c.Joins) != 1 || c.Joins[0].Snapshot != again.Snapshot {
		t.Errorf("after a join of the same table again: %+v, %v", c.Joins, err)
	}
}

func TestTableStoreJoins(t *testing.T) {
	_, dbURL := newTestDB(t)
	pool := newPool(t, dbURL)
	s := NewTableStore(pool, "public.ckpt_joins")
	if err := s.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	begin := func(ctx context.Context, fn func(tx pgx.Tx) error) error { return pgx.BeginFunc(ctx, pool, fn) }
	testJoinStoreContract(t, s, begin)

	// A transaction that rolls back records nothing: the join commits with
	// the publication's change or not at all.
	ctx := t.Context()
	abort := errors.New("the change failed")
	err := begin(ctx, func(tx pgx.Tx) error {
		if err := s.RecordJoin(ctx, tx, Checkpoint{Slot: "s", Tables: []string{"public.d"}, Joins: []Join{{Tables: []string{"public.d"}}}}); err != nil {
			return err
		}
		return abort
	})
	if !errors.Is(err, abort) {
		t.Fatal(err)
	}
	if c, _, err := s.Load(ctx, "s"); err != nil || c.Joins != nil || len(c.Tables) != 3 {
		t.Errorf("after a rolled back RecordJoin: %+v, %v", c, err)
	}
}
