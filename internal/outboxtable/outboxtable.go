// Package outboxtable reads the outbox table itself, not its WAL: it
// republishes rows still in the table (a replay for consumers rebuilding
// their state; through a Republisher, the relay's backfill after a slot loss,
// its initial snapshot and a table's join) and prunes old rows.
// Its replays run, and are recorded, through package replay, beside the
// dead-letter replays, so operators find every replay in one place.
package outboxtable

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/connectjson"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// Columns names the outbox table's columns for Replay. They mirror the
// decoder's configuration (decoder.Config), so errors name the decoder's
// fields ("TimestampColumn") as the setting to check, through Names.
type Columns struct {
	decoder.Columns        // as the relay's outbox.columns.* settings
	CreatedAt       string // insert time, for the time filters and order; "" means created_at
	// Headers maps extra columns to Kafka headers, as the relay's
	// outbox.header_columns (decoder.Config.HeaderColumns); NULL columns send none.
	Headers map[string]string
	// ContentType and Tracing are the relay's outbox.content_type and
	// outbox.columns.tracing (decoder.Config.ContentType, TracingColumn): rows are
	// published in the stream's format (decoder.Format), a bytea payload or key
	// as raw bytes. A Tracing column the table lacks is ignored, as the relay
	// ignores it.
	ContentType string
	Tracing     string
	// Timestamp is the relay's outbox.columns.timestamp
	// (decoder.Config.TimestampColumn): read as the stream reads it
	// (decoder.ParseTimestamp) into the record timestamp. "" means none.
	Timestamp string
	// Partition is the relay's outbox.columns.partition
	// (decoder.Config.PartitionColumn), read into Event.TargetPartition.
	// "" means none.
	Partition string
	// Envelope is the relay's outbox.envelope_columns
	// (decoder.Config.EnvelopeColumns): the value is decoder.Envelope of
	// the payload and these columns. nil means none.
	Envelope []decoder.EnvelopeColumn
	// JSON, SchemaVersion and RouteByEventType are the relay's JSON
	// encoding (decoder.Config.JSON, SchemaVersionColumn,
	// RouteByEventType): keys and values are written as the stream writes
	// them, with the nullability of the table's columns.
	JSON             connectjson.Options
	SchemaVersion    string
	RouteByEventType bool
	// Names names the settings in errors, as decoder.Config's fields (the
	// caller's Namer Within the field that holds the decoder's configuration).
	Names setting.Namer
}

// ReplayOptions configures Replay. Zero filters select everything.
type ReplayOptions struct {
	Since, Until time.Time // created_at in [Since, Until)
	AggregateID  string
	EventType    string
	IDs          []string // event ids, as text
	Limit        int      // at most this many rows; 0 = no limit
	// Topic is the relay's topic template, e.g. "outbox.{aggregate_type}",
	// rendered per row.
	Topic string
	// TopicRegex is the relay's outbox.topic_regex (route.NewWithRegex).
	TopicRegex route.Regex
	Rate       float64 // events per second; 0 = unlimited
	BatchSize  int     // 0 means replay.DefaultBatchSize
	DryRun     bool
	Actor      string
	// Headers are added to every published event, after
	// replay.HeaderReplay (e.g. replay.HeaderBackfill).
	Headers []outbox.Header
	// Snapshot, when not "", is a pg_snapshot as text
	// (pg_current_snapshot()::text): only rows whose inserting transaction is
	// visible in it are read, the rows a transaction with that snapshot saw,
	// less those deleted since (a join resumed after a crash reads what its
	// snapshot held, not the rows the stream carries since); see Through.
	Snapshot string
	// CommittedSince, when not zero, reads only rows whose transaction
	// committed at or after it (pg_xact_commit_timestamp), and rows whose
	// commit time is unknown. It needs track_commit_timestamp = on: Replay
	// and Count refuse it otherwise.
	CommittedSince time.Time
	// After resumes the read after this position, one Progress gave (a
	// Position's Encode); "" reads from the start.
	After string
	// Through, when not "", ends the read at this position (inclusive), one
	// Last gave. pg_current_snapshot lists no subtransactions, so Snapshot
	// alone also admits rows a subtransaction of a transaction in progress at
	// the snapshot wrote; in commit order those come after every row the
	// snapshot saw, and Last's position taken in the snapshot excludes them.
	Through string
	// Progress, when not nil, is called after each batch Kafka acknowledged,
	// or whose failures the history recorded, with the position of its last
	// row: every row up to it is done. An error stops the replay.
	Progress func(ctx context.Context, pos string) error
	// OnOrder, when not nil, is told the ordering the read uses (ReadOrder,
	// and the table's insertion-order column) before the first row, for the
	// line that says so and what it can misorder (Ordering.Caveat).
	OnOrder func(Ordering)
}

