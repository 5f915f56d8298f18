package checkpoint

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
)

// Loader loads the stored checkpoint of slot and whether there is one
// (TableStore, FileStore).
type Loader interface {
	Load(ctx context.Context, slot string) (Checkpoint, bool, error)
}

// Store loads and saves checkpoints (TableStore, FileStore): Load returns the
// stored checkpoint of slot and whether there is one; Save returns nil once c
// is durable.
type Store interface {
	Loader
	Saver
}

// Opening is the Committer before anything streams: the start-up half of the
// one owner of DESIGN invariant 1. Every checkpoint the relay writes goes
// through an Opening or the Committer it becomes, never through the store
// directly: the markers and positions of start-up (an initial snapshot, a
// backfill after a slot loss) here, the acknowledged watermark in the
// Committer. It also decides where streaming starts (StartFrom).
//
// An Opening is used by one goroutine, before Committer is called.
type Opening struct {
	store  Store
	base   Checkpoint // slot, system id and relay name of every write
	stored Checkpoint // what the store holds for the slot now
	have   bool
}

// Open loads the stored checkpoint of base.Slot. base names the slot, the
// Postgres system identifier the relay runs against now (IDENTIFY_SYSTEM) and
// the relay; every checkpoint written through the Opening and its Committer
// carries them.
func Open(ctx context.Context, store Store, base Checkpoint) (*Opening, error) {
	stored, have, err := store.Load(ctx, base.Slot)
	if err != nil {
		return nil, fmt.Errorf("load checkpoint of slot %q: %w", base.Slot, err)
	}
	base.LSN, base.CommitTime, base.UpdatedAt, base.Offsets, base.OldestUnrelayed = 0, time.Time{}, time.Time{}, nil, time.Time{}
	return &Opening{store: store, base: base, stored: stored, have: have}, nil
}

// Stored returns the checkpoint the store holds for the slot, and whether it
// holds one: what Open loaded, or what was written through o since.
func (o *Opening) Stored() (Checkpoint, bool) { return o.stored, o.have }

// SnapshotPending reports whether the stored checkpoint is the marker of an
// initial snapshot that has not completed on this system (MarkSnapshot).
func (o *Opening) SnapshotPending() bool {
	return o.have && o.stored.LSN == 0 && (o.stored.SystemID == "" || o.stored.SystemID == o.base.SystemID)
}

// MarkSnapshot stores the marker of an initial snapshot in progress: a
// checkpoint at LSN 0/0, never a real position, meaning "the slot of this name
// was created for an initial snapshot that has not completed". Contract: the
// caller stores it before it creates the slot the snapshot is exported from,
// and later stores the slot's consistent point with Reposition only once Kafka
// acknowledged every row of the snapshot; a start that finds the marker
// (SnapshotPending) must not stream from that slot.
func (o *Opening) MarkSnapshot(ctx context.Context) error {
	marker := o.base
	marker.UpdatedAt = time.Now()
	if err := o.store.Save(ctx, marker); err != nil {
		return fmt.Errorf("store the marker of a snapshot in progress: %w", err)
	}
	o.stored, o.have = marker, true
	return nil
}

// Reposition stores lsn as the slot's checkpoint although no acknowledgement
// moved a watermark there: the position a new or recreated slot streams from
// after an initial snapshot or a backfill. Contract, which keeps invariant 1:
// Kafka has acknowledged every event committed before lsn that the slot will
// not stream (the snapshot's or backfill's rows), commitTime is no later than
// the commit of any transaction after lsn, and offsets are valid for lsn (nil:
// none stored, at-least-once). Call it before Committer.
func (o *Opening) Reposition(ctx context.Context, lsn pglogrepl.LSN, commitTime time.Time, offsets Offsets) error {
	cp := o.base
	cp.LSN, cp.CommitTime, cp.UpdatedAt, cp.Offsets = lsn, commitTime, time.Now(), offsets
	if err := o.store.Save(ctx, cp); err != nil {
		return fmt.Errorf("store the new position %s: %w", lsn, err)
	}
	o.stored, o.have = cp, true
	return nil
}

// SaveTables stores the stored checkpoint again with the base's Tables when
// they differ from the stored ones, keeping its position: the tables the
// relay reads from now on, each covered by the publication from where the
// stream resumes (the caller's gap checks passed). A table the relay has just
// added to the publication then counts as read at once, not only from the
// Committer's first save. A marker or a missing checkpoint is left alone.
func (o *Opening) SaveTables(ctx context.Context) error {
	if !o.have || o.stored.LSN == 0 || slices.Equal(o.stored.Tables, o.base.Tables) {
		return nil
	}
	cp := o.stored
	cp.Tables, cp.RelayName, cp.UpdatedAt = o.base.Tables, o.base.RelayName, time.Now()
	if err := o.store.Save(ctx, cp); err != nil {
		return fmt.Errorf("store the outbox tables the relay reads at %s: %w", cp.LSN, err)
	}
	o.stored = cp
	return nil
}

// StartFrom returns where streaming starts from a slot confirmed up to
// confirmed: that position, or the stored checkpoint's LSN when it is ahead.
// The store is written before the slot is confirmed, so a stored LSN ahead of
// the slot marks events Kafka already acknowledged: streaming starts after
// them. (A slot ahead of the store is a gap, which the caller has refused or
// repaired before it asks.)
func (o *Opening) StartFrom(confirmed pglogrepl.LSN) pglogrepl.LSN {
	if o.have && o.stored.LSN > confirmed {
		return o.stored.LSN
	}
	return confirmed
}

// Committer returns the Committer that continues from start (StartFrom's
// answer), writing to the Opening's store with its slot, system and relay
// name. cfg's Store, Base and Start are set here; its CommitTime is the stored
// checkpoint's when that is at start. The Opening must not be used after.
func (o *Opening) Committer(start pglogrepl.LSN, cfg CommitterConfig) *Committer {
	cfg.Store, cfg.Base, cfg.Start = o.store, o.base, start
	if o.have && o.stored.LSN == start {
		cfg.Base.CommitTime = o.stored.CommitTime
	}
	return NewCommitter(cfg)
}
