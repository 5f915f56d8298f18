package gaps

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// GapKind tells apart the reasons Reconcile refuses to start.
type GapKind int

// The gaps the slot checks report as *GapError. Each may have lost events:
// none is retried.
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
	// TableJoined: the relay reads an outbox table the publication did not
	// cover at the stored checkpoint, and it did not add it itself.
	TableJoined
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
	case TableJoined:
		return "table_joined"
	default:
		return fmt.Sprintf("gap_kind_%d", int(k))
	}
}

// GapError is returned by the slot checks (Checker.Slot, Reconcile) when starting would silently skip or misplace
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

// The names of the slot checks callers act upon.
const (
	// CheckSnapshotIncomplete: the stored checkpoint is the marker of an
	// initial snapshot that did not complete; a relay with --snapshot initial
	// takes it again.
	CheckSnapshotIncomplete = "snapshot_incomplete"
	// CheckSlotDatabase: the slot belongs to another database.
	CheckSlotDatabase = "slot_other_database"
	// CheckWALUnreserved: the slot has wal_status unreserved (at start and
	// in status; the watch says it as a change of CheckWALStatus).
	CheckWALUnreserved = "wal_unreserved"
)

// slotChecks compare the stored checkpoint of the slot with the slot itself at
// start-up (PhaseSlot).
//
// Without a stored checkpoint this is a first run: a missing slot is fine (the caller
// creates it) and an existing one is used from its confirmed position. With one, the
// slot must exist on the same system, use pgoutput, still have its WAL, and not be
// ahead of the store — the relay writes the store before confirming the slot, so a
// slot ahead was moved by someone else or recreated. Streaming then starts at the
// slot's confirmed position, redelivering what lies between it and the store
// (checkpoint.Opening.StartFrom).
//
// Their fatal findings are *GapErrors (Kind.String() is the check's name),
// except the slot of another database and an unfinished snapshot, which are
// configuration errors.
func slotChecks() []Check {
	return []Check{
		{CheckSlotDatabase, judgeSlotDatabase},
		{CheckSnapshotIncomplete, func(f *Facts) Finding {
			if !f.SnapshotPending {
				return Finding{}
			}
			if f.RetakeSnapshot {
				return Finding{Verdict: Repair}
			}
			slot := f.Setup.Slot
			return fatal(&replication.ConfigError{Msg: fmt.Sprintf("the initial snapshot of replication slot %q (started by relay %q at %s) did not complete, so rows already in the outbox may be missing downstream: "+
				"restart with the initial snapshot on "+f.Setup.Names.Name("Snapshot")+" to drop the slot and take the snapshot again; "+
				"or, to give it up, drop the slot with SELECT pg_drop_replication_slot('%s'); and delete its checkpoint (the row slot_name = '%s' of the checkpoint table, or the checkpoint file), then restart",
				slot, f.Stored.RelayName, f.Stored.UpdatedAt.UTC().Format(time.RFC3339), slot, slot)})
		}},
		{"slot_active", func(f *Facts) Finding {
			s := f.Slot
			if !s.Exists || !s.Active {
				return Finding{}
			}
			return warn(fmt.Sprintf(
				"replication slot %q is in use by process %d; streaming cannot start until it disconnects "+
					"(another relay on the same slot, or one that is still shutting down): "+
					"SELECT pid, application_name, client_addr FROM pg_stat_replication WHERE pid = %d;",
				f.Setup.Slot, s.ActivePID, s.ActivePID))
		}},
		{CheckWALUnreserved, judgeUnreserved},
		{"no_system_id", func(f *Facts) Finding {
			if !f.HaveStored || f.Stored.SystemID != "" {
				return Finding{}
			}
			return warn(fmt.Sprintf(
				"the stored checkpoint of replication slot %q has no system identifier, so a restored or cloned database "+
					"cannot be detected this time; the next save records system %s", f.Setup.Slot, f.SystemID))
		}},
		{SystemChanged.String(), func(f *Facts) Finding {
			stored, s, slot := f.Stored, f.Slot, f.Setup.Slot
			if !f.HaveStored || stored.SystemID == "" || stored.SystemID == f.SystemID {
				return Finding{}
			}
			return fatal(gap(SystemChanged, slot, stored, s,
				"the checkpoint of replication slot %q (LSN %s, saved %s) was written on the Postgres system %s, "+
					"but the server now reports system %s: the database was restored from a backup, cloned, "+
					"or the relay points at a different cluster. LSNs of the old system mean nothing here "+
					"(the slot here is %s), so events may be missing or repeated. "+
					"If this is the server the relay should follow, check that its outbox holds what you expect, then "+
					"drop a slot copied along with the data, %s, remove the stale checkpoint with %s and restart the relay, "+
					"which creates a new slot. To recover events since the old checkpoint, %s",
				slot, stored.LSN, savedAt(stored), stored.SystemID, f.SystemID,
				slotDesc(s), dropSlotSQL(slot), deleteSQL(slot), replayHint(stored, f.Setup.Names)))
		}},
		{SlotMissing.String(), judgeSlotMissing},
		{WrongPlugin.String(), judgeWrongPlugin},
		{SlotLost.String(), judgeSlotLost},
		{SlotAhead.String(), judgeSlotAhead},
		{TableJoined.String(), func(f *Facts) Finding {
			stored, s := f.Stored, f.Slot
			if !f.HaveStored || f.SnapshotPending || stored.Tables == nil || !s.Exists || f.Setup.NoTable() {
				return Finding{}
			}
			var unproven []string
			for _, t := range f.Setup.PerTable() {
				name := t.Schema + "." + t.Table
				if !slices.Contains(stored.Tables, name) && !slices.Contains(f.Joined, name) {
					unproven = append(unproven, name)
				}
			}
			if len(unproven) == 0 {
				return Finding{}
			}
			return fatal(tableJoinedGap(f, unproven))
		}},
		{"slot_behind", func(f *Facts) Finding {
			stored, s := f.Stored, f.Slot
			if !f.HaveStored || !s.Exists || s.ConfirmedFlush >= stored.LSN {
				return Finding{}
			}
			return warn(fmt.Sprintf(
				"replication slot %q has confirmed up to %s, behind the stored checkpoint %s: "+
					"events committed between them were already delivered and may be delivered again",
				f.Setup.Slot, s.ConfirmedFlush, stored.LSN))
		}},
		{"no_checkpoint", func(f *Facts) Finding {
			s := f.Slot
			if f.HaveStored || !s.Exists {
				return Finding{}
			}
			return warn(fmt.Sprintf(
				"no stored checkpoint for replication slot %q, which already exists: starting from its confirmed position %s; "+
					"events a previous relay sent but did not confirm will be delivered again",
				f.Setup.Slot, s.ConfirmedFlush))
		}},
	}
}

