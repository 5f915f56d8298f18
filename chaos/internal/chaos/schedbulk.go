package chaos

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Rows written in bulk: what the table reader (replay, the initial
// snapshot, a join) must read as the stream does.
const (
	// bulkRows is the rows of each bulk statement: more than a replay's
	// page (replay.DefaultBatchSize, 100), so one statement's rows span
	// pages.
	bulkRows = 250
	// bulkKeys is how many keys a burst's rows spread over.
	bulkKeys = 8
	// crossedPairs is how many pairs of transactions of a burst commit in
	// the other order than they began.
	crossedPairs = 3
)

// bulkBurst writes a burst of rows into outbox_events outside the writers,
// on keys of its own (tag names them, e.g. "s" for the snapshot's, "r3"
// for step 3's): a multi-row INSERT ... SELECT, a COPY, and pairs of
// transactions where the one that began first commits second, its rows
// numbered after the other's. It records every row in the ledger once its
// transaction committed.
func (r *schedRun) bulkBurst(ctx context.Context, tag string, step int) error {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	a, err := pgx.Connect(ctx, r.url)
	if err != nil {
		return fmt.Errorf("bulk burst: %w", err)
	}
	defer a.Close(context.WithoutCancel(ctx))
	b, err := pgx.Connect(ctx, r.url)
	if err != nil {
		return fmt.Errorf("bulk burst: %w", err)
	}
	defer b.Close(context.WithoutCancel(ctx))
	next := map[string]int{}
	rows := func(n int) []ledgerEvent {
		evs := make([]ledgerEvent, n)
		for i := range evs {
			key := fmt.Sprintf("bulk%d%s-k%d", r.plan.Seed, tag, i%bulkKeys)
			next[key]++
			evs[i] = ledgerEvent{ID: newUUIDv4(), Key: key, Seq: next[key], Where: tableMain, Step: step}
		}
		return evs
	}

	// One statement, many rows: INSERT ... SELECT over arrays, in order.
	evs := rows(bulkRows)
	ids, keys, payloads := make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs))
	for i, e := range evs {
		ids[i], keys[i], payloads[i] = e.ID, e.Key, fmt.Sprintf(`{"agg":%q,"seq":%d}`, e.Key, e.Seq)
	}
	if _, err := a.Exec(ctx, `INSERT INTO public.`+tableMain+` (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT id, 'chaos', key, 'Numbered', payload FROM unnest($1::uuid[], $2::text[], $3::jsonb[]) WITH ORDINALITY AS t(id, key, payload, n) ORDER BY n`,
		ids, keys, payloads); err != nil {
		return fmt.Errorf("bulk burst: insert ... select: %w", err)
	}
	r.led.commit(evs, nil)

	// COPY.
	evs = rows(bulkRows)
	src := make([][]any, len(evs))
	for i, e := range evs {
		src[i] = []any{e.ID, "chaos", e.Key, "Numbered", fmt.Sprintf(`{"agg":%q,"seq":%d}`, e.Key, e.Seq)}
	}
	if _, err := a.CopyFrom(ctx, pgx.Identifier{"public", tableMain}, []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload"},
		pgx.CopyFromRows(src)); err != nil {
		return fmt.Errorf("bulk burst: copy: %w", err)
	}
	r.led.commit(evs, nil)

	// Transactions that commit in another order than they began: the
	// first begins (its created_at is its start), the second begins,
	// writes and commits, then the first writes and commits. Each key's
	// rows are numbered in commit order: the second's before the first's.
	insert := func(tx pgx.Tx, evs []ledgerEvent) error {
		bt := &pgx.Batch{}
		queueEvents(bt, evs, "")
		return tx.SendBatch(ctx, bt).Close()
	}
	for range crossedPairs {
		first, err := a.Begin(ctx)
		if err != nil {
			return fmt.Errorf("bulk burst: %w", err)
		}
		if _, err := first.Exec(ctx, "SELECT now()"); err != nil {
			_ = first.Rollback(ctx)
			return fmt.Errorf("bulk burst: %w", err)
		}
		second, err := b.Begin(ctx)
		if err != nil {
			_ = first.Rollback(ctx)
			return fmt.Errorf("bulk burst: %w", err)
		}
		secondEvs := rows(2 * bulkKeys)
		if err := insert(second, secondEvs); err != nil {
			_ = first.Rollback(ctx)
			_ = second.Rollback(ctx)
			return fmt.Errorf("bulk burst: the second transaction: %w", err)
		}
		if err := second.Commit(ctx); err != nil {
			_ = first.Rollback(ctx)
			return fmt.Errorf("bulk burst: commit the second transaction: %w", err)
		}
		r.led.commit(secondEvs, nil)
		firstEvs := rows(2 * bulkKeys)
		if err := insert(first, firstEvs); err != nil {
			_ = first.Rollback(ctx)
			return fmt.Errorf("bulk burst: the first transaction: %w", err)
		}
		if err := first.Commit(ctx); err != nil {
			return fmt.Errorf("bulk burst: commit the first transaction: %w", err)
		}
		r.led.commit(firstEvs, nil)
	}
	return nil
}

