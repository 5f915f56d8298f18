package checkpoint

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Join is a join in progress: outbox tables the relay added to the
// publication of its slot whose rows committed before are still to be
// published (relay: join.go). The joins in progress of a slot are stored
// beside its checkpoint (TableStore: column pending_joins, a JSON array;
// FileStore: pending_joins), each written in the
// transaction that adds the tables (JoinStore.RecordJoin), moved on after
// each batch Kafka acknowledged and removed once every row is published
// (JoinStore.SaveJoins). A start that finds one publishes what is left before
// it streams.
type Join struct {
	// Tables are the joining tables, as schema.table.
	Tables []string `json:"tables"`
	// Snapshot is the snapshot of the transaction that added them, taken
	// holding the lock that keeps their writers out
	// (pg_current_snapshot()::text): it holds every row committed into them
	// before the change and none after, which the stream carries.
	Snapshot string `json:"snapshot"`
	// Mode is what the join publishes: all, after-checkpoint.
	Mode string `json:"mode"`
	// CommittedSince, for after-checkpoint, is the commit time from which
	// rows are published. Zero: all.
	CommittedSince time.Time `json:"committed_since,omitzero"`
	// XID is the transaction that added them (txid_current()): with commit
	// timestamps, every row its snapshot saw committed before it, and every
	// row the stream carries after, so its commit time bounds the read
	// (pg_current_snapshot lists no subtransactions, which Snapshot alone
	// would take for committed). 0: unknown (recorded by an older relay).
	XID int64 `json:"xid,omitzero"`
	// After is each table's position up to which its rows are in Kafka
	// (outboxtable.ReplayOptions.After); a table absent starts from its first row.
	After map[string]string `json:"after,omitempty"`
}

// CloneJoins returns a copy of joins that shares nothing with it.
func CloneJoins(joins []Join) []Join {
	if joins == nil {
		return nil
	}
	out := make([]Join, len(joins))
	for i, j := range joins {
		j.Tables = slices.Clone(j.Tables)
		j.After = maps.Clone(j.After)
		out[i] = j
	}
	return out
}

// JoinStore keeps the joins in progress beside the checkpoint of a slot
// (TableStore, FileStore). The Save of the Store leaves them as they are.
type JoinStore interface {
	// RecordJoin adds cp.Joins to the slot's joins in progress and
	// cp.Tables to the stored checkpoint's Tables (when those are known),
	// inserting cp when the slot has no checkpoint. A TableStore writes
	// through tx, the transaction that adds the tables to the publication,
	// so both commit or neither does; a FileStore writes its file at once
	// (nil tx).
	RecordJoin(ctx context.Context, tx pgx.Tx, cp Checkpoint) error
	// SaveJoins replaces the slot's joins in progress; none removes them.
	SaveJoins(ctx context.Context, slot string, joins []Join) error
}

var (
	_ JoinStore = (*TableStore)(nil)
	_ JoinStore = (*FileStore)(nil)
)

func encodeJoins(joins []Join) (any, error) {
	if len(joins) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(joins)
	if err != nil {
		return nil, fmt.Errorf("encode the joins in progress: %w", err)
	}
	return string(b), nil
}

func decodeJoins(b []byte) ([]Join, error) {
	if b == nil {
		return nil, nil
	}
	var joins []Join
	if err := json.Unmarshal(b, &joins); err != nil {
		return nil, err
	}
	return joins, nil
}

