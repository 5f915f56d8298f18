package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/setting"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

const bigPayloadSQL = `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
	VALUES ('order', 'o-1', 'Huge', jsonb_build_object('pad', repeat('x', 2*1024*1024))) RETURNING id::text`

// poison commits: a small event, a 2 MB one (larger than the broker's default
// message.max.bytes), two small ones after it, each in its own transaction.
// It returns the big event's id and the end LSN of its transaction.
func poison(t *testing.T, e *env) (bigID string, bigEnd pglogrepl.LSN) {
	t.Helper()
	e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'o-1', 'Before', '{\"seq\": 1}')")
	if err := e.pool.QueryRow(context.Background(), bigPayloadSQL).Scan(&bigID); err != nil {
		t.Fatal(err)
	}
	bigEnd = e.currentLSN()
	e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'o-1', 'After', '{\"seq\": 3}')")
	e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('customer', 'c-1', 'Other', '{\"seq\": 4}')")
	return bigID, bigEnd
}

// TestPoisonEventGoesToDeadLetters: a 2 MB payload fails permanently; it lands
// in the dead-letter table with its metadata, the events after it are
// delivered, and the slot moves past it only once the dead letter is
// committed. Then, with the broker's limit raised, a replay delivers it with
// the same id, the history shows it, and a second replay is a no-op.
func TestPoisonEventGoesToDeadLetters(t *testing.T) {
	e := newEnv(t)
	store := deadletter.NewStore(e.relayPool, deadletter.DefaultTable)
	rec := store.Recorder("test-relay")
	release := make(chan struct{})
	var once, enterOnce sync.Once
	entered := make(chan struct{}) // the relay is storing the dead letter
	stored := make(chan struct{})
	e.cfgHook = func(c *relay.Config) {
		// Hold the dead letter back until the test has looked at the slot.
		c.DeadLetter = func(ctx context.Context, ev *outbox.Event, topic string, cause error) error {
			enterOnce.Do(func() { close(entered) })
			<-release
			err := rec(ctx, ev, topic, cause)
			once.Do(func() { close(stored) })
			return err
		}
		c.DeadLetterStore = store
		c.MonitorInterval = 100 * time.Millisecond
	}
	e.start()
	bigID, bigEnd := poison(t, e)

	// While the dead letter is not committed, the slot stays before the event:
	// once the relay is storing it (the event failed for good), let it send
	// several status updates, any of which would confirm past the event if it
	// were counted as done already.
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the big event was not handed to the dead-letter store")
	}
	testenv.WaitStatusUpdates(t, pg, e.db, e.slot, 5, 30*time.Second)
	if got := e.slotConfirmed(); got >= bigEnd {
		t.Fatalf("slot confirmed %s before the dead letter was committed; the big event's transaction ends at %s", got, bigEnd)
	}
	close(release)
	<-stored

	recs := e.waitRecords(3)
	var types []string
	for _, r := range recs {
		types = append(types, r.Headers["event_type"])
	}
	if strings.Join(types, ",") != "Before,After,Other" && strings.Join(types, ",") != "Before,Other,After" && strings.Join(types, ",") != "Other,Before,After" {
		t.Errorf("delivered %v, want Before and After (in that order) and Other", types)
	}
	e.waitSlotConfirmed(bigEnd) // past the dead-lettered event

	letters, err := store.List(context.Background(), deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	l := letters[0]
	if l.EventID != bigID || l.ErrorCode != "message_too_large" || l.Topic != e.topic || l.AggregateID != "o-1" ||
		l.EventType != "Huge" || l.AggregateType != "order" || string(l.Key) != "o-1" || len(l.Payload) < 2*1024*1024 ||
		l.RelayName != "test-relay" || l.CommitLSN == 0 || l.FirstFailedAt.IsZero() || l.LastFailedAt.IsZero() ||
		l.ErrorMessage == "" || l.Headers["id"] != bigID || l.Status != deadletter.StatusPending {
		t.Errorf("dead letter misses fields: %+v", summarize(l))
	}
	if got := testutil.ToFloat64(e.m.DeadLetters.WithLabelValues("message_too_large")); got != 1 {
		t.Errorf("dead_letters_total{code=message_too_large} = %v, want 1", got)
	}
	waitMetric(t, func() float64 { return testutil.ToFloat64(e.m.DeadLetterBacklog) }, 1)

	// Raise the broker's limit for the topic, then replay.
	setTopicConfig(t, e.kafka.Brokers(), e.topic, "max.message.bytes", "8388608")
	pub, err := sink.NewPublisher(context.Background(), sink.Config{Brokers: e.kafka.Brokers(), BatchMaxBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	res, err := store.ReplayDeadLetters(context.Background(), pub, deadletter.ReplayOptions{Actor: "test"})
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if res.Published != 1 {
		t.Fatalf("replay published %d, want 1 (%+v)", res.Published, res)
	}
	recs = e.waitRecords(4)
	last := recs[0]
	for _, r := range recs {
		if r.Headers["event_type"] == "Huge" {
			last = r
		}
	}
	if last.Headers["id"] != bigID || last.Headers[replay.HeaderReplay] == "" {
		t.Errorf("replayed record: id %q replay header %q, want id %s and a replay header", last.Headers["id"], last.Headers[replay.HeaderReplay], bigID)
	}
	history, err := store.History().Events(context.Background(), res.ReplayID)
	if err != nil || len(history) != 1 || history[0].EventID != bigID || history[0].Result != replay.ResultPublished {
		t.Errorf("replay history %+v (%v), want one published row for %s", history, err, bigID)
	}
	again, err := store.ReplayDeadLetters(context.Background(), pub, deadletter.ReplayOptions{Actor: "test"})
	if err != nil || again.Published != 0 || again.Skipped != 1 {
		t.Errorf("second replay: %+v (%v), want nothing published, one skipped", again, err)
	}
	// Publish waits for Kafka's acknowledgements; once the publisher is closed
	// nothing more can come from it.
	if err := pub.Close(); err != nil {
		t.Fatalf("close the replay publisher: %v", err)
	}
	if n := len(e.readAll()); n != 4 {
		t.Errorf("%d records after the second replay, want 4", n)
	}
}

// TestPoisonEventHalts: with --on-error=halt the relay stops with an error
// naming the event and the fix, and the slot stays before the event.
func TestPoisonEventHalts(t *testing.T) {
	e := newEnv(t)
	e.start()
	bigID, bigEnd := poison(t, e)
	select {
	case err := <-e.done:
		e.cancel = nil
		if err == nil || !strings.Contains(err.Error(), bigID) || !strings.Contains(err.Error(), setting.Namer{}.Name("DeadLetter")) ||
			!strings.Contains(err.Error(), "message_too_large") {
			t.Fatalf("Run = %v; want an error naming event %s, the code and the dead-letter setting", err, bigID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not halt")
	}
	if got := e.slotConfirmed(); got >= bigEnd {
		t.Errorf("slot confirmed %s, past the failed event's transaction (%s)", got, bigEnd)
	}
	recs := e.readAll()
	for _, r := range recs {
		if r.Headers["event_type"] != "Before" && r.Headers["event_type"] != "Other" {
			t.Errorf("published %s after halting on the event before it", r.Headers["event_type"])
		}
	}
}

// outageRetries is how many produce retries the broker outage of
// TestCircuitBreakerPausesReading lasts (with the sink's default backoff,
// about as many as in 10-20 s): more than the log lines it may cause, so a
// relay logging every retry fails.
const outageRetries = 15

// TestCircuitBreakerPausesReading: the broker fails every produce request
// until the sink retried outageRetries times. The circuit opens (metric),
// reading from the slot pauses, nothing is confirmed past the first
// undelivered event; afterwards everything arrives in per-key order, and the
// log has a handful of lines, not one per retry.
func TestCircuitBreakerPausesReading(t *testing.T) {
	e := newEnv(t)
	testenv.RequireLocalKafka(t, e.kafka)
	e.cfgHook = func(c *relay.Config) {
		c.MaxInFlightBytes = 1 << 30 // only the breaker may stop reading here
	}
	e.start()
	insert := func(from, to int) {
		e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) SELECT 't', 'k' || (g % 5), 'E', jsonb_build_object('seq', g) FROM generate_series($1::int, $2::int) g", from, to)
	}
	insert(1, 10)
	e.waitRecords(10)

	var failing sync.Mutex
	failing.Lock()
	broken := true
	c := e.kafka.Cluster()
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !broken {
			return nil, nil, false
		}
		return testenv.ProduceError(kreq.(*kmsg.ProduceRequest), kerr.NotLeaderForPartition.Code), nil, true
	})
	failing.Unlock()
	outage := time.Now()
	insert(11, 20)
	undelivered := e.currentLSN() // at or after the end of the first undelivered transaction
	waitMetric(t, func() float64 { return testutil.ToFloat64(e.m.CircuitState) }, 1, 2)
	// Reading pauses: while the circuit is open, new WAL is not received. The
	// metric is refreshed with each status update: let the one message in hand
	// when the circuit opened be counted first.
	testenv.WaitStatusUpdates(t, pg, e.db, e.slot, 3, 30*time.Second)
	received := testutil.ToFloat64(e.m.ReceivedLSN)
	for i := 0; i < 20; i++ {
		insert(21+i*10, 30+i*10)
	}
	// Proof that the relay would have received the new WAL if it were reading:
	// the walsender sent it to the relay's socket, and (after the outage) the
	// relay sent several status updates since, each of which sets the metric.
	walEnd := e.currentLSN()
	testenv.Eventually(t, 30*time.Second, func() error {
		var sent string
		err := e.pool.QueryRow(context.Background(), `SELECT coalesce(r.sent_lsn::text, '0/0') FROM pg_replication_slots s
			JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1`, e.slot).Scan(&sent)
		if err != nil {
			return fmt.Errorf("read the walsender's sent_lsn: %w", err)
		}
		if lsn, _ := pglogrepl.ParseLSN(sent); lsn < walEnd {
			return fmt.Errorf("walsender sent up to %s, not yet %s", sent, walEnd)
		}
		return nil
	})
	// The outage lasts until the sink retried outageRetries times, however
	// long that takes.
	testenv.Eventually(t, 2*time.Minute, func() error {
		if retries := testutil.ToFloat64(e.m.ProduceRetries); retries < outageRetries {
			return fmt.Errorf("produce_retries_total = %v, want %d for the outage", retries, outageRetries)
		}
		return nil
	})
	testenv.WaitStatusUpdates(t, pg, e.db, e.slot, 5, 30*time.Second)
	if got := testutil.ToFloat64(e.m.ReceivedLSN); got != received {
		t.Errorf("received_lsn moved from %v to %v while the circuit was open", received, got)
	}
	t.Logf("outage: %v produce retries in %v", testutil.ToFloat64(e.m.ProduceRetries), time.Since(outage).Round(time.Millisecond))
	if got := e.slotConfirmed(); got >= undelivered {
		t.Errorf("slot confirmed %s, at or past the undelivered transaction ending by %s", got, undelivered)
	}
	if e.relay.Ready() {
		t.Error("relay ready while Kafka fails every request")
	}
	if why := e.relay.NotReady(); !strings.HasPrefix(why, "Kafka: ") {
		t.Errorf("NotReady = %q while Kafka fails every request, want it to name Kafka", why)
	}
	failing.Lock()
	broken = false
	failing.Unlock()

	recs := e.waitRecords(220)
	last := map[string]int{}
	for _, r := range recs {
		var p struct{ Seq int }
		if err := json.Unmarshal(r.Value, &p); err != nil {
			t.Fatal(err)
		}
		k := string(r.Key)
		if p.Seq <= last[k] {
			t.Fatalf("key %s: seq %d after %d", k, p.Seq, last[k])
		}
		last[k] = p.Seq
	}
	waitMetric(t, func() float64 { return testutil.ToFloat64(e.m.CircuitState) }, 0)
	lines := 0
	for _, l := range strings.Split(e.logs.String(), "\n") {
		if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"level":"error"`) || strings.Contains(l, `"message":"circuit`) {
			lines++
		}
	}
	if lines > 10 {
		t.Errorf("%d warning/error/circuit log lines for one outage of %d produce retries, want a handful:\n%s", lines, outageRetries, e.logs.String())
	}
}

