package sinktest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// Bounds of the cases. They are generous: a case passes on a busy machine.
const (
	deliverTimeout = 30 * time.Second // for every event of a case to be reported
	signalTimeout  = 10 * time.Second // for a fault or a state to show
	closeBound     = 3 * time.Second  // for Close with requests held by the broker
)

// orderTopic is the topic of the Order cases.
const orderTopic = "contract.order"

// orderOptions are the producer settings of the Order cases: small batches,
// so that order must hold across many requests, several of them in flight,
// and quick retries.
var orderOptions = Options{BatchMaxEvents: 10, Retry: fastRetry, MaxInFlight: 5}

// orderStream is what the Order cases produce: 1500 events of 50 keys,
// queued at once so that batches wait behind failing ones.
func orderStream() []*outbox.Event { return stream(50, 1500, 0) }

// deliver produces evs to topic with p and waits until each is reported; it
// then checks that each was reported once with a nil error, per partition in
// produce order, and that the log holds each in per-key order (with
// duplicates only when dups).
func deliver(t *testing.T, b *broker, p Producer, rec *recorder, topic string, evs []*outbox.Event, dups bool) logOf {
	t.Helper()
	rec.produce(t, p, topic, evs...)
	return awaitDelivery(t, b, rec, topic, evs, dups)
}

// awaitDelivery is the waiting and checking half of deliver, for cases that
// produce evs themselves.
func awaitDelivery(t *testing.T, b *broker, rec *recorder, topic string, evs []*outbox.Event, dups bool) logOf {
	t.Helper()
	testenv.Eventually(t, deliverTimeout, rec.reached(len(evs)))
	rec.checkReported(t, evs, nil)
	l := checkLog(t, readLog(t, b, topic), evs, dups)
	rec.checkDoneOrder(t, evs, l.partitionOf)
	return l
}

// coin returns a kfake Fault.When that accepts with probability p, drawn
// from a seeded source so that a failing run can be replayed. When is
// asked once for every partition of a request, so some partitions of one
// request fail and others do not.
func coin(seed uint64, p float64) func(kmsg.Request) bool {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, seed))
	return func(kmsg.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		return rng.Float64() < p
	}
}

// testOrderTransient fails about 30% of the partitions of produce requests
// with retriable errors the broker answers before appending
// (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS): every event is reported
// done(nil) once, in order, and is in the log once, in order.
func testOrderTransient(t *testing.T, open Opener) {
	b := newBroker(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{orderTopic}})
	produce := []kmsg.Key{kmsg.Produce}
	faults := b.Cluster().Fault(
		kfake.Fault{Keys: produce, Err: kerr.NotLeaderForPartition, Count: -1, When: coin(1, 0.15)},
		kfake.Fault{Keys: produce, Err: kerr.NotEnoughReplicas, Count: -1, When: coin(2, 0.18)},
	)
	p := b.open(open, orderOptions, orderTopic)
	deliver(t, b, p, &recorder{}, orderTopic, orderStream(), false)
	if faults.Hits() < 10 {
		t.Fatalf("only %d produce requests failed: the case tested little", faults.Hits())
	}
	t.Logf("%d of %d produce requests failed", faults.Hits(), b.produceRequests())
}

// testOrderAmbiguous fails about 25% of the partitions of produce requests
// with errors the broker answers after appending (REQUEST_TIMED_OUT,
// NOT_ENOUGH_REPLICAS_AFTER_APPEND): the producer cannot know the events
// are in, so duplicates are allowed, but nothing is lost, each event is
// reported once, and a re-sent event never lands after a later one.
func testOrderAmbiguous(t *testing.T, open Opener) {
	b := newBroker(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{orderTopic}})
	produce := []kmsg.Key{kmsg.Produce}
	faults := b.Cluster().Fault(
		kfake.Fault{Keys: produce, Err: kerr.RequestTimedOut, Count: -1, When: coin(3, 0.15)},
		kfake.Fault{Keys: produce, Err: kerr.NotEnoughReplicasAfterAppend, Count: -1, When: coin(4, 0.12)},
	)
	evs := orderStream()
	p := b.open(open, orderOptions, orderTopic)
	l := deliver(t, b, p, &recorder{}, orderTopic, evs, true)
	if faults.Hits() < 10 {
		t.Fatalf("only %d produce requests failed: the case tested little", faults.Hits())
	}
	t.Logf("%d of %d produce requests failed after the append; %d records for %d events", faults.Hits(), b.produceRequests(), l.records, len(evs))
}