// The judgments of the slot that more than one phase makes (the start-up,
// status; the watch for wal_status unreserved): one function each, so that
// every caller gives the same verdict in the same words.

// judgeSlotDatabase: the slot belongs to another database.
func judgeSlotDatabase(f *Facts) Finding {
	s, slot := f.Slot, f.Setup.Slot
	if !s.Exists || s.Database == f.Database {
		return Finding{}
	}
	return fatal(&replication.ConfigError{Err: f.Setup.Names.Errorf("Slot", "replication slot %q belongs to database %q, not %q: choose another slot or connect to %q", slot, s.Database, f.Database, s.Database)})
}

// judgeUnreserved: the slot needs more WAL than max_slot_wal_keep_size
// keeps; the next checkpoint loses it unless the relay catches up.
func judgeUnreserved(f *Facts) Finding {
	if !f.Slot.Exists || f.Slot.WALStatus != "unreserved" {
		return Finding{}
	}
	return Finding{Verdict: Alert, Msg: unreservedMsg(f), Fields: walFields(f)}
}

// unreservedMsg explains wal_status unreserved and what buys time.
func unreservedMsg(f *Facts) string {
	return fmt.Sprintf("replication slot %q has wal_status 'unreserved': it needs more WAL than max_slot_wal_keep_size (%d bytes) keeps, "+
		"and Postgres removes that WAL at its next checkpoint unless the relay catches up first; the slot is then lost and the relay stops. "+
		"Buy time now if pg_wal's disk allows: ALTER SYSTEM SET max_slot_wal_keep_size = '<larger>'; SELECT pg_reload_conf();",
		f.Setup.Slot, f.Slot.WALKeepSize)
}

