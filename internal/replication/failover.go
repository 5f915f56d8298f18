package replication

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// The failover modes of a slot (the relay's SlotFailover setting).
const (
	// FailoverAuto makes the slot a failover slot where the server supports
	// it (PostgreSQL 17 and later) and leaves it alone below.
	FailoverAuto = "auto"
	// FailoverOn requires a failover slot: the relay refuses to start on a
	// server older than 17.
	FailoverOn = "on"
	// FailoverOff neither creates a failover slot nor switches one on.
	FailoverOff = "off"
)

// FailoverMinVersion is the first server_version_num with failover slots
// (CREATE_REPLICATION_SLOT … (FAILOVER), pg_replication_slots.failover).
const FailoverMinVersion = 170000

// ServerVersion returns the server's server_version_num, e.g. 150014.
func ServerVersion(ctx context.Context, db QueryRower) (int, error) {
	var s string
	if err := db.QueryRow(ctx, "SHOW server_version_num").Scan(&s); err != nil {
		return 0, fmt.Errorf("read server_version_num: %w", err)
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("read server_version_num: parse %q: %w", s, err)
	}
	return v, nil
}

// VersionName renders a server_version_num as the release users know:
// 170002 is "17.2", 90624 "9.6.24".
func VersionName(num int) string {
	if num >= 100000 {
		return fmt.Sprintf("%d.%d", num/10000, num%10000)
	}
	return fmt.Sprintf("%d.%d.%d", num/10000, num/100%100, num%100)
}

// WantFailover resolves mode (FailoverAuto, FailoverOn or FailoverOff; ""
// is FailoverAuto) against the server's server_version_num: whether the
// relay's slot is to be a failover slot. FailoverOn on a server older than 17
// is a *ConfigError naming the SlotFailover setting of names.
func WantFailover(mode string, version int, names setting.Namer) (bool, error) {
	supported := version >= FailoverMinVersion
	switch mode {
	case FailoverAuto, "":
		return supported, nil
	case FailoverOff:
		return false, nil
	case FailoverOn:
		if !supported {
			return false, fieldErr(names, "SlotFailover", "failover slots need PostgreSQL 17 or later, but the server is PostgreSQL %s (server_version_num %d): upgrade the server, or set the slot's failover to auto (a failover slot where the server has them) or off",
				VersionName(version), version)
		}
		return true, nil
	}
	return false, fieldErr(names, "SlotFailover", "unknown slot failover mode %q: use auto, on or off", mode)
}

// FailoverState is what makes a failover of the server safe for the slot, as
// the server reports it. On a server older than 17 only ServerVersion is set.
type FailoverState struct {
	ServerVersion int  // server_version_num
	SlotExists    bool // the slot exists (17+)
	// SlotFailover is pg_replication_slots.failover: the slot is synchronized
	// to standbys that have sync_replication_slots on.
	SlotFailover bool
	// SlotSynced is pg_replication_slots.synced: the slot was synchronized
	// from a primary (true on a promoted standby's copy, too).
	SlotSynced bool
	// StandbySlots is the setting synchronized_standby_slots: the physical
	// slots of the standbys that must have received WAL before a logical
	// walsender of a failover slot sends it. "" when unset.
	StandbySlots string
	// InRecovery: the server is a standby.
	InRecovery bool
}

// Supported reports whether the server has failover slots (17+).
func (s FailoverState) Supported() bool { return s.ServerVersion >= FailoverMinVersion }

// ReadFailover reads the failover facts of slot. Below 17 it reads only the
// version: the columns and the setting do not exist there.
func ReadFailover(ctx context.Context, db QueryRower, slot string) (FailoverState, error) {
	var s FailoverState
	var err error
	if s.ServerVersion, err = ServerVersion(ctx, db); err != nil {
		return s, err
	}
	if !s.Supported() {
		return s, nil
	}
	var failover, synced *bool
	err = db.QueryRow(ctx, `SELECT current_setting('synchronized_standby_slots'), pg_is_in_recovery(),
			(SELECT failover FROM pg_replication_slots WHERE slot_name = $1),
			(SELECT synced FROM pg_replication_slots WHERE slot_name = $1)`, slot).
		Scan(&s.StandbySlots, &s.InRecovery, &failover, &synced)
	if err != nil {
		return s, fmt.Errorf("read the failover state of replication slot %q: %w", slot, err)
	}
	s.SlotExists = failover != nil
	s.SlotFailover = failover != nil && *failover
	s.SlotSynced = synced != nil && *synced
	return s, nil
}

// StandbyFlush is how far the standbys that a failover slot waits for have
// the primary's WAL, read in one query (ReadStandbyFlush).
type StandbyFlush struct {
	// WALEnd is the server's WAL insert position when read: past the end of
	// every transaction committed before the read began.
	WALEnd pglogrepl.LSN
	// Slots is synchronized_standby_slots, "" when unset.
	Slots string
	// Flushed is the least position the standbys of Slots have flushed:
	// their physical slots' restart_lsn, which the walsender of a failover
	// slot waits for too. A named slot that is missing, not physical,
	// invalidated or never used (restart_lsn NULL) counts as 0, as the
	// walsender waits for it then. 0 when Slots is "".
	Flushed pglogrepl.LSN
}

