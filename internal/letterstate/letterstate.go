// Package letterstate is the state model that dead letters follow on both
// sides of the outbox: the relay's (package deadletter, events it could not
// publish) and the idempotent consumer's (package consumer, messages its
// handler could not apply).
//
//	pending ──claim──▶ processing ──success──▶ completed
//	                     │    └──failed──▶ retry_wait ──due (or by hand)──▶ processing …
//	                     └──failed, budget spent──▶ dead ──by hand──▶ processing …
//
// Every claim is atomic and leased: one statement takes the rows that no one
// else holds (SELECT … FOR UPDATE SKIP LOCKED, then status processing with
// claimed_by and claimed_until), so two claimers never get the same row, and
// a claimer that dies leaves a lease that expires, after which another takes
// the row over. Expiry is computed by the database's clock, so claimers on
// hosts with skewed clocks agree on it.
//
// The package holds what the two sides share: the status names, the SQL
// conditions and the claim statement's shape over the columns both tables
// have (status, claimed_by, claimed_until, next_attempt_at), and the decision
// what a letter whose attempt failed becomes. Each side keeps its own table,
// history and SQL for the columns that differ.
package letterstate

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
)

// The statuses of the state model, as stored in the status column.
const (
	// Pending: stored, not attempted since it last failed.
	Pending = "pending"
	// Processing: claimed by claimed_by until claimed_until; once that
	// passed, another claimer may take it over.
	Processing = "processing"
	// RetryWait: an attempt failed transiently; due again at
	// next_attempt_at.
	RetryWait = "retry_wait"
	// Completed: an attempt succeeded.
	Completed = "completed"
	// Dead: the budget is spent (or the failure cannot pass by itself); only
	// an operator attempts it now.
	Dead = "dead"
)

// SQLList returns the statuses of the model as an SQL list for a CHECK
// constraint, followed by legacy, the statuses older versions of one side
// may still write during an upgrade.
func SQLList(legacy ...string) string {
	all := append([]string{Pending, Processing, RetryWait, Completed, Dead}, legacy...)
	return "'" + strings.Join(all, "', '") + "'"
}

// SQL conditions over a letter's row (unqualified column names).
const (
	// LeaseExpired selects rows whose claimer's lease has run out.
	LeaseExpired = `(status = 'processing' AND coalesce(claimed_until, '-infinity') < now())`
	// RetryDue selects rows in retry_wait whose next attempt is due.
	RetryDue = `(status = 'retry_wait' AND coalesce(next_attempt_at, '-infinity') <= now())`
	// Claimable selects the rows an operator may claim by id: every row no
	// one holds that did not complete.
	Claimable = `(status IN ('pending', 'retry_wait', 'dead') OR ` + LeaseExpired + `)`
)

// HeldBy is the condition that the claimer named by the SQL parameter param
// (e.g. "$1") still holds the row: a settlement guarded by it cannot undo
// the work of a claimer that took an expired lease over.
func HeldBy(param string) string {
	return `(status = 'processing' AND claimed_by = ` + param + `)`
}

// ClaimCTEs returns the start of a claim statement on table (quoted): the
// common table expressions c, the rows cond selects (ordered by order, at
// most limit, 0: all) locked with SKIP LOCKED, and u, those rows set to
// processing for the owner $1 until $2 milliseconds from now, returning every
// column and was, was_owner and was_until (the status, claimer and expiry
// before the claim). The caller appends its history (TookOver helps) and the
// final SELECT from u; cond may use parameters from $3.
func ClaimCTEs(table, cond, order string, limit int) string {
	lim := ""
	if limit > 0 {
		lim = fmt.Sprintf(" LIMIT %d", limit)
	}
	return `WITH c AS (
    SELECT id AS claim_id, status AS was, claimed_by AS was_owner, claimed_until AS was_until FROM ` + table + `
    WHERE ` + cond + `
    ORDER BY ` + order + lim + ` FOR UPDATE SKIP LOCKED),
u AS (
    UPDATE ` + table + ` AS d SET status = 'processing', claimed_by = $1,
        claimed_until = now() + $2 * interval '1 millisecond'
    FROM c WHERE d.id = c.claim_id
    RETURNING d.*, c.was, c.was_owner, c.was_until)`
}

// TookOver is the SQL expression, over the columns of ClaimCTEs' u, that
// says in a claim's history entry whose expired lease it took over (NULL for
// a row no one held).
const TookOver = `CASE WHEN was = 'processing' THEN 'took over: the lease of ' || coalesce(was_owner, '(nobody)') ||
            ' expired at ' || coalesce(to_char(was_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS"Z"'), '(never set)') END`

// Lease says who claims letters and for how long.
type Lease struct {
	// Owner names the claimer in claimed_by and the history; two claimers
	// must never share one (see OwnerName).
	Owner string
	// Duration is how long a claim lasts unless renewed; 0 means the
	// caller's default.
	Duration time.Duration
}

// Millis is the lease's duration in milliseconds, at least 1, with def for
// a zero Duration: the $2 of ClaimCTEs.
func (l Lease) Millis(def time.Duration) int64 {
	if l.Duration <= 0 {
		return max(def.Milliseconds(), 1)
	}
	return max(l.Duration.Milliseconds(), 1)
}

// OwnerName is the lease owner of claimer id of kind ("replay", "auto
// retry", "reprocess by alice") run by this process: unique among claimers
// when id is (per process), and saying where to look.
func OwnerName(kind string, id int64) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s %d on %s (pid %d)", kind, id, host, os.Getpid())
}

// Policy decides what a letter whose attempt failed becomes.
type Policy struct {
	Budget int            // attempts after which it is dead; 0: never
	MaxAge time.Duration  // a letter that first failed longer ago than this is dead; 0: never
	Retry  backoff.Policy // the wait before it is due again: Retry.Delay(attempts so far)
}

// Failed returns the status, the wait before the next attempt (for
// RetryWait) and the history detail of a letter whose attempt failed with
// err: was is its status before the claim, attempts the attempts before this
// one, firstFailed its first failure, permanent whether err cannot pass by
// itself. A letter that was dead stays dead (an operator tried it), a
// permanent failure is dead at once, a spent budget or age limit is dead;
// anything else waits in RetryWait with full-jitter backoff.
func (p Policy) Failed(was string, attempts int, firstFailed time.Time, permanent bool, err error) (string, time.Duration, string) {
	n := attempts + 1
	switch {
	case was == Dead:
		return Dead, 0, err.Error()
	case permanent:
		return Dead, 0, fmt.Sprintf("permanent failure: %v", err)
	case p.Budget > 0 && n >= p.Budget:
		return Dead, 0, fmt.Sprintf("retry budget spent (%d attempts): %v", n, err)
	case p.MaxAge > 0 && time.Since(firstFailed) >= p.MaxAge:
		return Dead, 0, fmt.Sprintf("first failed more than %s ago, the retries' age limit: %v", p.MaxAge, err)
	}
	return RetryWait, p.Retry.Delay(n - 1), err.Error()
}
