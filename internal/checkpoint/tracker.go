// Package checkpoint decides how far the relay may confirm the replication slot and
// remembers it across restarts.
//
// A Tracker turns Kafka acknowledgements into a watermark: the end LSN of the newest
// transaction whose events, and those of every transaction before it, have all been
// acknowledged (DESIGN invariant 1). A Store persists that watermark per slot, in a table
// of the source database (TableStore) or in a local file (FileStore). The Committer
// alone writes it while streaming, and the Opening it is built from at start-up
// (snapshot marker, position after a snapshot or backfill, where streaming starts).
// Whether a stored checkpoint and the slot disagree is a gap, judged by
// internal/gaps (DESIGN invariant 6).
//
// The relay writes the store before it confirms the slot: the stored LSN is therefore
// never behind the slot's confirmed_flush_lsn, and a slot ahead of the store means
// someone else moved or recreated it.
package checkpoint

import (
	"context"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/jackc/pglogrepl"
)

// txn is the acknowledgement state of one transaction.
type txn struct {
	added     int
	acked     int
	committed bool
	end       pglogrepl.LSN
	at        time.Time // commit time
}

// TxnBytes is what one tracked transaction costs the Tracker's memory: its
// entry, twice, as the ring doubles when full. The relay counts it against
// its read-ahead bound with every event, as an event may be its
// transaction's only one.
const TxnBytes = 2 * int(unsafe.Sizeof(txn{}))

func (x *txn) done() bool { return x.committed && x.acked == x.added }

// Tracker computes the acknowledgement watermark of DESIGN invariant 1.
//
// The replication goroutine calls Begin, Add and Commit in stream order; sink
// goroutines call Ack in any order. Every event must be counted with Add before it is
// handed to the sink, so that an Ack can never arrive for an event the Tracker does not
// know. Transactions are identified by the sequence number Begin returns; sequence
// numbers keep increasing across Reset, so a late Ack from before a Reset is recognised
// as stale instead of being credited to a new transaction.
//
// Misuse never moves the watermark: an Ack or Add for a sequence number that is not
// tracked (already confirmed, forgotten by Reset, or never begun), an Ack of more events
// than were added, a negative count, or a second Commit is ignored, counted, and
// reported by Anomalies. Ignoring an excess Ack as a whole leaves its transaction
// unacknowledged, so the watermark stalls there — visible in InFlight and Anomalies —
// rather than advance past an event that may never have reached Kafka.
//
// A Tracker is safe for concurrent use. Add, Ack and Commit are O(1) amortised: open
// transactions live in a ring indexed by seq minus the oldest tracked seq.
type Tracker struct {
	mu sync.Mutex

	ring    []txn  // power-of-two capacity; ring[(head+i)&mask] is txn headSeq+i
	head    int    // physical index of headSeq in ring
	n       int    // number of tracked transactions
	headSeq uint64 // seq of the oldest tracked transaction
	nextSeq uint64 // seq the next Begin returns

	watermark pglogrepl.LSN
	delivered uint64        // transactions with events the watermark has passed
	markTime  time.Time     // commit time of the watermark's transaction (see Position)
	maxEnd    pglogrepl.LSN // highest end LSN of the stream since the last Reset, for the order check
	events    int           // events added and not yet acknowledged

	drained chan struct{} // made by WaitDrained while events > 0, closed when events drops to 0

	anomalies   uint64
	lastAnomaly error
}

// NewTracker returns a Tracker whose watermark starts at start, typically the LSN
// streaming starts from.
func NewTracker(start pglogrepl.LSN) *Tracker {
	return &Tracker{
		ring:      make([]txn, 64),
		watermark: start,
		maxEnd:    start,
	}
}

// Begin opens a transaction and returns its sequence number. Sequence numbers increase
// by one with every call, for the Tracker's whole life.
func (t *Tracker) Begin() uint64 { return t.BeginAt(time.Time{}) }

// BeginAt is Begin for a transaction that committed at commitTime (pgoutput's
// Begin message carries it), which OldestPending reports while its events
// wait.
func (t *Tracker) BeginAt(commitTime time.Time) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == len(t.ring) {
		t.grow()
	}
	seq := t.nextSeq
	t.nextSeq++
	t.ring[(t.head+t.n)&(len(t.ring)-1)] = txn{at: commitTime}
	t.n++
	return seq
}