// errDropped is what the broker's control returns to close a connection
// instead of answering.
var errDropped = errors.New("sinktest: response dropped after the append")

// testOrderDroppedResponses makes the broker append some produce requests
// and then close the connection without answering, as when a response is
// lost: duplicates are allowed, but nothing is lost, each event is reported
// once, and a re-sent event never lands after a later one.
func testOrderDroppedResponses(t *testing.T, open Opener) {
	b := newBroker(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{orderTopic}})
	var n int // requests seen; controls run one at a time
	d := b.dropResponses(func() bool {
		n++
		return n%4 == 2 && n < 50
	})
	evs := orderStream()
	p := b.open(open, orderOptions, orderTopic)
	l := deliver(t, b, p, &recorder{}, orderTopic, evs, true)
	dropped, appended, refused := d.counts()
	if appended == 0 {
		t.Fatalf("%d responses dropped, none after appending a batch: the case tested nothing", dropped)
	}
	t.Logf("%d responses dropped: %d batches appended before, %d refused by the broker itself (%v); %d records for %d events",
		dropped, appended, refused, d.refusals(), l.records, len(evs))
}

// drops counts what dropResponses did.
type drops struct {
	dropped, appended, refused atomic.Int64
	mu                         sync.Mutex
	codes                      map[string]int // the refusals, by error
}

// counts returns the responses dropped, and the batches of their requests
// the broker appended and refused.
func (d *drops) counts() (dropped, appended, refused int) {
	return int(d.dropped.Load()), int(d.appended.Load()), int(d.refused.Load())
}

// refusals returns how often the broker refused a batch of a dropped
// response, by error.
func (d *drops) refusals() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.codes)
}

// dropResponses makes the broker handle each produce request for which drop
// returns true and then close the producer's connection without an answer.
// It has the broker handle it by re-sending the request through a kgo client
// of its own before dropping the original. drop runs on the broker's
// goroutine, one call at a time.
//
// The broker's verdict on each batch stands, as it would for the original:
// a producer that pipelines sends batches behind one lost with an earlier
// dropped connection, which the broker refuses out of order. Only a verdict
// no producer of a working broker can get (the request failing, or an error
// other than the sequence's) is a failure of the fault injection.
func (b *broker) dropResponses(drop func() bool) *drops {
	// Produce v13 names topics by ID only; the proxy sends names.
	proxy, err := kgo.NewClient(append(b.ClientOpts(), kgo.MaxVersions(kversion.V3_6_0()))...)
	if err != nil {
		b.t.Fatalf("proxy client: %v", err)
	}
	b.t.Cleanup(proxy.Close)
	var (
		proxying atomic.Bool // the proxy's request is on its way: let everything pass
		d        = &drops{codes: map[string]int{}}
	)
	c := b.Cluster()
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if proxying.Load() || !drop() {
			return nil, nil, false
		}
		req := kreq.(*kmsg.ProduceRequest)
		var (
			resp *kmsg.ProduceResponse
			perr error
		)
		proxying.Store(true)
		c.SleepControl(func() {
			defer proxying.Store(false)
			resp, perr = appendVia(proxy, c, req)
		})
		if perr == nil {
			perr = d.record(resp)
		}
		if perr != nil {
			b.problem("%v", perr)
			return nil, nil, false // the broker answers it itself
		}
		d.dropped.Add(1)
		return nil, errDropped, true
	})
	return d
}

// record counts a proxied request's verdicts; it fails on one a producer of
// a working broker cannot get.
func (d *drops) record(resp *kmsg.ProduceResponse) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			err := kerr.ErrorForCode(rp.ErrorCode)
			switch err {
			case nil:
				d.appended.Add(1)
			case kerr.OutOfOrderSequenceNumber, kerr.DuplicateSequenceNumber:
				d.refused.Add(1)
				d.codes[err.(*kerr.Error).Message]++
			default:
				return fmt.Errorf("append a produce request through the proxy: %s/%d: %w", rt.Topic, rp.Partition, err)
			}
		}
	}
	return nil
}

