package main

// End-to-end tests of the table-less outbox (issue 31, test 2): the built
// binary with --messages-prefix publishes transactional logical decoding
// messages written by migrations/007_outbox_emit.sql's outbox_emit.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// applyOutboxEmit runs migrations/007_outbox_emit.sql on f's database.
func (f *fixture) applyOutboxEmit(ctx context.Context, t *testing.T) {
	t.Helper()
	sql, err := os.ReadFile(filepath.Join("..", "..", "migrations", "007_outbox_emit.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.connect(ctx, t).Exec(ctx, string(sql)); err != nil {
		t.Fatalf("apply 007_outbox_emit.sql: %v", err)
	}
}

// messageWriter commits outbox_emit messages, one per transaction, over
// eight keys whose payloads count up ({"seq": n} per key), and among them
// messages the relay must never publish: in rolled-back transactions, with
// another prefix, and non-transactional ones with the outbox's prefix.
type messageWriter struct {
	mu        sync.Mutex
	committed []string          // ids, in commit order
	never     map[string]string // id → why it must not be published
	seq       map[string]int    // key → last committed seq
}

func newMessageWriter() *messageWriter {
	return &messageWriter{never: map[string]string{}, seq: map[string]int{}}
}

// write commits n messages (and the unpublishable ones among them).
func (w *messageWriter) write(ctx context.Context, conn *pgx.Conn, from, n int) error {
	for i := from; i < from+n; i++ {
		key := fmt.Sprintf("k%d", i%8)
		w.mu.Lock()
		seq := w.seq[key] + 1
		w.mu.Unlock()
		var id string
		switch i % 50 {
		case 7: // rolled back: never published
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, `SELECT outbox_emit('order', $1, 'Rollback', '{}')::text`, key).Scan(&id); err != nil {
				return err
			}
			if err := tx.Rollback(ctx); err != nil {
				return err
			}
			w.mu.Lock()
			w.never[id] = "rolled back"
			w.mu.Unlock()
		case 17: // another prefix
			if err := conn.QueryRow(ctx, `SELECT outbox_emit('order', $1, 'Other', '{}', prefix => 'other')::text`, key).Scan(&id); err != nil {
				return err
			}
			w.mu.Lock()
			w.never[id] = "another prefix"
			w.mu.Unlock()
		case 27: // non-transactional, the outbox's prefix
			id = fmt.Sprintf("nontx-%d", i)
			env := fmt.Sprintf(`{"id":%q,"aggregate_type":"order","aggregate_id":%q,"event_type":"NonTx","payload":{}}`, id, key)
			if _, err := conn.Exec(ctx, `SELECT pg_logical_emit_message(false, 'outbox', $1::text)`, env); err != nil {
				return err
			}
			w.mu.Lock()
			w.never[id] = "non-transactional"
			w.mu.Unlock()
		}
		if err := conn.QueryRow(ctx, `SELECT outbox_emit('order', $1, 'Counted', jsonb_build_object('seq', $2::int),
			headers => jsonb_build_object('tenant', 'acme'))::text`, key, seq).Scan(&id); err != nil {
			return err
		}
		w.mu.Lock()
		w.committed = append(w.committed, id)
		w.seq[key] = seq
		w.mu.Unlock()
	}
	return nil
}

// checkOrderedOnce fails t unless recs hold each of ids exactly once, with
// its id header, none of never, and per key the payloads' seq counting up in
// partition order.
func checkOrderedOnce(t *testing.T, recs []sandbox.Record, ids []string, never map[string]string) {
	t.Helper()
	seen := map[string]int{}
	last := map[string]int{}
	for _, r := range recs {
		id := r.Headers[sink.HeaderID]
		seen[id]++
		if why, ok := never[id]; ok {
			t.Errorf("message %s was published, but it must not be (%s)", id, why)
		}
		var p struct{ Seq int }
		if err := json.Unmarshal(r.Value, &p); err != nil {
			t.Errorf("record %s: value %q is not the JSON payload: %v", id, r.Value, err)
			continue
		}
		if p.Seq <= last[string(r.Key)] {
			t.Errorf("key %s: seq %d after %d (partition %d offset %d): per-key order broken", r.Key, p.Seq, last[string(r.Key)], r.Partition, r.Offset)
		}
		last[string(r.Key)] = p.Seq
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("message %s is in Kafka %d times, want once", id, seen[id])
		}
	}
	if len(recs) != len(ids) {
		t.Errorf("%d records, want %d", len(recs), len(ids))
	}
}

