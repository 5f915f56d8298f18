package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/letterstate"
)

// Outcomes of Reprocess and ReprocessDue for one dead letter.
const (
	// Reprocessed: the handler ran and its transaction committed; the dead
	// letter's status is now StatusCompleted.
	Reprocessed = "reprocessed"
	// ReprocessFailed: the handler failed again; the transaction rolled back
	// and the letter is in retry_wait (a transient failure within the
	// budget) or dead (see ReprocessResult.Status). Its last_failed_at,
	// error_message (the new error; error_code keeps the original
	// failure's), last_attempt_error and reprocess_attempts say so.
	ReprocessFailed = "failed"
	// ReprocessSkipped: the dead letter was reprocessed before (completed).
	ReprocessSkipped = "skipped"
	// ReprocessBusy: another reprocessor holds the letter (its lease has not
	// expired), or took it over while this one waited; nothing changed.
	ReprocessBusy = "busy"
	// ReprocessStopped: the context ended during the attempt; the
	// transaction rolled back and the letter went back to the status it had
	// (a stop is not the message's failure, so no attempt is counted).
	ReprocessStopped = "stopped"
	// ReprocessNotFound: no dead letter of this consumer has the id.
	ReprocessNotFound = "not_found"
)

// Defaults of AutoReprocess.
const (
	DefaultReprocessBudget    = 10
	DefaultReprocessBase      = time.Second
	DefaultReprocessCap       = 5 * time.Minute
	DefaultReprocessLease     = 2 * time.Minute
	DefaultReprocessBatchSize = 10
)

// AutoReprocess configures the reprocessing of dead letters by the
// consumer itself, and the lease and budget of every reprocessing (Reprocess
// and ReprocessDue use it too).
type AutoReprocess struct {
	// Interval, when positive, makes Run look for due letters this often and
	// reprocess them in the background, and makes it store a message whose
	// transient failure used up Config.Retry as StatusPending (without it:
	// StatusDead, since nothing would retry it). The handler is then called
	// from two goroutines at once: it must be safe for that.
	Interval time.Duration
	// Budget is the reprocessing attempts after which a letter is dead;
	// 0 means DefaultReprocessBudget.
	Budget int
	// Base and Cap are the full-jitter backoff between attempts: after the
	// n-th failed attempt a letter waits rand(0, min(Cap, Base·2^(n-1))) in
	// retry_wait; a pending letter waits Base after its failure before the
	// first. 0 means DefaultReprocessBase and DefaultReprocessCap.
	Base, Cap time.Duration
	// Lease is how long a reprocessor's claim on a letter lasts; another
	// reprocessor takes a letter over once its lease expired (its claimer
	// died). The row is locked while its handler runs, so a slow handler
	// does not lose it. 0 means DefaultReprocessLease.
	Lease time.Duration
	// BatchSize is how many due letters are claimed at once; 0 means
	// DefaultReprocessBatchSize.
	BatchSize int
}

func (a AutoReprocess) withDefaults() AutoReprocess {
	if a.Budget <= 0 {
		a.Budget = DefaultReprocessBudget
	}
	if a.Base <= 0 {
		a.Base = DefaultReprocessBase
	}
	if a.Cap <= 0 {
		a.Cap = DefaultReprocessCap
	}
	if a.Lease <= 0 {
		a.Lease = DefaultReprocessLease
	}
	if a.BatchSize <= 0 {
		a.BatchSize = DefaultReprocessBatchSize
	}
	return a
}

// validate reports negative fields.
func (a AutoReprocess) validate() error {
	if a.Interval < 0 || a.Budget < 0 || a.Base < 0 || a.Cap < 0 || a.Lease < 0 || a.BatchSize < 0 {
		return errors.New("field AutoReprocess: Interval, Budget, Base, Cap, Lease and BatchSize must not be negative (0 means the default)")
	}
	return nil
}

// ReprocessResult is what Reprocess or ReprocessDue did with one dead letter.
type ReprocessResult struct {
	ID        int64  // the dead letter's id (consumer_dead_letters.id)
	MessageID string // its message_id; "" when not found
	Outcome   string // Reprocessed, ReprocessFailed, ReprocessSkipped, ReprocessBusy, ReprocessStopped or ReprocessNotFound
	Status    string // the letter's status afterwards, as far as this call knows ("" when not found)
	Err       error  // the handler's error, for ReprocessFailed
}

