package outboxtable_test

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/outboxtable"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestReplayPartitioned: a replay of a partitioned outbox table (what
// replay, the relay's backfill and its --snapshot initial read) reads the
// root, so every partition's rows, the default partition's too, in pages
// that cross partitions, in created_at order; also through a REPEATABLE READ
// transaction, as the initial snapshot reads it.
func TestReplayPartitioned(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t, "cdc_relay_outboxtable_partitioned")
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{})
	s := newStore(t, pool)
	p := newPublisher(t, kafka)
	now := time.Now()
	table := "public.outbox"
	if _, err := pool.Exec(ctx, `CREATE TABLE public.outbox (
    id uuid NOT NULL DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, aggregate_id text NOT NULL,
    event_type text NOT NULL, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), correlation_id text,
    PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
CREATE TABLE public.outbox_old PARTITION OF public.outbox FOR VALUES FROM (MINVALUE) TO ('`+now.Add(-time.Hour).UTC().Format(time.RFC3339Nano)+`');
CREATE TABLE public.outbox_default PARTITION OF public.outbox DEFAULT`); err != nil {
		t.Fatal(err)
	}
	ids := insertRows(t, pool, table, now,
		row{"order", "A", "Placed", 3 * time.Hour}, // outbox_old
		row{"order", "B", "Placed", 150 * time.Minute},
		row{"order", "A", "Paid", 30 * time.Minute}, // outbox_default
		row{"order", "B", "Paid", 20 * time.Minute},
		row{"order", "A", "Shipped", 10 * time.Minute},
	)
	var inOld, inDefault int
	if err := pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM public.outbox_old), (SELECT count(*) FROM public.outbox_default)").Scan(&inOld, &inDefault); err != nil {
		t.Fatal(err)
	}
	if inOld != 2 || inDefault != 3 {
		t.Fatalf("rows in outbox_old, outbox_default = %d, %d, want 2, 3", inOld, inDefault)
	}
	cols := outboxtable.Columns{Columns: decoder.DefaultColumns()}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	res, err := outboxtable.Replay(ctx, tx, s.History(), table, cols, p, outboxtable.ReplayOptions{Topic: "part", BatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "replay of a partitioned outbox", res, replay.Counts{Selected: 5, Published: 5})
	recs := testenv.MustReadAll(t, kafka, "part")
	got, want := sandbox.IDs(recs), slices.Clone(ids)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("replayed %v, want every partition's rows %v", got, want)
	}
	var keyA []string
	for _, r := range recs {
		if string(r.Key) == "A" {
			keyA = append(keyA, r.Headers["id"])
		}
	}
	if w := []string{ids[0], ids[2], ids[4]}; !slices.Equal(keyA, w) {
		t.Errorf("key A in order %v, want %v (created_at order across partitions)", keyA, w)
	}
}
