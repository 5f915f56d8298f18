package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/verify"
)

// TestInitialSnapshotCommitOrder (issue 42): rows the initial snapshot reads
// come in commit order, not start order. For each key, T1 begins, T2 inserts
// seq 1 and commits, then T1 inserts seq 2 and commits — writers that
// serialize on the aggregate's row lock do this — so created_at (now(), T1's
// start) puts seq 2 first. Then bulk statements (INSERT … SELECT, whose rows
// share created_at and cmin) write more than one page of the old reader each.
// With track_commit_timestamp = on, every row must arrive exactly once, each
// key's in commit order.
func TestInitialSnapshotCommitOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := sandbox.StartPostgres(ctx, sandbox.PGOptions{Settings: map[string]string{"track_commit_timestamp": "on"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Close() })
	f := newFixture(t, pg, t.Name(), true)
	var conns [2]*pgx.Conn
	for i := range conns {
		if conns[i], err = pgx.Connect(ctx, f.url); err != nil {
			t.Fatal(err)
		}
		defer conns[i].Close(context.Background())
	}
	var committed []verify.Event
	seq := map[string]int{}
	n := 0
	counter := func() int { n++; return n }
	event := func(agg string) verify.Event {
		seq[agg]++
		return verify.Event{ID: fmt.Sprintf("00000000-0000-4000-8000-%012d", counter()), Agg: agg, Seq: seq[agg], AggregateType: verify.AggregateType, EventType: verify.EventType}
	}
	insert := func(tx pgx.Tx, ev verify.Event) {
		if _, err := tx.Exec(ctx, `INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4, $5)`,
			ev.ID, ev.AggregateType, ev.Agg, ev.EventType, fmt.Sprintf(`{"agg":%q,"seq":%d}`, ev.Agg, ev.Seq)); err != nil {
			t.Fatal(err)
		}
	}
	const keys = 200
	for k := range keys {
		agg := fmt.Sprintf("agg-%d", k)
		t1, err := conns[0].Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := t1.Exec(ctx, "SELECT now()"); err != nil { // T1's start: its created_at
			t.Fatal(err)
		}
		t2, err := conns[1].Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		first := event(agg)
		insert(t2, first)
		if err := t2.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		second := event(agg)
		insert(t1, second)
		if err := t1.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		committed = append(committed, first, second)
	}
	// Bulk statements: 3 × 1000 rows, each statement's rows sharing
	// created_at and cmin, a key's rows in the order generate_series gives.
	for range 3 {
		evs := make([]verify.Event, 1000)
		ids, aggs, payloads := make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs))
		for i := range evs {
			evs[i] = event(fmt.Sprintf("agg-%d", i%keys))
			ids[i], aggs[i], payloads[i] = evs[i].ID, evs[i].Agg, fmt.Sprintf(`{"agg":%q,"seq":%d}`, evs[i].Agg, evs[i].Seq)
		}
		if _, err := conns[0].Exec(ctx, `INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
SELECT ($1::uuid[])[g], $4, ($2::text[])[g], $5, ($3::text[])[g]::jsonb FROM generate_series(1, $6::int) g ORDER BY g`,
			ids, aggs, payloads, verify.AggregateType, verify.EventType, len(evs)); err != nil {
			t.Fatal(err)
		}
		committed = append(committed, evs...)
	}

	r := newRelay(t, f.relayArgs("--snapshot", "initial"))
	r.Start()
	r.WaitReady(60 * time.Second)
	res, recs := f.waitDelivered(ctx, t, func() []verify.Event { return committed }, 60*time.Second)
	t.Logf("%s", res)
	requireComplete(t, res)
	if res.Duplicates > 0 || len(res.OrderViolations) > 0 {
		t.Errorf("%d duplicates, %d order violations (first: %v); want none", res.Duplicates, len(res.OrderViolations), res.OrderViolations[:min(3, len(res.OrderViolations))])
	}
	if n := checkSnapshotHeaders(t, committed, recs); n != len(committed) {
		t.Errorf("%d records from the snapshot, want %d", n, len(committed))
	}
	if !r.HasLog("commit order") {
		t.Errorf("the relay did not say that it reads the snapshot in commit order")
	}
	r.Stop(10 * time.Second)
}
