package deadletter_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// bulk adds n letters b-0000… with code to s in one statement, last failed an
// hour ago.
func bulk(t *testing.T, s *deadletter.Store, n int, code, topic string) []int64 {
	t.Helper()
	_, err := pool.Exec(t.Context(), `INSERT INTO `+quote(s.Table())+` (event_id, message_key, payload, topic, error_code,
    error_message, first_failed_at, last_failed_at)
SELECT 'b-' || lpad(i::text, 4, '0'), 'k'::bytea, '{}'::bytea, $2, $3, 'boom', now() - interval '1 hour', now() - interval '1 hour'
FROM generate_series(1, $1) i`, n, topic, code)
	if err != nil {
		t.Fatal(err)
	}
	all, err := s.List(t.Context(), deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, len(all))
	for i, l := range all {
		ids[i] = l.ID
	}
	return ids
}

// TestClaimIsExclusive: goroutines claiming the same letters at the same time,
// page by page as replays do (Claim) and oldest due first as the automatic
// retries do (ClaimDue), never get the same letter, and together get every one.
func TestClaimIsExclusive(t *testing.T) {
	const letters, workers = 300, 4
	tests := []struct {
		name  string
		claim func(ctx context.Context, s *deadletter.Store, l deadletter.Lease, ids []int64) ([]deadletter.Letter, bool, error)
	}{
		{"Claim, pages of 25 in id order", func(ctx context.Context, s *deadletter.Store, l deadletter.Lease, ids []int64) ([]deadletter.Letter, bool, error) {
			var got []deadletter.Letter
			for page := range slices.Chunk(ids, 25) {
				c, err := s.Claim(ctx, l, page, false)
				if err != nil {
					return nil, false, err
				}
				got = append(got, c...)
			}
			return got, true, nil // one pass over every id
		}},
		{"ClaimDue, 7 at a time", func(ctx context.Context, s *deadletter.Store, l deadletter.Lease, _ []int64) ([]deadletter.Letter, bool, error) {
			c, err := s.ClaimDue(ctx, l, []string{"message_too_large"}, time.Minute, 7)
			return c, len(c) == 0, err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			ids := bulk(t, s, letters, "message_too_large", "t")
			var mu sync.Mutex
			owner := map[int64]string{} // letter → the worker that claimed it
			var dup []string
			var wg sync.WaitGroup
			start := make(chan struct{})
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					lease := deadletter.Lease{Owner: fmt.Sprintf("worker %d", w), Duration: time.Minute}
					<-start
					for {
						got, done, err := tt.claim(t.Context(), s, lease, ids)
						if err != nil {
							errs <- err
							return
						}
						mu.Lock()
						for _, l := range got {
							if prev, ok := owner[l.ID]; ok {
								dup = append(dup, fmt.Sprintf("letter %d: %s and %s", l.ID, prev, lease.Owner))
							}
							owner[l.ID] = lease.Owner
							if l.Status != deadletter.StatusProcessing || l.ClaimedBy != lease.Owner || l.ClaimedUntil == nil {
								dup = append(dup, fmt.Sprintf("letter %d claimed as %+v", l.ID, l))
							}
						}
						mu.Unlock()
						if done {
							return
						}
					}
				}()
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if len(dup) > 0 {
				t.Fatalf("letters claimed twice or wrongly: %v", dup)
			}
			if len(owner) != letters {
				t.Errorf("%d letters claimed, want %d", len(owner), letters)
			}
			per := map[string]int{}
			for _, o := range owner {
				per[o]++
			}
			t.Logf("claims per worker: %v", per)
			ts, err := s.ListTransitions(t.Context(), deadletter.TransitionFilter{})
			if err != nil {
				t.Fatal(err)
			}
			if len(ts) != letters {
				t.Errorf("%d transitions recorded, want one per claim (%d)", len(ts), letters)
			}
			for _, tr := range ts {
				if tr.From != deadletter.StatusPending || tr.To != deadletter.StatusProcessing || tr.Owner != owner[tr.DeadLetterID] {
					t.Errorf("transition %+v, want pending → processing by %s", tr, owner[tr.DeadLetterID])
					break
				}
			}
		})
	}
}

