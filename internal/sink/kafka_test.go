package sink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/setting"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// fastRetry keeps retry tests short; the algorithm itself is tested in backoff.
var fastRetry = backoff.Policy{Base: time.Millisecond, Cap: 20 * time.Millisecond}

var commitBase = time.Date(2024, 5, 17, 10, 30, 0, 123456000, time.UTC)

// payload is the JSON value of test events: which key and the key's sequence number.
type payload struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
	Pad string `json:"pad,omitempty"`
}

// testEvent returns the seq-th event of aggregate key; n numbers the event in
// the whole stream (it becomes XID, LSN and commit time).
func testEvent(key string, seq int, n uint64) *outbox.Event {
	return paddedEvent(key, seq, n, 0)
}

// paddedEvent is testEvent with pad bytes of filler in the payload.
func paddedEvent(key string, seq int, n uint64, pad int) *outbox.Event {
	p, err := json.Marshal(payload{Key: key, Seq: seq, Pad: strings.Repeat("p", pad)})
	if err != nil {
		panic(err)
	}
	return &outbox.Event{
		ID:            []byte(fmt.Sprintf("%s#%d", key, seq)),
		AggregateType: []byte("order"),
		AggregateID:   []byte(key),
		EventType:     []byte(fmt.Sprintf("order.v%d", seq%3)),
		Payload:       p,
		XID:           uint32(1000 + n),
		CommitLSN:     pglogrepl.LSN(0x16B3748 + n*128),
		CommitTime:    commitBase.Add(time.Duration(n) * time.Millisecond),
	}
}

// stream returns total events spread round-robin over keys aggregates.
func stream(keys, total int) []*outbox.Event {
	next := make([]int, keys)
	evs := make([]*outbox.Event, 0, total)
	for i := 0; i < total; i++ {
		k := i % keys
		evs = append(evs, testEvent(fmt.Sprintf("agg-%03d", k), next[k], uint64(i)))
		next[k]++
	}
	return evs
}

// ackLog collects the acknowledgements the producer reports.
type ackLog struct {
	mu    sync.Mutex
	byID  map[string]acked
	total int
	want  int
	done  chan struct{}
}

func newAckLog(want int) *ackLog {
	return &ackLog{byID: make(map[string]acked), want: want, done: make(chan struct{})}
}

// acked is what an ackLog holds of one event: how often it was acknowledged,
// and where the last acknowledgement said Kafka stored it.
type acked struct {
	n  int
	at Stored
}

// ack is a Done that records acknowledgements and refuses failures, naming
// the event.
func (a *ackLog) ack(m Message, at Stored, err error) error {
	return a.doneWith(nil)(m, at, err)
}

// doneWith returns a Done that records acknowledgements and hands failures to
// permanent (nil: refuse them, naming the event).
func (a *ackLog) doneWith(permanent func(*outbox.Event, error) error) Done {
	return func(m Message, at Stored, err error) error {
		ev := m.Event
		if err != nil {
			if permanent == nil {
				return fmt.Errorf("event %s: %w", ev.ID, err)
			}
			return permanent(ev, err)
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		e := a.byID[string(ev.ID)]
		e.n++
		e.at = at
		a.byID[string(ev.ID)] = e
		a.total++
		if a.total == a.want {
			close(a.done)
		}
		return nil
	}
}

// stored returns where the producer said Kafka stored ev, and whether it
// acknowledged ev at all.
func (a *ackLog) stored(ev *outbox.Event) (Stored, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.byID[string(ev.ID)]
	return e.at, ok
}

func (a *ackLog) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.total
}

func (a *ackLog) wait(t testing.TB, timeout time.Duration) {
	t.Helper()
	select {
	case <-a.done:
	case <-time.After(timeout):
		t.Fatalf("only %d of %d events acknowledged after %v", a.count(), a.want, timeout)
	}
}

// checkExactlyOnce fails t unless every event of evs was acknowledged exactly once.
func (a *ackLog) checkExactlyOnce(t testing.TB, evs []*outbox.Event) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.total != len(evs) {
		t.Errorf("%d acknowledgements for %d events", a.total, len(evs))
	}
	for _, ev := range evs {
		if n := a.byID[string(ev.ID)].n; n != 1 {
			t.Errorf("event %s acknowledged %d times", ev.ID, n)
		}
	}
}

func openSink(t testing.TB, cfg Config) *Kafka {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	k, err := Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open sink: %v", err)
	}
	t.Cleanup(func() {
		if err := k.Close(); err != nil {
			t.Errorf("close sink: %v", err)
		}
	})
	return k
}

// sendAll produces evs to topic, reporting to done.
func sendAll(t testing.TB, k *Kafka, topic string, evs []*outbox.Event, done Done) {
	t.Helper()
	sendFrom(t, k, topic, evs, nil, done)
}

// sendFrom is sendAll for events some of which were read from a stream:
// origins holds their Origin (the others carry no source position).
func sendFrom(t testing.TB, k *Kafka, topic string, evs []*outbox.Event, origins map[*outbox.Event]*outbox.Origin, done Done) {
	t.Helper()
	for _, ev := range evs {
		if err := k.Produce(Message{Topic: topic, Event: ev, Origin: origins[ev]}, done); err != nil {
			t.Fatalf("produce %s: %v", ev.ID, err)
		}
	}
}

// sendRouted produces each of evs to the topic template renders for it, as
// the relay does.
func sendRouted(t testing.TB, k *Kafka, template string, evs []*outbox.Event, done Done) {
	t.Helper()
	r, err := route.New(template)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		topic, err := r.Topic(ev)
		if err != nil {
			t.Fatalf("route %s: %v", ev.ID, err)
		}
		if err := k.Produce(Message{Topic: topic, Event: ev}, done); err != nil {
			t.Fatalf("produce %s: %v", ev.ID, err)
		}
	}
}

func readAll(t testing.TB, kafka *sandbox.Kafka, topics ...string) []sandbox.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	recs, err := sandbox.ReadAll(ctx, kafka.Brokers(), topics...)
	if err != nil {
		t.Fatalf("read back %v: %v", topics, err)
	}
	return recs
}

