package replication

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// ConfigError is a problem an operator must fix before the relay can run. Its
// message says what is wrong and how to fix it, with the SQL to run where there
// is one. When Err is set (a *setting.FieldError naming the setting), the
// message is Err's.
type ConfigError struct {
	Msg string
	Err error
}

func (e *ConfigError) Error() string {
	if e.Err != nil {
		return e.Err.Error()
	}
	return e.Msg
}

// Unwrap returns Err.
func (e *ConfigError) Unwrap() error { return e.Err }

// fieldErr is a *ConfigError naming the setting field.
func fieldErr(names setting.Namer, field, format string, args ...any) error {
	return &ConfigError{Err: names.Errorf(field, format, args...)}
}

func configErr(format string, args ...any) error {
	return &ConfigError{Msg: fmt.Sprintf(format, args...)}
}

// Column is a column the relay needs, with the configuration field that
// names it (for setting.FieldError).
type Column struct {
	Name  string
	Field string
}

// SetupConfig says what Prepare checks and may create.
type SetupConfig struct {
	Slot          string
	Publication   string
	Schema, Table string
	// Also names further outbox tables (several outboxes behind one
	// relay), each with the columns it must have: each is checked as Table
	// is, and the publication covers them all.
	Also              []TableSetup
	TableField        string // the configuration field naming the table
	Columns           []Column
	CreatePublication bool
	// PublishUpdates says the relay must see UPDATEs of the outbox table
	// (delivery.on_outbox_update other than ignore): the publication it creates
	// publishes inserts and updates, and an existing one must publish both.
	PublishUpdates bool
	// Messages says the relay streams logical decoding messages (the
	// message outbox; pgoutput's messages option, PostgreSQL 14+), under
	// MessagesField. Table may then be empty: the relay reads no table and
	// the publication it creates covers none.
	Messages bool
	// JoinSnapshot, set when the slot exists (the stream resumes from a
	// position before any change made now), records the join of outbox
	// tables to the publication with the snapshot that holds their rows the
	// stream never carries, in the transaction that adds them (JoinTables).
	// Nil when the slot is yet to be created: it streams every table of the
	// publication from its creation, so a table may join with a plain ALTER
	// PUBLICATION.
	JoinSnapshot func(ctx context.Context, tx pgx.Tx, tables []decoder.TableName, snapshot string) error
	// PartialCoverage judges an existing publication that covers some of
	// the outbox tables and not others, given the Coverage of each table of
	// PerTable (gaps.PartialCoverage, the one owner of that judgment): it
	// returns the tables CheckServer adds to it, or the error to stop with.
	// Nil leaves such a publication as it is: the gap checks
	// (gaps.Checker.Publication) then refuse the uncovered table.
	PartialCoverage func(cfg SetupConfig, covs []Coverage) ([]decoder.TableName, error)

	// Names names the settings in messages: the fields of the caller's
	// configuration that TableField and each Column's Field name, and its
	// CreatePublication.
	Names setting.Namer
}

// NoTable reports whether the relay reads no outbox table (a message outbox
// alone): the table checks do not apply.
func (c SetupConfig) NoTable() bool { return c.Table == "" }

// MinMessagesVersion is the first server version (server_version_num) whose
// pgoutput streams logical decoding messages (its messages option).
const MinMessagesVersion = 140000

// TableSetup is a further outbox table of a SetupConfig and the columns
// the relay reads from it.
type TableSetup struct {
	Name    decoder.TableName
	Columns []Column
}

// PerTable returns one SetupConfig per outbox table (Table, then each of
// Also), each naming that table alone: the checks of one table run on each.
// A message outbox alone (NoTable) gives itself.
func (c SetupConfig) PerTable() []SetupConfig {
	out := []SetupConfig{c}
	out[0].Also = nil
	for _, t := range c.Also {
		o := c
		o.Schema, o.Table, o.Columns, o.Also = t.Name.Schema, t.Name.Table, t.Columns, nil
		out = append(out, o)
	}
	return out
}

// qualifiedTables returns every outbox table, quoted for SQL: Table first.
func (c SetupConfig) qualifiedTables() []string {
	var ts []string
	if !c.NoTable() {
		ts = append(ts, c.QualifiedTable())
	}
	for _, t := range c.Also {
		ts = append(ts, pgx.Identifier{t.Name.Schema, t.Name.Table}.Sanitize())
	}
	return ts
}

