package consumer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/letterstate"
)

// Table names. ProcessedTable is fixed; the dead-letter table is
// Config.DeadLetterTable.
const (
	ProcessedTable         = "public.processed_messages"
	DefaultDeadLetterTable = "public.consumer_dead_letters"
)

// MigrationFile holds DDL(DefaultDeadLetterTable): apply it to the consumer's
// database (not the outbox database, unless they are the same) as a role that
// may create tables, or call Migrate.
const MigrationFile = "migrations/006_consumer.sql"

// maxClaimIDLen is the longest message id claimed as it is. Longer ones are
// claimed as "sha256:" and the hex digest of the id, so that the key always
// fits a btree index entry.
const maxClaimIDLen = 255

// pruneBatch is how many claims Prune deletes per statement.
const pruneBatch = 1000

// Dead-letter statuses: the state model the relay's dead letters follow too
// (pending → processing → completed, retry_wait after a transient failure,
// dead once the budget is spent; see the package documentation).
const (
	// StatusPending: stored by Run after the retry budget of a transient
	// failure while Config.AutoReprocess is on; the automatic reprocessing
	// takes it once it is due (an operator's Reprocess at any time).
	StatusPending = letterstate.Pending
	// StatusProcessing: claimed by a reprocessor (claimed_by) until
	// claimed_until; once that passed, another reprocessor may take it over.
	StatusProcessing = letterstate.Processing
	// StatusRetryWait: a reprocessing attempt failed transiently; the
	// automatic reprocessing takes it again from next_attempt_at.
	StatusRetryWait = letterstate.RetryWait
	// StatusCompleted: reprocessing ran the handler and committed.
	StatusCompleted = letterstate.Completed
	// StatusDead: isolated after a permanent failure, or the retry budget
	// when nothing retries it automatically (Config.AutoReprocess off), or
	// the automatic reprocessing's budget; only an operator's Reprocess runs
	// it again. Redeliveries of the message are skipped whatever the status.
	StatusDead = letterstate.Dead
	// StatusReprocessed is what StatusCompleted was called before the state
	// model.
	//
	// Deprecated: use StatusCompleted. Migrate (and MigrationFile) turn the
	// rows that have it into completed ones; the table still accepts it from
	// a consumer of an older version during an upgrade, and it is read as
	// completed.
	StatusReprocessed = "reprocessed"
)

// tables are the quoted names of the consumer's tables.
type tables struct {
	processed   string // quoted
	deadLetters string // quoted
	dlName      string // as configured (with the default applied), for messages
	dlIndex     string // quoted name of the dead-letter index
	transitions string // quoted name of the dead-letter history table
	trIndex     string // quoted name of the history's index
	stateCheck  string // name of the status CHECK constraint, unquoted
}

// newTables names the tables for the dead-letter table dl ("table" or
// "schema.table", unquoted; "" means DefaultDeadLetterTable).
func newTables(dl string) (tables, error) {
	if dl == "" {
		dl = DefaultDeadLetterTable
	}
	schema, table := "public", dl
	if s, t, ok := strings.Cut(dl, "."); ok {
		schema, table = s, t
	}
	if schema == "" || table == "" || strings.Contains(table, ".") {
		return tables{}, fmt.Errorf("field DeadLetterTable: %q is not \"table\" or \"schema.table\"", dl)
	}
	return tables{
		processed:   pgx.Identifier{"public", "processed_messages"}.Sanitize(),
		deadLetters: pgx.Identifier{schema, table}.Sanitize(),
		dlName:      dl,
		dlIndex:     pgx.Identifier{table + "_status_idx"}.Sanitize(),
		transitions: pgx.Identifier{schema, table + "_transitions"}.Sanitize(),
		trIndex:     pgx.Identifier{table + "_transitions_letter_idx"}.Sanitize(),
		stateCheck:  table + "_state_check",
	}, nil
}

