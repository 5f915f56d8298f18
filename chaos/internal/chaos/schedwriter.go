package chaos

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// messagePrefix is the prefix of the logical decoding messages the writers
// emit beside rows (--messages-prefix).
const messagePrefix = "chaos"

// Where a schedule's writers write: two plain outbox tables, a partitioned
// one (a partition per bucket) and messages.
const (
	tableMain = "outbox_events"
	tableB    = "outbox_b"
	tableP    = "outbox_p"
	whereMsg  = "message"
)

// liveState is what the writers write to now. Writers hold mu's read lock
// for a whole transaction, so an operation that takes the write lock to
// change it knows no transaction of the old state is still open once it
// has the lock.
type liveState struct {
	mu       sync.RWMutex
	bMember  bool  // outbox_b is written (it is in the relay's --table list)
	buckets  []int // attached partitions of outbox_p written to
	messages bool
	step     int // the schedule step running
	pad      atomic.Int64
}

// partitionName is the partition of outbox_p holding bucket.
func partitionName(bucket int) string { return fmt.Sprintf("%s_%d", tableP, bucket) }

// schedWriter commits transactions mixing rows of every table written now
// and messages; its aggregates (keys) are its own, so the commit order of
// its transactions is each key's order. It records every event in the
// ledger: committed, or rolled back on purpose (whole transactions and
// savepoints), or, after an error, as the marker row of its transaction
// says once looked up.
type schedWriter struct {
	id   int
	url  string
	aggs int
	rng  *mrand.Rand
	st   *liveState
	led  *ledger
	next map[string]int

	txns, rollbacks, uncertain, reconnects atomic.Int64
	// waits are how long each transaction's INSERTs and COMMIT took, from
	// BEGIN to the answer (an error's too), with the step it ran in; read
	// once run returned.
	waits []writerWait
}

// writerWait is how long one transaction of a writer waited.
type writerWait struct {
	took time.Duration
	step int
}

// writerTxn is one transaction's plan.
type writerTxn struct {
	marker     string
	evs        []ledgerEvent // committed with the transaction
	savepoint  []ledgerEvent // inserted in a savepoint rolled back
	rollback   bool          // the whole transaction rolls back
	payloadPad string
}

// plan draws the next transaction over what st allows now. The caller holds
// st.mu's read lock.
func (w *schedWriter) plan() writerTxn {
	type target struct {
		where  string
		bucket int
	}
	where := []target{{where: tableMain}}
	if w.st.bMember {
		where = append(where, target{where: tableB})
	}
	for _, b := range w.st.buckets {
		where = append(where, target{partitionName(b), b})
	}
	if w.st.messages {
		where = append(where, target{where: whereMsg}, target{where: whereMsg})
	}
	t := writerTxn{marker: newUUIDv4(), rollback: w.rng.Float64() < 0.04}
	if pad := w.st.pad.Load(); pad > 0 {
		t.payloadPad = strings.Repeat("x", int(pad))
	}
	draw := func(n int) []ledgerEvent {
		evs := make([]ledgerEvent, n)
		for i := range evs {
			tg := where[w.rng.IntN(len(where))]
			// Rows of the main table and messages share aggregates: their
			// order holds across both. Other tables are other sequences.
			group := "a"
			switch {
			case tg.where == tableB:
				group = "b"
			case tg.bucket != 0:
				group = "p"
			}
			key := fmt.Sprintf("w%d-%s%d", w.id, group, w.rng.IntN(w.aggs))
			w.next[key]++
			evs[i] = ledgerEvent{ID: newUUIDv4(), Key: key, Seq: w.next[key], Where: tg.where, bucket: tg.bucket, Step: w.st.step}
		}
		return evs
	}
	t.evs = draw(1 + w.rng.IntN(6))
	if !t.rollback && w.rng.Float64() < 0.08 {
		t.savepoint = draw(1 + w.rng.IntN(2))
	}
	return t
}

