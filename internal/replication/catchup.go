package replication

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// The catch-up path reads a slot through SQL instead of a walsender:
// pg_logical_slot_peek_binary_changes returns rows whose data is exactly
// the pgoutput message the walsender would put in XLogData and whose lsn is
// XLogData's WALStart, so the stream's Handler takes them unchanged. Postgres
// decodes a whole batch at its decode speed, without the walsender's one send
// and flush per message; peeking leaves the slot where it is, so the caller
// moves it (AdvanceSlot) only past what Kafka acknowledged.

// SlotLag is where a slot stands against the WAL of the server it is on.
type SlotLag struct {
	// Confirmed is the slot's confirmed_flush_lsn: a peek returns the
	// transactions that commit after it.
	Confirmed pglogrepl.LSN
	// Restart is the slot's restart_lsn: every peek decodes from here, so
	// Confirmed-Restart is what a peek decodes again before its first row.
	Restart pglogrepl.LSN
	// End is the WAL a peek can read now: the flushed WAL on a primary, the
	// replayed WAL on a standby.
	End pglogrepl.LSN
	// Time is the server's clock when it read End: every transaction that
	// commits before End committed before Time.
	Time time.Time
	// Active says a process holds the slot (a walsender, or a peek).
	Active bool
}

// Behind is how many bytes of WAL lie between the slot and End.
func (l SlotLag) Behind() uint64 {
	if l.End <= l.Confirmed {
		return 0
	}
	return uint64(l.End - l.Confirmed)
}

// Redecode is how many bytes of WAL a peek decodes before it reaches
// Confirmed: the slot's restart point moves only at running-transactions
// records, and never past the start of the oldest transaction still open.
func (l SlotLag) Redecode() uint64 {
	if l.Confirmed <= l.Restart {
		return 0
	}
	return uint64(l.Confirmed - l.Restart)
}

// readableWALSQL is the WAL a peek reads up to: a primary's flushed WAL (a
// peek never decodes past it), a standby's replayed WAL.
const readableWALSQL = "(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_flush_lsn() END)"

// ReadSlotLag reads where slot stands on the server db reaches (the server
// the slot is on).
func ReadSlotLag(ctx context.Context, db QueryRower, slot string) (SlotLag, error) {
	var confirmed, restart, end *string
	var at time.Time
	var active bool
	err := db.QueryRow(ctx, "SELECT confirmed_flush_lsn::text, restart_lsn::text, "+readableWALSQL+"::text, now(), active FROM pg_replication_slots WHERE slot_name = $1", slot).
		Scan(&confirmed, &restart, &end, &at, &active)
	if errors.Is(err, pgx.ErrNoRows) {
		return SlotLag{}, fmt.Errorf("read the lag of slot %q: the slot does not exist", slot)
	}
	if err != nil {
		return SlotLag{}, fmt.Errorf("read the lag of slot %q: %w", slot, err)
	}
	if confirmed == nil || restart == nil || end == nil {
		return SlotLag{}, fmt.Errorf("read the lag of slot %q: the slot has no confirmed or restart position (invalidated, or not a logical slot)", slot)
	}
	l := SlotLag{Time: at, Active: active}
	for _, f := range []struct {
		text *string
		lsn  *pglogrepl.LSN
	}{{confirmed, &l.Confirmed}, {restart, &l.Restart}, {end, &l.End}} {
		if *f.lsn, err = pglogrepl.ParseLSN(*f.text); err != nil {
			return SlotLag{}, fmt.Errorf("read the lag of slot %q: parse %q: %w", slot, *f.text, err)
		}
	}
	return l, nil
}

// SQLConn is the catch-up's own connection to the server the slot is on. It
// keeps the server's warnings, which a walsender's stream ends on (Run): from
// PostgreSQL 18 a dropped publication is only a warning, after which
// decoding goes on without it and would skip the outbox's rows.
type SQLConn struct {
	*pgx.Conn
	mu      sync.Mutex
	warning *pgconn.Notice
}

// ConnectSQL opens an SQLConn to url (the relay's Postgres URL).
func ConnectSQL(ctx context.Context, url string, names setting.Namer) (*SQLConn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse Postgres URL %s: %w", names.Name("PGURL"), redactErr(err))
	}
	if cfg.RuntimeParams["application_name"] == "" {
		// Tells the batches' backend apart from the walsender's in
		// pg_stat_activity (and to the benchmark's CPU accounting).
		cfg.RuntimeParams["application_name"] = "cdc-relay catch-up"
	}
	c := &SQLConn{}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		severity := cmp.Or(n.SeverityUnlocalized, n.Severity)
		// A failover slot's peek warns while it waits for the standbys of
		// synchronized_standby_slots, as the walsender waits: not a change
		// of what is decoded.
		if severity != "WARNING" || strings.Contains(n.Message, "synchronized_standby_slots") {
			return
		}
		c.mu.Lock()
		if c.warning == nil {
			c.warning = n
		}
		c.mu.Unlock()
	}
	if c.Conn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
		return nil, fmt.Errorf("open the catch-up connection: %w", ConnectError(url, err, names))
	}
	return c, nil
}