// RecordJoin implements JoinStore: one statement through tx, the
// transaction that adds the tables to the publication.
func (s *TableStore) RecordJoin(ctx context.Context, tx pgx.Tx, cp Checkpoint) error {
	join, err := encodeJoins(cp.Joins)
	if err != nil {
		return err
	}
	var offsets any
	if enc, err := encodeOffsets(cp.Offsets); err != nil {
		return fmt.Errorf("record the join of %v in %s: encode kafka offsets: %w", cp.Tables, s.name, err)
	} else if enc != nil {
		offsets = string(enc)
	}
	var commit any
	if !cp.CommitTime.IsZero() {
		commit = cp.CommitTime
	}
	// A new row's tables are unknown (NULL), as a slot's without a checkpoint;
	// a stored row's known ones gain the joining tables.
	_, err = tx.Exec(ctx, "INSERT INTO "+s.table+` AS c (slot_name, system_id, lsn, relay_name, commit_time, kafka_offsets, pending_joins)
VALUES ($1, $2, $3::text::pg_lsn, $4, $5::timestamptz, $6::jsonb, $7::jsonb)
ON CONFLICT (slot_name) DO UPDATE SET
    outbox_tables = CASE WHEN c.outbox_tables IS NULL THEN NULL
        ELSE ARRAY(SELECT DISTINCT t FROM unnest(c.outbox_tables || $8::text[]) AS t ORDER BY t) END,
    pending_joins = CASE WHEN excluded.pending_joins IS NULL THEN c.pending_joins
        ELSE coalesce(c.pending_joins, '[]') || excluded.pending_joins END`,
		cp.Slot, cp.SystemID, cp.LSN.String(), cp.RelayName, commit, offsets, join, cp.Tables)
	if err != nil {
		return fmt.Errorf("record the join of %v in checkpoint table %s: %w", cp.Tables, s.name, err)
	}
	return nil
}

// SaveJoins implements JoinStore.
func (s *TableStore) SaveJoins(ctx context.Context, slot string, joins []Join) error {
	join, err := encodeJoins(joins)
	if err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, "UPDATE "+s.table+" SET pending_joins = $2::jsonb WHERE slot_name = $1", slot, join); err != nil {
		return fmt.Errorf("store the joins in progress of slot %q in %s: %w", slot, s.name, err)
	}
	return nil
}

// RecordJoin implements JoinStore; tx is not used: the file is written at
// once, before the transaction that adds the tables commits. Should that
// transaction fail, the file names tables the publication lacks, a superset
// the gap checks accept: the next start finds them outside the publication,
// adds them again and records a new join, which replaces a join in progress
// of the same tables (its snapshot holds every row the older one had left).
// Only a table added by hand after such a failure would escape table_joined.
func (s *FileStore) RecordJoin(_ context.Context, _ pgx.Tx, cp Checkpoint) error {
	return s.update(cp.Slot, func(e *fileEntry, ok bool) {
		if !ok {
			*e = fileEntry{SystemID: cp.SystemID, LSN: cp.LSN.String(), UpdatedAt: time.Now().UTC(), RelayName: cp.RelayName}
			if !cp.CommitTime.IsZero() {
				t := cp.CommitTime.UTC()
				e.CommitTime = &t
			}
			if cp.Offsets != nil {
				e.KafkaOffsets = &cp.Offsets
			}
		} else if e.OutboxTables != nil {
			tables := append(slices.Clone(*e.OutboxTables), cp.Tables...)
			slices.Sort(tables)
			tables = slices.Compact(tables)
			e.OutboxTables = &tables
		}
		var joining []string
		for _, j := range cp.Joins {
			joining = append(joining, j.Tables...)
		}
		e.PendingJoins = slices.DeleteFunc(e.PendingJoins, func(j Join) bool {
			return slices.ContainsFunc(j.Tables, func(t string) bool { return slices.Contains(joining, t) })
		})
		e.PendingJoins = append(e.PendingJoins, CloneJoins(cp.Joins)...)
	})
}

// SaveJoins implements JoinStore.
func (s *FileStore) SaveJoins(_ context.Context, slot string, joins []Join) error {
	return s.update(slot, func(e *fileEntry, ok bool) {
		if ok {
			e.PendingJoins = CloneJoins(joins)
			if len(joins) == 0 {
				e.PendingJoins = nil
			}
		}
	})
}

// update rewrites the entry of slot with change (ok: the entry existed;
// a new one is written only when change sets its LSN).
func (s *FileStore) update(slot string, change func(e *fileEntry, ok bool)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	doc, err := s.read()
	if err != nil {
		return err
	}
	e, ok := doc.Checkpoints[slot]
	change(&e, ok)
	if !ok && e.LSN == "" {
		return nil
	}
	doc.Checkpoints[slot] = e
	if err := s.write(doc); err != nil {
		return fmt.Errorf("store the joins in progress of slot %q: %w", slot, err)
	}
	return nil
}