// queueEvents adds the statements writing evs to b.
func queueEvents(b *pgx.Batch, evs []ledgerEvent, pad string) {
	for _, e := range evs {
		payload := fmt.Sprintf(`{"agg":%q,"seq":%d}`, e.Key, e.Seq)
		if pad != "" {
			payload = fmt.Sprintf(`{"agg":%q,"seq":%d,"pad":%q}`, e.Key, e.Seq, pad)
		}
		switch {
		case e.Where == whereMsg:
			env, _ := json.Marshal(map[string]any{ // strings and raw JSON: cannot fail
				"id": e.ID, "aggregate_type": "chaos", "aggregate_id": e.Key, "event_type": "Numbered",
				"payload": json.RawMessage(payload),
			})
			b.Queue("SELECT pg_logical_emit_message(true, $1, $2::text)", messagePrefix, string(env))
		case e.bucket != 0:
			b.Queue("INSERT INTO public."+tableP+" (id, aggregate_type, aggregate_id, event_type, payload, bucket) VALUES ($1, 'chaos', $2, 'Numbered', $3, $4)",
				e.ID, e.Key, payload, e.bucket)
		default:
			b.Queue("INSERT INTO public."+e.Where+" (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, 'chaos', $2, 'Numbered', $3)",
				e.ID, e.Key, payload)
		}
	}
}

// exec runs t on conn.
func (w *schedWriter) exec(ctx context.Context, conn *pgx.Conn, t writerTxn) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	b := &pgx.Batch{}
	b.Queue("INSERT INTO public.chaos_txns (txid) VALUES ($1)", t.marker)
	queueEvents(b, t.evs, t.payloadPad)
	if len(t.savepoint) > 0 {
		b.Queue("SAVEPOINT chaos")
		queueEvents(b, t.savepoint, t.payloadPad)
		b.Queue("ROLLBACK TO SAVEPOINT chaos")
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if t.rollback {
		return tx.Rollback(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// run commits transactions at about rate events a second until stop closes
// or ctx is done; it rides out lost connections (Postgres restarts).
func (w *schedWriter) run(ctx context.Context, stop <-chan struct{}, rate float64) error {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	next := time.Now()
	for failures := 0; ; {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if conn == nil {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			c, err := pgx.Connect(cctx, w.url)
			cancel()
			if err != nil {
				failures++
				if failures > 200 {
					return fmt.Errorf("writer %d: connect: %w", w.id, err)
				}
				if err := sleep(ctx, time.Duration(min(failures, 10))*50*time.Millisecond); err != nil {
					return err
				}
				continue
			}
			if failures > 0 {
				w.reconnects.Add(1)
			}
			conn, failures = c, 0
		}
		w.st.mu.RLock()
		t := w.plan()
		began := time.Now()
		err := w.exec(ctx, conn, t)
		w.waits = append(w.waits, writerWait{took: time.Since(began), step: w.st.step})
		if err != nil {
			conn.Close(context.WithoutCancel(ctx))
			conn = nil
			committed, rerr := w.resolve(ctx, t.marker)
			if rerr != nil {
				w.st.mu.RUnlock()
				return fmt.Errorf("writer %d: after %v: %w", w.id, err, rerr)
			}
			w.uncertain.Add(1)
			t.rollback = !committed
		}
		if t.rollback {
			w.led.abort(slices.Concat(t.evs, t.savepoint))
			w.rollbacks.Add(1)
		} else {
			w.led.commit(t.evs, t.savepoint)
			w.txns.Add(1)
		}
		w.st.mu.RUnlock()
		next = next.Add(time.Duration(float64(len(t.evs)) / rate * float64(time.Second)))
		if d := time.Until(next); d < -time.Second {
			next = time.Now()
		} else if d > 0 {
			select {
			case <-stop:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
	}
}

// resolve looks up whether the transaction with marker committed, on new
// connections, until it gets an answer or ctx is done.
func (w *schedWriter) resolve(ctx context.Context, marker string) (bool, error) {
	var last error
	for attempt := 1; ; attempt++ {
		committed, err := func() (bool, error) {
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			conn, err := pgx.Connect(qctx, w.url)
			if err != nil {
				return false, err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			var n int
			err = conn.QueryRow(qctx, "SELECT count(*) FROM public.chaos_txns WHERE txid = $1", marker).Scan(&n)
			return n == 1, err
		}()
		if err == nil {
			return committed, nil
		}
		last = err
		if err := sleep(ctx, time.Duration(min(attempt, 10))*100*time.Millisecond); err != nil {
			return false, fmt.Errorf("look up whether transaction %s committed: %w (last error: %w)", marker, err, last)
		}
	}
}

// newUUIDv4 returns a random UUID.
func newUUIDv4() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
