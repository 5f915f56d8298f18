package deadletter

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/letterstate"
)

// DefaultLease is how long a replay's claim on a letter lasts unless renewed;
// a replay renews its claims every third of it while it publishes.
const DefaultLease = 2 * time.Minute

// Lease says who claims letters and for how long.
type Lease struct {
	// Owner names the claimer in the letters (claimed_by) and the
	// transitions; two replays must never share one (see OwnerName).
	Owner string
	// Duration is how long a claim lasts unless renewed; 0 means
	// DefaultLease. Expiry is computed by the database's clock, so replays on
	// hosts with skewed clocks agree on it.
	Duration time.Duration
	// ReplayID is the replay the claims are for, recorded with each
	// transition (0: none).
	ReplayID int64
}

func (l Lease) millis() int64 {
	return letterstate.Lease{Owner: l.Owner, Duration: l.Duration}.Millis(DefaultLease)
}

// OwnerName is the lease owner of replay replayID of kind ("replay", "auto
// retry") run by this process: unique among replays, and saying where to look.
func OwnerName(kind string, replayID int64) string {
	return letterstate.OwnerName(kind, replayID)
}

// Claim takes, for lease, the letters among ids that no one else holds:
// pending, retry_wait and dead ones, processing ones whose lease expired
// (their former owner died or stalled), and, with force, completed ones. The
// claim is atomic: a row another replay is claiming at this moment is skipped
// (FOR UPDATE SKIP LOCKED), and a row it claimed no longer qualifies, so two
// replays never get the same letter. Claimed letters are processing, owned by
// lease.Owner until the lease expires; a transition is recorded for each in
// the same statement. They are returned in id order.
func (s *Store) Claim(ctx context.Context, lease Lease, ids []int64, force bool) ([]Letter, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	cond := `id = ANY($4) AND (` + letterstate.Claimable + `
        OR ($5 AND status IN ('completed', 'replayed')))`
	letters, err := s.claim(ctx, lease, cond, "id", 0, ids, force)
	if err != nil {
		return nil, s.wrap(err, "claim %d dead letters for %s", len(ids), lease.Owner)
	}
	return letters, nil
}

// ClaimDue claims, for lease, at most limit letters that are due for an
// automatic retry, earliest due first: those whose error code is one of codes
// and that are pending since their last failure at least firstDelay ago, in
// retry_wait past their NextAttemptAt, or processing with an expired lease.
// Like Claim it is atomic and records a transition for each.
func (s *Store) ClaimDue(ctx context.Context, lease Lease, codes []string, firstDelay time.Duration, limit int) ([]Letter, error) {
	if len(codes) == 0 || limit <= 0 {
		return nil, nil
	}
	cond := `error_code = ANY($4) AND (
        (status = 'pending' AND last_failed_at <= now() - $5 * interval '1 millisecond')
        OR ` + letterstate.RetryDue + `
        OR ` + letterstate.LeaseExpired + `)`
	letters, err := s.claim(ctx, lease, cond, "coalesce(next_attempt_at, last_failed_at), id", limit, codes, firstDelay.Milliseconds())
	if err != nil {
		return nil, s.wrap(err, "claim dead letters due for a retry (codes %s) for %s", strings.Join(codes, ", "), lease.Owner)
	}
	return letters, nil
}

// claim claims the letters cond selects ($4 and $5 are a and b), in order,
// at most limit (0: all), and records their transitions.
func (s *Store) claim(ctx context.Context, lease Lease, cond, order string, limit int, a, b any) ([]Letter, error) {
	q := letterstate.ClaimCTEs(s.n.letters, cond, order, limit) + `,
h AS (
    INSERT INTO ` + s.n.transitions + ` (dead_letter_id, event_id, replay_id, owner, from_status, to_status, attempt, detail)
    SELECT id, event_id, nullif($3::bigint, 0), $1, CASE WHEN was = 'replayed' THEN 'completed' ELSE was END,
        'processing', attempts,
        ` + letterstate.TookOver + `
    FROM u)
SELECT ` + letterColumns + `, CASE WHEN was = 'replayed' THEN 'completed' ELSE was END FROM u ORDER BY id`
	rows, err := s.pool.Query(ctx, q, lease.Owner, lease.millis(), lease.ReplayID, a, b)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Letter, error) {
		var was string
		l, err := scanLetter(r, &was)
		l.was = was
		return l, err
	})
}

