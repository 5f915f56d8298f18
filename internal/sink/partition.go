package sink

// Partition state: one topic-partition's queue and delivery state.

import (
	"sync"
	"sync/atomic"
	"time"
)

// item is one message in a partition's care, with the Done to tell its fate.
type item struct {
	m    Message
	done Done
	at   time.Time // when Produce took it (the latency split's metrics)
}

// batch is one partition's batch of events and how it was sent. A re-send
// repeats its producer fields and timestamp, so the broker can recognise a
// copy it already appended.
type batch struct {
	items []item
	built bool           // pf, gen and times are set (see Kafka.stamp)
	pf    producerFields // producer id, epoch and base sequence
	gen   int            // the producer session pf belongs to
	times recordTimes    // the records' timestamps
	// unknown: the last attempt ended without an answer, so the broker may
	// have appended it; everUnknown: some attempt in this session did.
	unknown, everUnknown bool
	// undecided: after its session was gone, the Verifier could not tell
	// whether Kafka holds it, so it is re-sent without another look.
	undecided bool
}

// flight is a batch sent to Kafka and not yet reported to its Dones.
type flight struct {
	b     batch
	state flightState
	// offset: where Kafka stored the batch once acked (-1: not said).
	offset int64
	// start: when the batch was last sent; answered: when it was acked.
	start, answered time.Time
	err             error // rejected: the permanent failure to report
}

// flightState is where a sent batch stands.
type flightState uint8

const (
	flying   flightState = iota // sent, no answer yet
	appended                    // acknowledged: reported once the batches before it are
	failed                      // to be sent again
	rejected                    // failed permanently: reported once the batches before it are
)

// partition is one topic-partition: its queue (filled by Produce) and its delivery
// state (owned by the dispatcher).
type partition struct {
	topic  string
	id     int
	k      *Kafka
	events prometheusCounter
	bytes  prometheusCounter

	mu    sync.Mutex
	queue []item
	since int64 // UnixNano when the queue became non-empty
	// sending: the partition takes no new batch now (its in-flight limit is
	// reached, or a failed batch goes first). It is looked at again when a
	// response comes, so a new event need not wake the dispatcher (each
	// wake-up is a futex call and a scheduler round). Set by the dispatcher.
	sending atomic.Bool
	// leaderBusy: the partition's leader has as many requests in flight as
	// it may. The dispatcher looks at every partition again when a response
	// comes, so an event that finds the queue empty need not wake it
	// meanwhile either; with hundreds of partitions most events find their
	// queue empty. Set by the dispatcher (markBusy).
	leaderBusy atomic.Bool

	// Dispatcher-owned.
	// end is the offset after the partition's last reported batch (-1
	// before one): where a batch of unknown fate would be if it was appended.
	end    int64
	leader int32
	// out holds the batches sent and not yet reported, in sequence order,
	// at most Config.MaxInFlight of them. They are reported in that order:
	// an acked batch waits for the ones before it. When one fails, the
	// batches after it fail too (the broker takes a producer's batches only
	// in sequence order); once none is in flight they are sent again in
	// order (resending), ahead of anything new.
	out       []*flight
	resending bool
	// confirmed: a batch of the partition's session was acknowledged. Until
	// then one batch at a time is in flight: a broker that does not know
	// the producer on the partition yet may take any first sequence, so a
	// later batch could land before a failed first one. A broker forgets a
	// producer whose last batch's records are older than
	// producer.id.expiration.ms, so a stale partition is no longer
	// confirmed (Kafka.nextFlight).
	confirmed bool
	verifying bool // a batch of unknown fate is being looked up (verify.go)
	limit     int  // event limit while splitting a rejected batch
	attempt   int
	notBefore time.Time
	failing   bool

	// appendedTs is the greatest record timestamp (Unix ms) of the last
	// batch of the session reported acknowledged: the broker's last
	// timestamp of the producer on the partition, unless a batch still in
	// out is (see stale).
	appendedTs int64
	// spares are delivered batches' slices (at most maxSpares), for the
	// queue to reuse, so a queue taken whole as a batch is replaced without
	// growing a new slice from nothing.
	spares [][]item
	// The producer session the partition's sequence belongs to, and the
	// base sequence of its next new batch in that session.
	sess session
	seq  int32
}

// flying counts p's batches in flight.
func (p *partition) flying() int {
	n := 0
	for _, f := range p.out {
		if f.state == flying {
			n++
		}
	}
	return n
}