// checkOrder decodes records (in partition-offset order, as ReadAll returns
// them) and fails t unless every key lives in one partition and its sequence
// numbers run 0, 1, 2, ... without gap, duplicate or reordering. It returns the
// number of records per key.
func checkOrder(t testing.TB, recs []sandbox.Record) map[string]int {
	t.Helper()
	next := make(map[string]int)
	part := make(map[string]int32)
	bad := 0
	for _, r := range recs {
		var p payload
		if err := json.Unmarshal(r.Value, &p); err != nil {
			t.Fatalf("record %s/%d@%d: value %q: %v", r.Topic, r.Partition, r.Offset, r.Value, err)
		}
		if string(r.Key) != p.Key {
			t.Fatalf("record %s/%d@%d: key %q, payload key %q", r.Topic, r.Partition, r.Offset, r.Key, p.Key)
		}
		if pp, ok := part[p.Key]; ok && pp != r.Partition {
			t.Errorf("key %s in partitions %d and %d", p.Key, pp, r.Partition)
		}
		part[p.Key] = r.Partition
		if p.Seq != next[p.Key] {
			if bad++; bad <= 10 {
				t.Errorf("key %s: seq %d at %s/%d@%d, want %d (gap, duplicate or reordering)", p.Key, p.Seq, r.Topic, r.Partition, r.Offset, next[p.Key])
			}
		}
		next[p.Key] = p.Seq + 1
	}
	if bad > 10 {
		t.Errorf("... %d order violations in all", bad)
	}
	return next
}

func TestSendDeliversInOrderWithHeaders(t *testing.T) {
	t.Parallel()
	const topic = "outbox.events"
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{topic}})
	evs := stream(200, 5000)
	evs[7].Headers = []outbox.Header{{Key: "traceparent", Value: []byte("00-abc-01")}}
	acks := newAckLog(len(evs))
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	// Small batches, so that order has to hold across many produce requests.
	k := openSink(t, Config{
		Brokers: kafka.Brokers(), Topics: []string{topic}, Retry: fastRetry, BatchMaxEvents: 50,
		Logger: zerolog.Nop(), Metrics: m,
	})
	start := time.Now()
	sendAll(t, k, topic, evs, acks.ack)
	acks.wait(t, 30*time.Second)
	batches := int(testutil.ToFloat64(m.ProduceBatches))
	t.Logf("%d events acknowledged in %v, %d batches", len(evs), time.Since(start), batches)
	acks.checkExactlyOnce(t, evs)
	if batches < len(evs)/50 {
		t.Errorf("%d batches for %d events with BatchMaxEvents 50", batches, len(evs))
	}
	if got := testutil.ToFloat64(m.EventsPublished.WithLabelValues(topic)); got != float64(len(evs)) {
		t.Errorf("events_published_total = %v, want %d", got, len(evs))
	}
	if got := testutil.ToFloat64(m.ProduceRetries); got != 0 {
		t.Errorf("produce_retries_total = %v without faults", got)
	}
	if k.Retrying() || k.Err() != nil {
		t.Errorf("Retrying() = %v, Err() = %v after a clean run", k.Retrying(), k.Err())
	}

	recs := readAll(t, kafka, topic)
	if len(recs) != len(evs) {
		t.Fatalf("%d records in Kafka, want %d", len(recs), len(evs))
	}
	perKey := checkOrder(t, recs)
	if len(perKey) != 200 {
		t.Errorf("%d keys in Kafka, want 200", len(perKey))
	}
	for key, n := range perKey {
		if n != 25 {
			t.Errorf("key %s: %d events, want 25", key, n)
		}
	}
	partitions := map[int32]bool{}
	byID := make(map[string]*outbox.Event, len(evs))
	for _, ev := range evs {
		byID[string(ev.ID)] = ev
	}
	for _, r := range recs {
		partitions[r.Partition] = true
		ev := byID[r.Headers[HeaderID]]
		if ev == nil {
			t.Fatalf("record %d@%d: header id %q names no sent event (headers %v)", r.Partition, r.Offset, r.Headers[HeaderID], r.Headers)
		}
		want := map[string]string{
			HeaderID:            string(ev.ID),
			HeaderEventType:     string(ev.EventType),
			HeaderAggregateType: string(ev.AggregateType),
			HeaderCommitLSN:     ev.CommitLSN.String(),
			HeaderCommitTime:    ev.CommitTime.UTC().Format(time.RFC3339Nano),
		}
		for _, h := range ev.Headers {
			want[h.Key] = string(h.Value)
		}
		for hk, hv := range want {
			if got, ok := r.Headers[hk]; !ok || got != hv {
				t.Fatalf("event %s: header %s = %q (present %v), want %q", ev.ID, hk, got, ok, hv)
			}
		}
		if len(r.Headers) != len(want) {
			t.Fatalf("event %s: headers %v, want %v", ev.ID, r.Headers, want)
		}
		if !bytes.Equal(r.Value, ev.Payload) || string(r.Key) != string(ev.AggregateID) {
			t.Fatalf("event %s: key/value %q/%q, want %q/%q", ev.ID, r.Key, r.Value, ev.AggregateID, ev.Payload)
		}
		ct, err := time.Parse(time.RFC3339Nano, r.Headers[HeaderCommitTime])
		if err != nil || !ct.Equal(ev.CommitTime) {
			t.Fatalf("event %s: commit_time %q parses to %v, %v; want %v", ev.ID, r.Headers[HeaderCommitTime], ct, err, ev.CommitTime)
		}
		lsn, err := pglogrepl.ParseLSN(r.Headers[HeaderCommitLSN])
		if err != nil || lsn != ev.CommitLSN {
			t.Fatalf("event %s: commit_lsn %q parses to %v, %v; want %v", ev.ID, r.Headers[HeaderCommitLSN], lsn, err, ev.CommitLSN)
		}
	}
	if len(partitions) != 4 {
		t.Errorf("records in %d partitions, want all 4", len(partitions))
	}
}

