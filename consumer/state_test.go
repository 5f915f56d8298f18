package consumer_test

// Tests of the dead letters' state model: pending → processing → completed,
// retry_wait, dead; atomic leased claims; the migration of old tables.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/consumer"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// insertLetter stores a dead letter of e.cfg.Name for message id as a
// reprocessor would find it, with its claim in processed_messages, and
// returns its row id. lease is "" (none), "live" (held by "someone" for an
// hour) or "expired" (held by "someone" until a second ago).
func (e *env) insertLetter(id, status string, attempts int, lease string) int64 {
	e.t.Helper()
	ctx := context.Background()
	var until any
	switch lease {
	case "live":
		until = time.Now().Add(time.Hour)
	case "expired":
		until = time.Now().Add(-time.Second)
	}
	var owner any
	if until != nil {
		owner = "someone"
	}
	var rowID int64
	err := e.pool.QueryRow(ctx, `INSERT INTO consumer_dead_letters (consumer_name, message_id, topic, kafka_partition,
    kafka_offset, message_key, headers, error_code, error_message, first_failed_at, last_failed_at, status,
    reprocess_attempts, claimed_by, claimed_until)
VALUES ($1, $2, $3, 0, 0, 'k', jsonb_build_object('id', $2::text), 'retries_exhausted', 'injected failure',
    now() - interval '1 minute', now() - interval '1 minute', $4, $5, $6, $7) RETURNING id`,
		e.cfg.Name, id, e.topic, status, attempts, owner, until).Scan(&rowID)
	if err != nil {
		e.t.Fatalf("insert dead letter %s: %v", id, err)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO processed_messages (consumer_name, message_id) VALUES ($1, $2)`, e.cfg.Name, id); err != nil {
		e.t.Fatal(err)
	}
	return rowID
}

// letterState is the state-model part of a dead letter's row.
type letterState struct {
	Status         string
	Attempts       int
	NextAttempt    *time.Time
	ClaimedBy      *string
	LastError      *string
	ReprocessedBy  *string
	DatabaseNow    time.Time
	ReprocessedAt  *time.Time
	LastAttemptAt  *time.Time
	ClaimedUntil   *time.Time
	ErrorMessage   string
	OriginalErrCde string
}

func (e *env) state(rowID int64) letterState {
	e.t.Helper()
	var s letterState
	err := e.pool.QueryRow(context.Background(), `SELECT status, reprocess_attempts, next_attempt_at, claimed_by,
    last_attempt_error, reprocessed_by, now(), reprocessed_at, last_attempt_at, claimed_until, error_message, error_code
FROM consumer_dead_letters WHERE id = $1`, rowID).Scan(&s.Status, &s.Attempts, &s.NextAttempt, &s.ClaimedBy, &s.LastError,
		&s.ReprocessedBy, &s.DatabaseNow, &s.ReprocessedAt, &s.LastAttemptAt, &s.ClaimedUntil, &s.ErrorMessage, &s.OriginalErrCde)
	if err != nil {
		e.t.Fatalf("read dead letter %d: %v", rowID, err)
	}
	return s
}

// history returns the statuses dead letter rowID went through, as
// "from>to" strings, and its transitions.
func (e *env) history(rowID int64) ([]string, []consumer.Transition) {
	e.t.Helper()
	trs, err := consumer.History(context.Background(), e.cfg, rowID)
	if err != nil {
		e.t.Fatal(err)
	}
	var steps []string
	for _, tr := range trs {
		steps = append(steps, tr.From+">"+tr.To)
	}
	return steps, trs
}

// TestReprocessTransitions: each status a letter can be in, with each
// result of the handler, moves to the status the state model says, with the
// attempt, the error and the history recorded.
func TestReprocessTransitions(t *testing.T) {
	e := newEnv(t, 1)
	e.cfg.AutoReprocess = consumer.AutoReprocess{Budget: 3, Base: time.Minute, Cap: time.Hour}
	transient := errInjected
	permanent := consumer.Permanent(errInjected)
	for _, tc := range []struct {
		name     string
		from     string
		lease    string
		attempts int
		err      error // the handler's result
		outcome  string
		to       string
		calls    int
		steps    []string // the history
		detail   string   // in the last transition's detail
		stop     bool     // the handler ends the context, as a stopping Run does
	}{
		{name: "pending succeeds", from: "pending", err: nil, outcome: consumer.Reprocessed, to: "completed", calls: 1,
			steps: []string{"pending>processing", "processing>completed"}, detail: "by alice"},
		{name: "pending fails transiently", from: "pending", err: transient, outcome: consumer.ReprocessFailed, to: "retry_wait", calls: 1,
			steps: []string{"pending>processing", "processing>retry_wait"}, detail: "injected failure"},
		{name: "retry_wait spends the budget", from: "retry_wait", attempts: 2, err: transient, outcome: consumer.ReprocessFailed, to: "dead", calls: 1,
			steps: []string{"retry_wait>processing", "processing>dead"}, detail: "retry budget spent (3 attempts)"},
		{name: "retry_wait not due yet succeeds", from: "retry_wait", attempts: 1, err: nil, outcome: consumer.Reprocessed, to: "completed", calls: 1,
			steps: []string{"retry_wait>processing", "processing>completed"}},
		{name: "pending fails permanently", from: "pending", err: permanent, outcome: consumer.ReprocessFailed, to: "dead", calls: 1,
			steps: []string{"pending>processing", "processing>dead"}, detail: "permanent failure"},
		{name: "dead fails again", from: "dead", err: transient, outcome: consumer.ReprocessFailed, to: "dead", calls: 1,
			steps: []string{"dead>processing", "processing>dead"}, detail: "injected failure"},
		{name: "dead succeeds", from: "dead", attempts: 7, err: nil, outcome: consumer.Reprocessed, to: "completed", calls: 1,
			steps: []string{"dead>processing", "processing>completed"}},
		{name: "completed is skipped", from: "completed", outcome: consumer.ReprocessSkipped, to: "completed"},
		{name: "legacy reprocessed is skipped", from: "reprocessed", outcome: consumer.ReprocessSkipped, to: "reprocessed"},
		{name: "live lease is busy", from: "processing", lease: "live", outcome: consumer.ReprocessBusy, to: "processing"},
		{name: "stopped mid-attempt", from: "pending", stop: true, outcome: consumer.ReprocessStopped, to: "pending", calls: 1,
			steps: []string{"pending>processing", "processing>pending"}, detail: "the reprocessor stopped during the attempt"},
		{name: "expired lease taken over", from: "processing", lease: "expired", err: nil, outcome: consumer.Reprocessed, to: "completed", calls: 1,
			steps: []string{"processing>processing", "processing>completed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := nonIdent.ReplaceAllString(tc.name, "-")
			rowID := e.insertLetter(id, tc.from, tc.attempts, tc.lease)
			calls := 0
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			h := func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
				calls++
				if tc.stop {
					cancel()
					return ctx.Err()
				}
				if msg.ID != id || string(msg.Key) != "k" {
					return consumer.Permanent(fmt.Errorf("rebuilt message %+v", msg))
				}
				if err := effect(ctx, tx, msg); err != nil {
					return err
				}
				return tc.err
			}
			before := e.state(rowID)
			res, err := consumer.Reprocess(ctx, e.cfg, h, "alice", rowID)
			if err != nil {
				t.Fatal(err)
			}
			wantStatus := tc.to
			if wantStatus == consumer.StatusReprocessed { // the legacy status reads as completed
				wantStatus = consumer.StatusCompleted
			}
			if len(res) != 1 || res[0].Outcome != tc.outcome || res[0].Status != wantStatus {
				t.Fatalf("Reprocess = %+v, want outcome %s, status %s", res, tc.outcome, wantStatus)
			}
			if calls != tc.calls {
				t.Errorf("handler called %d times, want %d", calls, tc.calls)
			}
			after := e.state(rowID)
			if after.Status != tc.to {
				t.Errorf("status %s, want %s", after.Status, tc.to)
			}
			wantEffects := 0
			if tc.to == "completed" && tc.calls == 1 {
				wantEffects = 1
			}
			if got := e.effects()[id]; got != wantEffects {
				t.Errorf("%d effects, want %d (a failed attempt rolls its effect back)", got, wantEffects)
			}
			wantAttempts := tc.attempts + tc.calls
			if tc.stop {
				wantAttempts = tc.attempts
			}
			if after.Attempts != wantAttempts {
				t.Errorf("reprocess_attempts %d, want %d", after.Attempts, wantAttempts)
			}
			switch tc.to {
			case "retry_wait":
				// rand(0, min(Cap, Base·2^0)) = up to a minute from now.
				if after.NextAttempt == nil || after.NextAttempt.Before(before.DatabaseNow) || after.NextAttempt.After(after.DatabaseNow.Add(time.Minute)) {
					t.Errorf("next_attempt_at %v, want within a minute of %v", after.NextAttempt, after.DatabaseNow)
				}
			case "completed":
				if tc.calls == 1 && (after.ReprocessedBy == nil || *after.ReprocessedBy != "alice" || after.ReprocessedAt == nil || after.LastError != nil) {
					t.Errorf("completed letter: by %v at %v, last error %v", after.ReprocessedBy, after.ReprocessedAt, after.LastError)
				}
			}
			if tc.to != "retry_wait" && after.NextAttempt != nil {
				t.Errorf("next_attempt_at %v on a %s letter", *after.NextAttempt, tc.to)
			}
			if tc.stop && (after.LastAttemptAt != nil || after.LastError != nil) {
				t.Errorf("a stop was recorded as an attempt: at %v, error %v", after.LastAttemptAt, after.LastError)
			}
			if tc.to != "processing" && (after.ClaimedBy != nil || after.ClaimedUntil != nil) {
				t.Errorf("still claimed by %v until %v", after.ClaimedBy, after.ClaimedUntil)
			}
			if tc.to == "processing" && (after.ClaimedBy == nil || *after.ClaimedBy != "someone") {
				t.Errorf("the live lease changed hands: %v", after.ClaimedBy)
			}
			if tc.err != nil {
				if after.LastError == nil || !strings.Contains(*after.LastError, tc.detail) || after.LastAttemptAt == nil ||
					!strings.HasPrefix(after.ErrorMessage, "reprocess: ") || after.OriginalErrCde != "retries_exhausted" {
					t.Errorf("failure recorded as last error %v at %v, message %q, code %s", after.LastError, after.LastAttemptAt,
						after.ErrorMessage, after.OriginalErrCde)
				}
			}
			steps, trs := e.history(rowID)
			if fmt.Sprint(steps) != fmt.Sprint(tc.steps) {
				t.Errorf("history %v, want %v", steps, tc.steps)
			}
			if len(trs) > 0 {
				last := trs[len(trs)-1]
				if !strings.Contains(last.Detail, tc.detail) || !strings.HasPrefix(last.Owner, "reprocess by alice ") || last.Attempt != wantAttempts {
					t.Errorf("last transition %+v, want detail %q by alice, attempt %d", last, tc.detail, wantAttempts)
				}
			}
			if tc.lease == "expired" && (len(trs) == 0 || !strings.Contains(trs[0].Detail, "took over: the lease of someone expired at")) {
				t.Errorf("the takeover is not in the history: %+v", trs)
			}
		})
	}
	if _, err := consumer.Reprocess(context.Background(), e.cfg, effect, "alice", 424242); err != nil {
		t.Fatal(err)
	}
}

// TestClaimRace: two reprocessors claiming one letter at the same moment:
// exactly one gets it, every time. Then several Reprocess calls race for
// one letter: one runs the handler, the others report it busy.
func TestClaimRace(t *testing.T) {
	e := newEnv(t, 1)
	ctx := context.Background()
	for round := 0; round < 20; round++ {
		rowID := e.insertLetter(fmt.Sprintf("race-%d", round), []string{"pending", "retry_wait", "dead"}[round%3], 0, "")
		start := make(chan struct{})
		var wg sync.WaitGroup
		got := make([][]int64, 2)
		errs := make([]error, 2)
		for i := range got {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				got[i], errs[i] = consumer.ClaimForTest(ctx, e.cfg, fmt.Sprintf("claimer-%d", i), time.Minute, rowID)
			}()
		}
		close(start)
		wg.Wait()
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("round %d: claims failed: %v, %v", round, errs[0], errs[1])
		}
		if len(got[0])+len(got[1]) != 1 {
			t.Fatalf("round %d: claimer 0 got %v, claimer 1 got %v; want exactly one to get letter %d", round, got[0], got[1], rowID)
		}
		winner := fmt.Sprintf("claimer-%d", map[bool]int{true: 0, false: 1}[len(got[0]) == 1])
		if s := e.state(rowID); s.Status != "processing" || s.ClaimedBy == nil || *s.ClaimedBy != winner {
			t.Fatalf("round %d: letter %s by %v, want processing by %s", round, s.Status, s.ClaimedBy, winner)
		}
	}

	// Whole reprocessings: the winner's handler waits until every other
	// call has returned, so they all ran while it held the letter.
	const n = 6
	rowID := e.insertLetter("contended", "dead", 0, "")
	var returned, calls atomic.Int64
	others := make(chan struct{}) // closed when n-1 calls returned
	h := func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
		calls.Add(1)
		select {
		case <-others:
		case <-time.After(20 * time.Second):
			return fmt.Errorf("only %d of the %d other reprocessors returned", returned.Load(), n-1)
		}
		return effect(ctx, tx, msg)
	}
	outcomes := make(chan string, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := consumer.Reprocess(ctx, e.cfg, h, fmt.Sprintf("operator-%d", i), rowID)
			if returned.Add(1) == n-1 {
				close(others)
			}
			if err != nil {
				outcomes <- err.Error()
				return
			}
			outcomes <- res[0].Outcome
		}()
	}
	wg.Wait()
	close(outcomes)
	count := map[string]int{}
	for o := range outcomes {
		count[o]++
	}
	if count[consumer.Reprocessed] != 1 || count[consumer.ReprocessBusy] != n-1 || calls.Load() != 1 {
		t.Fatalf("outcomes %v, handler calls %d; want 1 reprocessed, %d busy, 1 call", count, calls.Load(), n-1)
	}
	if got := e.effects()["contended"]; got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}
}

// TestExpiredLeaseTakenOver: a reprocessor that claimed letters and died
// holds them until its lease expires; then ReprocessDue takes them over.
func TestExpiredLeaseTakenOver(t *testing.T) {
	e := newEnv(t, 1)
	ctx := context.Background()
	e.cfg.AutoReprocess = consumer.AutoReprocess{Base: time.Millisecond}
	rowID := e.insertLetter("orphan", "pending", 0, "")
	const lease = 2 * time.Second
	if got, err := consumer.ClaimForTest(ctx, e.cfg, "crashed reprocessor", lease, rowID); err != nil || len(got) != 1 {
		t.Fatalf("claim = %v, %v", got, err)
	}
	claimedAt := time.Now()
	// The reprocessor "crashes" here: nothing settles its claim.
	res, err := consumer.Reprocess(ctx, e.cfg, effect, "bob", rowID)
	if err != nil || res[0].Outcome != consumer.ReprocessBusy {
		t.Fatalf("Reprocess of a letter under a live lease = %+v, %v; want busy", res, err)
	}
	var taken []consumer.ReprocessResult
	testenv.Eventually(t, 30*time.Second, func() error {
		res, err := consumer.ReprocessDue(ctx, e.cfg, effect, "carol")
		if err != nil {
			return err
		}
		if len(res) == 0 {
			return errors.New("nothing due yet")
		}
		taken = res
		return nil
	})
	if since := time.Since(claimedAt); since < lease {
		t.Errorf("taken over %v after the claim, before the %v lease expired", since, lease)
	}
	if len(taken) != 1 || taken[0].ID != rowID || taken[0].Outcome != consumer.Reprocessed {
		t.Fatalf("ReprocessDue = %+v, want letter %d reprocessed", taken, rowID)
	}
	steps, trs := e.history(rowID)
	want := []string{"pending>processing", "processing>processing", "processing>completed"}
	if fmt.Sprint(steps) != fmt.Sprint(want) {
		t.Fatalf("history %v, want %v", steps, want)
	}
	if trs[0].Owner != "crashed reprocessor" || !strings.HasPrefix(trs[1].Owner, "auto reprocess by carol ") ||
		!strings.Contains(trs[1].Detail, "took over: the lease of crashed reprocessor expired at") {
		t.Errorf("history %+v does not say who took over from whom", trs)
	}
	if got := e.effects()["orphan"]; got != 1 {
		t.Errorf("%d effects, want 1", got)
	}
}

// TestAutoReprocess: with AutoReprocess on, Run stores a message whose
// transient failure used up the retries as pending and reprocesses it in the
// background: after failed attempts in retry_wait it completes once the
// cause passes; a message that keeps failing is dead after the budget; a
// permanent failure is dead at once and not retried.
func TestAutoReprocess(t *testing.T) {
	e := newEnv(t, 1)
	cfg := e.cfg
	cfg.Retry = consumer.RetryPolicy{Base: time.Millisecond, Cap: 2 * time.Millisecond, MaxAttempts: 2}
	cfg.AutoReprocess = consumer.AutoReprocess{Interval: 20 * time.Millisecond, Budget: 4, Base: 5 * time.Millisecond, Cap: 20 * time.Millisecond}
	var mu sync.Mutex
	calls := map[string]int{}
	h := func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
		mu.Lock()
		calls[msg.ID]++
		n := calls[msg.ID]
		mu.Unlock()
		switch {
		case msg.ID == "flaky" && n <= 4: // 2 in Run, then 2 reprocessing attempts
			return errInjected
		case msg.ID == "broken":
			return errInjected
		case msg.ID == "bad":
			return consumer.Permanent(errInjected)
		}
		return effect(ctx, tx, msg)
	}
	e.produce(rec{id: "flaky"}, rec{id: "broken"}, rec{id: "bad"}, rec{id: "fine"})
	r := e.start(cfg, h)
	rowOf := func(id string) int64 {
		return e.scalar(`SELECT coalesce(max(id), 0) FROM consumer_dead_letters WHERE message_id = $1`, id)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		for id, want := range map[string]string{"flaky": "completed", "broken": "dead", "bad": "dead"} {
			rowID := rowOf(id)
			if rowID == 0 {
				return fmt.Errorf("no dead letter of %s yet", id)
			}
			if s := e.state(rowID); s.Status != want {
				return fmt.Errorf("%s is %s, want %s", id, s.Status, want)
			}
		}
		return nil
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	for status, want := range map[string]float64{"completed": 1, "retry_wait": 2 + 3, "dead": 1} {
		if got := r.metric("reprocess_attempts_total", "status", status); got != want {
			t.Errorf("reprocess_attempts_total{status=%s} = %v, want %v", status, got, want)
		}
	}
	flaky, _ := e.history(rowOf("flaky"))
	want := "[pending>processing processing>retry_wait retry_wait>processing processing>retry_wait retry_wait>processing processing>completed]"
	if fmt.Sprint(flaky) != want {
		t.Errorf("flaky's history %v, want %s", flaky, want)
	}
	broken, trs := e.history(rowOf("broken"))
	if len(broken) != 8 || broken[len(broken)-1] != "processing>dead" || !strings.Contains(trs[len(trs)-1].Detail, "retry budget spent (4 attempts)") {
		t.Errorf("broken's history %v (last %+v), want 4 attempts, the last to dead with the budget spent", broken, trs[len(trs)-1])
	}
	if s := e.state(rowOf("broken")); s.Attempts != 4 {
		t.Errorf("broken: %d reprocessing attempts, want 4", s.Attempts)
	}
	if bad, _ := e.history(rowOf("bad")); len(bad) != 0 {
		t.Errorf("the permanent failure was reprocessed: %v", bad)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["flaky"] != 5 || calls["broken"] != 2+4 || calls["bad"] != 1 || calls["fine"] != 1 {
		t.Errorf("handler calls %v, want flaky 5, broken 6, bad 1, fine 1", calls)
	}
	if got := e.effects(); got["flaky"] != 1 || got["fine"] != 1 || len(got) != 2 {
		t.Errorf("effects %v, want flaky and fine once", got)
	}
}

// oldDDL is the consumer's dead-letter table as versions before the state
// model made it.
const oldDDL = `CREATE TABLE public.consumer_dead_letters (
    id                 bigserial   PRIMARY KEY,
    consumer_name      text        NOT NULL,
    message_id         text        NOT NULL,
    topic              text        NOT NULL,
    kafka_partition    int         NOT NULL,
    kafka_offset       bigint      NOT NULL,
    message_key        bytea,
    payload            bytea,
    headers            jsonb       NOT NULL DEFAULT '{}',
    message_time       timestamptz,
    error_code         text        NOT NULL,
    error_message      text        NOT NULL,
    retry_count        int         NOT NULL DEFAULT 0,
    first_failed_at    timestamptz NOT NULL,
    last_failed_at     timestamptz NOT NULL,
    correlation_id     text,
    schema_version     text,
    status             text        NOT NULL DEFAULT 'dead' CHECK (status IN ('dead', 'reprocessed')),
    reprocess_attempts int         NOT NULL DEFAULT 0,
    reprocessed_at     timestamptz,
    reprocessed_by     text,
    UNIQUE (consumer_name, message_id)
);
CREATE INDEX consumer_dead_letters_status_idx ON public.consumer_dead_letters (consumer_name, status, last_failed_at);`

// TestMigrateOldTable: a table of an older version, with dead and
// reprocessed rows, is refused by Run until migrated; Migrate (and the
// migration file) bring it onto the state model in place, reprocessed rows
// completed and dead ones dead, and running them again changes nothing.
func TestMigrateOldTable(t *testing.T) {
	ctx := context.Background()
	url, err := pg.CreateDatabase(ctx, "migrate_old_table")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	e := &env{t: t, pool: pool, cfg: consumer.Config{Name: "old", Pool: pool}}
	if _, err := pool.Exec(ctx, oldDDL); err != nil {
		t.Fatal(err)
	}
	old := map[string]int64{}
	for _, id := range []string{"d1", "d2", "r1"} {
		status := map[bool]string{true: "reprocessed", false: "dead"}[id == "r1"]
		err := pool.QueryRow(ctx, `INSERT INTO consumer_dead_letters (consumer_name, message_id, topic, kafka_partition, kafka_offset,
    headers, error_code, error_message, first_failed_at, last_failed_at, status, reprocess_attempts, reprocessed_by)
VALUES ('old', $1, 't', 0, 0, jsonb_build_object('id', $1::text), 'permanent', 'boom', now(), now(), $2, 1, 'alice') RETURNING id`,
			id, status).Scan(new(int64))
		if err != nil {
			t.Fatal(err)
		}
		old[id] = e.scalar(`SELECT id FROM consumer_dead_letters WHERE message_id = $1`, id)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE processed_messages (consumer_name text NOT NULL, message_id text NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (consumer_name, message_id))`); err != nil {
		t.Fatal(err)
	}
	cfg := e.cfg
	cfg.Brokers, cfg.GroupID, cfg.Topics = kafka.Brokers(), "old", []string{"old"}
	if err := consumer.Run(ctx, cfg, effectless); err == nil || !strings.Contains(err.Error(), consumer.MigrationFile) {
		t.Fatalf("Run on a table of an older version = %v, want an error naming %s", err, consumer.MigrationFile)
	}
	if _, err := consumer.Reprocess(ctx, e.cfg, effectless, "alice", old["d1"]); err == nil {
		t.Fatal("Reprocess on a table of an older version worked; want an error")
	}

	b, err := os.ReadFile(filepath.Join("..", consumer.MigrationFile))
	if err != nil {
		t.Fatal(err)
	}
	for i, apply := range []func() error{
		func() error { return consumer.Migrate(ctx, pool, "") },
		func() error { return consumer.Migrate(ctx, pool, "") },
		func() error { _, err := pool.Exec(ctx, string(b)); return err },
	} {
		if err := apply(); err != nil {
			t.Fatalf("migration %d: %v", i, err)
		}
		for id, want := range map[string]string{"d1": "dead", "d2": "dead", "r1": "completed"} {
			if s := e.state(old[id]); s.Status != want || s.Attempts != 1 || s.ReprocessedBy == nil || *s.ReprocessedBy != "alice" {
				t.Fatalf("after migration %d: %s is %+v, want %s with its attempt and actor kept", i, id, s, want)
			}
		}
	}
	var checks []string
	rows, err := pool.Query(ctx, `SELECT conname FROM pg_constraint WHERE conrelid = 'consumer_dead_letters'::regclass AND contype = 'c'`)
	if err != nil {
		t.Fatal(err)
	}
	checks, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(checks) != "[consumer_dead_letters_state_check]" {
		t.Errorf("CHECK constraints %v, want only the state model's", checks)
	}
	if _, err := pool.Exec(ctx, `UPDATE consumer_dead_letters SET status = 'retry_wait' WHERE id = $1`, old["d2"]); err != nil {
		t.Errorf("the new constraint refuses retry_wait: %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE consumer_dead_letters SET status = 'lost' WHERE id = $1`, old["d2"]); err == nil {
		t.Error("the new constraint accepts 'lost'")
	}

	// The migrated table works: a dead letter is reprocessed, a completed
	// one skipped.
	res, err := consumer.Reprocess(ctx, e.cfg, effectless, "bob", old["d1"], old["r1"])
	if err != nil || len(res) != 2 || res[0].Outcome != consumer.Reprocessed || res[1].Outcome != consumer.ReprocessSkipped {
		t.Fatalf("Reprocess on the migrated table = %+v, %v", res, err)
	}
	if steps, _ := e.history(old["d1"]); fmt.Sprint(steps) != "[dead>processing processing>completed]" {
		t.Errorf("history %v", steps)
	}
}

// effectless is a handler that succeeds and changes nothing.
func effectless(context.Context, pgx.Tx, consumer.Message) error { return nil }