// TestClaimLeaseExpiry: a claim holds its letter until the lease expires
// (Renew extends it); then another owner takes it over, which the
// transitions say, and the old owner can no longer end the claim, except by
// completing the letter (it is in Kafka).
func TestClaimLeaseExpiry(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	ids := bulk(t, s, 2, "message_too_large", "t")
	a := deadletter.Lease{Owner: "replay A", Duration: 800 * time.Millisecond, ReplayID: 0}
	b := deadletter.Lease{Owner: "replay B", Duration: time.Minute}

	got, err := s.Claim(ctx, a, ids, false)
	if err != nil || len(got) != 2 {
		t.Fatalf("A claims %d letters, %v; want 2", len(got), err)
	}
	if again, err := s.Claim(ctx, b, ids, true); err != nil || len(again) != 0 {
		t.Fatalf("B claims %d letters held by A (even forced), %v; want none", len(again), err)
	}
	if due, err := s.ClaimDue(ctx, b, []string{"message_too_large"}, 0, 10); err != nil || len(due) != 0 {
		t.Fatalf("B's ClaimDue takes %d letters held by A, %v; want none", len(due), err)
	}
	before := *got[0].ClaimedUntil
	if n, err := s.Renew(ctx, a); err != nil || n != 2 {
		t.Fatalf("Renew = %d, %v; want 2", n, err)
	}
	if l, _ := s.Get(ctx, ids[0]); l.ClaimedUntil == nil || !l.ClaimedUntil.After(before) {
		t.Errorf("Renew left claimed_until at %v (was %v)", l.ClaimedUntil, before)
	}

	// A stops renewing (it died): B takes both over once the lease expired.
	var taken []deadletter.Letter
	testenv.Eventually(t, 10*time.Second, func() error {
		c, err := s.Claim(ctx, b, ids, false)
		if err != nil {
			t.Fatal(err)
		}
		if taken = append(taken, c...); len(taken) < 2 {
			return fmt.Errorf("B took %d letters over", len(taken))
		}
		return nil
	})
	ts, err := s.ListTransitions(ctx, deadletter.TransitionFilter{DeadLetterIDs: ids[:1]})
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || ts[1].From != deadletter.StatusProcessing || ts[1].Owner != "replay B" ||
		!strings.Contains(ts[1].Detail, "took over: the lease of replay A expired at") {
		t.Errorf("transitions of a taken-over letter: %+v", ts)
	}

	// A wakes up: it cannot put B's letter back, but it may complete it.
	if err := s.SettleForTest(ctx, a, ids[0], deadletter.StatusRetryWait, true); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.Get(ctx, ids[0]); l.Status != deadletter.StatusProcessing || l.ClaimedBy != "replay B" || l.Attempts != 0 {
		t.Errorf("after the old owner's failure: %s by %q, %d attempts; want still processing by replay B", l.Status, l.ClaimedBy, l.Attempts)
	}
	if err := s.SettleForTest(ctx, a, ids[0], deadletter.StatusCompleted, true); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.Get(ctx, ids[0]); l.Status != deadletter.StatusCompleted || l.ClaimedBy != "" || l.ReplayCount != 1 {
		t.Errorf("after the old owner's completion: %s by %q, replay_count %d", l.Status, l.ClaimedBy, l.ReplayCount)
	}
	// B releases the other one untried: back to pending, no attempt counted.
	if err := s.SettleForTest(ctx, b, ids[1], deadletter.StatusPending, false); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.Get(ctx, ids[1]); l.Status != deadletter.StatusPending || l.ClaimedBy != "" || l.ClaimedUntil != nil || l.Attempts != 0 {
		t.Errorf("released letter: %+v", l)
	}
}