// TestPartitioningMatchesJavaClient checks that a key lands where the Java
// client's default partitioner (murmur2, sign bit masked, mod n) puts it, as
// computed independently by franz-go.
func TestPartitioningMatchesJavaClient(t *testing.T) {
	t.Parallel()
	const topic, parts = "outbox.seven", 7
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: parts, Topics: []string{topic}})
	keys := []string{"a", "ab", "abc", "abcd", "abcde", "0", "-1", "order-42",
		"ü", "日本語のキー", "\x00", "\xff\xfe\xfd", strings.Repeat("k", 1000),
		"4f8c2a4e-8f6d-4c3b-9a51-3c6f7b1e2d90"}
	for i := 0; i < 500; i++ {
		keys = append(keys, fmt.Sprintf("customer-%d", i))
	}
	evs := make([]*outbox.Event, len(keys))
	for i, key := range keys {
		evs[i] = testEvent(key, 0, uint64(i))
	}
	acks := newAckLog(len(evs))
	k := openSink(t, Config{Brokers: kafka.Brokers(), Topics: []string{topic}, Logger: zerolog.Nop()})
	sendAll(t, k, topic, evs, acks.ack)
	acks.wait(t, 20*time.Second)

	java := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	recs := readAll(t, kafka, topic)
	if len(recs) != len(keys) {
		t.Fatalf("%d records, want %d", len(recs), len(keys))
	}
	used := map[int32]int{}
	for _, r := range recs {
		want := java.Partition(&kgo.Record{Topic: topic, Key: r.Key}, parts)
		if int(r.Partition) != want {
			t.Errorf("key %q: partition %d, Java client would pick %d", r.Key, r.Partition, want)
		}
		used[r.Partition]++
	}
	if len(used) != parts {
		t.Errorf("keys spread over %d of %d partitions: %v", len(used), parts, used)
	}
}

// TestTemplateTopics routes by {aggregate_type}: topics are created on first use
// and each keeps its keys in order.
func TestTemplateTopics(t *testing.T) {
	t.Parallel()
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 3})
	evs := stream(30, 900)
	types := []string{"order", "invoice", "customer"}
	for i, ev := range evs {
		ev.AggregateType = []byte(types[i%30%3]) // fixed per key
	}
	acks := newAckLog(len(evs))
	k := openSink(t, Config{Brokers: kafka.Brokers(), Retry: fastRetry, Logger: zerolog.Nop()})
	sendRouted(t, k, "cdc.{aggregate_type}", evs, acks.ack)
	acks.wait(t, 20*time.Second)
	acks.checkExactlyOnce(t, evs)
	for _, typ := range types {
		recs := readAll(t, kafka, "cdc."+typ)
		if len(recs) != 300 {
			t.Errorf("topic cdc.%s: %d records, want 300", typ, len(recs))
		}
		for _, r := range recs {
			if r.Headers[HeaderAggregateType] != typ {
				t.Fatalf("topic cdc.%s holds a record of aggregate_type %q", typ, r.Headers[HeaderAggregateType])
			}
		}
		for key, n := range checkOrder(t, recs) {
			if n != 30 {
				t.Errorf("topic cdc.%s key %s: %d events, want 30", typ, key, n)
			}
		}
	}
}

// faultInjector fails about 30% of produce requests with retriable errors in
// place of the broker (so nothing is written), and holds back some of the
// others for a while before the broker handles them. Failures come in bursts of
// 3 to 5 consecutive requests of one partition, like a leader election that
// takes a moment: since a partition has one request in flight and re-sends the
// same batch, one burst is one failing spell of one batch.
type faultInjector struct {
	mu        sync.Mutex
	rng       *rand.Rand
	burstLeft map[int32]int
	burstCode map[int32]int16
	bursts    int
	sleeps    int
	failed    map[int16]int // by error code
	requests  int
	// failedBatches counts partition batches in failed requests.
	failedBatches int
}

func newFaultInjector(seed uint64) *faultInjector {
	return &faultInjector{
		rng:       rand.New(rand.NewPCG(seed, seed)),
		burstLeft: map[int32]int{},
		burstCode: map[int32]int16{},
		failed:    map[int16]int{},
	}
}

// decide returns the error code to answer a request for partition p with, 0
// to let the broker handle it, and whether to hold it back first.
func (f *faultInjector) decide(p int32) (code int16, sleep bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests++
	if f.burstLeft[p] == 0 && f.rng.Float64() < 0.1 {
		f.bursts++
		f.burstLeft[p] = 3 + f.rng.IntN(3)
		f.burstCode[p] = kerr.NotLeaderForPartition.Code
		if f.rng.IntN(2) == 0 {
			f.burstCode[p] = kerr.RequestTimedOut.Code
		}
	}
	if f.burstLeft[p] > 0 {
		f.burstLeft[p]--
		f.failed[f.burstCode[p]]++
		return f.burstCode[p], false
	}
	if f.rng.Float64() < 0.07 {
		f.sleeps++
		return 0, true
	}
	return 0, false
}

func (f *faultInjector) install(c *kfake.Cluster) {
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		code, sleep := f.decide(req.Topics[0].Partitions[0].Partition)
		if code != 0 {
			// One request carries a batch of several partitions; all of them fail.
			f.mu.Lock()
			for _, t := range req.Topics {
				f.failedBatches += len(t.Partitions)
			}
			f.mu.Unlock()
			return testenv.ProduceError(req, code), nil, true
		}
		if sleep {
			// Hold the request back a while, then let the broker handle it.
			d := time.Duration(5+rand.IntN(25)) * time.Millisecond
			c.SleepControl(func() { time.Sleep(d) })
		}
		return nil, nil, false
	})
}

func (f *faultInjector) failures() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, v := range f.failed {
		n += v
	}
	return n
}

