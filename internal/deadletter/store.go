// Package deadletter is the dead-letter store of the relay's dlq failure
// policy: the letters, their state machine (claims with leases, settled in
// the transitions table), the dlq replays that publish them again and the
// relay's automatic retries of them. Replays run, and are recorded, through
// package replay.
//
// The store is a table in the source database (TableDDL, migrations/
// 005_dead_letters.sql) plus tables that record every state transition of a
// letter and, for package replay, every replay and the result of every event
// it touched (the tables keep the names and schema they always had). A
// dead letter keeps everything needed to publish the event as the relay would
// have: event id, key, payload, headers and topic. Replays keep the event id
// (header "id"), so idempotent consumers drop an event they already have.
//
// A letter moves through the reprocessing states of the source articles:
//
//	pending ──claim──▶ processing ──Kafka acked──▶ completed
//	                     │    └──failed──▶ retry_wait ──due (or replayed)──▶ processing …
//	                     └──failed, budget spent──▶ dead ──replayed──▶ processing …
//
// A claim that ends untried (the replay stopped) goes back to the status it
// came from.
//
// A replay (dlq replay, or the relay's automatic retries) claims the letters
// it publishes atomically, with a lease: an owner and an expiry that the
// owner renews while it publishes. Two replays never hold the same letter; a
// replay that dies leaves leases that expire, after which another replay
// takes the letters over. Claims, completions, failures and releases are
// recorded in the transitions table in the transaction that makes them.
package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/letterstate"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/replay"
)

// DefaultTable is the dead-letter table a Store uses when given no name.
const DefaultTable = "public.cdc_relay_dead_letters"

// MigrationFile creates the tables of TableDDL(DefaultTable), for roles that may
// not create tables themselves.
const MigrationFile = "migrations/005_dead_letters.sql"

// Letter statuses: the reprocessing state model (package letterstate, which
// the consumer's dead letters follow too).
const (
	// StatusPending: stored by the relay, not attempted since it last failed.
	StatusPending = letterstate.Pending
	// StatusProcessing: claimed by a replay (ClaimedBy) until ClaimedUntil;
	// once that passed, another replay may take it over.
	StatusProcessing = letterstate.Processing
	// StatusRetryWait: an attempt failed; the automatic retries take it again
	// from NextAttemptAt (a dlq replay at any time).
	StatusRetryWait = letterstate.RetryWait
	// StatusCompleted: published again and acknowledged by Kafka.
	StatusCompleted = letterstate.Completed
	// StatusDead: the automatic retries spent their budget on it; only an
	// operator's dlq replay publishes it now.
	StatusDead = letterstate.Dead
	// StatusReplayed is what StatusCompleted was called before the state
	// model. Rows of older versions that have it are migrated; a letter read
	// with it has StatusCompleted, and a Filter with it selects the completed.
	StatusReplayed = "replayed"
)

// Statuses lists the letter statuses in the order of the state model.
var Statuses = []string{StatusPending, StatusProcessing, StatusRetryWait, StatusCompleted, StatusDead}

// ErrNotFound is returned by Get and MarkCompleted when no dead letter has the id.
// Callers report it to the operator: the id is wrong or the letter was purged.
var ErrNotFound = errors.New("dead letter not found")

// PayloadTypeKey is the member of the headers column that holds a letter's
// PayloadType when it is not text. It is no Kafka header: Add writes it and
// the letters read back have it in PayloadType, not in Headers. Header
// columns may not be named so.
const PayloadTypeKey = "cdc_relay_payload_type"