// grow doubles the ring, keeping the tracked transactions in order. Called with mu held.
func (t *Tracker) grow() {
	ring := make([]txn, 2*len(t.ring))
	for i := 0; i < t.n; i++ {
		ring[i] = t.ring[(t.head+i)&(len(t.ring)-1)]
	}
	t.ring, t.head = ring, 0
}

// get returns the tracked transaction seq, or nil. Called with mu held.
func (t *Tracker) get(seq uint64) *txn {
	if seq < t.headSeq || seq-t.headSeq >= uint64(t.n) {
		return nil
	}
	return &t.ring[(t.head+int(seq-t.headSeq))&(len(t.ring)-1)]
}

// Add counts n more events in transaction seq. Call it before handing the events to
// the sink. Adding to a committed transaction that is still tracked is counted as an
// anomaly but honoured, because that only holds the watermark back.
func (t *Tracker) Add(seq uint64, n int) {
	if n == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	x := t.get(seq)
	switch {
	case n < 0:
		t.anomaly("add %d events to txn %d: negative count ignored", n, seq)
		return
	case x == nil:
		t.anomaly("add %d events to txn %d: txn is not tracked (next seq %d, oldest tracked %d); ignored",
			n, seq, t.nextSeq, t.headSeq)
		return
	case x.committed:
		t.anomaly("add %d events to txn %d: txn already committed; counted anyway", n, seq)
	}
	x.added += n
	t.addEvents(n)
}

// Commit closes transaction seq, whose commit record ends at end and which committed
// at at. A transaction with no events counts as acknowledged at once. An end LSN lower than one committed before is
// an anomaly: the transaction then counts with the highest end LSN seen, so the
// watermark never moves backwards.
func (t *Tracker) Commit(seq uint64, end pglogrepl.LSN, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	x := t.get(seq)
	switch {
	case x == nil:
		t.anomaly("commit txn %d at %s: txn is not tracked (next seq %d, oldest tracked %d); ignored",
			seq, end, t.nextSeq, t.headSeq)
		return
	case x.committed:
		t.anomaly("commit txn %d at %s: txn already committed at %s; ignored", seq, end, x.end)
		return
	}
	if end < t.maxEnd {
		t.anomaly("commit txn %d at %s: end LSN is below an earlier commit's %s; using %s",
			seq, end, t.maxEnd, t.maxEnd)
		end = t.maxEnd
	}
	t.maxEnd = end
	x.committed, x.end, x.at = true, end, at
	t.advance()
}

// Ack records that n events of transaction seq were acknowledged by Kafka. It may be
// called from any goroutine, in any order, and before the transaction is committed.
// See the Tracker documentation for what happens to an Ack that does not fit.
func (t *Tracker) Ack(seq uint64, n int) {
	if n == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	x := t.get(seq)
	switch {
	case n < 0:
		t.anomaly("ack %d events of txn %d: negative count ignored", n, seq)
		return
	case x == nil:
		t.anomaly("ack %d events of txn %d: txn is not tracked (next seq %d, oldest tracked %d); ignored",
			n, seq, t.nextSeq, t.headSeq)
		return
	case x.acked+n > x.added:
		t.anomaly("ack %d events of txn %d: only %d of %d events unacknowledged; ignored",
			n, seq, x.added-x.acked, x.added)
		return
	}
	x.acked += n
	t.addEvents(-n)
	if seq == t.headSeq {
		t.advance()
	}
}

// advance drops finished transactions from the head and moves the watermark to the
// newest one's end. Called with mu held.
func (t *Tracker) advance() {
	for t.n > 0 {
		x := &t.ring[t.head]
		if !x.done() {
			break
		}
		if x.end > t.watermark {
			t.watermark = x.end
		}
		if x.added > 0 {
			t.delivered++
		}
		t.markTime = x.at
		*x = txn{}
		t.head = (t.head + 1) & (len(t.ring) - 1)
		t.n--
		t.headSeq++
	}
}

// addEvents changes the count of unacknowledged events and wakes WaitDrained callers
// when it reaches zero. Called with mu held.
func (t *Tracker) addEvents(n int) {
	t.events += n
	if t.events == 0 && t.drained != nil {
		close(t.drained)
		t.drained = nil
	}
}

// anomaly counts a misuse. Called with mu held.
func (t *Tracker) anomaly(format string, args ...any) {
	t.anomalies++
	t.lastAnomaly = fmt.Errorf(format, args...)
}

// Watermark returns the LSN that may be confirmed to the slot and written to the store:
// the end LSN of the newest transaction that, with every transaction before it, is
// committed and fully acknowledged. It never decreases.
func (t *Tracker) Watermark() pglogrepl.LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.watermark
}