// appendVia sends a copy of req through cl, which appends its records as
// they are, and returns the broker's answer.
func appendVia(cl *kgo.Client, c *kfake.Cluster, req *kmsg.ProduceRequest) (*kmsg.ProduceResponse, error) {
	cp := *req
	cp.Topics = append([]kmsg.ProduceRequestTopic(nil), req.Topics...)
	for i, rt := range cp.Topics {
		if rt.Topic == "" {
			if info := c.TopicIDInfo(rt.TopicID); info != nil {
				cp.Topics[i].Topic = info.Topic
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), signalTimeout)
	defer cancel()
	kresp, err := cl.Request(ctx, &cp)
	if err != nil {
		return nil, fmt.Errorf("append a produce request through the proxy: %w", err)
	}
	return kresp.(*kmsg.ProduceResponse), nil
}

// testOrderBrokerRestart stops the broker while it holds a produce request
// mid-stream and starts it again on its data directory: nothing is lost,
// each event is reported once, and a re-sent event never lands after a
// later one (what was in flight at the stop may be in the log twice).
func testOrderBrokerRestart(t *testing.T, open Opener) {
	b := newBroker(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{orderTopic}})
	var n atomic.Int64
	g := b.hold(func(*kmsg.ProduceRequest) bool { return n.Add(1) == 8 })
	evs := orderStream()
	p := b.open(open, orderOptions, orderTopic)
	rec := &recorder{}
	rec.produce(t, p, orderTopic, evs...)
	testenv.Eventually(t, signalTimeout, g.holds(1))
	reported := rec.count()
	b.Stop()
	g.open()
	if err := b.Start(); err != nil {
		t.Fatalf("restart the broker: %v", err)
	}
	b.observe()
	l := awaitDelivery(t, b, rec, orderTopic, evs, true)
	t.Logf("broker restarted with %d of %d events reported; %d records for %d events", reported, len(evs), l.records, len(evs))
}

// testOrderLeaderMoves runs a two-broker cluster and moves the leaders of
// the partitions at random three times mid-stream, each while the broker
// holds a produce request: the producer finds the new leaders, nothing is
// lost, each event is reported once, and the log holds each event once, in
// per-key order.
func testOrderLeaderMoves(t *testing.T, open Opener) {
	b := newBroker(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{orderTopic}})
	c := b.Cluster()
	if _, _, err := c.AddNode(-1, 0); err != nil {
		t.Fatalf("add a second broker: %v", err)
	}
	var n atomic.Int64
	moves := []int64{5, 12, 20}
	gates := make([]*gate, len(moves))
	for i, at := range moves {
		gates[i] = b.hold(func(*kmsg.ProduceRequest) bool { return n.Load() == at })
	}
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		n.Add(1) // counted after the gates looked: the k-th request is held by the gate for k-1
		return nil, nil, false
	})
	evs := orderStream()
	p := b.open(open, orderOptions, orderTopic)
	rec := &recorder{}
	rec.produce(t, p, orderTopic, evs...)
	for _, g := range gates {
		testenv.Eventually(t, deliverTimeout, g.holds(1))
		c.ShufflePartitionLeaders()
		g.open()
	}
	l := awaitDelivery(t, b, rec, orderTopic, evs, false)
	t.Logf("leaders moved 3 times; %d produce requests, %d records for %d events", b.produceRequests(), l.records, len(evs))
}