// writeLarge writes n rows into outbox_b in one INSERT ... SELECT
// generate_series, their ids derived from the seed and step (md5, as
// largeRowID computes them), 64 keys of their own; it records them in the
// ledger.
func (r *schedRun) writeLarge(ctx context.Context, n, step int) error {
	const keys = 64
	prefix := fmt.Sprintf("%d-%d-", r.plan.Seed, step)
	keyPrefix := fmt.Sprintf("big%d-", step)
	ctx, cancel := context.WithTimeout(ctx, 2*setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.url)
	if err != nil {
		return fmt.Errorf("write %d rows: %w", n, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	began := time.Now()
	if _, err := conn.Exec(ctx, `INSERT INTO public.`+tableB+` (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT md5($1 || g)::uuid, 'chaos', $2 || (g % $3), 'Numbered', jsonb_build_object('agg', $2 || (g % $3), 'seq', g / $3 + 1)
		FROM generate_series(0, $4::int - 1) AS g`, prefix, keyPrefix, keys, n); err != nil {
		return fmt.Errorf("write %d rows: %w", n, err)
	}
	evs := make([]ledgerEvent, n)
	for g := range n {
		evs[g] = ledgerEvent{ID: largeRowID(prefix, g), Key: keyPrefix + strconv.Itoa(g%keys), Seq: g/keys + 1, Where: tableB, Step: step}
	}
	r.led.commit(evs, nil)
	r.note("step %d table-join-large: %d rows written into %s in %v", step, n, tableB, time.Since(began).Round(10*time.Millisecond))
	return nil
}

// largeRowID is the id writeLarge's SQL gives row g: md5(prefix || g) as a
// uuid.
func largeRowID(prefix string, g int) string {
	sum := md5.Sum([]byte(prefix + strconv.Itoa(g)))
	h := hex.EncodeToString(sum[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// backlogRows is how many one-event transactions backlogBurst commits: with
// their padding, over 2 MiB of WAL, twice the catch-up threshold the
// catch-up world runs with.
const backlogRows = 4000

// backlogBurst commits backlogRows one-event transactions into
// outbox_events on keys of its own, as a burst while the relay is down
// (Plan.CatchUp), recording each in the ledger once it committed.
func (r *schedRun) backlogBurst(ctx context.Context, step int) error {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.url)
	if err != nil {
		return fmt.Errorf("backlog burst: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	next := map[string]int{}
	pad := strings.Repeat("b", 300)
	for i := range backlogRows {
		key := fmt.Sprintf("backlog%d-s%d-k%d", r.plan.Seed, step, i%bulkKeys)
		next[key]++
		ev := ledgerEvent{ID: newUUIDv4(), Key: key, Seq: next[key], Where: tableMain, Step: step}
		b := &pgx.Batch{}
		queueEvents(b, []ledgerEvent{ev}, pad)
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("backlog burst: row %d: %w", i, err)
		}
		r.led.commit([]ledgerEvent{ev}, nil)
	}
	return nil
}
