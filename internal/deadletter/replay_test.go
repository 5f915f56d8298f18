package deadletter_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/testenv/cetest"
)

// newPublisher returns a publisher to the package's broker, closed with t.
func newPublisher(t *testing.T) *sink.Publisher {
	t.Helper()
	return newPublisherWith(t, sink.Config{Brokers: kafka.Brokers()})
}

// newPublisherWith is newPublisher with cfg, e.g. a record format.
func newPublisherWith(t *testing.T, cfg sink.Config) *sink.Publisher {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p, err := sink.NewPublisher(ctx, cfg)
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

// seed adds n letters e-0..e-(n-1) for topic to s, aggregate "A" for even and
// "B" for odd numbers.
func seed(t *testing.T, s *deadletter.Store, topic string, n int) {
	t.Helper()
	for i := range n {
		agg := "A"
		if i%2 == 1 {
			agg = "B"
		}
		l := letter(fmt.Sprintf("e-%02d", i), "message_too_large", agg, "OrderPlaced", base.Add(time.Duration(i)*time.Second))
		l.Topic = topic
		l.Headers[sink.HeaderCommitTime] = "2024-05-01T09:00:00Z"
		l.Headers[sink.HeaderCommitLSN] = "0/10"
		l.CommitLSN = 0x10
		mustAdd(t, s, l)
	}
}

func checkResult(t *testing.T, what string, got replay.Outcome, want replay.Counts) {
	t.Helper()
	if got.Counts != want {
		t.Errorf("%s: counts %+v, want %+v (failures %+v)", what, got.Counts, want, got.Failures)
	}
}

func TestReplayDeadLetters(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	p := newPublisher(t)
	topic := unique("replay.basic")
	seed(t, s, topic, 6)

	// First replay: every letter published once, with its id and the replay id.
	res, err := s.ReplayDeadLetters(ctx, p, deadletter.ReplayOptions{Actor: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "first replay", res, replay.Counts{Selected: 6, Published: 6})
	recs := testenv.MustReadAll(t, kafka, topic)
	if want := []string{"e-00", "e-01", "e-02", "e-03", "e-04", "e-05"}; !slices.Equal(sandbox.IDs(recs), want) {
		t.Fatalf("Kafka has %v, want %v", sandbox.IDs(recs), want)
	}
	lastOf := map[string]int{} // per key, the last event number seen: order within a key
	for _, r := range recs {
		id := r.Headers[sink.HeaderID]
		n, _ := strconv.Atoi(strings.TrimPrefix(id, "e-"))
		wantKey := map[bool]string{true: "A", false: "B"}[n%2 == 0]
		want := map[string]string{
			"id": id, "event_type": "OrderPlaced", "aggregate_type": "order", "commit_lsn": "0/10",
			"commit_time": "2024-05-01T09:00:00Z", "tenant": "acme", replay.HeaderReplay: fmt.Sprint(res.ReplayID),
		}
		if string(r.Key) != wantKey || string(r.Value) != fmt.Sprintf(`{"n": %q}`, id) || fmt.Sprint(r.Headers) != fmt.Sprint(want) {
			t.Errorf("record %s: key %q, value %s, headers %v; want key %q, headers %v", id, r.Key, r.Value, r.Headers, wantKey, want)
		}
		if prev, ok := lastOf[string(r.Key)]; ok && prev > n {
			t.Errorf("key %s: event %d after %d", r.Key, n, prev)
		}
		lastOf[string(r.Key)] = n
	}
	letters, _ := s.List(ctx, deadletter.Filter{})
	for _, l := range letters {
		if l.Status != deadletter.StatusCompleted || l.ReplayCount != 1 || l.ReplayedAt == nil || l.Attempts != 1 ||
			l.ClaimedBy != "" || l.ClaimedUntil != nil {
			t.Errorf("letter %s after replay: status %q, replay_count %d, attempts %d, claimed by %q until %v",
				l.EventID, l.Status, l.ReplayCount, l.Attempts, l.ClaimedBy, l.ClaimedUntil)
		}
	}

	// History: the replay and one result per letter.
	replays, err := s.History().List(ctx, 0)
	if err != nil || len(replays) != 1 {
		t.Fatalf("ListReplays = %+v, %v", replays, err)
	}
	r := replays[0]
	if r.ID != res.ReplayID || r.Kind != replay.KindDLQ || r.Actor != "alice" || r.FinishedAt == nil ||
		r.Counts != res.Counts || r.DryRun || r.Forced || len(r.Filters) != 0 {
		t.Errorf("history entry = %+v", r)
	}
	events, err := s.History().Events(ctx, res.ReplayID)
	if err != nil || len(events) != 6 {
		t.Fatalf("ListReplayEvents = %d, %v; want 6", len(events), err)
	}
	for _, e := range events {
		if e.Result != replay.ResultPublished || e.DeadLetterID == 0 || e.Error != "" {
			t.Errorf("history event = %+v", e)
		}
	}

	// Second replay: nothing to do.
	res2, err := s.ReplayDeadLetters(ctx, p, deadletter.ReplayOptions{Actor: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "second replay", res2, replay.Counts{Selected: 6, Skipped: 6})
	if n := len(testenv.MustReadAll(t, kafka, topic)); n != 6 {
		t.Errorf("second replay published: %d records, want still 6", n)
	}
	if events, _ := s.History().Events(ctx, res2.ReplayID); len(events) != 6 || events[0].Result != replay.ResultSkipped {
		t.Errorf("second replay history = %+v", events)
	}

	// Dry run with force: nothing published, everything recorded.
	res3, err := s.ReplayDeadLetters(ctx, p, deadletter.ReplayOptions{Force: true, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "dry run", res3, replay.Counts{Selected: 6})
	if res3.DryRun != 6 {
		t.Errorf("dry run would publish %d, want 6", res3.DryRun)
	}
	if n := len(testenv.MustReadAll(t, kafka, topic)); n != 6 {
		t.Errorf("dry run published: %d records, want still 6", n)
	}
	if events, _ := s.History().Events(ctx, res3.ReplayID); len(events) != 6 || events[5].Result != replay.ResultDryRun {
		t.Errorf("dry run history = %+v", events)
	}

	// Forced: published again, filtered to aggregate A.
	res4, err := s.ReplayDeadLetters(ctx, p, deadletter.ReplayOptions{Force: true, Filter: deadletter.Filter{AggregateID: "A"}})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "forced replay", res4, replay.Counts{Selected: 3, Published: 3})
	recs = testenv.MustReadAll(t, kafka, topic)
	var again []string
	for _, r := range recs {
		if r.Headers[replay.HeaderReplay] == fmt.Sprint(res4.ReplayID) {
			again = append(again, r.Headers[sink.HeaderID])
		}
	}
	if slices.Sort(again); !slices.Equal(again, []string{"e-00", "e-02", "e-04"}) {
		t.Errorf("forced replay of aggregate A published %v", again)
	}
	if l := byEventID(t, s, "e-02"); l.ReplayCount != 2 {
		t.Errorf("e-02 replay_count = %d, want 2", l.ReplayCount)
	}
	if l := byEventID(t, s, "e-01"); l.ReplayCount != 1 {
		t.Errorf("e-01 replay_count = %d, want 1", l.ReplayCount)
	}

	replays, _ = s.History().List(ctx, 2)
	if len(replays) != 2 || replays[0].ID != res4.ReplayID || !replays[0].Forced || replays[1].ID != res3.ReplayID ||
		!replays[1].DryRun || replays[0].Filters["aggregate_id"] != "A" {
		t.Errorf("ListReplays(2) = %+v", replays)
	}
}

func TestReplayFilters(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	topic := unique("replay.filters")
	seed(t, s, topic, 10)
	other := letter("x-1", "invalid_topic", "A", "OrderPaid", base.Add(time.Hour))
	other.Topic = topic
	mustAdd(t, s, other)
	ids := func(events ...string) []int64 {
		var out []int64
		for _, e := range events {
			out = append(out, byEventID(t, s, e).ID)
		}
		return out
	}
	// Dry runs, each on the same letters: which were selected?
	tests := []struct {
		name string
		f    deadletter.Filter
		want []string
	}{
		{"ids", deadletter.Filter{IDs: ids("e-03", "e-07")}, []string{"e-03", "e-07"}},
		{"error code", deadletter.Filter{ErrorCode: "invalid_topic"}, []string{"x-1"}},
		{"event type", deadletter.Filter{EventType: "OrderPaid"}, []string{"x-1"}},
		{"aggregate and time", deadletter.Filter{AggregateID: "B", Since: base.Add(3 * time.Second), Until: base.Add(8 * time.Second)}, []string{"e-03", "e-05", "e-07"}},
		{"limit", deadletter.Filter{Limit: 4}, []string{"e-00", "e-01", "e-02", "e-03"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := s.ReplayDeadLetters(ctx, nil, deadletter.ReplayOptions{Filter: tt.f, DryRun: true, BatchSize: 3})
			if err != nil {
				t.Fatal(err)
			}
			events, err := s.History().Events(ctx, res.ReplayID)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range events {
				got = append(got, e.EventID)
			}
			if !slices.Equal(got, tt.want) || res.Selected != len(tt.want) || res.DryRun != len(tt.want) {
				t.Errorf("selected %v (counts %+v), want %v", got, res.Counts, tt.want)
			}
		})
	}
	if _, err := s.ReplayDeadLetters(ctx, nil, deadletter.ReplayOptions{}); err == nil {
		t.Error("a replay without publisher that is not a dry run started")
	}
}

func TestReplayFailures(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	p := newPublisher(t)
	topic := unique("replay.failures")
	seed(t, s, topic, 2)
	noKey := letter("no-key", "empty_key", "", "T", base)
	noKey.Key, noKey.Topic = nil, topic
	badTopic := letter("bad-topic", "invalid_topic", "A", "T", base)
	badTopic.Topic = "outbox.{aggregate_type}"
	mustAdd(t, s, noKey, badTopic)

	res, err := s.ReplayDeadLetters(ctx, p, deadletter.ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "replay", res, replay.Counts{Selected: 4, Published: 2, Failed: 2})
	failed := map[string]string{}
	for _, f := range res.Failures {
		failed[f.EventID] = f.Error
	}
	if !strings.Contains(failed["no-key"], "empty_key") || !strings.Contains(failed["bad-topic"], "invalid_topic") {
		t.Errorf("failures = %v", failed)
	}
	// Failed attempts: retry_wait (the automatic retries' state), with the
	// error and the time of the next attempt, no lease.
	for _, e := range []string{"no-key", "bad-topic"} {
		l := byEventID(t, s, e)
		if l.Status != deadletter.StatusRetryWait || l.Attempts != 1 || l.LastAttemptError == "" || l.LastAttemptAt == nil ||
			l.NextAttemptAt == nil || l.ClaimedBy != "" || l.ReplayCount != 0 {
			t.Errorf("failed letter %s: status %s, attempts %d, error %q, next attempt %v, claimed by %q",
				e, l.Status, l.Attempts, l.LastAttemptError, l.NextAttemptAt, l.ClaimedBy)
		}
	}
	if got := sandbox.IDs(testenv.MustReadAll(t, kafka, topic)); !slices.Equal(got, []string{"e-00", "e-01"}) {
		t.Errorf("Kafka has %v", got)
	}
	events, _ := s.History().Events(ctx, res.ReplayID)
	var nFailed int
	for _, e := range events {
		if e.Result == replay.ResultFailed && e.Error != "" {
			nFailed++
		}
	}
	if len(events) != 4 || nFailed != 2 {
		t.Errorf("history = %+v", events)
	}
}

func TestReplayRate(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	p := newPublisher(t)
	topic := unique("replay.rate")
	seed(t, s, topic, 40)

	const rate = 20.0
	start := time.Now()
	res, err := s.ReplayDeadLetters(ctx, p, deadletter.ReplayOptions{Rate: rate, BatchSize: 10})
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "rate-limited replay", res, replay.Counts{Selected: 40, Published: 40})
	got := 40 / elapsed.Seconds()
	t.Logf("40 events at --rate %g took %v: %.1f events/s", rate, elapsed, got)
	// The limiter starts empty, so 40 events take about 40/rate = 2s. Allow a
	// slow machine to be slower, never faster.
	if got > rate*1.1 || got < rate/2 || elapsed < 1500*time.Millisecond || elapsed > 4*time.Second {
		t.Errorf("replay ran at %.1f events/s (%v for 40), want about %g", got, elapsed, rate)
	}
	if n := len(testenv.MustReadAll(t, kafka, topic)); n != 40 {
		t.Errorf("Kafka has %d records, want 40", n)
	}
}

func TestReplayCanceled(t *testing.T) {
	s := newStore(t)
	p := newPublisher(t)
	topic := unique("replay.cancel")
	seed(t, s, topic, 20)
	ctx, cancel := context.WithTimeout(t.Context(), 700*time.Millisecond)
	defer cancel()
	res, err := s.ReplayDeadLetters(ctx, p, deadletter.ReplayOptions{Rate: 10, BatchSize: 5})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("canceled replay returned %v, want the context's error", err)
	}
	if res.Published == 0 || res.Published >= 20 {
		t.Errorf("canceled replay published %d of 20", res.Published)
	}
	replays, _ := s.History().List(t.Context(), 1)
	if len(replays) != 1 || replays[0].FinishedAt == nil || replays[0].Counts != res.Counts {
		t.Errorf("history of the canceled replay = %+v, result %+v", replays, res.Counts)
	}
	replayed, _ := s.List(t.Context(), deadletter.Filter{Status: deadletter.StatusReplayed})
	if len(replayed) != res.Published {
		t.Errorf("%d letters marked replayed, %d published", len(replayed), res.Published)
	}
	events, _ := s.History().Events(t.Context(), res.ReplayID)
	if len(events) != res.Selected {
		t.Errorf("%d results recorded for %d selected letters", len(events), res.Selected)
	}
	// The replay let go of every claim: what it did not publish is pending
	// again, with no attempt counted, for the next replay.
	for _, l := range mustList(t, s) {
		if l.Status == deadletter.StatusCompleted {
			continue
		}
		if l.Status != deadletter.StatusPending || l.ClaimedBy != "" || l.Attempts != 0 {
			t.Errorf("letter %s after the canceled replay: %s by %q, %d attempts; want pending, no lease, no attempt",
				l.EventID, l.Status, l.ClaimedBy, l.Attempts)
		}
	}
}

// TestReplayConcurrent: two replays started at the same moment over the same
// 300 letters publish each exactly once between them, and both take part.
// Each waits, before its second batch, until the other has published one (or
// ended), so that they overlap however late the scheduler starts one of them:
// at 400 letters/s, a replay started 0.75 s after the other used to find every
// letter held (seen with 4 test packages at once on a busy 2-core machine).
func TestReplayConcurrent(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	topic := unique("replay.concurrent")
	seed(t, s, topic, 300)
	published := []chan struct{}{make(chan struct{}), make(chan struct{})}
	pubs := []*turnPublisher{
		{Publisher: newPublisher(t), mine: published[0], other: published[1]},
		{Publisher: newPublisher(t), mine: published[1], other: published[0]},
	}
	results := make([]replay.Outcome, 2)
	errs := make([]error, 2)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pubs[i].published() // an ended replay holds the other up no longer
			<-start
			results[i], errs[i] = s.ReplayDeadLetters(ctx, pubs[i], deadletter.ReplayOptions{
				Actor: fmt.Sprint("replayer ", i), BatchSize: 10, Rate: 400})
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replay %d: %v", i, err)
		}
	}
	t.Logf("replay A %+v, replay B %+v", results[0].Counts, results[1].Counts)
	if p := results[0].Published + results[1].Published; p != 300 {
		t.Errorf("the replays published %d letters together, want 300", p)
	}
	if results[0].Published == 0 || results[1].Published == 0 {
		t.Errorf("one replay published nothing (%d, %d): they did not run at the same time", results[0].Published, results[1].Published)
	}
	recs := testenv.MustReadAll(t, kafka, topic)
	seen := map[string]int{}
	for _, r := range recs {
		seen[r.Headers[sink.HeaderID]]++
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("event %s published %d times", id, n)
		}
	}
	if len(recs) != 300 || len(seen) != 300 {
		t.Errorf("Kafka has %d records of %d events, want 300 of 300", len(recs), len(seen))
	}
	for _, l := range mustList(t, s) {
		if l.Status != deadletter.StatusCompleted || l.ReplayCount != 1 {
			t.Errorf("letter %s: %s, replay_count %d", l.EventID, l.Status, l.ReplayCount)
		}
	}
}