func (o ReplayOptions) describe(table string) map[string]any {
	m := map[string]any{"table": table, "topic": o.Topic}
	if !o.Since.IsZero() {
		m["since"] = o.Since.UTC().Format(time.RFC3339Nano)
	}
	if !o.Until.IsZero() {
		m["until"] = o.Until.UTC().Format(time.RFC3339Nano)
	}
	if o.AggregateID != "" {
		m["aggregate_id"] = o.AggregateID
	}
	if o.EventType != "" {
		m["event_type"] = o.EventType
	}
	if len(o.IDs) > 0 {
		m["ids"] = o.IDs
	}
	if o.Limit > 0 {
		m["limit"] = o.Limit
	}
	if o.Snapshot != "" {
		m["snapshot"] = o.Snapshot
	}
	if !o.CommittedSince.IsZero() {
		m["committed_since"] = o.CommittedSince.UTC().Format(time.RFC3339Nano)
	}
	if o.After != "" {
		m["after"] = o.After
	}
	if o.Through != "" {
		m["through"] = o.Through
	}
	return m
}

// quoteTable quotes "table" or "schema.table" as one SQL name.
func quoteTable(table string) string {
	return pgx.Identifier(strings.Split(table, ".")).Sanitize()
}

func quoteColumn(c string) string { return pgx.Identifier{c}.Sanitize() }

// Querier runs a query: *pgxpool.Pool, *pgx.Conn, pgx.Tx. Replay reads in a
// transaction: the one given (a transaction that imported a snapshot makes it
// read the table as of that snapshot: the relay's initial snapshot, a join),
// else one it opens on the pool or connection.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

var _ Querier = (*pgxpool.Pool)(nil)

