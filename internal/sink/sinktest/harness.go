package sinktest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// fastRetry keeps cases with many failed attempts short.
var fastRetry = backoff.Policy{Base: time.Millisecond, Cap: 20 * time.Millisecond}

// broker is a case's in-process Kafka broker. It records the acks of every
// produce request it sees.
type broker struct {
	*sandbox.Kafka
	t *testing.T

	mu       sync.Mutex
	produces int      // produce requests seen
	badAcks  []int16  // the acks of those not asking for acks=all
	problems []string // failures of the suite's own fault injection
}

// problem notes that fault injection went wrong, from any goroutine; t
// fails with it when it ends.
func (b *broker) problem(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.problems = append(b.problems, fmt.Sprintf(format, args...))
}

// newBroker starts a broker for t, skipping t unless it is local (the cases
// inject faults), and checks when t ends that every produce request asked for
// acks=all.
func newBroker(t *testing.T, opts sandbox.KafkaOptions) *broker {
	t.Helper()
	k := testenv.NewKafka(t, opts)
	testenv.RequireLocalKafka(t, k)
	b := &broker{Kafka: k, t: t}
	b.observe()
	t.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, p := range b.problems {
			t.Errorf("fault injection: %s", p)
		}
		if len(b.badAcks) > 0 {
			t.Errorf("%d of %d produce requests did not ask for acks=all (-1): acks %v", len(b.badAcks), b.produces, b.badAcks[:min(len(b.badAcks), 10)])
		}
	})
	return b
}

// observe installs the acks check: the first produce control, which lets
// the broker (and the controls added later) handle every request. Call it
// again after a restart, which starts a cluster without controls.
func (b *broker) observe() {
	c := b.Cluster()
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		b.mu.Lock()
		b.produces++
		if req.Acks != -1 {
			b.badAcks = append(b.badAcks, req.Acks)
		}
		b.mu.Unlock()
		return nil, nil, false
	})
}

// produceRequests returns how many produce requests the broker saw.
func (b *broker) produceRequests() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.produces
}

// open opens a producer with open and closes it when t ends, unless the case
// closed it.
func (b *broker) open(open Opener, opts Options, topics ...string) Producer {
	b.t.Helper()
	p := &closeOnce{Producer: open(b.t, b.Brokers(), topics, opts)}
	b.t.Cleanup(func() {
		if err := p.Close(); err != nil {
			b.t.Errorf("close producer: %v", err)
		}
	})
	return p
}

// closeOnce makes Close idempotent, so a case can close its producer and
// the cleanup need not know.
type closeOnce struct {
	Producer
	once sync.Once
	err  error
}

// Close closes the producer the first time, and returns that answer every
// time.
func (p *closeOnce) Close() error {
	p.once.Do(func() { p.err = p.Producer.Close() })
	return p.err
}

// gate holds the produce requests a broker sees, those match selects, until
// it is opened; requests that arrive once it is open pass at once.
type gate struct {
	ch       chan struct{}
	once     sync.Once
	isOpen   atomic.Bool
	held     atomic.Int64 // requests held so far
	released atomic.Int64 // held requests let go to the broker
}

// hold installs a gate on b's current cluster. match runs on the broker's
// goroutine for every produce request, so it must not block; nil matches
// every request. The gate opens when t ends at the latest.
func (b *broker) hold(match func(*kmsg.ProduceRequest) bool) *gate {
	g := &gate{ch: make(chan struct{})}
	c := b.Cluster()
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if (match == nil || match(kreq.(*kmsg.ProduceRequest))) && !g.isOpen.Load() {
			g.held.Add(1)
			c.SleepControl(func() { <-g.ch })
			g.released.Add(1)
		}
		return nil, nil, false
	})
	b.t.Cleanup(g.open)
	return g
}

// open lets the held requests and all later ones through.
func (g *gate) open() {
	g.once.Do(func() {
		g.isOpen.Store(true)
		close(g.ch)
	})
}

// holds returns a testenv.Eventually condition: the gate holds at least n
// requests.
func (g *gate) holds(n int) func() error {
	return func() error {
		if h := g.held.Load(); h < int64(n) {
			return fmt.Errorf("the broker holds %d produce requests, want %d", h, n)
		}
		return nil
	}
}

// hasTopic reports whether req carries records for topic.
func hasTopic(req *kmsg.ProduceRequest, topic string) bool {
	for _, rt := range req.Topics {
		if rt.Topic == topic {
			return true
		}
	}
	return false
}

// eventPayload is the value of the suite's events: which key, and the
// event's number among the key's events.
type eventPayload struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
	Pad string `json:"pad,omitempty"`
}