func TestRetriesKeepOrderUnderTransientErrors(t *testing.T) {
	t.Parallel()
	const topic = "outbox.events"
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{topic}})
	testenv.RequireLocalKafka(t, kafka)
	faults := newFaultInjector(1)
	faults.install(kafka.Cluster())

	logs := &sandbox.Buffer{}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	evs := stream(100, 3000)
	acks := newAckLog(len(evs))
	k := openSink(t, Config{
		Brokers: kafka.Brokers(), Topics: []string{topic}, Retry: fastRetry, RequestTimeout: 10 * time.Second,
		BatchMaxEvents: 10, // many produce requests, so many injected failures
		Logger:         zerolog.New(logs), Metrics: m,
	})
	// Send in bursts so that many produce requests go out, not a few big ones.
	for i := 0; i < len(evs); i += 50 {
		sendAll(t, k, topic, evs[i:min(i+50, len(evs))], acks.ack)
		time.Sleep(time.Millisecond)
	}
	acks.wait(t, 40*time.Second)
	acks.checkExactlyOnce(t, evs)

	faults.mu.Lock() // the broker is idle now; this orders our reads after its writes
	requests, bursts, sleeps, byCode := faults.requests, faults.bursts, faults.sleeps, fmt.Sprint(faults.failed)
	failedBatches := faults.failedBatches
	faults.mu.Unlock()
	failed := faults.failures()
	retries := testutil.ToFloat64(m.ProduceRetries)
	transient := testutil.ToFloat64(m.ProduceErrors.WithLabelValues("transient"))
	t.Logf("%d produce requests, %d failed in %d bursts %v, %d held back; produce_retries_total %v; %d ack batches",
		requests, failed, bursts, byCode, sleeps, retries, int(testutil.ToFloat64(m.ProduceBatches)))
	if failed < requests/5 || sleeps == 0 {
		t.Fatalf("fault injection did not happen: %d failures, %d sleeps", failed, sleeps)
	}
	if retries != float64(failedBatches) || transient != float64(failedBatches) {
		t.Errorf("produce_retries_total = %v, produce_errors_total{transient} = %v; want both %d (one per failed partition batch)", retries, transient, failedBatches)
	}
	if got := testutil.ToFloat64(m.ProduceErrors.WithLabelValues("permanent")); got != 0 {
		t.Errorf("produce_errors_total{permanent} = %v, want 0", got)
	}

	recs := readAll(t, kafka, topic)
	if len(recs) != len(evs) {
		t.Errorf("%d records in Kafka, want %d (an error response must not leave a copy behind)", len(recs), len(evs))
	}
	for key, n := range checkOrder(t, recs) {
		if n != 30 {
			t.Errorf("key %s: %d events, want 30", key, n)
		}
	}

	// One warning when the sink starts failing and one note when it has
	// recovered, not a line per failed attempt.
	out := logs.String()
	failing := strings.Count(out, "produce failing")
	recovered := strings.Count(out, "produce recovered")
	t.Logf("log: %d 'produce failing', %d 'produce recovered' lines for %d failed attempts", failing, recovered, failed)
	if failing == 0 {
		t.Errorf("no 'produce failing' line for %d failed attempts", failed)
	}
	if failing != recovered {
		t.Errorf("%d 'produce failing' lines but %d 'produce recovered' lines; every failing state must end in one recovery", failing, recovered)
	}
	// At most one line per failing spell (fewer when spells of several
	// partitions overlap), and a spell is 3 to 5 failed attempts.
	if failing > bursts || failing*3 > failed {
		t.Errorf("%d 'produce failing' lines for %d failed attempts in %d failing spells: the sink logs per attempt, not per state change", failing, failed, bursts)
	}
	if k.Retrying() {
		t.Error("Retrying() = true after everything was acknowledged")
	}
}

// blockFirstProduce holds the first produce request in the broker until the
// returned release is called, so that events sent meanwhile queue up and go out
// together as the partition's next batch. sizes returns the record count of
// every produce request the broker got, in order.
func blockFirstProduce(c *kfake.Cluster) (release func(), sizes func() []int) {
	ch := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var counts []int
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		n := -1
		var batch kmsg.RecordBatch
		if err := batch.ReadFrom(kreq.(*kmsg.ProduceRequest).Topics[0].Partitions[0].Records); err == nil {
			n = int(batch.NumRecords)
		}
		mu.Lock()
		counts = append(counts, n)
		first := len(counts) == 1
		mu.Unlock()
		if first {
			c.SleepControl(func() { <-ch })
		}
		return nil, nil, false
	})
	return func() { once.Do(func() { close(ch) }) }, func() []int {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), counts...)
	}
}

// tooLarge is one run of TestMessageTooLarge.
type tooLarge struct {
	kafka *sandbox.Kafka
	k     *Kafka
	m     *metrics.Metrics
	acks  *ackLog
	done  Done // acks, and failures recorded in calls
	sizes func() []int
	evs   []*outbox.Event // warm-up, 5 small, big, 5 small; all one key
	big   *outbox.Event

	mu    sync.Mutex
	calls []permanentCall
}

type permanentCall struct {
	ev  *outbox.Event
	err error
}

func (r *tooLarge) permanentCalls() []permanentCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]permanentCall(nil), r.calls...)
}

// kafkaIDs returns the id headers of the records of topic, in offset order.
func kafkaIDs(t *testing.T, kafka *sandbox.Kafka, topic string) string {
	t.Helper()
	var ids []string
	for _, r := range readAll(t, kafka, topic) {
		ids = append(ids, r.Headers[HeaderID])
	}
	return strings.Join(ids, " ")
}

func eventIDs(evs []*outbox.Event) string {
	var ids []string
	for _, ev := range evs {
		ids = append(ids, string(ev.ID))
	}
	return strings.Join(ids, " ")
}

// startTooLarge sends, on a 1-partition topic whose broker accepts record
// batches of at most 4 KiB, a warm-up event and then, as one batch queued
// behind it, 5 small events, one of 10 KiB and 5 small ones. Their Done
// returns refuse for a failure. It waits until wantAcks events are acknowledged.
func startTooLarge(t *testing.T, refuse error, wantAcks int) *tooLarge {
	const topic, key = "outbox.events", "agg-1"
	r := &tooLarge{
		kafka: testenv.NewKafka(t, sandbox.KafkaOptions{
			Partitions: 1, Topics: []string{topic},
			BrokerConfigs: map[string]string{"message.max.bytes": "4096"},
		}),
		m:    metrics.New(prometheus.NewRegistry()),
		acks: newAckLog(wantAcks),
	}
	testenv.RequireLocalKafka(t, r.kafka)
	for i := 0; i <= 11; i++ {
		pad := 0
		if i == 6 {
			pad = 10 << 10
		}
		r.evs = append(r.evs, paddedEvent(key, i, uint64(i), pad))
	}
	r.big = r.evs[6]
	var release func()
	release, r.sizes = blockFirstProduce(r.kafka.Cluster())
	defer release()
	r.k = openSink(t, Config{
		Brokers: r.kafka.Brokers(), Topics: []string{topic}, Retry: fastRetry, Logger: zerolog.Nop(), Metrics: r.m,
	})
	r.done = r.acks.doneWith(func(ev *outbox.Event, err error) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.calls = append(r.calls, permanentCall{ev, err})
		return refuse
	})
	sendAll(t, r.k, topic, r.evs[:1], r.done)
	// Once the partition took the warm-up event, the rest queues behind it.
	part := r.k.topics[topic].parts[0]
	testenv.Eventually(t, 5*time.Second, func() error {
		if n := part.queueLen(); n != 0 {
			return fmt.Errorf("warm-up event not taken (%d queued)", n)
		}
		return nil
	})
	sendAll(t, r.k, topic, r.evs[1:], r.done)
	release()
	r.acks.wait(t, 15*time.Second)
	if got := r.sizes(); len(got) < 2 || got[0] != 1 || got[1] != 11 {
		t.Fatalf("produce requests carried %v records; want 1, then 11 (the small ones and the big one in one batch)", got)
	}
	return r
}

