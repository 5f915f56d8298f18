// Package deadletter is the dead-letter store of the relay's dlq failure policy,
// and the replays that publish dead letters, or rows still in the outbox table,
// to Kafka again.
//
// The store is a table in the source database (TableDDL, migrations/
// 005_dead_letters.sql) plus two history tables that record every replay and the
// result of every event it touched. A dead letter keeps everything needed to
// publish the event as the relay would have: event id, key, payload, headers and
// topic. Replays keep the event id (header "id"), so idempotent consumers drop an
// event they already have.
package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

// DefaultTable is the dead-letter table a Store uses when given no name.
const DefaultTable = "public.cdc_relay_dead_letters"

// MigrationFile creates the tables of TableDDL(DefaultTable), for roles that may
// not create tables themselves.
const MigrationFile = "migrations/005_dead_letters.sql"

// Letter statuses.
const (
	StatusPending  = "pending"  // not replayed since it last failed
	StatusReplayed = "replayed" // published again by a replay and acknowledged by Kafka
)

// ErrNotFound is returned by Get and MarkReplayed when no dead letter has the id.
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
	Status        string        // StatusPending or StatusReplayed
	ReplayedAt    *time.Time    // last successful replay
	ReplayCount   int           // successful replays
}

// TableDDL returns the statements that create the dead-letter table named table
// ("table" or "schema.table", unquoted; "" means DefaultTable), its indexes, and
// its history tables <table>_replays and <table>_replay_events, each only if
// missing. Store.Ensure and MigrationFile use this same text.
func TableDDL(table string) string {
	n := newNames(table)
	return `CREATE TABLE IF NOT EXISTS ` + n.letters + ` (
    id              bigserial   PRIMARY KEY,
    event_id        text        NOT NULL UNIQUE,
    aggregate_type  text,
    aggregate_id    text,
    event_type      text,
    message_key     bytea,
    payload         bytea       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}',
    topic           text        NOT NULL,
    error_code      text        NOT NULL,
    error_message   text        NOT NULL,
    retry_count     int         NOT NULL DEFAULT 0,
    first_failed_at timestamptz NOT NULL,
    last_failed_at  timestamptz NOT NULL,
    relay_name      text        NOT NULL DEFAULT '',
    correlation_id  text,
    schema_version  text,
    commit_lsn      pg_lsn,
    status          text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'replayed')),
    replayed_at     timestamptz,
    replay_count    int         NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS ` + n.index("status_idx") + ` ON ` + n.letters + ` (status, last_failed_at);
CREATE INDEX IF NOT EXISTS ` + n.index("error_code_idx") + ` ON ` + n.letters + ` (error_code);
CREATE TABLE IF NOT EXISTS ` + n.replays + ` (
    id           bigserial   PRIMARY KEY,
    kind         text        NOT NULL CHECK (kind IN ('dlq', 'outbox')),
    actor        text        NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    filters      jsonb       NOT NULL DEFAULT '{}',
    dry_run      boolean     NOT NULL DEFAULT false,
    forced       boolean     NOT NULL DEFAULT false,
    rate_per_sec float8      NOT NULL DEFAULT 0,
    selected     int         NOT NULL DEFAULT 0,
    published    int         NOT NULL DEFAULT 0,
    skipped      int         NOT NULL DEFAULT 0,
    failed       int         NOT NULL DEFAULT 0
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
`
}

// names are the quoted names of a store's tables, and the name as configured.
type names struct {
	name                     string // as configured, for messages
	schema, table            string // unquoted parts
	letters, replays, events string // quoted
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
	}
}

// index quotes the name of one of the table's indexes (created in its schema).
func (n names) index(suffix string) string {
	return pgx.Identifier{n.table + "_" + suffix}.Sanitize()
}

// Store keeps dead letters and the replay history in tables of the source
// database. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	n    names
}

// NewStore returns a store using the dead-letter table named table
// ("schema.table" or "table", unquoted; "" means DefaultTable) through pool, which
// the caller keeps owning and closes.
func NewStore(pool *pgxpool.Pool, table string) *Store {
	return &Store{pool: pool, n: newNames(table)}
}

// Table returns the dead-letter table's name as configured.
func (s *Store) Table() string { return s.n.name }

// Ensure creates the dead-letter and history tables when one is missing. When
// all exist it creates nothing and so needs no CREATE privilege. If the role may
// not create them, the error says to run MigrationFile as a role that may.
// Calling it again, or from several processes, is harmless.
func (s *Store) Ensure(ctx context.Context) error {
	var exist bool
	err := s.pool.QueryRow(ctx,
		"SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL AND to_regclass($3) IS NOT NULL",
		s.n.letters, s.n.replays, s.n.events).Scan(&exist)
	if err != nil {
		return fmt.Errorf("look up dead-letter table %s: %w", s.n.name, err)
	}
	if exist {
		return nil
	}
	if _, err := s.pool.Exec(ctx, TableDDL(s.n.name)); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
			return fmt.Errorf("create dead-letter table %s: the role may not create it; "+
				"run %s (with the table name %s) as the database owner, or grant the role CREATE on schema %s: %w",
				s.n.name, MigrationFile, s.n.name, s.n.schema, err)
		}
		return fmt.Errorf("create dead-letter table %s: %w", s.n.name, err)
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
// of it: retry_count+1, last_failed_at, error code and message updated and the
// status back to pending (first_failed_at and the event itself are kept). The
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
    relay_name, correlation_id, schema_version, commit_lsn)
VALUES ($1, nullif($2, ''), nullif($3, ''), nullif($4, ''), $5, $6, $7::jsonb, $8, $9, $10, $11,
    coalesce($12::timestamptz, now()), coalesce($13::timestamptz, $12::timestamptz, now()),
    $14, nullif($15, ''), nullif($16, ''), $17::text::pg_lsn)
