package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-relay/cdc-relay/consumer"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// effect is the business change of the tests' handlers: one row per call.
func effect(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (message_id) VALUES ($1)`, msg.ID)
	return err
}

// TestDuplicateSkipped: the same id twice takes effect once, the copy is
// counted, and after a clean stop a new Run redelivers nothing (the offsets
// were committed after the database commits).
func TestDuplicateSkipped(t *testing.T) {
	e := newEnv(t, 1)
	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
		calls.Add(1)
		return effect(ctx, tx, msg)
	}
	e.produce(rec{id: "a", value: "1"}, rec{id: "b", value: "2"}, rec{id: "a", value: "1"})
	r := e.start(e.cfg, h)
	r.waitMetric(2, "processed_total")
	r.waitMetric(1, "duplicates_skipped_total")
	if err := r.stop(); err != nil {
		t.Fatalf("Run after a clean stop: %v", err)
	}
	if got := e.effects(); !maps.Equal(got, map[string]int{"a": 1, "b": 1}) {
		t.Fatalf("effects = %v, want a and b once each", got)
	}
	if calls.Load() != 2 {
		t.Fatalf("handler called %d times, want 2", calls.Load())
	}
	if n := r.metric("handler_duration_seconds"); n != 2 {
		t.Errorf("handler_duration_seconds has %v samples, want 2", n)
	}
	if n := e.scalar(`SELECT count(*) FROM processed_messages WHERE consumer_name = $1`, e.cfg.Name); n != 2 {
		t.Errorf("%d claims, want 2", n)
	}

	// A new Run of the group: the only record it may see is the new one.
	e.produce(rec{id: "c", value: "3"})
	r2 := e.start(e.cfg, h)
	r2.waitMetric(1, "processed_total")
	if d := r2.metric("duplicates_skipped_total"); d != 0 {
		t.Errorf("the second run skipped %v duplicates: offsets were not committed by the first", d)
	}
	if got := r2.metric("lag", "topic", e.topic, "partition", "0"); got != 0 {
		t.Errorf("lag after catching up = %v, want 0", got)
	}
	if err := r2.stop(); err != nil {
		t.Fatal(err)
	}
	if got := e.effects(); !maps.Equal(got, map[string]int{"a": 1, "b": 1, "c": 1}) {
		t.Fatalf("effects = %v, want a, b and c once each", got)
	}
}

// TestRetryThenSucceed: transient failures are retried with the
// transaction rolled back each time (the failed attempts' writes vanish),
// and the next record of the partition waits for the retried one.
func TestRetryThenSucceed(t *testing.T) {
	tests := []struct {
		name string
		// fail makes attempt n (from 1) of message "m1" fail; nil: succeed.
		fail    func(ctx context.Context, tx pgx.Tx, n int) error
		retries int
	}{
		{"transient error twice", func(_ context.Context, _ pgx.Tx, n int) error {
			if n <= 2 {
				return consumer.Transient(errInjected)
			}
			return nil
		}, 2},
		{"unknown error once", func(_ context.Context, _ pgx.Tx, n int) error {
			if n == 1 {
				return errInjected
			}
			return nil
		}, 1},
		{"serialization failure from Postgres", func(ctx context.Context, tx pgx.Tx, n int) error {
			if n == 1 {
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END $$`)
				return err
			}
			return nil
		}, 1},
		{"panic once", func(_ context.Context, _ pgx.Tx, n int) error {
			if n == 1 {
				panic("injected panic")
			}
			return nil
		}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 1)
			var mu sync.Mutex
			var order []string
			attempts := map[string]int{}
			h := func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
				mu.Lock()
				attempts[msg.ID]++
				n := attempts[msg.ID]
				mu.Unlock()
				if err := effect(ctx, tx, msg); err != nil { // written before the failure: must roll back
					return err
				}
				if msg.ID == "m1" {
					if err := tc.fail(ctx, tx, n); err != nil {
						return err
					}
				}
				mu.Lock()
				order = append(order, msg.ID)
				mu.Unlock()
				return nil
			}
			e.produce(rec{id: "m1", key: "k"}, rec{id: "m2", key: "k"}, rec{id: "m3", key: "k"})
			r := e.start(e.cfg, h)
			r.waitMetric(3, "processed_total")
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(order, []string{"m1", "m2", "m3"}) {
				t.Fatalf("took effect in order %v, want m1, m2, m3", order)
			}
			if got := e.effects(); !maps.Equal(got, map[string]int{"m1": 1, "m2": 1, "m3": 1}) {
				t.Fatalf("effects = %v, want each once (failed attempts rolled back)", got)
			}
			if attempts["m1"] != tc.retries+1 {
				t.Errorf("m1 attempted %d times, want %d", attempts["m1"], tc.retries+1)
			}
			if got := r.metric("retries_total"); got != float64(tc.retries) {
				t.Errorf("retries_total = %v, want %d", got, tc.retries)
			}
			if n := e.scalar(`SELECT count(*) FROM consumer_dead_letters`); n != 0 {
				t.Errorf("%d dead letters, want none", n)
			}
		})
	}
}