func TestMessageTooLarge(t *testing.T) {
	t.Parallel()
	const topic = "outbox.events"

	t.Run("dead-lettered", func(t *testing.T) {
		t.Parallel()
		r := startTooLarge(t, nil, 11)
		testenv.Eventually(t, 5*time.Second, func() error {
			if len(r.permanentCalls()) == 0 {
				return errors.New("Done not called with the failure")
			}
			return nil
		})
		// A later event of the partition, acknowledged: the partition went on
		// past the big one, so a second call for it would have come by now.
		marker := testEvent(string(r.big.AggregateID), 12, 12)
		sendAll(t, r.k, topic, []*outbox.Event{marker}, r.done)
		testenv.Eventually(t, 10*time.Second, func() error {
			if n := r.acks.count(); n < 12 {
				return fmt.Errorf("%d of 12 events acknowledged", n)
			}
			return nil
		})
		// The broker refuses the 11 events, then 6 and 3 of them, then the
		// big one alone; the others go out in halves.
		t.Logf("records per produce request: %v", r.sizes())
		calls := r.permanentCalls()
		if len(calls) != 1 {
			t.Fatalf("Done called with a failure %d times, want once", len(calls))
		}
		if calls[0].ev != r.big {
			t.Errorf("Done got the failure of event %s, want the big one %s", calls[0].ev.ID, r.big.ID)
		}
		err := calls[0].err
		var ee *outbox.EventError
		if !errors.As(err, &ee) || ee.Code != "message_too_large" || Code(err) != "message_too_large" || Classify(err) != Permanent {
			t.Errorf("Done error %v: %v/%q, want a permanent *outbox.EventError with code message_too_large", err, Classify(err), Code(err))
		}
		if v := testutil.ToFloat64(r.m.PermanentFailures.WithLabelValues("message_too_large")); v != 1 {
			t.Errorf("permanent_failures_total{code=message_too_large} = %v, want 1", v)
		}
		if v := testutil.ToFloat64(r.m.ProduceRetries); v != 0 {
			t.Errorf("produce_retries_total = %v: a too-large batch must be split, not retried", v)
		}
		if r.k.Err() != nil {
			t.Errorf("Err() = %v after Done accepted the failure", r.k.Err())
		}
		delivered := append(append(r.evs[:6:6], r.evs[7:]...), marker)
		r.acks.checkExactlyOnce(t, delivered)
		want := eventIDs(delivered)
		if got := kafkaIDs(t, r.kafka, topic); got != want {
			t.Errorf("Kafka holds\n  %s\nwant\n  %s", got, want)
		}
	})

	t.Run("halts", func(t *testing.T) {
		t.Parallel()
		refuse := errors.New("dead-letter store unavailable")
		r := startTooLarge(t, refuse, 6) // the warm-up and the five before the big one
		testenv.Eventually(t, 10*time.Second, func() error {
			if r.k.Err() == nil {
				return errors.New("the producer did not halt after Done refused the failure")
			}
			return nil
		})
		if !errors.Is(r.k.Err(), refuse) {
			t.Errorf("Err() = %v, want %v", r.k.Err(), refuse)
		}
		// Later events for the partition stay behind the failed one: once the
		// sink's goroutines have ended, nothing more can be produced.
		if err := r.k.Produce(Message{Topic: topic, Event: testEvent("agg-1", 12, 12)}, r.done); !errors.Is(err, refuse) {
			t.Fatalf("Produce after halt = %v, want %v", err, refuse)
		}
		stopped := make(chan struct{})
		go func() {
			r.k.wg.Wait()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatal("the sink's goroutines still run 10s after it halted")
		}
		if n := len(r.permanentCalls()); n != 1 {
			t.Errorf("Done called with a failure %d times, want once", n)
		}
		if got := r.acks.count(); got != 6 {
			t.Errorf("%d events acknowledged, want 6", got)
		}
		// 11 refused and halved: the first 5 acknowledged; then at most 5 at a
		// time: 5 refused, 2 refused, the big one alone refused: halted, nothing
		// more is produced.
		if got, want := fmt.Sprint(r.sizes()), fmt.Sprint([]int{1, 11, 5, 5, 2, 1}); got != want {
			t.Errorf("records per produce request %s, want %s", got, want)
		}
		if got, want := kafkaIDs(t, r.kafka, topic), eventIDs(r.evs[:6]); got != want {
			t.Errorf("Kafka holds\n  %s\nwant only\n  %s", got, want)
		}
	})
}