// TestMessageOutbox: a relay with --messages-prefix and no --table publishes
// every committed message once, with its id header, in per-key order, across
// kill -9 restarts; never those rolled back, with another prefix or
// non-transactional (counted, logged once); dead-letters a malformed one as
// bad_message with its raw content and goes on. Then table rows and messages
// written in one transaction reach their partition in the order written.
// PostgreSQL 13 has no messages option: there the relay must refuse to start.
func TestMessageOutbox(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	f := newFixture(t, sharedPG, "message_outbox", true)
	f.applyOutboxEmit(ctx, t)
	r := newRelay(t, f.relayArgs("--messages-prefix", "outbox"))

	if sharedPG.Major() < 14 {
		r.Start()
		code, exited := r.Wait(60 * time.Second)
		logs := r.Output()
		if !exited || code != 1 || !strings.Contains(logs, "--messages-prefix") || !strings.Contains(logs, "PostgreSQL 14 or later") {
			t.Fatalf("on PostgreSQL %d the relay exited %v with code %d; want exit code 1 (refused by the server check) and a message naming --messages-prefix and PostgreSQL 14:\n%s",
				sharedPG.Major(), exited, code, relayproc.Tail(logs, 20))
		}
		t.Logf("refused: %s", relayproc.Tail(logs, 1))
		t.Skipf("PostgreSQL %d has no pgoutput messages option: the relay refused --messages-prefix as it must; the message outbox itself needs 14+", sharedPG.Major())
	}

	r.Start()
	r.WaitReady(30 * time.Second)
	conn := f.connect(ctx, t)
	var pubTables int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_publication_tables WHERE pubname = 'cdc_relay_outbox'`).Scan(&pubTables); err != nil {
		t.Fatal(err)
	}
	if pubTables != 0 {
		t.Errorf("the publication the relay created covers %d tables, want none (no --table)", pubTables)
	}

	// A malformed message, and a non-transactional one, before the stream.
	const bad = `{"id":"bad-1","aggregate_type":"order","event_type":"Broken","payload":{"x":1}}`
	if _, err := conn.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outbox', $1::text)`, bad); err != nil {
		t.Fatal(err)
	}
	w := newMessageWriter()
	if err := w.write(ctx, conn, 0, 50); err != nil {
		t.Fatal(err)
	}
	f.waitRecords(ctx, t, 50, 60*time.Second)
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := r.Metric("cdc_relay_messages_non_transactional_total"); n != 1 {
			return fmt.Errorf("cdc_relay_messages_non_transactional_total = %v, want 1", n)
		}
		return nil
	})
	if n := strings.Count(r.Logs(), "non-transactional logical decoding message has the message outbox's prefix"); n != 1 {
		t.Errorf("the non-transactional message was logged %d times, want once", n)
	}

	// kill -9 three times while the writer commits.
	done := make(chan error, 1)
	go func() {
		wconn, err := pgx.Connect(ctx, f.url)
		if err != nil {
			done <- err
			return
		}
		defer wconn.Close(context.Background())
		done <- w.write(ctx, wconn, 50, 600)
	}()
	for kill, after := range []int{150, 300, 450} {
		f.waitRecords(ctx, t, after, 60*time.Second)
		requireRunning(t, r, fmt.Sprintf("before kill %d", kill+1))
		w.mu.Lock()
		committed := len(w.committed)
		w.mu.Unlock()
		r.Kill()
		t.Logf("SIGKILL %d, after %d records in Kafka: %d messages committed so far", kill+1, after, committed)
		r.Start()
		r.WaitReady(30 * time.Second)
	}
	if err := <-done; err != nil {
		t.Fatalf("writer: %v", err)
	}
	w.mu.Lock()
	ids, never := append([]string(nil), w.committed...), w.never
	w.mu.Unlock()
	f.waitRecords(ctx, t, len(ids), 90*time.Second)
	recs := f.read(ctx, t)
	t.Logf("%d messages committed, %d never to be published, %d records in Kafka, %d runs of the relay", len(ids), len(never), len(recs), r.Runs())
	checkOrderedOnce(t, recs, ids, never)
	for _, rec := range recs {
		if rec.Headers["tenant"] != "acme" || rec.Headers[sink.HeaderEventType] != "Counted" || rec.Headers[sink.HeaderCommitLSN] == "" {
			t.Fatalf("record %s: headers %v; want the envelope's tenant header and the relay's event_type, commit_lsn", rec.Headers[sink.HeaderID], rec.Headers)
		}
	}

	// The malformed message is a dead letter with its raw content.
	store, _ := f.deadLetters(ctx, t)
	letters, err := store.List(ctx, deadletter.Filter{ErrorCode: "bad_message"})
	if err != nil {
		t.Fatal(err)
	}
	if len(letters) != 1 || string(letters[0].Payload) != bad || letters[0].EventID != "bad-1" ||
		!strings.Contains(letters[0].ErrorMessage, "message content: missing aggregate_id") {
		t.Fatalf("bad_message letters %+v; want one, event bad-1, with the raw content and an error naming the missing aggregate_id", letters)
	}
	requireRunning(t, r, "after delivering everything")
	r.Stop(10 * time.Second)

	t.Run("rows and messages in one transaction", func(t *testing.T) {
		testRowsAndMessagesInOrder(ctx, t, f)
	})
}

