package main

// End-to-end tests of the dead letters' reprocessing (issue 13) with the built
// binary: concurrent `dlq replay` processes, a replay killed with its claims,
// --event-id and --topic, and `run --dlq-auto-retry` with its metrics.

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// deadLetters returns the default dead-letter store of f's database, its
// tables created, and the pool under it.
func (f *fixture) deadLetters(ctx context.Context, t *testing.T) (*deadletter.Store, *pgxpool.Pool) {
	t.Helper()
	pool, err := pgxpool.New(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := deadletter.NewStore(pool, "")
	if err := s.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	return s, pool
}

// addLetters stores n letters ev-000… for topic, as the relay would have.
func addLetters(ctx context.Context, t *testing.T, s *deadletter.Store, topic string, n int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("ev-%03d", i)
		err := s.Add(ctx, deadletter.Letter{
			EventID: id, AggregateType: "order", AggregateID: fmt.Sprint("o-", i%7), EventType: "OrderPlaced",
			Key: []byte(fmt.Sprint("o-", i%7)), Payload: []byte(fmt.Sprintf(`{"n": %d}`, i)),
			Headers: map[string]string{sink.HeaderID: id}, Topic: topic,
			ErrorCode: "message_too_large", ErrorMessage: "message_too_large: 1 MB", RelayName: "e2e",
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// idCounts counts the records of topic by event id.
func idCounts(ctx context.Context, t *testing.T, brokers []string, topic string) (map[string]int, int) {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	recs, err := sandbox.ReadAll(rctx, brokers, topic)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, r := range recs {
		n[r.Headers[sink.HeaderID]]++
	}
	return n, len(recs)
}

// statusCounts counts the letters of s by status.
func statusCounts(ctx context.Context, t *testing.T, s *deadletter.Store) map[string]int64 {
	t.Helper()
	c, err := s.StatusCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var replayLine = regexp.MustCompile(`replay (\d+) \(dlq, by ([^)]*)\): selected (\d+), published (\d+), skipped (\d+), failed (\d+)`)

// replayCounts parses the summary line dlq replay prints.
func replayCounts(t *testing.T, out string) (published, skipped, failed int) {
	t.Helper()
	m := replayLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no replay summary in:\n%s", out)
	}
	p, _ := strconv.Atoi(m[4])
	s, _ := strconv.Atoi(m[5])
	f, _ := strconv.Atoi(m[6])
	return p, s, f
}

// TestDLQConcurrentReplays: two `cdc-relay dlq replay` processes started at
// the same moment over 300 letters publish each exactly once between them
// (read back with franz-go), both take part, and every letter is completed
// with one completion in its history.
func TestDLQConcurrentReplays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	s, pool := f.deadLetters(ctx, t)
	const n = 300
	addLetters(ctx, t, s, f.topic, n)

	type proc struct {
		cmd            *exec.Cmd
		stdout, stderr sandbox.Buffer
	}
	procs := make([]*proc, 2)
	for i := range procs {
		p := &proc{}
		// 100 letters a second each: one replay alone would take 3s, so the
		// second one starts long before the first could be done.
		p.cmd = exec.CommandContext(ctx, relayBin, "dlq", "replay", "--pg-url", f.url,
			"--kafka-brokers", strings.Join(f.brokers, ","), "--rate", "100", "--batch-size", "10",
			"--actor", fmt.Sprint("replayer-", i))
		p.cmd.Env = cleanEnv()
		p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
		procs[i] = p
	}
	for _, p := range procs {
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	total := 0
	for i, p := range procs {
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("replay %d: %v\n%s%s", i, err, p.stdout.String(), p.stderr.String())
		}
		published, skipped, failed := replayCounts(t, p.stdout.String())
		t.Logf("replayer-%d: published %d, skipped %d, failed %d", i, published, skipped, failed)
		if published == 0 || failed != 0 || published+skipped != n {
			t.Errorf("replayer-%d: published %d, skipped %d, failed %d; want a share of the %d letters, the rest skipped",
				i, published, skipped, failed, n)
		}
		total += published
	}
	if total != n {
		t.Errorf("the replays published %d letters together, want %d", total, n)
	}

	counts, records := idCounts(ctx, t, f.brokers, f.topic)
	for id, c := range counts {
		if c != 1 {
			t.Errorf("event %s is in Kafka %d times", id, c)
		}
	}
	if len(counts) != n || records != n {
		t.Errorf("Kafka has %d records of %d events, want %d of %d", records, len(counts), n, n)
	}
	if c := statusCounts(ctx, t, s); c[deadletter.StatusCompleted] != n {
		t.Errorf("letters by status after the replays: %v, want all %d completed", c, n)
	}
	var completions, letters int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT dead_letter_id) FROM cdc_relay_dead_letters_transitions
WHERE to_status = 'completed'`).Scan(&completions, &letters); err != nil {
		t.Fatal(err)
	}
	if completions != n || letters != n {
		t.Errorf("%d completions of %d letters in the history, want one for each of %d", completions, letters, n)
	}
}

// TestDLQReplayCrashedLease: a `dlq replay` killed with -9 while it publishes
// slowly leaves its claims; once its lease expired, a second replay takes them
// over and completes every letter. Nothing is lost, and what is in Kafka twice
// is at most the batch the first replay had in flight (at-least-once: sent,
// acknowledged, not yet marked when it died).
func TestDLQReplayCrashedLease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	s, pool := f.deadLetters(ctx, t)
	const n, batch = 40, 5
	addLetters(ctx, t, s, f.topic, n)
	brokers := strings.Join(f.brokers, ",")

	first := exec.CommandContext(ctx, relayBin, "dlq", "replay", "--pg-url", f.url, "--kafka-brokers", brokers,
		"--rate", "10", "--batch-size", fmt.Sprint(batch), "--lease", "3s", "--actor", "doomed")
	first.Env = cleanEnv()
	var out sandbox.Buffer
	first.Stdout, first.Stderr = &out, &out
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		if c := statusCounts(ctx, t, s); c[deadletter.StatusCompleted] < 8 {
			return fmt.Errorf("%d letters completed", c[deadletter.StatusCompleted])
		}
		return nil
	})
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	before := statusCounts(ctx, t, s)
	held := before[deadletter.StatusProcessing]
	t.Logf("after kill -9: %v", before)
	if held == 0 || held > batch {
		t.Fatalf("the killed replay holds %d letters, want 1 to %d (its claimed page)\n%s", held, batch, out.String())
	}

	// A replay now skips them: the lease still holds.
	code, stdout, stderr := runCommand(ctx, t, 60*time.Second, "dlq", "replay", "--pg-url", f.url, "--kafka-brokers", brokers,
		"--dry-run", "--actor", "too-early")
	if code != 0 {
		t.Fatalf("dry run: exit %d\n%s%s", code, stdout, stderr)
	}
	if m := regexp.MustCompile(`selected \d+, published 0, skipped (\d+)`).FindStringSubmatch(stdout); m == nil || m[1] != fmt.Sprint(int64(held)+before[deadletter.StatusCompleted]) {
		t.Errorf("dry run while the lease holds: want %d held + %d completed skipped:\n%s", held, before[deadletter.StatusCompleted], stdout)
	}

	// Once the lease expired, the next replay takes every letter over.
	testenv.Eventually(t, 30*time.Second, func() error {
		var live int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM cdc_relay_dead_letters WHERE status = 'processing' AND claimed_until > now()").Scan(&live); err != nil {
			t.Fatal(err)
		}
		if live > 0 {
			return fmt.Errorf("%d leases of the killed replay still hold", live)
		}
		return nil
	})
	code, stdout, stderr = runCommand(ctx, t, 90*time.Second, "dlq", "replay", "--pg-url", f.url, "--kafka-brokers", brokers,
		"--rate", "0", "--actor", "second")
	if code != 0 {
		t.Fatalf("second replay: exit %d\n%s%s", code, stdout, stderr)
	}
	published, skipped, _ := replayCounts(t, stdout)
	if int64(published) != int64(n)-before[deadletter.StatusCompleted] || int64(skipped) != before[deadletter.StatusCompleted] {
		t.Errorf("second replay published %d, skipped %d; want the %d not completed, skipping the %d completed",
			published, skipped, int64(n)-before[deadletter.StatusCompleted], before[deadletter.StatusCompleted])
	}
	if c := statusCounts(ctx, t, s); c[deadletter.StatusCompleted] != n {
		t.Errorf("letters by status: %v, want all %d completed", c, n)
	}
	var takenOver int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM cdc_relay_dead_letters_transitions
WHERE from_status = 'processing' AND to_status = 'processing' AND detail LIKE 'took over: the lease of replay % expired at %'`).Scan(&takenOver); err != nil {
		t.Fatal(err)
	}
	if int64(takenOver) != held {
		t.Errorf("%d take-overs in the history, want the %d letters the killed replay held", takenOver, held)
	}

	counts, records := idCounts(ctx, t, f.brokers, f.topic)
	if len(counts) != n {
		t.Errorf("Kafka has %d of the %d events: letters were lost", len(counts), n)
	}
	dups := records - len(counts)
	t.Logf("%d records for %d events: %d duplicates (the killed replay's batch in flight)", records, len(counts), dups)
	if dups > batch {
		t.Errorf("%d duplicates, more than the batch of %d the killed replay could have had in flight", dups, batch)
	}
}

// TestDLQEventIDAndTopicOverride: --event-id selects letters in list, show and
// replay; a letter whose template made an invalid topic fails until replayed
// with --topic, which delivers it there and is recorded in the history.
func TestDLQEventIDAndTopicOverride(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	s, _ := f.deadLetters(ctx, t)
	addLetters(ctx, t, s, f.topic, 3)
	bad := deadletter.Letter{
		EventID: "bad-topic", AggregateType: "Order Items", AggregateID: "o-9", EventType: "OrderPlaced",
		Key: []byte("o-9"), Payload: []byte(`{"n": 9}`), Headers: map[string]string{sink.HeaderID: "bad-topic"},
		Topic: "outbox.{aggregate_type}", ErrorCode: "invalid_topic", ErrorMessage: `invalid_topic: "outbox.Order Items"`,
	}
	if err := s.Add(ctx, bad); err != nil {
		t.Fatal(err)
	}
	pg := []string{"--pg-url", f.url}
	brokers := []string{"--kafka-brokers", strings.Join(f.brokers, ","), "--rate", "0"}
	mustCLI := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := runCommand(ctx, t, 60*time.Second, args...)
		if code != 0 {
			t.Fatalf("cdc-relay %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
		}
		return stdout
	}
	listed := func(args ...string) []string {
		t.Helper()
		var got struct {
			Letters []struct {
				EventID string `json:"event_id"`
			} `json:"letters"`
		}
		out := mustCLI(append(append([]string{"dlq", "list", "--json"}, pg...), args...)...)
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("dlq list --json: %v\n%s", err, out)
		}
		var ids []string
		for _, l := range got.Letters {
			ids = append(ids, l.EventID)
		}
		return ids
	}
	if got := listed("--event-id", "ev-002", "--event-id", "bad-topic"); strings.Join(got, ",") != "ev-002,bad-topic" {
		t.Errorf("dlq list --event-id ev-002 --event-id bad-topic: %v", got)
	}
	if got := listed("--topic", f.topic); strings.Join(got, ",") != "ev-000,ev-001,ev-002" {
		t.Errorf("dlq list --topic %s: %v", f.topic, got)
	}
	if out := mustCLI(append([]string{"dlq", "show", "--event-id", "bad-topic"}, pg...)...); !strings.Contains(out, "outbox.{aggregate_type}") {
		t.Errorf("dlq show --event-id bad-topic:\n%s", out)
	}

	// By event id: only that letter.
	out := mustCLI(append(append([]string{"dlq", "replay", "--event-id", "ev-001"}, pg...), brokers...)...)
	if p, _, _ := replayCounts(t, out); p != 1 {
		t.Errorf("replay --event-id ev-001 published %d", p)
	}
	if counts, _ := idCounts(ctx, t, f.brokers, f.topic); len(counts) != 1 || counts["ev-001"] != 1 {
		t.Errorf("after replay --event-id ev-001, Kafka has %v", counts)
	}

	// The invalid topic fails (exit 1, retry_wait) until --topic names one.
	code, stdout, _ := runCommand(ctx, t, 60*time.Second, append(append([]string{"dlq", "replay", "--event-id", "bad-topic"}, pg...), brokers...)...)
	if code == 0 || !strings.Contains(stdout, "invalid_topic") {
		t.Errorf("replay of the bad topic: exit %d, want a failure naming invalid_topic:\n%s", code, stdout)
	}
	if l := letterOf(t, s, "bad-topic"); l.Status != deadletter.StatusRetryWait || l.Attempts != 1 {
		t.Errorf("after the failed replay: %s, %d attempts; want retry_wait, 1", l.Status, l.Attempts)
	}
	fixed := f.topic + ".order-items"
	code, stdout, stderr := runCommand(ctx, t, 60*time.Second, "dlq", "replay", "--event-id", "bad-topic", "--topic", "outbox.Order Items",
		"--pg-url", f.url, "--dry-run")
	if code == 0 || !strings.Contains(stderr+stdout, "not a topic Kafka accepts") {
		t.Errorf("replay --topic with an invalid name: exit %d\n%s%s", code, stdout, stderr)
	}
	out = mustCLI(append(append([]string{"dlq", "replay", "--event-id", "bad-topic", "--topic", fixed}, pg...), brokers...)...)
	if p, _, _ := replayCounts(t, out); p != 1 {
		t.Errorf("replay --topic %s published %d", fixed, p)
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	recs, err := sandbox.ReadAll(rctx, f.brokers, fixed)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Headers[sink.HeaderID] != "bad-topic" || string(recs[0].Key) != "o-9" || recs[0].Headers[replay.HeaderReplay] == "" {
		t.Fatalf("%s has %d records (%v), want bad-topic with its key and the replay header", fixed, len(recs), sandbox.IDs(recs))
	}
	if l := letterOf(t, s, "bad-topic"); l.Status != deadletter.StatusCompleted || l.Topic != "outbox.{aggregate_type}" {
		t.Errorf("after the override: %s, topic %q; want completed, its intended topic kept", l.Status, l.Topic)
	}
	var replays []replay.Entry
	if err := json.Unmarshal([]byte(mustCLI(append([]string{"dlq", "history", "--json"}, pg...)...)), &replays); err != nil {
		t.Fatal(err)
	}
	if len(replays) != 3 || replays[0].TopicOverride != fixed || replays[1].TopicOverride != "" {
		t.Errorf("dlq history --json: %+v; want the last replay with the topic override %s", replays, fixed)
	}
	hist := mustCLI(append([]string{"dlq", "history", "--event-id", "bad-topic"}, pg...)...)
	t.Logf("dlq history --event-id bad-topic:\n%s", hist)
	var ts []deadletter.Transition
	if err := json.Unmarshal([]byte(mustCLI(append([]string{"dlq", "history", "--event-id", "bad-topic", "--json"}, pg...)...)), &ts); err != nil {
		t.Fatal(err)
	}
	var path []string
	for _, tr := range ts {
		path = append(path, tr.To)
	}
	if strings.Join(path, ",") != "processing,retry_wait,processing,completed" {
		t.Errorf("transitions of bad-topic: %v", path)
	} else if c := ts[3]; c.Topic != fixed || c.Detail != "topic override: published to "+fixed+" instead of outbox.{aggregate_type}" {
		t.Errorf("the completion: topic %q, detail %q", c.Topic, c.Detail)
	}
}

func letterOf(t *testing.T, s *deadletter.Store, eventID string) deadletter.Letter {
	t.Helper()
	ls, err := s.List(t.Context(), deadletter.Filter{EventIDs: []string{eventID}})
	if err != nil || len(ls) != 1 {
		t.Fatalf("letter of %s: %d, %v", eventID, len(ls), err)
	}
	return ls[0]
}

// TestDLQAutoRetry runs the relay with --dlq-auto-retry over a scripted
// scenario: two events too large for their topic, which stays so, and one too
// large for a topic whose limit is raised after its first failed retry. The
// first two are retried up to the budget, then dead; the third is completed.
// Then every new metric has the value the scenario implies, as scraped from
// /metrics: retries by result (retry_wait also equal to the history's count),
// dead letters dead, letters by status, the backlog.
func TestDLQAutoRetry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	s, pool := f.deadLetters(ctx, t)
	stuck, fixable := f.topic+".stuck", f.topic+".fixable"
	for _, topic := range []string{stuck, fixable} {
		if err := f.kafka.CreateTopic(ctx, topic, 1); err != nil {
			t.Fatal(err)
		}
		if err := f.kafka.SetTopicConfig(ctx, topic, "max.message.bytes", "2048"); err != nil {
			t.Fatal(err)
		}
	}
	const budget = 6
	r := newRelay(t, f.relayArgs("--topic", f.topic+".{aggregate_type}", "--dlq-auto-retry",
		"--dlq-auto-retry-budget", fmt.Sprint(budget), "--dlq-auto-retry-base", "500ms", "--dlq-auto-retry-cap", "1s",
		"--dlq-auto-retry-interval", "100ms", "--monitor-interval", "100ms"))
	r.Start()
	r.WaitReady(30 * time.Second)
	conn := f.connect(ctx, t)
	if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES
    ('stuck', 's-1', 'Big', jsonb_build_object('pad', repeat('x', 8000))),
    ('stuck', 's-2', 'Big', jsonb_build_object('pad', repeat('y', 8000))),
    ('fixable', 'f-1', 'Big', jsonb_build_object('pad', repeat('z', 8000))),
    ('stuck', 's-3', 'Small', '{}'), ('fixable', 'f-2', 'Small', '{}')`); err != nil {
		t.Fatal(err)
	}
	var fixID string
	testenv.Eventually(t, 60*time.Second, func() error {
		ls, err := s.List(ctx, deadletter.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			if l.AggregateID == "f-1" {
				fixID = l.EventID
				if l.Attempts >= 1 && l.Status == deadletter.StatusRetryWait {
					return nil
				}
			}
		}
		return fmt.Errorf("%d dead letters, the fixable one not failed again yet", len(ls))
	})
	if err := f.kafka.SetTopicConfig(ctx, fixable, "max.message.bytes", "1048576"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		c := statusCounts(ctx, t, s)
		if c[deadletter.StatusDead] != 2 || c[deadletter.StatusCompleted] != 1 {
			return fmt.Errorf("letters by status: %v", c)
		}
		return nil
	})
	fix := letterOf(t, s, fixID)
	if fix.Attempts < 2 || fix.Attempts >= budget {
		t.Fatalf("the fixable letter completed after %d attempts, want 2 to %d", fix.Attempts, budget-1)
	}
	for _, agg := range []string{"s-1", "s-2"} {
		ls, _ := s.List(ctx, deadletter.Filter{AggregateID: agg})
		if len(ls) != 1 || ls[0].Status != deadletter.StatusDead || ls[0].Attempts != budget {
			t.Errorf("letter of %s: %+v, want dead after %d attempts", agg, ls, budget)
		}
	}

	// Kafka: the fixable topic has both its events, the big one replayed.
	counts, _ := idCounts(ctx, t, f.brokers, fixable)
	if len(counts) != 2 || counts[fixID] != 1 {
		t.Errorf("%s has %v, want the small event and %s once", fixable, counts, fixID)
	}
	if counts, _ := idCounts(ctx, t, f.brokers, stuck); len(counts) != 1 {
		t.Errorf("%s has %v, want only the small event", stuck, counts)
	}

	// The metrics of the scenario: 2·(budget-1) failed attempts of the stuck
	// letters and fix.Attempts-1 of the fixable one went to retry_wait.
	var retryWaits int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM cdc_relay_dead_letters_transitions WHERE to_status = 'retry_wait'").Scan(&retryWaits); err != nil {
		t.Fatal(err)
	}
	wantRetryWait := 2*(budget-1) + fix.Attempts - 1
	t.Logf("the fixable letter completed at attempt %d; %d transitions to retry_wait", fix.Attempts, retryWaits)
	if retryWaits != wantRetryWait {
		t.Errorf("%d transitions to retry_wait in the history, want %d", retryWaits, wantRetryWait)
	}
	want := map[string]float64{
		`cdc_relay_dead_letter_retries_total{result="retry_wait"}`: float64(wantRetryWait),
		`cdc_relay_dead_letter_retries_total{result="dead"}`:       2,
		`cdc_relay_dead_letter_retries_total{result="completed"}`:  1,
		`cdc_relay_dead_letters_dead_total`:                        2,
		`cdc_relay_dead_letters_total{code="message_too_large"}`:   3,
		`cdc_relay_dead_letters_by_status{status="dead"}`:          2,
		`cdc_relay_dead_letters_by_status{status="completed"}`:     1,
		`cdc_relay_dead_letters_by_status{status="pending"}`:       0,
		`cdc_relay_dead_letters_by_status{status="retry_wait"}`:    0,
		`cdc_relay_dead_letters_by_status{status="processing"}`:    0,
		`cdc_relay_dead_letter_backlog`:                            2,
	}
	// The gauges follow the table every --monitor-interval.
	testenv.Eventually(t, 30*time.Second, func() error {
		var wrong []string
		for series, v := range want {
			if got := r.Metric(series); got != v {
				wrong = append(wrong, fmt.Sprintf("%s = %v, want %v", series, got, v))
			}
		}
		if len(wrong) > 0 {
			return fmt.Errorf("%s", strings.Join(wrong, "; "))
		}
		return nil
	})
	n := 0
	for _, l := range r.LogRecords() {
		if msg, _ := l["message"].(string); strings.Contains(msg, "automatic retries gave up on a dead letter") {
			n++
		}
	}
	if n != 2 {
		t.Errorf("%d log lines for letters gone dead, want 2", n)
	}
	r.Stop(15 * time.Second)
}
