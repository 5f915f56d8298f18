package sink

// Dispatch: the goroutine that builds produce requests, applies their
// responses and schedules retries.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

// request is one produce request in flight to one broker.
type request struct {
	broker  int32
	parts   []*partition
	batches []batch
	buf     *wireBuf // the encoded batches
	start   time.Time
	res     *produceAPI.Response
	err     error
	unsent  bool // err came before the request was sent
}

// dispatch is the sink's state machine: it builds requests for idle brokers,
// applies their responses, and schedules retries.
func (k *Kafka) dispatch() {
	var (
		parts      []*partition
		byBroker   = map[int32]bool{} // brokers with a request in flight
		done       = make(chan *request)
		inFlight   int
		timer      = time.NewTimer(time.Hour)
		refreshing bool
		refreshed  = make(chan map[string][]int32, 1)
		enc        encoder
	)
	defer timer.Stop()
	defer func() {
		// Wait for requests in flight; Close has closed their connections.
		for ; inFlight > 0; inFlight-- {
			<-done
		}
		k.failing.Store(0) // stopped: nothing is retrying any more
	}()
	for {
		if k.ctx.Err() != nil { // closed, or halted by a permanent failure
			return
		}
		k.mu.Lock()
		for _, ts := range k.newTopics {
			for _, p := range ts.parts {
				p.leaderBusy.Store(byBroker[p.leader])
			}
			parts = append(parts, ts.parts...)
		}
		k.newTopics = nil
		refused := k.refused
		k.refused = nil
		k.mu.Unlock()
		// Events of topics the broker refuses are reported here, so every
		// Done the dispatcher calls runs on this goroutine.
		for _, f := range refused {
			if k.fail(f.it, f.err) != nil {
				return
			}
		}

		// Build one request per idle broker from its ready partitions, once the
		// input paused, enough is queued, or the oldest event waited Linger.
		now := time.Now()
		wakeAt, send := k.gate(now, parts)
		if send {
			var reqs map[int32]*request
			reqs, wakeAt = k.collect(now, parts, byBroker, &refreshing, refreshed)
			if len(reqs) > 0 {
				k.lastSent = now.UnixNano()
			}
			for b, r := range reqs {
				byBroker[b] = true
				markBusy(parts, b, true)
				inFlight++
				req, err := enc.build(k, r)
				r.start = time.Now()
				k.wg.Add(1)
				go func() {
					defer k.wg.Done()
					if err != nil {
						r.err, r.unsent = err, true
						done <- r
						return
					}
					ctx, cancel := context.WithTimeout(k.ctx, k.cfg.RequestTimeout)
					m, err := k.transport.RoundTrip(ctx, k.addr, req)
					cancel()
					if err == nil {
						res, ok := m.(*produceAPI.Response)
						if !ok {
							err = fmt.Errorf("unexpected produce response %T", m)
						}
						r.res = res
					}
					r.err = err
					done <- r
				}()
			}
		}
		if !wakeAt.IsZero() {
			timer.Reset(time.Until(wakeAt))
		}
		select {
		case <-k.ctx.Done():
			return
		case <-k.wake:
		case <-timer.C:
		case r := <-done:
			inFlight--
			byBroker[r.broker] = false
			markBusy(parts, r.broker, false)
			refresh, ok := k.apply(r)
			enc.release(r.buf)
			if refresh && !refreshing {
				refreshing = k.refresh(parts, refreshed)
			}
			k.breaker(ok, inFlight > 0)
		case v := <-k.verified:
			if k.settleVerdict(v) {
				return
			}
		case s := <-k.sessions:
			// Partitions join the new session as they build their next batch.
			k.sess, k.resetting = s, false
		case leaders := <-refreshed:
			refreshing = false
			for _, p := range parts {
				if l, ok := leaders[p.topic]; ok && p.id < len(l) {
					p.leader = l[p.id]
					p.leaderBusy.Store(byBroker[p.leader])
				}
			}
		}
	}
}

// markBusy records on each of broker's partitions whether it has a request
// in flight (partition.leaderBusy). The dispatcher clears it before it looks at
// the queues again, so an event queued after that look finds it clear and
// wakes the dispatcher.
func markBusy(parts []*partition, broker int32, busy bool) {
	for _, p := range parts {
		if p.leader == broker {
			p.leaderBusy.Store(busy)
		}
	}
}

