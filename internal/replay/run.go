package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/time/rate"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// DefaultBatchSize is how many events a replay publishes at once by default.
const DefaultBatchSize = 100

// maxFailures bounds Outcome.Failures; the history has every failure.
const maxFailures = 100

// Publisher publishes replayed events; sink.Publisher is the relay's.
//
// Publish returns nil once Kafka acknowledged every event with acks=all. When
// some events failed for good and the others were acknowledged, it returns a
// *sink.PublishError naming the failed ones. Any other error (the context
// ended, the topic could not be opened) means no event may be assumed
// delivered. The topic travels beside the events, as every fact a stage
// learns about an event does (sink.Message), never in them: the relay renders
// it from a template, a dead letter stores it, a replay may override it.
// Replayed events carry no source position (no Origin): Kafka's copy is never
// taken for the stream's.
type Publisher interface {
	Publish(ctx context.Context, topic string, events []*outbox.Event) error
}

var _ Publisher = (*sink.Publisher)(nil)

// Claims ends the claims a run holds on the events it publishes (the leases
// on dead letters), in the transaction that records their results, so that
// the history and the claimed rows agree.
type Claims interface {
	// End queues the end of the claim on it, if it holds one: err nil means
	// Kafka acknowledged it; otherwise its attempt failed (tried) or it was
	// not attempted.
	End(it Item, err error, tried bool)
	// Settle writes the queued ends in tx.
	Settle(ctx context.Context, tx pgx.Tx) error
	// Settled is called once the transaction of Settle committed: the queued
	// ends are done.
	Settled()
}

// ErrAttemptTimeout is the cause to give a context that bounds one attempt
// (context.WithTimeoutCause): when it ends, Flush counts the events Kafka did
// not acknowledge as failed attempts; when a context ends for any other
// reason, the replay was stopped and they go back untried.
var ErrAttemptTimeout = errors.New("attempt not acknowledged by Kafka in time")

// Outcome is what a replay did.
type Outcome struct {
	ReplayID int64 // its id in the history
	Counts
	DryRun   int     // events a dry run would have published
	Failures []Event // the first failures (at most 100); the history has all
}

// Item is an event waiting to be published by a Run.
type Item struct {
	Event        *outbox.Event
	Topic        string
	DeadLetterID int64 // the dead letter it is, 0 for outbox rows
}

// Run is one replay in progress: it batches, rate-limits, publishes and
// records, so that every replay keeps one history and one accounting. For
// each event, Select it, then Note its result or Publish it; Flush at the end
// and Finish.
type Run struct {
	h      *History
	p      Publisher
	id     int64
	batch  int
	lim    *rate.Limiter // nil: unlimited
	claims Claims        // nil: the events are not claimed

	pending []Item  // to publish
	records []Event // results not recorded yet
	ended   int     // claim ends queued (claims.End) and not recorded yet
	res     Outcome

	// rec records the results of unclaimed events on a goroutine of its
	// own, one batch behind the publishing (nil until the first Flush):
	// recording each event's result cost more than publishing it, and
	// waiting for it between batches halved a table replay's speed. The
	// results of claimed events are recorded with their claims, at once.
	rec *recorder
}

// recorder records a run's results in the background, one batch at a
// time, in order. Its first error stops it and is returned by the next
// hand or by wait.
type recorder struct {
	jobs chan recordJob
	done chan struct{}
	err  error // set before done closes
}

// recordJob is one batch of results and the totals after it.
type recordJob struct {
	events []Event
	counts Counts
}

// StartRun validates the options common to every replay, records the start
// of e (as Start) and returns the run that publishes and records its events.
// batch is the events published at once (0 means DefaultBatchSize); p may be
// nil for a dry run. claims, when not nil, ends the claims on the events the
// run publishes.
func (h *History) StartRun(ctx context.Context, p Publisher, e Entry, batch int, claims Claims) (*Run, error) {
	if e.RatePerSec < 0 {
		return nil, fmt.Errorf("replay: rate %g is negative (0 means unlimited)", e.RatePerSec)
	}
	if p == nil && !e.DryRun {
		return nil, errors.New("replay: no publisher (only a dry run needs none)")
	}
	if batch <= 0 {
		batch = DefaultBatchSize
	}
	if e.Actor == "" {
		e.Actor = "unknown"
	}
	id, err := h.Start(ctx, e)
	if err != nil {
		return nil, err
	}
	r := &Run{h: h, p: p, id: id, batch: batch, claims: claims, res: Outcome{ReplayID: id}}
	if e.RatePerSec > 0 && !e.DryRun {
		// One token per event; a burst of one batch. The bucket starts empty so
		// the first second keeps the rate too (a full one would send a whole
		// batch at once).
		r.lim = rate.NewLimiter(rate.Limit(e.RatePerSec), batch)
		r.lim.AllowN(time.Now(), batch)
	}
	return r, nil
}

// ID is the replay's id in the history.
func (r *Run) ID() int64 { return r.id }

// BatchSize is how many events the run publishes at once: the page size for
// reading the events it replays.
func (r *Run) BatchSize() int { return r.batch }

// Select counts one more event the replay's filters selected; call it once per
// event, before Note or Publish.
func (r *Run) Select() { r.res.Selected++ }

