package sink

// Verification: a batch whose last attempt may have been appended, when the
// producer session it was sent in is gone (the broker forgot or fenced the
// producer id), cannot be deduplicated by the broker any more. Before it is
// re-sent in the new session, the partition is read from where the batch
// would be: when its events are there — same id and same source position —
// they are acknowledged as they are; when none is, the batch is sent. Only
// what cannot be decided (events without a source position, a partition with
// no acknowledged batch yet, part of the batch found) is re-sent blind, and
// counted as the producer_reset fallback.

import (
	"bytes"
	"context"
	"fmt"
	"time"
)

// verdict is the outcome of reading a partition for a batch of unknown fate.
type verdict struct {
	p       *partition
	b       batch
	offsets []int64 // per event, where it was found (-1: not found)
	err     error
}

// mustVerify reports whether b, about to be built for p, must be looked up
// first: an earlier attempt may be in Kafka under a producer session that is
// gone, and the partition says where to look.
func (k *Kafka) mustVerify(p *partition, b batch) bool {
	if !b.built || !b.everUnknown || b.pf.id < 0 || b.gen == k.sess.gen || p.end < 0 {
		return false
	}
	for _, it := range b.items {
		if it.ev.Origin == nil {
			return false
		}
	}
	return true
}

// verify reads p from the end of its last acknowledged batch to its high
// watermark in the background, for the events of b; the verdict comes back
// on k.verified. p counts as in flight meanwhile, so nothing of it is sent.
func (k *Kafka) verify(p *partition, b batch) {
	p.inFlight = true
	p.sending.Store(true)
	want := make(map[string]int, len(b.items)) // source position → index in b
	for i, it := range b.items {
		want[string(it.ev.Origin.AppendPosition(nil, it.ev.CommitLSN, it.ev.Index))] = i
	}
	from := p.end
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		v := verdict{p: p, b: b, offsets: make([]int64, len(b.items))}
		for i := range v.offsets {
			v.offsets[i] = -1
		}
		ctx, cancel := context.WithTimeout(k.ctx, k.cfg.RequestTimeout)
		defer cancel()
		ranges, err := k.Ranges(ctx, p.topic, p.id+1)
		if err == nil {
			err = k.Scan(ctx, p.topic, p.id, from, ranges[p.id].End, func(off int64, id, src []byte) error {
				if i, ok := want[string(src)]; ok && bytes.Equal(id, b.items[i].ev.ID) && v.offsets[i] < 0 {
					v.offsets[i] = off
				}
				return nil
			})
		}
		if err != nil {
			v.err = fmt.Errorf("look up a batch of unknown fate in %s/%d: %w", p.topic, p.id, err)
		}
		select {
		case k.verified <- v:
		case <-k.ctx.Done():
		}
	}()
}

// settleVerdict applies a verdict on the dispatcher goroutine; it reports
// whether the producer halted.
func (k *Kafka) settleVerdict(v verdict) (halted bool) {
	p, b := v.p, v.b
	p.inFlight = false
	p.sending.Store(false)
	if v.err != nil {
		// Look again after a backoff; the batch stays first.
		k.log.Warn().Err(v.err).Msg("cannot read the partition back; retrying")
		p.retry = b
		p.notBefore = time.Now().Add(k.cfg.Retry.Delay(p.attempt))
		p.attempt++
		return false
	}
	found := 0
	for _, off := range v.offsets {
		if off >= 0 {
			found++
		}
	}
	switch found {
	case len(b.items):
		// The lost attempt was appended: acknowledge it where it is. A batch
		// is appended whole, so its records are consecutive.
		k.cfg.Metrics.DuplicatesSuppressed.Add(float64(found))
		k.log.Info().Str("topic", p.topic).Int("partition", p.id).Int("events", found).Int64("offset", v.offsets[0]).
			Msg("a batch of unknown fate is in Kafka; not sending it again")
		b.pf.id = -1 // its session is gone: do not advance the new one's sequence
		now := time.Now()
		k.acked(p, b, v.offsets[0], now, now)
		return k.ctx.Err() != nil
	case 0:
		b.everUnknown = false // verifiably not in Kafka: sending it duplicates nothing
	}
	p.retry = b
	k.signal()
	return false
}
