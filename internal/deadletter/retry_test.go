package deadletter_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// smallTopic creates a topic that takes messages of at most 1 KiB.
func smallTopic(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := kafka.CreateTopic(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	setTopicConfig(t, name, "max.message.bytes", "1024")
}

// setTopicConfig sets one config of topic.
func setTopicConfig(t *testing.T, topic, key, value string) {
	t.Helper()
	if err := kafka.SetTopicConfig(t.Context(), topic, key, value); err != nil {
		t.Fatal(err)
	}
}

// bigLetter is a 4 KiB letter for topic that failed an hour ago.
func bigLetter(eventID, code, topic string) deadletter.Letter {
	l := letter(eventID, code, "A", "Big", time.Now().Add(-time.Hour))
	l.Topic = topic
	l.Payload = []byte(fmt.Sprintf(`{"pad": %q}`, strings.Repeat("x", 4096)))
	return l
}

// autoRetry returns an AutoRetry over s with fast backoff and its metrics.
func autoRetry(t *testing.T, s *deadletter.Store, budget int) (*deadletter.AutoRetry, *metrics.Metrics) {
	m := metrics.New(prometheus.NewRegistry())
	return &deadletter.AutoRetry{
		Store: s,
		Open: func(ctx context.Context) (replay.Publisher, func() error, error) {
			p, err := sink.NewPublisher(ctx, sink.Config{Brokers: kafka.Brokers()})
			if err != nil {
				return nil, nil, err
			}
			return p, p.Close, nil
		},
		Budget:    budget,
		Retry:     backoff.Policy{Base: 20 * time.Millisecond, Cap: 50 * time.Millisecond},
		Interval:  20 * time.Millisecond,
		RelayName: "test",
		Logger:    zerolog.New(zerolog.NewTestWriter(t)),
		Metrics:   m,
	}, m
}

// run runs a in the background until the test ends, and checks that it
// returned nil.
func run(t *testing.T, a *deadletter.AutoRetry) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("AutoRetry.Run returned %v after its context ended, want nil", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("AutoRetry.Run did not return within 30s of its context ending")
		}
	}
	t.Cleanup(stop)
	return stop
}

func waitStatus(t *testing.T, s *deadletter.Store, eventID, status string) deadletter.Letter {
	t.Helper()
	var l deadletter.Letter
	testenv.Eventually(t, 30*time.Second, func() error {
		if l = byEventID(t, s, eventID); l.Status != status {
			return fmt.Errorf("letter %s is %s after %d attempts, want %s", eventID, l.Status, l.Attempts, status)
		}
		return nil
	})
	return l
}

func transitionsTo(t *testing.T, s *deadletter.Store, to string) int {
	t.Helper()
	ts, err := s.ListTransitions(t.Context(), deadletter.TransitionFilter{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tr := range ts {
		if tr.To == to {
			n++
		}
	}
	return n
}

// TestAutoRetryToDead: letters whose topic refuses them are retried while
// the relay is ready, each up to the budget, then dead; letters of codes not
// retried are left alone. The metrics count every attempt.
func TestAutoRetryToDead(t *testing.T) {
	s := newStore(t)
	topic := unique("autoretry.small")
	smallTopic(t, topic)
	mustAdd(t, s, bigLetter("big-1", "message_too_large", topic), bigLetter("big-2", "message_too_large", topic),
		bigLetter("no-key", "empty_key", topic))
	a, m := autoRetry(t, s, 3)
	var ready atomic.Bool
	var asked atomic.Int32
	a.Ready = func() bool { asked.Add(1); return ready.Load() }
	stop := run(t, a)

	// Not ready (Kafka does not take the relay's events): no attempt.
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := asked.Load(); n < 3 {
			return fmt.Errorf("Ready asked %d times", n)
		}
		return nil
	})
	if n := transitionsTo(t, s, deadletter.StatusProcessing); n != 0 {
		t.Fatalf("%d claims while not ready", n)
	}
	ready.Store(true)

	for _, id := range []string{"big-1", "big-2"} {
		l := waitStatus(t, s, id, deadletter.StatusDead)
		if l.Attempts != 3 || !strings.Contains(l.LastAttemptError, "retry budget spent (3 attempts)") || l.ClaimedBy != "" || l.NextAttemptAt != nil {
			t.Errorf("dead letter %s: %d attempts, error %q, claimed by %q, next attempt %v", id, l.Attempts, l.LastAttemptError, l.ClaimedBy, l.NextAttemptAt)
		}
	}
	stop()
	if l := byEventID(t, s, "no-key"); l.Status != deadletter.StatusPending || l.Attempts != 0 {
		t.Errorf("empty_key letter: %s after %d attempts, want pending, untouched", l.Status, l.Attempts)
	}
	if n := len(testenv.MustReadAll(t, kafka, topic)); n != 0 {
		t.Errorf("%s has %d records, want none", topic, n)
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"dead_letter_retries_total{result=retry_wait}", testutil.ToFloat64(m.DeadLetterRetries.WithLabelValues("retry_wait")), 4},
		{"dead_letter_retries_total{result=dead}", testutil.ToFloat64(m.DeadLetterRetries.WithLabelValues("dead")), 2},
		{"dead_letter_retries_total{result=completed}", testutil.ToFloat64(m.DeadLetterRetries.WithLabelValues("completed")), 0},
		{"dead_letters_dead_total", testutil.ToFloat64(m.DeadLettersDead), 2},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if n := transitionsTo(t, s, deadletter.StatusRetryWait); n != 4 {
		t.Errorf("%d transitions to retry_wait, want 4", n)
	}
	replays, _ := s.History().List(t.Context(), 1)
	if len(replays) != 1 || replays[0].Actor != "auto retry of relay test" || replays[0].FinishedAt == nil ||
		replays[0].Selected != 6 || replays[0].Failed != 6 || replays[0].Filters["auto_retry"] != true {
		t.Errorf("the retries' history entry: %+v", replays)
	}
}