// DDL returns the statements that create processed_messages, the
// dead-letter table named deadLetterTable ("" means DefaultDeadLetterTable)
// and its history table <table>_transitions, each only if missing, and then
// bring a dead-letter table made by an older version onto the state model:
// the lease and retry columns added, the status CHECK replaced, rows marked
// 'reprocessed' marked 'completed' ('dead' ones stay dead). Every statement
// is idempotent, and once the table is current the upgrade does nothing (it
// takes no lock). The status column defaults to 'dead', which is what a
// consumer of an older version, which does not name it, means during an
// upgrade. MigrationFile and Migrate run this same text.
func DDL(deadLetterTable string) (string, error) {
	t, err := newTables(deadLetterTable)
	if err != nil {
		return "", err
	}
	return t.ddl(), nil
}

func (t tables) ddl() string {
	lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	// The statuses a dead letter may have: those of the state model, and
	// 'reprocessed', which a consumer of an older version may still write
	// during an upgrade (it is read as completed).
	statusList := letterstate.SQLList(StatusReprocessed)
	check := pgx.Identifier{t.stateCheck}.Sanitize()
	return `CREATE TABLE IF NOT EXISTS ` + t.processed + ` (
    consumer_name text        NOT NULL,
    message_id    text        NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, message_id)
);
CREATE INDEX IF NOT EXISTS "processed_messages_processed_at_idx" ON ` + t.processed + ` (processed_at);
CREATE TABLE IF NOT EXISTS ` + t.deadLetters + ` (
    id                 bigserial   PRIMARY KEY,
    consumer_name      text        NOT NULL,
    message_id         text        NOT NULL,
    topic              text        NOT NULL,
    kafka_partition    int         NOT NULL,
    kafka_offset       bigint      NOT NULL,
    message_key        bytea,
    payload            bytea,
    headers            jsonb       NOT NULL DEFAULT '{}',
    message_time       timestamptz,
    error_code         text        NOT NULL,
    error_message      text        NOT NULL,
    retry_count        int         NOT NULL DEFAULT 0,
    first_failed_at    timestamptz NOT NULL,
    last_failed_at     timestamptz NOT NULL,
    correlation_id     text,
    schema_version     text,
    status             text        NOT NULL DEFAULT 'dead' CONSTRAINT ` + check + ` CHECK (status IN (` + statusList + `)),
    reprocess_attempts int         NOT NULL DEFAULT 0,
    reprocessed_at     timestamptz,
    reprocessed_by     text,
    next_attempt_at    timestamptz,
    last_attempt_at    timestamptz,
    last_attempt_error text,
    claimed_by         text,
    claimed_until      timestamptz,
    UNIQUE (consumer_name, message_id)
);
CREATE INDEX IF NOT EXISTS ` + t.dlIndex + ` ON ` + t.deadLetters + ` (consumer_name, status, last_failed_at);
CREATE TABLE IF NOT EXISTS ` + t.transitions + ` (
    id             bigserial   PRIMARY KEY,
    dead_letter_id bigint      NOT NULL,
    consumer_name  text        NOT NULL,
    message_id     text        NOT NULL,
    owner          text        NOT NULL,
    from_status    text        NOT NULL,
    to_status      text        NOT NULL,
    attempt        int         NOT NULL DEFAULT 0,
    detail         text,
    at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ` + t.trIndex + ` ON ` + t.transitions + ` (dead_letter_id);
-- Tables of versions before the state model (statuses dead and reprocessed
-- only): add its columns, allow its statuses, call 'reprocessed' letters
-- 'completed'. Skipped, without a lock, once the constraint exists.
DO $cdc_relay$
DECLARE
    old name;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
            WHERE conrelid = ` + lit(t.deadLetters) + `::regclass AND conname = ` + lit(t.stateCheck) + `::name) THEN
        ALTER TABLE ` + t.deadLetters + `
            ADD COLUMN IF NOT EXISTS next_attempt_at    timestamptz,
            ADD COLUMN IF NOT EXISTS last_attempt_at    timestamptz,
            ADD COLUMN IF NOT EXISTS last_attempt_error text,
            ADD COLUMN IF NOT EXISTS claimed_by         text,
            ADD COLUMN IF NOT EXISTS claimed_until      timestamptz;
        FOR old IN SELECT c.conname FROM pg_catalog.pg_constraint c
                JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
                WHERE c.conrelid = ` + lit(t.deadLetters) + `::regclass AND c.contype = 'c' AND a.attname = 'status' LOOP
            EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', ` + lit(t.deadLetters) + `, old);
        END LOOP;
        UPDATE ` + t.deadLetters + ` SET status = 'completed' WHERE status = 'reprocessed';
        ALTER TABLE ` + t.deadLetters + ` ADD CONSTRAINT ` + check + ` CHECK (status IN (` + statusList + `));
    END IF;
END
$cdc_relay$;
`
}