// takeWarning returns the first warning since the last call, or nil.
func (c *SQLConn) takeWarning() *pgconn.Notice {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.warning
	c.warning = nil
	return w
}

// PeekConfig says which slot a peek reads and how pgoutput decodes it: the
// same options the stream starts with (StreamConfig).
type PeekConfig struct {
	Slot        string
	Publication string
	Messages    bool // logical decoding messages too (PostgreSQL 14+)
}

// PeekResult is what one Peek read.
type PeekResult struct {
	// Rows is the number of pgoutput messages read.
	Rows int
	// Complete says the peek returned every transaction that commits before
	// its upto: it stopped at upto, not at its row limit or on stop.
	Complete bool
	// Stopped says stop was closed: the peek ended at the first transaction
	// boundary after it.
	Stopped bool
}

// Peek feeds h, in commit order, the pgoutput messages of the transactions
// cfg.Slot holds after its confirmed position that commit before upto, about
// limit messages (Postgres returns whole transactions, so the last one may
// go past it). It leaves the slot where it is. It waits while h applies
// backpressure, and stops at a transaction boundary once stop is closed.
//
// Postgres decodes the whole batch before it sends the first row (into a
// tuplestore, spilled to disk past work_mem); the rows then come in as the
// relay reads them.
func Peek(ctx context.Context, db *SQLConn, cfg PeekConfig, upto pglogrepl.LSN, limit int, stop <-chan struct{}, h Handler) (PeekResult, error) {
	var res PeekResult
	db.takeWarning() // one from an earlier statement is not this batch's
	sql := "SELECT lsn, data FROM pg_logical_slot_peek_binary_changes($1, $2::pg_lsn, $3, 'proto_version', '1', 'publication_names', $4"
	if cfg.Messages {
		sql += ", 'messages', 'true'"
	}
	sql += ")"
	// Binary results: pg_lsn is 8 bytes, bytea its bytes, read in place.
	rows, err := db.Query(ctx, sql, pgx.QueryResultFormats{pgx.BinaryFormatCode, pgx.BinaryFormatCode},
		cfg.Slot, upto.String(), limit, cfg.Publication)
	if err != nil {
		return res, peekError(cfg.Slot, err)
	}
	defer rows.Close()
	stopping := false
	for rows.Next() {
		for wait := h.Backpressure(); wait != nil; wait = h.Backpressure() {
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-stopIf(!stopping, stop):
				stopping = true
				if h.AtBoundary() {
					res.Stopped = true
					return res, nil
				}
			case <-wait:
			}
		}
		raw := rows.RawValues()
		if len(raw) != 2 || len(raw[0]) != 8 {
			return res, fmt.Errorf("peek slot %q: unexpected row shape", cfg.Slot)
		}
		if err := h.HandleData(ctx, pglogrepl.LSN(binary.BigEndian.Uint64(raw[0])), raw[1]); err != nil {
			return res, err
		}
		res.Rows++
		if !stopping {
			select {
			case <-stop:
				stopping = true
			default:
			}
		}
		if stopping && h.AtBoundary() {
			res.Stopped = true
			return res, nil
		}
	}
	if err := rows.Err(); err != nil {
		return res, peekError(cfg.Slot, err)
	}
	if w := db.takeWarning(); w != nil {
		// As the stream: the caller decides (gaps.StreamError); nothing
		// of this batch may be confirmed.
		return res, fmt.Errorf("peek slot %q: server warning: %w", cfg.Slot, (*pgconn.PgError)(w))
	}
	res.Complete = res.Rows < limit
	return res, nil
}

// peekError wraps an error of a catch-up statement on slot, as
// ErrSlotBusy when a walsender or another session holds the slot.
func peekError(slot string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55006" {
		return fmt.Errorf("peek slot %q: %w: %s", slot, ErrSlotBusy, pgErr.Message)
	}
	return fmt.Errorf("peek slot %q: %w", slot, err)
}

// AdvanceSlot moves slot's confirmed position to to (never backwards: the
// caller passes a position past the slot's), as a standby status update of
// the stream does, and moves its restart point as far as the decoding it
// does allows.
func AdvanceSlot(ctx context.Context, db QueryRower, slot string, to pglogrepl.LSN) error {
	var end string
	err := db.QueryRow(ctx, "SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::pg_lsn)", slot, to.String()).Scan(&end)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" {
			return fmt.Errorf("advance slot %q to %s: %w: %s", slot, to, ErrSlotBusy, pgErr.Message)
		}
		return fmt.Errorf("advance slot %q to %s: %w", slot, to, err)
	}
	return nil
}
