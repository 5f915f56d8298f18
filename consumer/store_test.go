package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/consumer"
)

// TestReprocess: after the fix, Reprocess runs the handler for a dead
// letter in one transaction with its claim and marks it; a second call
// skips it; a failing call records the failure and leaves it dead.
func TestReprocess(t *testing.T) {
	e := newEnv(t, 1)
	var fixed atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
		if !fixed.Load() && msg.ID != "fine" {
			return consumer.Permanent(errors.New("bug in the handler"))
		}
		if msg.EventType() != "RewardGranted" || string(msg.Key) != "player-9" {
			return fmt.Errorf("rebuilt message %+v lacks its headers or key", msg)
		}
		return effect(ctx, tx, msg)
	}
	hdr := map[string]string{"event_type": "RewardGranted"}
	e.produce(rec{id: "one", key: "player-9", headers: hdr}, rec{id: "two", key: "player-9", headers: hdr},
		rec{id: "fine", key: "player-9", headers: hdr})
	r := e.start(e.cfg, h)
	r.waitMetric(1, "processed_total")
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	ls := e.letters()
	if len(ls) != 2 {
		t.Fatalf("%d dead letters, want 2", len(ls))
	}
	ctx := context.Background()

	// Still broken: the attempt is recorded, the letter stays dead.
	res, err := consumer.Reprocess(ctx, e.cfg, h, "alice", ls[0].ID)
	if err != nil || len(res) != 1 || res[0].Outcome != consumer.ReprocessFailed || res[0].Err == nil {
		t.Fatalf("Reprocess before the fix = %+v, %v; want failed", res, err)
	}
	if l := e.letters()[0]; l.Status != consumer.StatusDead || l.ReprocessAttempts != 1 || !strings.Contains(l.Message, "reprocess: bug in the handler") ||
		!l.Last.After(l.First) || l.Code != consumer.CodePermanent {
		t.Fatalf("after a failed reprocess: %+v", l)
	}

	fixed.Store(true)
	res, err = consumer.Reprocess(ctx, e.cfg, h, "alice", ls[0].ID, ls[1].ID, 999999)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{consumer.Reprocessed, consumer.Reprocessed, consumer.ReprocessNotFound}
	for i, w := range want {
		if res[i].Outcome != w {
			t.Errorf("result %d = %+v, want %s", i, res[i], w)
		}
	}
	for _, l := range e.letters() {
		if l.Status != consumer.StatusCompleted || l.ReprocessedAt == nil || l.ReprocessedBy == nil || *l.ReprocessedBy != "alice" {
			t.Errorf("letter %d after reprocessing: status %s at %v by %v", l.ID, l.Status, l.ReprocessedAt, l.ReprocessedBy)
		}
	}
	res, err = consumer.Reprocess(ctx, e.cfg, h, "bob", ls[0].ID)
	if err != nil || res[0].Outcome != consumer.ReprocessSkipped {
		t.Fatalf("second Reprocess = %+v, %v; want skipped", res, err)
	}
	got := e.effects()
	if got["one"] != 1 || got["two"] != 1 || got["fine"] != 1 || len(got) != 3 {
		t.Fatalf("effects = %v, want one, two and fine once each", got)
	}
	if n := e.scalar(`SELECT count(*) FROM processed_messages`); n != 3 {
		t.Errorf("%d claims, want 3", n)
	}

	// A Run delivering them again skips all three.
	e.produce(rec{id: "one", key: "player-9", headers: hdr}, rec{id: "last", key: "player-9", headers: hdr})
	r2 := e.start(e.cfg, h)
	r2.waitMetric(1, "processed_total")
	if d := r2.metric("duplicates_skipped_total"); d != 1 {
		t.Errorf("duplicates_skipped_total = %v, want 1 (the reprocessed one)", d)
	}
}