// QualifiedTable returns schema.table quoted for SQL.
func (c SetupConfig) QualifiedTable() string {
	return pgx.Identifier{c.Schema, c.Table}.Sanitize()
}

// CheckServer verifies wal_level, the outbox table and its columns, and that
// the publication exists (creating it when allowed and missing). Every failure
// is a *ConfigError naming the fix. Whether the publication streams the
// table's inserts is a gap check (internal/gaps, Checker.Publication).
func CheckServer(ctx context.Context, conn *pgx.Conn, cfg SetupConfig) error {
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		return configErr("wal_level is %q but logical replication needs \"logical\": run ALTER SYSTEM SET wal_level = logical; and restart PostgreSQL", walLevel)
	}

	if !cfg.NoTable() {
		for _, t := range cfg.PerTable() {
			if err := checkTable(ctx, conn, t); err != nil {
				return err
			}
		}
	}
	return checkPublication(ctx, conn, cfg)
}

// checkTable verifies that cfg's table exists with the columns the relay reads.
func checkTable(ctx context.Context, conn *pgx.Conn, cfg SetupConfig) error {
	table := cfg.QualifiedTable()
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
		return fmt.Errorf("look up table %s: %w", table, err)
	}
	if !exists {
		return fieldErr(cfg.Names, cfg.TableField, "outbox table %s does not exist: create it (migrations/001_outbox.sql) or point the relay at your outbox table", table)
	}
	rows, err := conn.Query(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`, table)
	if err != nil {
		return fmt.Errorf("list columns of %s: %w", table, err)
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("list columns of %s: %w", table, err)
	}
	set := make(map[string]bool, len(have))
	for _, c := range have {
		set[c] = true
	}
	var generated []string // PostgreSQL 15 does not replicate them
	if err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(attname::text), '{}') FROM pg_attribute WHERE attrelid = to_regclass($1) AND attgenerated <> '' AND NOT attisdropped`, table).Scan(&generated); err != nil {
		return fmt.Errorf("list generated columns of %s: %w", table, err)
	}
	for _, c := range cfg.Columns {
		if !set[c.Name] {
			return fieldErr(cfg.Names, c.Field, "outbox table %s has no column %q (it has: %s): set the column to use", table, c.Name, strings.Join(have, ", "))
		}
		if slices.Contains(generated, c.Name) {
			return fieldErr(cfg.Names, c.Field, "outbox column %q of %s is a generated column, which logical replication does not carry: use a regular column (fill it in the INSERT or with a trigger)", c.Name, table)
		}
	}
	return nil
}

// checkPublication creates the publication when it is missing and that is
// allowed, for every outbox table; when one of them is partitioned, one that
// publishes through the root. Of an existing publication that covers some of
// the tables but not others (tables added to the relay's list since), the
// gap checks judge what to do (cfg.PartialCoverage): it extends the
// publication to the tables they return. A publication that covers none of
// them is left to the gap checks (internal/gaps), which say what is missing.
func checkPublication(ctx context.Context, conn *pgx.Conn, cfg SetupConfig) error {
	pub := pgx.Identifier{cfg.Publication}.Sanitize()
	ops := "insert"
	if cfg.PublishUpdates {
		ops = "insert, update"
	}
	var (
		covs        []Coverage
		partitioned bool
	)
	for _, t := range cfg.PerTable() {
		c, err := ReadCoverage(ctx, conn, t)
		if err != nil {
			return err
		}
		covs = append(covs, c)
		partitioned = partitioned || c.Partitioned
	}
	tables := cfg.qualifiedTables()
	create := CreatePublicationSQL(pub, tables, ops, partitioned)
	if !covs[0].PubExists {
		if !cfg.CreatePublication {
			return configErr("publication %q does not exist and the relay may not create it %s: run %s (as the table owner) or allow the relay to create it", cfg.Publication, cfg.Names.Name("CreatePublication"), create)
		}
		if _, err := conn.Exec(ctx, create); err != nil {
			var pgErr *pgconn.PgError
			// Created concurrently: 42710 when the other session committed first,
			// 23505 (pg_publication's unique index) when both were inserting at once.
			if errors.As(err, &pgErr) && (pgErr.Code == "42710" || pgErr.Code == "23505") {
				return checkPublication(ctx, conn, cfg)
			}
			return configErr("create publication %q: %v: run %s as the table owner, then start the relay without creating it %s", cfg.Publication, err, create, cfg.Names.Name("CreatePublication"))
		}
		return nil
	}
	if cfg.PartialCoverage == nil {
		return nil
	}
	joining, err := cfg.PartialCoverage(cfg, covs)
	if err != nil || len(joining) == 0 {
		return err
	}
	if cfg.JoinSnapshot != nil {
		return JoinTables(ctx, conn, cfg.Publication, joining, cfg.JoinSnapshot)
	}
	var missing []string
	for _, t := range joining {
		missing = append(missing, pgx.Identifier{t.Schema, t.Table}.Sanitize())
	}
	alter := fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s;", pub, strings.Join(missing, ", "))
	if _, err := conn.Exec(ctx, alter); err != nil {
		return configErr("extend publication %q to outbox table %s: %v: run %s as the table owner", cfg.Publication, strings.Join(missing, ", "), err, alter)
	}
	return nil
}

