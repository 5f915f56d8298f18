// Package status is what `cdc-relay status` reports: the relay's state read
// from the database itself (the slot, its lag and retained WAL, the stored
// checkpoint, the dead letters, the slot's failover state, the age of the
// oldest unrelayed row), so it works while the relay is down. The relay's own
// checks (gaps.JudgeStatus) give its problems and warnings, in the words the
// relay logs; the report is written as text or JSON (text.go).
package status

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// Config says what Read reads and how its verdicts name settings.
type Config struct {
	Slot        string
	Publication string
	// Tables are the outbox tables the relay reads, the first as its Table
	// (none: a message outbox alone).
	Tables []decoder.TableName
	// CheckpointTable and DeadLetterTable name the relay's tables ("": the
	// stores' defaults); a missing one leaves its part of the report out.
	CheckpointTable string
	DeadLetterTable string
	// MaxLagBytes: a slot's lag above it is a problem; 0: none is.
	MaxLagBytes int64
	// Names names the settings in the verdicts as the relay's configuration
	// names them (the fields of relay.Config): status judges with the relay's
	// own checks, and says what to fix as the relay would.
	Names setting.Namer
}

// Report is what status reports.
type Report struct {
	Slot string `json:"slot"`
	// Server is the role of the server status read, where the slot lives:
	// "primary", or "standby" (a relay decoding there writes its checkpoint
	// and dead letters to the primary, replicated back here).
	Server           string `json:"server"`
	SlotExists       bool   `json:"slot_exists"`
	Active           bool   `json:"active"`
	ActivePID        int    `json:"active_pid,omitempty"`
	WALStatus        string `json:"wal_status,omitempty"`
	ServerWALEnd     string `json:"server_wal_end"`
	ConfirmedLSN     string `json:"confirmed_lsn,omitempty"`
	LagBytes         int64  `json:"lag_bytes"`
	RetainedWALBytes int64  `json:"retained_wal_bytes"`
	// The slot's health, where the server's version reports it (absent
	// otherwise): safe_wal_size (13+, absent without a limit) under
	// max_slot_wal_keep_size (-1: no limit), conflicting (16+),
	// invalidation_reason and inactive_since (17+). InvalidatedReason is the
	// relay's reading of them (replication.SlotState.Invalidated).
	SafeWALSizeBytes   *int64     `json:"safe_wal_size_bytes,omitempty"`
	WALKeepSizeBytes   *int64     `json:"max_slot_wal_keep_size_bytes,omitempty"`
	Conflicting        *bool      `json:"conflicting,omitempty"`
	InvalidationReason string     `json:"invalidation_reason,omitempty"`
	InactiveSince      *time.Time `json:"inactive_since,omitempty"`
	InvalidatedReason  string     `json:"invalidated,omitempty"`
	// OldestUnrelayedAge is the age in seconds of the oldest committed
	// outbox row not yet acknowledged by Kafka, 0 when nothing waits, null
	// when status could not tell; OldestUnrelayedSource says how it knows:
	// "checkpoint" (what the running relay stored: it stores a new oldest
	// unrelayed time within 100 ms, also while stuck behind an outage) or
	// "slot" (the slot, decoded without consuming it, while no relay holds
	// it).
	OldestUnrelayedAge    *float64 `json:"oldest_unrelayed_age_seconds"`
	OldestUnrelayedSource string   `json:"oldest_unrelayed_source,omitempty"`
	// OldestUnrelayedError says why the age is null (no problem by itself).
	OldestUnrelayedError string       `json:"oldest_unrelayed_error,omitempty"`
	Checkpoint           *Checkpoint  `json:"checkpoint,omitempty"`
	DeadLetters          *DeadLetters `json:"dead_letters,omitempty"`
	// Failover is what a failover of the server would do to the slot.
	Failover *Failover `json:"failover,omitempty"`
	Problems []string  `json:"problems,omitempty"`
	// Warnings are risks that are not problems yet (Err ignores them): a
	// slot a promotion would lose, events a promotion would lose.
	Warnings []string `json:"warnings,omitempty"`
}

// Err returns the report's problems as one error, nil when it has none.
func (r Report) Err() error {
	if len(r.Problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(r.Problems, "; "))
}