// deadLetter is a row of consumer_dead_letters.
type deadLetter struct {
	ID                           int64
	Consumer, MessageID, Topic   string
	Partition                    int
	Offset                       int64
	Key, Payload                 []byte
	Headers                      map[string]string
	MessageTime                  *time.Time
	Code, Message                string
	Retries                      int
	First, Last                  time.Time
	CorrelationID, SchemaVersion *string
	Status                       string
	ReprocessAttempts            int
	ReprocessedAt                *time.Time
	ReprocessedBy                *string
}

// letters returns the dead letters, by id.
func (e *env) letters() []deadLetter {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT id, consumer_name, message_id, topic, kafka_partition, kafka_offset,
    message_key, payload, headers, message_time, error_code, error_message, retry_count, first_failed_at, last_failed_at,
    correlation_id, schema_version, status, reprocess_attempts, reprocessed_at, reprocessed_by
FROM consumer_dead_letters ORDER BY id`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var out []deadLetter
	for rows.Next() {
		var l deadLetter
		var headers []byte
		if err := rows.Scan(&l.ID, &l.Consumer, &l.MessageID, &l.Topic, &l.Partition, &l.Offset, &l.Key, &l.Payload, &headers,
			&l.MessageTime, &l.Code, &l.Message, &l.Retries, &l.First, &l.Last, &l.CorrelationID, &l.SchemaVersion,
			&l.Status, &l.ReprocessAttempts, &l.ReprocessedAt, &l.ReprocessedBy); err != nil {
			e.t.Fatal(err)
		}
		if err := json.Unmarshal(headers, &l.Headers); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// TestPermanentDeadLetter: a permanent failure is stored with every field
// of the seeds' dead-letter list, the effect rolled back and the claim kept,
// so a redelivery is skipped; the consumer goes on with the next record.
func TestPermanentDeadLetter(t *testing.T) {
	e := newEnv(t, 1)
	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
		calls.Add(1)
		if err := effect(ctx, tx, msg); err != nil {
			return err
		}
		if msg.ID == "bad" {
			return consumer.WithCode("invalid_payload", consumer.Permanent(fmt.Errorf("points %q is not a number", msg.Value)))
		}
		return nil
	}
	headers := map[string]string{"event_type": "RewardGranted", "aggregate_type": "player", "correlation_id": "req-42",
		"schema_version": "2", "commit_lsn": "0/1234"}
	before := time.Now()
	e.produce(rec{id: "bad", key: "player-1", value: `{"points":"x"}`, headers: headers}, rec{id: "good", key: "player-1", value: `{"points":1}`})
	r := e.start(e.cfg, h)
	r.waitMetric(1, "processed_total")
	r.waitMetric(1, "dead_letters_total", "code", "invalid_payload")

	ls := e.letters()
	if len(ls) != 1 {
		t.Fatalf("%d dead letters, want 1: %+v", len(ls), ls)
	}
	l := ls[0]
	wantHeaders := maps.Clone(headers)
	wantHeaders["id"] = "bad"
	switch {
	case l.Consumer != e.cfg.Name || l.MessageID != "bad" || l.Topic != e.topic || l.Partition != 0 || l.Offset != 0:
		t.Errorf("dead letter names %s %s %s/%d@%d, want %s bad %s/0@0", l.Consumer, l.MessageID, l.Topic, l.Partition, l.Offset, e.cfg.Name, e.topic)
	case string(l.Key) != "player-1" || string(l.Payload) != `{"points":"x"}`:
		t.Errorf("key %q payload %q", l.Key, l.Payload)
	case !maps.Equal(l.Headers, wantHeaders):
		t.Errorf("headers %v, want %v", l.Headers, wantHeaders)
	case l.Code != "invalid_payload" || !strings.Contains(l.Message, `points "{\"points\":\"x\"}" is not a number`):
		t.Errorf("error %s: %s", l.Code, l.Message)
	case l.Retries != 0:
		t.Errorf("retry_count %d, want 0 (permanent: no retry)", l.Retries)
	case l.First.Before(before.Add(-time.Second)) || !l.Last.Equal(l.First):
		t.Errorf("first failure %v, last %v (test began %v)", l.First, l.Last, before)
	case l.CorrelationID == nil || *l.CorrelationID != "req-42" || l.SchemaVersion == nil || *l.SchemaVersion != "2":
		t.Errorf("correlation id %v, schema version %v", l.CorrelationID, l.SchemaVersion)
	case l.MessageTime == nil || l.MessageTime.Before(before.Add(-time.Second)):
		t.Errorf("message time %v", l.MessageTime)
	case l.Status != consumer.StatusDead:
		t.Errorf("status %q", l.Status)
	}
	if got := e.effects(); !maps.Equal(got, map[string]int{"good": 1}) {
		t.Fatalf("effects = %v, want only good (bad rolled back)", got)
	}
	if n := e.scalar(`SELECT count(*) FROM processed_messages WHERE message_id = 'bad'`); n != 1 {
		t.Fatalf("the dead-lettered message has %d claims, want 1", n)
	}

	// Delivered again (an operator replay, say): isolated, not run again.
	e.produce(rec{id: "bad", key: "player-1", value: `{"points":"x"}`}, rec{id: "after", key: "player-1"})
	r.waitMetric(2, "processed_total")
	if got := r.metric("duplicates_skipped_total"); got != 1 {
		t.Errorf("duplicates_skipped_total = %v, want 1 (the redelivered dead letter)", got)
	}
	if calls.Load() != 3 {
		t.Errorf("handler called %d times, want 3 (bad once, good, after)", calls.Load())
	}
	if n := len(e.letters()); n != 1 {
		t.Errorf("%d dead letters after the redelivery, want 1", n)
	}
}

// TestRetriesExhausted: transient failures beyond the budget (attempts or
// time) are dead-lettered with the retry count and both failure times.
func TestRetriesExhausted(t *testing.T) {
	tests := []struct {
		name        string
		policy      consumer.RetryPolicy
		wantRetries func(n int) bool
	}{
		{"attempts", consumer.RetryPolicy{Base: time.Millisecond, Cap: 2 * time.Millisecond, MaxAttempts: 3, MaxTotal: time.Minute},
			func(n int) bool { return n == 2 }},
		{"time", consumer.RetryPolicy{Base: 20 * time.Millisecond, Cap: 40 * time.Millisecond, MaxAttempts: 10000, MaxTotal: 300 * time.Millisecond},
			func(n int) bool { return n >= 2 && n < 10000 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 1)
			cfg := e.cfg
			cfg.Retry = tc.policy
			h := func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
				if msg.ID == "flaky" {
					return fmt.Errorf("call points service: %w", context.DeadlineExceeded)
				}
				return effect(ctx, tx, msg)
			}
			e.produce(rec{id: "flaky"}, rec{id: "next"})
			r := e.start(cfg, h)
			r.waitMetric(1, "processed_total")
			ls := e.letters()
			if len(ls) != 1 {
				t.Fatalf("%d dead letters, want 1", len(ls))
			}
			l := ls[0]
			if l.Code != consumer.CodeRetriesExhausted || !strings.Contains(l.Message, "call points service: context deadline exceeded") {
				t.Errorf("error %s: %s", l.Code, l.Message)
			}
			if !tc.wantRetries(l.Retries) {
				t.Errorf("retry_count = %d", l.Retries)
			}
			if got := r.metric("retries_total"); got != float64(l.Retries) {
				t.Errorf("retries_total = %v, want the letter's %d", got, l.Retries)
			}
			if !l.Last.After(l.First) {
				t.Errorf("last failure %v not after the first %v", l.Last, l.First)
			}
			if span := l.Last.Sub(l.First); span > tc.policy.MaxTotal+time.Second {
				t.Errorf("failures spanned %v, beyond MaxTotal %v", span, tc.policy.MaxTotal)
			}
			if got := r.metric("dead_letters_total", "code", consumer.CodeRetriesExhausted); got != 1 {
				t.Errorf("dead_letters_total{code=retries_exhausted} = %v", got)
			}
		})
	}
}

// TestMissingID: a record without an "id" header cannot be deduplicated: it
// is dead-lettered as missing_id without calling the handler, and the
// consumer goes on.
func TestMissingID(t *testing.T) {
	e := newEnv(t, 1)
	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
		calls.Add(1)
		return effect(ctx, tx, msg)
	}
	e.produce(rec{key: "k", value: "no id", headers: map[string]string{"event_type": "X"}}, rec{id: "ok"})
	r := e.start(e.cfg, h)
	r.waitMetric(1, "processed_total")
	r.waitMetric(1, "dead_letters_total", "code", consumer.CodeMissingID)
	ls := e.letters()
	if len(ls) != 1 || ls[0].Code != consumer.CodeMissingID || ls[0].MessageID != fmt.Sprintf("no-id:%s:0:0", e.topic) ||
		string(ls[0].Payload) != "no id" || ls[0].Headers["event_type"] != "X" {
		t.Fatalf("dead letters %+v, want the record without id as missing_id", ls)
	}
	if calls.Load() != 1 {
		t.Errorf("handler called %d times, want once (not for the record without id)", calls.Load())
	}
}

// TestPermanentPostgresError: a constraint violation from the handler's own
// statement is permanent, dead-lettered under its SQLSTATE.
func TestPermanentPostgresError(t *testing.T) {
	e := newEnv(t, 1)
	if _, err := e.pool.Exec(context.Background(), `CREATE TABLE players (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO players (id) VALUES ($1)`, string(msg.Value))
		return err
	}
	e.produce(rec{id: "1", value: "p"}, rec{id: "2", value: "p"}, rec{id: "3", value: "q"})
	r := e.start(e.cfg, h)
	r.waitMetric(2, "processed_total")
	ls := e.letters()
	if len(ls) != 1 || ls[0].MessageID != "2" || ls[0].Code != "sqlstate_23505" || ls[0].Retries != 0 {
		t.Fatalf("dead letters %+v, want message 2 as sqlstate_23505 without retries", ls)
	}
	if got := r.metric("retries_total"); got != 0 {
		t.Errorf("retries_total = %v, want 0", got)
	}
}

// TestStopFinishesMessageInHand: when Run's context ends during a handler
// call, the call finishes (within ShutdownTimeout), commits, and its offset
// is committed: a new Run does not see the message again.
func TestStopFinishesMessageInHand(t *testing.T) {
	e := newEnv(t, 1)
	entered, release := make(chan struct{}), make(chan struct{})
	h := func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
		if msg.ID == "slow" {
			close(entered)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return effect(ctx, tx, msg)
	}
	e.produce(rec{id: "slow"})
	r := e.start(e.cfg, h)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler was not called within 30s")
	}
	r.cancel()
	close(release)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got := e.effects(); got["slow"] != 1 {
		t.Fatalf("effects = %v, want slow once", got)
	}
	e.produce(rec{id: "next"})
	r2 := e.start(e.cfg, effect)
	r2.waitMetric(1, "processed_total")
	if d := r2.metric("duplicates_skipped_total"); d != 0 {
		t.Errorf("the message finished during the stop was delivered again (%v duplicates)", d)
	}
}

// TestStopCutsShortAfterShutdownTimeout: a handler that does not finish
// within ShutdownTimeout is cancelled and rolled back; Run still returns
// nil, and the message takes effect once on the next run.
func TestStopCutsShortAfterShutdownTimeout(t *testing.T) {
	e := newEnv(t, 1)
	cfg := e.cfg
	cfg.ShutdownTimeout = 100 * time.Millisecond
	entered := make(chan struct{})
	var once sync.Once
	stuck := func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
		if err := effect(ctx, tx, msg); err != nil {
			return err
		}
		once.Do(func() { close(entered) })
		<-ctx.Done()
		return ctx.Err()
	}
	e.produce(rec{id: "stuck"})
	r := e.start(cfg, stuck)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler was not called within 30s")
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got := e.effects(); len(got) != 0 {
		t.Fatalf("effects = %v after the cut-short call, want none", got)
	}
	if n := len(e.letters()); n != 0 {
		t.Fatalf("%d dead letters: a shutdown must not dead-letter", n)
	}
	r2 := e.start(e.cfg, effect)
	r2.waitMetric(1, "processed_total")
	if got := e.effects(); got["stuck"] != 1 {
		t.Fatalf("effects = %v, want stuck once", got)
	}
}

// TestStoreOutageDoesNotDeadLetter: while the consumer's database refuses
// connections, messages wait (store_unavailable = 1) instead of using up
// their retry budget; after it is back they take effect.
func TestStoreOutageDoesNotDeadLetter(t *testing.T) {
	e := newEnv(t, 1)
	cfg := e.cfg
	cfg.Retry = consumer.RetryPolicy{Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond, MaxAttempts: 2, MaxTotal: 100 * time.Millisecond}
	r := e.start(cfg, effect)
	e.produce(rec{id: "first"})
	r.waitMetric(1, "processed_total")

	// Block new connections to the database and end the pool's sessions.
	ctx := context.Background()
	db := e.db
	if err := pg.Exec(ctx, "postgres", `ALTER DATABASE "`+db+`" WITH ALLOW_CONNECTIONS false`); err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, "postgres", `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db); err != nil {
		t.Fatal(err)
	}
	e.produce(rec{id: "during"})
	r.waitMetric(1, "store_unavailable")
	// Not a wait for a condition: the outage must outlast the whole retry
	// budget (100 ms) to show that it does not run out.
	time.Sleep(300 * time.Millisecond)
	if err := pg.Exec(ctx, "postgres", `ALTER DATABASE "`+db+`" WITH ALLOW_CONNECTIONS true`); err != nil {
		t.Fatal(err)
	}
	r.waitMetric(2, "processed_total")
	if n := len(e.letters()); n != 0 {
		t.Fatalf("%d dead letters after an outage of the consumer's database, want none", n)
	}
	if got := r.metric("store_unavailable"); got != 0 {
		t.Errorf("store_unavailable = %v after recovery", got)
	}
}

