package deadletter_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

const testDB = "cdc_relay_deadletter_test"

// The package's shared servers: one Postgres cluster and one Kafka broker. Every
// test uses its own tables and topics.
var (
	pg      *sandbox.Postgres
	kafka   *sandbox.Kafka
	dbURL   string
	pool    *pgxpool.Pool
	counter atomic.Int64
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	ctx := context.Background()
	var err error
	if pg, err = sandbox.StartPostgres(ctx, sandbox.PGOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "start postgres:", err)
		return 1
	}
	defer pg.Close()
	if kafka, err = sandbox.StartKafka(sandbox.KafkaOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "start kafka:", err)
		return 1
	}
	defer kafka.Close()
	if dbURL, err = pg.CreateDatabase(ctx, testDB); err != nil {
		fmt.Fprintln(os.Stderr, "create database:", err)
		return 1
	}
	if pool, err = pgxpool.New(ctx, dbURL); err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		return 1
	}
	defer pool.Close()
	return m.Run()
}

// unique returns name with a number no other test uses.
func unique(name string) string { return fmt.Sprintf("%s_%d", name, counter.Add(1)) }

// newStore returns a store on fresh tables.
func newStore(t *testing.T) *deadletter.Store {
	t.Helper()
	s := deadletter.NewStore(pool, "public."+unique("dl"))
	if err := s.Ensure(t.Context()); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	return s
}

var base = time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)

// letter returns a dead letter; the event id is also the payload's "n".
func letter(eventID, code, aggregateID, eventType string, failed time.Time) deadletter.Letter {
	return deadletter.Letter{
		EventID: eventID, AggregateType: "order", AggregateID: aggregateID, EventType: eventType,
		Key: []byte(aggregateID), Payload: []byte(fmt.Sprintf(`{"n": %q}`, eventID)),
		Headers: map[string]string{sink.HeaderID: eventID, "tenant": "acme"},
		Topic:   "outbox.order", ErrorCode: code, ErrorMessage: code + ": boom",
		FirstFailedAt: failed, LastFailedAt: failed, RelayName: "relay-1",
	}
}

func mustAdd(t *testing.T, s *deadletter.Store, ls ...deadletter.Letter) {
	t.Helper()
	for _, l := range ls {
		if err := s.Add(t.Context(), l); err != nil {
			t.Fatalf("Add(%s): %v", l.EventID, err)
		}
	}
}

// byEventID returns the letter of eventID from s.
func byEventID(t *testing.T, s *deadletter.Store, eventID string) deadletter.Letter {
	t.Helper()
	ls, err := s.List(t.Context(), deadletter.Filter{EventIDs: []string{eventID}})
	if err != nil || len(ls) != 1 {
		t.Fatalf("List(event %s) = %d letters, %v; want 1", eventID, len(ls), err)
	}
	return ls[0]
}

func eventIDs(ls []deadletter.Letter) []string {
	ids := make([]string, len(ls))
	for i, l := range ls {
		ids[i] = l.EventID
	}
	return ids
}

