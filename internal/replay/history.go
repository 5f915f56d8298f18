// Package replay publishes events to Kafka again, outside the relay's stream,
// and keeps the history of every such replay: dead letters (package
// deadletter: dlq replay and the automatic retries) and rows still in the
// outbox table (package outboxtable: cdc-relay replay, the backfill after a
// lost slot, the initial snapshot).
//
// A Run batches, rate-limits and publishes the events a replay selected and
// records the result of each in the history tables, which live beside the
// dead-letter table they are named after (<table>_replays,
// <table>_replay_events: deadletter.TableDDL creates them). When the events
// are claimed rows (dead letters), the Claims the run is given end those
// claims in the transaction that records their results, so the history and
// the rows agree.
package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// HeaderReplay is the header a replay adds to every message it publishes: the
// replay's id in the history, so consumers and operators can tell a replay from
// the original delivery.
const HeaderReplay = "cdc_relay_replay"

// HeaderBackfill marks events republished from the outbox table after the
// replication slot was lost (delivery.on_slot_loss backfill); its value
// is the kind of loss: slot_missing, slot_lost or slot_ahead. Such events also
// carry HeaderReplay, and may repeat events consumers already have.
const HeaderBackfill = "cdc_relay_backfill"

// HeaderSnapshot marks events published from the snapshot the relay exported
// when it created its slot (delivery.snapshot initial); its value is
// "initial". Such events also carry HeaderReplay and no source position, and
// may be sent again if the relay stops before the snapshot completes.
const HeaderSnapshot = "cdc_relay_snapshot"

// Replay kinds.
const (
	KindDLQ    = "dlq"    // dead letters published again
	KindOutbox = "outbox" // outbox rows published again
)

// Results of one event in a replay.
const (
	ResultPublished = "published" // acknowledged by Kafka
	ResultSkipped   = "skipped"   // already replayed, and the replay was not forced
	ResultFailed    = "failed"    // not acknowledged; the error says why
	ResultDryRun    = "dry_run"   // would have been published
)

// Counts are the totals of a replay.
type Counts struct {
	Selected  int // events the filters selected
	Published int
	Skipped   int
	Failed    int
}

// Entry is one replay in the history.
type Entry struct {
	ID         int64
	Kind       string // KindDLQ or KindOutbox
	Actor      string // who ran it
	StartedAt  time.Time
	FinishedAt *time.Time     // nil while it runs, or when it was killed
	Filters    map[string]any // what selected the events
	DryRun     bool
	Forced     bool
	RatePerSec float64 // 0 = unlimited
	// TopicOverride is the topic every letter was published to instead of
	// its own ("" = each to its own).
	TopicOverride string
	Counts
}

// Event is the result of one event in a replay.
type Event struct {
	EventID      string
	DeadLetterID int64  // 0 for outbox replays
	Result       string // ResultPublished, ResultSkipped, ResultFailed or ResultDryRun
	Error        string // why it failed
	At           time.Time
}

// History reads and writes the replay history tables. It is safe for
// concurrent use.
type History struct {
	pool            *pgxpool.Pool
	replays, events string // quoted table names
	wrap            func(err error, what string) error
}

// NewHistory returns the history kept in the tables replays and events
// (quoted names) through pool, which the caller keeps owning. wrap adds what
// failed to an error, and how to create the tables when they are missing (the
// owner of the tables knows: deadletter.Store.History).
func NewHistory(pool *pgxpool.Pool, replays, events string, wrap func(err error, what string) error) *History {
	return &History{pool: pool, replays: replays, events: events, wrap: wrap}
}

func (h *History) wrapf(err error, format string, args ...any) error {
	return h.wrap(err, fmt.Sprintf(format, args...))
}

// Start records the start of e (its ID, StartedAt, FinishedAt and Counts
// are ignored) and returns its id.
func (h *History) Start(ctx context.Context, e Entry) (int64, error) {
	filters := e.Filters
	if filters == nil {
		filters = map[string]any{}
	}
	f, err := json.Marshal(filters)
	if err != nil {
		return 0, fmt.Errorf("start replay: encode filters: %w", err)
	}
	var id int64
	err = h.pool.QueryRow(ctx, `INSERT INTO `+h.replays+` (kind, actor, filters, dry_run, forced, rate_per_sec, topic_override)
VALUES ($1, $2, $3::jsonb, $4, $5, $6, nullif($7, '')) RETURNING id`, e.Kind, e.Actor, string(f), e.DryRun, e.Forced, e.RatePerSec,
		e.TopicOverride).Scan(&id)
	if err != nil {
		return 0, h.wrapf(err, "start %s replay", e.Kind)
	}
	return id, nil
}

// RecordEvent records the result of one event of replay replayID.
func (h *History) RecordEvent(ctx context.Context, replayID int64, e Event) error {
	return h.record(ctx, replayID, []Event{e}, nil, nil)
}

// RecordEvents records the results of events of replay replayID in one
// statement.
func (h *History) RecordEvents(ctx context.Context, replayID int64, events []Event) error {
	return h.record(ctx, replayID, events, nil, nil)
}

