package deadletter

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/letterstate"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// ReplayOptions configures ReplayDeadLetters.
type ReplayOptions struct {
	Filter Filter // which letters
	DryRun bool   // publish nothing; record what would be published
	Force  bool   // publish completed letters too (otherwise skipped)
	// Rate bounds the events published per second; 0 means unlimited.
	Rate float64
	// BatchSize is how many events are published at once, the rate
	// limiter's burst, and how many letters are claimed at once. 0 means
	// replay.DefaultBatchSize.
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

// ReplayDeadLetters publishes the letters o.Filter selects again, in id order,
// each to its stored topic (or o.Topic) with its stored key, payload and
// headers (so with its original "id" header) plus the header replay.HeaderReplay
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
func (s *Store) ReplayDeadLetters(ctx context.Context, p replay.Publisher, o ReplayOptions) (replay.Outcome, error) {
	if err := o.Filter.Validate(); err != nil {
		return replay.Outcome{}, fmt.Errorf("replay dead letters: %w", err)
	}
	if o.Topic != "" {
		if err := route.ValidTopic(o.Topic); err != nil {
			return replay.Outcome{}, fmt.Errorf("replay dead letters: topic override %q: %w", o.Topic, err)
		}
	}
	var c *letterClaims
	var claims replay.Claims // nil for a dry run, which claims nothing
	if !o.DryRun {
		retry := o.Retry
		if retry.Base <= 0 {
			retry = DefaultRetry
		}
		c = &letterClaims{s: s, policy: settlePolicy{retry: retry}, held: map[int64]*claimed{}}
		claims = c
	}
	run, err := s.History().StartRun(ctx, p, replay.Entry{
		Kind: replay.KindDLQ, Actor: o.Actor, Filters: o.Filter.describe(),
		DryRun: o.DryRun, Forced: o.Force, RatePerSec: o.Rate, TopicOverride: o.Topic,
	}, o.BatchSize, claims)
	if err != nil {
		return replay.Outcome{}, err
	}
	r := &letterRun{s: s, run: run, claims: c}
	if c != nil {
		c.lease = Lease{Owner: OwnerName("replay", run.ID()), Duration: o.Lease, ReplayID: run.ID()}
		var stop func()
		ctx, stop = r.keepLeases(ctx)
		defer stop()
	}
	f := o.Filter
	for {
		f.Limit = run.BatchSize()
		if o.Filter.Limit > 0 {
			f.Limit = min(run.BatchSize(), o.Filter.Limit-run.Selected())
			if f.Limit <= 0 {
				break
			}
		}
		page, err := s.List(ctx, f)
		if err != nil {
			return run.Finish(ctx, err)
		}
		var want []Letter // to claim and publish
		for _, l := range page {
			run.Select()
			switch {
			case l.Status == StatusCompleted && !o.Force:
				err = run.Note(ctx, replay.Event{EventID: l.EventID, DeadLetterID: l.ID, Result: replay.ResultSkipped,
					Error: "already completed (use force to replay again)"})
			case o.DryRun && l.Status == StatusProcessing && l.ClaimedUntil != nil && l.ClaimedUntil.After(time.Now()):
				err = run.Note(ctx, replay.Event{EventID: l.EventID, DeadLetterID: l.ID, Result: replay.ResultSkipped, Error: heldBy(l)})
			case o.DryRun:
				err = run.Note(ctx, replay.Event{EventID: l.EventID, DeadLetterID: l.ID, Result: replay.ResultDryRun})
			default:
				want = append(want, l)
			}
			if err != nil {
				return run.Finish(ctx, err)
			}
		}
		if err := r.claimAndPublish(ctx, want, o); err != nil {
			return run.Finish(ctx, err)
		}
		if len(page) < f.Limit {
			break
		}
		f.after = page[len(page)-1].ID
	}
	return run.Finish(ctx, run.Flush(ctx))
}

// heldBy says who holds processing letter l.
func heldBy(l Letter) string {
	until := "(no expiry)"
	if l.ClaimedUntil != nil {
		until = l.ClaimedUntil.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("held by %s until %s", l.ClaimedBy, until)
}

// letterRun is a replay of dead letters: the run that publishes and records
// them, and the claims it holds on them.
type letterRun struct {
	s      *Store
	run    *replay.Run
	claims *letterClaims
}

// claimAndPublish claims want and queues the claimed letters for publishing;
// the others are recorded as skipped: another replay holds them. On error,
// the claimed letters not queued yet are left for Finish to release.
func (r *letterRun) claimAndPublish(ctx context.Context, want []Letter, o ReplayOptions) error {
	if len(want) == 0 {
		return nil
	}
	ids := make([]int64, len(want))
	for i, l := range want {
		ids[i] = l.ID
	}
	claimed, err := r.s.Claim(ctx, r.claims.lease, ids, o.Force)
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
			err = r.run.Note(ctx, replay.Event{EventID: l.EventID, DeadLetterID: l.ID, Result: replay.ResultSkipped, Error: reason})
		} else {
			delete(got, l.ID)
			err = r.run.Publish(ctx, r.item(c, o.Topic))
		}
		if err != nil {
			for _, c := range claimed {
				if _, left := got[c.ID]; left {
					r.run.Queue(r.item(c, o.Topic)) // not attempted: Finish releases it
				}
			}
			return err
		}
	}
	return nil
}

