package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// failingSaver is a store whose writes fail while fail is set, then go to a
// real FileStore.
type failingSaver struct {
	*FileStore
	fail error
}

func (s *failingSaver) Save(ctx context.Context, c Checkpoint) error {
	if s.fail != nil {
		return s.fail
	}
	return s.FileStore.Save(ctx, c)
}

func newTestCommitter(t *testing.T, start pglogrepl.LSN) (*Committer, *failingSaver, *metrics.Metrics, *sandbox.Buffer) {
	t.Helper()
	store := &failingSaver{FileStore: NewFileStore(filepath.Join(t.TempDir(), "ck.json"))}
	m := metrics.New(prometheus.NewRegistry())
	logs := &sandbox.Buffer{}
	c := NewCommitter(CommitterConfig{
		Store: store, Start: start, Base: Checkpoint{Slot: "s", SystemID: "1", RelayName: "r"},
		Every: 10 * time.Millisecond, Idle: time.Hour, Logger: zerolog.New(logs), Metrics: m,
	})
	return c, store, m, logs
}

// TestCommitterConfirmsOnlyPersisted: Flushed moves only once Kafka
// acknowledged every event up to a position and the store holds it; a failed
// save leaves it where it was.
func TestCommitterConfirmsOnlyPersisted(t *testing.T) {
	ctx := context.Background()
	c, store, m, _ := newTestCommitter(t, 100)
	tr := c.Tracker()
	seq := tr.Begin()
	tr.Add(seq, 2)
	tr.Commit(seq, 200, time.Now())
	if lsn, err := c.Save(ctx); err != nil || lsn != 100 || c.Flushed() != 100 {
		t.Fatalf("Save with nothing acknowledged = %s, %v; Flushed %s; want 0/64 (the start)", lsn, err, c.Flushed())
	}
	tr.Ack(seq, 1)
	if lsn, _ := c.Save(ctx); lsn != 100 {
		t.Fatalf("Save with one of two events acknowledged = %s, want the start", lsn)
	}
	tr.Ack(seq, 1)
	store.fail = errors.New("disk full")
	if _, err := c.Save(ctx); err == nil || c.Flushed() != 100 {
		t.Fatalf("failed Save = %v, Flushed %s; want an error and the start", err, c.Flushed())
	}
	if v := testutil.ToFloat64(m.CheckpointErrors); v != 1 {
		t.Errorf("checkpoint_errors_total = %v, want 1", v)
	}
	store.fail = nil
	if lsn, err := c.Save(ctx); err != nil || lsn != 200 || c.Flushed() != 200 {
		t.Fatalf("Save = %s, %v; Flushed %s; want 0/C8", lsn, err, c.Flushed())
	}
	got, ok, err := store.Load(ctx, "s")
	if err != nil || !ok || got.LSN != 200 || got.RelayName != "r" {
		t.Fatalf("stored %+v, %v, %v; want LSN 0/C8 of relay r", got, ok, err)
	}
}