// collect takes the next batch of every ready partition whose broker is idle,
// one request per broker, and says when a backing-off partition is due.
func (k *Kafka) collect(now time.Time, parts []*partition, byBroker map[int32]bool, refreshing *bool, refreshed chan map[string][]int32) (map[int32]*request, time.Time) {
	var wakeAt time.Time
	reqs := map[int32]*request{}
	reqBytes := map[int32]int{}
	if k.resetting {
		// Nothing is sent until the new producer session is there; its
		// arrival wakes the dispatcher.
		return reqs, wakeAt
	}
	for _, p := range parts {
		if p.inFlight || byBroker[p.leader] {
			continue
		}
		if now.Before(p.notBefore) {
			if wakeAt.IsZero() || p.notBefore.Before(wakeAt) {
				wakeAt = p.notBefore
			}
			continue
		}
		if p.leader < 0 {
			// No leader known (yet): look again after a backoff.
			if p.hasQueued() || p.retry.items != nil {
				p.notBefore = now.Add(k.cfg.Retry.Delay(p.attempt))
				p.attempt++
				if !*refreshing {
					*refreshing = k.refresh(parts, refreshed)
				}
			}
			continue
		}
		room := k.cfg.MaxRequestBytes - reqBytes[p.leader]
		if room <= 0 {
			continue
		}
		b := p.next(room)
		if b.items == nil {
			continue
		}
		if k.mustVerify(p, b) {
			// Its last attempt may be in the log under a producer id the
			// broker no longer knows: read the partition before re-sending.
			k.verify(p, b)
			continue
		}
		k.stamp(p, &b, now)
		if b.unknown {
			// The last attempt may have been appended: with idempotence the
			// broker drops this copy, without it Kafka may hold two.
			k.cfg.Metrics.UnknownFateResent.Add(float64(len(b.items)))
			b.unknown = false
		}
		r := reqs[p.leader]
		if r == nil {
			r = &request{broker: p.leader}
			reqs[p.leader] = r
		}
		r.parts = append(r.parts, p)
		r.batches = append(r.batches, b)
		for _, it := range b.items {
			reqBytes[p.leader] += k.eventSize(it.m.Event)
		}
		p.inFlight = true
		p.sending.Store(true)
	}
	return reqs, wakeAt
}

// gate decides whether the dispatcher builds requests now: retries that are due
// and batches of an input that paused (the stream has nothing more buffered)
// go at once; while events keep arriving it waits, up to Linger after the
// oldest queued event, for more to join them. When it waits it says until when.
func (k *Kafka) gate(now time.Time, parts []*partition) (wakeAt time.Time, send bool) {
	total, oldest := 0, int64(0)
	for _, p := range parts {
		if p.inFlight || p.leaderBusy.Load() || now.Before(p.notBefore) {
			continue
		}
		if p.retry.items != nil {
			return time.Time{}, true
		}
		n, since := p.queued()
		if n == 0 {
			continue
		}
		total += n
		if oldest == 0 || since < oldest {
			oldest = since
		}
	}
	if total == 0 || total >= k.cfg.FlushEvents {
		return time.Time{}, true
	}
	nowNs := now.UnixNano()
	quietAt := k.lastPush.Load() + int64(k.cfg.QuietGap)
	lingerAt := oldest + int64(k.cfg.Linger)
	spacedAt := k.lastSent + int64(k.cfg.MinInterval)
	if (nowNs >= quietAt || nowNs >= lingerAt) && nowNs >= spacedAt {
		return time.Time{}, true
	}
	at := max(min(quietAt, lingerAt), spacedAt)
	if at <= nowNs {
		at = nowNs + 1
	}
	return time.Unix(0, at), false
}