// TestAutoRetryCompletes: a letter that fails until its topic takes it is
// completed at the first attempt after that, with the replay header; the
// metrics count its failed attempts and its success.
func TestAutoRetryCompletes(t *testing.T) {
	s := newStore(t)
	topic := unique("autoretry.fixed")
	smallTopic(t, topic)
	mustAdd(t, s, bigLetter("fix-1", "message_too_large", topic))
	a, m := autoRetry(t, s, 1000)
	stop := run(t, a)

	testenv.Eventually(t, 30*time.Second, func() error {
		if l := byEventID(t, s, "fix-1"); l.Attempts < 2 {
			return fmt.Errorf("letter tried %d times", l.Attempts)
		}
		return nil
	})
	setTopicConfig(t, topic, "max.message.bytes", "1048576")
	l := waitStatus(t, s, "fix-1", deadletter.StatusCompleted)
	stop()
	recs := testenv.MustReadAll(t, kafka, topic)
	if len(recs) != 1 || recs[0].Headers[sink.HeaderID] != "fix-1" || recs[0].Headers[replay.HeaderReplay] == "" {
		t.Fatalf("%s has %+v, want fix-1 once, with the replay header", topic, sandbox.IDs(recs))
	}
	if l.LastAttemptError != "" || l.ReplayCount != 1 {
		t.Errorf("completed letter: error %q, replay_count %d", l.LastAttemptError, l.ReplayCount)
	}
	failed := l.Attempts - 1
	if got := testutil.ToFloat64(m.DeadLetterRetries.WithLabelValues("retry_wait")); got != float64(failed) || transitionsTo(t, s, deadletter.StatusRetryWait) != failed {
		t.Errorf("retries_total{retry_wait} = %v, %d transitions to retry_wait; want %d (attempts %d)",
			got, transitionsTo(t, s, deadletter.StatusRetryWait), failed, l.Attempts)
	}
	if got := testutil.ToFloat64(m.DeadLetterRetries.WithLabelValues("completed")); got != 1 {
		t.Errorf("retries_total{completed} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.DeadLettersDead); got != 0 {
		t.Errorf("dead_letters_dead_total = %v, want 0", got)
	}
}

// TestStatusesMatchMetrics: the metrics package names the statuses itself (it
// imports no other package); they must be these.
func TestStatusesMatchMetrics(t *testing.T) {
	if !slices.Equal(deadletter.Statuses, metrics.DeadLetterStatuses) {
		t.Errorf("deadletter.Statuses %v, metrics.DeadLetterStatuses %v", deadletter.Statuses, metrics.DeadLetterStatuses)
	}
	want := []string{deadletter.StatusCompleted, deadletter.StatusRetryWait, deadletter.StatusDead}
	if !sameStrings(metrics.DeadLetterRetryResults, want) {
		t.Errorf("metrics.DeadLetterRetryResults %v, want %v", metrics.DeadLetterRetryResults, want)
	}
}

func sameStrings(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
