package deadletter

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"golang.org/x/time/rate"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// DefaultBatchSize is how many events a replay publishes at once by default.
const DefaultBatchSize = 100

// maxFailures bounds ReplayResult.Failures; the history has every failure.
const maxFailures = 100

// ReplayOptions configures ReplayDeadLetters.
type ReplayOptions struct {
	Filter Filter // which letters
	DryRun bool   // publish nothing; record what would be published
	Force  bool   // publish letters that were replayed already too (otherwise skipped)
	// Rate bounds the events published per second; 0 means unlimited.
	Rate float64
	// BatchSize is how many events are published at once, and the rate
	// limiter's burst. 0 means DefaultBatchSize.
	BatchSize int
	Actor     string // who runs the replay, for the history
}

// ReplayResult is what a replay did.
type ReplayResult struct {
	ReplayID int64 // its id in the history
	Counts
	DryRun   int           // events a dry run would have published
	Failures []ReplayEvent // the first failures (at most 100); the history has all
}

// ReplayDeadLetters publishes the letters o.Filter selects again, in id order,
// each to its stored topic with its stored key, payload and headers (so with its
// original "id" header) plus the header HeaderReplay holding the replay's id.
//
// Letters already replayed are skipped unless o.Force is set. A letter is marked
// replayed only after Kafka acknowledged it (acks=all); the result of every
// selected letter is recorded in the history, together with the marks, in one
// transaction per batch. A letter that fails stays pending and the replay goes
// on. p may be nil for a dry run.
//
// When ctx ends, the replay stops, records what it did and returns ctx's error
// with the result so far. Events sent but not acknowledged by then are recorded
// as failed; Kafka may still have them, so a later replay can duplicate them
// (consumers drop repeats by the id header).
func (s *Store) ReplayDeadLetters(ctx context.Context, p Publisher, o ReplayOptions) (ReplayResult, error) {
	if err := o.Filter.Validate(); err != nil {
		return ReplayResult{}, fmt.Errorf("replay dead letters: %w", err)
	}
	r, err := s.StartReplayRun(ctx, p, Replay{
		Kind: KindDLQ, Actor: o.Actor, Filters: o.Filter.describe(),
		DryRun: o.DryRun, Forced: o.Force, RatePerSec: o.Rate,
	}, o.BatchSize)
	if err != nil {
		return ReplayResult{}, err
	}
	f := o.Filter
	for {
		f.Limit = r.batch
		if o.Filter.Limit > 0 {
			f.Limit = min(r.batch, o.Filter.Limit-r.res.Selected)
			if f.Limit <= 0 {
				break
			}
		}
		page, err := s.List(ctx, f)
		if err != nil {
			return r.Finish(ctx, err)
		}
		for _, l := range page {
			r.res.Selected++
			switch {
			case l.Status == StatusReplayed && !o.Force:
				err = r.Note(ctx, ReplayEvent{EventID: l.EventID, DeadLetterID: l.ID, Result: ResultSkipped,
					Error: "already replayed (use force to replay again)"})
			case o.DryRun:
				err = r.Note(ctx, ReplayEvent{EventID: l.EventID, DeadLetterID: l.ID, Result: ResultDryRun})
			default:
				err = r.Publish(ctx, ReplayItem{Event: l.event(r.id), Topic: l.Topic, letter: l.ID})
			}
			if err != nil {
				return r.Finish(ctx, err)
			}
		}
		if len(page) < f.Limit {
			break
		}
		f.after = page[len(page)-1].ID
	}
	return r.Finish(ctx, r.Flush(ctx))
}

