package outboxtable_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/outboxtable"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// newPool starts a Postgres cluster for the test and returns a pool on a new
// database db.
func newPool(t *testing.T, db string) *pgxpool.Pool {
	t.Helper()
	url, err := testenv.NewPostgres(t, sandbox.PGOptions{}).CreateDatabase(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newStore returns a dead-letter store on new tables, for the replay history.
func newStore(t *testing.T, pool *pgxpool.Pool) *deadletter.Store {
	t.Helper()
	s := deadletter.NewStore(pool, "public.dead_letters")
	if err := s.Ensure(t.Context()); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	return s
}

// newPublisher returns a publisher to k, closed with t.
func newPublisher(t *testing.T, k *sandbox.Kafka) *sink.Publisher {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p, err := sink.NewPublisher(ctx, sink.Config{Brokers: k.Brokers()})
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close publisher: %v", err)
		}
	})
	return p
}

func checkResult(t *testing.T, what string, got replay.Outcome, want replay.Counts) {
	t.Helper()
	if got.Counts != want {
		t.Errorf("%s: counts %+v, want %+v (failures %+v)", what, got.Counts, want, got.Failures)
	}
}

// outboxTable creates an outbox table (as migrations/001_outbox.sql, plus a
// header column) and returns its name.
func outboxTable(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	name := "public.outbox"
	_, err := pool.Exec(t.Context(), `CREATE TABLE `+name+` (
    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    correlation_id text
)`)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

type row struct {
	aggType, aggID, evType string
	age                    time.Duration
}

// insertRows inserts rows, each created age ago, and returns their ids.
func insertRows(t *testing.T, pool *pgxpool.Pool, table string, now time.Time, rows ...row) []string {
	t.Helper()
	ids := make([]string, len(rows))
	for i, r := range rows {
		err := pool.QueryRow(t.Context(), `INSERT INTO `+table+` (aggregate_type, aggregate_id, event_type, payload, created_at, correlation_id)
VALUES ($1, $2, $3, $4, $5, nullif($6, '')) RETURNING id::text`,
			r.aggType, r.aggID, r.evType, fmt.Sprintf(`{"i": %d}`, i), now.Add(-r.age), map[bool]string{true: "corr"}[i%2 == 0]).Scan(&ids[i])
		if err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func TestReplay(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t, "cdc_relay_outboxtable_replay")
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{})
	s := newStore(t, pool)
	p := newPublisher(t, kafka)
	table := outboxTable(t, pool)
	prefix := "ob"
	now := time.Now()
	ids := insertRows(t, pool, table, now,
		row{"order", "A", "Placed", 3 * time.Hour},   // 0: too old
		row{"order", "A", "Paid", 100 * time.Minute}, // 1
		row{"order", "B", "Placed", 90 * time.Minute},
		row{"user", "A", "Registered", 80 * time.Minute}, // 3: other topic
		row{"order", "A", "Shipped", 70 * time.Minute},
		row{"order", "A", "Closed", 10 * time.Minute}, // 5: too new
	)
	cols := outboxtable.Columns{Columns: decoder.DefaultColumns(), Headers: map[string]string{"correlation_id": "x-correlation"}}
	opts := outboxtable.ReplayOptions{
		Since: now.Add(-2 * time.Hour), Until: now.Add(-30 * time.Minute),
		Topic: prefix + ".{aggregate_type}", Actor: "bob", BatchSize: 2,
	}
	res, err := outboxtable.Replay(ctx, pool, s.History(), table, cols, p, opts)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "outbox replay", res, replay.Counts{Selected: 4, Published: 4})
	orders, users := testenv.MustReadAll(t, kafka, prefix+".order"), testenv.MustReadAll(t, kafka, prefix+".user")
	want := []string{ids[1], ids[2], ids[4]}
	slices.Sort(want)
	if !slices.Equal(sandbox.IDs(orders), want) || len(users) != 1 || users[0].Headers["id"] != ids[3] {
		t.Fatalf("replayed: orders %v, users %v; want orders %v, users [%s]", sandbox.IDs(orders), sandbox.IDs(users), want, ids[3])
	}
	var keyA []string
	for _, r := range orders {
		if string(r.Key) == "A" {
			keyA = append(keyA, r.Headers["id"])
		}
		if r.Headers[replay.HeaderReplay] != fmt.Sprint(res.ReplayID) || r.Headers["event_type"] == "" ||
			r.Headers["aggregate_type"] != "order" || !strings.HasPrefix(string(r.Value), `{"i": `) {
			t.Errorf("record %+v", r)
		}
	}
	if !slices.Equal(keyA, []string{ids[1], ids[4]}) {
		t.Errorf("key A in order %v, want %v (created_at order)", keyA, []string{ids[1], ids[4]})
	}
	for _, r := range append(orders, users...) {
		i := slices.Index(ids, r.Headers["id"])
		if wantCorr := map[bool]string{true: "corr"}[i%2 == 0]; r.Headers["x-correlation"] != wantCorr {
			t.Errorf("row %d: x-correlation header %q, want %q", i, r.Headers["x-correlation"], wantCorr)
		}
	}
	replays, _ := s.History().List(ctx, 1)
	if len(replays) != 1 || replays[0].Kind != replay.KindOutbox || replays[0].Actor != "bob" || replays[0].Filters["table"] != table {
		t.Errorf("history = %+v", replays)
	}
	if events, _ := s.History().Events(ctx, res.ReplayID); len(events) != 4 || events[0].DeadLetterID != 0 || events[0].Result != replay.ResultPublished {
		t.Errorf("history events = %+v", events)
	}

	// Aggregate and event type filters, then ids.
	opts.AggregateID, opts.Since, opts.Until = "A", time.Time{}, time.Time{}
	res, err = outboxtable.Replay(ctx, pool, s.History(), table, cols, nil, withDryRun(opts))
	if err != nil {
		t.Fatal(err)
	}
	if got := resultIDs(t, s, res.ReplayID); !slices.Equal(got, []string{ids[0], ids[1], ids[3], ids[4], ids[5]}) {
		t.Errorf("aggregate A selected %v", got)
	}
	opts.EventType = "Placed"
	opts.AggregateID = ""
	res, _ = outboxtable.Replay(ctx, pool, s.History(), table, cols, nil, withDryRun(opts))
	if got := resultIDs(t, s, res.ReplayID); !slices.Equal(got, []string{ids[0], ids[2]}) {
		t.Errorf("event type Placed selected %v", got)
	}
	opts.EventType, opts.IDs = "", []string{ids[5], ids[2]}
	res, _ = outboxtable.Replay(ctx, pool, s.History(), table, cols, nil, withDryRun(opts))
	if got := resultIDs(t, s, res.ReplayID); !slices.Equal(got, []string{ids[2], ids[5]}) {
		t.Errorf("ids selected %v", got)
	}

	// A topic that cannot be rendered fails that row only.
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET aggregate_type = 'bad/type' WHERE id = $1`, ids[5]); err != nil {
		t.Fatal(err)
	}
	res, err = outboxtable.Replay(ctx, pool, s.History(), table, cols, p, outboxtable.ReplayOptions{IDs: []string{ids[2], ids[5]}, Topic: prefix + ".{aggregate_type}"})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "replay with a bad topic", res, replay.Counts{Selected: 2, Published: 1, Failed: 1})

	if _, err := outboxtable.Replay(ctx, pool, s.History(), "public.no_such_outbox", cols, nil, withDryRun(opts)); err == nil || !strings.Contains(err.Error(), "public.no_such_outbox") {
		t.Errorf("replay of a missing table: %v", err)
	}
}

func withDryRun(o outboxtable.ReplayOptions) outboxtable.ReplayOptions {
	o.DryRun = true
	return o
}

// resultIDs returns the event ids recorded for a replay, in order.
func resultIDs(t *testing.T, s *deadletter.Store, replayID int64) []string {
	t.Helper()
	events, err := s.History().Events(t.Context(), replayID)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range events {
		ids = append(ids, e.EventID)
	}
	return ids
}

func TestPrune(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t, "cdc_relay_outboxtable_prune")
	table := outboxTable(t, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (aggregate_type, aggregate_id, event_type, payload, created_at)
SELECT 'order', i::text, 'Placed', '{}', now() - interval '8 days' - i * interval '1 second' FROM generate_series(1, 2500) i;
INSERT INTO `+table+` (aggregate_type, aggregate_id, event_type, payload, created_at)
SELECT 'order', i::text, 'Placed', '{}', now() - interval '6 days' FROM generate_series(1, 30) i`); err != nil {
		t.Fatal(err)
	}
	statements := testenv.CountStatements(t, pool, table, "DELETE")
	n, err := outboxtable.Prune(ctx, pool, table, "", time.Now().Add(-7*24*time.Hour), 1000)
	if err != nil || n != 2500 {
		t.Fatalf("PruneOutbox = %d, %v; want 2500", n, err)
	}
	if got := statements(); got != 3 {
		t.Errorf("PruneOutbox ran %d DELETE statements, want 3 batches (1000, 1000, 500)", got)
	}
	var left, old int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE created_at < now() - interval '7 days') FROM `+table).Scan(&left, &old); err != nil {
		t.Fatal(err)
	}
	if left != 30 || old != 0 {
		t.Errorf("after prune: %d rows, %d of them old; want 30, 0", left, old)
	}
	if n, err := outboxtable.Prune(ctx, pool, table, "", time.Now().Add(-7*24*time.Hour), 0); err != nil || n != 0 {
		t.Errorf("second prune = %d, %v; want 0", n, err)
	}
	if _, err := outboxtable.Prune(ctx, pool, table, "inserted_at", time.Now(), 0); err == nil || !strings.Contains(err.Error(), table) {
		t.Errorf("prune by a missing column: %v", err)
	}
}

// TestReplayTransactionOrder: the rows one transaction inserts share their
// created_at (now() is the transaction's start), so a replay orders them as
// they were inserted, statement by statement and row by row within one, not
// by id: a join snapshot (or initial one) feeds them in front of the stream,
// and an aggregate's events stay in the order they were written. The ids
// here fall as the rows are inserted; pages of two cut between them.
func TestReplayTransactionOrder(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t, "cdc_relay_outboxtable_txorder")
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{})
	s := newStore(t, pool)
	p := newPublisher(t, kafka)
	table := outboxTable(t, pool)
	id := func(i int) string { return fmt.Sprintf("%08x-0000-4000-8000-000000000000", 0xffffffff-i) }
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var want []string
	for i := range 4 { // a statement each
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, 'order', 'K', 'Numbered', '{}')`, id(i)); err != nil {
			t.Fatal(err)
		}
		want = append(want, id(i))
	}
	// Three rows in one statement.
	if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (id, aggregate_type, aggregate_id, event_type, payload) VALUES