// turnPublisher publishes through Publisher; before its second batch it waits
// until the other replay's publisher closed other (after its first batch).
type turnPublisher struct {
	replay.Publisher
	mine, other chan struct{}
	calls       atomic.Int32
	once        sync.Once
}

func (p *turnPublisher) Publish(ctx context.Context, topic string, events []*outbox.Event) error {
	if p.calls.Add(1) == 2 {
		select {
		case <-p.other:
		case <-ctx.Done():
			return fmt.Errorf("wait for the other replay's first batch: %w", context.Cause(ctx))
		}
	}
	defer p.published()
	return p.Publisher.Publish(ctx, topic, events)
}

// published closes mine, once.
func (p *turnPublisher) published() { p.once.Do(func() { close(p.mine) }) }

// TestReplaySkipsHeldLetters: a letter another replay holds is skipped, and
// the history says who holds it.
func TestReplaySkipsHeldLetters(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	p := newPublisher(t)
	topic := unique("replay.held")
	seed(t, s, topic, 3)
	held := byEventID(t, s, "e-01")
	if c, err := s.Claim(ctx, deadletter.Lease{Owner: "the other replay", Duration: time.Hour}, []int64{held.ID}, false); err != nil || len(c) != 1 {
		t.Fatalf("claim: %d, %v", len(c), err)
	}
	res, err := s.ReplayDeadLetters(ctx, p, deadletter.ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "replay", res, replay.Counts{Selected: 3, Published: 2, Skipped: 1})
	events, _ := s.History().Events(ctx, res.ReplayID)
	for _, e := range events {
		if e.EventID == "e-01" && (e.Result != replay.ResultSkipped || !strings.Contains(e.Error, "held by the other replay until")) {
			t.Errorf("held letter's result: %+v", e)
		}
	}
	if got := sandbox.IDs(testenv.MustReadAll(t, kafka, topic)); !slices.Equal(got, []string{"e-00", "e-02"}) {
		t.Errorf("Kafka has %v", got)
	}
	if l, _ := s.Get(ctx, held.ID); l.Status != deadletter.StatusProcessing || l.ClaimedBy != "the other replay" {
		t.Errorf("held letter after the replay: %s by %q", l.Status, l.ClaimedBy)
	}
}