// JoinLockTimeout bounds JoinTables' wait for the writers of the joining
// tables, over all its attempts.
const JoinLockTimeout = 10 * time.Second

// JoinLockAttempt bounds one attempt of JoinTables to lock the joining
// tables: while it waits in the lock queue, their new inserts wait behind it,
// so it gives up soon and tries again after a pause in which they go on.
const JoinLockAttempt = 200 * time.Millisecond

// JoinTables adds tables to publication pub for a slot that resumes from a
// position before the change, and calls record, in the transaction that adds
// them, with that transaction's snapshot (pg_current_snapshot()::text): the
// rows visible in it are the ones the stream never carries, which the caller
// publishes after the commit (relay: join.go), reading the table without a
// lock. record stores that durably in the same transaction (a checkpoint
// table), so a crash after the commit resumes the publishing and never finds
// the table joined by no one.
//
// Why the seam is exact. Postgres decodes each change with the publication as
// it was when the change was written, so the slot never streams the rows
// committed into a table before it joined. The transaction locks the tables in
// SHARE mode first. Writers hold ROW EXCLUSIVE, which conflicts with SHARE: once
// the lock is granted no transaction that wrote to the tables is in progress
// (they committed or aborted, and a writer leaves the process array before it
// releases its locks), and none can write until the commit. So the snapshot,
// taken after the lock, holds every row committed into them before, and none
// committed after: a writer held back inserts after the commit record of the
// change, and the slot decodes its rows with the tables in the publication.
// A writer whose transaction began earlier but writes to the tables only
// after the commit is in the snapshot's in-progress list (or started after
// it): not visible, streamed.
//
// The lock is held for milliseconds: lock, change, snapshot, record, commit;
// no row is read and nothing waits on Kafka while it is held. Each attempt
// to lock waits at most JoinLockAttempt, and JoinTables tries again with
// growing pauses until JoinLockTimeout has passed: a long transaction writing
// to a table holds the join back, never the application's other writers
// (between attempts nothing is queued behind the relay).
//
// Nothing is committed when record fails: the tables are not in the
// publication and the next start joins them again.
func JoinTables(ctx context.Context, conn *pgx.Conn, publication string, tables []decoder.TableName, record func(ctx context.Context, tx pgx.Tx, tables []decoder.TableName, snapshot string) error) error {
	var quoted []string
	for _, t := range tables {
		quoted = append(quoted, pgx.Identifier{t.Schema, t.Table}.Sanitize())
	}
	list := strings.Join(quoted, ", ")
	began := time.Now()
	pause := 20 * time.Millisecond
	for {
		err := joinOnce(ctx, conn, publication, tables, list, record)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" { // lock_not_available
			return err
		}
		if time.Since(began)+pause > JoinLockTimeout {
			return fmt.Errorf("join outbox table %s to publication %q: a transaction writing to it did not end within %s "+
				"(see pg_locks and pg_stat_activity); restart the relay once it has: %w", list, publication, JoinLockTimeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("join outbox table %s to publication %q: %w", list, publication, ctx.Err())
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// joinOnce is one attempt of JoinTables; a *pgconn.PgError 55P03 when the
// lock was not granted within JoinLockAttempt.
func joinOnce(ctx context.Context, conn *pgx.Conn, publication string, tables []decoder.TableName, list string, record func(ctx context.Context, tx pgx.Tx, tables []decoder.TableName, snapshot string) error) error {
	pub := pgx.Identifier{publication}.Sanitize()
	alter := fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", pub, list)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("join outbox table %s to publication %q: %w", list, publication, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", JoinLockAttempt.Milliseconds())); err != nil {
		return fmt.Errorf("join outbox table %s to publication %q: %w", list, publication, err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+list+" IN SHARE MODE"); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
			return err
		}
		return fmt.Errorf("join outbox table %s to publication %q: lock it: %w", list, publication, err)
	}
	if _, err := tx.Exec(ctx, alter); err != nil {
		return configErr("extend publication %q to outbox table %s: %v: run %s; as the table owner", publication, list, err, alter)
	}
	// READ COMMITTED: this statement's snapshot is taken now, after the lock.
	var snapshot string
	if err := tx.QueryRow(ctx, "SELECT pg_current_snapshot()::text").Scan(&snapshot); err != nil {
		return fmt.Errorf("join outbox table %s to publication %q: read the snapshot: %w", list, publication, err)
	}
	if err := record(ctx, tx, tables, snapshot); err != nil {
		return fmt.Errorf("join outbox table %s to publication %q (not joined; the next start tries again): %w", list, publication, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("join outbox table %s to publication %q (not joined if the commit failed; the next start tries again): %w", list, publication, err)
	}
	return nil
}

// CreatePublicationSQL is the statement that creates publication pub
// (quoted) for tables (quoted) publishing ops ("insert" or "insert, update");
// with no table, a publication of none, through which pgoutput streams the
// logical decoding messages all the same. When a table is partitioned, it is
// published through its root (publish_via_partition_root, PostgreSQL 13+):
// its partitions' changes are streamed as the table's, partitions created or
// attached later included.
func CreatePublicationSQL(pub string, tables []string, ops string, partitioned bool) string {
	if len(tables) == 0 {
		return fmt.Sprintf("CREATE PUBLICATION %s;", pub)
	}
	with := fmt.Sprintf("publish = '%s'", ops)
	if partitioned {
		with += ", publish_via_partition_root = true"
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (%s);", pub, strings.Join(tables, ", "), with)
}

// QueryRower runs a query returning one row: *pgx.Conn, *pgxpool.Pool.
type QueryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SlotState is a replication slot as pg_replication_slots shows it. The
// health columns differ by server version (ReadSlot chooses them by
// server_version_num); a column the server does not have leaves its field at
// its zero value, nil for the pointers.
type SlotState struct {
	Exists         bool
	Plugin         string // output plugin; the relay needs "pgoutput"
	Database       string
	Active         bool
	ActivePID      int
	ConfirmedFlush pglogrepl.LSN // confirmed_flush_lsn
	WALStatus      string        // wal_status: reserved, extended, unreserved or lost
	// LagBytes is the server's WAL end - confirmed_flush_lsn; RetainedWALBytes
	// is the WAL end - restart_lsn, the WAL the server keeps for the slot. The
	// WAL end is pg_current_wal_lsn() on a primary, pg_last_wal_replay_lsn()
	// on a standby.
	LagBytes         int64
	RetainedWALBytes int64
	// WALKeepSize is the server's max_slot_wal_keep_size in bytes, -1 when
	// the limit is off (slots keep WAL without bound).
	WALKeepSize int64
	// SafeWALSize is safe_wal_size (13+): the WAL that can still be written
	// before the slot needs more than max_slot_wal_keep_size keeps, negative
	// once it does; nil when the limit is off (-1) or the slot is lost.
	SafeWALSize *int64
	// Conflicting is conflicting (16+): a logical slot invalidated by a
	// conflict with recovery on a standby (rows removed on the primary,
	// wal_level lowered); nil below 16.
	Conflicting *bool
	// InvalidationReason is invalidation_reason (17+): why Postgres
	// invalidated the slot (wal_removed, rows_removed,
	// wal_level_insufficient, idle_timeout), "" while it is valid or below 17.
	InvalidationReason string
	// InRecovery: the server is a hot standby (pg_is_in_recovery()).
	InRecovery bool
	// InactiveSince is inactive_since (17+): when the slot was last released
	// by its consumer; zero while in use or below 17.
	InactiveSince time.Time
	// Synced is synced (17+): the slot is a copy synchronized from a
	// primary, on a standby or on a standby promoted since.
	Synced bool
}

// Invalidated reports whether Postgres invalidated the slot, so that it can
// never be streamed again, and why: invalidation_reason on 17+;
// "wal_removed" for wal_status lost; "conflict" for conflicting on 16 (which
// names no reason).
func (s SlotState) Invalidated() (bool, string) {
	switch {
	case !s.Exists:
		return false, ""
	case s.InvalidationReason != "":
		return true, s.InvalidationReason
	case s.WALStatus == "lost":
		// Before 17 (no invalidation_reason) 16 also sets conflicting on a slot
		// whose WAL was removed (seen on 16.14), and shows a conflict-invalidated
		// one lost too. Conflicts invalidate slots on a standby only: on a
		// primary lost means the WAL was removed; on a standby a conflicting
		// lost slot is read as the conflict, the cause that needs a fix there.
		if s.InRecovery && s.Conflicting != nil && *s.Conflicting {
			return true, "conflict"
		}
		return true, "wal_removed"
	case s.Conflicting != nil && *s.Conflicting:
		return true, "conflict"
	}
	return false, ""
}

// The server versions (server_version_num) that added slot columns ReadSlot
// reads.
const (
	versionConflicting  = 160000 // pg_replication_slots.conflicting
	versionInvalidation = 170000 // invalidation_reason, inactive_since, synced
)

// ReadSlot reads the slot's state from pg_replication_slots, with the columns
// the server's version has. A missing slot is not an error: the state says
// Exists false.
func ReadSlot(ctx context.Context, db QueryRower, slot string) (SlotState, error) {
	var s SlotState
	var version int
	var keep int64
	var inRecovery bool
	if err := db.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, pg_size_bytes(current_setting('max_slot_wal_keep_size')), pg_is_in_recovery()").Scan(&version, &keep, &inRecovery); err != nil {
		return s, fmt.Errorf("read replication slot %q: read the server version and max_slot_wal_keep_size: %w", slot, err)
	}
	var plugin, database, walStatus *string
	var pid *int32
	var confirmed *string
	var lag, retained *int64
	var conflicting *bool
	var reason *string
	var inactiveSince *time.Time
	var synced *bool
	cols := `plugin, database, active, active_pid, confirmed_flush_lsn::text, wal_status,
			(` + walEndSQL + ` - confirmed_flush_lsn)::bigint, (` + walEndSQL + ` - restart_lsn)::bigint, safe_wal_size`
	dest := []any{&plugin, &database, &s.Active, &pid, &confirmed, &walStatus, &lag, &retained, &s.SafeWALSize}
	if version >= versionConflicting {
		cols += ", conflicting"
		dest = append(dest, &conflicting)
	}
	if version >= versionInvalidation {
		cols += ", invalidation_reason, inactive_since, synced"
		dest = append(dest, &reason, &inactiveSince, &synced)
	}
	err := db.QueryRow(ctx, "SELECT "+cols+" FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("read replication slot %q: %w", slot, err)
	}
	s.Exists, s.WALKeepSize, s.InRecovery = true, keep, inRecovery
	s.Plugin, s.Database, s.WALStatus = deref(plugin), deref(database), deref(walStatus)
	s.Conflicting, s.InvalidationReason = conflicting, deref(reason)
	if inactiveSince != nil {
		s.InactiveSince = *inactiveSince
	}
	s.Synced = synced != nil && *synced
	if pid != nil {
		s.ActivePID = int(*pid)
	}
	if lag != nil {
		s.LagBytes = *lag
	}
	if retained != nil {
		s.RetainedWALBytes = *retained
	}
	if confirmed != nil {
		if s.ConfirmedFlush, err = pglogrepl.ParseLSN(*confirmed); err != nil {
			return s, fmt.Errorf("parse confirmed_flush_lsn of slot %q: %w", slot, err)
		}
	}
	return s, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// CreateSlot creates a pgoutput logical slot through a replication connection,
// a failover slot when failover is set (PostgreSQL 17+: WantFailover). A slot
// created concurrently by another relay is not an error. names names the
// caller's settings (its PGURL) in errors.
func CreateSlot(ctx context.Context, url, slot string, failover bool, names setting.Namer) error {
	conn, err := ConnectReplication(ctx, url, names)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = createSlot(ctx, conn, slot, "nothing", failover)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" {
			return nil
		}
		return createSlotErr(slot, err)
	}
	return nil
}