// commitBase is the commit time of the first event.
var commitBase = time.Date(2024, 5, 17, 10, 30, 0, 0, time.UTC)

// newEvent returns the seq-th event of key, the n-th of its case, with pad
// bytes of filler in its payload.
func newEvent(key string, seq int, n uint64, pad int) *outbox.Event {
	p, err := json.Marshal(eventPayload{Key: key, Seq: seq, Pad: strings.Repeat("p", pad)})
	if err != nil {
		panic(err)
	}
	return &outbox.Event{
		ID:            fmt.Appendf(nil, "%s#%d", key, seq),
		AggregateType: []byte("order"),
		AggregateID:   []byte(key),
		EventType:     []byte("order.updated"),
		Payload:       p,
		XID:           uint32(1000 + n),
		CommitLSN:     pglogrepl.LSN(0x16B3748 + n*128),
		CommitTime:    commitBase.Add(time.Duration(n) * time.Millisecond),
	}
}

// stream returns total events spread round-robin over keys aggregates, each
// with pad bytes of filler.
func stream(keys, total, pad int) []*outbox.Event {
	next := make([]int, keys)
	evs := make([]*outbox.Event, 0, total)
	for i := range total {
		k := i % keys
		evs = append(evs, newEvent(fmt.Sprintf("k%03d", k), next[k], uint64(i), pad))
		next[k]++
	}
	return evs
}

// doneCall is one call of a recorder's Done.
type doneCall struct {
	ev  *outbox.Event
	err error
	// inProduce: the call came from within Produce of ev.
	inProduce bool
	// afterClose: the call came after Close of the producer returned.
	afterClose bool
	// afterHalt: the call came after a Done had returned an error.
	afterHalt bool
	// concurrent: another call not from within Produce was running.
	concurrent bool
	// lostTag: the Message's Tag was not the one Produce was given.
	lostTag bool
	// hwm is the high watermark of every partition of the topic at the
	// call, when the recorder snapshots them.
	hwm map[int32]int64
}

// recorder is the Done of a case's events: it records every call, and
// answers with what react returns.
type recorder struct {
	// react, when set, is what Done returns for a call.
	react func(ev *outbox.Event, err error) error
	// snapshot, when set, is called at every Done and its answer kept.
	snapshot func() map[int32]int64

	producing atomic.Pointer[outbox.Event] // the event whose Produce runs
	tags      sync.Map                     // *outbox.Event → the Tag Produce was given
	nextTag   atomic.Uint64
	closed    atomic.Bool  // Close of the producer returned
	halted    atomic.Bool  // a call returned an error
	active    atomic.Int32 // calls running, except from within Produce

	mu    sync.Mutex
	calls []doneCall
}

