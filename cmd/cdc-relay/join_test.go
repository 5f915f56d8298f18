package main

// End-to-end test of an outbox table that joins the publication of a running
// slot (issue 36): its rows committed while it was outside the publication
// are never streamed, so the relay must publish them itself.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestJoiningTable runs the built binary over public.outbox_events, stops it,
// commits rows into billing.outbox_events (outside the publication) and into
// public's, then restarts it with billing added to --table while a writer
// keeps committing into both tables. The relay extends the publication; every
// row of both tables must reach its topic once, in per-key order, the billing
// rows committed before the restart with cdc_relay_snapshot: join, whatever
// --snapshot says (never: the relay cannot tell which rows committed after its
// checkpoint, so it publishes them all). A relay that may not change the
// publication refuses first, saying what the change by hand would lose; when
// the table is added by hand all the same, the relay stops (table_joined)
// until it is removed again, and then joins it itself.
func TestJoiningTable(t *testing.T) {
	tests := []struct {
		name, mode string
		// byHand: after the refusal, the table is added to the publication
		// by hand; the relay must then stop (table_joined), and starts once
		// the table is removed again, as its message says.
		byHand bool
		// kill: the relay is killed (-9) after the join rather than stopped;
		// its restart sends nothing twice all the same.
		kill bool
		// rejoin: then the table leaves the relay's list while it stays in
		// the publication, and comes back: the relay starts (no
		// table_joined: the stream from its checkpoint carries the table's
		// rows), and every row committed after that checkpoint arrives.
		rejoin bool
	}{
		{name: "initial", mode: "initial"},
		{name: "never", mode: "never", kill: true, rejoin: true},
		{name: "by hand", mode: "initial", byHand: true},
	}
	for _, tt := range tests {
		mode := tt.mode
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			f := newFixture(t, sharedPG, "join_"+tt.name, true)
			conn := f.connect(ctx, t)
			if _, err := conn.Exec(ctx, `CREATE SCHEMA billing; CREATE TABLE billing.outbox_events (LIKE public.outbox_events INCLUDING ALL)`); err != nil {
				t.Fatal(err)
			}
			common := []string{"run", "--pg-url", f.url, "--kafka-brokers", strings.Join(f.brokers, ","),
				"--topic", "outbox.{schema}", "--log-format", "json", "--status-interval", "200ms", "--retry-cap", "1s",
				"--slot", f.slot, "--snapshot", mode, "--table", "public.outbox_events"}
			w := &joinWriter{seq: map[string]int{}, ids: map[string][]string{}}
			write := func(schema string, n int) {
				t.Helper()
				for range n {
					if err := w.write(ctx, conn, schema); err != nil {
						t.Fatal(err)
					}
				}
			}

			// Billing rows from before the relay's first start: in the table
			// when it joins.
			write("billing", 10)
			r := newRelay(t, common)
			r.Start()
			r.WaitReady(30 * time.Second)
			write("public", 10)
			waitTopic(ctx, t, f.brokers, "outbox.public", 10)
			r.Stop(10 * time.Second)

			// While the relay is stopped, both tables get rows: the stream
			// carries public's from the checkpoint, never billing's.
			write("billing", 20)
			// One transaction of five rows of one key: the join snapshot
			// keeps their order.
			if err := w.writeTxn(ctx, conn, "billing", 5); err != nil {
				t.Fatal(err)
			}
			write("public", 20)
			before := len(w.ids["billing"])

			joined := append(slices.Clone(common), "--table", "billing.outbox_events")
			refused := newRelay(t, append(joined, "--no-create-publication"))
			refused.Start()
			code, exited := refused.Wait(60 * time.Second)
			if out := refused.Output(); !exited || code != 1 || !strings.Contains(out, "are never streamed") {
				t.Errorf("a relay that may not change the publication exited %v with code %d; want code 1 saying what a change by hand loses:\n%s", exited, code, relayproc.Tail(out, 10))
			}

			if tt.byHand {
				// Added by hand: the stream never carries the rows committed
				// before, and the relay cannot tell which those are.
				if _, err := conn.Exec(ctx, `ALTER PUBLICATION cdc_relay_outbox ADD TABLE billing.outbox_events`); err != nil {
					t.Fatal(err)
				}
				stopped := newRelay(t, append(joined, "--no-create-publication"))
				stopped.Start()
				code, exited := stopped.Wait(60 * time.Second)
				out := stopped.Output()
				for _, want := range []string{"table_joined", `ALTER PUBLICATION \"cdc_relay_outbox\" DROP TABLE \"billing\".\"outbox_events\";`, "cdc-relay replay --table billing.outbox_events --since"} {
					if !exited || code != 1 || !strings.Contains(out, want) {
						t.Fatalf("a relay reading a table added to the publication by hand exited %v with code %d; want code 1 and %s:\n%s", exited, code, want, relayproc.Tail(out, 10))
					}
				}
				// As the message says: out of the publication again, then a
				// relay that may change it.
				if _, err := conn.Exec(ctx, `ALTER PUBLICATION cdc_relay_outbox DROP TABLE billing.outbox_events`); err != nil {
					t.Fatal(err)
				}
			}

			// The writer commits into both tables through the join.
			wconn, err := pgx.Connect(ctx, f.url)
			if err != nil {
				t.Fatal(err)
			}
			defer wconn.Close(context.Background())
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var werr error
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if werr = w.write(ctx, wconn, []string{"billing", "public"}[i%2]); werr != nil {
						return
					}
				}
			}()
			r = newRelay(t, joined)
			r.Start()
			r.WaitReady(60 * time.Second)
			testenv.Eventually(t, 30*time.Second, func() error {
				if n := w.count("billing"); n < before+100 {
					return fmt.Errorf("%d billing rows committed since the restart, want 100", n-before)
				}
				return nil
			})
			close(stop)
			wg.Wait()
			if werr != nil {
				t.Fatal(werr)
			}
			if !r.HasLog("joins publication") || !r.HasLog("join snapshot done") {
				t.Errorf("the relay did not log the join snapshot")
			}

			for _, schema := range []string{"public", "billing"} {
				ids := w.ids[schema]
				recs := waitTopic(ctx, t, f.brokers, "outbox."+schema, len(ids))
				checkOrderedOnce(t, recs, ids, nil)
				snap := 0
				byID := map[string]string{}
				for _, rec := range recs {
					byID[rec.Headers["id"]] = rec.Headers["cdc_relay_snapshot"]
					if rec.Headers["cdc_relay_snapshot"] != "" {
						snap++
					}
				}
				switch schema {
				case "public":
					if snap != 0 {
						t.Errorf("%d records of public carry cdc_relay_snapshot, want none", snap)
					}
				case "billing":
					for _, id := range ids[:before] {
						if byID[id] != "join" {
							t.Errorf("billing row %s, committed before the join, arrived with cdc_relay_snapshot %q, want join", id, byID[id])
						}
					}
					t.Logf("billing: %d records from the join snapshot (%d rows committed before the restart), %d streamed", snap, before, len(recs)-snap)
				}
			}
			requireRunning(t, r, "after the join")

			// A restart finds the table in the publication: no new snapshot.
			if tt.kill {
				r.Kill()
			} else {
				r.Stop(10 * time.Second)
			}
			r.Start()
			r.WaitReady(30 * time.Second)
			write("billing", 1)
			write("public", 1)
			for _, schema := range []string{"public", "billing"} {
				recs := waitTopic(ctx, t, f.brokers, "outbox."+schema, len(w.ids[schema]))
				checkOrderedOnce(t, recs, w.ids[schema], nil)
			}
			if strings.Count(r.Logs(), "join snapshot done") != 1 {
				t.Errorf("the restart took a join snapshot again")
			}
			r.Stop(10 * time.Second)
			if tt.rejoin {
				rejoin(ctx, t, f.brokers, conn, w, common, joined)
			}
		})
	}
}

