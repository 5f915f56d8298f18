package deadletter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// DefaultRetryCodes are the error codes the automatic retries take by
// default: failures that can pass without the event changing.
//
//   - message_too_large: the broker's or the topic's message.max.bytes may be
//     raised (the usual fix).
//   - topic_authorization_failed: the relay's principal may be granted WRITE.
//   - unknown_topic_or_partition: the topic may be created.
//
// Not retried: invalid_topic (a name Kafka refuses stays refused: replay to another
// topic), empty_key (the stored key stays empty), invalid_partition (a
// replay sends by key, which would change where the event goes without an
// operator deciding so), invalid_record and the other codes, which need a
// look at the error first.
var DefaultRetryCodes = []string{"message_too_large", "topic_authorization_failed", "unknown_topic_or_partition"}

// Defaults of AutoRetry.
const (
	DefaultRetryBudget    = 10
	DefaultRetryInterval  = 10 * time.Second
	DefaultAttemptTimeout = time.Minute
)

// PublisherOpener connects a Publisher for the automatic retries and returns
// it with the function that closes it.
type PublisherOpener func(ctx context.Context) (replay.Publisher, func() error, error)

// AutoRetry is the relay's automatic reprocessing of dead letters
// (dead_letters.auto_retry): in the background it claims the letters whose error
// code is one of Codes once they are due, publishes them as a dlq replay
// does, and moves each to completed, or after a failure to retry_wait with
// a backoff, or to dead once Budget attempts failed (or the letter is older
// than MaxAge). Its claims are leases like a replay's, so several relays,
// and operators' replays, may run at the same time.
//
// Each Run is one entry in the replay history (kind dlq, actor "auto retry
// of relay …"), whose published messages carry its id in replay.HeaderReplay, and
// whose transitions say what happened to every letter.
type AutoRetry struct {
	Store *Store
	// Open connects the publisher when the first letter is due. Run closes
	// it when it returns, and after an attempt Kafka did not answer within
	// AttemptTimeout: a fresh producer then abandons what the old one would
	// still be retrying.
	Open PublisherOpener
	// Codes are the error codes retried (DefaultRetryCodes when nil).
	Codes []string
	// Budget is the attempts after which a letter is dead (DefaultRetryBudget
	// when 0).
	Budget int
	// MaxAge, when positive, makes a letter whose first failure is older
	// than this dead at its next failed attempt.
	MaxAge time.Duration
	// Retry is the wait after the n-th failed attempt, rand(0, min(Cap,
	// Base·2^(n-1))) (DefaultRetry when Base is 0); a letter the relay just
	// stored waits Base before its first attempt.
	Retry backoff.Policy
	// Interval is how often due letters are looked for (DefaultRetryInterval
	// when 0).
	Interval time.Duration
	// AttemptTimeout bounds one batch's publishing; a batch Kafka did not
	// acknowledge by then counts as a failed attempt (DefaultAttemptTimeout
	// when 0).
	AttemptTimeout time.Duration
	// BatchSize is how many letters are claimed and published at once
	// (replay.DefaultBatchSize when 0).
	BatchSize int
	// Lease is how long a claim lasts unless renewed (DefaultLease when 0).
	Lease time.Duration
	// RelayName names the relay in the history.
	RelayName string
	// Ready, when set, is asked before each round: while it is false (Kafka
	// does not accept the relay's own events) nothing is attempted, so an
	// outage does not spend the letters' budget.
	Ready func() bool
	// Names names the command that replays a letter in the log line of a
	// letter given up on (see package setting).
	Names setting.Namer

	Logger  zerolog.Logger
	Metrics *metrics.Metrics
}

