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
	built bool           // pf, gen and ts are set (see Kafka.stamp)
	pf    producerFields // producer id, epoch and base sequence
	gen   int            // the producer session pf belongs to
	ts    int64          // the records' timestamp, Unix ms
	// unknown: the last attempt ended without an answer, so the broker may
	// have appended it; everUnknown: some attempt in this session did.
	unknown, everUnknown bool
	// undecided: after its session was gone, the Verifier could not tell
	// whether Kafka holds it, so it is re-sent without another look.
	undecided bool
}

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
	// sending mirrors inFlight for push: a partition whose batch is in flight is
	// looked at again when the response comes, so a new event need not wake the
	// dispatcher (each wake-up is a futex call and a scheduler round).
	sending atomic.Bool
	// leaderBusy: the partition's leader has a request in flight. The
	// dispatcher looks at every partition again when its response comes, so
	// an event that finds the queue empty need not wake it meanwhile either;
	// with hundreds of partitions most events find their queue empty. Set by
	// the dispatcher (markBusy).
	leaderBusy atomic.Bool

	// Dispatcher-owned.
	// end is the offset after the partition's last acknowledged batch (-1
	// before one): where a batch of unknown fate would be if it was appended.
	end       int64
	leader    int32
	inFlight  bool
	retry     batch // the batch to send next, ahead of the queue (items nil: none)
	limit     int   // event limit while splitting a rejected batch
	attempt   int
	notBefore time.Time
	failing   bool
	spare     []item
	// The producer session the partition's sequence belongs to, and the
	// base sequence of its next batch in that session.
	sess session
	seq  int32
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

// push appends ev to the queue and tells the dispatcher when the queue was empty.
func (p *partition) push(it item) {
	now := time.Now().UnixNano()
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

// next returns the partition's next batch within maxBytes (at least one event):
// the one to retry if any, else a new one from the queue. Its items are nil
// when it has nothing to send.
func (p *partition) next(maxBytes int) batch {
	if p.retry.items != nil {
		b := p.retry
		p.retry = batch{}
		return b
	}
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
		p.queue = p.spare[:0]
		p.spare = nil
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

// recycle keeps a delivered batch's slice for reuse.
func (p *partition) recycle(batch []item) {
	clear(batch)
	p.mu.Lock()
	if p.spare == nil || cap(batch) > cap(p.spare) {
		p.spare = batch[:0]
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