// rejoin runs the relay without billing.outbox_events in its list (the
// table stays in the publication), then with it again. The rows committed
// into it while the relay did not read it are skipped: the relay's
// checkpoint moves past them (a clean stop after public rows committed
// later). Every row committed after that checkpoint arrives once the table
// is back, and the relay starts: the publication covered the table at its
// checkpoint, so nothing it promises is missing.
func rejoin(ctx context.Context, t *testing.T, brokers []string, conn *pgx.Conn, w *joinWriter, common, joined []string) {
	t.Helper()
	write := func(schema string, n int) []string {
		t.Helper()
		var ids []string
		for range n {
			if err := w.write(ctx, conn, schema); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, w.ids[schema][len(w.ids[schema])-1])
		}
		return ids
	}
	left := newRelay(t, common)
	left.Start()
	left.WaitReady(30 * time.Second)
	skipped := write("billing", 5)
	write("public", 5)
	waitTopic(ctx, t, brokers, "outbox.public", len(w.ids["public"]))
	left.Stop(10 * time.Second)

	write("billing", 5)
	back := newRelay(t, joined)
	back.Start()
	testenv.Eventually(t, 60*time.Second, func() error {
		if back.Exited() || back.Readyz() == http.StatusOK {
			return nil
		}
		return fmt.Errorf("the relay is neither ready nor exited")
	})
	requireRunning(t, back, "when the table came back to its list")
	write("billing", 5)
	write("public", 1)
	var want []string
	for _, id := range w.ids["billing"] {
		if !slices.Contains(skipped, id) {
			want = append(want, id)
		}
	}
	for schema, ids := range map[string][]string{"public": w.ids["public"], "billing": want} {
		recs := waitTopic(ctx, t, brokers, "outbox."+schema, len(ids))
		checkOrderedOnce(t, recs, ids, nil)
	}
	if back.HasLog("joins publication") {
		t.Errorf("the relay joined the table again, though it stayed in the publication")
	}
	requireRunning(t, back, "after the table came back")
	back.Stop(10 * time.Second)
}