// testRowsAndMessagesInOrder runs a relay over the outbox table and the
// message outbox (its own slot, publication and topic on f's database):
// rows and messages of one aggregate, interleaved within transactions, reach
// the partition in the order they were written, each once.
func testRowsAndMessagesInOrder(ctx context.Context, t *testing.T, f *fixture) {
	slot, topic := f.slot+"_mixed", f.topic+".mixed"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = f.pg.Exec(ctx, f.db, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", slot)
	})
	r := newRelay(t, []string{"run", "--pg-url", f.url, "--kafka-brokers", strings.Join(f.brokers, ","),
		"--topic", topic, "--log-format", "json", "--status-interval", "200ms", "--retry-cap", "1s",
		"--slot", slot, "--publication", "cdc_relay_mixed", "--table", "public.outbox_events", "--messages-prefix", "outbox"})
	r.Start()
	r.WaitReady(30 * time.Second)
	conn := f.connect(ctx, t)
	var ids []string
	seq := 0
	for txn := range 5 {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			seq++
			var id string
			if (txn+i)%2 == 0 {
				err = tx.QueryRow(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
					VALUES ('order', 'mixed', 'Row', jsonb_build_object('seq', $1::int)) RETURNING id::text`, seq).Scan(&id)
			} else {
				err = tx.QueryRow(ctx, `SELECT outbox_emit('order', 'mixed', 'Message', jsonb_build_object('seq', $1::int))::text`, seq).Scan(&id)
			}
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := sandbox.WaitForRecords(wctx, f.brokers, len(ids), topic); err != nil {
		t.Fatal(err)
	}
	recs, err := sandbox.ReadAll(wctx, f.brokers, topic)
	if err != nil {
		t.Fatal(err)
	}
	checkOrderedOnce(t, recs, ids, nil)
	for i, rec := range recs {
		if i < len(ids) && rec.Headers[sink.HeaderID] != ids[i] {
			t.Errorf("record %d is %s (%s), want %s: rows and messages out of their written order", i, rec.Headers[sink.HeaderID], rec.Headers[sink.HeaderEventType], ids[i])
		}
	}
	r.Stop(10 * time.Second)
}