// event returns the message of l as the relay would have sent it, marked as
// part of replay replayID.
func (l *Letter) event(replayID int64) *outbox.Event {
	ev := &outbox.Event{
		ID:            []byte(l.EventID),
		AggregateType: []byte(l.AggregateType),
		AggregateID:   l.Key,
		EventType:     []byte(l.EventType),
		Payload:       l.Payload,
		PayloadType:   l.PayloadType,
		CommitLSN:     l.CommitLSN,
	}
	if t, err := time.Parse(time.RFC3339Nano, l.Headers[sink.HeaderCommitTime]); err == nil {
		ev.CommitTime = t
	}
	for _, k := range slices.Sorted(maps.Keys(l.Headers)) {
		switch k {
		case sink.HeaderID, sink.HeaderEventType, sink.HeaderAggregateType, sink.HeaderCommitLSN,
			sink.HeaderCommitTime, sink.HeaderSource, HeaderReplay:
			continue // set by the sink from the event's fields, or replaced below
		}
		ev.Headers = append(ev.Headers, outbox.Header{Key: k, Value: []byte(l.Headers[k])})
	}
	ev.Headers = append(ev.Headers, outbox.Header{Key: HeaderReplay, Value: []byte(strconv.FormatInt(replayID, 10))})
	return ev
}

// ReplayItem is an event waiting to be published by a ReplayRun.
type ReplayItem struct {
	Event  *outbox.Event
	Topic  string
	letter int64 // dead letter id, 0 for outbox rows (other packages' items)
}

// ReplayRun is one replay in progress: it batches, rate-limits, publishes and
// records. ReplayDeadLetters drives one over the store's letters; a replay of
// events the store does not hold (package outboxtable: rows of the outbox
// table) drives its own, so that every replay keeps one history and one
// accounting: for each event, Select it, then Note its result or Publish it;
// Flush at the end and Finish.
type ReplayRun struct {
	s     *Store
	p     Publisher
	id    int64
	batch int
	lim   *rate.Limiter // nil: unlimited

	pending  []ReplayItem  // to publish
	records  []ReplayEvent // results not recorded yet
	replayed []int64       // letters acknowledged, not marked yet
	res      ReplayResult
}

// StartReplayRun validates the options common to every replay, records the
// start of rp (as StartReplay) and returns the run that publishes and records
// its events. batch is the events published at once (0 means
// DefaultBatchSize); p may be nil for a dry run.
func (s *Store) StartReplayRun(ctx context.Context, p Publisher, rp Replay, batch int) (*ReplayRun, error) {
	if batch <= 0 {
		batch = DefaultBatchSize
	}
	if rp.RatePerSec < 0 {
		return nil, fmt.Errorf("replay: rate %g is negative (0 means unlimited)", rp.RatePerSec)
	}
	if p == nil && !rp.DryRun {
		return nil, errors.New("replay: no publisher (only a dry run needs none)")
	}
	if rp.Actor == "" {
		rp.Actor = "unknown"
	}
	id, err := s.StartReplay(ctx, rp)
	if err != nil {
		return nil, err
	}
	r := &ReplayRun{s: s, p: p, id: id, batch: batch, res: ReplayResult{ReplayID: id}}
	if rp.RatePerSec > 0 && !rp.DryRun {
		// One token per event; a burst of one batch. The bucket starts empty so
		// the first second keeps the rate too (a full one would send a whole
		// batch at once).
		r.lim = rate.NewLimiter(rate.Limit(rp.RatePerSec), batch)
		r.lim.AllowN(time.Now(), batch)
	}
	return r, nil
}

// ID is the replay's id in the history.
func (r *ReplayRun) ID() int64 { return r.id }

// BatchSize is how many events the run publishes at once: the page size for
// reading the events it replays.
func (r *ReplayRun) BatchSize() int { return r.batch }

// Select counts one more event the replay's filters selected; call it once per
// event, before Note or Publish.
func (r *ReplayRun) Select() { r.res.Selected++ }

// Selected is how many events were selected so far.
func (r *ReplayRun) Selected() int { return r.res.Selected }

// Note queues the result of an event that is not published (skipped, dry run
// or failed before publishing).
func (r *ReplayRun) Note(ctx context.Context, e ReplayEvent) error {
	switch e.Result {
	case ResultSkipped:
		r.res.Skipped++
		r.records = append(r.records, e)
	case ResultDryRun:
		r.res.DryRun++
		r.records = append(r.records, e)
	case ResultFailed:
		r.fail(e)
	}
	if len(r.records) >= r.batch {
		return r.Flush(ctx)
	}
	return nil
}

