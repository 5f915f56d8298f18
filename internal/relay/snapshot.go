package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// The initial snapshot (--snapshot initial, Config.Snapshot).
//
// The slot is created with EXPORT_SNAPSHOT: the exported snapshot sees exactly
// the transactions that committed before the slot's consistent point, and the
// slot streams exactly those that commit after it, so publishing the
// snapshot's rows and then streaming from the consistent point misses no row
// and sends none twice, whatever writers commit meanwhile.
//
// Restarts. The exported snapshot lives only as long as the replication
// connection that created the slot, so a snapshot cut short cannot be resumed:
// a later snapshot of the table is a different one, and resuming from the last
// published row of it would lose rows the first snapshot held but that were
// deleted since (outbox rows often are), and send twice those committed after
// the first consistent point, which the slot streams too. So the relay takes
// the snapshot again, from a new slot:
//
//  1. Before creating the slot it stores a marker, a checkpoint at LSN 0/0
//     (never a real position), meaning "the slot of this name was created for
//     an initial snapshot that has not completed".
//  2. It creates the slot, publishes the snapshot, waits for Kafka to
//     acknowledge every row, and only then stores the slot's consistent point
//     as the checkpoint.
//  3. A start that finds the marker drops the slot (nothing was ever
//     confirmed from it, nothing streamed) and goes back to 1.
//
// Rows the cut-short attempt published are published again (at-least-once,
// with the snapshot header, never lost). What the retake gives up: a row
// inserted and deleted again between the first attempt's consistent point and
// the retake's is in neither snapshot, and the dropped slot took its WAL with
// it, just as for a row inserted and deleted before the first start.

// snapshotPending reports whether stored is the marker of an initial snapshot
// that has not completed on this system (step 1 above).
func snapshotPending(stored checkpoint.Checkpoint, systemID string) bool {
	return stored.LSN == 0 && (stored.SystemID == "" || stored.SystemID == systemID)
}

// retakeSnapshot handles a start after an initial snapshot that did not
// complete: with --snapshot initial it drops the slot that attempt created and
// takes the snapshot again; otherwise it refuses to start and says what to do.
func (r *Relay) retakeSnapshot(ctx context.Context, pool *pgxpool.Pool, conn *pgx.Conn, store Store, systemID string, stored checkpoint.Checkpoint, state checkpoint.SlotState) (pglogrepl.LSN, error) {
	slot := r.cfg.Slot
	if r.cfg.Snapshot == nil {
		return 0, &replication.ConfigError{Msg: fmt.Sprintf("the initial snapshot of replication slot %q (started by relay %q at %s) did not complete, so rows already in the outbox may be missing downstream: "+
			"restart with --snapshot initial (CDC_RELAY_SNAPSHOT=initial) to drop the slot and take the snapshot again; "+
			"or, to give it up, drop the slot with SELECT pg_drop_replication_slot('%s'); and delete its checkpoint (the row slot_name = '%s' of the checkpoint table, or the checkpoint file), then restart",
			slot, stored.RelayName, stored.UpdatedAt.UTC().Format(time.RFC3339), slot, slot)}
	}
	if state.Exists {
		if state.Active {
			return 0, fmt.Errorf("retake the initial snapshot of slot %q: the slot is in use by process %d; stop that consumer first", slot, state.ActivePID)
		}
		if err := replication.DropSlot(ctx, conn, slot); err != nil {
			return 0, fmt.Errorf("retake the initial snapshot of slot %q: drop the slot of the incomplete attempt: %w", slot, err)
		}
	}
	if !r.cfg.CreateSlot {
		return 0, &replication.ConfigError{Msg: fmt.Sprintf("retake the initial snapshot of slot %q: the slot must be created with an exported snapshot but --create-slot=false: allow the relay to create it, or start with --snapshot never", slot)}
	}
	r.log.Warn().Str("started_by", stored.RelayName).Time("started_at", stored.UpdatedAt).Bool("slot_dropped", state.Exists).
		Msg("the initial snapshot did not complete: dropped the slot of that attempt (nothing was confirmed from it) and taking the snapshot again; rows that attempt published are published again")
	return r.initialSnapshot(ctx, pool, conn, store, systemID)
}

// initialSnapshot creates the slot with an exported snapshot, publishes the
// snapshot's rows through Config.Snapshot and, once Kafka acknowledged them
// all, stores the slot's consistent point as the checkpoint and returns it.
func (r *Relay) initialSnapshot(ctx context.Context, pool *pgxpool.Pool, conn *pgx.Conn, store Store, systemID string) (pglogrepl.LSN, error) {
	slot := r.cfg.Slot
	// Every transaction the new slot streams commits after this instant.
	markTime, err := replication.ServerClock(ctx, conn)
	if err != nil {
		return 0, fmt.Errorf("initial snapshot of slot %q: %w", slot, err)
	}
	marker := checkpoint.Checkpoint{Slot: slot, SystemID: systemID, UpdatedAt: time.Now(), RelayName: r.cfg.RelayName}
	if err := store.Save(ctx, marker); err != nil {
		return 0, fmt.Errorf("initial snapshot of slot %q: store the marker of a snapshot in progress: %w", slot, err)
	}
	began := time.Now()
	var n int
	point, err := replication.CreateSlotWithSnapshot(ctx, r.cfg.PGURL, slot, func(ctx context.Context, tx pgx.Tx) error {
		r.log.Info().Msg("created replication slot with an exported snapshot: publishing the outbox rows it holds (--snapshot initial)")
		var err error
		n, err = r.cfg.Snapshot(ctx, tx)
		return err
	})
	if errors.Is(err, replication.ErrSlotExists) {
		return 0, fmt.Errorf("initial snapshot of slot %q: another process created the slot meanwhile, so no snapshot was exported: "+
			"make sure one relay runs per slot, then restart (the relay drops the slot and takes the snapshot again): %w", slot, err)
	}
	if err != nil {
		return 0, fmt.Errorf("initial snapshot of slot %q (%d rows published before the failure; the next start with --snapshot initial drops the slot and takes the snapshot again): %w",
			slot, n, err)
	}
	cp := checkpoint.Checkpoint{Slot: slot, SystemID: systemID, LSN: point, UpdatedAt: time.Now(), RelayName: r.cfg.RelayName, CommitTime: markTime}
	if r.cfg.Delivery == DeliveryEffectivelyOnce {
		// Nothing streamed yet: each topic's offsets are registered before the
		// stream first writes to it. Snapshot rows carry no source position.
		cp.Offsets = checkpoint.Offsets{}
	}
	if err := store.Save(ctx, cp); err != nil {
		return 0, fmt.Errorf("initial snapshot of slot %q: store the slot's consistent point %s (the next start takes the snapshot again): %w", slot, point, err)
	}
	r.log.Info().Int("events", n).Dur("took", time.Since(began)).Str("lsn", point.String()).
		Msg("initial snapshot done: streaming from the slot's consistent point")
	return point, nil
}
