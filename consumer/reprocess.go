package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Outcomes of Reprocess for one dead letter.
const (
	// Reprocessed: the handler ran and its transaction committed; the dead
	// letter's status is now StatusReprocessed.
	Reprocessed = "reprocessed"
	// ReprocessFailed: the handler failed again; nothing changed but the
	// dead letter's last_failed_at, error_message (the new error; error_code
	// keeps the original failure's) and reprocess_attempts.
	ReprocessFailed = "failed"
	// ReprocessSkipped: the dead letter was reprocessed before.
	ReprocessSkipped = "skipped"
	// ReprocessNotFound: no dead letter of this consumer has the id.
	ReprocessNotFound = "not_found"
)

// ReprocessResult is what Reprocess did with one dead letter.
type ReprocessResult struct {
	ID        int64  // the dead letter's id (consumer_dead_letters.id)
	MessageID string // its message_id; "" when not found
	Outcome   string // Reprocessed, ReprocessFailed, ReprocessSkipped or ReprocessNotFound
	Err       error  // the handler's error, for ReprocessFailed
}

// Reprocess is the operator's way back for dead letters, once the cause is
// fixed: for each dead letter of cfg.Name with one of ids, in its own
// transaction, it locks the row (so two operators cannot run one letter
// twice), refreshes the message's claim in processed_messages, calls handler
// with the message rebuilt from the row, and marks the letter reprocessed by
// actor. A handler error rolls that back and records the failure on the
// letter; the letter stays dead. Reprocess makes one attempt per letter and
// does not classify errors: the operator decides what to try again.
//
// It uses cfg's Name, Pool, DeadLetterTable and Logger only. The returned
// error is a failure of the database, after which the remaining ids were not
// tried; per-letter outcomes are in the results.
func Reprocess(ctx context.Context, cfg Config, handler Handler, actor string, ids ...int64) ([]ReprocessResult, error) {
	if handler == nil {
		return nil, errors.New("consumer: handler is nil")
	}
	if problems := cfg.validateStore(); len(problems) > 0 {
		return nil, fmt.Errorf("consumer config: %s", problems[0])
	}
	t, _ := newTables(cfg.DeadLetterTable)
	log := cfg.Logger.With().Str("component", "consumer").Str("consumer", cfg.Name).Logger()
	var results []ReprocessResult
	for _, id := range ids {
		res, err := t.reprocessOne(ctx, cfg, handler, actor, id)
		if err != nil {
			return results, err
		}
		ev := log.Info()
		if res.Err != nil {
			ev = log.Warn().Err(res.Err)
		}
		ev.Int64("dead_letter", id).Str("message_id", res.MessageID).Str("outcome", res.Outcome).Str("actor", actor).Msg("reprocess")
		results = append(results, res)
	}
	return results, nil
}

// reprocessOne reprocesses dead letter id.
func (t tables) reprocessOne(ctx context.Context, cfg Config, handler Handler, actor string, id int64) (ReprocessResult, error) {
	res := ReprocessResult{ID: id}
	tx, err := cfg.Pool.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("reprocess dead letter %d: begin transaction: %w", id, err)
	}
	defer rollback(tx)
	var (
		msg     Message
		headers []byte
		msgTime *time.Time
		status  string
	)
	err = tx.QueryRow(ctx, `SELECT message_id, topic, kafka_partition, kafka_offset, message_key, payload, headers, message_time, status
FROM `+t.deadLetters+` WHERE id = $1 AND consumer_name = $2 FOR UPDATE`, id, cfg.Name).Scan(
		&res.MessageID, &msg.Topic, &msg.Partition, &msg.Offset, &msg.Key, &msg.Value, &headers, &msgTime, &status)
	if errors.Is(err, pgx.ErrNoRows) {
		res.Outcome = ReprocessNotFound
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("reprocess dead letter %d: read it from %s: %w", id, t.dlName, err)
	}
	if status != StatusDead {
		res.Outcome = ReprocessSkipped
		return res, nil
	}
	if err := json.Unmarshal(headers, &msg.Headers); err != nil {
		return res, fmt.Errorf("reprocess dead letter %d: decode its headers: %w", id, err)
	}
	msg.ID = msg.Headers[HeaderID]
	if msgTime != nil {
		msg.Timestamp = *msgTime
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+t.processed+` (consumer_name, message_id) VALUES ($1, $2)
ON CONFLICT (consumer_name, message_id) DO UPDATE SET processed_at = now()`, cfg.Name, res.MessageID); err != nil {
		return res, fmt.Errorf("reprocess dead letter %d: claim message %q: %w", id, res.MessageID, err)
	}
	if herr := callHandler(ctx, handler, tx, msg); herr != nil {
		rollback(tx)
		res.Outcome, res.Err = ReprocessFailed, herr
		_, err := cfg.Pool.Exec(ctx, `UPDATE `+t.deadLetters+` SET reprocess_attempts = reprocess_attempts + 1,
    last_failed_at = now(), error_message = $2, reprocessed_by = $3 WHERE id = $1`,
			id, pgText("reprocess: "+herr.Error()), pgText(actor))
		if err != nil {
			return res, fmt.Errorf("reprocess dead letter %d: record its failure: %w", id, err)
		}
		return res, nil
	}
	if _, err := tx.Exec(ctx, `UPDATE `+t.deadLetters+` SET status = 'reprocessed', reprocessed_at = now(),
    reprocessed_by = $2, reprocess_attempts = reprocess_attempts + 1 WHERE id = $1`, id, pgText(actor)); err != nil {
		return res, fmt.Errorf("reprocess dead letter %d: mark it reprocessed: %w", id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("reprocess dead letter %d: commit: %w", id, err)
	}
	res.Outcome = Reprocessed
	return res, nil
}