func TestAddStoresEveryField(t *testing.T) {
	s := newStore(t)
	in := deadletter.Letter{
		EventID: "e-1", AggregateType: "order", AggregateID: "42", EventType: "OrderPlaced",
		Key: []byte("42"), Payload: []byte{0xff, 0x00, 'x'}, // bytes as stored, not text
		Headers: map[string]string{"id": "e-1", "bad": "a\x00b\xff"},
		Topic:   "outbox.order", ErrorCode: "message_too_large", ErrorMessage: "too big",
		RetryCount: 2, FirstFailedAt: base, LastFailedAt: base.Add(time.Minute),
		RelayName: "relay-1", CorrelationID: "corr-9", SchemaVersion: "v3", CommitLSN: pglogrepl.LSN(0x1_0000_0010),
	}
	mustAdd(t, s, in)
	got := byEventID(t, s, "e-1")
	if got.ID <= 0 || got.Status != deadletter.StatusPending || got.ReplayedAt != nil || got.ReplayCount != 0 {
		t.Errorf("new letter: id %d, status %q, replayed_at %v, replay_count %d", got.ID, got.Status, got.ReplayedAt, got.ReplayCount)
	}
	in.ID, in.Status = got.ID, deadletter.StatusPending
	in.Headers = map[string]string{"id": "e-1", "bad": "a\uFFFDb\uFFFD"} // jsonb takes neither NUL nor invalid UTF-8
	got.FirstFailedAt, got.LastFailedAt = got.FirstFailedAt.UTC(), got.LastFailedAt.UTC()
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", in) {
		t.Errorf("stored letter differs:\n got %+v\nwant %+v", got, in)
	}

	// A letter without key, payload, times or LSN.
	mustAdd(t, s, deadletter.Letter{EventID: "e-2", Topic: "t", ErrorCode: "empty_key", ErrorMessage: "no key"})
	got = byEventID(t, s, "e-2")
	if got.Key != nil || len(got.Payload) != 0 || got.CommitLSN != 0 || time.Since(got.FirstFailedAt) > time.Minute ||
		!got.LastFailedAt.Equal(got.FirstFailedAt) || len(got.Headers) != 0 {
		t.Errorf("minimal letter = %+v", got)
	}

	if err := s.Add(t.Context(), deadletter.Letter{Topic: "t"}); err == nil {
		t.Error("Add without an event id succeeded")
	}
}

func TestAddTwiceCountsARetry(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	first := letter("e-1", "message_too_large", "42", "OrderPlaced", base)
	mustAdd(t, s, first)
	id := byEventID(t, s, "e-1").ID
	if err := s.MarkCompleted(ctx, id); err != nil {
		t.Fatal(err)
	}

	again := first
	again.ErrorCode, again.ErrorMessage = "invalid_topic", "bad topic"
	again.FirstFailedAt, again.LastFailedAt = base.Add(time.Hour), base.Add(time.Hour)
	again.Payload = []byte(`{"changed": true}`)
	mustAdd(t, s, again)
	again.LastFailedAt = base.Add(2 * time.Hour)
	mustAdd(t, s, again)

	got, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.RetryCount != 2 || !got.FirstFailedAt.Equal(base) || !got.LastFailedAt.Equal(base.Add(2*time.Hour)) ||
		got.ErrorCode != "invalid_topic" || got.ErrorMessage != "bad topic" || got.Status != deadletter.StatusPending ||
		string(got.Payload) != string(first.Payload) || got.ReplayCount != 1 {
		t.Errorf("after two more failures: retry_count %d, first %v, last %v, code %q, message %q, status %q, payload %s, replay_count %d",
			got.RetryCount, got.FirstFailedAt, got.LastFailedAt, got.ErrorCode, got.ErrorMessage, got.Status, got.Payload, got.ReplayCount)
	}
	if all, _ := s.List(ctx, deadletter.Filter{}); len(all) != 1 {
		t.Errorf("%d letters after adding one event three times, want 1", len(all))
	}
}