// testAckAfterAppend holds every produce request a moment before the broker
// handles it, and records the partitions' high watermarks at every done:
// each event reported is below the high watermark of its partition, so in
// the log, when its done runs. The broker checks that every produce request
// asks for acks=all (as in every case).
func testAckAfterAppend(t *testing.T, open Opener) {
	const topic = "contract.acks"
	b := newBroker(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{topic}})
	c := b.Cluster()
	delay := coin(5, 0.5)
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if delay(kreq) {
			c.SleepControl(func() { time.Sleep(2 * time.Millisecond) })
		}
		return nil, nil, false
	})
	rec := &recorder{snapshot: func() map[int32]int64 {
		hwm := make(map[int32]int64)
		for _, pi := range c.PartitionInfos(topic) {
			hwm[pi.Partition] = pi.HighWatermark
		}
		return hwm
	}}
	evs := stream(40, 400, 0)
	p := b.open(open, Options{BatchMaxEvents: 10, Retry: fastRetry}, topic)
	l := deliver(t, b, p, rec, topic, evs, false)
	bad := 0
	for _, call := range rec.all() {
		part, ok := l.partitionOf(call.ev)
		offset, in := l.first[string(call.ev.ID)]
		if !ok || !in {
			continue // checkLog said so
		}
		if offset >= call.hwm[part] {
			if bad++; bad <= 5 {
				t.Errorf("done(%s) ran while partition %d ended at offset %d; the event is at offset %d: reported before the broker had it", call.ev.ID, part, call.hwm[part], offset)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d events reported before the broker had them", bad, len(evs))
	}
}

// testMessageTooLarge queues, behind a first event the broker holds, eleven
// more of one key on a topic whose max.message.bytes is 4 KiB, the sixth
// of them 10 KiB: that one is reported once, in its place among the
// others, with an *outbox.EventError of Code "message_too_large"; every
// other event is delivered once, in order.
func testMessageTooLarge(t *testing.T, open Opener) {
	const topic = "contract.small"
	b := newBroker(t, sandbox.KafkaOptions{Partitions: 1})
	if err := b.Cluster().CreateTopic(topic, 1, map[string]string{"max.message.bytes": "4096"}); err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	var evs []*outbox.Event
	for i := range 13 {
		pad := 0
		if i == 6 {
			pad = 10 << 10
		}
		evs = append(evs, newEvent("k000", i, uint64(i), pad))
	}
	big, trailer := evs[6], evs[12]
	g := b.hold(nil)
	p := b.open(open, Options{Retry: fastRetry}, topic)
	rec := &recorder{}
	rec.produce(t, p, topic, evs[0])
	testenv.Eventually(t, signalTimeout, g.holds(1))
	rec.produce(t, p, topic, evs[1:12]...) // one batch, if the producer batches
	g.open()
	testenv.Eventually(t, deliverTimeout, rec.reached(12))
	// Reports of one partition come in order: once the trailer is
	// reported, a second report of the big event would be out of order.
	rec.produce(t, p, topic, trailer)
	testenv.Eventually(t, deliverTimeout, rec.reached(13))

	ok := append(evs[:6:6], evs[7:]...)
	rec.checkReported(t, ok, map[*outbox.Event]string{big: "message_too_large"})
	rec.checkDoneOrder(t, evs, func(*outbox.Event) (int32, bool) { return 0, true })
	checkLog(t, readLog(t, b, topic), ok, false)
	for _, c := range rec.all() {
		if c.ev == big {
			t.Logf("done(%s, %v)", c.ev.ID, c.err)
		}
	}
}

// testEmptyKey produces events with a NULL and an empty AggregateID between
// good ones: each is reported once, from within its Produce, with an
// *outbox.EventError of Code "empty_key"; the good ones are delivered.
func testEmptyKey(t *testing.T, open Opener) {
	const topic = "contract.keys"
	b := newBroker(t, sandbox.KafkaOptions{Partitions: 2, Topics: []string{topic}})
	good := []*outbox.Event{newEvent("k000", 0, 0, 0), newEvent("k000", 1, 3, 0)}
	null := newEvent("k001", 0, 1, 0)
	null.ID, null.AggregateID = []byte("null-key"), nil
	empty := newEvent("k002", 0, 2, 0)
	empty.ID, empty.AggregateID = []byte("empty-key"), []byte{}
	p := b.open(open, Options{Retry: fastRetry}, topic)
	rec := &recorder{}
	rec.produce(t, p, topic, good[0], null, empty, good[1])
	testenv.Eventually(t, deliverTimeout, rec.reached(4))
	rec.checkReported(t, good, map[*outbox.Event]string{null: "empty_key", empty: "empty_key"})
	for _, c := range rec.all() {
		if (c.ev == null || c.ev == empty) && !c.inProduce {
			t.Errorf("done(%s, %v) came after Produce returned; want it from within Produce, the failure is known at once", c.ev.ID, c.err)
		}
	}
	checkLog(t, readLog(t, b, topic), good, false)
}

// testRefusedTopic produces, between events for a good topic, one for a
// topic whose metadata the broker answers with INVALID_TOPIC_EXCEPTION: it
// is reported once with an *outbox.EventError of Code "invalid_topic"; the
// others are delivered. The broker holds the good events until the refused
// one's Done runs, which then waits a moment for a Done of a good event: on
// a producer that calls Done from one goroutine, none can come meanwhile.
func testRefusedTopic(t *testing.T, open Opener) {
	const topic, refused = "contract.good", "contract.refused"
	b := newBroker(t, sandbox.KafkaOptions{Partitions: 2, Topics: []string{topic}})
	faults := b.Cluster().Fault(kfake.Fault{
		Keys: []kmsg.Key{kmsg.Metadata, kmsg.CreateTopics}, Topic: refused, Err: kerr.InvalidTopicException, Count: -1,
	})
	g := b.hold(func(req *kmsg.ProduceRequest) bool { return hasTopic(req, topic) })
	good := stream(5, 20, 0)
	bad := newEvent("k100", 0, 100, 0)
	goodDone := make(chan struct{})
	var once sync.Once
	rec := &recorder{react: func(ev *outbox.Event, _ error) error {
		if ev != bad {
			once.Do(func() { close(goodDone) })
			return nil
		}
		g.open()
		select {
		case <-goodDone:
		case <-time.After(300 * time.Millisecond):
		}
		return nil
	}}
	p := b.open(open, Options{Retry: fastRetry}, topic)
	rec.produce(t, p, topic, good[:10]...)
	testenv.Eventually(t, signalTimeout, g.holds(1))
	rec.produce(t, p, refused, bad)
	rec.produce(t, p, topic, good[10:]...)
	testenv.Eventually(t, deliverTimeout, rec.reached(len(good)+1))
	rec.close(t, p)
	rec.checkReported(t, good, map[*outbox.Event]string{bad: "invalid_topic"})
	l := checkLog(t, readLog(t, b, topic), good, false)
	rec.checkDoneOrder(t, good, l.partitionOf)
	t.Logf("the broker refused %d lookups of %s", faults.Hits(), refused)
	faults.Remove()
	if recs := readLog(t, b, refused); len(recs) > 0 {
		t.Errorf("%d records in the refused topic %s", len(recs), refused)
	}
}

// testCloseAbandons closes a producer while the broker holds every produce
// request (RequestTimeout 30s): Close returns within closeBound, no
// goroutine started since before Open outlives it (the broker's aside),
// and once the broker has answered the held requests no done has run.
//
// Not parallel: it looks at every goroutine of the process.
func testCloseAbandons(t *testing.T, open Opener) {
	const topic = "contract.close"
	b := newBroker(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{topic}})
	g := b.hold(nil)
	before := goroutineStacks()
	p := b.open(open, Options{Retry: fastRetry, RequestTimeout: 30 * time.Second}, topic)
	rec := &recorder{}
	rec.produce(t, p, topic, stream(40, 400, 0)...)
	testenv.Eventually(t, signalTimeout, g.holds(1))

	if d := rec.close(t, p); d > closeBound {
		t.Errorf("Close took %v while the broker held a produce request; want at most %v", d.Round(time.Millisecond), closeBound)
	}
	// A second for goroutines returning right now.
	testenv.Eventually(t, time.Second, func() error {
		if left := newGoroutines(before); len(left) > 0 {
			return fmt.Errorf("%d goroutines started since before Open still run after Close returned:\n\n%s", len(left), strings.Join(left, "\n\n"))
		}
		return nil
	})

	// Let the broker answer what it held (the producer's connections are
	// gone, or should be), then see one more request through it: any
	// answer to the producer has been sent by then.
	held := g.held.Load()
	g.open()
	testenv.Eventually(t, signalTimeout, func() error {
		if r := g.released.Load(); r < held {
			return fmt.Errorf("the broker let %d of %d held requests go", r, held)
		}
		return nil
	})
	recs := readLog(t, b, topic)
	if n := rec.count(); n > 0 {
		c := rec.all()[0]
		t.Errorf("done called %d times though the broker acknowledged nothing before Close, e.g. done(%s, %v) (after Close: %v)", n, c.ev.ID, c.err, c.afterClose)
	}
	t.Logf("Close with %d requests held; %d records appended after it", held, len(recs))
}

