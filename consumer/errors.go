package consumer

import (
	"context"
	"errors"
	"io"
	"net"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Dead-letter error codes the consumer itself assigns. A handler adds its own
// with WithCode.
const (
	// CodeMissingID: the record has no "id" header, so it cannot be
	// deduplicated; it is dead-lettered without calling the handler.
	CodeMissingID = "missing_id"
	// CodeRetriesExhausted: transient failures used up the retry budget
	// (RetryPolicy.MaxAttempts or MaxTotal); the message keeps the last error.
	CodeRetriesExhausted = "retries_exhausted"
	// CodePermanent: a permanent failure without a more specific code.
	CodePermanent = "permanent"
	// CodeHandlerPanic: the handler panicked. The panic becomes an error that
	// is retried like a transient one (a panic is not proof the message is
	// bad); a message that still panics after the budget is dead-lettered
	// with this code and the panic value and stack in the error message.
	CodeHandlerPanic = "handler_panic"
)

// kind is what a marker says about an error.
type kind int

const (
	kindTransient kind = iota + 1
	kindPermanent
)

// marked is an error a handler marked with Permanent, Transient or WithCode.
type marked struct {
	err  error
	kind kind   // 0: not marked, classify err
	code string // "": none
}

func (m *marked) Error() string { return m.err.Error() }
func (m *marked) Unwrap() error { return m.err }

// Permanent marks err as permanent: retrying cannot help (the payload is
// invalid, a business rule refuses it). The consumer does not retry it; it
// stores the message in the dead-letter table and moves on. Permanent(nil) is
// nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &marked{err: err, kind: kindPermanent}
}

// Transient marks err as transient: the same message may succeed later (a
// dependency is down, a lock timed out). The consumer retries it within the
// RetryPolicy and dead-letters it with CodeRetriesExhausted when the budget is
// used up. Transient(nil) is nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &marked{err: err, kind: kindTransient}
}

// codePattern is what a dead-letter error code may look like: short, stable,
// lower snake case, usable as a Prometheus label value.
var codePattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// WithCode attaches a short stable code to err, e.g. "invalid_payload". It is
// stored as the dead letter's error_code and is the code label of
// cdc_relay_consumer_dead_letters_total, so keep the set of codes small. It
// does not change how err is classified: combine it with Permanent or
// Transient for that. A code that is not lower snake case (at most 63
// characters) is replaced by "permanent" or "retries_exhausted" as usual.
// WithCode(code, nil) is nil.
func WithCode(code string, err error) error {
	if err == nil {
		return nil
	}
	return &marked{err: err, code: code}
}

// IsPermanent is the consumer's one classifier: it reports whether err is
// permanent, so retrying the message is pointless. Everything else is retried
// as transient, including errors it does not know (the safe side: a message is
// dead-lettered only after the retry budget, never on a guess).
//
// In order:
//   - a mark from Permanent or Transient decides (the outermost mark in the
//     chain wins);
//   - context deadlines, network errors, dropped connections and Postgres
//     connection failures are transient;
//   - Postgres errors by SQLSTATE: class 22 (invalid data, e.g. 22P02 invalid
//     text representation) and class 23 (constraint violations, e.g. 23505
//     unique, 23503 foreign key) are permanent; class 40 (40001 serialization
//     failure, 40P01 deadlock), 08 (connection), 53 (insufficient resources),
//     55P03 (lock not available), 57014 (query canceled, e.g. a statement
//     timeout) and 57P01-57P05 (server shutting down) are transient;
//   - anything else is transient.
func IsPermanent(err error) bool {
	return classify(err) == kindPermanent
}

func classify(err error) kind {
	if err == nil {
		return 0
	}
	var m *marked
	for e := err; errors.As(e, &m); e = m.err {
		if m.kind != 0 {
			return m.kind
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return kindTransient
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return classifySQLState(pgErr.Code)
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connErr), errors.As(err, &netErr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		pgconn.Timeout(err), pgconn.SafeToRetry(err):
		return kindTransient
	}
	return kindTransient // unknown: retried, see IsPermanent
}

// classifySQLState classifies a Postgres error by its SQLSTATE.
func classifySQLState(code string) kind {
	switch {
	case strings.HasPrefix(code, "22"), strings.HasPrefix(code, "23"):
		return kindPermanent
	case strings.HasPrefix(code, "40"), strings.HasPrefix(code, "08"), strings.HasPrefix(code, "53"),
		code == "55P03", code == "57014", strings.HasPrefix(code, "57P"):
		return kindTransient
	}
	return kindTransient
}

// errorCode returns the dead-letter code of err, which failed permanently
// (exhausted false) or used up the retry budget (exhausted true): the code
// from WithCode if there is one, then for a permanent Postgres error
// "sqlstate_<code>", otherwise CodePermanent or CodeRetriesExhausted.
func errorCode(err error, exhausted bool) string {
	var m *marked
	for e := err; errors.As(e, &m); e = m.err {
		if m.code != "" && codePattern.MatchString(m.code) {
			return m.code
		}
	}
	if exhausted {
		return CodeRetriesExhausted
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && codePattern.MatchString("sqlstate_"+strings.ToLower(pgErr.Code)) {
		return "sqlstate_" + strings.ToLower(pgErr.Code)
	}
	return CodePermanent
}
