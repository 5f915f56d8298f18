package sink

// Dispatch: the goroutine that builds produce requests, applies their
// responses and schedules retries.

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

// request is one produce request in flight to one broker: one batch of
// each of its partitions (Kafka takes at most one per partition with
// idempotence).
type request struct {
	broker  int32
	parts   []*partition
	flights []*flight
	x       *produceExchange // the encoded request
	buf     *wireBuf         // x's buffer
	start   time.Time
	bytes   int // the events' size (Kafka.eventSize), for pipelineBytes
	res     *produceAPI.Response
	err     error
	unsent  bool // err came before the request was written
}

// pipelineBytes bounds pipelining: a broker is given another request while
// it has some in flight only while those carry less than this many bytes of
// events. Steady loads' small requests then go back to back, while a
// backlog's large requests go one at a time, as they did before pipelining:
// measured on a 600,000-event drain of 10-event transactions, five large
// requests in flight doubled the relay's CPU per event (4.49 against
// 2.24 µs), a third of it garbage collection of the encoded requests held
// meanwhile, and grew its RSS from 58 to 70 MiB.
const pipelineBytes = 1 << 20

// maxInFlight is how many requests may be in flight per broker and batches
// per partition: Config.MaxInFlight while the producer is idempotent (the
// broker then keeps a partition's order across them), else 1, since without
// sequence numbers a retried batch could land after a later one.
func (k *Kafka) maxInFlight() int {
	if k.idempotent.Load() {
		return k.cfg.MaxInFlight
	}
	return 1
}