// Replay publishes rows still present in the outbox table again, for
// consumers that rebuild their state, in the reader's order (reader.go:
// commit order where the server tracks commit timestamps, else created_at;
// each transaction's rows as it inserted them), each as the relay publishes it
// (key aggregate_id, value payload, the same "id" header and header columns)
// plus the header replay.HeaderReplay, to the topic o.Topic renders.
// commit_lsn is 0/0 (unknown) and commit_time carries created_at, since a row
// read from the table has no commit position. The replay is recorded in
// history as kind "outbox"; outbox rows are not marked. Rows are read through
// one server-side cursor in one transaction (db's, when db is one; else a
// REPEATABLE READ one Replay opens), a batch at a time: one snapshot, one scan,
// never a row skipped or read twice, the table neither locked nor held in
// memory. p may be nil for a dry run. On ctx's end it behaves as
// deadletter.Store.ReplayDeadLetters.
func Replay(ctx context.Context, db Querier, history *replay.History, table string, cols Columns, p replay.Publisher, o ReplayOptions) (replay.Outcome, error) {
	q, err := newQuery(table, cols, o)
	if err != nil {
		return replay.Outcome{}, err
	}
	router, err := route.NewWithRegex(o.Topic, o.TopicRegex)
	if err != nil {
		return replay.Outcome{}, fmt.Errorf("replay outbox: %w", err)
	}
	r, err := history.StartRun(ctx, p, replay.Entry{Kind: replay.KindOutbox, Actor: o.Actor, Filters: o.describe(table),
		DryRun: o.DryRun, RatePerSec: o.Rate}, o.BatchSize, nil)
	if err != nil {
		return replay.Outcome{}, err
	}
	tx, end, err := inTx(ctx, db)
	if err != nil {
		return r.Finish(ctx, err)
	}
	defer end()
	if err := q.prepare(ctx, tx); err != nil {
		return r.Finish(ctx, err)
	}
	if o.OnOrder != nil {
		o.OnOrder(Ordering{Order: q.order, Column: q.insertOrder})
	}
	sql, args := q.sql(rowsQuery)
	if err := declare(ctx, tx, sql, args); err != nil {
		return r.Finish(ctx, outboxErr(err, q.name, q.cols.Names))
	}
	batch := r.BatchSize()
	pages, stop := readAhead(ctx, tx, batch, q.scan)
	var last Position
	for pg := range pages {
		if pg.err != nil {
			stop()
			return r.Finish(ctx, outboxErr(pg.err, q.name, q.cols.Names))
		}
		end := pg.last
		var err error
		for i, ev := range pg.evs {
			if o.Limit > 0 && r.Selected() >= o.Limit {
				end = true
				break
			}
			r.Select()
			last = pg.pos[i]
			topic, terr := router.Topic(ev)
			switch {
			case terr != nil:
				err = r.Note(ctx, replay.Event{EventID: string(ev.ID), Result: replay.ResultFailed, Error: terr.Error(), At: time.Now()})
			case o.DryRun:
				err = r.Note(ctx, replay.Event{EventID: string(ev.ID), Result: replay.ResultDryRun})
			default:
				ev.Headers = append(ev.Headers, outbox.Header{Key: replay.HeaderReplay, Value: fmt.Appendf(nil, "%d", r.ID())})
				ev.Headers = append(ev.Headers, o.Headers...)
				err = r.Publish(ctx, replay.Item{Event: ev, Topic: topic})
			}
			if err != nil {
				stop()
				return r.Finish(ctx, err)
			}
		}
		// One batch: published, acknowledged and recorded before Progress
		// names its last row, so every row before that position is done.
		if err := r.Flush(ctx); err != nil {
			stop()
			return r.Finish(ctx, err)
		}
		if o.Progress != nil && len(pg.evs) > 0 {
			if err := o.Progress(ctx, last.Encode()); err != nil {
				stop()
				return r.Finish(ctx, fmt.Errorf("replay outbox: record progress: %w", err))
			}
		}
		if end {
			break
		}
	}
	stop()
	if err := closeCursor(ctx, tx); err != nil {
		return r.Finish(ctx, outboxErr(err, q.name, q.cols.Names))
	}
	return r.Finish(ctx, nil)
}

// Count returns how many rows Replay with options o would select from table
// (its filters, Snapshot, CommittedSince, After and Through; not Limit), read
// through db.
func Count(ctx context.Context, db Querier, table string, cols Columns, o ReplayOptions) (int64, error) {
	q, err := newQuery(table, cols, o)
	if err != nil {
		return 0, err
	}
	if err := q.prepare(ctx, db); err != nil {
		return 0, err
	}
	sql, args := q.sql(countQuery)
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return 0, outboxErr(err, q.name, q.cols.Names)
	}
	n, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, outboxErr(err, q.name, q.cols.Names)
	}
	return n, nil
}

// Last returns the position of the last row Replay with options o would
// select from table (its filters, Snapshot, CommittedSince, After, Through;
// not Limit), read through db; ok is false when it selects none. Taken in the
// transaction of a snapshot, it is the Through of a read that resumes that
// snapshot's later.
func Last(ctx context.Context, db Querier, table string, cols Columns, o ReplayOptions) (pos string, ok bool, err error) {
	q, err := newQuery(table, cols, o)
	if err != nil {
		return "", false, err
	}
	if err := q.prepare(ctx, db); err != nil {
		return "", false, err
	}
	sql, args := q.sql(lastQuery)
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return "", false, outboxErr(err, q.name, q.cols.Names)
	}
	p := Position{Order: q.order}
	found := false
	for rows.Next() {
		if err := rows.Scan(&p.Known, &p.At, &p.Cmin, &p.Ord, &p.Rel, &p.TID); err != nil {
			rows.Close()
			return "", false, outboxErr(err, q.name, q.cols.Names)
		}
		found = true
	}
	if err := rows.Err(); err != nil {
		return "", false, outboxErr(err, q.name, q.cols.Names)
	}
	if !found {
		return "", false, nil
	}
	return p.Encode(), true, nil
}