// waitMetric waits until get returns one of want.
func waitMetric(t *testing.T, get func() float64, want ...float64) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		if v := get(); !slices.Contains(want, v) {
			return fmt.Errorf("metric is %v, want one of %v", v, want)
		}
		return nil
	})
}

// setTopicConfig changes a topic config with an IncrementalAlterConfigs request.
func setTopicConfig(t *testing.T, brokers []string, topic, key, value string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	r := kmsg.NewIncrementalAlterConfigsRequestResource()
	r.ResourceType = kmsg.ConfigResourceTypeTopic
	r.ResourceName = topic
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name = key
	c.Value = &value
	r.Configs = append(r.Configs, c)
	req.Resources = append(req.Resources, r)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatalf("alter topic config: %v", err)
	}
	for _, res := range resp.Resources {
		if err := kerr.ErrorForCode(res.ErrorCode); err != nil {
			t.Fatalf("alter topic config %s=%s: %v", key, value, err)
		}
	}
}

func summarize(l deadletter.Letter) deadletter.Letter {
	l.Payload = l.Payload[:min(len(l.Payload), 32)]
	return l
}

// TestDeadLetterRetentionRuns: with a retention set, the relay runs it at start
// and then every 60 monitor intervals.
func TestDeadLetterRetentionRuns(t *testing.T) {
	e := newEnv(t)
	var calls atomic.Int32
	e.cfgHook = func(c *relay.Config) {
		c.MonitorInterval = 10 * time.Millisecond
		c.DeadLetterRetention = func(context.Context) (int64, error) {
			calls.Add(1)
			return 0, nil
		}
	}
	e.start()
	waitMetric(t, func() float64 { return float64(min(calls.Load(), 2)) }, 2)
}