// done is the sink.Done given to Produce.
func (r *recorder) done(m sink.Message, _ sink.Stored, err error) error {
	ev := m.Event
	c := doneCall{ev: ev, err: err, inProduce: r.producing.Load() == ev, afterClose: r.closed.Load(), afterHalt: r.halted.Load()}
	if tag, ok := r.tags.Load(ev); !ok || tag.(uint64) != m.Tag {
		c.lostTag = true
	}
	if !c.inProduce {
		c.concurrent = r.active.Add(1) > 1
		defer r.active.Add(-1)
	}
	if r.snapshot != nil {
		c.hwm = r.snapshot()
	}
	var ret error
	if r.react != nil {
		ret = r.react(ev, err)
	}
	if ret != nil {
		r.halted.Store(true)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
	return ret
}

// produce gives evs to p for topic, failing t if Produce returns an error.
func (r *recorder) produce(t testing.TB, p Producer, topic string, evs ...*outbox.Event) {
	t.Helper()
	for _, ev := range evs {
		r.producing.Store(ev)
		tag := r.nextTag.Add(1)
		r.tags.Store(ev, tag)
		err := p.Produce(sink.Message{Topic: topic, Event: ev, Tag: tag}, r.done)
		r.producing.Store(nil)
		if err != nil {
			t.Fatalf("Produce %s to %s: %v (the producer has not halted)", ev.ID, topic, err)
		}
	}
}

// close closes p and notes that later Done calls come after Close.
func (r *recorder) close(t testing.TB, p Producer) time.Duration {
	t.Helper()
	start := time.Now()
	err := p.Close()
	d := time.Since(start)
	r.closed.Store(true)
	if err != nil {
		t.Errorf("Close: %v", err)
	}
	return d
}

// all returns the calls so far.
func (r *recorder) all() []doneCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// count returns the number of calls so far.
func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

// reached returns a testenv.Eventually condition: at least n calls.
func (r *recorder) reached(n int) func() error {
	return func() error {
		if c := r.count(); c < n {
			return fmt.Errorf("done called %d times, want %d", c, n)
		}
		return nil
	}
}

// checkReported fails t unless every event of ok was reported exactly once
// with a nil error, every event of failed exactly once with an
// *outbox.EventError of the given code, nothing else was reported, and
// nothing after Close returned.
func (r *recorder) checkReported(t testing.TB, ok []*outbox.Event, failed map[*outbox.Event]string) {
	t.Helper()
	want := make(map[*outbox.Event]bool, len(ok)+len(failed))
	for _, ev := range ok {
		want[ev] = true
	}
	for ev := range failed {
		want[ev] = true
	}
	seen := make(map[*outbox.Event]int)
	bad := 0
	report := func(format string, args ...any) {
		if bad++; bad <= 10 {
			t.Errorf(format, args...)
		}
	}
	for _, c := range r.all() {
		seen[c.ev]++
		switch code, isFailed := failed[c.ev]; {
		case c.afterHalt:
			report("done(%s, %v) called after a Done had returned an error, which halts the producer", c.ev.ID, c.err)
		case !want[c.ev]:
			report("done(%s, %v) for an event the case did not expect to be reported", c.ev.ID, c.err)
		case seen[c.ev] > 1:
			report("done(%s, %v): reported %d times", c.ev.ID, c.err, seen[c.ev])
		case isFailed:
			var ee *outbox.EventError
			if !errors.As(c.err, &ee) || ee.Code != code {
				report("done(%s, %v): want an *outbox.EventError with Code %q", c.ev.ID, c.err, code)
			}
		case c.err != nil:
			report("done(%s, %v): want nil, the event was deliverable", c.ev.ID, c.err)
		}
		if c.afterClose {
			report("done(%s, %v) called after Close returned", c.ev.ID, c.err)
		}
		if c.lostTag {
			report("done(%s, %v): the Message's Tag is not the one Produce was given", c.ev.ID, c.err)
		}
		if c.concurrent {
			report("done(%s, %v) ran while another Done call ran on another goroutine; Done runs on the producer's goroutine (or within Produce)", c.ev.ID, c.err)
		}
	}
	missing := 0
	for ev := range want {
		if seen[ev] == 0 {
			if missing++; missing <= 5 {
				t.Errorf("event %s never reported", ev.ID)
			}
		}
	}
	if bad > 10 || missing > 5 {
		t.Errorf("... %d bad and %d missing reports in all", bad, missing)
	}
}

// checkDoneOrder fails t unless, for every partition, Done calls came in the
// order the events were produced. partition maps an event to its partition;
// events it does not know (ok false) are left out.
func (r *recorder) checkDoneOrder(t testing.TB, produced []*outbox.Event, partition func(*outbox.Event) (int32, bool)) {
	t.Helper()
	index := make(map[*outbox.Event]int, len(produced))
	for i, ev := range produced {
		index[ev] = i
	}
	last := make(map[int32]*outbox.Event)
	bad := 0
	for _, c := range r.all() {
		p, ok := partition(c.ev)
		if !ok {
			continue
		}
		if prev := last[p]; prev != nil && index[c.ev] < index[prev] {
			if bad++; bad <= 5 {
				t.Errorf("partition %d: done(%s) came after done(%s), but %s was produced first", p, c.ev.ID, prev.ID, c.ev.ID)
			}
		}
		if prev := last[p]; prev == nil || index[c.ev] > index[prev] {
			last[p] = c.ev
		}
	}
	if bad > 5 {
		t.Errorf("... %d Done calls out of produce order in all", bad)
	}
}

// logged is one record of the case's topic as read back: which event and
// where.
type logged struct {
	key       string
	seq       int
	partition int32
	offset    int64
}

// String names the record for failure messages: key#seq@partition/offset.
func (r logged) String() string {
	return fmt.Sprintf("%s#%d@%d/%d", r.key, r.seq, r.partition, r.offset)
}

// readLog reads every record of topic with testenv's reader, in partition
// and offset order, and decodes which event each is; it fails t on a record
// that is not one of the suite's.
func readLog(t testing.TB, b *broker, topic string) []logged {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	recs, err := b.ReadAll(ctx, topic)
	if err != nil {
		t.Fatalf("read back %s: %v", topic, err)
	}
	out := make([]logged, 0, len(recs))
	for _, r := range recs {
		var p eventPayload
		if err := json.Unmarshal(r.Value, &p); err != nil {
			t.Fatalf("record %s/%d@%d: value %.40q is not an event of the suite: %v", r.Topic, r.Partition, r.Offset, r.Value, err)
		}
		if string(r.Key) != p.Key {
			t.Fatalf("record %s/%d@%d: key %q, but the value is of key %q", r.Topic, r.Partition, r.Offset, r.Key, p.Key)
		}
		out = append(out, logged{key: p.Key, seq: p.Seq, partition: r.Partition, offset: r.Offset})
	}
	return out
}

// logOf is what checkLog learnt of a topic's log.
type logOf struct {
	partition map[string]int32 // by key
	first     map[string]int64 // offset of the first copy of each event, by ID
	records   int
}

// partitionOf returns the partition of ev's key in the log.
func (l logOf) partitionOf(ev *outbox.Event) (int32, bool) {
	p, ok := l.partition[string(ev.AggregateID)]
	return p, ok
}

// checkLog fails t unless the log holds exactly the events of want, each
// key in one partition, and in the order of want per key, read both by the
// first and by the last copy of each event: a re-sent batch may leave
// duplicates (when dups), but it never lands after a later event of its key.
// Without dups every event is in the log once.
func checkLog(t testing.TB, log []logged, want []*outbox.Event, dups bool) logOf {
	t.Helper()
	wantSeqs := make(map[string][]int)
	for _, ev := range want {
		var p eventPayload
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			t.Fatalf("event %s: %v", ev.ID, err)
		}
		wantSeqs[p.Key] = append(wantSeqs[p.Key], p.Seq)
	}
	out := logOf{partition: make(map[string]int32), first: make(map[string]int64), records: len(log)}
	got := make(map[string][]logged)
	for _, r := range log {
		if p, ok := out.partition[r.key]; ok && p != r.partition {
			t.Errorf("key %s in partitions %d and %d", r.key, p, r.partition)
		}
		out.partition[r.key] = r.partition
		got[r.key] = append(got[r.key], r)
		id := fmt.Sprintf("%s#%d", r.key, r.seq)
		if _, ok := out.first[id]; !ok {
			out.first[id] = r.offset
		}
	}
	bad := 0
	report := func(format string, args ...any) {
		if bad++; bad <= 10 {
			t.Errorf(format, args...)
		}
	}
	for key := range got {
		if wantSeqs[key] == nil {
			report("key %s: %d records of a key the case did not produce", key, len(got[key]))
		}
	}
	for key, seqs := range wantSeqs {
		recs := got[key]
		firsts, lasts := dedup(recs, false), dedup(recs, true)
		var missing []int
		for _, s := range seqs {
			if !slices.Contains(firsts, s) {
				missing = append(missing, s)
			}
		}
		switch {
		case len(missing) > 0:
			report("key %s: events %v are not in the log (records %v)", key, missing, recs)
		case !slices.Equal(seqs, firsts):
			report("key %s: events by first copy in the log %v, want %v: reordered or foreign (records %v)", key, firsts, seqs, recs)
		case !slices.Equal(seqs, lasts):
			report("key %s: events by last copy in the log %v, want %v: a re-sent event landed after a later one (records %v)", key, lasts, seqs, recs)
		case !dups && len(recs) != len(seqs):
			report("key %s: %d records for %d events: duplicates where the broker never appended twice (records %v)", key, len(recs), len(seqs), recs)
		}
	}
	if bad > 10 {
		t.Errorf("... %d keys wrong in all", bad)
	}
	return out
}