// newQuery checks what Replay and Count are given and returns their query.
func newQuery(table string, cols Columns, o ReplayOptions) (*outboxQuery, error) {
	if cols.CreatedAt == "" {
		cols.CreatedAt = "created_at"
	}
	for _, c := range []string{cols.ID, cols.AggregateType, cols.AggregateID, cols.Payload} {
		if c == "" {
			return nil, errors.New("replay outbox: a column name is empty")
		}
	}
	if cols.EventType == "" && o.EventType != "" {
		return nil, errors.New("replay outbox: the table has no event type column to select by")
	}
	if !o.Since.IsZero() && !o.Until.IsZero() && !o.Until.After(o.Since) {
		return nil, fmt.Errorf("replay outbox: until (%s) is not after since (%s)",
			o.Until.Format(time.RFC3339), o.Since.Format(time.RFC3339))
	}
	q := &outboxQuery{table: quoteTable(table), name: table, cols: cols, o: o, headerCols: slices.Sorted(maps.Keys(cols.Headers))}
	q.schema, q.tableName, _ = strings.Cut(table, ".")
	if q.tableName == "" { // unqualified: the search path's, as Postgres reads it
		q.schema, q.tableName = "", table
	}
	if o.Snapshot != "" {
		x, err := snapshotXmax(o.Snapshot)
		if err != nil {
			return nil, fmt.Errorf("replay outbox: %w", err)
		}
		q.snapXmax = x
	}
	if o.After != "" {
		a, err := ParsePosition(o.After)
		if err != nil {
			return nil, fmt.Errorf("replay outbox: resume: %w", err)
		}
		q.after = &a
	}
	if o.Through != "" {
		a, err := ParsePosition(o.Through)
		if err != nil {
			return nil, fmt.Errorf("replay outbox: end: %w", err)
		}
		q.through = &a
	}
	return q, nil
}

// prepare reads what the query depends on: the table's columns and the
// order the server allows.
func (q *outboxQuery) prepare(ctx context.Context, db Querier) error {
	if err := q.describe(ctx, db); err != nil {
		return err
	}
	var err error
	if q.order, err = ReadOrder(ctx, db); err != nil {
		return fmt.Errorf("read outbox table %s: %w", q.name, err)
	}
	if !q.o.CommittedSince.IsZero() && q.order != CommitOrder {
		return fmt.Errorf("read outbox table %s: rows committed since %s can be told only with track_commit_timestamp = on (the server has it off)",
			q.name, q.o.CommittedSince.UTC().Format(time.RFC3339))
	}
	for _, p := range []*Position{q.after, q.through} {
		if p != nil && p.Order != q.order {
			return fmt.Errorf("read outbox table %s: %w: it was %s order, the server now gives %s order", q.name, errOrderChanged, p.Order, q.order)
		}
	}
	return nil
}

// snapshotXmax reads xmax of a pg_snapshot's text (xmin:xmax:xip,...).
func snapshotXmax(snap string) (uint64, error) {
	parts := strings.Split(snap, ":")
	if len(parts) != 3 {
		return 0, fmt.Errorf("snapshot %q is not a pg_snapshot (xmin:xmax:xip_list)", snap)
	}
	x, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("snapshot %q is not a pg_snapshot (xmin:xmax:xip_list): %w", snap, err)
	}
	return x, nil
}

// outboxQuery reads the outbox rows a replay selects, page by page.
type outboxQuery struct {
	table, name string
	// schema and tableName are the events' source table (outbox.Event).
	schema, tableName string
	cols              Columns
	o                 ReplayOptions
	format            decoder.Format       // set by describe
	tracing           bool                 // the table has cols.Tracing
	tsType            uint32               // type OID of cols.Timestamp, when set
	partType          uint32               // type OID of cols.Partition, when set
	payType           uint32               // type OID of the payload column
	json              *connectjson.Encoder // nil: raw keys and values
	hasVersion        bool                 // cols.SchemaVersion is read
	headerCols        []string             // cols.Headers' columns, sorted
	order             Order                // set by prepare
	snapXmax          uint64               // xmax of o.Snapshot, when set
	after, through    *Position            // o.After, o.Through, when set
	insertOrder       string               // the insertion-order column, "" when none; set by describe
}