func createSlotErr(slot string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return configErr("create replication slot %q: %s: grant the relay's role REPLICATION (ALTER ROLE <role> REPLICATION;) or create the slot as a superuser: SELECT pg_create_logical_replication_slot('%s', 'pgoutput');", slot, pgErr.Message, slot)
	}
	return fmt.Errorf("create replication slot %q: %w", slot, err)
}

// ErrSlotExists is returned by CreateSlotWithSnapshot when the slot was created
// by someone else meanwhile: no snapshot was exported; the caller should read
// the slot again and treat it as one that already existed.
var ErrSlotExists = errors.New("replication slot already exists")

// CreateSlotWithSnapshot creates a pgoutput logical slot through a replication
// connection with EXPORT_SNAPSHOT and, while that connection stays open (the
// exported snapshot lives only that long), calls read with a REPEATABLE READ,
// READ ONLY transaction on a normal connection that imported the snapshot: it
// sees exactly the transactions committed before the slot's consistent point,
// which is returned, so every later commit is streamed by the slot and every
// earlier one is in the snapshot. The slot is a failover slot when failover is
// set. Both connections are closed on return; the slot stays whether read
// succeeds or not. names names the caller's settings (its PGURL) in errors.
func CreateSlotWithSnapshot(ctx context.Context, url, slot string, failover bool, names setting.Namer, read func(ctx context.Context, tx pgx.Tx) error) (pglogrepl.LSN, error) {
	repl, err := ConnectReplication(ctx, url, names)
	if err != nil {
		return 0, err
	}
	defer repl.Close(context.Background())
	res, err := createSlot(ctx, repl, slot, "export", failover)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" {
			return 0, fmt.Errorf("create replication slot %q: %w", slot, ErrSlotExists)
		}
		return 0, createSlotErr(slot, err)
	}
	point, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, fmt.Errorf("create replication slot %q: parse its consistent point %q: %w", slot, res.ConsistentPoint, err)
	}
	if res.SnapshotName == "" {
		return point, fmt.Errorf("create replication slot %q: the server exported no snapshot", slot)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return point, ConnectError(url, err, names)
	}
	defer conn.Close(context.Background())
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return point, fmt.Errorf("begin the snapshot transaction of slot %q: %w", slot, err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // read only; a no-op after Commit
	// SET TRANSACTION SNAPSHOT takes no parameters: quote the name as a literal.
	lit := "'" + strings.ReplaceAll(res.SnapshotName, "'", "''") + "'"
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+lit); err != nil {
		return point, fmt.Errorf("import snapshot %s of slot %q: %w", res.SnapshotName, slot, err)
	}
	if err := read(ctx, tx); err != nil {
		return point, err
	}
	if err := tx.Commit(ctx); err != nil {
		return point, fmt.Errorf("end the snapshot transaction of slot %q: %w", slot, err)
	}
	return point, nil
}