// Reprocess is the operator's way back for dead letters, once the cause is
// fixed: for each dead letter of cfg.Name with one of ids, it claims the
// letter with a lease (atomically: of two reprocessors, one gets it and the
// other reports ReprocessBusy), then in one transaction locks it, refreshes
// the message's claim in processed_messages, calls handler with the message
// rebuilt from the row and marks the letter completed by actor. A handler
// error rolls that back and records the failure: a letter that was dead
// stays dead; a pending or retry_wait one goes to retry_wait, or to dead
// when the failure is permanent or cfg.AutoReprocess.Budget is spent.
// Reprocess makes one attempt per letter, at once, whatever its
// next_attempt_at; a completed letter is skipped.
//
// It uses cfg's Name, Pool, DeadLetterTable, AutoReprocess and Logger only.
// The returned error is a failure of the database, after which the
// remaining ids were not tried; per-letter outcomes are in the results.
// Every change of status is recorded in <table>_transitions (History).
func Reprocess(ctx context.Context, cfg Config, handler Handler, actor string, ids ...int64) ([]ReprocessResult, error) {
	p, err := newReprocessor(cfg, handler, "reprocess by "+actor, actor)
	if err != nil {
		return nil, err
	}
	var results []ReprocessResult
	for _, id := range ids {
		cs, err := p.claim(ctx, `id = $4 AND `+letterstate.Claimable, "id", 0, id)
		if err != nil {
			return results, err
		}
		var res ReprocessResult
		if len(cs) == 0 {
			res, err = p.notClaimed(ctx, id)
		} else {
			res, err = p.run(ctx, cs[0])
		}
		if err != nil {
			return results, err
		}
		p.logResult(res)
		results = append(results, res)
	}
	return results, nil
}

// ReprocessDue reprocesses, as Reprocess does, the letters of cfg.Name that
// are due, earliest first, at most cfg.AutoReprocess.BatchSize: pending ones
// whose failure is at least AutoReprocess.Base old, retry_wait ones past
// their next_attempt_at, and processing ones whose lease expired (their
// reprocessor died). Run calls it every AutoReprocess.Interval; an operator
// may call it from a job of their own. actor names the caller in the
// letters and their history.
func ReprocessDue(ctx context.Context, cfg Config, handler Handler, actor string) ([]ReprocessResult, error) {
	p, err := newReprocessor(cfg, handler, "auto reprocess by "+actor, actor)
	if err != nil {
		return nil, err
	}
	cond := `((status = 'pending' AND last_failed_at <= now() - $4 * interval '1 millisecond')
        OR ` + letterstate.RetryDue + `
        OR ` + letterstate.LeaseExpired + `)`
	cs, err := p.claim(ctx, cond, "coalesce(next_attempt_at, last_failed_at), id", p.auto.BatchSize, p.auto.Base.Milliseconds())
	if err != nil {
		return nil, err
	}
	var results []ReprocessResult
	for i, c := range cs {
		if ctx.Err() != nil {
			// Stopping: give back what was claimed and not tried.
			for _, c := range cs[i:] {
				if err := p.release(c, "the reprocessor stopped before trying it"); err != nil {
					return results, err
				}
			}
			return results, nil
		}
		res, err := p.run(ctx, c)
		if err != nil {
			return results, err
		}
		p.logResult(res)
		results = append(results, res)
	}
	return results, nil
}

// reprocessor is one call of Reprocess or ReprocessDue.
type reprocessor struct {
	cfg     Config
	t       tables
	handler Handler
	actor   string
	auto    AutoReprocess // with defaults
	lease   letterstate.Lease
	policy  letterstate.Policy
	log     zerolog.Logger
}