// TestClaimWhichStatuses: what Claim and ClaimDue take, by status.
func TestClaimWhichStatuses(t *testing.T) {
	ctx := t.Context()
	s := newStore(t)
	tbl := quote(s.Table())
	ids := bulk(t, s, 7, "message_too_large", "t")
	other := letter("other-code", "empty_key", "A", "T", time.Now().Add(-time.Hour))
	mustAdd(t, s, other)
	set := func(id int64, sql string) {
		if _, err := pool.Exec(ctx, "UPDATE "+tbl+" SET "+sql+" WHERE id = $1", id); err != nil {
			t.Fatal(err)
		}
	}
	// ids[0] pending, failed an hour ago
	set(ids[1], "status = 'retry_wait', next_attempt_at = now() - interval '1 second'")
	set(ids[2], "status = 'retry_wait', next_attempt_at = now() + interval '1 hour'")
	set(ids[3], "status = 'completed'")
	set(ids[4], "status = 'dead'")
	set(ids[5], "status = 'processing', claimed_by = 'gone', claimed_until = now() - interval '1 second'")
	set(ids[6], "last_failed_at = now()") // pending, just failed
	statusOf := func(ls []deadletter.Letter) map[int64]string {
		m := map[int64]string{}
		for _, l := range ls {
			m[l.ID] = l.Status
		}
		return m
	}

	due, err := s.ClaimDue(ctx, deadletter.Lease{Owner: "auto"}, []string{"message_too_large", "empty_key"}, time.Minute, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, l := range due {
		got = append(got, l.ID)
	}
	otherID := byEventID(t, s, "other-code").ID
	// Due: pending for a minute (ids[0], other-code), retry_wait past its
	// time (ids[1]), an expired lease (ids[5]); oldest due first.
	if want := []int64{ids[0], ids[5], ids[1], otherID}; !sameSet(got, want) {
		t.Errorf("ClaimDue took %v, want %v (ids %v)", got, want, ids)
	}
	for _, l := range due {
		set(l.ID, "status = 'pending', claimed_by = NULL, claimed_until = NULL")
	}
	set(ids[5], "status = 'processing', claimed_by = 'gone', claimed_until = now() - interval '1 second'")
	set(ids[1], "status = 'retry_wait'")

	all := append(slices.Clone(ids), otherID)
	claimed, err := s.Claim(ctx, deadletter.Lease{Owner: "replay"}, all, false)
	if err != nil {
		t.Fatal(err)
	}
	// A replay takes everything but completed letters, even retry_wait before
	// its time and dead ones.
	if m := statusOf(claimed); len(m) != 7 || slices.Contains(idsOf(claimed), ids[3]) {
		t.Errorf("Claim took %v, want all but the completed %d", idsOf(claimed), ids[3])
	}
	set(ids[3], "status = 'completed'")
	forced, err := s.Claim(ctx, deadletter.Lease{Owner: "forced"}, ids[3:4], true)
	if err != nil || len(forced) != 1 {
		t.Errorf("forced Claim of a completed letter: %d, %v", len(forced), err)
	}
}

func idsOf(ls []deadletter.Letter) []int64 {
	out := make([]int64, len(ls))
	for i, l := range ls {
		out[i] = l.ID
	}
	return out
}

func sameSet(a, b []int64) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestUpgradeFromV1: tables made by the migration of the versions before the
// state model, with letters replayed and not, keep working: Upgrade (the
// read-only commands) and Ensure (the relay) add the columns and the
// transitions table and call replayed letters completed; the migration file
// itself does the same on an old table; Upgrade creates nothing where there is
// no table.
func TestUpgradeFromV1(t *testing.T) {
	ctx := t.Context()
	v1, err := os.ReadFile("testdata/005_dead_letters_v1.sql")
	if err != nil {
		t.Fatal(err)
	}
	current, err := os.ReadFile("../../" + deadletter.MigrationFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, how := range []string{"Upgrade", "Ensure", "migration file"} {
		t.Run(how, func(t *testing.T) {
			name := unique("dl_v1")
			rename := func(sql []byte) string { return strings.ReplaceAll(string(sql), "cdc_relay_dead_letters", name) }
			if err := pg.Exec(ctx, testDB, rename(v1)); err != nil {
				t.Fatalf("create v1 tables: %v", err)
			}
			if err := pg.Exec(ctx, testDB, `INSERT INTO public.`+name+` (event_id, payload, topic, error_code, error_message,
    first_failed_at, last_failed_at, status, replayed_at, replay_count)
VALUES ('old-pending', '{}', 't', 'message_too_large', 'm', now(), now(), 'pending', NULL, 0),
       ('old-replayed', '{}', 't', 'message_too_large', 'm', now(), now(), 'replayed', now(), 1)`); err != nil {
				t.Fatal(err)
			}
			s := deadletter.NewStore(pool, "public."+name)
			switch how {
			case "Upgrade":
				err = s.Upgrade(ctx)
			case "Ensure":
				err = s.Ensure(ctx)
			default:
				err = pg.Exec(ctx, testDB, rename(current))
			}
			if err != nil {
				t.Fatalf("%s on v1 tables: %v", how, err)
			}
			var raw string
			if err := pool.QueryRow(ctx, "SELECT status FROM public."+name+" WHERE event_id = 'old-replayed'").Scan(&raw); err != nil || raw != "completed" {
				t.Errorf("the replayed row's status is %q (%v), want completed", raw, err)
			}
			got, err := s.List(ctx, deadletter.Filter{Status: deadletter.StatusCompleted})
			if err != nil || len(got) != 1 || got[0].EventID != "old-replayed" || got[0].ReplayCount != 1 {
				t.Errorf("completed letters after the upgrade: %+v, %v", got, err)
			}
			// The new model works on the upgraded tables.
			claimed, err := s.Claim(ctx, deadletter.Lease{Owner: "t"}, idsOf(mustList(t, s)), false)
			if err != nil || len(claimed) != 1 || claimed[0].EventID != "old-pending" {
				t.Fatalf("Claim on upgraded tables: %+v, %v", claimed, err)
			}
			if err := s.SettleForTest(ctx, deadletter.Lease{Owner: "t"}, claimed[0].ID, deadletter.StatusDead, true); err != nil {
				t.Fatalf("settle to dead on upgraded tables: %v", err)
			}
			// An older relay still running during the upgrade may write 'replayed'.
			if err := pg.Exec(ctx, testDB, "UPDATE public."+name+" SET status = 'replayed' WHERE event_id = 'old-pending'"); err != nil {
				t.Errorf("the upgraded table refuses an older version's 'replayed': %v", err)
			}
			if l := byEventID(t, s, "old-pending"); l.Status != deadletter.StatusCompleted {
				t.Errorf("a 'replayed' row reads as %q, want completed", l.Status)
			}
			counts, err := s.StatusCounts(ctx)
			if err != nil || counts[deadletter.StatusCompleted] != 2 || len(counts) != len(deadletter.Statuses) {
				t.Errorf("StatusCounts = %v, %v", counts, err)
			}
			// Current now: Ensure has nothing left to do, twice.
			for range 2 {
				if err := s.Ensure(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}

	t.Run("Upgrade creates no table", func(t *testing.T) {
		s := deadletter.NewStore(pool, "public."+unique("dl_absent"))
		if err := s.Upgrade(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := s.List(ctx, deadletter.Filter{}); err == nil || !strings.Contains(err.Error(), deadletter.MigrationFile) {
			t.Errorf("List after Upgrade on no table: %v; want the missing table named", err)
		}
	})
}

func mustList(t *testing.T, s *deadletter.Store) []deadletter.Letter {
	t.Helper()
	ls, err := s.List(t.Context(), deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return ls
}
