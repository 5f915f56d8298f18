// Package poller is the design cdc-relay replaces, written fairly so the
// comparison means something: a batch poller over the outbox table.
//
// Each round is one transaction:
//
//	BEGIN;
//	SELECT id, aggregate_type, aggregate_id, event_type, payload::text,
//	       pg_xact_commit_timestamp(xmin)
//	  FROM outbox_events ORDER BY created_at, id LIMIT n FOR UPDATE SKIP LOCKED;
//	-- produce the batch with kafka-go's Writer (acks=all, murmur2), wait for the acks
//	DELETE FROM outbox_events WHERE id = ANY($1);
//	COMMIT;
//
// Published rows are deleted (not marked with UPDATE ... SET published_at): a
// delete writes less WAL than an update and keeps the table and its index
// small, the poller's best case. A round that finds rows starts the next one
// at once; an empty round sleeps the idle interval (100 ms by default) before
// polling again.
//
// The producer is configured like the relay's: the same client
// (segmentio/kafka-go), acks=all, the Java client's murmur2 partitioner, and a
// whole polled batch per produce call. commit_time is read with
// pg_xact_commit_timestamp (track_commit_timestamp=on) so the latency consumer
// measures both designs from the same instant.
package poller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// Config configures a poller.
type Config struct {
	URL     string   // the outbox database
	Brokers []string // Kafka bootstrap brokers
	// TopicPrefix is prepended to the aggregate type to name the topic, like
	// the relay's --topic '<prefix>{aggregate_type}'.
	TopicPrefix string
	BatchSize   int // rows per round; default 1000
	// BatchBytes bounds one produce batch, and so the largest event; default 1 MiB.
	BatchBytes int
	Idle       time.Duration // sleep after an empty round; default 100ms
	// Count stops the poller once it has published this many events; 0 runs
	// until ctx is done.
	Count int
}

// Stats count what a poller did.
type Stats struct {
	Events      int
	Rounds      int // rounds that found rows
	EmptyRounds int
}

const selectBatch = `SELECT id::text, aggregate_type, aggregate_id, event_type, payload::text,
       pg_xact_commit_timestamp(xmin)
  FROM public.outbox_events
 ORDER BY created_at, id
 LIMIT $1
   FOR UPDATE SKIP LOCKED`

const deleteBatch = `DELETE FROM public.outbox_events WHERE id = ANY($1::uuid[])`

// Run polls until ctx is done (returning nil) or cfg.Count events were
// published; reached, if not nil, is called at that moment.
func Run(ctx context.Context, cfg Config, reached func()) (Stats, error) {
	var st Stats
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 1000
	}
	if cfg.BatchBytes <= 0 {
		cfg.BatchBytes = 1 << 20
	}
	if cfg.Idle <= 0 {
		cfg.Idle = 100 * time.Millisecond
	}
	conn, err := pgx.Connect(ctx, cfg.URL)
	if err != nil {
		return st, fmt.Errorf("connect poller: %w", err)
	}
	defer conn.Close(context.Background())
	w := &kafka.Writer{
		Addr:         kafka.TCP(cfg.Brokers...),
		Balancer:     kafka.Murmur2Balancer{Consistent: true},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    cfg.BatchSize,
		BatchBytes:   int64(cfg.BatchBytes),
		// A batch is flushed when full or after BatchTimeout; a polled batch
		// is rarely a multiple of the partition count, so keep it short.
		BatchTimeout: time.Millisecond,
	}
	defer w.Close()

	msgs := make([]kafka.Message, 0, cfg.BatchSize)
	ids := make([]string, 0, cfg.BatchSize)
	for cfg.Count == 0 || st.Events < cfg.Count {
		n, err := round(ctx, conn, w, cfg, &msgs, &ids)
		if err != nil {
			if ctx.Err() != nil {
				return st, nil
			}
			return st, err
		}
		st.Events += n
		if n > 0 {
			st.Rounds++
			continue
		}
		st.EmptyRounds++
		select {
		case <-ctx.Done():
			return st, nil
		case <-time.After(cfg.Idle):
		}
	}
	if reached != nil {
		reached()
	}
	return st, nil
}

// round runs one poll-produce-delete transaction and returns how many events
// it published.
func round(ctx context.Context, conn *pgx.Conn, w *kafka.Writer, cfg Config, msgs *[]kafka.Message, ids *[]string) (int, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin poll: %w", err)
	}
	// After Commit this is a no-op; after a failure it releases the row locks
	// (the connection is closed anyway if that fails).
	defer func() { _ = tx.Rollback(context.Background()) }()
	rows, err := tx.Query(ctx, selectBatch, cfg.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("select batch: %w", err)
	}
	*msgs, *ids = (*msgs)[:0], (*ids)[:0]
	for rows.Next() {
		var id, aggType, aggID, evType, payload string
		var commit *time.Time
		if err := rows.Scan(&id, &aggType, &aggID, &evType, &payload, &commit); err != nil {
			rows.Close()
			return 0, fmt.Errorf("scan outbox row: %w", err)
		}
		headers := []kafka.Header{
			{Key: "id", Value: []byte(id)},
			{Key: "event_type", Value: []byte(evType)},
			{Key: "aggregate_type", Value: []byte(aggType)},
		}
		if commit != nil {
			headers = append(headers, kafka.Header{Key: "commit_time", Value: []byte(commit.UTC().Format(time.RFC3339Nano))})
		}
		*msgs = append(*msgs, kafka.Message{
			Topic:   cfg.TopicPrefix + aggType,
			Key:     []byte(aggID),
			Value:   []byte(payload),
			Headers: headers,
		})
		*ids = append(*ids, id)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("read batch: %w", err)
	}
	if len(*msgs) == 0 {
		return 0, tx.Commit(ctx)
	}
	if err := w.WriteMessages(ctx, *msgs...); err != nil {
		var werr kafka.WriteErrors
		if errors.As(err, &werr) {
			return 0, fmt.Errorf("produce batch of %d: %d failed: %w", len(*msgs), werr.Count(), err)
		}
		return 0, fmt.Errorf("produce batch of %d: %w", len(*msgs), err)
	}
	if _, err := tx.Exec(ctx, deleteBatch, *ids); err != nil {
		return 0, fmt.Errorf("delete published rows: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit poll: %w", err)
	}
	return len(*msgs), nil
}