func newReprocessor(cfg Config, handler Handler, kind, actor string) (*reprocessor, error) {
	if handler == nil {
		return nil, errors.New("consumer: handler is nil")
	}
	if problems := cfg.validateStore(); len(problems) > 0 {
		return nil, fmt.Errorf("consumer config: %s", problems[0])
	}
	if err := cfg.AutoReprocess.validate(); err != nil {
		return nil, fmt.Errorf("consumer config: %w", err)
	}
	t, _ := newTables(cfg.DeadLetterTable)
	auto := cfg.AutoReprocess.withDefaults()
	return &reprocessor{
		cfg: cfg, t: t, handler: handler, actor: actor, auto: auto,
		lease:  letterstate.Lease{Owner: ownerName(kind), Duration: auto.Lease},
		policy: letterstate.Policy{Budget: auto.Budget, Retry: backoff.Policy{Base: auto.Base, Cap: auto.Cap}},
		log:    cfg.Logger.With().Str("component", "consumer").Str("consumer", cfg.Name).Logger(),
	}, nil
}

// ownerName is a lease owner unique to this call: kind, a random id, the
// host and the process.
func ownerName(kind string) string {
	return letterstate.OwnerName(kind, rand.Int64N(1<<40))
}

// claimed is a letter this reprocessor claimed.
type claimed struct {
	id          int64
	messageID   string
	msg         Message
	was         string // the status before the claim
	attempts    int    // reprocess_attempts before this one
	firstFailed time.Time
}

// claim claims, for p.lease, the letters of cfg.Name that cond selects ($4
// is arg), in order, at most limit (0: all), recording a transition for
// each.
func (p *reprocessor) claim(ctx context.Context, cond, order string, limit int, arg any) ([]claimed, error) {
	q := letterstate.ClaimCTEs(p.t.deadLetters, `consumer_name = $3 AND `+cond, order, limit) + `,
h AS (
    INSERT INTO ` + p.t.transitions + ` (dead_letter_id, consumer_name, message_id, owner, from_status, to_status, attempt, detail)
    SELECT id, consumer_name, message_id, $1, was, 'processing', reprocess_attempts, ` + letterstate.TookOver + `
    FROM u)
SELECT id, message_id, topic, kafka_partition, kafka_offset, message_key, payload, headers, message_time,
    first_failed_at, reprocess_attempts, was FROM u ORDER BY id`
	rows, err := p.cfg.Pool.Query(ctx, q, p.lease.Owner, p.lease.Millis(DefaultReprocessLease), p.cfg.Name, arg)
	if err != nil {
		return nil, fmt.Errorf("claim dead letters of %s in %s: %w", p.cfg.Name, p.t.dlName, err)
	}
	cs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
		var (
			c       claimed
			headers []byte
			msgTime *time.Time
		)
		err := r.Scan(&c.id, &c.messageID, &c.msg.Topic, &c.msg.Partition, &c.msg.Offset, &c.msg.Key, &c.msg.Value,
			&headers, &msgTime, &c.firstFailed, &c.attempts, &c.was)
		if err != nil {
			return c, err
		}
		if c.was == StatusProcessing {
			// Taken over from a reprocessor that died: what it had claimed
			// is unknown, so a failure counts against the budget, and a
			// release leaves the letter due at once.
			c.was = StatusRetryWait
		}
		if err := json.Unmarshal(headers, &c.msg.Headers); err != nil {
			return c, fmt.Errorf("decode the headers of dead letter %d: %w", c.id, err)
		}
		c.msg.ID = c.msg.Headers[HeaderID]
		if msgTime != nil {
			c.msg.Timestamp = *msgTime
		}
		return c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim dead letters of %s in %s: %w", p.cfg.Name, p.t.dlName, err)
	}
	return cs, nil
}

// notClaimed says why letter id could not be claimed.
func (p *reprocessor) notClaimed(ctx context.Context, id int64) (ReprocessResult, error) {
	res := ReprocessResult{ID: id}
	err := p.cfg.Pool.QueryRow(ctx, `SELECT message_id, status FROM `+p.t.deadLetters+` WHERE id = $1 AND consumer_name = $2`,
		id, p.cfg.Name).Scan(&res.MessageID, &res.Status)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		res.Outcome = ReprocessNotFound
		return res, nil
	case err != nil:
		return res, fmt.Errorf("reprocess dead letter %d: read it from %s: %w", id, p.t.dlName, err)
	case res.Status == StatusCompleted || res.Status == StatusReprocessed:
		res.Outcome, res.Status = ReprocessSkipped, StatusCompleted
	default:
		// Held by a live lease, or being claimed by someone else this very
		// moment (SKIP LOCKED passed it over).
		res.Outcome = ReprocessBusy
	}
	return res, nil
}