// Failover is the slot's failover state (docs/postgres.md, Failover).
type Failover struct {
	ServerVersion string `json:"server_version"` // e.g. "17.2"
	// Supported: the server has failover slots (PostgreSQL 17+); the fields
	// below are only read there.
	Supported bool `json:"supported"`
	// SlotFailover: the slot is a failover slot, copied to standbys with
	// sync_replication_slots on; SlotSynced: this copy was synchronized
	// from a primary (a promoted standby's slot).
	SlotFailover bool `json:"slot_failover"`
	SlotSynced   bool `json:"slot_synced"`
	// SynchronizedStandbySlots is the server's setting: the standbys that
	// receive WAL before the relay does ("" when unset).
	SynchronizedStandbySlots string `json:"synchronized_standby_slots"`
}

// Checkpoint is the stored checkpoint.
type Checkpoint struct {
	LSN        string    `json:"lsn"`
	UpdatedAt  time.Time `json:"updated_at"`
	AgeSeconds float64   `json:"age_seconds"`
	RelayName  string    `json:"relay_name,omitempty"`
	// KafkaOffsets are the per-partition Kafka offsets stored with it, in the
	// store's JSON form; null when none are stored, {} when stored but empty.
	KafkaOffsets checkpoint.Offsets `json:"kafka_offsets"`
}

// DeadLetters counts dead letters.
type DeadLetters struct {
	Pending int64            `json:"pending"` // not completed (pending, processing, retry_wait or dead)
	Dead    int64            `json:"dead"`    // of which dead: the automatic retries gave up on them
	ByCode  map[string]int64 `json:"by_code,omitempty"`
	// BySourceTable counts them by the outbox table their events came from
	// (several outbox tables behind one relay); letters without one are
	// left out.
	BySourceTable map[string]int64 `json:"by_source_table,omitempty"`
}

// Read reads the report through the same code the relay uses, and judges
// it with the relay's checks; a missing checkpoint or dead-letter table just
// leaves its part out. An error is a failure to read, not a problem found.
func Read(ctx context.Context, pool *pgxpool.Pool, cfg Config) (Report, error) {
	r := Report{Slot: cfg.Slot}
	source, err := replication.ReadSource(ctx, pool)
	if err != nil {
		return r, err
	}
	r.Server = source.Role()
	end, err := replication.CurrentWAL(ctx, pool)
	if err != nil {
		return r, err
	}
	r.ServerWALEnd = end.String()
	// The slot before the checkpoint (gaps.Probe).
	slot, err := replication.ReadSlot(ctx, pool, cfg.Slot)
	if err != nil {
		return r, err
	}
	if slot.Exists {
		r.SlotExists, r.Active, r.ActivePID, r.WALStatus = true, slot.Active, slot.ActivePID, slot.WALStatus
		r.ConfirmedLSN = slot.ConfirmedFlush.String()
		r.LagBytes, r.RetainedWALBytes = slot.LagBytes, slot.RetainedWALBytes
		r.SafeWALSizeBytes, r.WALKeepSizeBytes = slot.SafeWALSize, &slot.WALKeepSize
		r.Conflicting, r.InvalidationReason = slot.Conflicting, slot.InvalidationReason
		if !slot.InactiveSince.IsZero() {
			r.InactiveSince = &slot.InactiveSince
		}
		_, r.InvalidatedReason = slot.Invalidated()
	}
	cp, haveCP, err := checkpoint.NewTableStore(pool, cfg.CheckpointTable).Load(ctx, cfg.Slot)
	haveCP = haveCP && err == nil
	if haveCP {
		r.Checkpoint = &Checkpoint{LSN: cp.LSN.String(), UpdatedAt: cp.UpdatedAt, AgeSeconds: time.Since(cp.UpdatedAt).Seconds(),
			RelayName: cp.RelayName, KafkaOffsets: cp.Offsets}
	}
	probe := gaps.Probe{Setup: cfg.setup(), Slot: slot, Stored: cp, HaveStored: haveCP, MaxLagBytes: cfg.MaxLagBytes}
	if probe.Database, err = replication.CurrentDatabase(ctx, pool); err != nil {
		return r, err
	}
	for _, t := range probe.Setup.PerTable() {
		cov, err := replication.ReadCoverage(ctx, pool, t)
		if err != nil {
			return r, err
		}
		probe.Coverage = append(probe.Coverage, cov)
	}
	if probe.Failover, err = readFailover(ctx, pool, cfg.Slot, &r); err != nil {
		return r, err
	}
	// The relay's own checks judge: the problems are their verdicts.
	verdicts := gaps.JudgeStatus(probe)
	r.Problems = append(r.Problems, verdicts.Problems...)
	r.Warnings = append(r.Warnings, verdicts.Warnings...)
	oldestUnrelayed(ctx, pool, cfg, &r, slot.Exists && slot.Active, cp, haveCP)
	r.DeadLetters = readDeadLetters(ctx, deadletter.NewStore(pool, cfg.DeadLetterTable))
	return r, nil
}