// Renew extends every claim lease.Owner holds to lease.Duration from now and
// returns how many it extended.
func (s *Store) Renew(ctx context.Context, lease Lease) (int64, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE `+s.n.letters+` SET claimed_until = now() + $2 * interval '1 millisecond'
WHERE claimed_by = $1 AND status = 'processing'`, lease.Owner, lease.millis())
	if err != nil {
		return 0, s.wrap(err, "renew the leases of %s", lease.Owner)
	}
	return tag.RowsAffected(), nil
}

// settlement is the end of one claim: what the letter becomes.
type settlement struct {
	id        int64
	to        string        // StatusCompleted, StatusRetryWait, StatusDead, or the status before the claim (not attempted)
	attempted bool          // the letter was sent: Attempts+1
	wait      time.Duration // to retry_wait: until NextAttemptAt
	topic     string        // where it was sent, when not its own topic
	detail    string        // the error, or why it was not attempted
}

// settleIn ends, in tx, lease's claims ss (see settleSQL).
func (s *Store) settleIn(ctx context.Context, tx pgx.Tx, lease Lease, ss []settlement) error {
	if len(ss) == 0 {
		return nil
	}
	// Lock in id order first: two replays ending claims on the same letters
	// (one took over the other's expired lease) then wait for each other
	// instead of deadlocking.
	ids := make([]int64, len(ss))
	for i, x := range ss {
		ids[i] = x.id
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+s.n.letters+` WHERE id = ANY($1) ORDER BY id FOR UPDATE`, ids); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, s.settleSQL(), settleArgs(lease, ss)...)
	return err
}

// settleSQL ends claims ($2…$7 are arrays of settlements): a completed letter
// is marked whoever holds it now (it is in Kafka); any other end applies only
// while lease $1 still holds the letter, so a replay whose lease expired and
// was taken over cannot undo the new owner's work. A transition is recorded
// for each letter changed.
func (s *Store) settleSQL() string {
	return `WITH x AS (
    SELECT * FROM unnest($2::bigint[], $3::text[], $4::bool[], $5::bigint[], $6::text[], $7::text[])
        AS x(sid, to_status, attempted, wait_ms, topic, detail)),
u AS (
    UPDATE ` + s.n.letters + ` AS d SET
        status = x.to_status,
        claimed_by = NULL,
        claimed_until = NULL,
        attempts = d.attempts + CASE WHEN x.attempted THEN 1 ELSE 0 END,
        last_attempt_at = CASE WHEN x.attempted THEN now() ELSE d.last_attempt_at END,
        last_attempt_error = CASE WHEN x.to_status = 'completed' THEN NULL
            WHEN x.attempted THEN nullif(x.detail, '') ELSE d.last_attempt_error END,
        next_attempt_at = CASE WHEN x.to_status = 'retry_wait' THEN now() + x.wait_ms * interval '1 millisecond' END,
        replayed_at = CASE WHEN x.to_status = 'completed' THEN now() ELSE d.replayed_at END,
        replay_count = d.replay_count + CASE WHEN x.to_status = 'completed' THEN 1 ELSE 0 END
    FROM x
    WHERE d.id = x.sid AND (x.to_status = 'completed' OR (d.status = 'processing' AND d.claimed_by = $1))
    RETURNING d.id, d.event_id, d.attempts, x.to_status, x.topic, x.detail)
INSERT INTO ` + s.n.transitions + ` (dead_letter_id, event_id, replay_id, owner, from_status, to_status, attempt, topic, detail)
SELECT id, event_id, nullif($8::bigint, 0), $1, 'processing', to_status, attempts, nullif(topic, ''), nullif(detail, '') FROM u`
}

// settleArgs returns the arguments of settleSQL.
func settleArgs(lease Lease, ss []settlement) []any {
	ids := make([]int64, len(ss))
	to := make([]string, len(ss))
	attempted := make([]bool, len(ss))
	wait := make([]int64, len(ss))
	topics := make([]string, len(ss))
	details := make([]string, len(ss))
	for i, x := range ss {
		ids[i], to[i], attempted[i], wait[i], topics[i], details[i] = x.id, x.to, x.attempted, x.wait.Milliseconds(), x.topic, x.detail
	}
	return []any{lease.Owner, ids, to, attempted, wait, topics, details, lease.ReplayID}
}

// Transition is one change of a letter's status, as recorded.
type Transition struct {
	ID           int64
	DeadLetterID int64
	EventID      string
	ReplayID     int64  // the replay that made it; 0: none
	Owner        string // the lease owner that made it
	From, To     string // statuses
	Attempt      int    // the letter's Attempts after it
	Topic        string // where the letter was sent, when a replay overrode its topic
	Detail       string // the error of a failed attempt, a lease taken over, why a claim ended untried
	At           time.Time
}

// TransitionFilter selects transitions; zero fields select everything.
type TransitionFilter struct {
	DeadLetterIDs []int64
	EventIDs      []string
	ReplayID      int64
	Limit         int // the newest this many (0: all), still listed oldest first
}

// ListTransitions returns the transitions f selects, oldest first.
func (s *Store) ListTransitions(ctx context.Context, f TransitionFilter) ([]Transition, error) {
	var conds []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		conds = append(conds, fmt.Sprintf(cond, len(args)))
	}
	if len(f.DeadLetterIDs) > 0 {
		add("dead_letter_id = ANY($%d)", f.DeadLetterIDs)
	}
	if len(f.EventIDs) > 0 {
		add("event_id = ANY($%d)", f.EventIDs)
	}
	if f.ReplayID != 0 {
		add("replay_id = $%d", f.ReplayID)
	}
	q := `SELECT id, dead_letter_id, event_id, coalesce(replay_id, 0), owner, from_status, to_status, attempt,
    coalesce(topic, ''), coalesce(detail, ''), at FROM ` + s.n.transitions
	if len(conds) > 0 {
		q += " WHERE " + strings.Join(conds, " AND ")
	}
	q += " ORDER BY id DESC"
	if f.Limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", f.Limit)
	}
	rows, err := s.pool.Query(ctx, "SELECT * FROM ("+q+") t ORDER BY id", args...)
	if err != nil {
		return nil, s.wrap(err, "list dead-letter transitions")
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Transition, error) {
		var t Transition
		err := r.Scan(&t.ID, &t.DeadLetterID, &t.EventID, &t.ReplayID, &t.Owner, &t.From, &t.To, &t.Attempt,
			&t.Topic, &t.Detail, &t.At)
		return t, err
	})
	if err != nil {
		return nil, s.wrap(err, "list dead-letter transitions")
	}
	return out, nil
}