// run makes one attempt at claimed letter c. In one transaction it locks the
// row and checks that p still holds it (a lease that expired and was taken
// over is lost: ReprocessBusy), refreshes the message's claim, calls the
// handler and marks the letter completed. After a handler error it records
// the failure (settle); if ctx ended meanwhile it gives the letter back
// untried (release).
func (p *reprocessor) run(ctx context.Context, c claimed) (ReprocessResult, error) {
	res := ReprocessResult{ID: c.id, MessageID: c.messageID}
	tx, err := p.cfg.Pool.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("reprocess dead letter %d: begin transaction: %w", c.id, err)
	}
	defer rollback(tx)
	var held bool
	err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+p.t.deadLetters+` WHERE id = $1 AND `+letterstate.HeldBy("$2")+` FOR UPDATE)`,
		c.id, p.lease.Owner).Scan(&held)
	if err != nil {
		return res, fmt.Errorf("reprocess dead letter %d: lock it: %w", c.id, err)
	}
	if !held {
		res.Outcome = ReprocessBusy
		return res, nil
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+p.t.processed+` (consumer_name, message_id) VALUES ($1, $2)
ON CONFLICT (consumer_name, message_id) DO UPDATE SET processed_at = now()`, p.cfg.Name, c.messageID); err != nil {
		return res, fmt.Errorf("reprocess dead letter %d: claim message %q: %w", c.id, c.messageID, err)
	}
	if herr := callHandler(ctx, p.handler, tx, c.msg); herr != nil {
		rollback(tx)
		if ctx.Err() != nil {
			res.Outcome, res.Status, res.Err = ReprocessStopped, c.was, herr
			return res, p.release(c, "the reprocessor stopped during the attempt: "+herr.Error())
		}
		return p.settle(ctx, c, herr)
	}
	if _, err := tx.Exec(ctx, `WITH u AS (
    UPDATE `+p.t.deadLetters+` SET status = 'completed', reprocessed_at = now(), reprocessed_by = $2,
        reprocess_attempts = reprocess_attempts + 1, last_attempt_at = now(), last_attempt_error = NULL,
        next_attempt_at = NULL, claimed_by = NULL, claimed_until = NULL
    WHERE id = $1
    RETURNING id, consumer_name, message_id, reprocess_attempts)
INSERT INTO `+p.t.transitions+` (dead_letter_id, consumer_name, message_id, owner, from_status, to_status, attempt, detail)
SELECT id, consumer_name, message_id, $3, 'processing', 'completed', reprocess_attempts, 'by ' || $2 FROM u`,
		c.id, pgText(p.actor), p.lease.Owner); err != nil {
		return res, fmt.Errorf("reprocess dead letter %d: mark it completed: %w", c.id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		// The claim stays until its lease expires; then it is due again.
		return res, fmt.Errorf("reprocess dead letter %d: commit: %w", c.id, err)
	}
	res.Outcome, res.Status = Reprocessed, StatusCompleted
	return res, nil
}