// Letter is one event the relay could not publish, with why and when.
type Letter struct {
	ID            int64  // assigned by the store
	EventID       string // the outbox event id: the Kafka header "id" and the store's unique key
	AggregateType string
	AggregateID   string
	EventType     string
	Key           []byte            // Kafka message key (nil: the event had none)
	Payload       []byte            // Kafka message value, as stored in the outbox
	Headers       map[string]string // every header the message carries (see FromEvent)
	// PayloadType is what Payload holds (outbox.Event.PayloadType), for the
	// structured CloudEvents format of a replay. The table keeps it under
	// PayloadTypeKey of the headers column (no key: text).
	PayloadType   outbox.PayloadType
	Topic         string // the topic the event was meant for
	ErrorCode     string // short stable code, e.g. "message_too_large" (sink.Code)
	ErrorMessage  string
	RetryCount    int       // how many times the event failed again after the first time
	FirstFailedAt time.Time // zero in Add means now
	LastFailedAt  time.Time // zero in Add means now
	RelayName     string
	CorrelationID string
	SchemaVersion string
	CommitLSN     pglogrepl.LSN // commit LSN of the event's transaction; 0 = unknown
	// SourceTable is the outbox table the event's row was inserted into,
	// schema.table (outbox.Event.Schema and Table); "" for a message-outbox
	// event, or when unknown (letters stored before the relay kept it).
	SourceTable string
	Status      string     // one of Statuses
	ReplayedAt  *time.Time // last successful replay
	ReplayCount int        // successful replays
	// Attempts counts the replays (by hand or automatic) that tried to publish
	// the letter since the relay last stored it; the automatic retries' budget
	// counts these.
	Attempts         int
	NextAttemptAt    *time.Time // retry_wait: when the automatic retries take it again
	LastAttemptAt    *time.Time
	LastAttemptError string     // why the last attempt failed ("" after a success)
	ClaimedBy        string     // processing: the replay holding the lease
	ClaimedUntil     *time.Time // processing: when the lease expires

	was string // set by a claim: the status the letter had before it
}