// Position returns the watermark with the commit time of the transaction it ends: no
// transaction after the watermark committed before that time (up to the small disorder
// of commit timestamps). After an idle advance the time is that of the advance. It is
// zero until the first transaction or idle advance since NewTracker.
//
// The time is the server's latest, not the highest seen: after the server's clock
// steps back, later commits carry the stepped-back clock, and a time kept from
// before the step would be later than them.
func (t *Tracker) Position() (pglogrepl.LSN, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.watermark, t.markTime
}

// Delivered returns how many transactions with events the watermark has passed since
// NewTracker: when it has not changed, a moved watermark only skipped empty
// transactions or idle WAL.
func (t *Tracker) Delivered() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.delivered
}

// Idle moves the watermark to serverWALEnd if nothing is in flight — no transaction open
// or unacknowledged — and serverWALEnd is ahead of it, so an idle outbox does not make
// Postgres retain WAL (DESIGN invariant 4). It reports whether the watermark moved.
//
// The caller must have received the whole stream up to serverWALEnd, as it has when
// serverWALEnd is the WAL end of a primary keepalive handled by the goroutine that also
// calls Begin. serverTime is the keepalive's server clock, which Position reports after
// the advance (transactions after serverWALEnd commit after it, on the same clock).
func (t *Tracker) Idle(serverWALEnd pglogrepl.LSN, serverTime time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n > 0 || t.events > 0 || serverWALEnd <= t.watermark {
		return false
	}
	t.watermark = serverWALEnd
	t.markTime = serverTime
	if serverWALEnd > t.maxEnd {
		t.maxEnd = serverWALEnd
	}
	return true
}

// OldestPending returns the commit time of the oldest transaction with an
// event Kafka has not acknowledged yet, and false when there is none. The
// stream reads transactions in commit order, so while the relay reads, no
// committed outbox row waits longer than it.
func (t *Tracker) OldestPending() (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.events == 0 {
		return time.Time{}, false
	}
	for i := 0; i < t.n; i++ {
		x := &t.ring[(t.head+i)&(len(t.ring)-1)]
		if x.acked < x.added {
			return x.at, true
		}
	}
	return time.Time{}, false
}

// InFlight returns the number of tracked transactions (open, or committed with events
// not yet acknowledged, or waiting behind such a transaction) and of unacknowledged
// events.
func (t *Tracker) InFlight() (txns int, events int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n, t.events
}

// Anomalies returns how many calls were ignored or corrected as misuse (see Tracker)
// and the description of the latest one, or nil if there was none. A non-zero count is
// a relay bug: report it as a metric and in the log.
func (t *Tracker) Anomalies() (count uint64, last error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.anomalies, t.lastAnomaly
}

// Reset forgets every tracked transaction and event, as after a reconnect once the sink
// has drained; acknowledgements that still arrive for them count as anomalies.
//
// The watermark becomes the greater of the current one and start, never start alone:
// after a reconnect the slot may restart from a confirmed_flush_lsn older than what was
// already acknowledged (the last standby status may not have reached the server), but
// the watermark has already been written to the store. Moving it back would let the
// store fall behind, and a later start-up would then find the slot ahead of the store
// and report a gap that does not exist. Events redelivered between start and the
// watermark are simply delivered again (at-least-once), and confirming a position at or
// below the slot's current one is a no-op for Postgres.
func (t *Tracker) Reset(start pglogrepl.LSN) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.ring {
		t.ring[i] = txn{}
	}
	t.head, t.n, t.headSeq = 0, 0, t.nextSeq
	if t.events > 0 {
		t.addEvents(-t.events)
	}
	if start > t.watermark {
		t.watermark = start
	}
	// The stream restarts at start: transactions redelivered below the watermark are
	// expected, not anomalies, and cannot move the watermark back anyway.
	t.maxEnd = start
}

// WaitDrained blocks until every added event has been acknowledged, or Reset is
// called, or ctx is done, in which case it returns ctx's error. Used at shutdown and
// before Reset on reconnect.
func (t *Tracker) WaitDrained(ctx context.Context) error {
	t.mu.Lock()
	if t.events == 0 {
		t.mu.Unlock()
		return nil
	}
	if t.drained == nil {
		t.drained = make(chan struct{})
	}
	ch := t.drained
	t.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for acknowledgements: %w", ctx.Err())
	}
}
