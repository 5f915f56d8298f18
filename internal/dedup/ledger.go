package dedup

import (
	"sync"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// Ledger tracks, per topic-partition, the offset after the relay's newest
// record of an event at or before a given LSN. It is safe for concurrent use:
// acknowledgements arrive on the producer's goroutine, saves on the
// committer's.
type Ledger struct {
	mu     sync.Mutex
	base   checkpoint.Offsets // what is covered up to the newest Covered LSN
	parts  map[tp]*queue
	last   *queue // the queue of the previous Acked, which the next mostly shares
	lastTP tp
}

type tp struct {
	topic string
	part  int32
}

// queue holds one partition's acknowledgements not yet covered by a
// checkpoint, in commit order, one entry per commit LSN.
type queue struct {
	entries []entry
}

type entry struct {
	lsn  pglogrepl.LSN // commit LSN of the events
	next int64         // offset after the newest of them
}

// NewLedger returns a Ledger that starts from the offsets of the stored
// checkpoint (nil when none were stored).
func NewLedger(stored checkpoint.Offsets) *Ledger {
	base := stored.Clone()
	if base == nil {
		base = checkpoint.Offsets{}
	}
	return &Ledger{base: base, parts: make(map[tp]*queue)}
}

// Register records the partition count of topic and the offsets where its
// partitions end (ends[p]) before the relay first writes to it in this form:
// records of the relay's later events can only come after them.
func (l *Ledger) Register(topic string, ends []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := make(map[int32]int64, len(ends))
	for p, e := range ends {
		next[int32(p)] = e
	}
	l.base[topic] = checkpoint.TopicOffsets{Partitions: len(ends), Next: next}
	for k := range l.parts {
		if k.topic == topic {
			delete(l.parts, k)
		}
	}
	l.last = nil
}

// Acked records that Kafka stored m's event at at, in m.Topic. Call it
// before the acknowledgement can move the watermark past the event, so that
// a checkpoint covering it also covers its offset. Events with an unknown
// offset are ignored.
func (l *Ledger) Acked(m sink.Message, at sink.Stored) {
	if at.Offset < 0 {
		return
	}
	ev := m.Event
	next := at.Offset + 1
	l.mu.Lock()
	k := tp{m.Topic, at.Partition}
	q := l.last
	if q == nil || l.lastTP != k {
		q = l.parts[k]
		if q == nil {
			q = &queue{}
			l.parts[k] = q
		}
		l.last, l.lastTP = q, k
	}
	n := len(q.entries)
	switch {
	case n > 0 && q.entries[n-1].lsn >= ev.CommitLSN:
		// Same transaction (or, after an anomaly, an older one): merge, never
		// letting the offset go back.
		q.entries[n-1].next = max(q.entries[n-1].next, next)
	default:
		if n > 0 {
			next = max(next, q.entries[n-1].next) // offsets only move forward
		}
		q.entries = append(q.entries, entry{lsn: ev.CommitLSN, next: next})
	}
	l.mu.Unlock()
}

// Covered returns the offsets to store with a checkpoint at lsn (every event
// of a transaction ending at or before lsn acknowledged) and forgets what it
// covers. lsn must not decrease between calls; the committer's saves ensure it.
func (l *Ledger) Covered(lsn pglogrepl.LSN) checkpoint.Offsets {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, q := range l.parts {
		i := q.before(lsn)
		if i == 0 {
			continue
		}
		l.raise(k, q.entries[i-1].next)
		q.entries = append(q.entries[:0], q.entries[i:]...)
	}
	return l.base.Clone()
}

// At returns the offsets that hold at lsn without forgetting anything: where
// a stream restarting from lsn may find records of its replayed events.
func (l *Ledger) At(lsn pglogrepl.LSN) checkpoint.Offsets {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.base.Clone()
	for k, q := range l.parts {
		i := q.before(lsn)
		if i == 0 {
			continue
		}
		to, ok := out[k.topic]
		if !ok {
			continue
		}
		if q.entries[i-1].next > to.Next[k.part] {
			to.Next[k.part] = q.entries[i-1].next
		}
	}
	return out
}

// before returns how many of q's entries are of transactions that commit
// before lsn.
func (q *queue) before(lsn pglogrepl.LSN) int {
	i := 0
	for i < len(q.entries) && q.entries[i].lsn < lsn {
		i++
	}
	return i
}

// raise moves the base offset of a partition of a registered topic forward.
func (l *Ledger) raise(k tp, next int64) {
	to, ok := l.base[k.topic]
	if !ok {
		// Acknowledged without Register: its partition count is unknown, so
		// the offsets could not be checked on restart; keep nothing.
		return
	}
	if next > to.Next[k.part] {
		to.Next[k.part] = next
	}
}