// Migrate creates processed_messages and the dead-letter table named
// deadLetterTable ("" means DefaultDeadLetterTable) in pool's database when
// they are missing (DDL). It needs the right to create tables; otherwise
// apply MigrationFile as a role that has it. Several processes may call it at
// once: CREATE TABLE IF NOT EXISTS is not safe against a concurrent creation
// of the same table, so Migrate holds a transaction-level advisory lock
// around it.
func Migrate(ctx context.Context, pool *pgxpool.Pool, deadLetterTable string) error {
	t, err := newTables(deadLetterTable)
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('cdc_relay_consumer_migrate'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, t.ddl())
		return err
	})
	if err != nil {
		return fmt.Errorf("create consumer tables %s and %s: %w", ProcessedTable, t.dlName, err)
	}
	return nil
}

// check verifies that both tables exist and that the role may write them,
// naming the fix when not. A failure of the query itself is a *storeError.
func (t tables) check(ctx context.Context, pool *pgxpool.Pool) error {
	for _, tbl := range []struct{ quoted, name, privs string }{
		{t.processed, ProcessedTable, "SELECT, INSERT, UPDATE, DELETE"},
		{t.deadLetters, t.dlName, "SELECT, INSERT, UPDATE"},
		{t.transitions, t.dlName + "_transitions", "SELECT, INSERT"},
	} {
		var exists, writable bool
		err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL,
    to_regclass($1) IS NOT NULL AND has_table_privilege(to_regclass($1), 'INSERT')`, tbl.quoted).Scan(&exists, &writable)
		if err != nil {
			return &storeError{fmt.Errorf("check table %s: %w", tbl.name, err)}
		}
		if !exists {
			return fmt.Errorf("table %s does not exist: apply %s to the consumer's database (or call consumer.Migrate)", tbl.name, MigrationFile)
		}
		if !writable {
			return fmt.Errorf("the consumer's role may not insert into %s: GRANT %s ON %s TO <role>", tbl.name, tbl.privs, tbl.name)
		}
	}
	var current bool
	err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
    WHERE conrelid = to_regclass($1) AND conname = $2::name)`, t.deadLetters, t.stateCheck).Scan(&current)
	if err != nil {
		return &storeError{fmt.Errorf("check table %s: %w", t.dlName, err)}
	}
	if !current {
		return fmt.Errorf("table %s was made by an older version (statuses dead and reprocessed only): apply %s again as its owner (or call consumer.Migrate)", t.dlName, MigrationFile)
	}
	return nil
}

