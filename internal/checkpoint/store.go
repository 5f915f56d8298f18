package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Checkpoint is the persisted position of one replication slot: every outbox event
// committed at or before LSN has been acknowledged by Kafka.
type Checkpoint struct {
	Slot      string        // replication slot name; the key of the store
	SystemID  string        // Postgres system identifier (IDENTIFY_SYSTEM), as text
	LSN       pglogrepl.LSN // acknowledgement watermark written before the slot is confirmed
	UpdatedAt time.Time     // when the checkpoint was saved
	RelayName string        // the relay instance that saved it, for operators
	// CommitTime is no later than the commit of any transaction after LSN: the
	// commit time of the transaction LSN ends (or, after an idle advance, when
	// the slot was moved past nothing). Zero when unknown (older checkpoints).
	// A backfill after a slot loss republishes outbox rows from it, less a margin.
	CommitTime time.Time
	// Offsets are the Kafka offsets the relay had written up to LSN, for
	// effectively-once delivery after a restart. Nil when none are stored
	// (delivery at-least-once, or saved by an older relay); empty when the
	// relay stores them but had written no record yet.
	Offsets Offsets
	// OldestUnrelayed is the commit time of the oldest transaction whose
	// events the relay had read and Kafka had not yet acknowledged when it
	// saved (checkpoint.Tracker.OldestPending); zero when none waited. It
	// lets cdc-relay status tell, from the database alone, how long the
	// oldest unrelayed outbox row has waited while the relay runs.
	OldestUnrelayed time.Time
	// Tables are the tables (schema.table, a partition as its root) the
	// publication covered from LSN on: the stream resumed from LSN carries
	// every row committed into them after it, whether the relay read them
	// then or not. An outbox table the relay reads later that is not among
	// them and that it did not add to the publication itself is a gap
	// (internal/gaps, table_joined). Nil when unknown (saved by an older
	// relay).
	Tables []string
	// Joins are the joins in progress of outbox tables to the publication,
	// oldest first; nil when none. Load reads them; Save leaves the stored
	// ones as they are: only a JoinStore's methods write them.
	Joins []Join
}

// DefaultTable is the checkpoint table TableStore uses when given no name.
const DefaultTable = "public.cdc_relay_checkpoints"

// MigrationFile is the migration that creates the checkpoint table with TableDDL, for
// roles that may not create tables themselves.
const MigrationFile = "migrations/002_checkpoints.sql"

// TableDDL returns the CREATE TABLE IF NOT EXISTS statement of the checkpoint table
// named table ("table" or "schema.table", unquoted; "" means DefaultTable). Both
// TableStore.Ensure and the migration file use it, so they cannot disagree.
func TableDDL(table string) string {
	return "CREATE TABLE IF NOT EXISTS " + quoteTable(table) + ` (
    slot_name  text        PRIMARY KEY,
    system_id  text        NOT NULL,
    lsn        pg_lsn      NOT NULL,
    relay_name text        NOT NULL DEFAULT '',
    updated_at timestamptz NOT NULL DEFAULT now(),
    commit_time timestamptz,
    kafka_offsets jsonb,
    oldest_unrelayed_at timestamptz,
    outbox_tables text[],
    pending_joins jsonb
)`
}

// addedColumns are the columns of TableDDL added after the table's first
// version, in the order they were added; Ensure adds the missing ones to an
// older table, and MigrationFile has an ALTER TABLE for each.
var addedColumns = []struct{ name, typ string }{
	{"commit_time", "timestamptz"},
	{"kafka_offsets", "jsonb"},
	{"oldest_unrelayed_at", "timestamptz"},
	{"outbox_tables", "text[]"},
	{"pending_joins", "jsonb"},
}

// addColumnsDDL adds the columns named (of addedColumns) to a checkpoint table
// made before they existed, in one statement.
func addColumnsDDL(table string, names []string) string {
	var adds []string
	for _, c := range addedColumns {
		if slices.Contains(names, c.name) {
			adds = append(adds, "ADD COLUMN IF NOT EXISTS "+c.name+" "+c.typ)
		}
	}
	return "ALTER TABLE " + quoteTable(table) + " " + strings.Join(adds, ", ")
}

// quoteTable quotes a "table" or "schema.table" name as one SQL identifier.
func quoteTable(table string) string {
	if table == "" {
		table = DefaultTable
	}
	return pgx.Identifier(strings.Split(table, ".")).Sanitize()
}

// TableStore keeps checkpoints in a table of the source database, one row per slot.
// Every Save writes a row, so while the relay runs the database produces WAL even when
// the outbox is idle; that WAL doubles as a heartbeat that lets keepalives move the
// slot forward.
type TableStore struct {
	pool  *pgxpool.Pool
	table string // quoted
	name  string // as configured, for messages
}

// NewTableStore returns a store using the checkpoint table named table ("schema.table"
// or "table", unquoted; "" means DefaultTable) through pool, which the caller keeps
// owning and closes.
func NewTableStore(pool *pgxpool.Pool, table string) *TableStore {
	if table == "" {
		table = DefaultTable
	}
	return &TableStore{pool: pool, table: quoteTable(table), name: table}
}

// Ensure creates the checkpoint table if it does not exist. If the table exists, it
// creates nothing and so needs no CREATE privilege. If the relay's role may not create
// it, the error says to run MigrationFile as a role that may.
func (s *TableStore) Ensure(ctx context.Context) error {
	var exists bool
	if err := s.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", s.table).Scan(&exists); err != nil {
		return fmt.Errorf("look up checkpoint table %s: %w", s.name, err)
	}
	if exists {
		return s.ensureColumns(ctx)
	}
	if _, err := s.pool.Exec(ctx, TableDDL(s.name)); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
			return fmt.Errorf("create checkpoint table %s: the relay's role may not create it; "+
				"run %s (with the table name %s) as the database owner, or grant the role CREATE on the schema: %w",
				s.name, MigrationFile, s.name, err)
		}
		return fmt.Errorf("create checkpoint table %s: %w", s.name, err)
	}
	return nil
}