// apply handles a finished request partition by partition; it reports whether
// leadership may have moved (metadata should be refreshed) and whether any
// partition was acknowledged.
func (k *Kafka) apply(r *request) (refresh, ok bool) {
	var answers responseIndex
	if r.err == nil {
		answers.init(r.res)
	}
	answeredAt := time.Now() // one clock read per response, not per batch
	for i, p := range r.parts {
		if k.ctx.Err() != nil { // closed, or halted by a Done: the rest is abandoned
			return false, ok
		}
		b := r.batches[i]
		n := len(b.items)
		p.inFlight = false
		p.sending.Store(false)
		var (
			err      error
			code     kafka.Error
			rp       produceAPI.ResponsePartition
			answered bool
		)
		if r.err != nil {
			err = fmt.Errorf("produce %d events to %s/%d: %w", n, p.topic, p.id, r.err)
		} else if rp, answered = answers.find(p.topic, int32(p.id)); !answered {
			err = fmt.Errorf("produce %d events to %s/%d: no answer for the partition", n, p.topic, p.id)
		} else if code = kafka.Error(rp.ErrorCode); code == kafka.DuplicateSequenceNumber && b.pf.id >= 0 {
			// The broker already holds the batch: an earlier attempt was
			// appended. It may not say at which offset.
			if rp.BaseOffset < 0 {
				rp.BaseOffset = -1
			}
		} else if code != 0 {
			err = fmt.Errorf("produce %d events to %s/%d: %w", n, p.topic, p.id, code)
			if rp.ErrorMessage != "" {
				err = fmt.Errorf("%w (%s)", err, rp.ErrorMessage)
			}
		}
		if err == nil {
			ok = true
			k.acked(p, b, rp.BaseOffset, r.start, answeredAt)
			continue
		}
		if k.ctx.Err() != nil {
			return false, ok
		}
		if Classify(err) == Permanent {
			p.attempt = 0
			ok = true // the broker answered: Kafka itself works
			if n > 1 {
				// The batch as a whole may be what is too large: halve it, in
				// order. Nothing of it was appended, so the halves are new
				// batches, the first taking the sequence this one had.
				half := n / 2
				p.retry = batch{items: b.items[:half:half]}
				p.unshift(b.items[half:])
				p.limit = half
				continue
			}
			if k.fail(b.items[0], &outbox.EventError{Code: Code(err), Err: err}) != nil {
				return false, ok
			}
			continue
		}
		k.cfg.Metrics.ProduceErrors.WithLabelValues("transient").Inc()
		k.cfg.Metrics.ProduceRetries.Inc()
		if !p.failing {
			p.failing = true
			k.setFailing(true, err, p)
		}
		if !r.unsent && unknownFate(r.err, code, answered) {
			b.unknown, b.everUnknown = true, true
		}
		if sessionError(code) && b.pf.id >= 0 && b.gen == k.sess.gen && !k.resetting {
			k.log.Warn().Err(err).Int64("producer_id", b.pf.id).
				Msg("broker rejects the producer session; getting a new producer id, partitions restart their sequences")
			k.resetting = true
			k.renewSession(k.sess.gen+1, k.sessions)
		}
		p.retry = b
		p.notBefore = time.Now().Add(k.cfg.Retry.Delay(p.attempt))
		p.attempt++
		var ke kafka.Error
		if errors.As(err, &ke) || r.err != nil {
			refresh = true
		}
	}
	return refresh, ok
}

// responseIndex finds each partition's answer in a produce response. apply
// walks the partitions in the order build wrote them (grouped by topic), and
// brokers answer a topic's partitions in that order, so a lookup is usually
// the next answer. Topics may come back in any order (kfake answers from a
// map; Kafka promises none): a change of topic looks the topic up, and only a
// response whose partitions are out of order within a topic gets a map of
// them all. Building that map for every response was most of apply's own cost
// at 256 partitions, and at 50 topics it was built for nearly every response.
type responseIndex struct {
	res     *produceAPI.Response
	t, p    int // the next answer expected: res.Topics[t].Partitions[p]
	byTopic map[string]int
	byPart  map[answerKey]*produceAPI.ResponsePartition
}

type answerKey struct {
	topic string
	part  int32
}

func (x *responseIndex) init(res *produceAPI.Response) { *x = responseIndex{res: res} }

