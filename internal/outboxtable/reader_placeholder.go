package outboxtable

// A placeholder of the reader main is getting (ReplayOptions.Snapshot,
// CommittedSince, After, Progress and Count): replaced by main's at the merge.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// filters adds the conditions of Snapshot and CommittedSince through add.
func (o ReplayOptions) filters(add func(cond string, vals ...any)) {
	if o.Snapshot != "" {
		// xmin is a 32-bit xid; pg_visible_in_snapshot takes an xid8: the
		// xid is widened against the snapshot's xmax (a row's xmin is within
		// 2^31 of it while the row is not frozen).
		add(`pg_visible_in_snapshot(((pg_snapshot_xmax($?::pg_snapshot)::text::int8) -
			(((pg_snapshot_xmax($?::pg_snapshot)::text::int8) % 4294967296) - xmin::text::int8 + 4294967296) % 4294967296)::text::xid8, $?::pg_snapshot)`,
			o.Snapshot, o.Snapshot, o.Snapshot)
	}
	if !o.CommittedSince.IsZero() {
		add("(pg_xact_commit_timestamp(xmin) IS NULL OR pg_xact_commit_timestamp(xmin) >= $?)", o.CommittedSince)
	}
}

// String is the cursor as ReplayOptions.After takes it.
func (c cursor) String() string {
	b, _ := json.Marshal(struct {
		CreatedAt time.Time `json:"created_at"`
		Cmin      int64     `json:"cmin"`
		Ctid      string    `json:"ctid"`
		ID        string    `json:"id"`
	}{c.createdAt, c.cmin, c.ctid, c.id})
	return string(b)
}

// parseCursor reads a position String gave; "" is none.
func parseCursor(s string) (*cursor, error) {
	if s == "" {
		return nil, nil
	}
	var v struct {
		CreatedAt time.Time `json:"created_at"`
		Cmin      int64     `json:"cmin"`
		Ctid      string    `json:"ctid"`
		ID        string    `json:"id"`
	}
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return nil, fmt.Errorf("replay outbox: position %q: %w", s, err)
	}
	return &cursor{createdAt: v.CreatedAt, cmin: v.Cmin, ctid: v.Ctid, id: v.ID}, nil
}

// Count returns how many rows Replay with these options would select (the same
// filters), read through db.
func Count(ctx context.Context, db Querier, table string, cols Columns, o ReplayOptions) (int64, error) {
	if cols.CreatedAt == "" {
		cols.CreatedAt = "created_at"
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
	created := quoteColumn(cols.CreatedAt)
	if !o.Since.IsZero() {
		add(created+" >= $?", o.Since)
	}
	o.filters(add)
	after, err := parseCursor(o.After)
	if err != nil {
		return 0, err
	}
	if after != nil {
		add("("+created+", cmin::text::int8, ctid, "+quoteColumn(cols.ID)+"::text) > ($?::timestamptz, $?::int8, $?::tid, $?::text)", after.createdAt, after.cmin, after.ctid, after.id)
	}
	sql := "SELECT count(*) FROM " + quoteTable(table)
	if len(conds) > 0 {
		sql += " WHERE " + strings.Join(conds, " AND ")
	}
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return 0, outboxErr(err, table, cols.Names)
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		if err := rows.Scan(&n); err != nil {
			return 0, fmt.Errorf("count outbox table %s: %w", table, err)
		}
	}
	if err := rows.Err(); err != nil {
		return 0, outboxErr(err, table, cols.Names)
	}
	return n, nil
}