// TestRebalanceBetweenTwoRuns: two Runs in one group over four partitions,
// one joining late and one leaving early: every message takes effect once.
func TestRebalanceBetweenTwoRuns(t *testing.T) {
	e := newEnv(t, 4)
	const n = 400
	var recs []rec
	for i := 0; i < n; i++ {
		recs = append(recs, rec{id: fmt.Sprintf("e%d", i), partition: int32(i % 4), key: fmt.Sprintf("k%d", i%4)})
	}
	slow := func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
		time.Sleep(time.Millisecond) // keep both busy across the rebalances
		return effect(ctx, tx, msg)
	}
	e.produce(recs[:n/2]...)
	a := e.start(e.cfg, slow)
	a.waitMetric(20, "processed_total")
	b := e.start(e.cfg, slow)
	e.produce(recs[n/2:]...)
	b.waitMetric(10, "processed_total")
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		if got := e.scalar(`SELECT count(*) FROM processed_messages`); got < n {
			return fmt.Errorf("%d of %d processed", got, n)
		}
		return nil
	})
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	got := e.effects()
	for _, r := range recs {
		if got[r.id] != 1 {
			t.Fatalf("message %s took effect %d times", r.id, got[r.id])
		}
	}
	if len(got) != n {
		t.Fatalf("%d messages took effect, want %d", len(got), n)
	}
	t.Logf("a: processed %v, duplicates %v, rebalances %v; b: processed %v, duplicates %v, rebalances %v",
		a.metric("processed_total"), a.metric("duplicates_skipped_total"), a.metric("rebalances_total"),
		b.metric("processed_total"), b.metric("duplicates_skipped_total"), b.metric("rebalances_total"))
	if b.metric("rebalances_total") < 2 {
		t.Errorf("b saw %v group generations, want at least 2 (joined, then a left)", b.metric("rebalances_total"))
	}
}