// ensureColumns adds the columns of addedColumns that a table created before
// them lacks; a role that may not alter the table is told to run the migration.
func (s *TableStore) ensureColumns(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `SELECT attname FROM pg_attribute
WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`, s.table)
	if err != nil {
		return fmt.Errorf("look up columns of checkpoint table %s: %w", s.name, err)
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("look up columns of checkpoint table %s: %w", s.name, err)
	}
	var missing []string
	for _, c := range addedColumns {
		if !slices.Contains(have, c.name) {
			missing = append(missing, c.name)
		}
	}
	if len(missing) == 0 {
		return nil // the usual case: no ALTER, so no ownership needed
	}
	noun := "column"
	if len(missing) > 1 {
		noun = "columns"
	}
	what := fmt.Sprintf("add %s %s to checkpoint table %s", noun, strings.Join(missing, ", "), s.name)
	if _, err := s.pool.Exec(ctx, addColumnsDDL(s.name, missing)); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return fmt.Errorf("%s: the relay's role may not alter it; "+
				"run %s again (with the table name %s) as the table's owner: %w", what, MigrationFile, s.name, err)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// Load returns the checkpoint of slot, and false if there is none.
func (s *TableStore) Load(ctx context.Context, slot string) (Checkpoint, bool, error) {
	c := Checkpoint{Slot: slot}
	var lsn string
	var commit, oldest *time.Time
	var offsets, join []byte
	var tables *[]string
	err := s.pool.QueryRow(ctx,
		"SELECT system_id, lsn::text, relay_name, updated_at, commit_time, kafka_offsets, oldest_unrelayed_at, outbox_tables, pending_joins FROM "+s.table+" WHERE slot_name = $1", slot,
	).Scan(&c.SystemID, &lsn, &c.RelayName, &c.UpdatedAt, &commit, &offsets, &oldest, &tables, &join)
	if errors.Is(err, pgx.ErrNoRows) {
		return Checkpoint{}, false, nil
	}
	if err != nil {
		return Checkpoint{}, false, fmt.Errorf("load checkpoint of slot %q from %s: %w", slot, s.name, err)
	}
	if c.LSN, err = pglogrepl.ParseLSN(lsn); err != nil {
		return Checkpoint{}, false, fmt.Errorf("parse checkpoint LSN %q of slot %q in %s: %w", lsn, slot, s.name, err)
	}
	if commit != nil {
		c.CommitTime = *commit
	}
	if oldest != nil {
		c.OldestUnrelayed = *oldest
	}
	if tables != nil {
		c.Tables = append([]string{}, *tables...)
	}
	if c.Offsets, err = decodeOffsets(offsets); err != nil {
		return Checkpoint{}, false, fmt.Errorf("decode kafka_offsets of slot %q in %s: %w", slot, s.name, err)
	}
	if c.Joins, err = decodeJoins(join); err != nil {
		return Checkpoint{}, false, fmt.Errorf("decode pending_joins of slot %q in %s: %w", slot, s.name, err)
	}
	return c, true, nil
}

// Save inserts or replaces the checkpoint of c.Slot, but for its Joins,
// which it leaves as stored. A zero c.UpdatedAt is stored as the server's current time. Save does not refuse an LSN lower than the stored one:
// keeping the watermark monotonic is the Tracker's job.
func (s *TableStore) Save(ctx context.Context, c Checkpoint) error {
	var updated, commit, oldest any // NULL lets the server set now(); NULL commit_time is unknown
	if !c.UpdatedAt.IsZero() {
		updated = c.UpdatedAt
	}
	if !c.OldestUnrelayed.IsZero() {
		oldest = c.OldestUnrelayed
	}
	if !c.CommitTime.IsZero() {
		commit = c.CommitTime
	}
	var offsets any // NULL: none stored
	if enc, err := encodeOffsets(c.Offsets); err != nil {
		return fmt.Errorf("save checkpoint of slot %q at %s to %s: encode kafka offsets: %w", c.Slot, c.LSN, s.name, err)
	} else if enc != nil {
		offsets = string(enc)
	}
	var tables any // NULL: unknown
	if c.Tables != nil {
		tables = c.Tables
	}
	_, err := s.pool.Exec(ctx, "INSERT INTO "+s.table+` AS c (slot_name, system_id, lsn, relay_name, updated_at, commit_time, kafka_offsets, oldest_unrelayed_at, outbox_tables)
VALUES ($1, $2, $3::text::pg_lsn, $4, coalesce($5::timestamptz, now()), $6::timestamptz, $7::jsonb, $8::timestamptz, $9::text[])
ON CONFLICT (slot_name) DO UPDATE SET
    system_id = excluded.system_id,
    lsn = excluded.lsn,
    relay_name = excluded.relay_name,
    updated_at = excluded.updated_at,
    commit_time = excluded.commit_time,
    kafka_offsets = excluded.kafka_offsets,
    oldest_unrelayed_at = excluded.oldest_unrelayed_at,
    outbox_tables = excluded.outbox_tables`,
		c.Slot, c.SystemID, c.LSN.String(), c.RelayName, updated, commit, offsets, oldest, tables)
	if err != nil {
		return fmt.Errorf("save checkpoint of slot %q at %s to %s: %w", c.Slot, c.LSN, s.name, err)
	}
	return nil
}

// Close releases nothing: the pool belongs to the caller. It exists so both stores
// satisfy the same interface.
func (s *TableStore) Close() error { return nil }