// TestRoutingFailureGoesToDeadLetters: an event whose topic the template
// cannot name (aggregate_type "orders/eu" in "outbox.{aggregate_type}") fails
// permanently in the relay's router, before the producer: it is counted like
// any permanent failure and dead-lettered, and the events around it are
// delivered.
func TestRoutingFailureGoesToDeadLetters(t *testing.T) {
	e := newEnv(t)
	var (
		mu     sync.Mutex
		codes  []string
		topics []string // what the dead letters were given
	)
	e.cfgHook = func(c *relay.Config) {
		c.Topic = "outbox.{aggregate_type}"
		c.DeadLetter = func(_ context.Context, ev *outbox.Event, topic string, cause error) error {
			mu.Lock()
			defer mu.Unlock()
			codes = append(codes, string(ev.AggregateType)+":"+sink.Code(cause))
			topics = append(topics, topic)
			return nil
		}
	}
	e.start()
	e.tx(func(tx pgx.Tx) error {
		for _, typ := range []string{"order", "orders/eu", "order"} {
			if _, err := insert(tx, typ, "o-1", "Placed", `{}`); err != nil {
				return err
			}
		}
		return nil
	})
	recs := e.waitRecords(2, "outbox.order")
	if len(recs) != 2 {
		t.Fatalf("%d records in outbox.order, want 2", len(recs))
	}
	mu.Lock()
	got, gotTopics := fmt.Sprint(codes), fmt.Sprint(topics)
	mu.Unlock()
	if want := "[orders/eu:invalid_topic]"; got != want {
		t.Errorf("dead letters %s, want %s", got, want)
	}
	// The template could not name a topic: the letter is given the template.
	if want := "[outbox.{aggregate_type}]"; gotTopics != want {
		t.Errorf("dead letters' topics %s, want %s", gotTopics, want)
	}
	if v := testutil.ToFloat64(e.m.PermanentFailures.WithLabelValues("invalid_topic")); v != 1 {
		t.Errorf("permanent_failures_total{invalid_topic} = %v, want 1", v)
	}
	if v := testutil.ToFloat64(e.m.ProduceErrors.WithLabelValues("permanent")); v != 1 {
		t.Errorf("produce_errors_total{permanent} = %v, want 1", v)
	}
	if v := testutil.ToFloat64(e.m.DeadLetters.WithLabelValues("invalid_topic")); v != 1 {
		t.Errorf("dead_letters_total{invalid_topic} = %v, want 1", v)
	}
}