// joinWriter commits one-row transactions (writeTxn: several rows of one
// key) into the outbox tables of several schemas, over four keys per schema
// whose payloads count up. Safe for one writer at a time and concurrent
// count calls.
type joinWriter struct {
	mu   sync.Mutex
	seq  map[string]int
	ids  map[string][]string // schema → ids in commit order
	txns int                 // writeTxn's transactions, for their ids
}

func (w *joinWriter) write(ctx context.Context, conn *pgx.Conn, schema string) error {
	w.mu.Lock()
	n := len(w.ids[schema])
	key := fmt.Sprintf("%s-%d", schema, n%4)
	seq := w.seq[key] + 1
	w.mu.Unlock()
	payload, _ := json.Marshal(map[string]int{"seq": seq})
	var id string
	if err := conn.QueryRow(ctx, fmt.Sprintf(`INSERT INTO %s.outbox_events (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', $1, 'Counted', $2::jsonb) RETURNING id::text`, schema), key, string(payload)).Scan(&id); err != nil {
		return fmt.Errorf("insert into %s.outbox_events: %w", schema, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq[key] = seq
	w.ids[schema] = append(w.ids[schema], id)
	return nil
}

// writeTxn commits n rows of one key into schema's outbox table in one
// transaction, a statement each, with ids that fall as they are inserted:
// the rows share created_at (now()), so only the order they were inserted
// in keeps the key's order.
func (w *joinWriter) writeTxn(ctx context.Context, conn *pgx.Conn, schema string, n int) error {
	w.mu.Lock()
	key := fmt.Sprintf("%s-%d", schema, len(w.ids[schema])%4)
	seq := w.seq[key]
	w.txns++
	txn := w.txns
	w.mu.Unlock()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%08x-%04x-4000-8000-000000000000", 0xffffffff-i, txn)
		payload, _ := json.Marshal(map[string]int{"seq": seq + 1 + i})
		if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
		VALUES ($1, 'order', $2, 'Counted', $3::jsonb)`, schema), id, key, string(payload)); err != nil {
			return fmt.Errorf("insert into %s.outbox_events: %w", schema, err)
		}
		ids = append(ids, id)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit into %s.outbox_events: %w", schema, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq[key] = seq + n
	w.ids[schema] = append(w.ids[schema], ids...)
	return nil
}

func (w *joinWriter) count(schema string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ids[schema])
}