// TableDDL returns the statements that create the dead-letter table named table
// ("table" or "schema.table", unquoted; "" means DefaultTable), its indexes, and
// its history tables <table>_replays, <table>_replay_events and
// <table>_transitions, each only if missing, and then bring tables made by
// older versions up to date: the lease and retry columns, the state model's
// statuses (rows marked 'replayed' become 'completed'), the replays' topic
// override. Every statement is idempotent. Store.Ensure and MigrationFile use
// this same text.
func TableDDL(table string) string {
	n := newNames(table)
	return `CREATE TABLE IF NOT EXISTS ` + n.letters + ` (
    id                 bigserial   PRIMARY KEY,
    event_id           text        NOT NULL UNIQUE,
    aggregate_type     text,
    aggregate_id       text,
    event_type         text,
    message_key        bytea,
    payload            bytea       NOT NULL,
    headers            jsonb       NOT NULL DEFAULT '{}',
    topic              text        NOT NULL,
    error_code         text        NOT NULL,
    error_message      text        NOT NULL,
    retry_count        int         NOT NULL DEFAULT 0,
    first_failed_at    timestamptz NOT NULL,
    last_failed_at     timestamptz NOT NULL,
    relay_name         text        NOT NULL DEFAULT '',
    correlation_id     text,
    schema_version     text,
    commit_lsn         pg_lsn,
    source_table       text,
    status             text        NOT NULL DEFAULT 'pending' CONSTRAINT ` + n.index("state_check") + ` CHECK (status IN (` + statusList + `)),
    replayed_at        timestamptz,
    replay_count       int         NOT NULL DEFAULT 0,
    attempts           int         NOT NULL DEFAULT 0,
    next_attempt_at    timestamptz,
    last_attempt_at    timestamptz,
    last_attempt_error text,
    claimed_by         text,
    claimed_until      timestamptz
);
CREATE INDEX IF NOT EXISTS ` + n.index("status_idx") + ` ON ` + n.letters + ` (status, last_failed_at);
CREATE INDEX IF NOT EXISTS ` + n.index("error_code_idx") + ` ON ` + n.letters + ` (error_code);
CREATE TABLE IF NOT EXISTS ` + n.replays + ` (
    id             bigserial   PRIMARY KEY,
    kind           text        NOT NULL CHECK (kind IN ('dlq', 'outbox')),
    actor          text        NOT NULL,
    started_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    filters        jsonb       NOT NULL DEFAULT '{}',
    dry_run        boolean     NOT NULL DEFAULT false,
    forced         boolean     NOT NULL DEFAULT false,
    rate_per_sec   float8      NOT NULL DEFAULT 0,
    selected       int         NOT NULL DEFAULT 0,
    published      int         NOT NULL DEFAULT 0,
    skipped        int         NOT NULL DEFAULT 0,
    failed         int         NOT NULL DEFAULT 0,
    topic_override text
);
CREATE TABLE IF NOT EXISTS ` + n.events + ` (
    id             bigserial   PRIMARY KEY,
    replay_id      bigint      NOT NULL REFERENCES ` + n.replays + ` (id) ON DELETE CASCADE,
    event_id       text        NOT NULL,
    dead_letter_id bigint,
    result         text        NOT NULL CHECK (result IN ('published', 'skipped', 'failed', 'dry_run')),
    error          text,
    at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ` + n.index("replay_events_replay_idx") + ` ON ` + n.events + ` (replay_id);
CREATE TABLE IF NOT EXISTS ` + n.transitions + ` (
    id             bigserial   PRIMARY KEY,
    dead_letter_id bigint      NOT NULL,
    event_id       text        NOT NULL,
    replay_id      bigint      REFERENCES ` + n.replays + ` (id) ON DELETE CASCADE,
    owner          text        NOT NULL,
    from_status    text        NOT NULL,
    to_status      text        NOT NULL,
    attempt        int         NOT NULL DEFAULT 0,
    topic          text,
    detail         text,
    at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ` + n.index("transitions_letter_idx") + ` ON ` + n.transitions + ` (dead_letter_id);
CREATE INDEX IF NOT EXISTS ` + n.index("transitions_replay_idx") + ` ON ` + n.transitions + ` (replay_id);
-- Tables of versions before the state model: add its columns, allow its
-- statuses, and call 'replayed' letters 'completed'.
ALTER TABLE ` + n.letters + `
    ADD COLUMN IF NOT EXISTS attempts           int NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS next_attempt_at    timestamptz,
    ADD COLUMN IF NOT EXISTS last_attempt_at    timestamptz,
    ADD COLUMN IF NOT EXISTS last_attempt_error text,
    ADD COLUMN IF NOT EXISTS claimed_by         text,
    ADD COLUMN IF NOT EXISTS claimed_until      timestamptz;
ALTER TABLE ` + n.replays + ` ADD COLUMN IF NOT EXISTS topic_override text;
ALTER TABLE ` + n.letters + ` ADD COLUMN IF NOT EXISTS source_table text;
DO $cdc_relay$
DECLARE
    old name;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
            WHERE conrelid = ` + n.literal(n.letters) + `::regclass AND conname = ` + n.literal(n.table+"_state_check") + `::name) THEN
        FOR old IN SELECT c.conname FROM pg_catalog.pg_constraint c
                JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
                WHERE c.conrelid = ` + n.literal(n.letters) + `::regclass AND c.contype = 'c' AND a.attname = 'status' LOOP
            EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', ` + n.literal(n.letters) + `, old);
        END LOOP;
        UPDATE ` + n.letters + ` SET status = 'completed' WHERE status = 'replayed';
        ALTER TABLE ` + n.letters + ` ADD CONSTRAINT ` + n.index("state_check") + ` CHECK (status IN (` + statusList + `));
    END IF;
END
$cdc_relay$;
`
}

// statusList is the SQL list of the statuses a letter may have: those of the
// state model, and 'replayed', which a relay or CLI of an older version may
// still write during an upgrade (it is read as completed).
// It is letterstate.SQLList(StatusReplayed), written out so that it is a
// constant (a test holds them equal).
const statusList = `'pending', 'processing', 'retry_wait', 'completed', 'dead', 'replayed'`

// names are the quoted names of a store's tables, and the name as configured.
type names struct {
	name                                  string // as configured, for messages
	schema, table                         string // unquoted parts
	letters, replays, events, transitions string // quoted
}

func newNames(table string) names {
	if table == "" {
		table = DefaultTable
	}
	schema, tbl := "public", table
	if s, t, ok := strings.Cut(table, "."); ok {
		schema, tbl = s, t
	}
	q := func(t string) string { return pgx.Identifier{schema, t}.Sanitize() }
	return names{
		name: table, schema: schema, table: tbl,
		letters: q(tbl), replays: q(tbl + "_replays"), events: q(tbl + "_replay_events"),
		transitions: q(tbl + "_transitions"),
	}
}