// Selected is how many events were selected so far.
func (r *Run) Selected() int { return r.res.Selected }

// Note queues the result of an event that is not published (skipped, dry run
// or failed before publishing).
func (r *Run) Note(ctx context.Context, e Event) error {
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
func (r *Run) fail(e Event) {
	r.res.Failed++
	if len(r.res.Failures) < maxFailures {
		r.res.Failures = append(r.res.Failures, e)
	}
	r.records = append(r.records, e)
}

// Publish queues it, taking a token from the rate limiter first: when none is
// left, what is queued is published before waiting, so a low rate publishes
// events one by one instead of waiting to fill a batch.
func (r *Run) Publish(ctx context.Context, it Item) error {
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
	r.Queue(it)
	if len(r.pending) >= r.batch {
		return r.Flush(ctx)
	}
	return nil
}

// Queue queues it without taking a token nor publishing: the next Flush
// publishes it, or Abandon (or Finish with an error) records it as not
// attempted and ends its claim so.
func (r *Run) Queue(it Item) { r.pending = append(r.pending, it) }

// wait takes a token from the rate limiter, waiting for it until ctx ends.
// (rate.Limiter.Wait gives up at once when ctx's deadline is nearer than the
// token, with an error of its own; a replay rather runs until the deadline.)
func (r *Run) wait(ctx context.Context) error {
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
func (r *Run) Flush(ctx context.Context) error {
	var topics []string
	groups := map[string][]Item{}
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
				tried = errors.Is(stop, ErrAttemptTimeout)
			}
		}
		var pe *sink.PublishError
		isPE := errors.As(err, &pe)
		now := time.Now()
		for i, it := range items {
			e := Event{EventID: string(it.Event.ID), DeadLetterID: it.DeadLetterID, Result: ResultPublished, At: now}
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
	if err := r.flushRecords(ctx, r.claims == nil && stop == nil); err != nil {
		return err
	}
	if stop != nil {
		return fmt.Errorf("replay %d stopped: %w", r.id, stop)
	}
	return nil
}

// end queues the end of the claim on it, if the run's events are claimed.
func (r *Run) end(it Item, err error, tried bool) {
	if r.claims != nil {
		r.claims.End(it, err, tried)
		r.ended++
	}
}

// flushRecords records the queued results and claim ends with the totals so
// far, even when ctx has ended: in the background when behind (a batch of
// unclaimed events published; the history may then trail Kafka by the batch
// being recorded), else at once, after what the background holds.
func (r *Run) flushRecords(ctx context.Context, behind bool) error {
	counts := r.res.Counts
	if behind {
		if r.rec == nil {
			r.rec = r.h.startRecorder(r.id)
		}
		if err := r.rec.hand(recordJob{events: r.records, counts: counts}); err != nil {
			return err
		}
		r.records, r.ended = nil, 0 // the recorder owns the slice now
		return nil
	}
	if err := r.waitRecorder(); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := r.h.record(rctx, r.id, r.records, &counts, r.claims); err != nil {
		return err
	}
	r.records, r.ended = r.records[:0], 0
	return nil
}

// waitRecorder waits until the background has recorded what it was handed,
// and returns its error.
func (r *Run) waitRecorder() error {
	if r.rec == nil {
		return nil
	}
	rec := r.rec
	r.rec = nil
	close(rec.jobs)
	<-rec.done
	return rec.err
}

// startRecorder starts recording the results of replay id in the
// background.
func (h *History) startRecorder(id int64) *recorder {
	rec := &recorder{jobs: make(chan recordJob), done: make(chan struct{})}
	go func() {
		defer close(rec.done)
		for job := range rec.jobs {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			rec.err = h.record(ctx, id, job.events, &job.counts, nil)
			cancel()
			if rec.err != nil {
				return // hand and waitRecorder report it
			}
		}
	}()
	return rec
}

// hand gives the recorder job, waiting while it records the one before; it
// returns the error that stopped it, if one did.
func (rec *recorder) hand(job recordJob) error {
	select {
	case rec.jobs <- job:
		return nil
	case <-rec.done:
		return rec.err
	}
}

// Finish records the end of the replay, with err the reason it stopped (nil
// when it ran to the end), and returns the outcome. Events queued and not
// attempted are recorded so (see Abandon).
func (r *Run) Finish(ctx context.Context, err error) (Outcome, error) {
	if err != nil {
		if rerr := r.Abandon(ctx, err); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	if werr := r.waitRecorder(); werr != nil {
		err = errors.Join(err, werr)
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if ferr := r.h.Finish(fctx, r.id, r.res.Counts); ferr != nil {
		err = errors.Join(err, ferr)
	}
	return r.res, err
}

// Abandon records the queued events as failed, not attempted because of err,
// ends their claims so (the claimed rows go back untried), and records what
// else is queued.
func (r *Run) Abandon(ctx context.Context, err error) error {
	if len(r.pending)+len(r.records)+r.ended == 0 {
		return nil
	}
	for _, it := range r.pending {
		r.fail(Event{EventID: string(it.Event.ID), DeadLetterID: it.DeadLetterID, Result: ResultFailed,
			Error: "not attempted: " + err.Error(), At: time.Now()})
		r.end(it, err, false)
	}
	r.pending = nil
	return r.flushRecords(ctx, false)
}