// record stores results, ends claims (claims, when set, with their
// transitions) and updates the replay's totals (counts, when set) in one
// transaction, so the history and the claimed rows agree, and the history of
// a replay that is killed says what it did.
func (h *History) record(ctx context.Context, replayID int64, events []Event, counts *Counts, claims Claims) error {
	if len(events) == 0 && counts == nil && claims == nil {
		return nil
	}
	ids := make([]string, len(events))
	letters := make([]int64, len(events))
	results := make([]string, len(events))
	errs := make([]string, len(events))
	at := make([]time.Time, len(events))
	now := time.Now()
	for i, e := range events {
		ids[i], letters[i], results[i], errs[i], at[i] = e.EventID, e.DeadLetterID, e.Result, e.Error, e.At
		if e.At.IsZero() {
			at[i] = now
		}
	}
	err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		if claims != nil {
			if err := claims.Settle(ctx, tx); err != nil {
				return err
			}
		}
		if len(events) > 0 {
			// COPY: a table replay records a row per event, and COPY costs
			// Postgres about half what INSERT … unnest did per row.
			if _, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(copyText(replayID, ids, letters, results, errs, at)),
				`COPY `+h.events+` (replay_id, event_id, dead_letter_id, result, error, at) FROM STDIN`); err != nil {
				return err
			}
		}
		if c := counts; c != nil {
			if _, err := tx.Exec(ctx, `UPDATE `+h.replays+` SET selected = $2, published = $3, skipped = $4, failed = $5
WHERE id = $1`, replayID, c.Selected, c.Published, c.Skipped, c.Failed); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return h.wrapf(err, "record %d results of replay %d", len(events), replayID)
	}
	if claims != nil {
		claims.Settled()
	}
	return nil
}

// Finish records the end of replay id with its totals.
func (h *History) Finish(ctx context.Context, id int64, c Counts) error {
	tag, err := h.pool.Exec(ctx, `UPDATE `+h.replays+` SET finished_at = now(),
    selected = $2, published = $3, skipped = $4, failed = $5 WHERE id = $1`,
		id, c.Selected, c.Published, c.Skipped, c.Failed)
	if err != nil {
		return h.wrapf(err, "finish replay %d", id)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("finish replay %d in %s: no such replay", id, h.replays)
	}
	return nil
}

// Total is how many events the replays of one kind, in the whole history,
// ended with one result.
type Total struct {
	Kind   string // KindDLQ or KindOutbox
	Result string // ResultPublished, ResultSkipped or ResultFailed
	Events int64
}

// Totals sums the history by kind and result (dry runs publish nothing and
// are left out), a row for every kind and result even when zero. The sums
// only grow while the history is kept, so a monitoring system can take their
// rate like a counter's.
func (h *History) Totals(ctx context.Context) ([]Total, error) {
	var out []Total
	for _, kind := range []string{KindDLQ, KindOutbox} {
		var published, skipped, failed int64
		if err := h.pool.QueryRow(ctx, `SELECT coalesce(sum(published), 0), coalesce(sum(skipped), 0), coalesce(sum(failed), 0)
FROM `+h.replays+` WHERE kind = $1 AND NOT dry_run`, kind).Scan(&published, &skipped, &failed); err != nil {
			return nil, h.wrapf(err, "sum the replay history")
		}
		out = append(out, Total{kind, ResultPublished, published}, Total{kind, ResultSkipped, skipped},
			Total{kind, ResultFailed, failed})
	}
	return out, nil
}

// List returns the newest limit replays (0 = all), newest first.
func (h *History) List(ctx context.Context, limit int) ([]Entry, error) {
	q := `SELECT id, kind, actor, started_at, finished_at, filters, dry_run, forced, rate_per_sec,
    selected, published, skipped, failed, coalesce(topic_override, '') FROM ` + h.replays + ` ORDER BY id DESC`
	if limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", limit)
	}
	rows, err := h.pool.Query(ctx, q)
	if err != nil {
		return nil, h.wrapf(err, "list replays")
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Entry, error) {
		var x Entry
		err := r.Scan(&x.ID, &x.Kind, &x.Actor, &x.StartedAt, &x.FinishedAt, &x.Filters, &x.DryRun, &x.Forced,
			&x.RatePerSec, &x.Selected, &x.Published, &x.Skipped, &x.Failed, &x.TopicOverride)
		return x, err
	})
	if err != nil {
		return nil, h.wrapf(err, "list replays")
	}
	return out, nil
}

// Events returns the recorded results of replay replayID in the order they
// were recorded.
func (h *History) Events(ctx context.Context, replayID int64) ([]Event, error) {
	rows, err := h.pool.Query(ctx, `SELECT event_id, coalesce(dead_letter_id, 0), result, coalesce(error, ''), at
FROM `+h.events+` WHERE replay_id = $1 ORDER BY id`, replayID)
	if err != nil {
		return nil, h.wrapf(err, "list results of replay %d", replayID)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.EventID, &e.DeadLetterID, &e.Result, &e.Error, &e.At)
		return e, err
	})
	if err != nil {
		return nil, h.wrapf(err, "list results of replay %d", replayID)
	}
	return out, nil
}

// copyText returns the rows of the events table in COPY's text format.
func copyText(replayID int64, ids []string, letters []int64, results, errs []string, at []time.Time) []byte {
	var b []byte
	for i := range ids {
		b = strconv.AppendInt(b, replayID, 10)
		b = append(b, '\t')
		b = appendCopyField(b, ids[i])
		b = append(b, '\t')
		if letters[i] == 0 {
			b = append(b, `\N`...)
		} else {
			b = strconv.AppendInt(b, letters[i], 10)
		}
		b = append(b, '\t')
		b = appendCopyField(b, results[i])
		b = append(b, '\t')
		if errs[i] == "" {
			b = append(b, `\N`...)
		} else {
			b = appendCopyField(b, errs[i])
		}
		b = append(b, '\t')
		b = at[i].UTC().AppendFormat(b, "2006-01-02 15:04:05.999999+00")
		b = append(b, '\n')
	}
	return b
}

// appendCopyField appends s escaped for COPY's text format: backslash,
// and the delimiters tab, newline and carriage return.
func appendCopyField(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b = append(b, '\\', '\\')
		case '\t':
			b = append(b, '\\', 't')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			b = append(b, c)
		}
	}
	return b
}