// literal quotes s as an SQL string literal.
func (names) literal(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// index quotes the name of one of the table's indexes (created in its schema).
func (n names) index(suffix string) string {
	return pgx.Identifier{n.table + "_" + suffix}.Sanitize()
}

// Store keeps dead letters in tables of the source database, beside which
// lies the replay history (History). It is safe for concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	n       names
	history *replay.History
}

// NewStore returns a store using the dead-letter table named table
// ("schema.table" or "table", unquoted; "" means DefaultTable) through pool, which
// the caller keeps owning and closes.
func NewStore(pool *pgxpool.Pool, table string) *Store {
	s := &Store{pool: pool, n: newNames(table)}
	s.history = replay.NewHistory(pool, s.n.replays, s.n.events, func(err error, what string) error {
		return s.wrap(err, "%s", what)
	})
	return s
}

// History returns the replay history kept in the tables named after the
// dead-letter table (<table>_replays, <table>_replay_events), which Ensure
// creates: the replays of dead letters and of outbox rows alike.
func (s *Store) History() *replay.History { return s.history }

// Table returns the dead-letter table's name as configured.
func (s *Store) Table() string { return s.n.name }

// Ensure creates the dead-letter and history tables when one is missing, and
// brings tables of older versions up to date (see TableDDL). When all exist
// and are current it changes nothing and so needs no CREATE privilege nor
// ownership. If the role may not create or alter them, the error says to run
// MigrationFile as a role that may. Calling it again, or from several
// processes, is harmless.
func (s *Store) Ensure(ctx context.Context) error {
	st, err := s.state(ctx)
	if err != nil {
		return err
	}
	if st == tablesCurrent {
		return nil
	}
	return s.applyDDL(ctx, st)
}

// Upgrade brings tables of older versions up to date, like Ensure, but
// creates nothing when the dead-letter table does not exist: the commands
// that only read or delete letters call it, so that they work on a table an
// older version made and still say that a missing one is missing.
func (s *Store) Upgrade(ctx context.Context) error {
	st, err := s.state(ctx)
	if err != nil || st != tablesOld {
		return err
	}
	return s.applyDDL(ctx, st)
}

// What state finds.
const (
	tablesMissing = iota // the dead-letter table or a history table does not exist
	tablesOld            // they exist, made by a version before the state model
	tablesCurrent
)