// NotNullColumns returns the columns of table that are NOT NULL, which
// pgoutput does not announce: the relay hands them to its decoder for the
// JSON schemas (decoder.Decoder.SetNotNull). names names the settings in errors, as
// decoder.Config's fields (see Columns.Names).
func NotNullColumns(ctx context.Context, db Querier, table string, names setting.Namer) (map[string]bool, error) {
	rows, err := db.Query(ctx, `SELECT attname FROM pg_attribute
WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attnotnull`, quoteTable(table))
	if err != nil {
		return nil, outboxErr(err, table, names)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, outboxErr(err, table, names)
	}
	m := make(map[string]bool, len(cols))
	for _, n := range cols {
		m[n] = true
	}
	return m, nil
}

// describe reads the types of the payload and key columns and whether the
// tracing column exists from the catalog, as the relay learns them from the
// Relation message (pg_attribute.atttypid is the type OID pgoutput sends).
func (q *outboxQuery) describe(ctx context.Context, db Querier) error {
	// An insertion-order column is an integer one that a sequence fills:
	// an identity column, or one whose default is nextval() (serial; the
	// only kind a partitioned table has before PostgreSQL 17).
	rows, err := db.Query(ctx, `SELECT a.attname, a.atttypid::int8, a.atttypmod, a.attnotnull,
       a.atttypid IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype)
       AND (a.attidentity <> '' OR COALESCE(pg_get_expr(d.adbin, d.adrelid) LIKE 'nextval(%', false))
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`, q.table)
	if err != nil {
		return outboxErr(err, q.name, q.cols.Names)
	}
	defer rows.Close()
	var payloadType, keyType uint32
	cols := map[string]connectjson.Column{}
	for rows.Next() {
		var name string
		var oid int64
		var typmod int32
		var notNull, ordered bool
		if err := rows.Scan(&name, &oid, &typmod, &notNull, &ordered); err != nil {
			return fmt.Errorf("read columns of outbox table %s: %w", q.name, err)
		}
		cols[name] = connectjson.Column{Name: name, Type: uint32(oid), Typmod: typmod, NotNull: notNull}
		if ordered && q.insertOrder == "" {
			q.insertOrder = name
		}
		switch name {
		case q.cols.Payload:
			payloadType = uint32(oid)
		case q.cols.AggregateID:
			keyType = uint32(oid)
		}
		if q.cols.Tracing != "" && name == q.cols.Tracing {
			q.tracing = true
		}
		if q.cols.Timestamp != "" && name == q.cols.Timestamp {
			q.tsType = uint32(oid)
		}
		if q.cols.Partition != "" && name == q.cols.Partition {
			q.partType = uint32(oid)
		}
	}
	if err := rows.Err(); err != nil {
		return outboxErr(err, q.name, q.cols.Names)
	}
	if q.cols.Timestamp != "" {
		if q.tsType == 0 {
			return fmt.Errorf("read outbox table %s: it has no timestamp column %q %s", q.name, q.cols.Timestamp, q.cols.Names.Name("TimestampColumn"))
		}
		if err := decoder.CheckTimestampType(q.tsType); err != nil {
			return fmt.Errorf("read outbox table %s: timestamp column %q %w %s", q.name, q.cols.Timestamp, err, q.cols.Names.Name("TimestampColumn"))
		}
	}
	if q.cols.Partition != "" {
		if q.partType == 0 {
			return fmt.Errorf("read outbox table %s: it has no partition column %q %s", q.name, q.cols.Partition, q.cols.Names.Name("PartitionColumn"))
		}
		if err := decoder.CheckPartitionType(q.partType); err != nil {
			return fmt.Errorf("read outbox table %s: partition column %q %w %s", q.name, q.cols.Partition, err, q.cols.Names.Name("PartitionColumn"))
		}
	}
	q.format = decoder.NewFormat(q.cols.ContentType, payloadType, keyType, q.tracing)
	q.payType = payloadType
	return q.describeJSON(cols)
}