// Run retries due letters until ctx ends, then records the end of its replay
// and returns nil. It returns an error when the store fails (Postgres is
// unreachable, say); the caller may call Run again after a while. Failures
// to connect to Kafka or to publish are not errors of Run: the letters go
// back untried, or count a failed attempt.
func (a *AutoRetry) Run(ctx context.Context) error {
	codes := a.Codes
	if codes == nil {
		codes = DefaultRetryCodes
	}
	budget := a.Budget
	if budget <= 0 {
		budget = DefaultRetryBudget
	}
	retry := a.Retry
	if retry.Base <= 0 {
		retry = DefaultRetry
	}
	every := a.Interval
	if every <= 0 {
		every = DefaultRetryInterval
	}
	m := a.Metrics
	if m == nil {
		m = metrics.Discard()
	}
	filters := map[string]any{"auto_retry": true, "error_codes": codes, "budget": budget}
	if a.MaxAge > 0 {
		filters["max_age"] = a.MaxAge.String()
	}
	c := &letterClaims{s: a.Store, policy: settlePolicy{budget: budget, maxAge: a.MaxAge, retry: retry}, held: map[int64]*claimed{}}
	p := &retryPublisher{open: a.Open}
	run, err := a.Store.History().StartRun(ctx, p,
		replay.Entry{Kind: replay.KindDLQ, Actor: "auto retry of relay " + a.RelayName, Filters: filters}, a.BatchSize, c)
	if err != nil {
		return fmt.Errorf("start the automatic dead-letter retries: %w", err)
	}
	r := &letterRun{s: a.Store, run: run, claims: c}
	c.lease = Lease{Owner: OwnerName("auto retry", run.ID()), Duration: a.Lease, ReplayID: run.ID()}
	log := a.Logger.With().Str("component", "dlq-auto-retry").Int64("replay_id", run.ID()).Logger()
	p.log = log
	c.onSettle = func(x settlement, eventID string) {
		if !x.attempted {
			return
		}
		m.DeadLetterRetries.WithLabelValues(x.to).Inc()
		if x.to == StatusDead {
			m.DeadLettersDead.Inc()
			log.Warn().Str("event_id", eventID).Int64("dead_letter_id", x.id).Str("error", x.detail).
				Msg("automatic retries gave up on a dead letter (status dead): fix the cause, then replay it: " + a.Names.Command("dlq replay", "id", "<dead_letter_id>"))
		}
	}
	log.Info().Strs("codes", codes).Int("budget", budget).Msg("automatic dead-letter retries started")

	rctx, stopLeases := r.keepLeases(ctx)
	defer stopLeases()
	defer p.close()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		n, err := 0, error(nil)
		if a.Ready == nil || a.Ready() {
			n, err = a.round(rctx, r, p, codes, retry.Base)
		}
		if rctx.Err() != nil {
			_, ferr := run.Finish(ctx, nil)
			if ferr != nil && ctx.Err() == nil {
				return ferr
			}
			if cause := context.Cause(rctx); ctx.Err() == nil && cause != nil {
				return cause // the leases could not be renewed
			}
			return nil
		}
		if err != nil {
			_, ferr := run.Finish(ctx, err)
			return errors.Join(fmt.Errorf("automatic dead-letter retries: %w", err), ferr)
		}
		if n == run.BatchSize() {
			continue // more may be due
		}
		select {
		case <-rctx.Done():
		case <-t.C:
		}
	}
}

// round claims the letters due now and publishes them; it returns how many
// it claimed.
func (a *AutoRetry) round(ctx context.Context, r *letterRun, p *retryPublisher, codes []string, firstDelay time.Duration) (int, error) {
	letters, err := a.Store.ClaimDue(ctx, r.claims.lease, codes, firstDelay, r.run.BatchSize())
	if err != nil || len(letters) == 0 {
		return 0, err
	}
	for _, l := range letters {
		r.run.Select()
		r.run.Queue(r.item(l, ""))
	}
	if _, err := p.get(ctx); err != nil {
		// Kafka unreachable: the letters go back untried.
		return len(letters), r.run.Abandon(ctx, err)
	}
	timeout := a.AttemptTimeout
	if timeout <= 0 {
		timeout = DefaultAttemptTimeout
	}
	actx, cancel := context.WithTimeoutCause(ctx, timeout, replay.ErrAttemptTimeout)
	err = r.run.Flush(actx)
	cancel()
	if errors.Is(err, replay.ErrAttemptTimeout) {
		p.log.Warn().Dur("timeout", timeout).Int("letters", len(letters)).
			Msg("Kafka did not acknowledge a dead-letter retry in time; counted as a failed attempt, reconnecting")
		p.close()
		return len(letters), nil
	}
	if err != nil && ctx.Err() != nil {
		return len(letters), nil // stopping
	}
	return len(letters), err
}

// retryPublisher is the publisher of the automatic retries' run: round opens
// it (get) before each batch, and again after close.
type retryPublisher struct {
	open  PublisherOpener
	log   zerolog.Logger
	pub   replay.Publisher
	done  func() error
	fails int // consecutive failures to open
}

// Publish publishes through the publisher get opened.
func (p *retryPublisher) Publish(ctx context.Context, topic string, events []*outbox.Event) error {
	if p.pub == nil {
		return errors.New("publish dead-letter retries: no Kafka connection")
	}
	return p.pub.Publish(ctx, topic, events)
}

func (p *retryPublisher) get(ctx context.Context) (replay.Publisher, error) {
	if p.pub != nil {
		return p.pub, nil
	}
	pub, done, err := p.open(ctx)
	if err != nil {
		if p.fails++; p.fails == 1 {
			p.log.Warn().Err(err).Msg("cannot connect to Kafka for the dead-letter retries; retrying at the next round")
		}
		return nil, fmt.Errorf("connect to Kafka for the dead-letter retries: %w", err)
	}
	p.fails = 0
	p.pub, p.done = pub, done
	return pub, nil
}

func (p *retryPublisher) close() {
	if p.done != nil {
		if err := p.done(); err != nil {
			p.log.Warn().Err(err).Msg("close the dead-letter retries' Kafka producer")
		}
	}
	p.pub, p.done = nil, nil
}