func (p *partition) queueLen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// TestPermanentFailuresAtSend: an event without a key fails at once, through
// its Done, and the others are delivered; a Done that refuses halts the
// producer. (Events whose topic the template cannot name never reach the
// producer: the relay's router reports them, see internal/route and
// internal/relay.)
func TestPermanentFailuresAtSend(t *testing.T) {
	t.Parallel()
	const topic = "t.order"
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 2})
	type call struct {
		id   string
		code string
	}
	var (
		mu    sync.Mutex
		calls []call
	)
	m := metrics.New(prometheus.NewRegistry())
	good := []*outbox.Event{testEvent("agg-1", 0, 0), testEvent("agg-1", 1, 1)}
	acks := newAckLog(len(good))
	k := openSink(t, Config{Brokers: kafka.Brokers(), Retry: fastRetry, Logger: zerolog.Nop(), Metrics: m})
	done := acks.doneWith(func(ev *outbox.Event, err error) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, call{string(ev.ID), Code(err)})
		return nil
	})
	noKey := testEvent("agg-x", 0, 2)
	noKey.ID, noKey.AggregateID = []byte("no-key"), nil
	emptyKey := testEvent("agg-x", 0, 3)
	emptyKey.ID, emptyKey.AggregateID = []byte("empty-key"), []byte{}
	sendAll(t, k, topic, []*outbox.Event{good[0], noKey, emptyKey, good[1]}, done)
	acks.wait(t, 10*time.Second)
	acks.checkExactlyOnce(t, good)
	mu.Lock()
	got := fmt.Sprint(calls)
	mu.Unlock()
	if want := fmt.Sprint([]call{{"no-key", "empty_key"}, {"empty-key", "empty_key"}}); got != want {
		t.Errorf("failures reported %s, want %s", got, want)
	}
	if v := testutil.ToFloat64(m.PermanentFailures.WithLabelValues("empty_key")); v != 2 {
		t.Errorf("permanent_failures_total{empty_key} = %v, want 2", v)
	}
	if recs := readAll(t, kafka, topic); len(recs) != 2 {
		t.Errorf("%s holds %d records, want 2", topic, len(recs))
	}

	// When Done refuses, Produce returns its error and the producer halts.
	refuse := errors.New("no dead-letter table")
	k2 := openSink(t, Config{Brokers: kafka.Brokers(), Logger: zerolog.Nop()})
	if err := k2.Produce(Message{Topic: topic, Event: emptyKey}, func(Message, Stored, error) error { return refuse }); !errors.Is(err, refuse) {
		t.Fatalf("Produce of an event without key = %v, want %v", err, refuse)
	}
	if !errors.Is(k2.Err(), refuse) {
		t.Errorf("Err() = %v, want %v", k2.Err(), refuse)
	}
	if err := k2.Produce(Message{Topic: topic, Event: good[0]}, acks.ack); !errors.Is(err, refuse) {
		t.Errorf("Produce after halt = %v, want %v", err, refuse)
	}
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	t.Run("unreachable broker", func(t *testing.T) {
		t.Parallel()
		port, err := sandbox.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		for _, topic := range []string{"outbox.events", "outbox.{aggregate_type}"} {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			start := time.Now()
			k, err := Open(ctx, Config{
				Brokers: []string{fmt.Sprintf("127.0.0.1:%d", port)}, Topics: []string{topic},
				Retry: backoff.Policy{Base: 50 * time.Millisecond, Cap: 200 * time.Millisecond}, Logger: zerolog.Nop(),
			})
			elapsed := time.Since(start)
			cancel()
			if err == nil {
				k.Close()
				t.Fatalf("topic %s: Open succeeded against a closed port", topic)
			}
			if !strings.Contains(err.Error(), setting.Namer{}.Name("Brokers")) {
				t.Errorf("topic %s: error %q does not name the Brokers setting", topic, err)
			}
			if elapsed > 2*time.Second {
				t.Errorf("topic %s: Open took %v with a 1s context", topic, elapsed)
			}
			t.Logf("topic %s: %v after %v", topic, err, elapsed.Round(time.Millisecond))
		}
	})
	t.Run("topic missing", func(t *testing.T) {
		t.Parallel()
		kafka := testenv.NewKafka(t, sandbox.KafkaOptions{NoAutoCreate: true})
		testenv.RequireLocalKafka(t, kafka) // external brokers may create topics
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		start := time.Now()
		// A long backoff: the context ends while Open waits to ask again,
		// not while a request is in flight (see TestOpenMissingTopicSlowBroker).
		k, err := Open(ctx, Config{
			Brokers: kafka.Brokers(), Topics: []string{"outbox.missing"},
			Retry: backoff.Policy{Base: 10 * time.Second, Cap: 10 * time.Second}, Logger: zerolog.Nop(),
		})
		if err == nil {
			k.Close()
			t.Fatal("Open succeeded for a missing topic with auto-creation off")
		}
		if !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "outbox.missing") {
			t.Errorf("error %q does not say that topic outbox.missing does not exist", err)
		}
		if elapsed := time.Since(start); elapsed > 3*time.Second {
			t.Errorf("Open took %v with a 1.5s context", elapsed)
		}
		t.Logf("%v", err)
	})
	t.Run("topic auto-created", func(t *testing.T) {
		t.Parallel()
		kafka := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 5})
		k := openSink(t, Config{Brokers: kafka.Brokers(), Topics: []string{"outbox.auto"}, Logger: zerolog.Nop()})
		if ts := k.topics["outbox.auto"]; ts == nil || len(ts.parts) != 5 {
			t.Fatalf("topic state after Open: %+v, want 5 partitions", ts)
		}
	})
	t.Run("bad config", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		if _, err := Open(ctx, Config{Topics: []string{"t"}}); err == nil || !strings.Contains(err.Error(), setting.Namer{}.Name("Brokers")) {
			t.Errorf("no brokers: %v", err)
		}
	})
}

// closeWhileRetrying opens a sink whose produce requests all fail, one of them
// held in the broker until hold returns, sends events and waits until
// partitions are retrying with one request in flight. It returns the sink, its
// metrics, and the process's goroutine count before Open.
// closeWhileRetrying opens a sink whose broker holds its first produce request
// (with hold) and fails all others; with needRetries it waits until partitions
// are retrying too (possible only once the held request was answered, since a
// broker has one request of the sink in flight at a time).
func closeWhileRetrying(t *testing.T, hold func(), needRetries bool) (*Kafka, *metrics.Metrics, int) {
	t.Helper()
	const topic = "outbox.events"
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{topic}})
	testenv.RequireLocalKafka(t, kafka)
	c := kafka.Cluster()
	// Let kfake settle before counting.
	time.Sleep(200 * time.Millisecond)
	before := runtime.NumGoroutine()

	var held atomic.Bool
	var failed atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		if req.Topics[0].Partitions[0].Partition == 0 && held.CompareAndSwap(false, true) {
			c.SleepControl(hold)
			return testenv.ProduceError(req, kerr.RequestTimedOut.Code), nil, true
		}
		failed.Add(1)
		return testenv.ProduceError(req, kerr.NotLeaderForPartition.Code), nil, true
	})

	m := metrics.New(prometheus.NewRegistry())
	k, err := Open(context.Background(), Config{
		Brokers: kafka.Brokers(), Topics: []string{topic}, RequestTimeout: 20 * time.Second,
		Retry:  backoff.Policy{Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond},
		Logger: zerolog.Nop(), Metrics: m,
	})
	if err != nil {
		t.Fatal(err)
	}
	sendAll(t, k, topic, stream(40, 400), newAckLog(400).ack)
	retrying := false
	defer func() {
		if !retrying {
			k.Close()
		}
	}()
	testenv.Eventually(t, 10*time.Second, func() error {
		if !held.Load() || needRetries && (failed.Load() <= 10 || !k.Retrying()) {
			return fmt.Errorf("no retries in progress: held %v, failed %d, Retrying %v", held.Load(), failed.Load(), k.Retrying())
		}
		return nil
	})
	retrying = true
	return k, m, before
}