// dedup returns the sequence numbers of recs with only the first (or last)
// copy of each kept.
func dedup(recs []logged, keepLast bool) []int {
	count := make(map[int]int)
	for _, r := range recs {
		count[r.seq]++
	}
	seen := make(map[int]int)
	var out []int
	for _, r := range recs {
		seen[r.seq]++
		if (!keepLast && seen[r.seq] == 1) || (keepLast && seen[r.seq] == count[r.seq]) {
			out = append(out, r.seq)
		}
	}
	return out
}

// queuedBytes is the in-memory size of evs.
func queuedBytes(evs []*outbox.Event) int {
	n := 0
	for _, ev := range evs {
		n += ev.Size()
	}
	return n
}

// heapInUse returns the bytes of heap in use after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC() // the first may leave sync.Pool victims behind
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// goroutineStacks returns the stack of every goroutine by its id.
func goroutineStacks() map[int]string {
	out := make(map[int]string)
	for _, g := range testenv.GoroutineStacks() {
		var id int
		if _, err := fmt.Sscanf(g, "goroutine %d", &id); err == nil {
			out[id] = g
		}
	}
	return out
}

// newGoroutines returns the stacks of the goroutines not in before, except
// the broker's (kfake's, and those it started, such as a held request's).
func newGoroutines(before map[int]string) []string {
	var out []string
	for id, g := range goroutineStacks() {
		if _, ok := before[id]; ok || strings.Contains(g, "twmb/franz-go/pkg/kfake") {
			continue
		}
		out = append(out, g)
	}
	return out
}
