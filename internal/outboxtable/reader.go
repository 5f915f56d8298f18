package outboxtable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

// The table reader: one order, one cursor.
//
// Every read of the outbox table (replay, backfill, the initial snapshot, a
// join) goes through one server-side cursor inside one transaction, so a read
// sees one snapshot and never pages: no row can be skipped or repeated between
// pages, whatever the ties, and the table is scanned once (the cost is linear
// in the rows read, plus one sort). The order is a total order on a sort key
// that the reader also returns as each row's Position, so a read cut short
// (a crash mid-join) resumes after the last row Kafka acknowledged, with the
// same key compared in the same types.
//
// The key, in order:
//
//  1. commit known: false before true. With track_commit_timestamp = on,
//     pg_xact_commit_timestamp(xmin) is the commit time of the row's
//     transaction (subtransactions share their top transaction's), unknown
//     (NULL) for rows committed before the setting was on or frozen since:
//     those are older than every row with a known commit time.
//  2. time: the commit time where known, else the created_at column
//     (the transaction's start, as now() defaults it). Rows of transactions
//     that committed in another order than they began come in commit order
//     where it is known; rows of one transaction share it.
//  3. cmin: the command of its transaction that inserted the row, one per
//     statement, counted across savepoints, so a transaction's statements
//     come in the order it ran them.
//  4. tableoid and 5. ctid: the rows of one statement (a multi-row INSERT,
//     INSERT … SELECT, COPY) in the order it wrote them into each partition.
//     ctid is compared as a tid (block, then offset), never as its text.
//
// What the order cannot tell (the docs say so, docs/guarantee.md): two
// transactions with the same commit microsecond, or, without commit times,
// the same start, are interleaved statement by statement; a statement that
// wrote into pages out of order (a table whose free space map hands back an
// earlier page) or into several partitions may interleave its own rows. Rows
// updated by the transaction that inserted them carry a combo command id.

// Order is the order a table read publishes rows in.
type Order int

// The orders a read can use.
const (
	// StartOrder: by created_at (the inserting transaction's start, as now()
	// defaults it): track_commit_timestamp is off.
	StartOrder Order = iota
	// CommitOrder: by the commit time of the inserting transaction
	// (track_commit_timestamp = on); rows committed before it was on, by
	// created_at, before them.
	CommitOrder
)

// String names the order in logs and in the replay history.
func (o Order) String() string {
	if o == CommitOrder {
		return "commit"
	}
	return "start"
}

// Caveat says what the order can misorder, for the line that starts a read.
func (o Order) Caveat() string {
	if o == CommitOrder {
		return "rows in commit order (track_commit_timestamp = on), each transaction's rows as it inserted them; rows committed before commit timestamps were on come first, by created_at"
	}
	return "rows in created_at order (the inserting transaction's start): track_commit_timestamp is off, so two transactions of one aggregate that committed in another order than they began come out in start order, not commit order; " +
		"set track_commit_timestamp = on (a restart) for commit order (docs/postgres.md)"
}

// ReadOrder returns the order a read through db uses: CommitOrder when the
// server tracks commit timestamps.
func ReadOrder(ctx context.Context, db Querier) (Order, error) {
	rows, err := db.Query(ctx, "SELECT current_setting('track_commit_timestamp')::bool")
	if err != nil {
		return 0, fmt.Errorf("read track_commit_timestamp: %w", err)
	}
	on, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if err != nil {
		return 0, fmt.Errorf("read track_commit_timestamp: %w", err)
	}
	if on {
		return CommitOrder, nil
	}
	return StartOrder, nil
}

// keyExprs are the SQL expressions of the sort key, in order, for order o and
// the (quoted) created_at column.
func keyExprs(o Order, created string) [5]string {
	known, at := "false", "COALESCE("+created+", '-infinity')"
	if o == CommitOrder {
		known = "pg_xact_commit_timestamp(xmin) IS NOT NULL"
		at = "COALESCE(pg_xact_commit_timestamp(xmin), " + created + ", '-infinity')"
	}
	// cid and oid have no ordering operators: compared as numbers.
	return [5]string{known, at, "cmin::text::int8", "tableoid::int8", "ctid"}
}

// CommittedThrough returns the position (ReplayOptions.Through) that ends a
// commit-order read after every row committed at or before at, and the rows
// whose commit time is unknown.
func CommittedThrough(at time.Time) string {
	return Position{Order: CommitOrder, Known: true, At: pgtype.Timestamptz{Time: at, Valid: true},
		Cmin: math.MaxInt64, Rel: math.MaxInt64, TID: pgtype.TID{BlockNumber: math.MaxUint32, OffsetNumber: math.MaxUint16, Valid: true}}.Encode()
}

// Position is where a read stands: the sort key of a row. Its text (Encode)
// is what a caller stores to resume a read after that row (ReplayOptions.After).
type Position struct {
	Order Order
	Known bool
	At    pgtype.Timestamptz
	Cmin  int64
	Rel   int64
	TID   pgtype.TID
}

type positionJSON struct {
	Order string `json:"order"`
	Known bool   `json:"known"`
	At    string `json:"at"`
	Cmin  int64  `json:"cmin"`
	Rel   int64  `json:"rel"`
	Block uint32 `json:"block"`
	Off   uint16 `json:"offset"`
}

// Encode returns the position as text, to store and give back to
// ParsePosition.
func (p Position) Encode() string {
	at := ""
	switch p.At.InfinityModifier {
	case pgtype.NegativeInfinity:
		at = "-infinity"
	case pgtype.Infinity:
		at = "infinity"
	default:
		at = p.At.Time.UTC().Format(time.RFC3339Nano)
	}
	b, _ := json.Marshal(positionJSON{Order: p.Order.String(), Known: p.Known, At: at, Cmin: p.Cmin, Rel: p.Rel,
		Block: p.TID.BlockNumber, Off: p.TID.OffsetNumber})
	return string(b)
}