// testHaltOnDoneError makes a Done return an error. The broker holds the
// first request (one event) until 200 more events of 20 keys, over every
// partition, are queued behind it; once it answers, the Done of the first
// of those 200 to be reported refuses it. After the refusal: Err returns the
// error, Produce fails, no other event is reported (not even one the same
// response acknowledged, in this partition or another), and no produce
// request for the topic is sent, which a second producer's marker,
// acknowledged after the halt, shows the broker would have seen.
//
// Requests already on the wire at the halt cannot be recalled: with up to
// haltInFlight requests in flight, the broker may still read
// haltInFlight-1 of them after it. One event a batch makes the 200 events
// some 50 requests of four partitions' batches, so a producer that kept
// sending would exceed that by far.
func testHaltOnDoneError(t *testing.T, open Opener) {
	const haltInFlight = 5
	const topic, markers = "contract.halt", "contract.markers"
	b := newBroker(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{topic, markers}})
	var halted atomic.Bool
	var afterHalt atomic.Int64
	g := b.hold(func(req *kmsg.ProduceRequest) bool {
		if !hasTopic(req, topic) {
			return false
		}
		if halted.Load() {
			afterHalt.Add(1)
		}
		return true
	})
	first := newEvent("k000", 0, 0, 0)
	var rest []*outbox.Event
	for i := range 200 {
		rest = append(rest, newEvent(fmt.Sprintf("k%03d", i%20), 1+i/20, uint64(1+i), 0))
	}
	errRefused := errors.New("sinktest: Done refuses the event")
	var refused atomic.Pointer[outbox.Event]
	rec := &recorder{react: func(ev *outbox.Event, _ error) error {
		if ev != first && refused.CompareAndSwap(nil, ev) {
			halted.Store(true)
			return errRefused
		}
		return nil
	}}
	p := b.open(open, Options{Retry: fastRetry, BatchMaxEvents: 1, MaxInFlight: haltInFlight}, topic)
	rec.produce(t, p, topic, first)
	testenv.Eventually(t, signalTimeout, g.holds(1))
	rec.produce(t, p, topic, rest...)
	g.open()
	testenv.Eventually(t, deliverTimeout, func() error {
		if err := p.Err(); err == nil {
			return fmt.Errorf("Err() = %v after Done returned %v (done called %d times)", err, errRefused, rec.count())
		}
		return nil
	})
	if err := p.Err(); !errors.Is(err, errRefused) {
		t.Errorf("Err() = %v, want the error Done returned: %v", err, errRefused)
	}
	late := newEvent("k999", 0, 99, 0)
	if err := p.Produce(sink.Message{Topic: topic, Event: late}, rec.done); err == nil {
		t.Errorf("Produce after the halt returned nil; want an error")
	} else {
		t.Logf("Produce after the halt: %v", err)
	}

	// The positive signal: a marker produced after the halt, by another
	// producer, reaches the broker and is acknowledged.
	marker := newEvent("m000", 0, 0, 0)
	deliver(t, b, b.open(open, Options{Retry: fastRetry}, markers), &recorder{}, markers, []*outbox.Event{marker}, false)
	if n := afterHalt.Load(); n > haltInFlight-1 {
		t.Errorf("%d produce requests for %s reached the broker after Done halted the producer; at most %d can have been in flight then", n, topic, haltInFlight-1)
	} else {
		t.Logf("%d produce requests for %s, sent before the halt, reached the broker after it", n, topic)
	}
	rec.close(t, p)
	rec.checkReported(t, []*outbox.Event{first, refused.Load()}, nil)

	allowed := map[string]bool{string(first.ID): true}
	for _, ev := range rest {
		allowed[string(ev.ID)] = true // sent with the refused one
	}
	log := readLog(t, b, topic)
	seen := map[string]bool{}
	for _, r := range log {
		id := fmt.Sprintf("%s#%d", r.key, r.seq)
		if !allowed[id] || seen[id] {
			t.Errorf("record %v: not sent before the halt, or twice", r)
		}
		seen[id] = true
	}
	if ev := refused.Load(); !seen[string(first.ID)] || !seen[string(ev.ID)] {
		t.Errorf("log %v lacks the acknowledged events %s and %s", log, first.ID, ev.ID)
	}
}