// describeJSON builds the JSON encoder from the table's columns, as the
// decoder does from the Relation message.
func (q *outboxQuery) describeJSON(cols map[string]connectjson.Column) error {
	o := q.cols.JSON
	if o.Key == connectjson.Raw && o.Value == connectjson.Raw {
		return nil
	}
	l := connectjson.Layout{Key: cols[q.cols.AggregateID], Payload: cols[q.cols.Payload], PayloadField: q.cols.Payload}
	for _, ec := range q.cols.Envelope {
		c, ok := cols[ec.Column]
		if !ok {
			return fmt.Errorf("read outbox table %s: it has no envelope column %q %s", q.name, ec.Column, q.cols.Names.Name("EnvelopeColumns"))
		}
		l.Envelope = append(l.Envelope, connectjson.EnvelopeField{Alias: ec.Alias, Column: c})
	}
	if q.cols.SchemaVersion != "" {
		c, ok := cols[q.cols.SchemaVersion]
		if !ok {
			return fmt.Errorf("read outbox table %s: it has no schema version column %q %s", q.name, q.cols.SchemaVersion, q.cols.Names.Name("SchemaVersionColumn"))
		}
		l.Version, q.hasVersion = &c, true
	}
	enc, err := connectjson.New(o, l)
	if err != nil {
		return fmt.Errorf("read outbox table %s: %w %s", q.name, err, q.cols.Names.Name("JSON"))
	}
	q.json = enc
	return nil
}

// The forms of the query sql returns.
const (
	rowsQuery  = iota // the rows, in the reader's order
	countQuery        // their number
	lastQuery         // the last one's position
)

// sql returns the query of the rows the read selects, in the reader's order
// with each row's sort key first (reader.go), or another form of it.
func (q *outboxQuery) sql(form int) (string, []any) {
	c := q.cols
	created, id := quoteColumn(c.CreatedAt), quoteColumn(c.ID)
	eventType := "NULL" // no event type column: an empty event_type header, as the relay sends
	if c.EventType != "" {
		eventType = quoteColumn(c.EventType)
	}
	insertOrder := ""
	if q.insertOrder != "" {
		insertOrder = quoteColumn(q.insertOrder)
	}
	key := keyExprs(q.order, created, insertOrder)
	sel := append(key[:], id+"::text", quoteColumn(c.AggregateType)+"::text", quoteColumn(c.AggregateID)+"::text",
		eventType+"::text", quoteColumn(c.Payload)+"::text", created)
	for _, h := range q.headerCols {
		sel = append(sel, quoteColumn(h)+"::text")
	}
	if q.tracing {
		sel = append(sel, quoteColumn(c.Tracing)+"::text")
	}
	if q.tsType != 0 {
		sel = append(sel, quoteColumn(c.Timestamp)+"::text")
	}
	if q.partType != 0 {
		sel = append(sel, quoteColumn(c.Partition)+"::text")
	}
	for _, ec := range c.Envelope {
		sel = append(sel, quoteColumn(ec.Column)+"::text")
	}
	if q.hasVersion {
		sel = append(sel, quoteColumn(c.SchemaVersion)+"::text")
	}
	var conds []string
	var args []any
	add := func(cond string, vals ...any) {
		for _, v := range vals {
			args = append(args, v)
			cond = strings.Replace(cond, "$?", fmt.Sprintf("$%d", len(args)), 1)
		}
		conds = append(conds, cond)
	}
	if !q.o.Since.IsZero() {
		add(created+" >= $?", q.o.Since)
	}
	if !q.o.Until.IsZero() {
		add(created+" < $?", q.o.Until)
	}
	if q.o.AggregateID != "" {
		add(quoteColumn(c.AggregateID)+"::text = $?", q.o.AggregateID)
	}
	if q.o.EventType != "" {
		add(quoteColumn(c.EventType)+"::text = $?", q.o.EventType)
	}
	if len(q.o.IDs) > 0 {
		add(id+"::text = ANY($?::text[])", q.o.IDs)
	}
	if q.o.Snapshot != "" {
		// xmin is a 32-bit xid; pg_visible_in_snapshot takes the 64-bit
		// one: placed within 2^31 of the snapshot's xmax, the rule Postgres
		// compares xids by (TransactionIdPrecedes).
		d := "((xmin::text::int8 - ($?::int8 & 4294967295)) % 4294967296 + 4294967296) % 4294967296"
		add("pg_visible_in_snapshot((CASE WHEN "+d+" < 2147483648 THEN $?::int8 + "+d+
			" ELSE GREATEST($?::int8 - 4294967296 + "+d+", 2) END)::text::xid8, $?::pg_snapshot)",
			int64(q.snapXmax), int64(q.snapXmax), int64(q.snapXmax), int64(q.snapXmax), int64(q.snapXmax), q.o.Snapshot)
	}
	if !q.o.CommittedSince.IsZero() {
		add("(pg_xact_commit_timestamp(xmin) IS NULL OR pg_xact_commit_timestamp(xmin) >= $?)", q.o.CommittedSince)
	}
	if a := q.after; a != nil {
		add("("+strings.Join(key[:], ", ")+") > ($?::bool, $?::timestamptz, $?::int8, $?::int8, $?::int8, $?::tid)", a.Known, a.At, a.Cmin, a.Ord, a.Rel, a.TID)
	}
	if a := q.through; a != nil {
		add("("+strings.Join(key[:], ", ")+") <= ($?::bool, $?::timestamptz, $?::int8, $?::int8, $?::int8, $?::tid)", a.Known, a.At, a.Cmin, a.Ord, a.Rel, a.TID)
	}
	from := " FROM " + q.table
	if len(conds) > 0 {
		from += " WHERE " + strings.Join(conds, " AND ")
	}
	switch form {
	case countQuery:
		return "SELECT count(*)" + from, args
	case lastQuery:
		return "SELECT " + strings.Join(key[:], ", ") + from + " ORDER BY 1 DESC, 2 DESC, 3 DESC, 4 DESC, 5 DESC, 6 DESC LIMIT 1", args
	}
	// By the key's positions: the expressions, typed, never their text.
	return "SELECT " + strings.Join(sel, ", ") + from + " ORDER BY 1, 2, 3, 4, 5, 6", args
}