// IdentifySystem returns the server's system identifier through a replication
// connection. names names the caller's settings (its PGURL) in errors.
func IdentifySystem(ctx context.Context, url string, names setting.Namer) (pglogrepl.IdentifySystemResult, error) {
	conn, err := ConnectReplication(ctx, url, names)
	if err != nil {
		return pglogrepl.IdentifySystemResult{}, err
	}
	defer conn.Close(context.Background())
	res, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return res, fmt.Errorf("identify system: %w", err)
	}
	return res, nil
}

var (
	passwordKV    = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)`)
	passwordQuery = regexp.MustCompile(`(?i)([?&]password=)[^&#\s]*`)
	urlUserinfo   = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://)([^/?#\s]*)@`)
)

// Redact hides the password in a Postgres URL or keyword/value DSN. It works on
// the text, not on a parsed URL, so strings that net/url rejects but pgx accepts
// (several hosts, odd escapes) are redacted too.
func Redact(dsn string) string {
	out := urlUserinfo.ReplaceAllStringFunc(dsn, func(m string) string {
		sub := urlUserinfo.FindStringSubmatch(m)
		user, _, hasPass := strings.Cut(sub[2], ":")
		if !hasPass {
			return m
		}
		return sub[1] + user + ":REDACTED@"
	})
	out = passwordQuery.ReplaceAllString(out, "${1}REDACTED")
	if !strings.Contains(out, "://") {
		out = passwordKV.ReplaceAllString(out, "${1}REDACTED")
	}
	return out
}