// TestCloseStopsGoroutines closes a sink while its partitions are backing off
// between retries and one produce request is in flight; the broker answers
// that request shortly after.
//
// Not parallel: it counts the process's goroutines.
func TestCloseStopsGoroutines(t *testing.T) {
	k, m, before := closeWhileRetrying(t, func() { time.Sleep(300 * time.Millisecond) }, true)
	start := time.Now()
	if err := k.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v with retries in flight", d)
	}
	if testutil.ToFloat64(m.ProduceRetries) == 0 {
		t.Error("no retries counted")
	}
	if k.Retrying() {
		t.Error("Retrying() = true after Close")
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if after := runtime.NumGoroutine(); after > before {
			return fmt.Errorf("%d goroutines before Open, %d after Close:\n\n%s", before, after, strings.Join(sinkGoroutines(), "\n\n"))
		}
		return nil
	})
}

// TestCloseAbandonsInFlightProduce closes a sink while the broker holds one
// of its produce requests (a slow or hung broker), and checks that nothing of
// the sink runs once Close returned.
//
// Not parallel: it looks at every goroutine of the process.
func TestCloseAbandonsInFlightProduce(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	k, _, _ := closeWhileRetrying(t, func() { <-release }, false)
	if err := k.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	testenv.Eventually(t, 2*time.Second, func() error {
		if left := sinkGoroutines(); len(left) > 0 {
			return fmt.Errorf("%d goroutines of the sink or kafka-go still running after Close returned, while the broker holds a produce request (RequestTimeout 20s):\n\n%s",
				len(left), strings.Join(left, "\n\n"))
		}
		return nil
	})
}

// TestOpenMissingTopicSlowBroker lets the context of Open end while a
// metadata request is in flight, after the broker already said the topic does
// not exist: the error must still say so rather than blame the broker address.
func TestOpenMissingTopicSlowBroker(t *testing.T) {
	t.Parallel()
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{NoAutoCreate: true})
	testenv.RequireLocalKafka(t, kafka)
	c := kafka.Cluster()
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	var asked atomic.Int32
	c.ControlKey(int16(kmsg.Metadata), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.MetadataRequest)
		for _, rt := range req.Topics {
			if rt.Topic != nil && *rt.Topic == "outbox.missing" && asked.Add(1) > 1 {
				// The first answer comes at once; later ones are slow.
				c.SleepControl(func() {
					select {
					case <-done:
					case <-time.After(5 * time.Second):
					}
				})
			}
		}
		return nil, nil, false
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	k, err := Open(ctx, Config{
		Brokers: kafka.Brokers(), Topics: []string{"outbox.missing"},
		Retry: backoff.Policy{Base: 10 * time.Millisecond, Cap: 10 * time.Millisecond}, Logger: zerolog.Nop(),
	})
	if err == nil {
		k.Close()
		t.Fatal("Open succeeded for a missing topic with auto-creation off")
	}
	if asked.Load() < 2 {
		t.Fatalf("topic looked up %d times, want a second, slow lookup", asked.Load())
	}
	if !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("error %q does not say that topic outbox.missing does not exist, which the broker answered to the first lookup", err)
	}
}

// sinkGoroutines returns the stacks of goroutines running code of the sink or
// of kafka-go, which the sink owns.
func sinkGoroutines() []string {
	var out []string
	for _, g := range testenv.GoroutineStacks() {
		if strings.Contains(g, "segmentio/kafka-go") || strings.Contains(g, "internal/sink.(*") {
			out = append(out, g)
		}
	}
	return out
}