// testBoundedMemory lets the broker fail every produce request
// (NOT_ENOUGH_REPLICAS) while 1000 events (~0.4 MB) are queued, and
// measures the heap in use after a collection once retries are under way
// and again 100 failed requests later: it grows by less than the queued
// bytes plus 8 MiB (retries re-send the batches they have, they do not keep
// copies), and the producer holds less than four times the queued bytes
// plus 16 MiB in all. Then the broker recovers and every event is
// delivered once, in order.
//
// Not parallel: it measures the heap of the process.
func testBoundedMemory(t *testing.T, open Opener) {
	const topic = "contract.memory"
	b := newBroker(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{topic}})
	evs := stream(100, 1000, 300)
	queued := queuedBytes(evs)
	faults := b.Cluster().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotEnoughReplicas, Count: -1})
	failed := func(n int) func() error {
		return func() error {
			if h := faults.Hits(); h < n {
				return fmt.Errorf("%d produce requests failed, want %d", h, n)
			}
			return nil
		}
	}
	h0 := heapInUse()
	p := b.open(open, Options{Retry: backoff.Policy{Base: time.Millisecond, Cap: 5 * time.Millisecond}}, topic)
	rec := &recorder{}
	rec.produce(t, p, topic, evs...)
	testenv.Eventually(t, signalTimeout, failed(20))
	h1, n1 := heapInUse(), faults.Hits()
	testenv.Eventually(t, deliverTimeout, failed(n1+100))
	h2, n2 := heapInUse(), faults.Hits()
	faults.Remove()
	t.Logf("heap in use: %d KiB before Open, %d KiB after %d failed requests, %d KiB after %d; %d KiB queued",
		h0>>10, h1>>10, n1, h2>>10, n2, queued>>10)
	if growth := int64(h2) - int64(h1); growth > int64(queued)+8<<20 {
		t.Errorf("the heap grew by %d KiB over %d failed produce requests with %d KiB queued: retries keep copies", growth>>10, n2-n1, queued>>10)
	}
	if held := int64(h2) - int64(h0); held > 4*int64(queued)+16<<20 {
		t.Errorf("the producer holds %d KiB for %d KiB of queued events", held>>10, queued>>10)
	}
	awaitDelivery(t, b, rec, topic, evs, false)
}