func TestListFilters(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	mustAdd(t, s,
		letter("a1", "message_too_large", "A", "Placed", base),
		letter("a2", "message_too_large", "A", "Paid", base.Add(1*time.Hour)),
		letter("b1", "invalid_topic", "B", "Placed", base.Add(2*time.Hour)),
		letter("b2", "empty_key", "B", "Shipped", base.Add(3*time.Hour)),
		letter("c1", "message_too_large", "C", "Placed", base.Add(4*time.Hour)),
	)
	user := letter("u1", "invalid_topic", "U", "Registered", base.Add(5*time.Hour))
	user.AggregateType = "user"
	mustAdd(t, s, user)
	if err := s.MarkCompleted(ctx, byEventID(t, s, "a2").ID); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkCompleted(ctx, byEventID(t, s, "b1").ID); err != nil {
		t.Fatal(err)
	}
	ids := func(events ...string) []int64 {
		var out []int64
		for _, e := range events {
			out = append(out, byEventID(t, s, e).ID)
		}
		return out
	}

	tests := []struct {
		name string
		f    deadletter.Filter
		want []string
	}{
		{"all", deadletter.Filter{}, []string{"a1", "a2", "b1", "b2", "c1", "u1"}},
		{"ids", deadletter.Filter{IDs: ids("b2", "a1")}, []string{"a1", "b2"}},
		{"event ids", deadletter.Filter{EventIDs: []string{"c1", "u1", "nope"}}, []string{"c1", "u1"}},
		{"error code", deadletter.Filter{ErrorCode: "message_too_large"}, []string{"a1", "a2", "c1"}},
		{"aggregate id", deadletter.Filter{AggregateID: "B"}, []string{"b1", "b2"}},
		{"aggregate type", deadletter.Filter{AggregateType: "user"}, []string{"u1"}},
		{"event type", deadletter.Filter{EventType: "Placed"}, []string{"a1", "b1", "c1"}},
		{"pending", deadletter.Filter{Status: deadletter.StatusPending}, []string{"a1", "b2", "c1", "u1"}},
		{"replayed", deadletter.Filter{Status: deadletter.StatusReplayed}, []string{"a2", "b1"}},
		{"since", deadletter.Filter{Since: base.Add(3 * time.Hour)}, []string{"b2", "c1", "u1"}},
		{"until", deadletter.Filter{Until: base.Add(2 * time.Hour)}, []string{"a1", "a2"}},
		{"since and until", deadletter.Filter{Since: base.Add(time.Hour), Until: base.Add(4 * time.Hour)}, []string{"a2", "b1", "b2"}},
		{"combined", deadletter.Filter{ErrorCode: "message_too_large", EventType: "Placed", Status: deadletter.StatusPending}, []string{"a1", "c1"}},
		{"limit", deadletter.Filter{Limit: 2}, []string{"a1", "a2"}},
		{"limit after filter", deadletter.Filter{AggregateID: "B", Limit: 1}, []string{"b1"}},
		{"nothing", deadletter.Filter{AggregateID: "A", EventType: "Shipped"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.List(ctx, tt.f)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(eventIDs(got), tt.want) {
				t.Errorf("List = %v, want %v", eventIDs(got), tt.want)
			}
		})
	}

	if _, err := s.List(ctx, deadletter.Filter{Status: "done"}); err == nil || !strings.Contains(err.Error(), `"done"`) {
		t.Errorf("List with a bad status: %v", err)
	}

	t.Run("summary", func(t *testing.T) {
		got, err := s.Summary(ctx, deadletter.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		want := []deadletter.CodeCount{
			{ErrorCode: "message_too_large", Count: 3, Pending: 2, Oldest: base, Newest: base.Add(4 * time.Hour)},
			{ErrorCode: "invalid_topic", Count: 2, Pending: 1, Oldest: base.Add(2 * time.Hour), Newest: base.Add(5 * time.Hour)},
			{ErrorCode: "empty_key", Count: 1, Pending: 1, Oldest: base.Add(3 * time.Hour), Newest: base.Add(3 * time.Hour)},
		}
		if len(got) != len(want) {
			t.Fatalf("Summary = %+v, want %+v", got, want)
		}
		for i := range want {
			g, w := got[i], want[i]
			if g.ErrorCode != w.ErrorCode || g.Count != w.Count || g.Pending != w.Pending || !g.Oldest.Equal(w.Oldest) || !g.Newest.Equal(w.Newest) {
				t.Errorf("Summary[%d] = %+v, want %+v", i, g, w)
			}
		}
		got, err = s.Summary(ctx, deadletter.Filter{AggregateID: "A"})
		if err != nil || len(got) != 1 || got[0].Count != 2 || got[0].Pending != 1 {
			t.Errorf("Summary(aggregate A) = %+v, %v; want message_too_large: 2, 1 pending", got, err)
		}
	})

	t.Run("backlog", func(t *testing.T) {
		n, err := s.Backlog(ctx)
		if err != nil || n != 4 {
			t.Errorf("Backlog = %d, %v; want 4", n, err)
		}
	})
}

func TestGetAndMarkCompleted(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	mustAdd(t, s, letter("e-1", "empty_key", "1", "T", base))
	id := byEventID(t, s, "e-1").ID

	before := time.Now().Add(-time.Second)
	for range 2 {
		if err := s.MarkCompleted(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != deadletter.StatusCompleted || got.ReplayCount != 2 || got.ReplayedAt == nil || got.ReplayedAt.Before(before) {
		t.Errorf("after two MarkCompleted: status %q, replay_count %d, replayed_at %v", got.Status, got.ReplayCount, got.ReplayedAt)
	}

	_, err = s.Get(ctx, id+1000)
	if !errors.Is(err, deadletter.ErrNotFound) || !strings.Contains(err.Error(), fmt.Sprint(id+1000)) {
		t.Errorf("Get(missing) = %v, want ErrNotFound naming the id", err)
	}
	if err := s.MarkCompleted(ctx, id+1000); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("MarkCompleted(missing) = %v, want ErrNotFound", err)
	}
}

func TestPurge(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	now := time.Now()
	old, recent := now.Add(-10*24*time.Hour), now.Add(-time.Hour)
	mustAdd(t, s,
		letter("old-pending", "c", "1", "T", old),
		letter("old-replayed", "c", "1", "T", old),
		letter("old-replayed-lately", "c", "1", "T", old),
		letter("recent-pending", "c", "1", "T", recent),
		letter("recent-replayed", "c", "1", "T", recent),
	)
	for _, e := range []string{"old-replayed", "old-replayed-lately", "recent-replayed"} {
		if err := s.MarkCompleted(ctx, byEventID(t, s, e).ID); err != nil {
			t.Fatal(err)
		}
	}
	// old-replayed was replayed long ago too; old-replayed-lately just now.
	if _, err := pool.Exec(ctx, "UPDATE "+quote(s.Table())+" SET replayed_at = $1 WHERE event_id = 'old-replayed'", old); err != nil {
		t.Fatal(err)
	}
	week := now.Add(-7 * 24 * time.Hour)

	n, err := s.Purge(ctx, week, deadletter.StatusReplayed)
	if err != nil || n != 1 {
		t.Fatalf("Purge(7d, replayed) = %d, %v; want 1", n, err)
	}
	n, err = s.Purge(ctx, week, "")
	if err != nil || n != 1 {
		t.Fatalf("Purge(7d, any) = %d, %v; want 1 (old-pending)", n, err)
	}
	left, _ := s.List(ctx, deadletter.Filter{})
	if want := []string{"old-replayed-lately", "recent-pending", "recent-replayed"}; !slices.Equal(eventIDs(left), want) {
		t.Errorf("left after purge: %v, want %v", eventIDs(left), want)
	}
	if _, err := s.Purge(ctx, week, "gone"); err == nil {
		t.Error("Purge with a bad status succeeded")
	}

	t.Run("in batches", func(t *testing.T) {
		// 2500 old letters: three DELETE statements of at most 1000 rows.
		tbl := quote(s.Table())
		if _, err := pool.Exec(ctx, `INSERT INTO `+tbl+` (event_id, payload, topic, error_code, error_message, first_failed_at, last_failed_at)
SELECT 'bulk-' || i, '\x00', 't', 'c', 'm', $1, $1 FROM generate_series(1, 2500) i`, old); err != nil {
			t.Fatal(err)
		}
		statements := testenv.CountStatements(t, pool, s.Table(), "DELETE")
		n, err := s.Purge(ctx, week, "")
		if err != nil || n != 2500 {
			t.Fatalf("Purge = %d, %v; want 2500", n, err)
		}
		if got := statements(); got != 3 {
			t.Errorf("Purge ran %d DELETE statements, want 3 batches (1000, 1000, 500)", got)
		}
	})
}

// quote quotes a schema.table name.
func quote(table string) string {
	s, t, _ := strings.Cut(table, ".")
	return fmt.Sprintf("%q.%q", s, t)
}

func TestEnsure(t *testing.T) {
	ctx := t.Context()

	t.Run("idempotent, quoted names", func(t *testing.T) {
		if err := pg.Exec(ctx, testDB, `CREATE SCHEMA IF NOT EXISTS "Ops Schema"`); err != nil {
			t.Fatal(err)
		}
		quoted := unique("Dead-Letters")
		for _, table := range []string{"", "Ops Schema." + quoted, unique("bare_dead_letters")} {
			s := deadletter.NewStore(pool, table)
			for range 2 {
				if err := s.Ensure(ctx); err != nil {
					t.Fatalf("Ensure(%q): %v", table, err)
				}
			}
			mustAdd(t, s, letter("e-1", "c", "1", "T", base))
			if n, err := s.Backlog(ctx); err != nil || n != 1 {
				t.Errorf("Backlog of %q = %d, %v", table, n, err)
			}
			id, err := s.History().Start(ctx, replay.Entry{Kind: replay.KindDLQ, Actor: "t"})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.History().RecordEvent(ctx, id, replay.Event{EventID: "e-1", Result: replay.ResultSkipped}); err != nil {
				t.Fatal(err)
			}
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM "Ops Schema"."`+quoted+`_replay_events"`).Scan(&n); err != nil || n != 1 {
			t.Errorf("quoted history table has %d rows (err %v), want 1", n, err)
		}
	})

	t.Run("missing tables name the migration", func(t *testing.T) {
		s := deadletter.NewStore(pool, "public.never_created")
		_, err := s.List(ctx, deadletter.Filter{})
		for _, w := range []string{"public.never_created", deadletter.MigrationFile} {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("List on a missing table: %v; want it to name %q", err, w)
			}
		}
	})

	t.Run("role without CREATE", func(t *testing.T) {
		role := unique("dlq_role")
		if err := pg.Exec(ctx, testDB, fmt.Sprintf(`CREATE ROLE %[1]s LOGIN PASSWORD 'secret';
%[2]s
GRANT SELECT, INSERT, UPDATE ON public.dl_premigrated, public.dl_premigrated_replays, public.dl_premigrated_replay_events TO %[1]s;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO %[1]s;`, role, deadletter.TableDDL("public.dl_premigrated"))); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := pg.Exec(ctx, testDB, "DROP OWNED BY "+role); err != nil {
				t.Errorf("drop owned by %s: %v", role, err)
			}
			if err := pg.Exec(ctx, "postgres", "DROP ROLE "+role); err != nil {
				t.Errorf("drop role %s: %v", role, err)
			}
		})
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(role, "secret")
		limited, err := pgxpool.New(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer limited.Close()

		err = deadletter.NewStore(limited, "public.dl_unmigrated").Ensure(ctx)
		for _, w := range []string{"migrations/005_dead_letters.sql", "public.dl_unmigrated", "CREATE on schema public"} {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("Ensure without privilege: %v; want it to name %q", err, w)
			}
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("Ensure error does not wrap the insufficient_privilege PgError: %v", err)
		}

		// Migrated: the role needs no CREATE.
		s := deadletter.NewStore(limited, "public.dl_premigrated")
		if err := s.Ensure(ctx); err != nil {
			t.Fatalf("Ensure on migrated tables: %v", err)
		}
		mustAdd(t, s, letter("e-1", "c", "1", "T", base), letter("e-1", "c", "1", "T", base))
	})

	t.Run("migration file", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join("..", "..", deadletter.MigrationFile))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), deadletter.TableDDL("")) {
			t.Errorf("%s does not contain TableDDL(\"\") verbatim:\n%s", deadletter.MigrationFile, deadletter.TableDDL(""))
		}
		// It runs twice on a fresh database, with and without the relay's role.
		db := unique("migrated")
		if _, err := pg.CreateDatabase(ctx, db); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := pg.Exec(ctx, db, string(b)); err != nil {
				t.Fatalf("run %s: %v", deadletter.MigrationFile, err)
			}
		}
		if err := pg.Exec(ctx, db, "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cdc_relay') THEN CREATE ROLE cdc_relay; END IF; END $$"); err != nil {
			t.Fatal(err)
		}
		if err := pg.Exec(ctx, db, string(b)); err != nil {
			t.Fatalf("run %s with role cdc_relay: %v", deadletter.MigrationFile, err)
		}

		// Its grants let the relay's role store letters and run the dlq commands.
		if pg.External() {
			t.Skip("logging in as cdc_relay would change a role of an external server")
		}
		if err := pg.Exec(ctx, db, "ALTER ROLE cdc_relay LOGIN PASSWORD 'relay-secret'"); err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(pg.URL(db))
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword("cdc_relay", "relay-secret")
		relayPool, err := pgxpool.New(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer relayPool.Close()
		s := deadletter.NewStore(relayPool, "")
		if err := s.Ensure(ctx); err != nil {
			t.Fatalf("Ensure as cdc_relay: %v", err)
		}
		mustAdd(t, s, letter("e-1", "c", "1", "T", base), letter("e-1", "c", "1", "T", base))
		if n, err := s.Backlog(ctx); err != nil || n != 1 {
			t.Errorf("Backlog as cdc_relay = %d, %v", n, err)
		}
		if _, err := s.ReplayDeadLetters(ctx, nil, deadletter.ReplayOptions{DryRun: true}); err != nil {
			t.Errorf("dry-run replay as cdc_relay: %v", err)
		}
		if err := s.MarkCompleted(ctx, byEventID(t, s, "e-1").ID); err != nil {
			t.Errorf("MarkCompleted as cdc_relay: %v", err)
		}
		if n, err := s.Purge(ctx, time.Now().Add(time.Hour), ""); err != nil || n != 1 {
			t.Errorf("Purge as cdc_relay = %d, %v", n, err)
		}
	})
}

func TestFromEventAndRecorder(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	commit := time.Date(2024, 5, 1, 9, 0, 0, 123456000, time.UTC)
	ev := &outbox.Event{
		ID: []byte("ev-1"), AggregateType: []byte("order"), AggregateID: []byte("42"), EventType: []byte("OrderPlaced"),
		Payload: []byte(`{"total": 1}`), CommitLSN: 0x16B3748, CommitTime: commit,
		Headers: []outbox.Header{{Key: "correlation_id", Value: []byte("corr-1")}, {Key: "tenant", Value: []byte("acme")}},
	}
	rec := s.Recorder("relay-a")
	cause := &outbox.EventError{Code: "message_too_large", Err: errors.New("1 MB")}
	if err := rec(ctx, ev, "outbox.order", cause); err != nil {
		t.Fatal(err)
	}
	got := byEventID(t, s, "ev-1")
	wantHeaders := map[string]string{"id": "ev-1", "event_type": "OrderPlaced", "aggregate_type": "order",
		"commit_lsn": "0/16B3748", "commit_time": "2024-05-01T09:00:00.123456Z", "correlation_id": "corr-1", "tenant": "acme"}
	if fmt.Sprint(got.Headers) != fmt.Sprint(wantHeaders) {
		t.Errorf("headers = %v, want %v", got.Headers, wantHeaders)
	}
	if got.Topic != "outbox.order" || got.ErrorCode != "message_too_large" || got.ErrorMessage != cause.Error() ||
		got.RelayName != "relay-a" || got.CorrelationID != "corr-1" || got.CommitLSN != 0x16B3748 ||
		string(got.Key) != "42" || string(got.Payload) != `{"total": 1}` {
		t.Errorf("recorded letter = %+v", got)
	}

	// A topic the template cannot render: the relay gives the template
	// (TestRoutingFailureGoesToDeadLetters), which is stored.
	bad := &outbox.Event{ID: []byte("ev-2"), AggregateType: []byte("no/slash"), AggregateID: []byte("1"), Payload: []byte("{}")}
	if err := rec(ctx, bad, "outbox.{aggregate_type}", &outbox.EventError{Code: "invalid_topic", Err: errors.New("bad")}); err != nil {
		t.Fatal(err)
	}
	if got := byEventID(t, s, "ev-2"); got.Topic != "outbox.{aggregate_type}" || got.ErrorCode != "invalid_topic" {
		t.Errorf("invalid-topic letter: topic %q, code %q", got.Topic, got.ErrorCode)
	}
}

// TestEnsureConcurrent: relays starting at the same moment on one database
// each create the dead-letter tables when missing; every Ensure succeeds
// (without the advisory lock, concurrent CREATE TABLE IF NOT EXISTS fails one
// of them on pg_type's unique index).
func TestEnsureConcurrent(t *testing.T) {
	for round := range 5 {
		table := "public." + unique(fmt.Sprint("dl_race", round))
		errs := make([]error, 4)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = deadletter.NewStore(pool, table).Ensure(t.Context())
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d, relay %d: Ensure: %v", round, i, err)
			}
		}
	}
}