// state looks up whether the tables exist and are current.
func (s *Store) state(ctx context.Context) (int, error) {
	var letters, all, current bool
	err := s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL,
    to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL AND to_regclass($3) IS NOT NULL AND to_regclass($4) IS NOT NULL,
    EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'claimed_until' AND NOT attisdropped)
    AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = to_regclass($2) AND attname = 'topic_override' AND NOT attisdropped)
    AND EXISTS (SELECT 1 FROM pg_catalog.pg_constraint WHERE conrelid = to_regclass($1) AND conname = $5::name)`,
		s.n.letters, s.n.replays, s.n.events, s.n.transitions, s.n.table+"_state_check").Scan(&letters, &all, &current)
	switch {
	case err != nil:
		return 0, fmt.Errorf("look up dead-letter table %s: %w", s.n.name, err)
	case all && current:
		return tablesCurrent, nil
	case letters:
		return tablesOld, nil
	}
	return tablesMissing, nil
}

// applyDDL runs TableDDL, to create (st tablesMissing) or upgrade the tables.
func (s *Store) applyDDL(ctx context.Context, st int) error {
	what := "create dead-letter table " + s.n.name
	if st == tablesOld {
		what = "upgrade dead-letter table " + s.n.name + " (made by an older version) to the reprocessing state model"
	}
	// One statement string runs as one transaction: the advisory lock makes a
	// second relay starting at the same moment wait and then find the tables,
	// where two concurrent CREATE TABLE IF NOT EXISTS would collide in pg_type.
	lock := fmt.Sprintf("SELECT pg_advisory_xact_lock(hashtext(%s));\n", s.n.literal("cdc_relay ddl "+s.n.name))
	if _, err := s.pool.Exec(ctx, lock+TableDDL(s.n.name)); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
			if st == tablesOld {
				return fmt.Errorf("%s: the role may not alter it; run %s again (with the table name %s) as the tables' owner: %w",
					what, MigrationFile, s.n.name, err)
			}
			return fmt.Errorf("%s: the role may not create it; "+
				"run %s (with the table name %s) as the database owner, or grant the role CREATE on schema %s: %w",
				what, MigrationFile, s.n.name, s.n.schema, err)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// wrap adds what failed to err, and the fix when the tables are missing.
func (s *Store) wrap(err error, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("%s: dead-letter table %s or its history tables do not exist: run %s, "+
			"or start the relay with the dlq failure policy, which creates them: %w", what, s.n.name, MigrationFile, err)
	}
	return fmt.Errorf("%s in %s: %w", what, s.n.name, err)
}

// Add stores l, or, when a letter with l.EventID exists, records one more failure
// of it: retry_count+1, last_failed_at, error code and message updated, the
// status back to pending with no attempts, no retry time and no lease
// (first_failed_at and the event itself are kept). The
// letter is committed when Add returns nil, so the relay may then count the event
// as done.
//
// Headers are stored as JSON text: values that are not valid UTF-8, or hold NUL
// bytes, which jsonb refuses, are stored with U+FFFD in their place.
func (s *Store) Add(ctx context.Context, l Letter) error {
	if l.EventID == "" {
		return errors.New("add dead letter: the event id is empty")
	}
	h := l.Headers
	if l.PayloadType != outbox.PayloadText {
		h = maps.Clone(h)
		if h == nil {
			h = map[string]string{}
		}
		h[PayloadTypeKey] = l.PayloadType.String()
	}
	headers, err := headersJSON(h)
	if err != nil {
		return fmt.Errorf("add dead letter for event %s: %w", l.EventID, err)
	}
	payload := l.Payload
	if payload == nil {
		payload = []byte{} // NOT NULL: an SQL NULL payload is kept as empty
	}
	var lsn any
	if l.CommitLSN != 0 {
		lsn = l.CommitLSN.String()
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO `+s.n.letters+` AS d (event_id, aggregate_type, aggregate_id, event_type,
    message_key, payload, headers, topic, error_code, error_message, retry_count, first_failed_at, last_failed_at,
    relay_name, correlation_id, schema_version, commit_lsn, source_table)
VALUES ($1, nullif($2, ''), nullif($3, ''), nullif($4, ''), $5, $6, $7::jsonb, $8, $9, $10, $11,
    coalesce($12::timestamptz, now()), coalesce($13::timestamptz, $12::timestamptz, now()),
    $14, nullif($15, ''), nullif($16, ''), $17::text::pg_lsn, nullif($18, ''))
ON CONFLICT (event_id) DO UPDATE SET
    retry_count = d.retry_count + 1,
    last_failed_at = excluded.last_failed_at,
    error_code = excluded.error_code,
    error_message = excluded.error_message,
    status = 'pending',
    attempts = 0,
    next_attempt_at = NULL,
    claimed_by = NULL,
    claimed_until = NULL`,
		l.EventID, l.AggregateType, l.AggregateID, l.EventType,
		l.Key, payload, headers, l.Topic, l.ErrorCode, l.ErrorMessage, l.RetryCount,
		nullTime(l.FirstFailedAt), nullTime(l.LastFailedAt),
		l.RelayName, l.CorrelationID, l.SchemaVersion, lsn, l.SourceTable)
	if err != nil {
		return s.wrap(err, "add dead letter for event %s", l.EventID)
	}
	return nil
}

func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// headersJSON encodes headers as a JSON object jsonb accepts.
func headersJSON(h map[string]string) (string, error) {
	clean := make(map[string]string, len(h))
	for k, v := range h {
		clean[jsonSafe(k)] = jsonSafe(v)
	}
	b, err := json.Marshal(clean)
	if err != nil {
		return "", fmt.Errorf("encode headers: %w", err)
	}
	return string(b), nil
}

