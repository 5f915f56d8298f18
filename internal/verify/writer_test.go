package verify

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestWriterRidesOutRestart runs the writer with Reconnect across an
// immediate (crash) restart of Postgres: it keeps going, and what it reports
// as committed is exactly what is in the table, each aggregate numbered in
// increasing order.
func TestWriterRidesOutRestart(t *testing.T) {
	pg := testenv.NewPostgres(t, sandbox.PGOptions{})
	testenv.RequireLocal(t, pg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url, err := pg.CreateDatabase(ctx, "writer")
	if err != nil {
		t.Fatal(err)
	}
	sql, err := os.ReadFile(filepath.Join("..", "..", "migrations", "001_outbox.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, "writer", string(sql)); err != nil {
		t.Fatal(err)
	}

	w := NewWriter(url, "a", 10, 1)
	w.Reconnect = true
	w.Pad = 10
	stop := make(chan struct{})
	errc := w.GoRun(ctx, stop, 0, 2000)
	committedAtLeast := func(n int) func() error {
		return func() error {
			select {
			case err := <-errc:
				t.Fatalf("writer stopped: %v", err)
			default:
			}
			if got := w.Count(); got < n {
				return fmt.Errorf("writer committed %d events, want %d", got, n)
			}
			return nil
		}
	}
	testenv.Eventually(t, 30*time.Second, committedAtLeast(200))
	if err := pg.Restart("immediate"); err != nil {
		t.Fatal(err)
	}
	before := w.Count()
	testenv.Eventually(t, 30*time.Second, committedAtLeast(before+200))
	close(stop)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	st := w.Stats()
	t.Logf("writer stats after a restart: %+v", st)
	if st.Reconnects == 0 {
		t.Errorf("no reconnect counted across a restart")
	}

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, "SELECT id::text FROM outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	committed := w.Committed()
	if len(ids) != len(committed) || st.Events != len(committed) {
		t.Fatalf("%d rows in the table, writer says %d events committed (stats %d)", len(ids), len(committed), st.Events)
	}
	inTable := map[string]bool{}
	for _, id := range ids {
		inTable[id] = true
	}
	last := map[string]int{}
	for _, ev := range committed {
		if !inTable[ev.ID] {
			t.Fatalf("event %s reported committed, not in the table", ev.ID)
		}
		if ev.Seq <= last[ev.Agg] {
			t.Fatalf("aggregate %s: seq %d after %d", ev.Agg, ev.Seq, last[ev.Agg])
		}
		last[ev.Agg] = ev.Seq
	}
}