// TestReplayTopicOverride: a letter whose template produced an invalid topic
// name is delivered to the topic the replay names; the replay and the
// letter's transitions record the override.
func TestReplayTopicOverride(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	p := newPublisher(t)
	bad := letter("bad-topic", "invalid_topic", "A", "T", base)
	bad.Topic = "outbox.{aggregate_type}"
	mustAdd(t, s, bad)
	fixed := unique("replay.override")

	if _, err := s.ReplayDeadLetters(ctx, p, deadletter.ReplayOptions{Topic: "no spaces allowed"}); err == nil {
		t.Error("a replay to an invalid topic started")
	}
	res, err := s.ReplayDeadLetters(ctx, p, deadletter.ReplayOptions{Topic: fixed, Filter: deadletter.Filter{EventIDs: []string{"bad-topic"}}})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "override", res, replay.Counts{Selected: 1, Published: 1})
	if got := sandbox.IDs(testenv.MustReadAll(t, kafka, fixed)); !slices.Equal(got, []string{"bad-topic"}) {
		t.Errorf("%s has %v", fixed, got)
	}
	l := byEventID(t, s, "bad-topic")
	if l.Status != deadletter.StatusCompleted || l.Topic != bad.Topic {
		t.Errorf("letter after the override: %s, topic %q (the letter keeps the topic it was meant for)", l.Status, l.Topic)
	}
	replays, _ := s.History().List(ctx, 1)
	if len(replays) != 1 || replays[0].TopicOverride != fixed {
		t.Errorf("replay history: %+v", replays)
	}
	ts, err := s.ListTransitions(ctx, deadletter.TransitionFilter{EventIDs: []string{"bad-topic"}})
	if err != nil || len(ts) != 2 {
		t.Fatalf("transitions = %+v, %v", ts, err)
	}
	if c := ts[1]; c.To != deadletter.StatusCompleted || c.Topic != fixed || c.ReplayID != res.ReplayID ||
		!strings.Contains(c.Detail, "topic override: published to "+fixed+" instead of outbox.{aggregate_type}") {
		t.Errorf("completion transition: %+v", c)
	}
}