// redactedError carries an error whose text had a password removed, and keeps
// the original in the chain for errors.Is/As.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redactErr hides passwords that an error message may quote from a DSN.
func redactErr(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	red := Redact(msg)
	if red == msg {
		return err
	}
	return &redactedError{msg: red, err: err}
}

// ConnectError describes a failed connection to the Postgres server at url: the
// URL without its password, what to check (for the server's refusal, such as
// a wrong password, what it means), and for a server certificate the relay
// does not trust, what to change in the URL. Of pgconn's joined errors for
// each attempt (every host, with and without TLS) it keeps the meaningful
// ones, on one line (see meaningfulConnectError). names names the caller's
// settings: the hint names its PGURL.
func ConnectError(url string, err error, names setting.Namer) error {
	server, err := meaningfulConnectError(err)
	hint := "check the Postgres URL " + names.Name("PGURL")
	if server != nil {
		hint = connectHint(server, names)
	}
	var host x509.HostnameError
	var unknown x509.UnknownAuthorityError
	var verify *tls.CertificateVerificationError
	switch {
	case errors.As(err, &host):
		hint = "the server's certificate does not name the host of the Postgres URL " + names.Name("PGURL") + ": connect by a name the certificate lists"
	case errors.As(err, &unknown), errors.As(err, &verify):
		hint = "the server's certificate is not signed by a CA the relay trusts: set sslrootcert=<CA file> in the Postgres URL " + names.Name("PGURL")
	}
	return fmt.Errorf("connect to Postgres %s (%s): %w", Redact(url), hint, redactErr(err))
}