// walFields are the log fields of a wal_status finding.
func walFields(f *Facts) map[string]any {
	fields := map[string]any{"wal_status": walStatus(f.Slot), "was": f.Prev.WALStatus}
	if f.Slot.SafeWALSize != nil {
		fields["safe_wal_size"] = *f.Slot.SafeWALSize
	}
	return fields
}

// judgeSlotMissing: a checkpoint is stored, but the slot does not exist.
func judgeSlotMissing(f *Facts) Finding {
	stored, s, slot := f.Stored, f.Slot, f.Setup.Slot
	if !f.HaveStored || s.Exists {
		return Finding{}
	}
	return fatal(gap(SlotMissing, slot, stored, s,
		"replication slot %q does not exist, but the checkpoint store has LSN %s for it (saved %s): "+
			"the slot was dropped, or the relay points at another database. "+
			"Events committed after %s until a new slot is created cannot be streamed and would be missing downstream. "+
			"To accept that gap, delete the checkpoint with %s and restart the relay, which creates a new slot "+
			"and streams from then on. To recover the events, %s",
		slot, stored.LSN, savedAt(stored), stored.LSN, deleteSQL(slot), replayHint(stored, f.Setup.Names)))
}

// judgeWrongPlugin: the slot does not use pgoutput.
func judgeWrongPlugin(f *Facts) Finding {
	s := f.Slot
	if !s.Exists || s.Plugin == "pgoutput" {
		return Finding{}
	}
	storedAt, lost := lostAfter(f)
	slot := f.Setup.Slot
	return fatal(gap(WrongPlugin, slot, f.Stored, s,
		"replication slot %q uses output plugin %q, but the relay needs \"pgoutput\" (the slot is at %s, %s). "+
			"It probably belongs to another application: give the relay its own slot name. "+
			"If the slot is abandoned, drop it with %s%s and restart the relay, which creates a pgoutput slot. %s",
		slot, s.Plugin, s.ConfirmedFlush, storedAt, dropSlotSQL(slot), deleteIf(f.HaveStored, slot), lost))
}

// judgeSlotLost: Postgres invalidated the slot (before streaming: the watch
// says it with the words of invalidatedWhileStreaming).
func judgeSlotLost(f *Facts) Finding {
	s := f.Slot
	invalid, reason := s.Invalidated()
	if !invalid {
		return Finding{}
	}
	storedAt, lost := lostAfter(f)
	slot := f.Setup.Slot
	return fatal(gap(SlotLost, slot, f.Stored, s,
		"replication slot %q is invalidated (%s; confirmed at %s, %s): %s. %s "+
			"To continue, drop the slot with %s%s and restart the relay, which creates a new one. %s",
		slot, invalidDesc(s, reason), s.ConfirmedFlush, storedAt, invalidCause(reason), lost,
		dropSlotSQL(slot), deleteIf(f.HaveStored, slot), invalidPrevent(reason)))
}

