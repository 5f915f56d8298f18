package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// The initial snapshot (delivery.snapshot initial, Config.Snapshot).
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

// retakeSnapshot handles a start with the initial snapshot on after an initial
// snapshot that did not complete (the stored marker, step 1 above; without
// the initial snapshot on the gap check refuses to start and says what to do): it
// drops the slot that attempt created and takes the snapshot again.
func (r *Relay) retakeSnapshot(ctx context.Context, conn *pgx.Conn, op *checkpoint.Opening, stored checkpoint.Checkpoint, state replication.SlotState) (pglogrepl.LSN, error) {
	slot := r.cfg.Slot
	if state.Exists {
		if state.Active {
			return 0, fmt.Errorf("retake the initial snapshot of slot %q: the slot is in use by process %d; stop that consumer first", slot, state.ActivePID)
		}
		if err := replication.DropSlot(ctx, conn, slot); err != nil {
			return 0, fmt.Errorf("retake the initial snapshot of slot %q: drop the slot of the incomplete attempt: %w", slot, err)
		}
	}
	if !r.cfg.CreateSlot {
		return 0, &replication.ConfigError{Msg: fmt.Sprintf("retake the initial snapshot of slot %q: the slot must be created with an exported snapshot but the relay may not create it %s: allow the relay to create it, or start without the initial snapshot", slot, r.cfg.Names.Name("CreateSlot"))}
	}
	r.log.Warn().Str("started_by", stored.RelayName).Time("started_at", stored.UpdatedAt).Bool("slot_dropped", state.Exists).
		Msg("the initial snapshot did not complete: dropped the slot of that attempt (nothing was confirmed from it) and taking the snapshot again; rows that attempt published are published again")
	return r.initialSnapshot(ctx, conn, op)
}

// initialSnapshot creates the slot with an exported snapshot, publishes the
// snapshot's rows through Config.Snapshot and, once Kafka acknowledged them
// all, stores the slot's consistent point as the checkpoint and returns it.
func (r *Relay) initialSnapshot(ctx context.Context, conn *pgx.Conn, op *checkpoint.Opening) (pglogrepl.LSN, error) {
	slot := r.cfg.Slot
	// Every transaction the new slot streams commits after this instant.
	markTime, err := replication.ServerClock(ctx, conn)
	if err != nil {
		return 0, fmt.Errorf("initial snapshot of slot %q: %w", slot, err)
	}
	if err := op.MarkSnapshot(ctx); err != nil {
		return 0, fmt.Errorf("initial snapshot of slot %q: %w", slot, err)
	}
	began := time.Now()
	var n int
	var point pglogrepl.LSN
	err = r.creatingSlot(ctx, func() error {
		var err error
		point, err = replication.CreateSlotWithSnapshot(ctx, r.cfg.PGURL, slot, r.failover, r.cfg.Names, func(ctx context.Context, tx pgx.Tx) error {
			r.log.Info().Msg("created replication slot with an exported snapshot: publishing the outbox rows it holds " + r.cfg.Names.Name("Snapshot"))
			var err error
			n, err = r.cfg.Snapshot(ctx, tx)
			return err
		})
		return err
	})
	if errors.Is(err, replication.ErrSlotExists) {
		return 0, fmt.Errorf("initial snapshot of slot %q: another process created the slot meanwhile, so no snapshot was exported: "+
			"make sure one relay runs per slot, then restart (the relay drops the slot and takes the snapshot again): %w", slot, err)
	}
	if err != nil {
		return 0, fmt.Errorf("initial snapshot of slot %q (%d rows published before the failure; the next start with the initial snapshot %s drops the slot and takes the snapshot again): %w",
			slot, n, r.cfg.Names.Name("Snapshot"), err)
	}
	var offsets checkpoint.Offsets
	if r.cfg.Delivery == DeliveryEffectivelyOnce {
		// Nothing streamed yet: each topic's offsets are registered before the
		// stream first writes to it. Snapshot rows carry no source position.
		offsets = checkpoint.Offsets{}
	}
	// Kafka acknowledged every row of the snapshot: the consistent point may
	// be stored.
	if err := op.Reposition(ctx, point, markTime, offsets); err != nil {
		return 0, fmt.Errorf("initial snapshot of slot %q (the next start takes the snapshot again): %w", slot, err)
	}
	r.log.Info().Int("events", n).Dur("took", time.Since(began)).Str("lsn", point.String()).
		Msg("initial snapshot done: streaming from the slot's consistent point")
	return point, nil
}
