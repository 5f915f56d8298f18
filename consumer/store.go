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

// Dead-letter statuses.
const (
	// StatusDead: isolated after a permanent failure or the retry budget;
	// redeliveries of the message are skipped until Reprocess succeeds.
	StatusDead = "dead"
	// StatusReprocessed: Reprocess ran the handler for it and committed.
	StatusReprocessed = "reprocessed"
)

// tables are the quoted names of the consumer's tables.
type tables struct {
	processed   string // quoted
	deadLetters string // quoted
	dlName      string // as configured (with the default applied), for messages
	dlIndex     string // quoted name of the dead-letter index
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
	}, nil
}

// DDL returns the statements that create processed_messages and the
// dead-letter table named deadLetterTable ("" means
// DefaultDeadLetterTable), each only if missing. MigrationFile and Migrate
// run this same text.
func DDL(deadLetterTable string) (string, error) {
	t, err := newTables(deadLetterTable)
	if err != nil {
		return "", err
	}
	return t.ddl(), nil
}

func (t tables) ddl() string {
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
    status             text        NOT NULL DEFAULT 'dead' CHECK (status IN ('dead', 'reprocessed')),
    reprocess_attempts int         NOT NULL DEFAULT 0,
    reprocessed_at     timestamptz,
    reprocessed_by     text,
    UNIQUE (consumer_name, message_id)
);
CREATE INDEX IF NOT EXISTS ` + t.dlIndex + ` ON ` + t.deadLetters + ` (consumer_name, status, last_failed_at);
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
}

// addLetter stores l in tx: a new row, or, when the message was
// dead-lettered before and its claim has been pruned since, the same row
// updated (status dead again, the new error, the retries added).
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
    correlation_id, schema_version)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, nullif($15, ''), nullif($16, ''))
ON CONFLICT (consumer_name, message_id) DO UPDATE SET
    topic = EXCLUDED.topic, kafka_partition = EXCLUDED.kafka_partition, kafka_offset = EXCLUDED.kafka_offset,
    error_code = EXCLUDED.error_code, error_message = EXCLUDED.error_message,
    retry_count = d.retry_count + EXCLUDED.retry_count + 1, last_failed_at = EXCLUDED.last_failed_at, status = 'dead'`,
		pgText(l.consumer), l.msg.claimID(), pgText(l.msg.Topic), l.msg.Partition, l.msg.Offset,
		l.msg.Key, l.msg.Value, headers, msgTime, l.code, pgText(l.text), l.retries, l.first, l.last,
		pgText(l.correlationID), pgText(l.schemaVersion))
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
// must not repeat whatever it costs (money): see the README.
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
