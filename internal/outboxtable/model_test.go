package outboxtable_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/outboxtable"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// The table reader against a model (issue 42): random transactions write
// rows by every kind of statement (single and multi-row INSERT, INSERT …
// SELECT, COPY, savepoints kept and rolled back, whole transactions rolled
// back, created_at ties across transactions), several open at once and
// committing in another order than they began; then the reader publishes
// the table in random batch sizes, whole, cut and resumed from the position
// its Progress gave, and as of a snapshot taken between two commits. Each
// key's records in Kafka must be exactly the model's: the rows that
// committed, in commit order, each transaction's in the order it inserted
// them, none missing, none twice.
//
// CDC_RELAY_MODEL_SEEDS=N runs N seeds instead of CI's (the failing seed is
// in the subtest's name: -run 'TestReaderModel/seed=17').

// modelSeeds is how many seeds CI runs.
const modelSeeds = 8

func TestReaderModel(t *testing.T) {
	seeds := modelSeeds
	if v := os.Getenv("CDC_RELAY_MODEL_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("CDC_RELAY_MODEL_SEEDS=%q: %v", v, err)
		}
		seeds = n
	}
	url, err := testenv.NewPostgres(t, sandbox.PGOptions{Settings: map[string]string{"track_commit_timestamp": "on"}}).
		CreateDatabase(t.Context(), "cdc_relay_reader_model")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16 // a schedule's open transactions, the reader's, the history's
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{})
	s := newStore(t, pool)
	p := newPublisher(t, kafka)
	for seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			m := runModel(t, pool, uint64(seed))
			m.check(t, pool, kafka, s, p)
		})
	}
}

// model is what a schedule committed, as the reader must publish it.
type model struct {
	table string
	seed  uint64
	rng   *rand.Rand
	// committed are the transactions' rows in commit order, each
	// transaction's in insert order; beforeSnap how many of them committed
	// before snapshot was taken.
	committed  [][]modelRow
	snapshot   string
	through    string // "" when the snapshot saw no row
	beforeSnap int
	rows       int // rows written, committed or not: the labels
}

type modelRow struct {
	label int
	key   string
}

// modelTx is one open transaction of a schedule.
type modelTx struct {
	tx   pgx.Tx
	rows []modelRow // inserted so far, in order
	done bool
}

