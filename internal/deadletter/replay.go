package deadletter

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/letterstate"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/route"
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
	Force  bool   // publish completed letters too (otherwise skipped)
	// Rate bounds the events published per second; 0 means unlimited.
	Rate float64
	// BatchSize is how many events are published at once, the rate
	// limiter's burst, and how many letters are claimed at once. 0 means
	// DefaultBatchSize.
	BatchSize int
	Actor     string // who runs the replay, for the history
	// Topic, when set, is where every letter is published instead of its
	// own topic (a letter whose topic template produced a name Kafka refuses
	// can only be delivered so); it must be a valid topic name. The replay
	// and every transition it makes record it.
	Topic string
	// Lease is how long a claim lasts unless renewed (0: DefaultLease). The
	// replay renews its claims every third of it while it runs.
	Lease time.Duration
	// Retry is the wait before the automatic retries take a letter whose
	// attempt failed (0: DefaultRetry).
	Retry backoff.Policy
}

// DefaultRetry is the wait after a failed attempt before the automatic retries
// take a letter again: rand(0, min(1h, 1m·2^n)) after the n+1st failure.
var DefaultRetry = backoff.Policy{Base: time.Minute, Cap: time.Hour}

// ReplayResult is what a replay did.
type ReplayResult struct {
	ReplayID int64 // its id in the history
	Counts
	DryRun   int           // events a dry run would have published
	Failures []ReplayEvent // the first failures (at most 100); the history has all
}

// ReplayDeadLetters publishes the letters o.Filter selects again, in id order,
// each to its stored topic (or o.Topic) with its stored key, payload and
// headers (so with its original "id" header) plus the header HeaderReplay
// holding the replay's id.
//
// It claims each page of letters before publishing them (see Claim), so
// replays running at the same time publish each letter once: a letter another
// replay holds is skipped, and recorded so. Completed letters are skipped
// unless o.Force is set. A letter is marked completed only after Kafka
// acknowledged it (acks=all), right after each batch, in the transaction
// that records the batch's results in the history; a letter that fails goes
// to retry_wait (a dead one stays dead) and the replay goes on. p may be nil
// for a dry run, which claims nothing.
//
// When ctx ends, the replay stops, records what it did, releases the letters
// it did not attempt and returns ctx's error with the result so far. Events
// sent but not acknowledged by then are recorded as failed and released
// untried; Kafka may still have them, so a later replay can duplicate them
// (consumers drop repeats by the id header). The same holds for a replay
// that dies: at most the batch it was publishing can be published again by
// the replay that takes its expired claims over.
func (s *Store) ReplayDeadLetters(ctx context.Context, p Publisher, o ReplayOptions) (ReplayResult, error) {
	if err := o.Filter.Validate(); err != nil {
		return ReplayResult{}, fmt.Errorf("replay dead letters: %w", err)
	}
	if o.Topic != "" {
		if err := route.ValidTopic(o.Topic); err != nil {
			return ReplayResult{}, fmt.Errorf("replay dead letters: topic override %q: %w", o.Topic, err)
		}
	}
	r, err := s.StartReplayRun(ctx, p, Replay{
		Kind: KindDLQ, Actor: o.Actor, Filters: o.Filter.describe(),
		DryRun: o.DryRun, Forced: o.Force, RatePerSec: o.Rate, TopicOverride: o.Topic,
	}, o.BatchSize)
	if err != nil {
		return ReplayResult{}, err
	}
	if !o.DryRun {
		retry := o.Retry
		if retry.Base <= 0 {
			retry = DefaultRetry
		}
		r.lease = Lease{Owner: OwnerName("replay", r.id), Duration: o.Lease, ReplayID: r.id}
		r.policy = settlePolicy{retry: retry}
		var stop func()
		ctx, stop = r.keepLeases(ctx)
		defer stop()
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
		var want []Letter // to claim and publish
		for _, l := range page {
			r.res.Selected++
			switch {
			case l.Status == StatusCompleted && !o.Force:
				err = r.Note(ctx, ReplayEvent{EventID: l.EventID, DeadLetterID: l.ID, Result: ResultSkipped,
					Error: "already completed (use force to replay again)"})
			case o.DryRun && l.Status == StatusProcessing && l.ClaimedUntil != nil && l.ClaimedUntil.After(time.Now()):
				err = r.Note(ctx, ReplayEvent{EventID: l.EventID, DeadLetterID: l.ID, Result: ResultSkipped, Error: heldBy(l)})
			case o.DryRun:
				err = r.Note(ctx, ReplayEvent{EventID: l.EventID, DeadLetterID: l.ID, Result: ResultDryRun})
			default:
				want = append(want, l)
			}
			if err != nil {
				return r.Finish(ctx, err)
			}
		}
		if err := r.claimAndPublish(ctx, want, o); err != nil {
			return r.Finish(ctx, err)
		}
		if len(page) < f.Limit {
			break
		}
		f.after = page[len(page)-1].ID
	}
	return r.Finish(ctx, r.Flush(ctx))
}