// TestPrune deletes old claims in batches, of one consumer or of all.
func TestPrune(t *testing.T) {
	e := newEnv(t, 1)
	ctx := context.Background()
	// 2500 old claims of "a" (three batches), 10 old of "b", 5 fresh of each.
	_, err := e.pool.Exec(ctx, `INSERT INTO processed_messages (consumer_name, message_id, processed_at)
SELECT 'a', 'old-' || g, now() - interval '10 days' FROM generate_series(1, 2500) g
UNION ALL SELECT 'b', 'old-' || g, now() - interval '10 days' FROM generate_series(1, 10) g
UNION ALL SELECT c, 'new-' || g, now() FROM generate_series(1, 5) g, (VALUES ('a'), ('b')) v(c)`)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		consumer  string
		olderThan time.Duration
		deleted   int64
		left      map[string]int64
	}{
		{"a", 30 * 24 * time.Hour, 0, map[string]int64{"a": 2505, "b": 15}},
		{"a", 7 * 24 * time.Hour, 2500, map[string]int64{"a": 5, "b": 15}},
		{"", 7 * 24 * time.Hour, 10, map[string]int64{"a": 5, "b": 5}},
		{"", time.Hour, 0, map[string]int64{"a": 5, "b": 5}},
	}
	for i, s := range steps {
		n, err := consumer.Prune(ctx, e.pool, s.consumer, s.olderThan)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if n != s.deleted {
			t.Errorf("step %d: Prune(%q, %v) deleted %d, want %d", i, s.consumer, s.olderThan, n, s.deleted)
		}
		for c, want := range s.left {
			if got := e.scalar(`SELECT count(*) FROM processed_messages WHERE consumer_name = $1`, c); got != want {
				t.Errorf("step %d: %d claims of %s left, want %d", i, got, c, want)
			}
		}
	}
	if _, err := consumer.Prune(ctx, e.pool, "a", 0); err == nil {
		t.Error("Prune with olderThan 0 did not refuse")
	}
}

// TestMigration: the migration file holds DDL("") verbatim, Migrate can run
// twice, and another dead-letter table name works end to end.
func TestMigration(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", consumer.MigrationFile))
	if err != nil {
		t.Fatal(err)
	}
	ddl, err := consumer.DDL("")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), ddl) {
		t.Errorf("%s does not contain DDL(\"\") verbatim:\n%s", consumer.MigrationFile, ddl)
	}
	if _, err := consumer.DDL("a.b.c"); err == nil {
		t.Error(`DDL("a.b.c") did not refuse the name`)
	}

	e := newEnv(t, 1)
	ctx := context.Background()
	// Several processes starting at once on a fresh database.
	fresh, err := pg.CreateDatabase(ctx, "migrate_concurrently")
	if err != nil {
		t.Fatal(err)
	}
	freshPool, err := pgxpool.New(ctx, fresh)
	if err != nil {
		t.Fatal(err)
	}
	defer freshPool.Close()
	errs := make(chan error, 4)
	for i := 0; i < cap(errs); i++ {
		go func() { errs <- consumer.Migrate(ctx, freshPool, "") }()
	}
	for i := 0; i < cap(errs); i++ {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Migrate: %v", err)
		}
	}
	if err := consumer.Migrate(ctx, e.pool, ""); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	if _, err := e.pool.Exec(ctx, string(b)); err != nil {
		t.Fatalf("the migration file after Migrate: %v", err)
	}
	if _, err := e.pool.Exec(ctx, `CREATE SCHEMA ops`); err != nil {
		t.Fatal(err)
	}
	if err := consumer.Migrate(ctx, e.pool, "ops.reward_failures"); err != nil {
		t.Fatal(err)
	}
	cfg := e.cfg
	cfg.DeadLetterTable = "ops.reward_failures"
	fail := func(context.Context, pgx.Tx, consumer.Message) error { return consumer.Permanent(errInjected) }
	e.produce(rec{id: "x"})
	r := e.start(cfg, fail)
	r.waitMetric(1, "dead_letters_total", "code", consumer.CodePermanent)
	if n := e.scalar(`SELECT count(*) FROM ops.reward_failures WHERE message_id = 'x'`); n != 1 {
		t.Fatalf("%d dead letters in ops.reward_failures, want 1", n)
	}
	if n := e.scalar(`SELECT count(*) FROM consumer_dead_letters`); n != 0 {
		t.Fatalf("%d dead letters in the default table, want 0", n)
	}
}
