package checkpoint

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
)

// SlotState is a replication slot as pg_replication_slots shows it.
type SlotState struct {
	Exists         bool
	Plugin         string // output plugin; the relay needs "pgoutput"
	Database       string
	Active         bool
	ActivePID      int
	ConfirmedFlush pglogrepl.LSN // confirmed_flush_lsn
	WALStatus      string        // wal_status: reserved, extended, unreserved or lost
	// LagBytes is pg_current_wal_lsn() - confirmed_flush_lsn; RetainedWALBytes is
	// pg_current_wal_lsn() - restart_lsn, the WAL the server keeps for the slot.
	LagBytes         int64
	RetainedWALBytes int64
}

// Decision is what Reconcile allows: where to start streaming, and what to log.
type Decision struct {
	// StartFrom is the LSN to pass to START_REPLICATION; 0 when the slot does not exist
	// yet and the caller creates it.
	StartFrom pglogrepl.LSN
	// Warnings are complete sentences for the log; none of them stops the relay.
	Warnings []string
}

// GapKind tells apart the reasons Reconcile refuses to start.
type GapKind int

// The gaps Reconcile reports. Each may have lost events: none is retried.
const (
	// SlotMissing: a checkpoint is stored but the slot does not exist.
	SlotMissing GapKind = iota + 1
	// SlotLost: Postgres removed WAL the slot still needed (wal_status = lost).
	SlotLost
	// SlotAhead: the slot's confirmed_flush_lsn is past the stored checkpoint.
	SlotAhead
	// SystemChanged: the server's system identifier differs from the stored one.
	SystemChanged
	// WrongPlugin: the slot does not use pgoutput.
	WrongPlugin
)

// String returns the kind in snake case, usable as a metric label.
func (k GapKind) String() string {
	switch k {
	case SlotMissing:
		return "slot_missing"
	case SlotLost:
		return "slot_lost"
	case SlotAhead:
		return "slot_ahead"
	case SystemChanged:
		return "system_changed"
	case WrongPlugin:
		return "wrong_plugin"
	default:
		return fmt.Sprintf("gap_kind_%d", int(k))
	}
}

// GapError is returned by Reconcile when starting would silently skip or misplace
// events (DESIGN invariant 6). Its message says what happened, what may be lost and what
// to do, with the SQL to run; log it whole and count it by Kind. The relay must not
// retry: it exits until an operator acts. Use errors.As to get at it.
type GapError struct {
	Kind      GapKind       // what went wrong; Kind.String() is a metric label
	Slot      string        // the replication slot's name
	StoredLSN pglogrepl.LSN // the stored checkpoint's LSN
	SlotLSN   pglogrepl.LSN // the slot's confirmed_flush_lsn; 0 when the slot is missing
	msg       string
}

// Error returns the full explanation.
func (e *GapError) Error() string { return e.msg }