// TestReplayKeepsRawBytesAndFormatHeaders: a dead-lettered event with a bytea
// payload and key (raw bytes, not valid UTF-8) and the content-type and trace
// headers replays as the same bytes with the same headers; the letter keeps
// the payload's type, so a structured CloudEvents replay carries it in
// data_base64, as the stream would have.
func TestReplayKeepsRawBytesAndFormatHeaders(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	p := newPublisher(t)
	topic := unique("replay.bytea")
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	key := []byte{0xca, 0xfe, 0x00, 0xff}
	payload := []byte{0x00, 0x00, 0x00, 0x00, 0x2a, 0x0a, 0x03, 0xc3, 0x28, 0x00}
	ev := &outbox.Event{
		ID: []byte("bin-1"), AggregateType: []byte("order"), AggregateID: key, EventType: []byte("OrderPlaced"),
		Payload: payload, PayloadType: outbox.PayloadBinary, CommitLSN: 0x10,
		Headers: []outbox.Header{
			{Key: outbox.HeaderContentType, Value: []byte("application/x-protobuf")},
			{Key: outbox.HeaderTraceParent, Value: []byte(tp)},
			{Key: outbox.HeaderTraceState, Value: []byte("rojo=00f067aa0ba902b7")},
		},
	}
	rec := s.Recorder("relay-a")
	if err := rec(ctx, ev, topic, &outbox.EventError{Code: "message_too_large", Err: errors.New("1 MB")}); err != nil {
		t.Fatalf("record the dead letter of a binary event: %v", err)
	}
	l := byEventID(t, s, "bin-1")
	if l.AggregateID != `\xcafe00ff` {
		t.Errorf("aggregate_id column = %q, want the hex form of the binary key", l.AggregateID)
	}
	if _, ok := l.Headers[deadletter.PayloadTypeKey]; l.PayloadType != outbox.PayloadBinary || ok {
		t.Errorf("letter payload type %s (key among the headers: %v), want binary, apart from the headers", l.PayloadType, ok)
	}
	res, err := s.ReplayDeadLetters(ctx, p, deadletter.ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "replay", res, replay.Counts{Selected: 1, Published: 1})
	recs := testenv.MustReadAll(t, kafka, topic)
	if len(recs) != 1 {
		t.Fatalf("Kafka has %d records, want 1", len(recs))
	}
	r := recs[0]
	if !bytes.Equal(r.Key, key) || !bytes.Equal(r.Value, payload) {
		t.Errorf("replayed key %x, value %x; want %x, %x", r.Key, r.Value, key, payload)
	}
	for k, want := range map[string]string{
		outbox.HeaderContentType: "application/x-protobuf", outbox.HeaderTraceParent: tp, outbox.HeaderTraceState: "rojo=00f067aa0ba902b7",
	} {
		if got, ok := r.Headers[k]; !ok || got != want {
			t.Errorf("replayed header %s = %q (present %v), want %q", k, got, ok, want)
		}
	}
	if _, ok := r.Headers[deadletter.PayloadTypeKey]; ok {
		t.Errorf("replayed record has header %s", deadletter.PayloadTypeKey)
	}

	// A structured CloudEvents replay of the letter: the payload in base64.
	const source = "/cdc-relay/app/public.outbox_events"
	sp := newPublisherWith(t, sink.Config{Brokers: kafka.Brokers(), CloudEventsSource: source, CloudEventsMode: sink.CloudEventsStructured})
	res, err = s.ReplayDeadLetters(ctx, sp, deadletter.ReplayOptions{Force: true})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, "structured replay", res, replay.Counts{Selected: 1, Published: 1})
	recs = testenv.MustReadAll(t, kafka, topic)
	if len(recs) != 2 {
		t.Fatalf("Kafka has %d records, want 2", len(recs))
	}
	ce, _, err := cetest.ToEvent(recs[1])
	if err != nil {
		t.Fatal(err)
	}
	if !ce.DataBase64 || !bytes.Equal(ce.Data(), payload) || ce.DataContentType() != "application/x-protobuf" ||
		ce.ID() != "bin-1" || ce.Source() != source || ce.Extensions()["traceparent"] != tp {
		t.Errorf("structured replay: base64 %v data %x datacontenttype %q id %q source %q extensions %v",
			ce.DataBase64, ce.Data(), ce.DataContentType(), ce.ID(), ce.Source(), ce.Extensions())
	}
}