func jsonSafe(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// Filter selects dead letters. Zero fields select everything; set fields must
// all match.
type Filter struct {
	IDs           []int64  // any of these ids
	EventIDs      []string // any of these event ids
	ErrorCode     string
	AggregateID   string
	EventType     string
	AggregateType string
	Topic         string    // the topic the letters were meant for
	SourceTable   string    // the outbox table (schema.table) the events came from
	Status        string    // one of Statuses (StatusReplayed selects the completed), or "" for any
	Since         time.Time // last failure at or after
	Until         time.Time // last failure before
	Limit         int       // at most this many letters (lowest ids first); 0 = no limit

	after int64 // only ids above this one (paging)
}

// Validate reports a Status that is not a letter status.
func (f Filter) Validate() error {
	if err := CheckStatus(f.Status); err != nil {
		return err
	}
	if f.Limit < 0 {
		return fmt.Errorf("limit %d is negative", f.Limit)
	}
	return nil
}

// CheckStatus reports a status that is not one of Statuses, "" or
// StatusReplayed (the former name of StatusCompleted).
func CheckStatus(status string) error {
	if status == "" || status == StatusReplayed || slices.Contains(Statuses, status) {
		return nil
	}
	return fmt.Errorf("status %q is not one of %s", status, strings.Join(Statuses, ", "))
}

// statusesOf returns the values of the status column that mean status:
// completed letters may still be marked 'replayed' by an older version.
func statusesOf(status string) []string {
	if status == StatusCompleted || status == StatusReplayed {
		return []string{StatusCompleted, StatusReplayed}
	}
	return []string{status}
}

// where returns the filter's WHERE clause, appending its arguments to args.
func (f Filter) where(args *[]any) string {
	var conds []string
	add := func(cond string, v any) {
		*args = append(*args, v)
		conds = append(conds, strings.ReplaceAll(cond, "$?", fmt.Sprintf("$%d", len(*args))))
	}
	if len(f.IDs) > 0 {
		add("id = ANY($?)", f.IDs)
	}
	if len(f.EventIDs) > 0 {
		add("event_id = ANY($?)", f.EventIDs)
	}
	if f.ErrorCode != "" {
		add("error_code = $?", f.ErrorCode)
	}
	if f.AggregateID != "" {
		add("aggregate_id = $?", f.AggregateID)
	}
	if f.EventType != "" {
		add("event_type = $?", f.EventType)
	}
	if f.AggregateType != "" {
		add("aggregate_type = $?", f.AggregateType)
	}
	if f.Topic != "" {
		add("topic = $?", f.Topic)
	}
	if f.SourceTable != "" {
		add("source_table = $?", f.SourceTable)
	}
	if f.Status != "" {
		add("status = ANY($?)", statusesOf(f.Status))
	}
	if !f.Since.IsZero() {
		add("last_failed_at >= $?", f.Since)
	}
	if !f.Until.IsZero() {
		add("last_failed_at < $?", f.Until)
	}
	if f.after > 0 {
		add("id > $?", f.after)
	}
	if len(conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(conds, " AND ")
}

// describe returns the set fields of f, for the replay history.
func (f Filter) describe() map[string]any {
	m := map[string]any{}
	if len(f.IDs) > 0 {
		m["ids"] = f.IDs
	}
	if len(f.EventIDs) > 0 {
		m["event_ids"] = f.EventIDs
	}
	for k, v := range map[string]string{"error_code": f.ErrorCode, "aggregate_id": f.AggregateID,
		"event_type": f.EventType, "aggregate_type": f.AggregateType, "topic": f.Topic, "source_table": f.SourceTable, "status": f.Status} {
		if v != "" {
			m[k] = v
		}
	}
	if !f.Since.IsZero() {
		m["since"] = f.Since.UTC().Format(time.RFC3339Nano)
	}
	if !f.Until.IsZero() {
		m["until"] = f.Until.UTC().Format(time.RFC3339Nano)
	}
	if f.Limit > 0 {
		m["limit"] = f.Limit
	}
	return m
}

const letterColumns = `id, event_id, coalesce(aggregate_type, ''), coalesce(aggregate_id, ''), coalesce(event_type, ''),
    message_key, payload, headers, topic, error_code, error_message, retry_count, first_failed_at, last_failed_at,
    relay_name, coalesce(correlation_id, ''), coalesce(schema_version, ''), coalesce(commit_lsn::text, ''),
    coalesce(source_table, ''), status, replayed_at, replay_count, attempts, next_attempt_at, last_attempt_at, coalesce(last_attempt_error, ''),
    coalesce(claimed_by, ''), claimed_until`

func scanLetter(row pgx.Row, extra ...any) (Letter, error) {
	var l Letter
	var lsn string
	dest := []any{&l.ID, &l.EventID, &l.AggregateType, &l.AggregateID, &l.EventType,
		&l.Key, &l.Payload, &l.Headers, &l.Topic, &l.ErrorCode, &l.ErrorMessage, &l.RetryCount,
		&l.FirstFailedAt, &l.LastFailedAt, &l.RelayName, &l.CorrelationID, &l.SchemaVersion, &lsn,
		&l.SourceTable, &l.Status, &l.ReplayedAt, &l.ReplayCount, &l.Attempts, &l.NextAttemptAt, &l.LastAttemptAt, &l.LastAttemptError,
		&l.ClaimedBy, &l.ClaimedUntil}
	if err := row.Scan(append(dest, extra...)...); err != nil {
		return Letter{}, err
	}
	if v, ok := l.Headers[PayloadTypeKey]; ok {
		l.PayloadType = outbox.ParsePayloadType(v)
		delete(l.Headers, PayloadTypeKey)
	}
	if l.Status == StatusReplayed {
		l.Status = StatusCompleted
	}
	if lsn != "" {
		var err error
		if l.CommitLSN, err = pglogrepl.ParseLSN(lsn); err != nil {
			return Letter{}, fmt.Errorf("parse commit LSN %q of dead letter %d: %w", lsn, l.ID, err)
		}
	}
	return l, nil
}

// List returns the letters f selects, ordered by id.
func (s *Store) List(ctx context.Context, f Filter) ([]Letter, error) {
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	var args []any
	q := "SELECT " + letterColumns + " FROM " + s.n.letters + f.where(&args) + " ORDER BY id"
	if f.Limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", f.Limit)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, s.wrap(err, "list dead letters")
	}
	letters, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Letter, error) { return scanLetter(r) })
	if err != nil {
		return nil, s.wrap(err, "list dead letters")
	}
	return letters, nil
}

