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
	batches [][]item
	start   time.Time
	res     *produceAPI.Response
	err     error
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
		wakeAt, send := k.gate(now, parts, byBroker)
		if send {
			var reqs map[int32]*request
			reqs, wakeAt = k.collect(now, parts, byBroker, &refreshing, refreshed)
			if len(reqs) > 0 {
				k.lastSent = now.UnixNano()
			}
			for b, r := range reqs {
				byBroker[b] = true
				inFlight++
				req := enc.build(k, r)
				r.start = time.Now()
				k.wg.Add(1)
				go func() {
					defer k.wg.Done()
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
			refresh, ok := k.apply(r)
			if refresh && !refreshing {
				refreshing = k.refresh(parts, refreshed)
			}
			k.breaker(ok, inFlight > 0)
		case leaders := <-refreshed:
			refreshing = false
			for _, p := range parts {
				if l, ok := leaders[p.topic]; ok && p.id < len(l) {
					p.leader = l[p.id]
				}
			}
		}
	}
}

// collect takes the next batch of every ready partition whose broker is idle,
// one request per broker, and says when a backing-off partition is due.
func (k *Kafka) collect(now time.Time, parts []*partition, byBroker map[int32]bool, refreshing *bool, refreshed chan map[string][]int32) (map[int32]*request, time.Time) {
	var wakeAt time.Time
	reqs := map[int32]*request{}
	reqBytes := map[int32]int{}
	for _, p := range parts {
		if p.inFlight || byBroker[p.leader] && reqs[p.leader] == nil {
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
			if p.hasQueued() || p.retry != nil {
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
		batch := p.next(room)
		if batch == nil {
			continue
		}
		r := reqs[p.leader]
		if r == nil {
			r = &request{broker: p.leader}
			reqs[p.leader] = r
		}
		r.parts = append(r.parts, p)
		r.batches = append(r.batches, batch)
		for _, it := range batch {
			reqBytes[p.leader] += it.ev.Size()
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
func (k *Kafka) gate(now time.Time, parts []*partition, busy map[int32]bool) (wakeAt time.Time, send bool) {
	total, oldest := 0, int64(0)
	for _, p := range parts {
		if p.inFlight || busy[p.leader] || now.Before(p.notBefore) {
			continue
		}
		if p.retry != nil {
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
	type key struct {
		topic string
		part  int32
	}
	byPart := map[key]produceAPI.ResponsePartition{}
	if r.err == nil {
		for _, t := range r.res.Topics {
			for _, rp := range t.Partitions {
				byPart[key{t.Topic, rp.Partition}] = rp
			}
		}
	}
	for i, p := range r.parts {
		if k.ctx.Err() != nil { // closed, or halted by a Done: the rest is abandoned
			return false, ok
		}
		batch := r.batches[i]
		p.inFlight = false
		p.sending.Store(false)
		var err error
		if r.err != nil {
			err = fmt.Errorf("produce %d events to %s/%d: %w", len(batch), p.topic, p.id, r.err)
		} else if rp, ok := byPart[key{p.topic, int32(p.id)}]; !ok {
			err = fmt.Errorf("produce %d events to %s/%d: no answer for the partition", len(batch), p.topic, p.id)
		} else if rp.ErrorCode != 0 {
			err = fmt.Errorf("produce %d events to %s/%d: %w", len(batch), p.topic, p.id, kafka.Error(rp.ErrorCode))
			if rp.ErrorMessage != "" {
				err = fmt.Errorf("%w (%s)", err, rp.ErrorMessage)
			}
		}
		if err == nil {
			ok = true
			k.acked(p, batch, r.start)
			continue
		}
		if k.ctx.Err() != nil {
			return false, ok
		}
		if Classify(err) == Permanent {
			p.attempt = 0
			ok = true // the broker answered: Kafka itself works
			if len(batch) > 1 {
				// The batch as a whole may be what is too large: halve it, in order.
				half := len(batch) / 2
				p.retry = batch[:half:half]
				p.unshift(batch[half:])
				p.limit = half
				continue
			}
			if k.fail(batch[0], &outbox.EventError{Code: Code(err), Err: err}) != nil {
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
		p.retry = batch
		p.notBefore = time.Now().Add(k.cfg.Retry.Delay(p.attempt))
		p.attempt++
		var ke kafka.Error
		if errors.As(err, &ke) || r.err != nil {
			refresh = true
		}
	}
	return refresh, ok
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

func (k *Kafka) acked(p *partition, batch []item, start time.Time) {
	if p.failing {
		p.failing = false
		k.setFailing(false, nil, p)
	}
	p.attempt = 0
	p.notBefore = time.Time{}
	if p.limit > 0 && !p.hasQueued() {
		p.limit = 0
	}
	now := time.Now()
	m := k.cfg.Metrics
	m.ProduceBatches.Inc()
	m.ProduceBatchSize.Observe(float64(len(batch)))
	m.ProduceLatency.Observe(now.Sub(start).Seconds())
	m.EndToEndLatency.Observe(now.Sub(batch[0].ev.CommitTime).Seconds())
	var bytes int
	for _, it := range batch {
		bytes += len(it.ev.Payload)
	}
	p.events.Add(float64(len(batch)))
	p.bytes.Add(float64(bytes))
	for _, it := range batch {
		if k.report(it, nil) != nil {
			return // halted: the rest is abandoned
		}
	}
	p.recycle(batch)
}