// find returns the answer for topic/part; ok is false when there is none.
func (x *responseIndex) find(topic string, part int32) (produceAPI.ResponsePartition, bool) {
	ts := x.res.Topics
	if x.t < len(ts) && ts[x.t].Topic != topic {
		if t, ok := x.topic(topic); ok {
			x.t, x.p = t, 0
		}
	}
	if x.t < len(ts) && ts[x.t].Topic == topic {
		if ps := ts[x.t].Partitions; x.p < len(ps) && ps[x.p].Partition == part {
			x.p++
			return ps[x.p-1], true
		}
	}
	if x.byPart == nil {
		x.byPart = make(map[answerKey]*produceAPI.ResponsePartition)
		for i := range ts {
			for j := range ts[i].Partitions {
				rp := &ts[i].Partitions[j]
				x.byPart[answerKey{ts[i].Topic, rp.Partition}] = rp
			}
		}
	}
	if rp := x.byPart[answerKey{topic, part}]; rp != nil {
		return *rp, true
	}
	return produceAPI.ResponsePartition{}, false
}

// topic returns the index of name's answers: mostly the next topic's.
func (x *responseIndex) topic(name string) (int, bool) {
	ts := x.res.Topics
	if x.t+1 < len(ts) && ts[x.t+1].Topic == name {
		return x.t + 1, true
	}
	if x.byTopic == nil {
		x.byTopic = make(map[string]int, len(ts))
		for i := len(ts) - 1; i >= 0; i-- { // the first of duplicate names wins
			x.byTopic[ts[i].Topic] = i
		}
	}
	t, ok := x.byTopic[name]
	return t, ok
}

// setFailing tracks how many partitions are retrying and logs only the first
// failure and the last recovery, not every attempt.
func (k *Kafka) setFailing(on bool, err error, p *partition) {
	if on {
		if k.failing.Add(1) == 1 {
			ev := k.log.Warn()
			if Classify(err) == Configuration {
				ev = k.log.Error()
			}
			ev.Err(err).Str("topic", p.topic).Int("partition", p.id).Str("class", Classify(err).String()).
				Msg("Kafka produce failing; retrying with backoff, nothing is confirmed meanwhile")
		}
		return
	}
	if k.failing.Add(-1) == 0 {
		k.log.Info().Str("topic", p.topic).Int("partition", p.id).Msg("Kafka produce recovered")
	}
}

// acked reports a batch acknowledged at baseOffset (-1: unknown), sent at
// start and answered at now, and advances the partition's sequence past it.
func (k *Kafka) acked(p *partition, b batch, baseOffset int64, start, now time.Time) {
	batch := b.items
	if b.pf.id >= 0 {
		p.seq = nextSeq(b.pf.seq, len(batch))
	}
	if baseOffset >= 0 {
		p.end = baseOffset + int64(len(batch))
	}
	if p.failing {
		p.failing = false
		k.setFailing(false, nil, p)
	}
	p.attempt = 0
	p.notBefore = time.Time{}
	if p.limit > 0 && !p.hasQueued() {
		p.limit = 0
	}
	m := k.cfg.Metrics
	m.ProduceBatches.Inc()
	m.ProduceBatchSize.Observe(float64(len(batch)))
	m.ProduceLatency.Observe(now.Sub(start).Seconds())
	m.EndToEndLatency.Observe(now.Sub(batch[0].m.Event.CommitTime).Seconds())
	if first := batch[0]; first.m.Event.CommitLSN != 0 { // read from the stream, not a replay
		m.ReadLatency.Observe(first.at.Sub(first.m.Event.CommitTime).Seconds())
		m.QueueLatency.Observe(start.Sub(first.at).Seconds())
	}
	var bytes int
	for _, it := range batch {
		bytes += len(it.m.Event.Payload)
	}
	p.events.Add(float64(len(batch)))
	p.bytes.Add(float64(bytes))
	for _, it := range batch {
		ev := it.m.Event
		// Only events read from the stream (a commit LSN): a replay's or
		// snapshot's rows waited for the operator, not for the relay.
		if ev.CommitLSN == 0 {
			continue
		}
		from := ev.CreatedAt
		if from.IsZero() {
			from = ev.CommitTime
		}
		m.ObserveOutboxWait(ev.EventType, now.Sub(from))
	}
	for i, it := range batch {
		at := Stored{Partition: int32(p.id), Offset: -1}
		if baseOffset >= 0 {
			at.Offset = baseOffset + int64(i)
		}
		if k.report(it, at, nil) != nil {
			return // halted: the rest is abandoned
		}
	}
	p.recycle(batch)
}