// judgeSlotAhead: the slot confirmed past the stored checkpoint. The marker
// of an initial snapshot (SnapshotPending, LSN 0/0) is no position. On a
// promoted standby whose copy of a failover slot it is (synced), it says
// why that happens and what tells the cases apart; it stops the relay all
// the same, as the relay cannot tell them apart itself.
func judgeSlotAhead(f *Facts) Finding {
	stored, s, slot := f.Stored, f.Slot, f.Setup.Slot
	if !f.HaveStored || f.SnapshotPending || !s.Exists || s.ConfirmedFlush <= stored.LSN {
		return Finding{}
	}
	if s.Synced && !s.InRecovery {
		return fatal(gap(SlotAhead, slot, stored, s,
			"replication slot %q has confirmed up to %s, past the stored checkpoint %s (saved %s). "+
				"This server was promoted, and the slot is the copy it synchronized from its primary (synced): its position was confirmed on that primary, "+
				"while the checkpoint is the one this server had replayed when it was promoted. The relay confirms a failover slot only once the standbys "+
				"named in synchronized_standby_slots have flushed the checkpoint that covers the position, so this server was not among them, "+
				"or a relay older than that rule, or another consumer of the slot, confirmed it. "+
				"If the relay was the slot's only consumer, the events up to %s reached Kafka before the promotion (it confirms nothing Kafka has not acknowledged): "+
				"accept the slot's position with %s and restart the relay. "+
				"Otherwise events committed between %s and %s may never have reached Kafka: to recover them, %s; then accept the slot's position and restart the relay. "+
				"Name every standby that may be promoted in synchronized_standby_slots on the primary (docs/postgres.md, Failover)",
			slot, s.ConfirmedFlush, stored.LSN, savedAt(stored), s.ConfirmedFlush, updateSQL(slot, s.ConfirmedFlush),
			stored.LSN, s.ConfirmedFlush, replayHint(stored, f.Setup.Names)))
	}
	return fatal(gap(SlotAhead, slot, stored, s,
		"replication slot %q has confirmed up to %s, past the stored checkpoint %s (saved %s). "+
			"The relay writes its checkpoint before it confirms the slot, so another consumer advanced the slot "+
			"(a second relay or tool using the same slot name, pg_replication_slot_advance) or it was dropped and recreated; "+
			"events committed between %s and %s may never have reached Kafka. "+
			"Find out who uses the slot (SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s;). "+
			"To recover the events, %s; then accept the slot's position with %s and restart the relay",
		slot, s.ConfirmedFlush, stored.LSN, savedAt(stored), stored.LSN, s.ConfirmedFlush,
		sqlString(slot), replayHint(stored, f.Setup.Names), updateSQL(slot, s.ConfirmedFlush)))
}

// Reconcile runs the slot checks over a slot's state without reading or
// logging anything (DESIGN invariant 6): systemID is what IDENTIFY_SYSTEM
// reports now; haveStored is false when the store has no checkpoint for slot.
// It returns the warnings to log, or the first refusal: a *GapError, or a
// *replication.ConfigError for a slot of another database. Checker.Slot is
// what the relay calls; Reconcile is its pure part.
func Reconcile(slot, systemID string, stored checkpoint.Checkpoint, haveStored bool, s replication.SlotState) ([]string, error) {
	f := &Facts{
		Setup: replication.SetupConfig{Slot: slot}, SystemID: systemID, Database: s.Database,
		Stored: stored, HaveStored: haveStored, Slot: s,
	}
	r := Judge(PhaseSlot, f)
	if r.Err != nil {
		return nil, r.Err
	}
	var warnings []string
	for _, n := range r.Findings {
		warnings = append(warnings, n.Msg)
	}
	return warnings, nil
}

// invalidDesc names what pg_replication_slots shows of an invalidated slot.
func invalidDesc(s replication.SlotState, reason string) string {
	parts := []string{"wal_status '" + s.WALStatus + "'"}
	if s.InvalidationReason != "" {
		parts = append(parts, "invalidation_reason '"+s.InvalidationReason+"'")
	}
	if s.Conflicting != nil && *s.Conflicting {
		parts = append(parts, "conflicting")
	}
	if s.WALStatus == "" {
		parts = parts[1:]
	}
	if len(parts) == 0 {
		return reason
	}
	return strings.Join(parts, ", ")
}