// PeekOldestCommit returns the commit time of the first transaction on slot
// after its confirmed position that publication publishes — the oldest
// committed outbox row the relay has not confirmed — and false when there
// is none. It decodes the slot without consuming it
// (pg_logical_slot_peek_binary_changes), so the slot must be inactive; it
// reads no further than the current WAL end and gives up after timeout, as
// a long backlog of other tables' changes is decoded on the way.
//
// Up to PostgreSQL 14 pgoutput sends a Begin and a Commit for every
// transaction, publishing nothing of it or not; from 15 it skips those. The
// first transaction with a change is looked for in ever longer peeks.
func PeekOldestCommit(ctx context.Context, pool *pgxpool.Pool, slot, publication string, timeout time.Duration) (time.Time, bool, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("peek slot %q: %w", slot, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", timeout.Milliseconds())); err != nil {
		return time.Time{}, false, fmt.Errorf("peek slot %q: %w", slot, err)
	}
	// Up to 17 decoding with a missing publication fails; 18 warns and skips
	// every change, which would read as "nothing waits": ask first.
	var pubExists bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1)", publication).Scan(&pubExists); err != nil {
		return time.Time{}, false, fmt.Errorf("peek slot %q: %w", slot, err)
	}
	if !pubExists {
		return time.Time{}, false, fmt.Errorf("peek slot %q: publication %q does not exist", slot, publication)
	}
	for changes := 16; ; changes *= 8 {
		rows, err := tx.Query(ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes($1, `+walEndSQL+`, $3,
			'proto_version', '1', 'publication_names', $2)`, slot, publication, changes)
		if err != nil {
			return time.Time{}, false, fmt.Errorf("peek slot %q: %w", slot, err)
		}
		datas, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
		if err != nil {
			return time.Time{}, false, fmt.Errorf("peek slot %q: %w", slot, err)
		}
		var begin *decoder.Message
		for _, data := range datas {
			msg, err := decoder.Boundary(data)
			if err != nil {
				return time.Time{}, false, fmt.Errorf("peek slot %q: %w", slot, err)
			}
			switch msg.Kind {
			case decoder.KindBegin:
				begin = &msg
			case decoder.KindCommit:
				begin = nil // an empty transaction (14 and older)
			default:
				if begin != nil {
					return begin.CommitTime, true, nil
				}
			}
		}
		if len(datas) < changes {
			return time.Time{}, false, nil // decoded up to the WAL end
		}
	}
}
