package replication_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestJoinTables: JoinTables adds the table to the publication in the
// transaction record is called in, with a snapshot that holds every row
// committed before and none of an insert held back by the lock, which waits
// only until the commit; a writer that does not end within the lock timeout,
// or a failing record, leaves the publication as it was.
func TestJoinTables(t *testing.T) {
	p := testenv.NewPostgres(t, sandbox.PGOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	url := p.URL("postgres")
	connect := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	admin := connect()
	if _, err := admin.Exec(ctx, `CREATE TABLE public.outbox_a (id int PRIMARY KEY); CREATE TABLE public.outbox_b (id int PRIMARY KEY);
		CREATE PUBLICATION joins FOR TABLE public.outbox_a;
		INSERT INTO public.outbox_b SELECT generate_series(1, 5)`); err != nil {
		t.Fatal(err)
	}
	table := []decoder.TableName{{Schema: "public", Table: "outbox_b"}}
	published := func() bool {
		t.Helper()
		var ok bool
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = 'joins' AND tablename = 'outbox_b')`).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	tests := []struct {
		name string
		// hold keeps a transaction that inserted into the table open during
		// the join.
		hold bool
		// fail makes record return an error.
		fail bool
		want string // substring of the error; "" for a join
	}{
		{name: "a writer outlasts the lock timeout", hold: true, want: "did not end within"},
		{name: "record fails", fail: true, want: "not joined; the next start tries again"},
		{name: "joins"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.hold {
				w := connect()
				tx, err := w.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = tx.Rollback(context.Background()) }()
				if _, err := tx.Exec(ctx, `INSERT INTO public.outbox_b VALUES (100)`); err != nil {
					t.Fatal(err)
				}
			}
			writer := connect()
			var seen []int
			inserted := make(chan error, 1)
			called := false
			var snapshot string
			err := replication.JoinTables(ctx, connect(), "joins", table, func(ctx context.Context, tx pgx.Tx, got []decoder.TableName, snap string) error {
				snapshot = snap
				called = true
				if len(got) != 1 || got[0] != table[0] {
					t.Errorf("record got tables %v, want %v", got, table)
				}
				// An insert now waits for the commit: it is not in this view.
				go func() {
					_, err := writer.Exec(ctx, `INSERT INTO public.outbox_b VALUES (6)`)
					inserted <- err
				}()
				select {
				case err := <-inserted:
					t.Errorf("an insert into the joining table completed before the join committed (err %v)", err)
				case <-time.After(200 * time.Millisecond):
				}
				if tt.fail {
					return errors.New("kafka is away")
				}
				return nil
			})
			if called {
				if err := <-inserted; err != nil {
					t.Fatalf("the held-back insert: %v", err)
				}
				if tt.want != "" {
					if _, err := admin.Exec(ctx, `DELETE FROM public.outbox_b WHERE id = 6`); err != nil {
						t.Fatal(err)
					}
				}
			}
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("JoinTables error %v, want one containing %q", err, tt.want)
				}
				if published() {
					t.Fatal("the table is in the publication after a failed join")
				}
				if tt.hold && called {
					t.Error("record was called although the table could not be locked")
				}
				return
			}
			if err != nil {
				t.Fatalf("JoinTables: %v", err)
			}
			defer func() {
				if _, err := admin.Exec(ctx, `DELETE FROM public.outbox_b WHERE id = 6`); err != nil {
					t.Fatal(err)
				}
			}()
			if !published() {
				t.Fatal("the table is not in the publication after the join")
			}
			// A fresh cluster's xids are in epoch 0: xmin is the xid8.
			rows, err := admin.Query(ctx, `SELECT id FROM public.outbox_b WHERE pg_visible_in_snapshot(xmin::text::xid8, $1::pg_snapshot) ORDER BY id`, snapshot)
			if err != nil {
				t.Fatal(err)
			}
			if seen, err = pgx.CollectRows(rows, pgx.RowTo[int]); err != nil {
				t.Fatal(err)
			}
			if want := []int{1, 2, 3, 4, 5}; !slices.Equal(seen, want) {
				t.Errorf("the join's snapshot %s holds rows %v, want %v (every row committed before, none held back)", snapshot, seen, want)
			}
		})
	}
}

// TestJoinTablesDoesNotQueueWriters: while a long transaction writing to the
// table keeps JoinTables from locking it, other inserts into the table go on
// (each waits at most one lock attempt, JoinLockAttempt, not the long
// transaction), and JoinTables joins once that transaction ended.
func TestJoinTablesDoesNotQueueWriters(t *testing.T) {
	p := testenv.NewPostgres(t, sandbox.PGOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	url := p.URL("postgres")
	connect := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	admin := connect()
	if _, err := admin.Exec(ctx, `CREATE TABLE public.outbox_a (id int PRIMARY KEY); CREATE TABLE public.outbox_b (id serial PRIMARY KEY);
		CREATE PUBLICATION joins FOR TABLE public.outbox_a`); err != nil {
		t.Fatal(err)
	}
	long, err := connect().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := long.Exec(ctx, `INSERT INTO public.outbox_b DEFAULT VALUES`); err != nil {
		t.Fatal(err)
	}
	joined := make(chan error, 1)
	go func() {
		joined <- replication.JoinTables(ctx, connect(), "joins", []decoder.TableName{{Schema: "public", Table: "outbox_b"}},
			func(context.Context, pgx.Tx, []decoder.TableName, string) error { return nil })
	}()
	committed := make(chan error, 1)
	go func() {
		// The long transaction ends while the join keeps trying.
		<-time.After(1500 * time.Millisecond)
		committed <- long.Commit(ctx)
	}()
	writer := connect()
	var slowest time.Duration
	n := 0
	for done := false; !done; {
		select {
		case err := <-joined:
			if err != nil {
				t.Fatalf("JoinTables: %v", err)
			}
			done = true
		case <-time.After(20 * time.Millisecond):
			began := time.Now()
			if _, err := writer.Exec(ctx, `INSERT INTO public.outbox_b DEFAULT VALUES`); err != nil {
				t.Fatal(err)
			}
			slowest, n = max(slowest, time.Since(began)), n+1
		}
	}
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d inserts while the join waited for the long transaction, the slowest took %s", n, slowest)
	if slowest > time.Second {
		t.Errorf("an insert waited %s behind the join's lock, want < 1s (one lock attempt is %s)", slowest, replication.JoinLockAttempt)
	}
}