// TestCommitterReportsAnomalies: a misuse of the tracker shows in the metric
// and in one log line, however many follow.
func TestCommitterReportsAnomalies(t *testing.T) {
	c, _, m, logs := newTestCommitter(t, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	c.Tracker().Ack(999, 1) // never begun
	testenv.Eventually(t, 5*time.Second, func() error {
		if v := testutil.ToFloat64(m.TrackerAnomalies); v != 1 {
			return errors.New("tracker_anomalies_total not 1 yet")
		}
		return nil
	})
	c.Tracker().Ack(998, 1)
	c.Tracker().Ack(997, 1)
	testenv.Eventually(t, 5*time.Second, func() error {
		if v := testutil.ToFloat64(m.TrackerAnomalies); v != 3 {
			return errors.New("tracker_anomalies_total not 3 yet")
		}
		return nil
	})
	if n := strings.Count(logs.String(), "acknowledgement accounting saw a misuse"); n != 1 {
		t.Errorf("%d anomaly log lines, want 1:\n%s", n, logs.String())
	}
}

// TestCommitterFinish: the final save confirms the persisted position, and
// nothing is confirmed when the save fails.
func TestCommitterFinish(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, fail := range []bool{false, true} {
		c, store, _, _ := newTestCommitter(t, 100)
		tr := c.Tracker()
		seq := tr.Begin()
		tr.Add(seq, 1)
		tr.Commit(seq, 300, time.Now())
		tr.Ack(seq, 1)
		if fail {
			store.fail = errors.New("read-only")
		}
		var confirmed []pglogrepl.LSN
		lsn := c.Finish(ctx, time.Now().Add(time.Second), func(_ context.Context, l pglogrepl.LSN) error {
			confirmed = append(confirmed, l)
			return nil
		})
		switch {
		case !fail && (lsn != 300 || len(confirmed) != 1 || confirmed[0] != 300):
			t.Errorf("Finish = %s, confirmed %v; want 0/12C once", lsn, confirmed)
		case fail && (lsn != 100 || len(confirmed) != 0):
			t.Errorf("Finish with a failing store = %s, confirmed %v; want the start, nothing confirmed", lsn, confirmed)
		}
	}
}

// offsetsAt are the offsets a test's CommitterConfig.Offsets returns for lsn:
// derived from it, so a stored checkpoint shows whether its offsets were
// taken at its own LSN.
func offsetsAt(lsn pglogrepl.LSN) Offsets {
	return Offsets{"orders": {Partitions: 2, Next: map[int32]int64{0: int64(lsn), 1: int64(lsn) + 1}}}
}

// TestCommitterOffsets: with CommitterConfig.Offsets every save stores what it
// returns for the LSN being saved, called only when there is something to
// save and never concurrently with itself; without it, none are stored, even
// when Base carries some.
func TestCommitterOffsets(t *testing.T) {
	_, dbURL := newTestDB(t)
	pool := newPool(t, dbURL)
	newStore := func(t *testing.T) *TableStore {
		s := NewTableStore(pool, "public.ckpt_"+strings.ToLower(strings.NewReplacer("/", "_", " ", "_", ",", "").Replace(t.Name())))
		if err := s.Ensure(t.Context()); err != nil {
			t.Fatalf("Ensure: %v", err)
		}
		return s
	}
	// ack commits one transaction of one event ending at lsn and acknowledges it.
	ack := func(tr *Tracker, lsn pglogrepl.LSN) {
		seq := tr.Begin()
		tr.Add(seq, 1)
		tr.Commit(seq, lsn, time.Now())
		tr.Ack(seq, 1)
	}
	base := Checkpoint{Slot: "s", SystemID: "1", RelayName: "r",
		Offsets: Offsets{"stale": {Partitions: 1, Next: map[int32]int64{0: 1}}}}

	tests := []struct {
		name string
		run  func(t *testing.T, s *TableStore)
	}{
		{"each save stores the offsets of its LSN", func(t *testing.T, s *TableStore) {
			ctx := t.Context()
			var calls []pglogrepl.LSN
			c := NewCommitter(CommitterConfig{Store: s, Base: base, Start: 100, Every: time.Hour, Idle: time.Hour,
				Offsets: func(lsn pglogrepl.LSN) Offsets {
					calls = append(calls, lsn)
					return offsetsAt(lsn)
				}})
			if _, err := c.Save(ctx); err != nil || len(calls) != 0 {
				t.Fatalf("Save with nothing to save = %v, Offsets called with %v; want no call", err, calls)
			}
			for _, lsn := range []pglogrepl.LSN{200, 300} {
				ack(c.Tracker(), lsn)
				if got, err := c.Save(ctx); err != nil || got != lsn {
					t.Fatalf("Save = %s, %v; want %s", got, err, lsn)
				}
				want := base
				want.LSN, want.Offsets = lsn, offsetsAt(lsn)
				stored, ok, err := s.Load(ctx, "s")
				if err != nil || !ok || stored.LSN != lsn || !reflect.DeepEqual(stored.Offsets, want.Offsets) {
					t.Fatalf("stored %+v, %v, %v; want LSN %s with offsets %v", stored, ok, err, lsn, want.Offsets)
				}
			}
			if !slices.Equal(calls, []pglogrepl.LSN{200, 300}) {
				t.Errorf("Offsets called with %v, want [0/C8 0/12C]", calls)
			}
		}},
		{"nil stores none", func(t *testing.T, s *TableStore) {
			ctx := t.Context()
			c := NewCommitter(CommitterConfig{Store: s, Base: base, Start: 100, Every: time.Hour, Idle: time.Hour})
			ack(c.Tracker(), 200)
			if _, err := c.Save(ctx); err != nil {
				t.Fatal(err)
			}
			if stored, ok, err := s.Load(ctx, "s"); err != nil || !ok || stored.LSN != 200 || stored.Offsets != nil {
				t.Fatalf("stored %+v, %v, %v; want LSN 0/C8 and no offsets", stored, ok, err)
			}
		}},
		{"never called concurrently", func(t *testing.T, s *TableStore) {
			ctx, cancel := context.WithCancel(t.Context())
			var inside, overlaps, calls atomic.Int64
			c := NewCommitter(CommitterConfig{Store: s, Base: base, Start: 100, Every: time.Millisecond, Idle: time.Hour,
				Offsets: func(lsn pglogrepl.LSN) Offsets {
					if inside.Add(1) > 1 {
						overlaps.Add(1)
					}
					defer inside.Add(-1)
					calls.Add(1)
					return offsetsAt(lsn)
				}})
			var wg sync.WaitGroup
			wg.Go(func() { c.Run(ctx) })
			const savers, acks = 4, 50
			for range savers {
				wg.Go(func() {
					for ctx.Err() == nil {
						_, _ = c.Save(ctx)
					}
				})
			}
			for i := range acks {
				ack(c.Tracker(), pglogrepl.LSN(1000+i))
			}
			testenv.Eventually(t, 10*time.Second, func() error {
				if f := c.Flushed(); f != 1000+acks-1 {
					return fmt.Errorf("flushed %s, want the last LSN acknowledged", f)
				}
				return nil
			})
			cancel()
			wg.Wait()
			if n := overlaps.Load(); n != 0 {
				t.Errorf("Offsets entered %d times while already running (of %d calls)", n, calls.Load())
			}
			stored, _, err := s.Load(t.Context(), "s")
			if err != nil || !reflect.DeepEqual(stored.Offsets, offsetsAt(stored.LSN)) {
				t.Fatalf("stored %+v, %v; want the offsets of its own LSN", stored, err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, newStore(t)) })
	}
}

// TestCommitterOldestUnrelayed: the gauge and the stored checkpoint carry the
// commit time of the oldest transaction with an unacknowledged event, also
// while the watermark is stuck behind it (refreshed every Idle), and none
// once everything is acknowledged.
func TestCommitterOldestUnrelayed(t *testing.T) {
	store := &failingSaver{FileStore: NewFileStore(filepath.Join(t.TempDir(), "ck.json"))}
	m := metrics.New(prometheus.NewRegistry())
	c := NewCommitter(CommitterConfig{
		Store: store, Start: 100, Base: Checkpoint{Slot: "s", SystemID: "1"},
		Every: 5 * time.Millisecond, Idle: 20 * time.Millisecond, Logger: zerolog.Nop(), Metrics: m,
	})
	tr := c.Tracker()
	if _, ok := tr.OldestPending(); ok {
		t.Fatal("OldestPending with nothing tracked reports a transaction")
	}
	old := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	first := tr.BeginAt(old)
	tr.Add(first, 1)
	tr.Commit(first, 200, old)
	second := tr.BeginAt(time.Now())
	tr.Add(second, 1)
	if at, ok := tr.OldestPending(); !ok || !at.Equal(old) {
		t.Fatalf("OldestPending = %s, %v; want the first transaction's %s", at, ok, old)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testenv.Eventually(t, 10*time.Second, func() error {
		if v := testutil.ToFloat64(m.OldestUnrelayedAge); v < 59 || v > 120 {
			return fmt.Errorf("oldest_unrelayed_event_age_seconds = %v, want about 60", v)
		}
		cp, ok, err := store.Load(ctx, "s")
		if err != nil || !ok || !cp.OldestUnrelayed.Equal(old) || cp.LSN != 100 {
			return fmt.Errorf("stored %+v, %v, %v: want oldest_unrelayed_at %s at the start LSN (the watermark is stuck)", cp, ok, err, old)
		}
		return nil
	})

	tr.Ack(first, 1)
	tr.Ack(second, 1)
	tr.Commit(second, 300, time.Now())
	testenv.Eventually(t, 10*time.Second, func() error {
		if v := testutil.ToFloat64(m.OldestUnrelayedAge); v != 0 {
			return fmt.Errorf("oldest_unrelayed_event_age_seconds = %v, want 0 with nothing waiting", v)
		}
		cp, ok, err := store.Load(ctx, "s")
		if err != nil || !ok || !cp.OldestUnrelayed.IsZero() || cp.LSN != 300 {
			return fmt.Errorf("stored %+v, %v, %v: want LSN 0/12C and no oldest unrelayed", cp, ok, err)
		}
		return nil
	})
}

// TestCommitterStoresAStuckOldestAtOnce: while the watermark is stuck behind
// an unacknowledged event, its commit time is stored at the next tick, not
// at the next Idle refresh (an hour here), so that cdc-relay status, which
// reads the store, does not say "nothing waits" during an outage; also when
// keepalives had moved the watermark past the stored LSN just before.
func TestCommitterStoresAStuckOldestAtOnce(t *testing.T) {
	for _, idleAdvance := range []bool{false, true} {
		t.Run(fmt.Sprintf("idle advance %v", idleAdvance), func(t *testing.T) {
			store := &failingSaver{FileStore: NewFileStore(filepath.Join(t.TempDir(), "ck.json"))}
			c := NewCommitter(CommitterConfig{
				Store: store, Start: 100, Base: Checkpoint{Slot: "s", SystemID: "1"},
				Every: 5 * time.Millisecond, Idle: time.Hour, Logger: zerolog.Nop(), Metrics: metrics.Discard(),
			})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); c.Run(ctx) }()
			defer func() { cancel(); <-done }()
			if err := c.Persist(ctx); err != nil { // a row with nothing waiting
				t.Fatal(err)
			}
			tr := c.Tracker()
			if idleAdvance && !tr.Idle(150, time.Now()) {
				t.Fatal("Idle did not move the watermark")
			}
			at := time.Now().Truncate(time.Microsecond)
			txn := tr.BeginAt(at)
			tr.Add(txn, 1)
			tr.Commit(txn, 200, at)
			testenv.Eventually(t, 10*time.Second, func() error {
				cp, ok, err := store.Load(ctx, "s")
				if err != nil || !ok || !cp.OldestUnrelayed.Equal(at) {
					return fmt.Errorf("stored %+v, %v, %v: want oldest_unrelayed_at %s", cp, ok, err, at)
				}
				return nil
			})
		})
	}
}

// TestCommitterConfirmsWhatReplicaHolds: with a Replica (the checkpoint as
// the standby the slot is on holds it), Flushed is the persisted watermark
// only once the replica holds it too, and never past what was persisted;
// a replica that cannot be read keeps Flushed where it was. The replica is
// a second FileStore, "replayed" by copying the primary's checkpoint into it.
func TestCommitterConfirmsWhatReplicaHolds(t *testing.T) {
	ctx := context.Background()
	primary := NewFileStore(filepath.Join(t.TempDir(), "primary.json"))
	standby := &failingSaver{FileStore: NewFileStore(filepath.Join(t.TempDir(), "standby.json"))}
	logs := &sandbox.Buffer{}
	base := Checkpoint{Slot: "s", SystemID: "1", RelayName: "r"}
	c := NewCommitter(CommitterConfig{
		Store: primary, Replica: replicaLoader{standby}, Start: 100, Base: base,
		Every: 10 * time.Millisecond, Idle: time.Hour, Logger: zerolog.New(logs),
	})
	replay := func() {
		t.Helper()
		cp, ok, err := primary.Load(ctx, "s")
		if err != nil || !ok {
			t.Fatalf("load the primary's checkpoint: %v, %v", ok, err)
		}
		if err := standby.FileStore.Save(ctx, cp); err != nil {
			t.Fatal(err)
		}
	}
	ack := func(end pglogrepl.LSN) {
		tr := c.Tracker()
		seq := tr.Begin()
		tr.Add(seq, 1)
		tr.Commit(seq, end, time.Now())
		tr.Ack(seq, 1)
		if _, err := c.Save(ctx); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name string
		do   func()
		want pglogrepl.LSN
	}{
		{"nothing read yet", func() {}, 0},
		{"the replica holds no checkpoint", func() { _ = c.Refresh(ctx) }, 0},
		{"the replica replayed the start", func() {
			if err := c.Persist(ctx); err != nil {
				t.Fatal(err)
			}
			replay()
			_ = c.Refresh(ctx)
		}, 100},
		{"persisted on the primary only", func() { ack(200); _ = c.Refresh(ctx) }, 100},
		{"the replica replayed it", func() { replay(); _ = c.Refresh(ctx) }, 200},
		{"the replica cannot be read", func() { ack(300); replay(); standby.fail = errors.New("standby down"); _ = c.Refresh(ctx) }, 200},
		{"the replica can be read again", func() { standby.fail = nil; _ = c.Refresh(ctx) }, 300},
	}
	for _, s := range steps {
		s.do()
		if got := c.Flushed(); got != s.want {
			t.Fatalf("%s: Flushed %s, want %s", s.name, got, s.want)
		}
	}
	if n := strings.Count(logs.String(), "cannot read the checkpoint on the standby"); n != 1 {
		t.Errorf("%d warnings about the unreadable replica, want 1:\n%s", n, logs)
	}
	// Finish confirms what the replica holds, not the persisted watermark.
	ack(400)
	var confirmed pglogrepl.LSN
	c.Finish(ctx, time.Now().Add(time.Second), func(_ context.Context, lsn pglogrepl.LSN) error { confirmed = lsn; return nil })
	if confirmed != 300 {
		t.Errorf("Finish confirmed %s, want 0/12C (what the replica holds)", confirmed)
	}
}

// replicaLoader reads a failingSaver, failing while its fail is set.
type replicaLoader struct{ s *failingSaver }

func (r replicaLoader) Load(ctx context.Context, slot string) (Checkpoint, bool, error) {
	if r.s.fail != nil {
		return Checkpoint{}, false, r.s.fail
	}
	return r.s.Load(ctx, slot)
}

// standbys stands for a primary and the standbys of its
// synchronized_standby_slots as CommitterConfig.Standbys reads them: the
// test moves the WAL end and what they flushed, or has them follow the WAL
// end (streaming, caught up at every read).
type standbys struct {
	mu              sync.Mutex
	slots           string
	walEnd, flushed pglogrepl.LSN
	follow          bool
	fail            error
}

func (s *standbys) set(f func(s *standbys)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *standbys) read(context.Context) (StandbyFlush, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return StandbyFlush{}, s.fail
	}
	if s.follow {
		s.flushed = s.walEnd
	}
	return StandbyFlush{WALEnd: s.walEnd, Slots: s.slots, Flushed: s.flushed}, nil
}