// Get returns the letter with id, or an error wrapping ErrNotFound.
func (s *Store) Get(ctx context.Context, id int64) (Letter, error) {
	l, err := scanLetter(s.pool.QueryRow(ctx, "SELECT "+letterColumns+" FROM "+s.n.letters+" WHERE id = $1", id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Letter{}, fmt.Errorf("get dead letter %d from %s: %w", id, s.n.name, ErrNotFound)
	}
	if err != nil {
		return Letter{}, s.wrap(err, "get dead letter %d", id)
	}
	return l, nil
}

// CodeCount summarises the letters of one error code.
type CodeCount struct {
	ErrorCode string
	Count     int64 // letters with this code
	// Pending counts those not completed (pending, processing, retry_wait or
	// dead): the events consumers still miss.
	Pending int64
	Dead    int64     // of which dead
	Oldest  time.Time // earliest first failure
	Newest  time.Time // latest last failure
}

// Summary counts the letters f selects per error code, most frequent first.
// f.Limit is ignored.
func (s *Store) Summary(ctx context.Context, f Filter) ([]CodeCount, error) {
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("summarise dead letters: %w", err)
	}
	var args []any
	rows, err := s.pool.Query(ctx, `SELECT error_code, count(*), count(*) FILTER (WHERE status NOT IN ('completed', 'replayed')),
    count(*) FILTER (WHERE status = 'dead'), min(first_failed_at), max(last_failed_at) FROM `+s.n.letters+f.where(&args)+`
GROUP BY error_code ORDER BY count(*) DESC, error_code`, args...)
	if err != nil {
		return nil, s.wrap(err, "summarise dead letters")
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (CodeCount, error) {
		var c CodeCount
		err := r.Scan(&c.ErrorCode, &c.Count, &c.Pending, &c.Dead, &c.Oldest, &c.Newest)
		return c, err
	})
	if err != nil {
		return nil, s.wrap(err, "summarise dead letters")
	}
	return out, nil
}