// TestRunRefusesMissingTables: Run names the migration when the tables are
// not there.
func TestRunRefusesMissingTables(t *testing.T) {
	e := newEnv(t, 1)
	if _, err := e.pool.Exec(context.Background(), `DROP TABLE consumer_dead_letters`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := consumer.Run(ctx, e.cfg, effect)
	if err == nil || !strings.Contains(err.Error(), "public.consumer_dead_letters does not exist") || !strings.Contains(err.Error(), consumer.MigrationFile) {
		t.Fatalf("Run without the dead-letter table = %v, want an error naming it and %s", err, consumer.MigrationFile)
	}
	if err := consumer.Run(ctx, consumer.Config{}, effect); err == nil || !strings.Contains(err.Error(), "Brokers is empty") {
		t.Fatalf("Run with an empty config = %v", err)
	}
	if err := consumer.Run(ctx, e.cfg, nil); err == nil || !strings.Contains(err.Error(), "handler is nil") {
		t.Fatalf("Run without a handler = %v", err)
	}
}

// TestTLSAndSASL: Config.TLS and Config.SASL reach a broker that accepts
// only TLS connections and SASL/PLAIN logins.
func TestTLSAndSASL(t *testing.T) {
	e := newEnv(t, 1)
	k := testenv.NewKafka(t, sandbox.KafkaOptions{
		Partitions: 1, Topics: []string{e.topic}, TLS: true,
		SASLUsers:     []sandbox.SASLUser{{Mechanism: sandbox.SASLPlain, User: "rewards", Password: "s3cret"}},
		BrokerConfigs: map[string]string{"group.min.session.timeout.ms": "500"},
	})
	cl, err := kgo.NewClient(k.ClientOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: e.topic, Headers: []kgo.RecordHeader{{Key: "id", Value: []byte("secure")}}}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cfg := e.cfg
	cfg.Brokers = k.Brokers()
	cfg.TLS = k.ClientTLS()
	cfg.SASL = plain.Mechanism{Username: "rewards", Password: "s3cret"}
	r := e.start(cfg, effect)
	r.waitMetric(1, "processed_total")
	if got := e.effects(); got["secure"] != 1 {
		t.Fatalf("effects = %v", got)
	}
}