// heldBy says who holds processing letter l.
func heldBy(l Letter) string {
	until := "(no expiry)"
	if l.ClaimedUntil != nil {
		until = l.ClaimedUntil.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("held by %s until %s", l.ClaimedBy, until)
}

// claimAndPublish claims want and queues the claimed letters for publishing;
// the others are recorded as skipped: another replay holds them. On error,
// the claimed letters not queued yet are left for Finish to release.
func (r *ReplayRun) claimAndPublish(ctx context.Context, want []Letter, o ReplayOptions) error {
	if len(want) == 0 {
		return nil
	}
	ids := make([]int64, len(want))
	for i, l := range want {
		ids[i] = l.ID
	}
	claimed, err := r.s.Claim(ctx, r.lease, ids, o.Force)
	if err != nil {
		return err
	}
	got := make(map[int64]Letter, len(claimed))
	for _, l := range claimed {
		got[l.ID] = l
	}
	for _, l := range want {
		c, ok := got[l.ID]
		if !ok {
			reason := "claimed by another replay meanwhile"
			if l.Status == StatusProcessing {
				reason = heldBy(l)
			}
			err = r.Note(ctx, ReplayEvent{EventID: l.EventID, DeadLetterID: l.ID, Result: ResultSkipped, Error: reason})
		} else {
			delete(got, l.ID)
			err = r.Publish(ctx, r.item(c, o.Topic))
		}
		if err != nil {
			for _, c := range claimed {
				if _, left := got[c.ID]; left {
					r.pending = append(r.pending, r.item(c, o.Topic)) // not attempted: Finish releases it
				}
			}
			return err
		}
	}
	return nil
}

// item is the claimed letter l to publish, to topic when set.
func (r *ReplayRun) item(l Letter, topic string) ReplayItem {
	if topic == "" {
		topic = l.Topic
	}
	return ReplayItem{Event: l.event(r.id), Topic: topic, letter: l.ID,
		claim: &claimed{was: l.was, attempts: l.Attempts, firstFailed: l.FirstFailedAt, topic: l.Topic}}
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
	letter int64    // dead letter id, 0 for outbox rows (other packages' items)
	claim  *claimed // the claim on the letter, nil for outbox rows
}

// claimed is what a run knows of a letter it claimed, to end the claim.
type claimed struct {
	was         string // the status before the claim
	attempts    int    // Attempts before this one
	firstFailed time.Time
	topic       string // the letter's own topic
}

// before is the status an untried claim goes back to: the one before it, or
// pending when the claim took over an expired one (whose status before that
// is not known).
func (c *claimed) before() string {
	if c.was == "" || c.was == StatusProcessing {
		return StatusPending
	}
	return c.was
}

// settlePolicy decides what a letter whose attempt failed becomes: the
// state model's shared decision (letterstate.Policy.Failed).
type settlePolicy struct {
	budget int            // attempts after which it is dead; 0: never
	maxAge time.Duration  // a letter that first failed longer ago than this is dead; 0: never
	retry  backoff.Policy // the wait before it is due again
}

// failed returns the status, wait and detail of the claim c whose attempt
// failed with err.
func (p settlePolicy) failed(c *claimed, err error) (string, time.Duration, string) {
	return letterstate.Policy{Budget: p.budget, MaxAge: p.maxAge, Retry: p.retry}.Failed(c.was, c.attempts, c.firstFailed, false, err)
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

	lease    Lease        // the claims' (dead-letter replays)
	policy   settlePolicy // for letters whose attempt failed
	onSettle func(x settlement, eventID string)

	pending []ReplayItem  // to publish
	records []ReplayEvent // results not recorded yet
	settle  []settlement  // claims ended, not recorded yet
	ids     []string      // the event id of each settle
	res     ReplayResult
}

// StartReplayRun validates the options common to every replay, records the
// start of rp (as StartReplay) and returns the run that publishes and records
// its events. batch is the events published at once (0 means
// DefaultBatchSize); p may be nil for a dry run.
func (s *Store) StartReplayRun(ctx context.Context, p Publisher, rp Replay, batch int) (*ReplayRun, error) {
	if rp.RatePerSec < 0 {
		return nil, fmt.Errorf("replay: rate %g is negative (0 means unlimited)", rp.RatePerSec)
	}
	if p == nil && !rp.DryRun {
		return nil, errors.New("replay: no publisher (only a dry run needs none)")
	}
	return s.startRun(ctx, p, rp, batch)
}

// startRun is StartReplayRun without the check of the publisher, which the
// automatic retries open when they need it.
func (s *Store) startRun(ctx context.Context, p Publisher, rp Replay, batch int) (*ReplayRun, error) {
	if batch <= 0 {
		batch = DefaultBatchSize
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
// appearance, and records their results, the end of their claims and the
// other queued results.
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
		tried := stop == nil
		if err == nil {
			evs := make([]*outbox.Event, len(items))
			for i, it := range items {
				evs[i] = it.Event
			}
			err = r.p.Publish(ctx, topic, evs)
			if err != nil && ctx.Err() != nil {
				stop = context.Cause(ctx)
				// Kafka did not answer in time: a failed attempt. Otherwise
				// the replay was stopped: the letters go back untried.
				tried = errors.Is(stop, errAttemptTimeout)
			}
		}
		var pe *sink.PublishError
		isPE := errors.As(err, &pe)
		now := time.Now()
		for i, it := range items {
			e := ReplayEvent{EventID: string(it.Event.ID), DeadLetterID: it.letter, Result: ResultPublished, At: now}
			switch {
			case err == nil || isPE && pe.Errs[i] == nil:
				r.res.Published++
				r.records = append(r.records, e)
				r.end(it, nil, true)
				continue
			case isPE:
				e.Error = pe.Errs[i].Error()
			default:
				e.Error = err.Error()
			}
			e.Result = ResultFailed
			r.fail(e)
			r.end(it, errors.New(e.Error), tried)
		}
	}
	// Record even when ctx ended: the history must say what reached Kafka.
	if err := r.flushRecords(ctx); err != nil {
		return err
	}
	if stop != nil {
		return fmt.Errorf("replay %d stopped: %w", r.id, stop)
	}
	return nil
}

// errAttemptTimeout is the cause of a context that bounds one attempt of the
// automatic retries.
var errAttemptTimeout = errors.New("attempt not acknowledged by Kafka in time")

// end queues the end of the claim on it, if any: err nil means Kafka
// acknowledged it; otherwise the attempt failed (tried) or it was not
// attempted.
func (r *ReplayRun) end(it ReplayItem, err error, tried bool) {
	c := it.claim
	if c == nil {
		return
	}
	x := settlement{id: it.letter, attempted: tried}
	if it.Topic != c.topic {
		x.topic = it.Topic
	}
	switch {
	case err == nil:
		x.to = StatusCompleted
		if x.topic != "" {
			x.detail = fmt.Sprintf("topic override: published to %s instead of %s", it.Topic, c.topic)
		}
	case !tried:
		x.to, x.detail = c.before(), "not attempted: "+err.Error()
	default:
		x.to, x.wait, x.detail = r.policy.failed(c, err)
	}
	r.settle = append(r.settle, x)
	r.ids = append(r.ids, string(it.Event.ID))
}

// flushRecords records the queued results and claim ends with the totals so
// far, even when ctx has ended.
func (r *ReplayRun) flushRecords(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	counts := r.res.Counts
	err := r.s.record(rctx, r.id, batchRecord{events: r.records, lease: r.lease, settle: r.settle, counts: &counts})
	if err != nil {
		return err
	}
	if r.onSettle != nil {
		for i, x := range r.settle {
			r.onSettle(x, r.ids[i])
		}
	}
	r.records, r.settle, r.ids = r.records[:0], r.settle[:0], r.ids[:0]
	return nil
}

// keepLeases renews the run's claims every third of the lease until stop is
// called. When a renewal fails, it cancels the returned context with the
// reason: the replay stops before its claims expire and another replay may
// take them over while it still publishes.
func (r *ReplayRun) keepLeases(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Duration(r.lease.millis()) * time.Millisecond / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if _, err := r.s.Renew(ctx, r.lease); err != nil {
					cancel(fmt.Errorf("replay %d stopped before its claims expire: %w", r.id, err))
					return
				}
			}
		}
	}()
	return ctx, func() {
		close(done)
		wg.Wait()
		cancel(nil)
	}
}

// Finish records the end of the replay, with err the reason it stopped (nil
// when it ran to the end), and returns the result. Letters it claimed and did
// not attempt are released.
func (r *ReplayRun) Finish(ctx context.Context, err error) (ReplayResult, error) {
	if err != nil {
		if rerr := r.abandon(ctx, err); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if ferr := r.s.FinishReplay(fctx, r.id, r.res.Counts); ferr != nil {
		err = errors.Join(err, ferr)
	}
	return r.res, err
}

// abandon records the queued events as not attempted because of err,
// releases their claims, and records what else is queued.
func (r *ReplayRun) abandon(ctx context.Context, err error) error {
	if len(r.pending)+len(r.records)+len(r.settle) == 0 {
		return nil
	}
	for _, it := range r.pending {
		r.fail(ReplayEvent{EventID: string(it.Event.ID), DeadLetterID: it.letter, Result: ResultFailed,
			Error: "not attempted: " + err.Error(), At: time.Now()})
		r.end(it, err, false)
	}
	r.pending = nil
	return r.flushRecords(ctx)
}
