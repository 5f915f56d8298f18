package sink

// Verification: a batch whose last attempt may have been appended, when the
// producer session it was sent in is gone (the broker forgot or fenced the
// producer id), cannot be deduplicated by the broker any more. Before it is
// re-sent in the new session, the sink reads the partition from where the
// batch would be and asks the Verifier (internal/dedup's Decider) whether
// Kafka holds it; the sink never decides that itself. Held, the batch is
// acknowledged where it is; absent, it is sent; undecided (or with no
// Verifier, or a partition with no acknowledged batch yet), it is re-sent
// blind and counted as the producer_reset fallback.

import (
	"context"
	"fmt"
	"time"
)

// Verifier decides, for DESIGN invariant 8, whether Kafka already holds the
// events of a batch of unknown fate: a batch whose last attempt may have been
// appended under a producer session the broker no longer knows, so that the
// broker cannot drop a copy. The sink asks it before re-sending such a batch
// and acts on its verdict; it never matches records itself.
// internal/dedup's Decider implements it, by the rule it also applies at
// start-up reconciliation.
//
// The rule: a record is one of the events exactly when it carries the event's
// id (HeaderID) and its source position (HeaderSource) of the same database
// system identifier, timeline and slot, commit LSN and index. Nothing else
// counts as the event: not the same id at another position, not another id at
// the same position, not a record without those headers.
//
// Verify decides the fate of msgs, the messages of one batch of one partition
// in the order they were batched (each event's source position is its
// Message's Origin with the event's CommitLSN and Index). scan reads that partition from where the batch
// would have been appended (the offset after its last acknowledged batch) to
// its high watermark, calling fn with each record's offset, id header and
// source position header (nil when absent), in offset order. Verify calls
// scan at most once, and not at all when it can decide without reading. It
// returns scan's error (the sink reads again after a backoff) or a Verdict:
//
//   - FateHeld: every event is in the partition; the batch was appended whole,
//     its first record at Verdict.Offset. The sink acknowledges the events
//     there and does not send them again.
//   - FateAbsent: none of them is: sending the batch duplicates nothing.
//   - FateUndecided: anything else (an event without a source position, part
//     of the batch found): the sink re-sends the batch and counts the
//     producer_reset fallback. When it cannot prove an event is in Kafka, the
//     sink sends it: at-least-once stays the floor.
type Verifier interface {
	Verify(ctx context.Context, msgs []Message, scan ScanFunc) (Verdict, error)
}

// ScanFunc reads a partition for a Verifier: it calls fn with each record's
// offset, id header and source position header (nil when absent), in offset
// order, and stops with fn's error.
type ScanFunc func(ctx context.Context, fn func(offset int64, id, source []byte) error) error

// Fate is what a Verifier found of a batch of unknown fate.
type Fate int8

// The fates a Verifier decides (see Verifier).
const (
	FateUndecided Fate = iota // cannot be proved either way: re-send, a counted fallback
	FateAbsent                // verifiably not in Kafka: send
	FateHeld                  // verifiably in Kafka, appended whole: do not send
)

// Verdict is a Verifier's answer for a batch of unknown fate.
type Verdict struct {
	Fate Fate
	// Offset is where the batch's first record is, when Fate is FateHeld.
	Offset int64
}

// verdict is the outcome of verifying a batch, for the dispatcher.
type verdict struct {
	p   *partition
	f   *flight
	v   Verdict
	err error
}

// mustVerify reports whether b, about to be built for p, must be looked up
// first: an earlier attempt may be in Kafka under a producer session that is
// gone, the partition says where to look, and no lookup in this session was
// undecided already.
func (k *Kafka) mustVerify(p *partition, b batch) bool {
	return k.cfg.Verifier != nil && b.built && b.everUnknown && !b.undecided && b.pf.id >= 0 &&
		b.gen != k.sess.gen && p.end >= 0
}

// verify asks the Verifier about f's batch in the background, reading p from
// the end of its last reported batch to its high watermark; the verdict comes
// back on k.verified. Nothing of p is sent meanwhile.
func (k *Kafka) verify(p *partition, f *flight) {
	p.verifying = true
	p.sending.Store(true)
	b := f.b
	msgs := make([]Message, len(b.items))
	for i, it := range b.items {
		msgs[i] = it.m
	}
	topic, id, from := p.topic, p.id, p.end
	scan := func(ctx context.Context, fn func(offset int64, id, source []byte) error) error {
		ranges, err := k.Ranges(ctx, topic, id+1)
		if err != nil {
			return err
		}
		return k.Scan(ctx, topic, id, from, ranges[id].End, fn)
	}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		ctx, cancel := context.WithTimeout(k.ctx, k.cfg.RequestTimeout)
		defer cancel()
		res := verdict{p: p, f: f}
		res.v, res.err = k.cfg.Verifier.Verify(ctx, msgs, scan)
		if res.err != nil {
			res.err = fmt.Errorf("look up a batch of unknown fate in %s/%d: %w", topic, id, res.err)
		}
		select {
		case k.verified <- res:
		case <-k.ctx.Done():
		}
	}()
}

// settleVerdict applies a verdict on the dispatcher goroutine; it reports
// whether the producer halted.
func (k *Kafka) settleVerdict(res verdict) (halted bool) {
	p, f := res.p, res.f
	p.verifying = false
	defer k.updateSending(p, k.maxInFlight())
	if res.err != nil {
		// Look again after a backoff; the batch stays first.
		k.log.Warn().Err(res.err).Msg("cannot read the partition back; retrying")
		p.notBefore = time.Now().Add(k.cfg.Retry.Delay(p.attempt))
		p.attempt++
		return false
	}
	switch res.v.Fate {
	case FateHeld:
		// The lost attempt was appended: acknowledge it where it is.
		k.cfg.Metrics.DuplicatesSuppressed.Add(float64(len(f.b.items)))
		k.log.Info().Str("topic", p.topic).Int("partition", p.id).Int("events", len(f.b.items)).Int64("offset", res.v.Offset).
			Msg("a batch of unknown fate is in Kafka; not sending it again")
		now := time.Now()
		f.state, f.offset, f.start, f.answered = appended, res.v.Offset, now, now
		return !k.drain(p)
	case FateAbsent:
		f.b.everUnknown = false // verifiably not in Kafka: sending it duplicates nothing
	default:
		f.b.undecided = true // re-sent blind (stamp counts the fallback), not looked up again
	}
	k.signal()
	return false
}