// dispatch is the sink's state machine: it builds requests for brokers with
// room, applies their responses, and schedules retries.
func (k *Kafka) dispatch() {
	var (
		parts      []*partition
		byBroker   = map[int32]int{} // requests in flight per broker
		bytesOut   = map[int32]int{} // their events' bytes
		pipes      = map[int32]*pipe{}
		done       = make(chan *request)
		inFlight   int
		timer      = time.NewTimer(time.Hour)
		refreshing bool
		refreshed  = make(chan map[string][]int32, 1)
		enc        encoder
	)
	defer timer.Stop()
	defer func() {
		for _, pp := range pipes {
			pp.close()
		}
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
		limit := k.maxInFlight()
		k.mu.Lock()
		for _, ts := range k.newTopics {
			for _, p := range ts.parts {
				p.leaderBusy.Store(full(byBroker, bytesOut, p.leader, limit))
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

		// Build requests for brokers with room from their ready partitions,
		// once the input paused, enough is queued, or the oldest event waited
		// Linger.
		now := time.Now()
		wakeAt, send := k.gate(now, parts, byBroker)
		if send {
			var reqs []*request
			reqs, wakeAt = k.collect(now, parts, byBroker, bytesOut, limit, &refreshing, refreshed)
			if len(reqs) > 0 {
				k.lastSent = now.UnixNano()
			}
			for _, r := range reqs {
				inFlight++
				x, err := enc.build(k, r)
				r.x, r.start = x, time.Now()
				if err != nil {
					r.err, r.unsent = err, true
					k.wg.Add(1)
					go func() {
						defer k.wg.Done()
						done <- r
					}()
					continue
				}
				r.buf = x.buf
				if pp := pipes[r.broker]; pp == nil || !pp.send(r) {
					pipes[r.broker] = k.openPipe(r.broker, k.cfg.MaxInFlight, done, r)
				}
			}
			markBusy(parts, byBroker, bytesOut, limit)
		}
		for b, pp := range pipes {
			if byBroker[b] == 0 && pp.idle(now) {
				pp.close()
				delete(pipes, b)
			}
		}
		if wakeAt.IsZero() && len(pipes) > 0 {
			wakeAt = now.Add(pipeIdle) // to close idle pipes
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
			byBroker[r.broker]--
			bytesOut[r.broker] -= r.bytes
			refresh, ok := k.apply(r)
			enc.release(r.buf)
			markBusy(parts, byBroker, bytesOut, limit)
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
			s.gen = k.sess.gen + 1
			k.sess, k.resetting = s, false
		case leaders := <-refreshed:
			refreshing = false
			for _, p := range parts {
				if l, ok := leaders[p.topic]; ok && p.id < len(l) {
					p.leader = l[p.id]
				}
			}
			markBusy(parts, byBroker, bytesOut, limit)
		}
	}
}

// markBusy records on each partition whether its leader takes no more
// requests now (partition.leaderBusy, see full). The dispatcher updates
// it before it looks at the queues again, so an event queued after that look
// finds it clear and wakes the dispatcher.
func markBusy(parts []*partition, byBroker, bytesOut map[int32]int, limit int) {
	for _, p := range parts {
		p.leaderBusy.Store(full(byBroker, bytesOut, p.leader, limit))
	}
}

// full reports whether broker takes no more requests now: it has limit in
// flight, or some carrying pipelineBytes.
func full(byBroker, bytesOut map[int32]int, broker int32, limit int) bool {
	n := byBroker[broker]
	return n >= limit || n > 0 && bytesOut[broker] >= pipelineBytes
}

// open reports whether p may take a new batch: it has room, nothing to send
// again, and every batch in flight belongs to the current session with the
// sequence it has (a new batch must not overtake one that may come back
// failed and be given a new sequence).
func (k *Kafka) open(p *partition, limit int) bool {
	if p.verifying || len(p.out) >= limit || len(p.out) > 0 && (!p.confirmed || p.sess.gen != k.sess.gen) {
		return false
	}
	for _, f := range p.out {
		switch f.state {
		case failed, rejected:
			return false
		case flying:
			if f.b.gen != k.sess.gen {
				return false
			}
		}
	}
	return true
}

// updateSending records whether p takes a new batch (partition.sending).
func (k *Kafka) updateSending(p *partition, limit int) {
	p.sending.Store(!k.open(p, limit))
}

// collect builds the requests to send now: rounds of at most one request per
// broker with room, each carrying at most one batch per partition (a failed
// batch again, in order, or a new one). It says when a backing-off partition
// is due.
func (k *Kafka) collect(now time.Time, parts []*partition, byBroker, bytesOut map[int32]int, limit int, refreshing *bool, refreshed chan map[string][]int32) ([]*request, time.Time) {
	var (
		wakeAt time.Time
		reqs   []*request
	)
	if k.resetting {
		// Nothing is sent until the new producer session is there; its
		// arrival wakes the dispatcher.
		return reqs, wakeAt
	}
	round := map[int32]*request{}
	reqBytes := map[int32]int{}
	for {
		clear(round)
		clear(reqBytes)
		for _, p := range parts {
			if p.verifying || full(byBroker, bytesOut, p.leader, limit) {
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
				if p.hasQueued() || p.firstFailed() != nil {
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
			f := k.nextFlight(p, now, room, limit)
			if f == nil {
				continue
			}
			k.stamp(p, &f.b, now)
			if f.b.unknown {
				// The last attempt may have been appended: with idempotence the
				// broker drops this copy, without it Kafka may hold two.
				k.cfg.Metrics.UnknownFateResent.Add(float64(len(f.b.items)))
				f.b.unknown = false
			}
			f.state, f.start = flying, now
			r := round[p.leader]
			if r == nil {
				r = &request{broker: p.leader}
				round[p.leader] = r
			}
			r.parts = append(r.parts, p)
			r.flights = append(r.flights, f)
			for _, it := range f.b.items {
				reqBytes[p.leader] += k.eventSize(it.m.Event)
			}
			k.updateSending(p, limit)
		}
		if len(round) == 0 {
			return reqs, wakeAt
		}
		for b, r := range round {
			r.bytes = reqBytes[b]
			reqs = append(reqs, r)
			byBroker[b]++
			bytesOut[b] += r.bytes
			if n := int32(byBroker[b]); n > k.peakInFlight.Load() {
				k.peakInFlight.Store(n)
			}
		}
	}
}

// nextFlight returns p's next batch to send, or nil: its first failed batch
// once none is in flight (and, within a resending pass, the next failed one),
// else a new batch from the queue when p is open. A failed batch of unknown
// fate from a session that is gone is looked up first (verify.go).
func (k *Kafka) nextFlight(p *partition, now time.Time, room, limit int) *flight {
	if p.confirmed && p.stale(now.UnixMilli()-k.cfg.ProducerIdle.Milliseconds()) {
		// The broker may have expired the producer on the partition, or may
		// before the next batch arrives, and would take any first sequence:
		// as in a new session, one batch goes alone until Kafka acknowledges
		// one.
		p.confirmed = false
	}
	if (p.sess.gen != k.sess.gen || !p.confirmed) && p.flying() > 0 {
		// Until the broker acknowledged a batch of this session on the
		// partition, one at a time (see partition.confirmed).
		return nil
	}
	if f := p.firstFailed(); f != nil {
		if !p.resending {
			if p.flying() > 0 {
				return nil // wait for every answer, then send again in order
			}
			p.resending = true
		}
		if k.mustVerify(p, f.b) {
			if p.flying() == 0 {
				// Its last attempt may be in the log under a producer id the
				// broker no longer knows: read the partition before re-sending.
				k.verify(p, f)
			}
			return nil
		}
		return f
	}
	p.resending = false
	if !k.open(p, limit) {
		return nil
	}
	b := p.next(room)
	if b.items == nil {
		return nil
	}
	f := &flight{b: b, offset: -1}
	p.out = append(p.out, f)
	return f
}

// gate decides whether the dispatcher builds requests now: retries that are due
// go at once. Batches for a broker with nothing in flight go once the input
// paused (the stream has nothing more buffered); while events keep arriving
// they wait, up to Linger after the oldest queued event, for more to join
// them. Batches for a broker that has requests in flight go only once
// FlushEvents are queued or the oldest waited Linger: the answer they would
// otherwise wait for is what lets them grow, and many small requests cost
// more than they save. Once BacklogEvents are queued, BacklogLinger replaces
// Linger. When it waits it says until when.
func (k *Kafka) gate(now time.Time, parts []*partition, byBroker map[int32]int) (wakeAt time.Time, send bool) {
	var idle, busy struct {
		total  int
		oldest int64
	}
	for _, p := range parts {
		if p.leaderBusy.Load() || p.verifying || now.Before(p.notBefore) {
			continue
		}
		if f := p.firstFailed(); f != nil {
			if p.resending || p.flying() == 0 {
				return time.Time{}, true
			}
			continue
		}
		if p.sending.Load() {
			continue
		}
		n, since := p.queued()
		if n == 0 {
			continue
		}
		g := &idle
		if byBroker[p.leader] > 0 {
			g = &busy
		}
		g.total += n
		if g.oldest == 0 || since < g.oldest {
			g.oldest = since
		}
	}
	if idle.total+busy.total == 0 || idle.total >= k.cfg.FlushEvents || busy.total >= k.cfg.FlushEvents {
		return time.Time{}, true
	}
	nowNs := now.UnixNano()
	spacedAt := k.lastSent + int64(k.cfg.MinInterval)
	linger := int64(k.linger(idle.total + busy.total))
	at := int64(0)
	if idle.total > 0 {
		quietAt := k.lastPush.Load() + int64(k.cfg.QuietGap)
		at = min(quietAt, idle.oldest+linger)
	}
	if busy.total > 0 {
		if lingerAt := busy.oldest + linger; at == 0 || lingerAt < at {
			at = lingerAt
		}
	}
	at = max(at, spacedAt)
	if nowNs >= at {
		return time.Time{}, true
	}
	return time.Unix(0, at), false
}

// linger is how long queued events may wait for more: Linger, or
// BacklogLinger once queued (events of ready partitions) reach BacklogEvents.
func (k *Kafka) linger(queued int) time.Duration {
	if queued >= k.cfg.BacklogEvents {
		return k.cfg.BacklogLinger
	}
	return k.cfg.Linger
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
	limit := k.maxInFlight()
	for i, p := range r.parts {
		if k.ctx.Err() != nil { // closed, or halted by a Done: the rest is abandoned
			return false, ok
		}
		f := r.flights[i]
		if !k.settle(p, f, r, &answers, answeredAt, &refresh, &ok) {
			return false, ok
		}
		if !k.drain(p) {
			return false, ok
		}
		k.updateSending(p, limit)
	}
	return refresh, ok
}

// settle applies one partition's answer to its batch f; false when the
// producer halted.
func (k *Kafka) settle(p *partition, f *flight, r *request, answers *responseIndex, answeredAt time.Time, refresh, ok *bool) bool {
	b := f.b
	n := len(b.items)
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
		*ok = true
		f.state, f.offset, f.answered = appended, rp.BaseOffset, answeredAt
		if b.gen == p.sess.gen && p.sess.gen == k.sess.gen {
			p.confirmed = true
		}
		if p.firstFailed() == nil {
			if p.failing {
				p.failing = false
				k.setFailing(false, nil, p)
			}
			p.attempt = 0
			p.notBefore = time.Time{}
		}
		return true
	}
	if Classify(err) == Permanent {
		*ok = true // the broker answered: Kafka itself works
		p.resending = false
		p.rewind(f, k.sess)
		if n > 1 {
			// The batch as a whole may be what is too large: halve it, in
			// order. Nothing of it was appended, so the halves are new
			// batches, the first taking the sequence this one had.
			half := n / 2
			if at := slices.Index(p.out, f); at == len(p.out)-1 {
				// The later half goes back to the queue, to be batched
				// within the limit with what follows it.
				p.unshift(b.items[half:])
			} else {
				p.out = slices.Insert(p.out, at+1,
					&flight{b: batch{items: b.items[half:]}, state: failed, offset: -1})
			}
			*f = flight{b: batch{items: b.items[:half:half]}, state: failed, offset: -1}
			p.limit = half
			return true
		}
		f.state, f.err = rejected, &outbox.EventError{Code: Code(err), Err: err}
		return true
	}
	if answered && code == kafka.OutOfOrderSequenceNumber && !p.settledBefore(f) {
		// The broker's answer to a batch sent behind one it has not
		// appended (failed, or refused and split): not a failure of its
		// own. It goes again in order behind that one.
		*ok = true // the broker answered: Kafka itself works
		k.cfg.Metrics.OutOfOrderBehind.Inc()
		k.log.Debug().Str("topic", p.topic).Int("partition", p.id).Int("events", n).Int32("sequence", b.pf.seq).
			Msg("batch refused out of order behind one not appended; re-sending it in order behind that one")
		f.state = failed
		p.resending = false
		return true
	}
	k.cfg.Metrics.ProduceErrors.WithLabelValues("transient").Inc()
	k.cfg.Metrics.ProduceRetries.Inc()
	if !p.failing {
		p.failing = true
		k.setFailing(true, err, p)
	}
	if !r.unsent && unknownFate(r.err, code, answered) {
		f.b.unknown, f.b.everUnknown = true, true
	}
	// Out of order for the first batch not appended says that the session
	// lost its sequence (behind another batch it did not, see above).
	if sessionError(code) && b.pf.id >= 0 && b.gen == k.sess.gen && !k.resetting {
		k.log.Warn().Err(err).Int64("producer_id", b.pf.id).
			Msg("broker rejects the producer session; getting a new producer id, partitions restart their sequences")
		k.resetting = true
		k.renewSession()
	}
	f.state = failed
	p.resending = false
	if now := time.Now(); !p.notBefore.After(now) {
		// One backoff step per failed pass, however many of its batches fail.
		p.notBefore = now.Add(k.cfg.Retry.Delay(p.attempt))
		p.attempt++
	}
	var ke kafka.Error
	if errors.As(err, &ke) || r.err != nil {
		*refresh = true
	}
	return true
}

// drain reports p's settled batches from the front, in order: acknowledged
// ones to their Dones with where Kafka stored them, rejected ones as their
// permanent failure. False when the producer halted.
func (k *Kafka) drain(p *partition) bool {
	for len(p.out) > 0 {
		f := p.out[0]
		switch f.state {
		case appended:
			if f.b.gen == p.sess.gen {
				// In sequence order, as the broker keeps its last timestamp.
				p.appendedTs = f.b.times.max
			}
			p.out[0] = nil
			p.out = p.out[1:]
			if !k.acked(p, f.b, f.offset, f.start, f.answered) {
				return false
			}
		case rejected:
			p.out[0] = nil
			p.out = p.out[1:]
			if k.fail(f.b.items[0], f.err) != nil {
				return false
			}
		default:
			return true
		}
	}
	p.out = p.out[:0:0]
	return true
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
// start and answered at now, to its Dones; false when the producer halted.
func (k *Kafka) acked(p *partition, b batch, baseOffset int64, start, now time.Time) bool {
	batch := b.items
	if baseOffset >= 0 {
		p.end = baseOffset + int64(len(batch))
	}
	if p.limit > 0 && !p.hasQueued() && p.firstFailed() == nil {
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
	// One pass for the metrics, one for the Dones: items by index, not
	// copied, and the outbox-wait observer looked up once per run of events
	// of one type. In a drain this loop touches each event for the first
	// time since it was queued.
	var (
		size     int
		wait     prometheus.Observer
		waitType []byte
	)
	for i := range batch {
		ev := batch[i].m.Event
		size += len(ev.Payload)
		// Only events read from the stream (a commit LSN): a replay's or
		// snapshot's rows waited for the operator, not for the relay.
		if ev.CommitLSN == 0 {
			continue
		}
		from := ev.CreatedAt
		if from.IsZero() {
			from = ev.CommitTime
		}
		if wait == nil || !bytes.Equal(ev.EventType, waitType) {
			wait, waitType = m.OutboxWaitOf(ev.EventType), ev.EventType
		}
		wait.Observe(now.Sub(from).Seconds())
	}
	p.events.Add(float64(len(batch)))
	p.bytes.Add(float64(size))
	at := Stored{Partition: int32(p.id), Offset: -1}
	for i := range batch {
		if baseOffset >= 0 {
			at.Offset = baseOffset + int64(i)
		}
		if k.report(&batch[i], at, nil) != nil {
			return false // halted: the rest is abandoned
		}
	}
	p.recycle(batch)
	return true
}