// testEventLifetime poisons every event right after its done returns, on
// another goroutine: each byte of its values, key and headers is
// overwritten, as the relay's
// decoder reuses an event and its buffer for the next row once it is
// settled. Produce requests fail as in Order/TransientErrors, so batches are
// retried around events already reported. A producer that reads an event,
// or bytes it kept of one, after its done (to re-encode a retried batch, to
// count or log it) writes garbage or another event into Kafka: the log must
// hold every event exactly as produced, in order.
func testEventLifetime(t *testing.T, open Opener) {
	b := newBroker(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{orderTopic}})
	produce := []kmsg.Key{kmsg.Produce}
	faults := b.Cluster().Fault(
		kfake.Fault{Keys: produce, Err: kerr.NotLeaderForPartition, Count: -1, When: coin(3, 0.15)},
		kfake.Fault{Keys: produce, Err: kerr.NotEnoughReplicas, Count: -1, When: coin(4, 0.18)},
	)
	want := orderStream()
	given := make([]*outbox.Event, len(want)) // what the producer is given, and what is poisoned
	for i, ev := range want {
		given[i] = cloneEvent(ev)
	}
	// Poisoned on a goroutine of its own, as the relay's next decode may
	// run on another: under -race any read of the event after its done,
	// even one that sends nothing, is a data race with the poisoning.
	var poisoners sync.WaitGroup
	rec := &recorder{react: func(ev *outbox.Event, _ error) error {
		poisoners.Go(func() { poison(ev) })
		return nil
	}}
	p := b.open(open, orderOptions, orderTopic)
	rec.produce(t, p, orderTopic, given...)
	testenv.Eventually(t, deliverTimeout, rec.reached(len(given)))
	poisoners.Wait()
	rec.checkReported(t, given, nil)
	checkLog(t, readLog(t, b, orderTopic), want, false)
	if faults.Hits() < 10 {
		t.Fatalf("only %d produce requests failed: the case tested little", faults.Hits())
	}
}

// cloneEvent returns a copy of ev that shares no bytes with it.
func cloneEvent(ev *outbox.Event) *outbox.Event {
	c := *ev
	c.ID, c.AggregateType, c.AggregateID = slices.Clone(ev.ID), slices.Clone(ev.AggregateType), slices.Clone(ev.AggregateID)
	c.EventType, c.Payload = slices.Clone(ev.EventType), slices.Clone(ev.Payload)
	c.Headers = nil
	for _, h := range ev.Headers {
		c.Headers = append(c.Headers, outbox.Header{Key: h.Key, Value: slices.Clone(h.Value)})
	}
	return &c
}

// poison overwrites every byte ev holds, in place, with decoder.Poison.
func poison(ev *outbox.Event) {
	for _, b := range [][]byte{ev.ID, ev.AggregateType, ev.AggregateID, ev.EventType, ev.Payload} {
		for i := range b {
			b[i] = decoder.Poison
		}
	}
	for _, h := range ev.Headers {
		for i := range h.Value {
			h.Value[i] = decoder.Poison
		}
	}
}