// BacklogBySource returns how many letters are not completed per outbox
// table their events came from (Letter.SourceTable; "" for those without
// one), tables without any left out.
func (s *Store) BacklogBySource(ctx context.Context) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT coalesce(source_table, ''), count(*) FROM `+s.n.letters+`
WHERE status NOT IN ('completed', 'replayed') GROUP BY 1`)
	if err != nil {
		return nil, s.wrap(err, "count dead letters not completed by source table")
	}
	out := map[string]int64{}
	for rows.Next() {
		var t string
		var n int64
		if err := rows.Scan(&t, &n); err != nil {
			rows.Close()
			return nil, s.wrap(err, "count dead letters not completed by source table")
		}
		out[t] = n
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap(err, "count dead letters not completed by source table")
	}
	return out, nil
}

// Backlog returns how many letters are not completed (pending, processing,
// retry_wait or dead): the events consumers still miss.
func (s *Store) Backlog(ctx context.Context) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.n.letters+" WHERE status NOT IN ('completed', 'replayed')").Scan(&n); err != nil {
		return 0, s.wrap(err, "count dead letters not completed")
	}
	return n, nil
}

// StatusCounts returns how many letters have each of Statuses (every one is
// in the map, 0 when none has it), for metrics.
func (s *Store) StatusCounts(ctx context.Context) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, "SELECT status, count(*) FROM "+s.n.letters+" GROUP BY status")
	if err != nil {
		return nil, s.wrap(err, "count dead letters by status")
	}
	out := make(map[string]int64, len(Statuses))
	for _, st := range Statuses {
		out[st] = 0
	}
	var status string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&status, &n}, func() error {
		if status == StatusReplayed {
			status = StatusCompleted
		}
		out[status] += n
		return nil
	})
	if err != nil {
		return nil, s.wrap(err, "count dead letters by status")
	}
	return out, nil
}

// purgeBatch is how many letters one DELETE of Purge removes.
const purgeBatch = 1000

// Purge deletes letters whose last failure, and last replay if any, are before
// olderThan, and whose status is status ("" for any), except letters a replay
// holds (processing, the lease not expired). It deletes in batches of 1000,
// each its own transaction, so it never holds many locks or a long
// transaction, and returns how many it deleted. The replay history is kept.
func (s *Store) Purge(ctx context.Context, olderThan time.Time, status string) (int64, error) {
	if err := CheckStatus(status); err != nil {
		return 0, fmt.Errorf("purge dead letters: %w", err)
	}
	statuses := append(slices.Clone(Statuses), StatusReplayed)
	if status != "" {
		statuses = statusesOf(status)
	}
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, `DELETE FROM `+s.n.letters+` WHERE id IN (
    SELECT id FROM `+s.n.letters+`
    WHERE last_failed_at < $1 AND (replayed_at IS NULL OR replayed_at < $1) AND status = ANY($2)
        AND NOT (status = 'processing' AND claimed_until > now())
    ORDER BY id LIMIT $3)`, olderThan, statuses, purgeBatch)
		if err != nil {
			return total, s.wrap(err, "purge dead letters older than %s (%d deleted so far)", olderThan.Format(time.RFC3339), total)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < purgeBatch {
			return total, nil
		}
	}
}

// MarkCompleted records that letter id was published again and acknowledged
// by other means than a replay: status completed, replayed_at now,
// replay_count+1, no lease. It returns an error wrapping ErrNotFound when
// there is no such letter.
func (s *Store) MarkCompleted(ctx context.Context, id int64) error {
	tag, err := s.pool.Exec(ctx, `UPDATE `+s.n.letters+` SET status = 'completed', replayed_at = now(),
    replay_count = replay_count + 1, claimed_by = NULL, claimed_until = NULL, next_attempt_at = NULL WHERE id = $1`, id)
	if err != nil {
		return s.wrap(err, "mark dead letter %d completed", id)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("mark dead letter %d completed in %s: %w", id, s.n.name, ErrNotFound)
	}
	return nil
}