// stale reports whether the broker may have forgotten the producer on p by
// the time a batch sent now arrives: Kafka expires a producer whose last
// batch appended on the partition has a greatest record timestamp older
// than producer.id.expiration.ms, which rows' own timestamps (a backlog, a
// replay) can be from the start; bound is now less Config.ProducerIdle. Any
// batch in flight or acknowledged out of order may be that last batch.
func (p *partition) stale(bound int64) bool {
	if p.appendedTs <= bound {
		return true
	}
	for _, f := range p.out {
		if (f.state == flying || f.state == appended) && f.b.times.max <= bound {
			return true
		}
	}
	return false
}

// firstFailed returns p's first batch to send again, or nil.
func (p *partition) firstFailed() *flight {
	for _, f := range p.out {
		if f.state == failed {
			return f
		}
	}
	return nil
}

// settledBefore reports whether every batch before f was appended.
func (p *partition) settledBefore(f *flight) bool {
	for _, g := range p.out {
		if g == f {
			return true
		}
		if g.state != appended {
			return false
		}
	}
	return true
}

// rewind makes f's sequence the partition's next and marks every batch
// after f to take a new one when it is sent again: f will not be appended
// as it was (it was rejected, or split), so neither will they, as the broker
// appends a producer's batches only in sequence order.
func (p *partition) rewind(f *flight, sess session) {
	if f.b.built && f.b.pf.id >= 0 && f.b.gen == sess.gen && p.sess.gen == sess.gen {
		p.seq = f.b.pf.seq
	}
	after := false
	for _, g := range p.out {
		if after {
			g.b.gen = 0 // no session's: stamp gives it a new sequence
			g.b.unknown, g.b.everUnknown = false, false
		}
		after = after || g == f
	}
}

// prometheusCounter is the part of a Prometheus counter the partition uses.
type prometheusCounter interface{ Add(float64) }

func newPartition(k *Kafka, topic string, id int, leader int32) *partition {
	return &partition{
		topic: topic, id: id, k: k, leader: leader, end: -1,
		events: k.cfg.Metrics.EventsPublished.WithLabelValues(topic),
		bytes:  k.cfg.Metrics.BytesPublished.WithLabelValues(topic),
	}
}

// push appends it to the queue, taken at now (UnixNano), and tells the
// dispatcher when the queue was empty.
func (p *partition) push(it item, now int64) {
	p.k.lastPush.Store(now)
	p.mu.Lock()
	p.queue = append(p.queue, it)
	first := len(p.queue) == 1
	if first {
		p.since = now
	}
	p.mu.Unlock()
	if first && !p.sending.Load() && !p.leaderBusy.Load() {
		p.k.signal()
	}
}

// next returns a new batch from the queue within maxBytes (at least one
// event). Its items are nil when the queue is empty.
func (p *partition) next(maxBytes int) batch {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) == 0 {
		return batch{}
	}
	maxEvents := p.k.cfg.BatchMaxEvents
	if p.limit > 0 && p.limit < maxEvents {
		maxEvents = p.limit
	}
	if maxBytes > p.k.cfg.BatchMaxBytes {
		maxBytes = p.k.cfg.BatchMaxBytes
	}
	n, size := 0, 0
	for n < len(p.queue) && n < maxEvents {
		s := p.k.eventSize(p.queue[n].m.Event)
		if n > 0 && size+s > maxBytes {
			break
		}
		size += s
		n++
	}
	if n == len(p.queue) {
		items := p.queue
		p.queue = nil
		if n := len(p.spares); n > 0 {
			p.queue, p.spares[n-1] = p.spares[n-1][:0], nil
			p.spares = p.spares[:n-1]
		}
		return batch{items: items}
	}
	items := make([]item, n)
	copy(items, p.queue)
	rest := copy(p.queue, p.queue[n:])
	clear(p.queue[rest:])
	p.queue = p.queue[:rest]
	return batch{items: items}
}

// unshift puts events back at the front of the queue (the later half of a split
// batch), ahead of everything queued since.
func (p *partition) unshift(events []item) {
	p.mu.Lock()
	q := make([]item, 0, len(events)+len(p.queue))
	q = append(q, events...)
	p.queue = append(q, p.queue...)
	p.mu.Unlock()
}

// maxSpares bounds a partition's spare slices: each may hold a full batch's
// worth of items, memory the garbage collector walks.
const maxSpares = 2

// recycle keeps a delivered batch's slice for reuse.
func (p *partition) recycle(batch []item) {
	clear(batch)
	p.mu.Lock()
	if len(p.spares) < maxSpares {
		p.spares = append(p.spares, batch[:0])
	}
	p.mu.Unlock()
}

// queued returns the queue's length and when it became non-empty.
func (p *partition) queued() (int, int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue), p.since
}

// hasQueued reports whether the queue has events.
func (p *partition) hasQueued() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue) > 0
}