// claim inserts the claim of (consumer, id) in tx and reports whether it is
// new; false means the message was processed (or dead-lettered) before.
func (t tables) claim(ctx context.Context, tx pgx.Tx, consumer, id string) (bool, error) {
	tag, err := tx.Exec(ctx, `INSERT INTO `+t.processed+` (consumer_name, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
		consumer, id)
	if err != nil {
		return false, fmt.Errorf("claim message %q in %s: %w", id, ProcessedTable, err)
	}
	return tag.RowsAffected() == 1, nil
}

// letter is one dead letter as the consumer writes it.
type letter struct {
	consumer      string
	msg           Message
	code, text    string
	retries       int
	first, last   time.Time
	correlationID string
	schemaVersion string
	status        string // StatusDead or StatusPending
}

// addLetter stores l in tx: a new row, or, when the message was
// dead-lettered before and its claim has been pruned since, the same row
// updated (l.status again, the new error, the retries added, the
// reprocessing attempts and any lease cleared).
func (t tables) addLetter(ctx context.Context, tx pgx.Tx, l letter) error {
	headers, err := json.Marshal(textMap(l.msg.Headers))
	if err != nil {
		return fmt.Errorf("encode headers of %s: %w", l.msg, err)
	}
	var msgTime *time.Time
	if !l.msg.Timestamp.IsZero() {
		msgTime = &l.msg.Timestamp
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+t.deadLetters+` AS d (consumer_name, message_id, topic, kafka_partition, kafka_offset,
    message_key, payload, headers, message_time, error_code, error_message, retry_count, first_failed_at, last_failed_at,
    correlation_id, schema_version, status)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, nullif($15, ''), nullif($16, ''), $17)
ON CONFLICT (consumer_name, message_id) DO UPDATE SET
    topic = EXCLUDED.topic, kafka_partition = EXCLUDED.kafka_partition, kafka_offset = EXCLUDED.kafka_offset,
    error_code = EXCLUDED.error_code, error_message = EXCLUDED.error_message,
    retry_count = d.retry_count + EXCLUDED.retry_count + 1, last_failed_at = EXCLUDED.last_failed_at, status = EXCLUDED.status,
    reprocess_attempts = 0, next_attempt_at = NULL, claimed_by = NULL, claimed_until = NULL`,
		pgText(l.consumer), l.msg.claimID(), pgText(l.msg.Topic), l.msg.Partition, l.msg.Offset,
		l.msg.Key, l.msg.Value, headers, msgTime, l.code, pgText(l.text), l.retries, l.first, l.last,
		pgText(l.correlationID), pgText(l.schemaVersion), l.status)
	if err != nil {
		return fmt.Errorf("store dead letter of %s in %s: %w", l.msg, t.dlName, err)
	}
	return nil
}

// Prune deletes the claims in processed_messages older than olderThan, of
// consumer consumerName ("" for every consumer), in batches of 1000 rows per
// statement so that it never holds many locks, and returns how many it
// deleted. A message whose claim is gone is processed again if Kafka delivers
// it again: keep claims longer than the broker's retention of the topics plus
// the longest replay anyone may run (a reset of the group's offsets, a
// cdc-relay replay or dlq replay), and never prune the claims of effects that
// must not repeat whatever it costs (money): see consumer/README.md.
func Prune(ctx context.Context, pool *pgxpool.Pool, consumerName string, olderThan time.Duration) (int64, error) {
	if olderThan <= 0 {
		return 0, fmt.Errorf("prune %s: olderThan must be positive, got %v", ProcessedTable, olderThan)
	}
	t, _ := newTables("")
	cutoff := time.Now().Add(-olderThan)
	// ctid keeps each statement to one batch; the outer condition makes sure
	// a row that changed since the subquery read it is not touched.
	sql := `DELETE FROM ` + t.processed + ` WHERE ctid = ANY(ARRAY(SELECT ctid FROM ` + t.processed +
		` WHERE processed_at < $1 AND consumer_name = $2 LIMIT $3)) AND processed_at < $1 AND consumer_name = $2`
	args := []any{cutoff, consumerName, pruneBatch}
	if consumerName == "" {
		sql = `DELETE FROM ` + t.processed + ` WHERE ctid = ANY(ARRAY(SELECT ctid FROM ` + t.processed +
			` WHERE processed_at < $1 LIMIT $2)) AND processed_at < $1`
		args = []any{cutoff, pruneBatch}
	}
	var total int64
	for {
		tag, err := pool.Exec(ctx, sql, args...)
		if err != nil {
			return total, fmt.Errorf("prune %s (%d claims deleted so far): %w", ProcessedTable, total, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < pruneBatch {
			return total, nil
		}
	}
}

// pgText makes s storable in a text column: invalid UTF-8 and NUL bytes
// (which text cannot hold) become U+FFFD.
func pgText(s string) string {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// textMap applies pgText to the keys and values of m, for a jsonb column.
func textMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[pgText(k)] = pgText(v)
	}
	return out
}

// claimKey is the processed_messages key of a message id: the id made
// storable, and hashed when longer than maxClaimIDLen.
func claimKey(id string) string {
	id = pgText(id)
	if len(id) <= maxClaimIDLen {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// isConnError reports whether err means the database could not be reached
// or the connection broke (as opposed to a statement the server refused).
func isConnError(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) || strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P")
}