// settle records the failed attempt herr at c, while p still holds it: the
// status the policy decides (retry_wait with its next attempt, or dead), the
// error and the attempt, and a transition.
func (p *reprocessor) settle(ctx context.Context, c claimed, herr error) (ReprocessResult, error) {
	res := ReprocessResult{ID: c.id, MessageID: c.messageID, Outcome: ReprocessFailed, Err: herr}
	to, wait, detail := p.policy.Failed(c.was, c.attempts, c.firstFailed, IsPermanent(herr), herr)
	tag, err := p.cfg.Pool.Exec(ctx, `WITH u AS (
    UPDATE `+p.t.deadLetters+` SET status = $3, reprocess_attempts = reprocess_attempts + 1,
        last_failed_at = now(), last_attempt_at = now(), error_message = $4, last_attempt_error = $5, reprocessed_by = $6,
        next_attempt_at = CASE WHEN $3 = 'retry_wait' THEN now() + $7 * interval '1 millisecond' END,
        claimed_by = NULL, claimed_until = NULL
    WHERE id = $1 AND `+letterstate.HeldBy("$2")+`
    RETURNING id, consumer_name, message_id, reprocess_attempts)
INSERT INTO `+p.t.transitions+` (dead_letter_id, consumer_name, message_id, owner, from_status, to_status, attempt, detail)
SELECT id, consumer_name, message_id, $2, 'processing', $3, reprocess_attempts, $5 FROM u`,
		c.id, p.lease.Owner, to, pgText("reprocess: "+herr.Error()), pgText(detail), pgText(p.actor), wait.Milliseconds())
	if err != nil {
		return res, fmt.Errorf("reprocess dead letter %d: record its failure: %w", c.id, err)
	}
	if tag.RowsAffected() == 0 {
		res.Outcome = ReprocessBusy // taken over meanwhile: the new owner decides
		return res, nil
	}
	res.Status = to
	return res, nil
}

// release gives c back untried, to the status it had before the claim,
// while p still holds it. It runs after ctx ended, so on a context of its
// own.
func (p *reprocessor) release(c claimed, why string) error {
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	_, err := p.cfg.Pool.Exec(ctx, `WITH u AS (
    UPDATE `+p.t.deadLetters+` SET status = $3, claimed_by = NULL, claimed_until = NULL
    WHERE id = $1 AND `+letterstate.HeldBy("$2")+`
    RETURNING id, consumer_name, message_id, reprocess_attempts)
INSERT INTO `+p.t.transitions+` (dead_letter_id, consumer_name, message_id, owner, from_status, to_status, attempt, detail)
SELECT id, consumer_name, message_id, $2, 'processing', $3, reprocess_attempts, $4 FROM u`,
		c.id, p.lease.Owner, c.was, pgText(why))
	if err != nil {
		return fmt.Errorf("reprocess dead letter %d: give it back (its lease expires otherwise): %w", c.id, err)
	}
	return nil
}

func (p *reprocessor) logResult(res ReprocessResult) {
	ev := p.log.Info()
	if res.Err != nil {
		ev = p.log.Warn().Err(res.Err)
	}
	if res.Status == StatusDead && res.Outcome == ReprocessFailed {
		ev = p.log.Error().Err(res.Err)
	}
	ev.Int64("dead_letter", res.ID).Str("message_id", res.MessageID).Str("outcome", res.Outcome).
		Str("status", res.Status).Str("actor", p.actor).Str("owner", p.lease.Owner).Msg("reprocess")
}

// Transition is one change of a dead letter's status, as recorded in
// <table>_transitions.
type Transition struct {
	ID           int64
	DeadLetterID int64
	MessageID    string
	Owner        string // the reprocessor that made it: its kind, actor, host and process
	From, To     string // statuses
	Attempt      int    // the letter's reprocess_attempts after it
	Detail       string // the error of a failed attempt, a lease taken over, who completed it
	At           time.Time
}

// History returns the recorded status changes of dead letter id of
// cfg.Name, oldest first. It uses cfg's Name, Pool and DeadLetterTable.
func History(ctx context.Context, cfg Config, id int64) ([]Transition, error) {
	if problems := cfg.validateStore(); len(problems) > 0 {
		return nil, fmt.Errorf("consumer config: %s", problems[0])
	}
	t, _ := newTables(cfg.DeadLetterTable)
	rows, err := cfg.Pool.Query(ctx, `SELECT id, dead_letter_id, message_id, owner, from_status, to_status, attempt,
    coalesce(detail, ''), at FROM `+t.transitions+` WHERE dead_letter_id = $1 AND consumer_name = $2 ORDER BY id`, id, cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("read the history of dead letter %d: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Transition, error) {
		var tr Transition
		err := r.Scan(&tr.ID, &tr.DeadLetterID, &tr.MessageID, &tr.Owner, &tr.From, &tr.To, &tr.Attempt, &tr.Detail, &tr.At)
		return tr, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the history of dead letter %d: %w", id, err)
	}
	return out, nil
}