($1, 'order', 'K', 'Numbered', '{}'), ($2, 'order', 'K', 'Numbered', '{}'), ($3, 'order', 'K', 'Numbered', '{}')`, id(4), id(5), id(6)); err != nil {
		t.Fatal(err)
	}
	want = append(want, id(4), id(5), id(6))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := outboxtable.Replay(ctx, pool, s.History(), table, outboxtable.Columns{Columns: decoder.DefaultColumns()}, p,
		outboxtable.ReplayOptions{Topic: "txorder", BatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "replay", res, replay.Counts{Selected: len(want), Published: len(want)})
	var got []string // one key: one partition, read in offset order
	for _, r := range testenv.MustReadAll(t, kafka, "txorder") {
		got = append(got, r.Headers["id"])
	}
	if !slices.Equal(got, want) {
		t.Errorf("one transaction's rows in Kafka in order\n%v\nwant the order they were inserted\n%v", got, want)
	}
}

// TestReplayLimit: a limit that ends the read between two batches ends it
// cleanly, while the next batch is being read ahead: exactly the first rows
// in the reader's order are published, and the replay reports no error.
func TestReplayLimit(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t, "cdc_relay_outboxtable_limit")
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{})
	s := newStore(t, pool)
	p := newPublisher(t, kafka)
	table := outboxTable(t, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'K', 'Numbered', jsonb_build_object('n', g) FROM generate_series(1, 2000) g ORDER BY g`); err != nil {
		t.Fatal(err)
	}
	res, err := outboxtable.Replay(ctx, pool, s.History(), table, outboxtable.Columns{Columns: decoder.DefaultColumns()}, p,
		outboxtable.ReplayOptions{Topic: "limit", BatchSize: 100, Limit: 150})
	if err != nil {
		t.Fatalf("replay with a limit: %v", err)
	}
	checkResult(t, "replay with a limit", res, replay.Counts{Selected: 150, Published: 150})
	recs := testenv.MustReadAll(t, kafka, "limit")
	for i, r := range recs {
		if want := fmt.Sprintf(`{"n": %d}`, i+1); string(r.Value) != want {
			t.Fatalf("record %d is %s, want %s (the first rows, in order)", i, r.Value, want)
		}
	}
	if len(recs) != 150 {
		t.Errorf("%d records, want 150", len(recs))
	}
}