// invalidCause explains an invalidation reason (Invalidated's).
func invalidCause(reason string) string {
	switch reason {
	case "wal_removed":
		return "Postgres removed WAL the slot still needed because it fell further behind than max_slot_wal_keep_size allows"
	case "rows_removed", "conflict":
		return "the slot is on a standby and the primary removed catalog rows it still needed (a conflict with recovery; hot_standby_feedback off, or no physical slot between them)"
	case "wal_level_insufficient":
		return "wal_level on the primary was lowered below logical"
	case "idle_timeout":
		return "the slot was inactive for longer than idle_replication_slot_timeout"
	}
	if reason == "" {
		return "Postgres invalidated it"
	}
	return "Postgres invalidated it (" + reason + ")"
}

// invalidPrevent says how to keep an invalidation from recurring.
func invalidPrevent(reason string) string {
	switch reason {
	case "rows_removed", "conflict":
		return "To keep it from recurring, set hot_standby_feedback = on on the standby and use a physical replication slot between primary and standby."
	case "wal_level_insufficient":
		return "Keep wal_level = logical on the primary."
	case "idle_timeout":
		return "To keep it from recurring, keep the relay running or raise idle_replication_slot_timeout."
	}
	return "To keep it from recurring, keep the relay running or raise the limit: " +
		"ALTER SYSTEM SET max_slot_wal_keep_size = '<size>'; SELECT pg_reload_conf(); " +
		"and alert on cdc_relay_slot_safe_wal_size_bytes (deploy/prometheus/alerts.yml)."
}

// lostAfter describes the stored checkpoint and what a slot the relay cannot
// stream from loses after it.
func lostAfter(f *Facts) (storedAt, lost string) {
	if !f.HaveStored {
		return "no stored checkpoint", "Nothing was stored for this slot yet, so no relay position is affected."
	}
	return "stored checkpoint " + f.Stored.LSN.String(),
		fmt.Sprintf("Events committed after the stored checkpoint %s cannot be streamed; to recover them, %s.",
			f.Stored.LSN, replayHint(f.Stored, f.Setup.Names))
}

func warn(msg string) Finding { return Finding{Verdict: Warn, Msg: msg} }
func fatal(err error) Finding { return Finding{Verdict: Fatal, Err: err} }

// gap builds a *GapError.
func gap(kind GapKind, slot string, stored checkpoint.Checkpoint, s replication.SlotState, format string, args ...any) *GapError {
	return &GapError{
		Kind:      kind,
		Slot:      slot,
		StoredLSN: stored.LSN,
		SlotLSN:   s.ConfirmedFlush,
		msg:       fmt.Sprintf("reconcile slot %q: %s: ", slot, kind) + fmt.Sprintf(format, args...),
	}
}