ON CONFLICT (event_id) DO UPDATE SET
    retry_count = d.retry_count + 1,
    last_failed_at = excluded.last_failed_at,
    error_code = excluded.error_code,
    error_message = excluded.error_message,
    status = 'pending'`,
		l.EventID, l.AggregateType, l.AggregateID, l.EventType,
		l.Key, payload, headers, l.Topic, l.ErrorCode, l.ErrorMessage, l.RetryCount,
		nullTime(l.FirstFailedAt), nullTime(l.LastFailedAt),
		l.RelayName, l.CorrelationID, l.SchemaVersion, lsn)
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
	Status        string    // StatusPending, StatusReplayed or "" for both
	Since         time.Time // last failure at or after
	Until         time.Time // last failure before
	Limit         int       // at most this many letters (lowest ids first); 0 = no limit

	after int64 // only ids above this one (paging)
}

// Validate reports a Status that is not a letter status.
func (f Filter) Validate() error {
	switch f.Status {
	case "", StatusPending, StatusReplayed:
	default:
		return fmt.Errorf("status %q is not %s or %s", f.Status, StatusPending, StatusReplayed)
	}
	if f.Limit < 0 {
		return fmt.Errorf("limit %d is negative", f.Limit)
	}
	return nil
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
	if f.Status != "" {
		add("status = $?", f.Status)
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
		"event_type": f.EventType, "aggregate_type": f.AggregateType, "status": f.Status} {
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
    status, replayed_at, replay_count`

func scanLetter(row pgx.Row) (Letter, error) {
	var l Letter
	var lsn string
	err := row.Scan(&l.ID, &l.EventID, &l.AggregateType, &l.AggregateID, &l.EventType,
		&l.Key, &l.Payload, &l.Headers, &l.Topic, &l.ErrorCode, &l.ErrorMessage, &l.RetryCount,
		&l.FirstFailedAt, &l.LastFailedAt, &l.RelayName, &l.CorrelationID, &l.SchemaVersion, &lsn,
		&l.Status, &l.ReplayedAt, &l.ReplayCount)
	if err != nil {
		return Letter{}, err
	}
	if v, ok := l.Headers[PayloadTypeKey]; ok {
		l.PayloadType = outbox.ParsePayloadType(v)
		delete(l.Headers, PayloadTypeKey)
	}
	if lsn != "" {
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
	Count     int64     // letters with this code
	Pending   int64     // of which not replayed
	Oldest    time.Time // earliest first failure
	Newest    time.Time // latest last failure
}

// Summary counts the letters f selects per error code, most frequent first.
// f.Limit is ignored.
func (s *Store) Summary(ctx context.Context, f Filter) ([]CodeCount, error) {
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("summarise dead letters: %w", err)
	}
	var args []any
	rows, err := s.pool.Query(ctx, `SELECT error_code, count(*), count(*) FILTER (WHERE status = 'pending'),
    min(first_failed_at), max(last_failed_at) FROM `+s.n.letters+f.where(&args)+`
GROUP BY error_code ORDER BY count(*) DESC, error_code`, args...)
	if err != nil {
		return nil, s.wrap(err, "summarise dead letters")
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (CodeCount, error) {
		var c CodeCount
		err := r.Scan(&c.ErrorCode, &c.Count, &c.Pending, &c.Oldest, &c.Newest)
		return c, err
	})
	if err != nil {
		return nil, s.wrap(err, "summarise dead letters")
	}
	return out, nil
}

// Backlog returns how many letters are pending (not replayed), for a metric.
func (s *Store) Backlog(ctx context.Context) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.n.letters+" WHERE status = 'pending'").Scan(&n); err != nil {
		return 0, s.wrap(err, "count pending dead letters")
	}
	return n, nil
}

// purgeBatch is how many letters one DELETE of Purge removes.
const purgeBatch = 1000

// Purge deletes letters whose last failure, and last replay if any, are before
// olderThan, and whose status is status ("" for any). It deletes in batches of
// 1000, each its own transaction, so it never holds many locks or a long
// transaction, and returns how many it deleted. The replay history is kept.
func (s *Store) Purge(ctx context.Context, olderThan time.Time, status string) (int64, error) {
	if err := (Filter{Status: status}).Validate(); err != nil {
		return 0, fmt.Errorf("purge dead letters: %w", err)
	}
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, `DELETE FROM `+s.n.letters+` WHERE id IN (
    SELECT id FROM `+s.n.letters+`
    WHERE last_failed_at < $1 AND (replayed_at IS NULL OR replayed_at < $1) AND ($2 = '' OR status = $2)
    ORDER BY id LIMIT $3)`, olderThan, status, purgeBatch)
		if err != nil {
			return total, s.wrap(err, "purge dead letters older than %s (%d deleted so far)", olderThan.Format(time.RFC3339), total)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < purgeBatch {
			return total, nil
		}
	}
}

// MarkReplayed records that letter id was published again and acknowledged:
// status replayed, replayed_at now, replay_count+1. It returns an error wrapping
// ErrNotFound when there is no such letter.
func (s *Store) MarkReplayed(ctx context.Context, id int64) error {
	tag, err := s.pool.Exec(ctx, `UPDATE `+s.n.letters+` SET status = 'replayed', replayed_at = now(),
    replay_count = replay_count + 1 WHERE id = $1`, id)
	if err != nil {
		return s.wrap(err, "mark dead letter %d replayed", id)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("mark dead letter %d replayed in %s: %w", id, s.n.name, ErrNotFound)
	}
	return nil
}