// ParsePosition reads a position Encode wrote.
func ParsePosition(s string) (Position, error) {
	var j positionJSON
	if err := json.Unmarshal([]byte(s), &j); err != nil {
		return Position{}, fmt.Errorf("read position %q: %w", s, err)
	}
	p := Position{Known: j.Known, Cmin: j.Cmin, Rel: j.Rel, TID: pgtype.TID{BlockNumber: j.Block, OffsetNumber: j.Off, Valid: true}}
	switch j.Order {
	case "commit":
		p.Order = CommitOrder
	case "start":
		p.Order = StartOrder
	default:
		return Position{}, fmt.Errorf("read position %q: unknown order %q", s, j.Order)
	}
	p.At.Valid = true
	switch j.At {
	case "-infinity":
		p.At.InfinityModifier = pgtype.NegativeInfinity
	case "infinity":
		p.At.InfinityModifier = pgtype.Infinity
	default:
		t, err := time.Parse(time.RFC3339Nano, j.At)
		if err != nil {
			return Position{}, fmt.Errorf("read position %q: %w", s, err)
		}
		p.At.Time = t
	}
	return p, nil
}

// txBeginner opens the transaction a read runs in when the caller gave none
// (*pgxpool.Pool, *pgx.Conn).
type txBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// inTx returns the transaction to read in: db itself when it is one (a
// snapshot's), else a new REPEATABLE READ READ ONLY transaction, whose
// snapshot the whole read sees, ended by the returned function. From a pool
// it is on a connection of its own, not one of the pool's: the read holds it
// for as long as it publishes, while the replay history writes through the
// pool (the relay's holds two connections, one of them busy at start-up).
func inTx(ctx context.Context, db Querier) (pgx.Tx, func(), error) {
	if tx, ok := db.(pgx.Tx); ok {
		return tx, func() {}, nil
	}
	var b txBeginner
	closeConn := func() {}
	switch db := db.(type) {
	case *pgxpool.Pool:
		conn, err := pgx.ConnectConfig(ctx, db.Config().ConnConfig.Copy())
		if err != nil {
			return nil, nil, fmt.Errorf("read the outbox table: connect: %w", err)
		}
		b, closeConn = conn, func() { _ = conn.Close(context.WithoutCancel(ctx)) }
	case txBeginner:
		b = db
	default:
		return nil, nil, fmt.Errorf("read the outbox table: %T can open no transaction", db)
	}
	tx, err := b.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		closeConn()
		return nil, nil, fmt.Errorf("read the outbox table: begin: %w", err)
	}
	return tx, func() {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		closeConn()
	}, nil
}

// cursorName is the reader's cursor; a transaction reads one table at a time
// (each read closes it), so one name serves.
const cursorName = "cdc_relay_outbox_read"

// declare declares the reader's cursor for sql in tx.
func declare(ctx context.Context, tx pgx.Tx, sql string, args []any) error {
	_, err := tx.Exec(ctx, "DECLARE "+cursorName+" NO SCROLL CURSOR FOR "+sql, args...)
	return err
}

// fetch fetches the next batch rows of the cursor, calling scan on each, and
// returns how many there were: fewer than batch at the end.
func fetch(ctx context.Context, tx pgx.Tx, batch int, scan func(pgx.Rows) error) (int, error) {
	rows, err := tx.Query(ctx, fmt.Sprintf("FETCH %d FROM %s", batch, cursorName))
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		n++
		if err := scan(rows); err != nil {
			return n, err
		}
	}
	return n, rows.Err()
}

// page is one batch of the cursor's rows: the events, each one's position,
// and whether the rows ended with it (or err stopped the read).
type page struct {
	evs  []*outbox.Event
	pos  []Position
	last bool
	err  error
}

// readAhead fetches the cursor's rows batch at a time on a goroutine of its
// own, one batch ahead of the caller, which publishes a batch while the next
// is read (a read waits on Postgres, Kafka and the history in turn: without
// it a replay ran at a third of its speed). Each row is read with scan. The
// channel closes after the last page or one with an error. stop, which the
// caller calls once it reads no more pages, lets the fetch under way finish
// and fetches no more, so the cursor stays usable (an early end by a limit
// still closes it); only ctx's end cuts a fetch short.
func readAhead(ctx context.Context, tx pgx.Tx, batch int, scan func(pgx.Rows) (*outbox.Event, Position, error)) (pages <-chan page, stop func()) {
	out := make(chan page, 1)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(out)
		for {
			var pg page
			n, err := fetch(ctx, tx, batch, func(rows pgx.Rows) error {
				ev, pos, err := scan(rows)
				pg.evs, pg.pos = append(pg.evs, ev), append(pg.pos, pos)
				return err
			})
			pg.err, pg.last = err, err != nil || n < batch
			select {
			case out <- pg:
			case <-quit:
				return
			}
			if pg.last {
				return
			}
		}
	})
	var once sync.Once
	return out, func() {
		once.Do(func() { close(quit) })
		wg.Wait()
	}
}

// closeCursor closes the reader's cursor, so that tx can read another table.
func closeCursor(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, "CLOSE "+cursorName); err != nil {
		return fmt.Errorf("close cursor: %w", err)
	}
	return nil
}

// errOrderChanged: a stored position was taken in the other order.
var errOrderChanged = errors.New("the position to resume from was taken in another order (track_commit_timestamp changed since)")