// TestOpenWaitsForBroker starts the broker a moment after Open: Open keeps
// trying within its context, for a fixed topic as for a template.
func TestOpenWaitsForBroker(t *testing.T) {
	t.Parallel()
	for _, topic := range []string{"outbox.events", "outbox.{aggregate_type}"} {
		t.Run(topic, func(t *testing.T) {
			t.Parallel()
			if strings.Contains(topic, "{") {
			}
			if os.Getenv(sandbox.EnvKafkaBrokers) != "" {
				t.Skipf("skip: starts its own broker late, %s points at external brokers", sandbox.EnvKafkaBrokers)
			}
			port, err := sandbox.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			started := make(chan *sandbox.Kafka, 1)
			go func() {
				time.Sleep(300 * time.Millisecond)
				kafka, err := sandbox.StartKafka(sandbox.KafkaOptions{Port: port, Topics: []string{"outbox.events"}})
				if err != nil {
					t.Errorf("start kafka on port %d: %v", port, err)
				}
				started <- kafka
			}()
			t.Cleanup(func() {
				if kafka := <-started; kafka != nil {
					kafka.Close()
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			start := time.Now()
			k, err := Open(ctx, Config{
				Brokers: []string{fmt.Sprintf("127.0.0.1:%d", port)}, Topics: []string{topic},
				Retry: backoff.Policy{Base: 50 * time.Millisecond, Cap: 200 * time.Millisecond}, Logger: zerolog.Nop(),
			})
			if err != nil {
				t.Fatalf("Open with a broker that starts after 300ms and a 15s context: %v (after %v)", err, time.Since(start).Round(time.Millisecond))
			}
			t.Logf("Open succeeded after %v", time.Since(start).Round(time.Millisecond))
			if err := k.Close(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestBrokerRejectsTemplatedTopic makes the broker refuse a topic the template
// rendered (as Kafka does for a name that collides with an existing one in '.'
// versus '_'): the events for it are permanent failures, and the sink looks the
// topic up again with backoff, not in a loop.
func TestBrokerRejectsTemplatedTopic(t *testing.T) {
	t.Parallel()
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 2})
	testenv.RequireLocalKafka(t, kafka)
	lookups := kafka.Cluster().Fault(kfake.Fault{
		Keys: []kmsg.Key{kmsg.Metadata}, Topic: "t.bad", Err: kerr.InvalidTopicException, Count: -1,
	})
	var (
		mu    sync.Mutex
		codes []string
	)
	calls := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), codes...)
	}
	good := testEvent("agg-1", 0, 0)
	good.AggregateType = []byte("good")
	bad := testEvent("agg-2", 0, 1)
	bad.AggregateType = []byte("bad")
	acks := newAckLog(1)
	k := openSink(t, Config{
		Brokers: kafka.Brokers(), Logger: zerolog.Nop(),
		Retry: backoff.Policy{Base: 50 * time.Millisecond, Cap: 200 * time.Millisecond},
	})
	sendRouted(t, k, "t.{aggregate_type}", []*outbox.Event{bad, good}, acks.doneWith(func(ev *outbox.Event, err error) error {
		mu.Lock()
		defer mu.Unlock()
		codes = append(codes, string(ev.ID)+":"+Code(err))
		return nil
	}))
	acks.wait(t, 10*time.Second)
	testenv.Eventually(t, 5*time.Second, func() error {
		if len(calls()) == 0 {
			return errors.New("Done not called with the failure of the event whose topic the broker refuses")
		}
		return nil
	})
	if got, want := fmt.Sprint(calls()), fmt.Sprint([]string{string(bad.ID) + ":invalid_topic"}); got != want {
		t.Errorf("failures reported %s, want %s", got, want)
	}

	// With 50ms..200ms backoff, a second holds at most a few dozen lookups:
	// the 41st lookup from now comes a second or more later. Waiting for it
	// (not for a second) also shows the sink does keep looking the topic up.
	n0, start := lookups.Hits(), time.Now()
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := lookups.Wait(wctx, n0+41); err != nil {
		t.Fatalf("%d metadata requests for the refused topic t.bad within 30s after its events failed, want it looked up again with backoff: %v", lookups.Hits()-n0, err)
	}
	if d := time.Since(start); d < time.Second {
		t.Errorf("41 metadata requests for the refused topic t.bad within %v after its events failed, with a retry policy of %v..%v: the sink retries without backoff", d.Round(time.Millisecond), 50*time.Millisecond, 200*time.Millisecond)
	}
}

// TestCompression produces with every codec --compression offers, plain and
// idempotent, and reads the records back with franz-go: nothing is lost,
// reordered or altered, and events of the replication stream carry their
// source position.
func TestCompression(t *testing.T) {
	t.Parallel()
	origin := outbox.NewOrigin("7312345678901234567", 1, "cdc_relay")
	for _, c := range []kafkago.Compression{kafkago.Gzip, kafkago.Snappy, kafkago.Lz4, kafkago.Zstd} {
		idempotent := c == kafkago.Snappy || c == kafkago.Zstd
		t.Run(fmt.Sprintf("%s/idempotent=%v", c, idempotent), func(t *testing.T) {
			t.Parallel()
			const topic = "outbox.compressed"
			kf := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 2, Topics: []string{topic}})
			evs := stream(20, 600)
			origins := map[*outbox.Event]*outbox.Origin{}
			for i, ev := range evs {
				if i%2 == 0 {
					origins[ev], ev.Index = origin, uint32(i%7)
				}
			}
			acks := newAckLog(len(evs))
			k := openSink(t, Config{
				Brokers: kf.Brokers(), Topics: []string{topic}, Retry: fastRetry, BatchMaxEvents: 100,
				Compression: c, Idempotent: idempotent, Logger: zerolog.Nop(),
			})
			sendFrom(t, k, topic, evs, origins, acks.ack)
			acks.wait(t, 30*time.Second)
			acks.checkExactlyOnce(t, evs)
			recs := readAll(t, kf, topic)
			if len(recs) != len(evs) {
				t.Fatalf("%d records in Kafka, want %d", len(recs), len(evs))
			}
			checkOrder(t, recs)
			byID := map[string]*outbox.Event{}
			for _, ev := range evs {
				byID[string(ev.ID)] = ev
			}
			for _, r := range recs {
				ev := byID[r.Headers[HeaderID]]
				if ev == nil || string(r.Key) != string(ev.AggregateID) || string(r.Value) != string(ev.Payload) {
					t.Fatalf("record %s/%d: key %q value %q does not match its event", r.Topic, r.Offset, r.Key, r.Value)
				}
				pos, ok := r.Headers[HeaderSource]
				if o := origins[ev]; o == nil && ok || o != nil && pos != string(o.AppendPosition(nil, ev.CommitLSN, ev.Index)) {
					t.Fatalf("record %s/%d: %s header %q (present %v) for origin %v", r.Topic, r.Offset, HeaderSource, pos, ok, o)
				}
				if at, _ := acks.stored(ev); at.Partition != r.Partition || at.Offset != r.Offset {
					t.Fatalf("event %s acknowledged at %d@%d, stored at %d@%d", ev.ID, at.Partition, at.Offset, r.Partition, r.Offset)
				}
			}
		})
	}
}

func TestAwaitFailure(t *testing.T) {
	tls := errors.New("tls: certificate is valid for kafka.local, not kafka.example.com")
	refused := errors.New("connect: connection refused")
	deadline := fmt.Errorf("fetch metadata of topic %q: %w", "t", context.DeadlineExceeded)
	answer := fmt.Errorf("fetch metadata of topic %q: %w", "t", kafkago.UnknownTopicOrPartition)
	tests := []struct {
		name                      string
		last, cause, answer, want error
	}{
		{"the last attempt's own cause", refused, tls, nil, refused},
		{"the deadline cut the last attempt short", deadline, tls, nil, tls},
		{"only deadlines", deadline, nil, nil, deadline},
		{"a broker's answer first", deadline, tls, answer, answer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := awaitFailure(tt.last, tt.cause, tt.answer); !errors.Is(got, tt.want) {
				t.Errorf("awaitFailure(%v, %v, %v) = %v, want %v", tt.last, tt.cause, tt.answer, got, tt.want)
			}
		})
	}
}