// setup names the slot, the publication and the outbox tables for the gap
// checks.
func (cfg Config) setup() replication.SetupConfig {
	s := replication.SetupConfig{Slot: cfg.Slot, Publication: cfg.Publication, Names: cfg.Names}
	for i, t := range cfg.Tables {
		if i == 0 {
			s.Schema, s.Table = t.Schema, t.Table
			continue
		}
		s.Also = append(s.Also, replication.TableSetup{Name: t})
	}
	return s
}

// readFailover reads the slot's failover state into r (gaps.JudgeStatus
// judges it).
func readFailover(ctx context.Context, pool *pgxpool.Pool, slot string, r *Report) (replication.FailoverState, error) {
	s, err := replication.ReadFailover(ctx, pool, slot)
	if err != nil {
		return s, err
	}
	r.Failover = &Failover{
		ServerVersion: replication.VersionName(s.ServerVersion), Supported: s.Supported(),
		SlotFailover: s.SlotFailover, SlotSynced: s.SlotSynced, SynchronizedStandbySlots: s.StandbySlots,
	}
	return s, nil
}

// readDeadLetters counts the letters not completed, nil when the store
// cannot be read (no dead-letter table).
func readDeadLetters(ctx context.Context, store *deadletter.Store) *DeadLetters {
	codes, err := store.Summary(ctx, deadletter.Filter{})
	if err != nil {
		return nil
	}
	d := &DeadLetters{ByCode: map[string]int64{}}
	if by, err := store.BacklogBySource(ctx); err == nil {
		delete(by, "")
		if len(by) > 0 {
			d.BySourceTable = by
		}
	}
	for _, cc := range codes {
		if cc.Pending > 0 {
			d.ByCode[cc.ErrorCode] = cc.Pending
			d.Pending += cc.Pending
		}
		d.Dead += cc.Dead
	}
	return d
}

// peekTimeout bounds decoding the slot for the oldest unrelayed row.
const peekTimeout = 5 * time.Second

// oldestUnrelayed fills in the age of the oldest unrelayed outbox row: from
// the checkpoint the running relay keeps writing while the slot is active,
// else by decoding the idle slot up to its first published transaction.
func oldestUnrelayed(ctx context.Context, pool *pgxpool.Pool, cfg Config, r *Report, active bool, cp checkpoint.Checkpoint, haveCP bool) {
	age := func(at time.Time) *float64 {
		v := 0.0
		if !at.IsZero() {
			v = max(time.Since(at).Seconds(), 0)
		}
		return &v
	}
	switch {
	case !r.SlotExists:
	case active && haveCP:
		r.OldestUnrelayedAge, r.OldestUnrelayedSource = age(cp.OldestUnrelayed), "checkpoint"
	case active:
		r.OldestUnrelayedError = "the slot is active but no checkpoint is stored (yet)"
	default:
		at, ok, err := replication.PeekOldestCommit(ctx, pool, cfg.Slot, cfg.Publication, peekTimeout)
		if err != nil {
			r.OldestUnrelayedError = err.Error()
			return
		}
		if !ok {
			at = time.Time{}
		}
		r.OldestUnrelayedAge, r.OldestUnrelayedSource = age(at), "slot"
	}
}