// Reconcile compares the stored checkpoint of slot with the slot itself at start-up and
// decides where streaming starts (DESIGN invariant 6). systemID is what IDENTIFY_SYSTEM
// reports now; haveStored is false when the store has no checkpoint for slot.
//
// Without a stored checkpoint this is a first run: a missing slot is fine (the caller
// creates it) and an existing one is used from its confirmed position. With one, the
// slot must exist on the same system, use pgoutput, still have its WAL, and not be
// ahead of the store — the relay writes the store before confirming the slot, so a
// slot ahead was moved by someone else or recreated. Streaming then starts at the
// slot's confirmed position, redelivering what lies between it and the store.
//
// Every refusal is a *GapError.
func Reconcile(slot, systemID string, stored Checkpoint, haveStored bool, s SlotState) (Decision, error) {
	var warnings []string
	if s.Exists && s.Active {
		warnings = append(warnings, fmt.Sprintf(
			"replication slot %q is in use by process %d; streaming cannot start until it disconnects "+
				"(another relay on the same slot, or one that is still shutting down): "+
				"SELECT pid, application_name, client_addr FROM pg_stat_replication WHERE pid = %d;",
			slot, s.ActivePID, s.ActivePID))
	}
	if s.Exists && s.WALStatus == "unreserved" {
		warnings = append(warnings, fmt.Sprintf(
			"replication slot %q has wal_status 'unreserved' at %s: Postgres will remove WAL it still needs "+
				"at the next checkpoint unless the relay catches up; raise max_slot_wal_keep_size if this recurs",
			slot, s.ConfirmedFlush))
	}

	if !haveStored {
		if !s.Exists {
			return Decision{Warnings: warnings}, nil
		}
		if err := checkUsable(slot, stored, false, s); err != nil {
			return Decision{}, err
		}
		warnings = append(warnings, fmt.Sprintf(
			"no stored checkpoint for replication slot %q, which already exists: starting from its confirmed position %s; "+
				"events a previous relay sent but did not confirm will be delivered again",
			slot, s.ConfirmedFlush))
		return Decision{StartFrom: s.ConfirmedFlush, Warnings: warnings}, nil
	}

	replay := replayHint(stored)
	if stored.SystemID == "" {
		warnings = append(warnings, fmt.Sprintf(
			"the stored checkpoint of replication slot %q has no system identifier, so a restored or cloned database "+
				"cannot be detected this time; the next save records system %s", slot, systemID))
	}
	if stored.SystemID != "" && stored.SystemID != systemID {
		return Decision{}, gap(SystemChanged, slot, stored, s,
			"the checkpoint of replication slot %q (LSN %s, saved %s) was written on the Postgres system %s, "+
				"but the server now reports system %s: the database was restored from a backup, cloned, "+
				"or the relay points at a different cluster. LSNs of the old system mean nothing here "+
				"(the slot here is %s), so events may be missing or repeated. "+
				"If this is the server the relay should follow, check that its outbox holds what you expect, then "+
				"drop a slot copied along with the data, %s, remove the stale checkpoint with %s and restart the relay, "+
				"which creates a new slot. To recover events since the old checkpoint, %s",
			slot, stored.LSN, savedAt(stored), stored.SystemID, systemID,
			slotDesc(s), dropSlotSQL(slot), deleteSQL(slot), replay)
	}
	if !s.Exists {
		return Decision{}, gap(SlotMissing, slot, stored, s,
			"replication slot %q does not exist, but the checkpoint store has LSN %s for it (saved %s): "+
				"the slot was dropped, or the relay points at another database. "+
				"Events committed after %s until a new slot is created cannot be streamed and would be missing downstream. "+
				"To accept that gap, delete the checkpoint with %s and restart the relay, which creates a new slot "+
				"and streams from then on. To recover the events, %s",
			slot, stored.LSN, savedAt(stored), stored.LSN, deleteSQL(slot), replay)
	}
	if err := checkUsable(slot, stored, true, s); err != nil {
		return Decision{}, err
	}
	if s.ConfirmedFlush > stored.LSN {
		return Decision{}, gap(SlotAhead, slot, stored, s,
			"replication slot %q has confirmed up to %s, past the stored checkpoint %s (saved %s). "+
				"The relay writes its checkpoint before it confirms the slot, so another consumer advanced the slot "+
				"(a second relay or tool using the same slot name, pg_replication_slot_advance) or it was dropped and recreated; "+
				"events committed between %s and %s may never have reached Kafka. "+
				"Find out who uses the slot (SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s;). "+
				"To recover the events, %s; then accept the slot's position with %s and restart the relay",
			slot, s.ConfirmedFlush, stored.LSN, savedAt(stored), stored.LSN, s.ConfirmedFlush,
			sqlString(slot), replay, updateSQL(slot, s.ConfirmedFlush))
	}
	if s.ConfirmedFlush < stored.LSN {
		warnings = append(warnings, fmt.Sprintf(
			"replication slot %q has confirmed up to %s, behind the stored checkpoint %s: "+
				"events committed between them were already delivered and may be delivered again",
			slot, s.ConfirmedFlush, stored.LSN))
	}
	return Decision{StartFrom: s.ConfirmedFlush, Warnings: warnings}, nil
}

