package deadletter

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

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

// Replay is one entry of the replay history.
type Replay struct {
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

// ReplayEvent is the result of one event in a replay.
type ReplayEvent struct {
	EventID      string
	DeadLetterID int64  // 0 for outbox replays
	Result       string // ResultPublished, ResultSkipped, ResultFailed or ResultDryRun
	Error        string // why it failed
	At           time.Time
}

// StartReplay records the start of r (its ID, StartedAt, FinishedAt and Counts
// are ignored) and returns its id.
func (s *Store) StartReplay(ctx context.Context, r Replay) (int64, error) {
	filters := r.Filters
	if filters == nil {
		filters = map[string]any{}
	}
	f, err := json.Marshal(filters)
	if err != nil {
		return 0, fmt.Errorf("start replay: encode filters: %w", err)
	}
	var id int64
	err = s.pool.QueryRow(ctx, `INSERT INTO `+s.n.replays+` (kind, actor, filters, dry_run, forced, rate_per_sec, topic_override)
VALUES ($1, $2, $3::jsonb, $4, $5, $6, nullif($7, '')) RETURNING id`, r.Kind, r.Actor, string(f), r.DryRun, r.Forced, r.RatePerSec,
		r.TopicOverride).Scan(&id)
	if err != nil {
		return 0, s.wrap(err, "start %s replay", r.Kind)
	}
	return id, nil
}

// RecordReplayEvent records the result of one event of replay replayID.
func (s *Store) RecordReplayEvent(ctx context.Context, replayID int64, e ReplayEvent) error {
	return s.record(ctx, replayID, batchRecord{events: []ReplayEvent{e}})
}

// RecordReplayEvents records the results of events of replay replayID in one
// statement.
func (s *Store) RecordReplayEvents(ctx context.Context, replayID int64, events []ReplayEvent) error {
	return s.record(ctx, replayID, batchRecord{events: events})
}

// batchRecord is what one transaction of a replay records.
type batchRecord struct {
	events []ReplayEvent // results
	lease  Lease         // the replay's, for settle
	settle []settlement  // claims ended
	counts *Counts       // when set, the replay's totals so far
}

// record stores results, ends claims (with their transitions) and updates the
// replay's totals in one transaction, so the history and the letters' status
// agree, and the history of a replay that is killed says what it did.
func (s *Store) record(ctx context.Context, replayID int64, b batchRecord) error {
	if len(b.events) == 0 && len(b.settle) == 0 && b.counts == nil {
		return nil
	}
	events := b.events
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
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if len(b.settle) > 0 {
			// Lock in id order first: two replays ending claims on the same
			// letters (one took over the other's expired lease) then wait for
			// each other instead of deadlocking.
			ids := make([]int64, len(b.settle))
			for i, x := range b.settle {
				ids[i] = x.id
			}
			if _, err := tx.Exec(ctx, `SELECT 1 FROM `+s.n.letters+` WHERE id = ANY($1) ORDER BY id FOR UPDATE`, ids); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, s.settleSQL(), settleArgs(b.lease, b.settle)...); err != nil {
				return err
			}
		}
		if len(events) > 0 {
			if _, err := tx.Exec(ctx, `INSERT INTO `+s.n.events+` (replay_id, event_id, dead_letter_id, result, error, at)
SELECT $1, e, nullif(d, 0), r, nullif(x, ''), a
FROM unnest($2::text[], $3::bigint[], $4::text[], $5::text[], $6::timestamptz[]) AS u(e, d, r, x, a)`,
				replayID, ids, letters, results, errs, at); err != nil {
				return err
			}
		}
		if c := b.counts; c != nil {
			if _, err := tx.Exec(ctx, `UPDATE `+s.n.replays+` SET selected = $2, published = $3, skipped = $4, failed = $5
WHERE id = $1`, replayID, c.Selected, c.Published, c.Skipped, c.Failed); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return s.wrap(err, "record %d results of replay %d", len(events), replayID)
	}
	return nil
}

// FinishReplay records the end of replay id with its totals.
func (s *Store) FinishReplay(ctx context.Context, id int64, c Counts) error {
	tag, err := s.pool.Exec(ctx, `UPDATE `+s.n.replays+` SET finished_at = now(),
    selected = $2, published = $3, skipped = $4, failed = $5 WHERE id = $1`,
		id, c.Selected, c.Published, c.Skipped, c.Failed)
	if err != nil {
		return s.wrap(err, "finish replay %d", id)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("finish replay %d in %s: no such replay", id, s.n.name)
	}
	return nil
}

// ReplayTotal is how many events the replays of one kind, in the whole
// history, ended with one result.
type ReplayTotal struct {
	Kind   string // KindDLQ or KindOutbox
	Result string // ResultPublished, ResultSkipped or ResultFailed
	Events int64
}

// ReplayTotals sums the replay history by kind and result (dry runs
// publish nothing and are left out), a row for every kind and result even
// when zero. The sums only grow while the history is kept, so a monitoring
// system can take their rate like a counter's.
func (s *Store) ReplayTotals(ctx context.Context) ([]ReplayTotal, error) {
	var out []ReplayTotal
	for _, kind := range []string{KindDLQ, KindOutbox} {
		var published, skipped, failed int64
		if err := s.pool.QueryRow(ctx, `SELECT coalesce(sum(published), 0), coalesce(sum(skipped), 0), coalesce(sum(failed), 0)
FROM `+s.n.replays+` WHERE kind = $1 AND NOT dry_run`, kind).Scan(&published, &skipped, &failed); err != nil {
			return nil, s.wrap(err, "sum the replay history")
		}
		out = append(out, ReplayTotal{kind, ResultPublished, published}, ReplayTotal{kind, ResultSkipped, skipped},
			ReplayTotal{kind, ResultFailed, failed})
	}
	return out, nil
}

// ListReplays returns the newest limit replays (0 = all), newest first.
func (s *Store) ListReplays(ctx context.Context, limit int) ([]Replay, error) {
	q := `SELECT id, kind, actor, started_at, finished_at, filters, dry_run, forced, rate_per_sec,
    selected, published, skipped, failed, coalesce(topic_override, '') FROM ` + s.n.replays + ` ORDER BY id DESC`
	if limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", limit)
	}
	rows, err := s.pool.Query(ctx, q)
	if err != nil {
		return nil, s.wrap(err, "list replays")
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Replay, error) {
		var x Replay
		err := r.Scan(&x.ID, &x.Kind, &x.Actor, &x.StartedAt, &x.FinishedAt, &x.Filters, &x.DryRun, &x.Forced,
			&x.RatePerSec, &x.Selected, &x.Published, &x.Skipped, &x.Failed, &x.TopicOverride)
		return x, err
	})
	if err != nil {
		return nil, s.wrap(err, "list replays")
	}
	return out, nil
}

// ListReplayEvents returns the recorded results of replay replayID in the order
// they were recorded.
func (s *Store) ListReplayEvents(ctx context.Context, replayID int64) ([]ReplayEvent, error) {
	rows, err := s.pool.Query(ctx, `SELECT event_id, coalesce(dead_letter_id, 0), result, coalesce(error, ''), at
FROM `+s.n.events+` WHERE replay_id = $1 ORDER BY id`, replayID)
	if err != nil {
		return nil, s.wrap(err, "list results of replay %d", replayID)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ReplayEvent, error) {
		var e ReplayEvent
		err := r.Scan(&e.EventID, &e.DeadLetterID, &e.Result, &e.Error, &e.At)
		return e, err
	})
	if err != nil {
		return nil, s.wrap(err, "list results of replay %d", replayID)
	}
	return out, nil
}