// item is the claimed letter l to publish, to topic when set; the run's
// claims remember the claim, to end it.
func (r *letterRun) item(l Letter, topic string) replay.Item {
	if topic == "" {
		topic = l.Topic
	}
	r.claims.held[l.ID] = &claimed{was: l.was, attempts: l.Attempts, firstFailed: l.FirstFailedAt, topic: l.Topic}
	return replay.Item{Event: l.event(r.run.ID()), Topic: topic, DeadLetterID: l.ID}
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
			sink.HeaderCommitTime, sink.HeaderSource, replay.HeaderReplay:
			continue // set by the sink from the event's fields, or replaced below
		}
		ev.Headers = append(ev.Headers, outbox.Header{Key: k, Value: []byte(l.Headers[k])})
	}
	ev.Headers = append(ev.Headers, outbox.Header{Key: replay.HeaderReplay, Value: []byte(strconv.FormatInt(replayID, 10))})
	return ev
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

// keepLeases renews the run's claims every third of the lease until stop is
// called. When a renewal fails, it cancels the returned context with the
// reason: the replay stops before its claims expire and another replay may
// take them over while it still publishes.
func (r *letterRun) keepLeases(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Duration(r.claims.lease.millis()) * time.Millisecond / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if _, err := r.s.Renew(ctx, r.claims.lease); err != nil {
					cancel(fmt.Errorf("replay %d stopped before its claims expire: %w", r.run.ID(), err))
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

// letterClaims are the claims of a replay on the letters it publishes
// (replay.Claims): it ends each in the transaction that records the letter's
// result in the history.
type letterClaims struct {
	s        *Store
	lease    Lease
	policy   settlePolicy // for letters whose attempt failed
	onSettle func(x settlement, eventID string)

	held   map[int64]*claimed // by letter id: claimed, not ended yet
	settle []settlement       // claims ended, not recorded yet
	ids    []string           // the event id of each settle
}

var _ replay.Claims = (*letterClaims)(nil)

// End queues the end of the claim on it, if the run holds one: err nil means
// Kafka acknowledged it; otherwise the attempt failed (tried) or it was not
// attempted.
func (r *letterClaims) End(it replay.Item, err error, tried bool) {
	c := r.held[it.DeadLetterID]
	if c == nil {
		return
	}
	delete(r.held, it.DeadLetterID)
	x := settlement{id: it.DeadLetterID, attempted: tried}
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

// Settle ends the queued claims in tx (see settleSQL).
func (c *letterClaims) Settle(ctx context.Context, tx pgx.Tx) error {
	return c.s.settleIn(ctx, tx, c.lease, c.settle)
}

// Settled reports the ended claims to onSettle and forgets them.
func (c *letterClaims) Settled() {
	if c.onSettle != nil {
		for i, x := range c.settle {
			c.onSettle(x, c.ids[i])
		}
	}
	c.settle, c.ids = c.settle[:0], c.ids[:0]
}