// scan reads one row of the query sql returns into an event and its
// position.
func (q *outboxQuery) scan(rows pgx.Rows) (*outbox.Event, Position, error) {
	c := q.cols
	pos := Position{Order: q.order}
	vals := make([]*string, 5+len(q.headerCols))
	var createdAt time.Time
	var trace, ts, part *string
	dest := []any{&pos.Known, &pos.At, &pos.Cmin, &pos.Ord, &pos.Rel, &pos.TID, &vals[0], &vals[1], &vals[2], &vals[3], &vals[4], &createdAt}
	for i := range q.headerCols {
		dest = append(dest, &vals[5+i])
	}
	if q.tracing {
		dest = append(dest, &trace)
	}
	if q.tsType != 0 {
		dest = append(dest, &ts)
	}
	if q.partType != 0 {
		dest = append(dest, &part)
	}
	env := make([]*string, len(c.Envelope))
	for i := range env {
		dest = append(dest, &env[i])
	}
	var version *string
	if q.hasVersion {
		dest = append(dest, &version)
	}
	if err := rows.Scan(dest...); err != nil {
		return nil, pos, fmt.Errorf("read outbox table %s: %w", q.name, err)
	}
	b := func(v *string) []byte {
		if v == nil {
			return nil
		}
		return []byte(*v)
	}
	ev := &outbox.Event{ID: b(vals[0]), AggregateType: b(vals[1]), AggregateID: b(vals[2]),
		EventType: b(vals[3]), Payload: b(vals[4]), CommitTime: createdAt, CreatedAt: createdAt,
		Schema: q.schema, Table: q.tableName}
	for i, col := range q.headerCols {
		if v := vals[5+i]; v != nil {
			ev.Headers = append(ev.Headers, outbox.Header{Key: c.Headers[col], Value: []byte(*v)})
		}
	}
	// A bad trace context goes out without trace headers, as from the
	// stream (whose relay counts and logs it).
	var err error
	if _, err := q.format.Apply(ev, b(trace)); err != nil {
		return nil, pos, fmt.Errorf("read outbox table %s: event %s: %w", q.name, ev.ID, err)
	}
	if ts != nil {
		if ev.Timestamp, err = decoder.ParseTimestamp(q.tsType, []byte(*ts)); err != nil {
			return nil, pos, fmt.Errorf("read outbox table %s: event %s: %w", q.name, ev.ID, err)
		}
	}
	if q.json != nil {
		if err := q.encodeJSON(ev, env, b(version)); err != nil {
			return nil, pos, fmt.Errorf("read outbox table %s: event %s: %w", q.name, ev.ID, err)
		}
	} else if len(c.Envelope) > 0 {
		aliases := make([]string, len(c.Envelope))
		vals := make([][]byte, len(c.Envelope))
		for i, ec := range c.Envelope {
			aliases[i], vals[i] = ec.Alias, b(env[i])
		}
		ev.Payload = decoder.Envelope(ev.Payload, q.payType, aliases, vals)
		ev.PayloadType = outbox.PayloadJSON
	}
	if part != nil {
		if ev.TargetPartition, err = decoder.ParsePartition([]byte(*part)); err != nil {
			return nil, pos, fmt.Errorf("read outbox table %s: event %s: %w", q.name, ev.ID, err)
		}
		ev.HasTargetPartition = true
	}
	return ev, pos, nil
}