// TestCommitterConfirmsWhatStandbysFlushed: with Standbys (a failover slot
// whose checkpoint is a table on the same server), Flushed is a persisted
// watermark only once the standbys have flushed the WAL past its write,
// while the standbys lag it goes in steps, never backwards; a failed read
// keeps it where it was; without standbys named a save is confirmable at
// once; Finish waits for the standbys, briefly, and says when they did not
// flush the last checkpoint.
func TestCommitterConfirmsWhatStandbysFlushed(t *testing.T) {
	ctx := context.Background()
	sb := &standbys{slots: "sb1"}
	logs := &sandbox.Buffer{}
	c := NewCommitter(CommitterConfig{
		Store: NewFileStore(filepath.Join(t.TempDir(), "ck.json")), Standbys: sb.read, Start: 100,
		Base: Checkpoint{Slot: "s", SystemID: "1", RelayName: "r"}, Every: 10 * time.Millisecond, Idle: time.Hour, Logger: zerolog.New(logs),
	})
	// ack saves a watermark at end, whose write ends before walEnd.
	ack := func(end, walEnd pglogrepl.LSN) {
		t.Helper()
		tr := c.Tracker()
		seq := tr.Begin()
		tr.Add(seq, 1)
		tr.Commit(seq, end, time.Now())
		tr.Ack(seq, 1)
		if _, err := c.Save(ctx); err != nil {
			t.Fatal(err)
		}
		sb.set(func(s *standbys) { s.walEnd = walEnd })
	}
	flushed := func(lsn pglogrepl.LSN) func() {
		return func() { sb.set(func(s *standbys) { s.flushed = lsn }); _ = c.Refresh(ctx) }
	}
	steps := []struct {
		name string
		do   func()
		want pglogrepl.LSN
	}{
		{"nothing read yet", func() {}, 0},
		{"the start's write not flushed", func() { sb.set(func(s *standbys) { s.walEnd = 150 }); flushed(120)() }, 0},
		{"the start's write flushed", flushed(150), 100},
		{"a save not flushed", func() { ack(200, 250); flushed(150)() }, 100},
		{"another save, none flushed", func() { ack(300, 350); flushed(150)() }, 100},
		// The newest save replaces 300 among those waiting: 200 is
		// confirmed when its write is flushed, then 400.
		{"the oldest waiting flushed", func() { ack(400, 450); flushed(260)() }, 200},
		{"the newest flushed", flushed(450), 400},
		{"the standbys cannot be read", func() {
			ack(500, 550)
			sb.set(func(s *standbys) { s.fail = errors.New("primary down") })
			_ = c.Refresh(ctx)
		}, 400},
		{"none named: confirmable at once", func() {
			sb.set(func(s *standbys) { s.fail, s.slots = nil, "" })
			_ = c.Refresh(ctx)
		}, 500},
		{"none named: a save too, before any read", func() { ack(600, 650) }, 600},
		{"named again: not back", func() { sb.set(func(s *standbys) { s.slots = "sb1" }); flushed(10)() }, 600},
		{"named again: a save waits", func() { ack(700, 750); flushed(10)() }, 600},
	}
	for _, s := range steps {
		s.do()
		if got := c.Flushed(); got != s.want {
			t.Fatalf("%s: Flushed %s, want %s", s.name, got, s.want)
		}
	}
	if n := strings.Count(logs.String(), "cannot read how far the standbys"); n != 1 {
		t.Errorf("%d warnings about the unreadable standbys, want 1:\n%s", n, logs)
	}
	// 700 waits: once it has waited standbyHoldWarning, that is said once,
	// and again when the standbys have flushed it.
	const holds, again = "have not flushed the relay's checkpoint", "have flushed the checkpoint: the slot is confirmed again"
	c.rmu.Lock()
	c.heldSince = time.Now().Add(-standbyHoldWarning)
	c.rmu.Unlock()
	flushed(10)()
	flushed(20)()
	if n := strings.Count(logs.String(), holds); n != 1 {
		t.Errorf("%d warnings that the standbys hold the checkpoint back, want 1:\n%s", n, logs)
	}
	if flushed(750)(); c.Flushed() != 700 || !strings.Contains(logs.String(), again) {
		t.Errorf("Flushed %s once the standbys flushed 0/2EE, want 0/2BC and a line saying so:\n%s", c.Flushed(), logs)
	}
	finish := func() pglogrepl.LSN {
		t.Helper()
		var confirmed pglogrepl.LSN
		c.Finish(ctx, time.Now().Add(time.Minute), func(_ context.Context, lsn pglogrepl.LSN) error { confirmed = lsn; return nil })
		return confirmed
	}
	// Standbys that stream: Finish confirms the last checkpoint.
	ack(800, 850)
	sb.set(func(s *standbys) { s.follow = true })
	if got := finish(); got != 800 {
		t.Errorf("Finish with streaming standbys confirmed %s, want 0/320", got)
	}
	// Standbys cut off: Finish gives up on them, confirms what they
	// flushed, and says so.
	sb.set(func(s *standbys) { s.follow = false })
	ack(900, 950)
	began := time.Now()
	if got := finish(); got != 800 {
		t.Errorf("Finish with standbys cut off confirmed %s, want 0/320 (what they flushed)", got)
	}
	if took := time.Since(began); took < standbyFinishWait || took > standbyFinishWait+5*time.Second {
		t.Errorf("Finish waited %s for the standbys, want about %s", took, standbyFinishWait)
	}
	if !strings.Contains(logs.String(), "stopping with the slot confirmed behind the checkpoint") {
		t.Errorf("no warning that the slot stays behind the checkpoint:\n%s", logs)
	}
}