// standbyFlushSQL splits synchronized_standby_slots as Postgres does for
// the names a slot may have (lower case, digits, underscores: no quotes
// needed, though a quoted name is allowed).
const standbyFlushSQL = `WITH named AS (
	SELECT btrim(n, ' "') AS name
	FROM unnest(string_to_array(current_setting('synchronized_standby_slots'), ',')) AS n
	WHERE btrim(n, ' "') <> ''
)
SELECT pg_current_wal_insert_lsn()::text, current_setting('synchronized_standby_slots'),
	(SELECT min(CASE WHEN s.slot_type = 'physical' AND s.invalidation_reason IS NULL AND s.restart_lsn IS NOT NULL
		THEN s.restart_lsn ELSE '0/0'::pg_lsn END)::text
	FROM named LEFT JOIN pg_replication_slots s ON s.slot_name = named.name)`

// ReadStandbyFlush reads, on a primary of PostgreSQL 17 or later, where its
// WAL ends and how far the standbys of synchronized_standby_slots have
// flushed it.
func ReadStandbyFlush(ctx context.Context, db QueryRower) (StandbyFlush, error) {
	var s StandbyFlush
	var end string
	var flushed *string
	if err := db.QueryRow(ctx, standbyFlushSQL).Scan(&end, &s.Slots, &flushed); err != nil {
		return s, fmt.Errorf("read how far the standbys of synchronized_standby_slots have flushed the WAL: %w", err)
	}
	var err error
	if s.WALEnd, err = pglogrepl.ParseLSN(end); err != nil {
		return s, fmt.Errorf("parse the WAL insert position %q: %w", end, err)
	}
	if flushed != nil {
		if s.Flushed, err = pglogrepl.ParseLSN(*flushed); err != nil {
			return s, fmt.Errorf("parse the standbys' flush position %q: %w", *flushed, err)
		}
	}
	return s, nil
}

// createSlotCommand is the CREATE_REPLICATION_SLOT command of a pgoutput
// slot. snapshot is "nothing" or "export". With failover it uses the
// option-list syntax of PostgreSQL 15 and later (FAILOVER exists from 17);
// without it the old syntax every supported version accepts.
func createSlotCommand(slot, snapshot string, failover bool) string {
	if failover {
		return fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT '%s', FAILOVER true)", slot, snapshot)
	}
	old := map[string]string{"nothing": "NOEXPORT_SNAPSHOT", "export": "EXPORT_SNAPSHOT"}[snapshot]
	return fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput %s", slot, old)
}

// createSlot sends createSlotCommand on a replication connection.
func createSlot(ctx context.Context, conn *pgconn.PgConn, slot, snapshot string, failover bool) (pglogrepl.CreateReplicationSlotResult, error) {
	return pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx, createSlotCommand(slot, snapshot, failover)))
}

// alterSlotWait bounds how long ALTER_REPLICATION_SLOT may wait for the slot:
// the server waits, without a bound, for a process streaming it to let go.
const alterSlotWait = 5 * time.Second

// EnableFailover switches the failover option of an existing slot on
// (ALTER_REPLICATION_SLOT … (FAILOVER true), PostgreSQL 17+) through a
// replication connection with url. The slot must not be in use: a slot
// another process streams is ErrSlotBusy, which the caller may retry. names
// names the caller's settings (its PGURL and SlotFailover) in errors.
func EnableFailover(ctx context.Context, url, slot string, names setting.Namer) error {
	if !ValidName(slot) { // it is spliced into the commands below
		return fmt.Errorf("switch on failover of replication slot %q: invalid slot name", slot)
	}
	conn, err := ConnectReplication(ctx, url, names)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	// A replication=database connection takes SQL too. The server would wait
	// for an active slot rather than fail: ask first, and bound the wait for
	// one acquired in between.
	res, err := conn.Exec(ctx, fmt.Sprintf("SELECT active FROM pg_replication_slots WHERE slot_name = '%s'", slot)).ReadAll()
	if err != nil {
		return fmt.Errorf("switch on failover of replication slot %q: read whether it is in use: %w", slot, err)
	}
	if len(res) == 1 && len(res[0].Rows) == 1 && string(res[0].Rows[0][0]) == "t" {
		return fmt.Errorf("switch on failover of replication slot %q: %w", slot, ErrSlotBusy)
	}
	actx, cancel := context.WithTimeout(ctx, alterSlotWait)
	defer cancel()
	_, err = conn.Exec(actx, fmt.Sprintf("ALTER_REPLICATION_SLOT %s (FAILOVER true)", slot)).ReadAll()
	if err == nil {
		return nil
	}
	if ctx.Err() == nil && actx.Err() != nil {
		return fmt.Errorf("switch on failover of replication slot %q: %w (it was acquired while the relay waited %s)", slot, ErrSlotBusy, alterSlotWait)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "55006":
			return fmt.Errorf("switch on failover of replication slot %q: %w: %s", slot, ErrSlotBusy, pgErr.Message)
		case "42501":
			return configErr("switch on failover of replication slot %q: %s: grant the relay's role REPLICATION (ALTER ROLE <role> REPLICATION;), or switch it on as a superuser with psql \"dbname=<db> replication=database\" -c 'ALTER_REPLICATION_SLOT %s (FAILOVER true)', or set the slot's failover %s to off",
				slot, pgErr.Message, slot, names.Name("SlotFailover"))
		}
	}
	return fmt.Errorf("switch on failover of replication slot %q: %w", slot, err)
}