// TestStopWhileDeadLetterStoreHangs: an event without a key fails inside
// Produce, on the stream's goroutine, and its dead letter cannot be stored;
// a stop still ends within the shutdown budget, confirming nothing past it.
func TestStopWhileDeadLetterStoreHangs(t *testing.T) {
	e := newEnv(t)
	storing := make(chan struct{})
	var once sync.Once
	e.cfgHook = func(c *relay.Config) {
		c.ShutdownTimeout = 2 * time.Second
		c.DeadLetter = func(ctx context.Context, _ *outbox.Event, _ string, _ error) error {
			once.Do(func() { close(storing) })
			<-ctx.Done() // the store never answers
			return ctx.Err()
		}
	}
	e.start()
	e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '', 'NoKey', '{}')")
	end := e.currentLSN()
	select {
	case <-storing:
	case <-time.After(20 * time.Second):
		t.Fatal("the dead letter of the event without a key was never attempted")
	}
	began := time.Now()
	if err := e.stop(); err != nil {
		t.Errorf("Run = %v after a stop, want nil", err)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("Run returned %v after the stop (shutdown budget 2 s) while the dead-letter store hung", took.Round(time.Millisecond))
	}
	if got := e.slotConfirmed(); got >= end {
		t.Errorf("slot confirmed %s, past the event whose dead letter was never stored (before %s)", got, end)
	}
}
