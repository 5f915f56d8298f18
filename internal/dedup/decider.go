// Package dedup owns DESIGN invariant 8: an event Kafka already holds is not
// appended again after a crash, a restart, a reconnect or a produce of unknown
// fate. (Within one producer session the sink's idempotent producer keeps a
// retry from appending twice; this package covers what it cannot.)
//
// The Decider (decider.go) is the only code that decides whether Kafka holds
// an event, by one rule: same event id AND same source position, from the
// same database and slot. It is asked on two paths. At start-up (and after each reconnect)
// the Gate reads each partition from the offset stored with the checkpoint to
// its high watermark and lets the relay skip a replayed event only when the
// rule finds it there. For a batch of unknown fate whose producer session is
// gone, the sink reads the partition from its last acknowledged batch and asks
// the Decider (sink.Verifier). The Ledger records where Kafka stored each
// acknowledged event, so that every checkpoint carries, per partition, the
// offset where records of events after it can start. Whatever cannot be
// proved to be in Kafka is sent again: at-least-once stays the floor.
//
// Source positions are written by the sink (outbox.Origin.AppendPosition) and
// read back only here (index.add).
package dedup

import (
	"context"
	"sync"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// Decider is the one decider of DESIGN invariant 8: whether Kafka already
// holds an event. Both paths that might send an event a second time go
// through its rule, written once (key and index below): the Gate's start-up
// reconciliation (events a restarted or reconnected stream replays) keeps the
// records it reads in an index and takes each replayed event from it, and the
// sink asks Verify for a batch of unknown fate. The sink never matches
// records itself.
//
// The rule, for both: a record read back from Kafka is the event exactly when
// it carries the event's id (header sink.HeaderID) AND its source position
// (header sink.HeaderSource) of the same stream — the same database system
// identifier, timeline and slot, the same commit LSN and index in the
// transaction. The same id at another position (a replayed dead letter, a row
// re-inserted with its id) is another event; another id at the same position
// (LSNs reused after a restore) is too; so is a record of another database or
// slot, and a record without an id or a source position (a replay, a backfill,
// another producer). Only records read from where the relay's own records of
// the events can be (see Gate and sink.Verifier) are looked at. Whatever
// cannot be proved to be in Kafka is sent: at-least-once stays the floor.
//
// The zero Decider is ready to use; it holds no state.
type Decider struct{}

var _ sink.Verifier = Decider{}

// Verify decides the fate of a batch of unknown fate by the rule above; see
// sink.Verifier for the contract. A batch is held when every event's record
// is found, absent when none is, and undecided otherwise, or when an event has
// no source position or events of several streams are mixed (then scan is not
// called).
func (Decider) Verify(ctx context.Context, msgs []sink.Message, scan sink.ScanFunc) (sink.Verdict, error) {
	if len(msgs) == 0 {
		return sink.Verdict{Fate: sink.FateAbsent}, nil
	}
	origin := msgs[0].Origin
	from, to := pglogrepl.LSN(0), pglogrepl.LSN(0)
	for i, m := range msgs {
		ev := m.Event
		if !sameOrigin(m.Origin, origin) {
			return sink.Verdict{Fate: sink.FateUndecided}, nil
		}
		if i == 0 || ev.CommitLSN < from {
			from = ev.CommitLSN
		}
		to = max(to, ev.CommitLSN+1)
	}
	x := newIndex(origin, from, to)
	if err := scan(ctx, func(off int64, id, src []byte) error {
		x.add(0, off, id, src)
		return nil
	}); err != nil {
		return sink.Verdict{}, err
	}
	found, first := 0, int64(-1)
	for i, m := range msgs {
		r, ok := x.take(m.Event, m.Origin)
		if !ok {
			continue
		}
		if i == 0 {
			first = r.offset
		}
		found++
	}
	switch {
	case found == len(msgs):
		// A batch is appended whole, so its records are consecutive from
		// the first event's.
		return sink.Verdict{Fate: sink.FateHeld, Offset: first}, nil
	case found == 0:
		return sink.Verdict{Fate: sink.FateAbsent}, nil
	default:
		return sink.Verdict{Fate: sink.FateUndecided}, nil
	}
}

// key identifies an event of one stream in one topic: records and events
// with equal keys are the same event (the rule of Decider).
type key struct {
	lsn   pglogrepl.LSN
	index uint32
	id    string
}

// record is where a record of an event was read.
type record struct {
	partition int32
	offset    int64
}

// index holds the records read back from one topic (or one partition) that
// are events of origin committed in [from, to), by key. It is safe for
// concurrent add; take is called once the reading is over.
type index struct {
	origin   *outbox.Origin
	from, to pglogrepl.LSN

	mu   sync.Mutex
	recs map[key]record
}

func newIndex(origin *outbox.Origin, from, to pglogrepl.LSN) *index {
	return &index{origin: origin, from: from, to: to, recs: make(map[key]record)}
}

// add remembers a record read at partition/offset with its id and source
// position headers (nil when absent), when it may be an event of x's origin
// in x's window. Of several records of the same event, the first added is
// kept. add is the only reader of source positions.
func (x *index) add(partition int32, offset int64, id, source []byte) {
	if id == nil || source == nil {
		return // not the relay's record of a stream event
	}
	pos, ok, err := x.origin.ParsePosition(source)
	if err != nil || !ok || pos.CommitLSN < x.from || pos.CommitLSN >= x.to {
		return
	}
	k := key{lsn: pos.CommitLSN, index: pos.Index, id: string(id)}
	x.mu.Lock()
	if _, dup := x.recs[k]; !dup {
		x.recs[k] = record{partition: partition, offset: offset}
	}
	x.mu.Unlock()
}

// take reports where the record of ev, read from origin, is, by the rule of
// Decider, and forgets it: a record stands for one event once.
func (x *index) take(ev *outbox.Event, origin *outbox.Origin) (record, bool) {
	if !sameOrigin(origin, x.origin) {
		return record{}, false
	}
	k := key{lsn: ev.CommitLSN, index: ev.Index, id: string(ev.ID)}
	x.mu.Lock()
	defer x.mu.Unlock()
	r, ok := x.recs[k]
	if ok {
		delete(x.recs, k)
	}
	return r, ok
}

// len returns how many records x holds.
func (x *index) len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.recs)
}

// sameOrigin reports whether a and b are the same stream: the same database
// system identifier, timeline and slot. A nil Origin (an event not read from
// the stream) is no stream's.
func sameOrigin(a, b *outbox.Origin) bool {
	if a == nil || b == nil {
		return false
	}
	return a == b || a.SystemID == b.SystemID && a.Timeline == b.Timeline && a.Slot == b.Slot
}