// encodeJSON writes ev's key and value with the JSON encoder; env holds the
// envelope columns' text (a bytea one is decoded to its bytes first).
func (q outboxQuery) encodeJSON(ev *outbox.Event, env []*string, version []byte) error {
	vals := make([][]byte, len(env))
	for i, v := range env {
		if v == nil {
			continue
		}
		vals[i] = []byte(*v)
		if q.json.EnvelopeType(i) == decoder.TypeBytea {
			var err error
			if vals[i], err = decoder.DecodeBytea(vals[i]); err != nil {
				return fmt.Errorf("envelope column %q: %w", q.cols.Envelope[i].Column, err)
			}
		}
	}
	routedBy := ev.AggregateType
	if q.cols.RouteByEventType {
		routedBy = ev.EventType
	}
	var err error
	if ev.Payload, err = q.json.Value(ev.Payload, vals, routedBy, version); err != nil {
		return err
	}
	if ev.AggregateID, err = q.json.Key(ev.AggregateID); err != nil {
		return fmt.Errorf("key: %w", err)
	}
	return nil
}

func outboxErr(err error, table string, names setting.Namer) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42P01":
			return fmt.Errorf("read outbox table %s: it does not exist %s: %w", table, names.Name("Table"), err)
		case "42703":
			return fmt.Errorf("read outbox table %s: a column is missing %s: %w", table, names.Name("Columns"), err)
		}
	}
	return fmt.Errorf("read outbox table %s: %w", table, err)
}

// DefaultPruneBatch is how many rows one DELETE of Prune removes by default.
const DefaultPruneBatch = 1000

// Prune deletes outbox rows whose createdAtColumn ("" means created_at) is
// before olderThan, batch rows at a time (0 means DefaultPruneBatch), each batch
// its own transaction, until none is left, and returns how many it deleted.
// Deleting published rows is safe for the relay (it reads the WAL, not the
// table), but they can no longer be replayed with Replay.
func Prune(ctx context.Context, pool *pgxpool.Pool, table, createdAtColumn string, olderThan time.Time, batch int) (int64, error) {
	if batch <= 0 {
		batch = DefaultPruneBatch
	}
	if createdAtColumn == "" {
		createdAtColumn = "created_at"
	}
	t, c := quoteTable(table), quoteColumn(createdAtColumn)
	// ctid keeps this independent of the key column; the outer condition makes
	// sure a row that moved since the subquery read it is not touched.
	sql := `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(SELECT ctid FROM ` + t + ` WHERE ` + c + ` < $1 LIMIT $2)) AND ` + c + ` < $1`
	var total int64
	for {
		tag, err := pool.Exec(ctx, sql, olderThan, batch)
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "42501" {
				return total, fmt.Errorf("prune outbox table %s: the role may not delete from it (the relay's role of migrations/004_role.sql only reads it): run prune as the table's owner: %w", table, err)
			}
			return total, fmt.Errorf("prune outbox table %s (%d rows deleted so far): %w", table, total, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}