// checkUsable refuses a slot the relay cannot stream from: another plugin, or WAL lost.
func checkUsable(slot string, stored Checkpoint, haveStored bool, s SlotState) error {
	lost := "Nothing was stored for this slot yet, so no relay position is affected."
	storedAt := "no stored checkpoint"
	if haveStored {
		storedAt = "stored checkpoint " + stored.LSN.String()
		lost = fmt.Sprintf("Events committed after the stored checkpoint %s cannot be streamed; to recover them, %s.",
			stored.LSN, replayHint(stored))
	}
	if s.Plugin != "pgoutput" {
		return gap(WrongPlugin, slot, stored, s,
			"replication slot %q uses output plugin %q, but the relay needs \"pgoutput\" (the slot is at %s, %s). "+
				"It probably belongs to another application: give the relay its own slot name. "+
				"If the slot is abandoned, drop it with %s%s and restart the relay, which creates a pgoutput slot. %s",
			slot, s.Plugin, s.ConfirmedFlush, storedAt, dropSlotSQL(slot), deleteIf(haveStored, slot), lost)
	}
	if s.WALStatus == "lost" {
		return gap(SlotLost, slot, stored, s,
			"replication slot %q has wal_status 'lost' (confirmed at %s, %s): Postgres removed WAL "+
				"the slot still needed because it fell further behind than max_slot_wal_keep_size allows. %s "+
				"To continue, drop the slot with %s%s and restart the relay, which creates a new one. "+
				"To keep it from recurring, keep the relay running or raise the limit: "+
				"ALTER SYSTEM SET max_slot_wal_keep_size = '<size>'; SELECT pg_reload_conf();",
			slot, s.ConfirmedFlush, storedAt, lost, dropSlotSQL(slot), deleteIf(haveStored, slot))
	}
	return nil
}

// gap builds a *GapError.
func gap(kind GapKind, slot string, stored Checkpoint, s SlotState, format string, args ...any) *GapError {
	return &GapError{
		Kind:      kind,
		Slot:      slot,
		StoredLSN: stored.LSN,
		SlotLSN:   s.ConfirmedFlush,
		msg:       fmt.Sprintf("reconcile slot %q: %s: ", slot, kind) + fmt.Sprintf(format, args...),
	}
}

func replayHint(stored Checkpoint) string {
	at, what := stored.CommitTime, "the commit time the checkpoint covers"
	if at.IsZero() {
		at, what = stored.UpdatedAt, "when the checkpoint was saved (later than the commit it covers if the relay was behind)"
	}
	if at.IsZero() {
		return "replay them from the outbox table with `cdc-relay replay --since <time of the last delivered event>`"
	}
	return fmt.Sprintf("replay them from the outbox table with `cdc-relay replay --since %s`, %s, "+
		"less the duration of your longest write transaction (created_at is a transaction's start; "+
		"replayed events keep their ids, so idempotent consumers drop repeats)",
		at.UTC().Format(time.RFC3339), what)
}

func savedAt(stored Checkpoint) string {
	if stored.UpdatedAt.IsZero() {
		return "at an unknown time"
	}
	return "at " + stored.UpdatedAt.UTC().Format(time.RFC3339)
}

func slotDesc(s SlotState) string {
	if !s.Exists {
		return "missing"
	}
	return "at " + s.ConfirmedFlush.String()
}

// The SQL in messages assumes the default checkpoint table; a relay configured with
// another table or a file store is told so.
func deleteSQL(slot string) string {
	return fmt.Sprintf("`DELETE FROM %s WHERE slot_name = %s;` (or remove the slot's entry from the checkpoint table or file the relay is configured with)",
		DefaultTable, sqlString(slot))
}

func deleteIf(haveStored bool, slot string) string {
	if !haveStored {
		return ""
	}
	return ", delete the checkpoint with " + deleteSQL(slot) + ","
}

func updateSQL(slot string, lsn pglogrepl.LSN) string {
	return fmt.Sprintf("`UPDATE %s SET lsn = '%s', updated_at = now() WHERE slot_name = %s;`",
		DefaultTable, lsn, sqlString(slot))
}

func dropSlotSQL(slot string) string {
	return fmt.Sprintf("`SELECT pg_drop_replication_slot(%s);`", sqlString(slot))
}

// sqlString quotes s as an SQL string literal.
func sqlString(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