// tie is the created_at that some statements of every transaction write, so
// that rows of different transactions tie on it.
var tie = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// runModel writes a random schedule into a new table and returns its model.
func runModel(t *testing.T, pool *pgxpool.Pool, seed uint64) *model {
	ctx := t.Context()
	m := &model{table: fmt.Sprintf("public.outbox_model_%d", seed), seed: seed, rng: rand.New(rand.NewPCG(seed, 42))}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+m.table+` (
    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	rng := m.rng
	txs := make([]*modelTx, 3+rng.IntN(5))
	var steps []int // a random interleaving: each transaction's index once per statement, then once to end
	for i := range txs {
		for range 2 + rng.IntN(5) {
			steps = append(steps, i)
		}
	}
	rng.Shuffle(len(steps), func(a, b int) { steps[a], steps[b] = steps[b], steps[a] })
	left := map[int]int{}
	for _, i := range steps {
		left[i]++
	}
	snapAt := rng.IntN(len(txs) + 1) // take the snapshot after this many commits
	// The snapshot and the position of the last row it sees, as a join
	// records them.
	takeSnap := func() {
		if m.snapshot != "" {
			return
		}
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := tx.QueryRow(ctx, "SELECT pg_current_snapshot()::text").Scan(&m.snapshot); err != nil {
			t.Fatal(err)
		}
		if m.through, _, err = outboxtable.Last(ctx, tx, m.table, outboxtable.Columns{Columns: decoder.DefaultColumns()}, outboxtable.ReplayOptions{}); err != nil {
			t.Fatal(err)
		}
		m.beforeSnap = len(m.committed)
	}
	for _, i := range steps {
		if len(m.committed) >= snapAt {
			takeSnap()
		}
		if txs[i] == nil {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			txs[i] = &modelTx{tx: tx}
			// The transaction's start (now(), created_at's default) is when
			// it first runs a statement: make it so.
			if _, err := tx.Exec(ctx, "SELECT now()"); err != nil {
				t.Fatal(err)
			}
		}
		mt := txs[i]
		if left[i]--; left[i] > 0 {
			m.statement(t, mt)
			continue
		}
		// Its last step ends it: most commit, some roll back.
		if rng.IntN(6) == 0 {
			if err := mt.tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			if err := mt.tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			m.committed = append(m.committed, mt.rows)
		}
		mt.done = true
	}
	takeSnap()
	return m
}

var modelKeys = []string{"K1", "K2", "K3", "K4"}

// statement runs one random statement in mt and records its rows.
func (m *model) statement(t *testing.T, mt *modelTx) {
	ctx := t.Context()
	rng := m.rng
	created := "DEFAULT"
	var createdAt any = "now"
	if rng.IntN(3) == 0 {
		created, createdAt = "$1::timestamptz", tie
	}
	next := func(n int) []modelRow {
		rows := make([]modelRow, n)
		for i := range rows {
			rows[i] = modelRow{label: m.rows, key: modelKeys[rng.IntN(len(modelKeys))]}
			m.rows++
		}
		return rows
	}
	values := func(rows []modelRow) (string, []any) {
		var vals []string
		args := []any{createdAt}
		if created == "DEFAULT" {
			args = nil
		}
		for _, r := range rows {
			args = append(args, r.key, fmt.Sprintf(`{"label": %d}`, r.label))
			vals = append(vals, fmt.Sprintf("('order', $%d, 'Numbered', $%d, %s)", len(args)-1, len(args), created))
		}
		return strings.Join(vals, ", "), args
	}
	insert := "INSERT INTO " + m.table + " (aggregate_type, aggregate_id, event_type, payload, created_at) "
	var rows []modelRow
	switch kind := rng.IntN(6); kind {
	case 0: // one row
		rows = next(1)
		vals, args := values(rows)
		exec(t, mt.tx, insert+"VALUES "+vals, args...)
	case 1: // many rows, one VALUES list
		rows = next(2 + rng.IntN(12))
		vals, args := values(rows)
		exec(t, mt.tx, insert+"VALUES "+vals, args...)
	case 2: // INSERT … SELECT: a bulk statement of one key per row, chosen by the row's number
		n := 20 + rng.IntN(120)
		rows = next(n)
		keys := make([]string, n)
		for i, r := range rows {
			keys[i] = r.key
		}
		ts := "now()"
		args := []any{rows[0].label, keys}
		if created != "DEFAULT" {
			ts = "$3::timestamptz"
			args = append(args, tie)
		}
		exec(t, mt.tx, insert+"SELECT 'order', ($2::text[])[g], 'Numbered', jsonb_build_object('label', $1::int + g - 1), "+ts+
			" FROM generate_series(1, "+strconv.Itoa(n)+") g ORDER BY g", args...)
	case 3: // COPY
		rows = next(10 + rng.IntN(100))
		src := make([][]any, len(rows))
		var at time.Time
		if err := mt.tx.QueryRow(ctx, "SELECT now()").Scan(&at); err != nil {
			t.Fatal(err)
		}
		if created != "DEFAULT" {
			at = tie
		}
		for i, r := range rows {
			src[i] = []any{"order", r.key, "Numbered", fmt.Sprintf(`{"label": %d}`, r.label), at}
		}
		name := strings.Split(m.table, ".")
		if _, err := mt.tx.CopyFrom(ctx, pgx.Identifier(name), []string{"aggregate_type", "aggregate_id", "event_type", "payload", "created_at"},
			pgx.CopyFromRows(src)); err != nil {
			t.Fatal(err)
		}
	case 4, 5: // a savepoint around a few rows: released (kept) or rolled back
		exec(t, mt.tx, "SAVEPOINT s")
		rows = next(1 + rng.IntN(4))
		vals, args := values(rows)
		exec(t, mt.tx, insert+"VALUES "+vals, args...)
		if kind == 5 {
			exec(t, mt.tx, "ROLLBACK TO SAVEPOINT s")
			rows = nil
		} else {
			exec(t, mt.tx, "RELEASE SAVEPOINT s")
		}
	}
	mt.rows = append(mt.rows, rows...)
}

func exec(t *testing.T, tx pgx.Tx, sql string, args ...any) {
	t.Helper()
	if _, err := tx.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// want returns each key's labels, in order, of the first n committed
// transactions.
func (m *model) want(n int) (map[string][]int, int) {
	want, total := map[string][]int{}, 0
	for _, rows := range m.committed[:n] {
		for _, r := range rows {
			want[r.key] = append(want[r.key], r.label)
			total++
		}
	}
	return want, total
}

// check reads the model's table with the reader, whole, cut and resumed, and
// as of the snapshot, and compares what reached Kafka with the model.
func (m *model) check(t *testing.T, pool *pgxpool.Pool, kafka *sandbox.Kafka, s interface{ History() *replay.History }, p replay.Publisher) {
	ctx := t.Context()
	cols := outboxtable.Columns{Columns: decoder.DefaultColumns()}
	want, total := m.want(len(m.committed))
	topic := func(what string) string { return fmt.Sprintf("model.%d.%s", m.seed, what) }

	// Whole.
	batch := 1 + m.rng.IntN(50)
	res, err := outboxtable.Replay(ctx, pool, s.History(), m.table, cols, p, outboxtable.ReplayOptions{Topic: topic("whole"), BatchSize: batch})
	if err != nil {
		t.Fatal(err)
	}
	if res.Selected != total || res.Published != total || res.Failed != 0 {
		t.Errorf("whole read (batch %d): selected %d, published %d, failed %d; the model committed %d rows", batch, res.Selected, res.Published, res.Failed, total)
	}
	compare(t, fmt.Sprintf("whole read (batch %d)", batch), want, read(t, kafka, topic("whole")))

	// Cut after some batches, then resumed from the last position Progress gave.
	batch = 1 + m.rng.IntN(30)
	cutAfter := 1 + m.rng.IntN(max(1, total/batch))
	var pos string
	calls := 0
	errCut := errors.New("cut")
	o := outboxtable.ReplayOptions{Topic: topic("resumed"), BatchSize: batch, Progress: func(_ context.Context, at string) error {
		pos, calls = at, calls+1
		if calls == cutAfter {
			return errCut
		}
		return nil
	}}
	if _, err := outboxtable.Replay(ctx, pool, s.History(), m.table, cols, p, o); err != nil && !errors.Is(err, errCut) {
		t.Fatal(err)
	}
	if calls == cutAfter {
		o.After, o.Progress = pos, nil
		if _, err := outboxtable.Replay(ctx, pool, s.History(), m.table, cols, p, o); err != nil {
			t.Fatal(err)
		}
	}
	compare(t, fmt.Sprintf("read cut after %d batches of %d and resumed", cutAfter, batch), want, read(t, kafka, topic("resumed")))

	// As of the snapshot taken after beforeSnap commits.
	wantSnap, totalSnap := m.want(m.beforeSnap)
	o = outboxtable.ReplayOptions{Topic: topic("snapshot"), BatchSize: 1 + m.rng.IntN(50), Snapshot: m.snapshot, Through: m.through}
	if m.through == "" {
		o.IDs = []string{"00000000-0000-0000-0000-000000000000"} // it saw none: select none
	}
	n, err := outboxtable.Count(ctx, pool, m.table, cols, o)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(totalSnap) {
		t.Errorf("Count as of snapshot %s = %d, the model committed %d rows before it", m.snapshot, n, totalSnap)
	}
	if _, err := outboxtable.Replay(ctx, pool, s.History(), m.table, cols, p, o); err != nil {
		t.Fatal(err)
	}
	compare(t, "read as of snapshot "+m.snapshot, wantSnap, read(t, kafka, topic("snapshot")))
}

// read returns each key's labels in the order Kafka holds them (one key, one
// partition).
func read(t *testing.T, kafka *sandbox.Kafka, topic string) map[string][]int {
	t.Helper()
	got := map[string][]int{}
	for _, r := range testenv.MustReadAll(t, kafka, topic) {
		var v struct{ Label int }
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("record %s: %v", r.Value, err)
		}
		got[string(r.Key)] = append(got[string(r.Key)], v.Label)
	}
	return got
}

// compare reports each key whose labels differ from the model's: missing,
// repeated or out of order.
func compare(t *testing.T, what string, want, got map[string][]int) {
	t.Helper()
	for _, k := range modelKeys {
		w, g := want[k], got[k]
		if slices.Equal(w, g) {
			continue
		}
		seen := map[int]int{}
		for _, l := range g {
			seen[l]++
		}
		var missing, twice []int
		for _, l := range w {
			if seen[l] == 0 {
				missing = append(missing, l)
			}
		}
		for l, c := range seen {
			if c > 1 {
				twice = append(twice, l)
			}
		}
		slices.Sort(twice)
		t.Errorf("%s, key %s: %d records, the model has %d: %d missing %v, %d twice %v, out of order: %v\n got  %v\n want %v",
			what, k, len(g), len(w), len(missing), head(missing), len(twice), head(twice), len(missing) == 0 && len(twice) == 0, head(g), head(w))
	}
}

func head(l []int) []int { return l[:min(len(l), 40)] }