// tableJoinedGap is the gap of outbox tables the relay reads now that the
// publication did not cover at the stored checkpoint (Checkpoint.Tables),
// and that joined the publication before this start (the relay adds a table
// itself with the rows it holds: relay.joinSnapshot). Postgres never streams
// a row committed while its table was outside the publication: the relay
// cannot prove that none of the rows committed since the checkpoint is
// missing. A table that only left the relay's list and came back, staying in
// the publication, is named by the checkpoint: the stream carries its rows.
func tableJoinedGap(f *Facts, tables []string) *GapError {
	stored, slot := f.Stored, f.Setup.Slot
	list := strings.Join(tables, ", ")
	var quoted []string
	for _, t := range tables {
		schema, table, _ := strings.Cut(t, ".")
		quoted = append(quoted, pgx.Identifier{schema, table}.Sanitize())
	}
	at := stored.CommitTime
	if at.IsZero() {
		at = stored.UpdatedAt
	}
	since := at.UTC().Format(time.RFC3339)
	replay := ""
	for _, t := range tables {
		replay += "`" + f.Setup.Names.Command("replay", "table", t, "since", since) + "` "
	}
	return gap(TableJoined, slot, stored, f.Slot,
		"the relay reads outbox table %s, which publication %q covers, but the publication did not cover it at the relay's stored checkpoint (LSN %s, saved %s): "+
			"the table was added to the publication since, without the relay adding it (ALTER PUBLICATION … ADD TABLE by hand). "+
			"Rows committed into it after the checkpoint and before that change may be missing downstream: Postgres never streams the rows committed while a table is outside the publication "+
			"(it decodes with the publication as it was), and the relay cannot tell which. "+
			"To publish them, remove the table from the publication (ALTER PUBLICATION %s DROP TABLE %s;) and restart the relay allowed to change the publication "+
			f.Setup.Names.Name("CreatePublication")+": it adds the table back and publishes every row it holds (cdc_relay_snapshot: join; rows the stream carries too arrive twice). "+
			"Or republish them yourself, less the duration of your longest write transaction (created_at is a transaction's start): %s"+
			"and then accept the table with `UPDATE %s SET outbox_tables = NULL WHERE slot_name = %s;` (or remove outbox_tables from the slot's entry in the checkpoint file) and restart the relay",
		list, f.Setup.Publication, stored.LSN, savedAt(stored),
		pgx.Identifier{f.Setup.Publication}.Sanitize(), strings.Join(quoted, ", "), replay, checkpoint.DefaultTable, sqlString(slot))
}

func replayHint(stored checkpoint.Checkpoint, names setting.Namer) string {
	at, what := stored.CommitTime, "the commit time the checkpoint covers"
	if at.IsZero() {
		at, what = stored.UpdatedAt, "when the checkpoint was saved (later than the commit it covers if the relay was behind)"
	}
	if at.IsZero() {
		return "replay them from the outbox table with `" + names.Command("replay", "since", "<time of the last delivered event>") + "`"
	}
	return fmt.Sprintf("replay them from the outbox table with `%s`, %s, "+
		"less the duration of your longest write transaction (created_at is a transaction's start; "+
		"replayed events keep their ids, so idempotent consumers drop repeats)",
		names.Command("replay", "since", at.UTC().Format(time.RFC3339)), what)
}

func savedAt(stored checkpoint.Checkpoint) string {
	if stored.UpdatedAt.IsZero() {
		return "at an unknown time"
	}
	return "at " + stored.UpdatedAt.UTC().Format(time.RFC3339)
}

func slotDesc(s replication.SlotState) string {
	if !s.Exists {
		return "missing"
	}
	return "at " + s.ConfirmedFlush.String()
}

// The SQL in messages assumes the default checkpoint table; a relay configured with
// another table or a file store is told so.
func deleteSQL(slot string) string {
	return fmt.Sprintf("`DELETE FROM %s WHERE slot_name = %s;` (or remove the slot's entry from the checkpoint table or file the relay is configured with)",
		checkpoint.DefaultTable, sqlString(slot))
}

func deleteIf(haveStored bool, slot string) string {
	if !haveStored {
		return ""
	}
	return ", delete the checkpoint with " + deleteSQL(slot) + ","
}

func updateSQL(slot string, lsn pglogrepl.LSN) string {
	return fmt.Sprintf("`UPDATE %s SET lsn = '%s', updated_at = now() WHERE slot_name = %s;`",
		checkpoint.DefaultTable, lsn, sqlString(slot))
}

func dropSlotSQL(slot string) string {
	return fmt.Sprintf("`SELECT pg_drop_replication_slot(%s);`", sqlString(slot))
}

// sqlString quotes s as an SQL string literal.
func sqlString(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