// fail counts a failed event, keeps it for the result and queues its record.
func (r *ReplayRun) fail(e ReplayEvent) {
	r.res.Failed++
	if len(r.res.Failures) < maxFailures {
		r.res.Failures = append(r.res.Failures, e)
	}
	r.records = append(r.records, e)
}

// Publish queues it, taking a token from the rate limiter first: when none is
// left, what is queued is published before waiting, so a low rate publishes
// events one by one instead of waiting to fill a batch.
func (r *ReplayRun) Publish(ctx context.Context, it ReplayItem) error {
	if r.lim != nil && !r.lim.Allow() {
		err := r.Flush(ctx)
		if err == nil {
			err = r.wait(ctx)
		}
		if err != nil {
			r.pending = append(r.pending, it) // finish records it as not attempted
			return err
		}
	}
	r.pending = append(r.pending, it)
	if len(r.pending) >= r.batch {
		return r.Flush(ctx)
	}
	return nil
}

// wait takes a token from the rate limiter, waiting for it until ctx ends.
// (rate.Limiter.Wait gives up at once when ctx's deadline is nearer than the
// token, with an error of its own; a replay rather runs until the deadline.)
func (r *ReplayRun) wait(ctx context.Context) error {
	res := r.lim.Reserve() // burst >= 1, so always possible
	t := time.NewTimer(res.Delay())
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		res.Cancel()
		return fmt.Errorf("replay %d: wait for the rate limit: %w", r.id, ctx.Err())
	}
}

// Flush publishes the queued events, grouped by topic in order of first
// appearance, and records their results and the other queued results.
func (r *ReplayRun) Flush(ctx context.Context) error {
	var topics []string
	groups := map[string][]ReplayItem{}
	for _, it := range r.pending {
		if _, ok := groups[it.Topic]; !ok {
			topics = append(topics, it.Topic)
		}
		groups[it.Topic] = append(groups[it.Topic], it)
	}
	r.pending = r.pending[:0]
	var stop error // the context ended: the remaining groups are not attempted
	for _, topic := range topics {
		items := groups[topic]
		err := stop
		if err == nil {
			evs := make([]*outbox.Event, len(items))
			for i, it := range items {
				evs[i] = it.Event
			}
			err = r.p.Publish(ctx, topic, evs)
			if err != nil && ctx.Err() != nil {
				stop = ctx.Err()
			}
		}
		var pe *PublishError
		isPE := errors.As(err, &pe)
		now := time.Now()
		for i, it := range items {
			e := ReplayEvent{EventID: string(it.Event.ID), DeadLetterID: it.letter, Result: ResultPublished, At: now}
			switch {
			case err == nil || isPE && pe.Errs[i] == nil:
				r.res.Published++
				r.records = append(r.records, e)
				if it.letter != 0 {
					r.replayed = append(r.replayed, it.letter)
				}
				continue
			case isPE:
				e.Error = pe.Errs[i].Error()
			default:
				e.Error = err.Error()
			}
			e.Result = ResultFailed
			r.fail(e)
		}
	}
	// Record even when ctx ended: the history must say what reached Kafka.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := r.s.record(rctx, r.id, r.records, r.replayed); err != nil {
		return err
	}
	r.records, r.replayed = r.records[:0], r.replayed[:0]
	if stop != nil {
		return fmt.Errorf("replay %d stopped: %w", r.id, stop)
	}
	return nil
}

// Finish records the end of the replay, with err the reason it stopped (nil
// when it ran to the end), and returns the result.
func (r *ReplayRun) Finish(ctx context.Context, err error) (ReplayResult, error) {
	if err != nil && len(r.pending)+len(r.records) > 0 {
		// Stopped early: what was queued was not published.
		for _, it := range r.pending {
			r.fail(ReplayEvent{EventID: string(it.Event.ID), DeadLetterID: it.letter, Result: ResultFailed,
				Error: "not attempted: " + err.Error(), At: time.Now()})
		}
		r.pending = nil
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		if rerr := r.s.record(rctx, r.id, r.records, r.replayed); rerr != nil {
			err = errors.Join(err, rerr)
		}
		cancel()
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if ferr := r.s.FinishReplay(fctx, r.id, r.res.Counts); ferr != nil {
		err = errors.Join(err, ferr)
	}
	return r.res, err
}
