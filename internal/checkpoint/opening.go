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
	base   Checkpoint // slot, system id, relay name and Tables of every write
	stored Checkpoint // what the store holds for the slot now
	have   bool
	// covered are the tables the publication covered at coveredAt
	// (CoverTables): the Tables of a write at or past coveredAt.
	covered   []string
	coveredAt pglogrepl.LSN
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
	marker.Joins = o.stored.Joins // Save leaves them
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
	cp.Joins = o.stored.Joins // Save leaves them
	o.stored, o.have = cp, true
	return nil
}

// CoverTables sets the Tables of the writes from now on, from what the
// publication covers now: published (replication.PublishedTables, read at
// WAL position at), joined (the outbox tables this start added to the
// publication, publishing the rows they held) and reads (the outbox tables
// the relay reads: covered now, and since the stored checkpoint or joined,
// as the caller's gap checks found). A write at or past at names every
// published table. One before it, such as the stored checkpoint's own
// position, names only the tables read, joined, or published and named by
// the stored checkpoint: a table added to the publication since (by hand)
// was not covered there, and the stream from there misses its rows
// committed before the change. A table that leaves the relay's list stays
// named while the publication keeps it, so it may come back without
// table_joined.
func (o *Opening) CoverTables(published []string, at pglogrepl.LSN, joined, reads []string) {
	// The tables read are named as the relay reads them, even a partition
	// (published is by root).
	covered := slices.Clone(reads)
	var before []string
	for _, t := range published {
		if slices.Contains(reads, t) {
			continue
		}
		covered = append(covered, t)
		if slices.Contains(o.stored.Tables, t) || slices.Contains(joined, t) {
			before = append(before, t)
		}
	}
	before = append(slices.Clone(reads), before...)
	slices.Sort(before)
	slices.Sort(covered)
	o.base.Tables = slices.Compact(before)
	o.covered, o.coveredAt = slices.Compact(covered), at
}

// SaveTables stores the stored checkpoint again with the Tables covered at
// its position (CoverTables, else the base's) when they differ from the
// stored ones, keeping its position: the caller's gap checks passed, and a
// table the relay has just added to the publication then counts at once,
// not only from the Committer's first save. A marker or a missing checkpoint
// is left alone.
func (o *Opening) SaveTables(ctx context.Context) error {
	if !o.have || o.stored.LSN == 0 {
		return nil
	}
	tables := o.tablesAt(o.stored.LSN)
	if slices.Equal(o.stored.Tables, tables) {
		return nil
	}
	cp := o.stored
	cp.Tables, cp.RelayName, cp.UpdatedAt = tables, o.base.RelayName, time.Now()
	if err := o.store.Save(ctx, cp); err != nil {
		return fmt.Errorf("store the tables the publication covers at %s: %w", cp.LSN, err)
	}
	o.stored = cp
	return nil
}

// tablesAt are the Tables of a write at lsn.
func (o *Opening) tablesAt(lsn pglogrepl.LSN) []string {
	if o.covered != nil && lsn >= o.coveredAt {
		return o.covered
	}
	return o.base.Tables
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
	c := NewCommitter(cfg)
	c.covered, c.coveredAt = o.covered, o.coveredAt
	return c
}
