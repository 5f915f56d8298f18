package checkpoint

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// step is one call on a Tracker, or one check of its state, in a scripted scenario.
type step struct {
	name string
	do   func(t *testing.T, tr *Tracker)
}

func begin(want uint64) step {
	return step{"begin", func(t *testing.T, tr *Tracker) {
		t.Helper()
		if got := tr.Begin(); got != want {
			t.Fatalf("Begin() = %d, want %d", got, want)
		}
	}}
}

func add(seq uint64, n int) step {
	return step{"add", func(_ *testing.T, tr *Tracker) { tr.Add(seq, n) }}
}

// at is the commit time the tests give the transaction ending at end: a second
// per LSN unit after a fixed epoch, so times follow LSNs.
func at(end pglogrepl.LSN) time.Time {
	return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(end) * time.Second)
}

func commit(seq uint64, end pglogrepl.LSN) step {
	return step{"commit", func(_ *testing.T, tr *Tracker) { tr.Commit(seq, end, at(end)) }}
}

// commitAt commits with an explicit commit time (for out-of-order clocks).
func commitAt(seq uint64, end pglogrepl.LSN, when time.Time) step {
	return step{"commit", func(_ *testing.T, tr *Tracker) { tr.Commit(seq, end, when) }}
}

// delivered checks Delivered.
func delivered(want uint64) step {
	return step{"delivered", func(t *testing.T, tr *Tracker) {
		t.Helper()
		if got := tr.Delivered(); got != want {
			t.Fatalf("Delivered() = %d, want %d", got, want)
		}
	}}
}

// pos checks Position: the watermark and its commit time.
func pos(lsn pglogrepl.LSN, when time.Time) step {
	return step{"position", func(t *testing.T, tr *Tracker) {
		t.Helper()
		gotLSN, gotAt := tr.Position()
		if gotLSN != lsn || !gotAt.Equal(when) {
			t.Fatalf("Position() = %s, %s; want %s, %s", gotLSN, gotAt, lsn, when)
		}
	}}
}

func ack(seq uint64, n int) step {
	return step{"ack", func(_ *testing.T, tr *Tracker) { tr.Ack(seq, n) }}
}

func reset(start pglogrepl.LSN) step {
	return step{"reset", func(_ *testing.T, tr *Tracker) { tr.Reset(start) }}
}

func idle(walEnd pglogrepl.LSN, want bool) step {
	return step{"idle", func(t *testing.T, tr *Tracker) {
		t.Helper()
		if got := tr.Idle(walEnd, at(walEnd)); got != want {
			t.Fatalf("Idle(%s) = %v, want %v", walEnd, got, want)
		}
	}}
}

func wm(want pglogrepl.LSN) step {
	return step{"watermark", func(t *testing.T, tr *Tracker) {
		t.Helper()
		if got := tr.Watermark(); got != want {
			t.Fatalf("Watermark() = %s, want %s", got, want)
		}
	}}
}

func inFlight(txns, events int) step {
	return step{"inflight", func(t *testing.T, tr *Tracker) {
		t.Helper()
		if gt, ge := tr.InFlight(); gt != txns || ge != events {
			t.Fatalf("InFlight() = (%d, %d), want (%d, %d)", gt, ge, txns, events)
		}
	}}
}

func anomalies(want uint64) step {
	return step{"anomalies", func(t *testing.T, tr *Tracker) {
		t.Helper()
		got, last := tr.Anomalies()
		if got != want {
			t.Fatalf("Anomalies() = %d (last: %v), want %d", got, last, want)
		}
		if (last != nil) != (want > 0) {
			t.Fatalf("Anomalies() last = %v with count %d", last, got)
		}
	}}
}

func TestTracker(t *testing.T) {
	tests := []struct {
		name  string
		start pglogrepl.LSN
		steps []step
	}{
		{
			name:  "in-order acks",
			start: 100,
			steps: []step{
				begin(0), add(0, 2), commit(0, 200), wm(100),
				ack(0, 1), wm(100), ack(0, 1), wm(200),
				begin(1), add(1, 1), commit(1, 300), ack(1, 1), wm(300),
				inFlight(0, 0), anomalies(0),
			},
		},
		{
			name:  "later txn acked first waits, then jumps",
			start: 100,
			steps: []step{
				begin(0), add(0, 1), commit(0, 200),
				begin(1), add(1, 2), commit(1, 300),
				begin(2), add(2, 1), commit(2, 400),
				ack(1, 2), ack(2, 1), wm(100), inFlight(3, 1),
				ack(0, 1), wm(400), inFlight(0, 0), anomalies(0),
			},
		},
		{
			name:  "partial acks hold the watermark",
			start: 100,
			steps: []step{
				begin(0), add(0, 3), add(0, 2), commit(0, 200),
				ack(0, 1), ack(0, 3), wm(100), inFlight(1, 1),
				ack(0, 1), wm(200), inFlight(0, 0),
			},
		},
		{
			name:  "acks before commit",
			start: 100,
			steps: []step{
				begin(0), add(0, 2), ack(0, 2), wm(100), inFlight(1, 0),
				commit(0, 200), wm(200), inFlight(0, 0),
			},
		},
		{
			name:  "empty txns count as acked",
			start: 100,
			steps: []step{
				begin(0), wm(100), commit(0, 150), wm(150),
				begin(1), add(1, 1), commit(1, 200),
				begin(2), commit(2, 250), wm(150),
				ack(1, 1), wm(250), anomalies(0),
			},
		},
		{
			name:  "open txn holds later closed txns",
			start: 100,
			steps: []step{
				begin(0), add(0, 1),
				begin(1), commit(1, 300), wm(100),
				ack(0, 1), wm(100), commit(0, 200), wm(300),
			},
		},
		{
			name:  "idle with open txn does nothing",
			start: 100,
			steps: []step{
				begin(0), idle(500, false), wm(100),
			},
		},
		{
			name:  "idle with unacked committed txn does nothing",
			start: 100,
			steps: []step{
				begin(0), add(0, 1), commit(0, 200), idle(500, false), wm(100),
				ack(0, 1), wm(200),
			},
		},
		{
			name:  "idle when drained advances",
			start: 100,
			steps: []step{
				idle(100, false), idle(50, false), idle(500, true), wm(500),
				begin(0), add(0, 1), commit(0, 600), ack(0, 1), wm(600),
				idle(700, true), wm(700), idle(650, false), wm(700),
			},
		},
		{
			name:  "position carries the watermark's commit time",
			start: 100,
			steps: []step{
				pos(100, time.Time{}),
				begin(0), add(0, 1), commit(0, 200),
				begin(1), add(1, 1), commit(1, 300),
				ack(1, 1), pos(100, time.Time{}), // txn 1 acked first: not the watermark yet
				ack(0, 1), pos(300, at(300)),
				idle(400, true), pos(400, at(400)), // an idle advance takes the keepalive's server time
				// The server's clock stepped back: the time follows it, since commits
				// after the watermark carry the stepped-back clock too.
				begin(2), add(2, 1), commitAt(2, 500, at(100)), ack(2, 1), pos(500, at(100)),
				// Acked out of order, the time is still the watermark transaction's.
				begin(3), add(3, 1), commitAt(3, 600, at(600)),
				begin(4), add(4, 1), commitAt(4, 700, at(650)),
				ack(4, 1), pos(500, at(100)), ack(3, 1), pos(700, at(650)),
				delivered(5),
				// Empty transactions and idle advances move the watermark, not Delivered.
				begin(5), commit(5, 800), pos(800, at(800)), idle(900, true), delivered(5),
			},
		},
		{
			name:  "commit end below an earlier one keeps the max",
			start: 100,
			steps: []step{
				begin(0), commit(0, 300), wm(300),
				begin(1), add(1, 1), commit(1, 200), anomalies(1), ack(1, 1), wm(300),
				begin(2), commit(2, 400), wm(400),
			},
		},
		{
			name:  "reset forgets in-flight, keeps seqs and the max watermark",
			start: 100,
			steps: []step{
				begin(0), add(0, 1), commit(0, 200), ack(0, 1), wm(200),
				begin(1), add(1, 5), commit(1, 300), inFlight(1, 5),
				reset(150), wm(200), inFlight(0, 0),
				ack(1, 5), wm(200), anomalies(1),
				begin(2), add(2, 1), commit(2, 180), ack(2, 1), wm(200), anomalies(1), // redelivered
				begin(3), add(3, 1), commit(3, 250), ack(3, 1), wm(250),
				reset(400), wm(400),
				begin(4), commit(4, 450), wm(450), anomalies(1),
			},
		},
		{
			name:  "misuse is ignored and counted",
			start: 100,
			steps: []step{
				ack(0, 1), add(0, 1), commit(0, 200), anomalies(3), // never begun
				begin(0), add(0, 1), ack(0, 2), anomalies(4), // more than added: ignored whole
				ack(0, -1), add(0, -1), anomalies(6),
				commit(0, 200), commit(0, 300), anomalies(7), wm(100),
				ack(0, 1), wm(200), ack(0, 1), anomalies(8), // already confirmed
				ack(0, 0), add(5, 0), anomalies(8), inFlight(0, 0),
			},
		},
		{
			name:  "add after commit holds the watermark",
			start: 100,
			steps: []step{
				begin(0), add(0, 1), commit(0, 200), add(0, 1), anomalies(1),
				ack(0, 1), wm(100), ack(0, 1), wm(200),
			},
		},
		{
			name:  "ring grows past its initial size",
			start: 0,
			steps: func() []step {
				var s []step
				for i := uint64(0); i < 1000; i++ {
					s = append(s, begin(i), add(i, 1), commit(i, pglogrepl.LSN(10*(i+1))))
				}
				for i := uint64(999); i > 0; i-- {
					s = append(s, ack(i, 1))
				}
				return append(s, wm(0), inFlight(1000, 1), ack(0, 1), wm(10000), inFlight(0, 0), anomalies(0))
			}(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(tt.start)
			for i, s := range tt.steps {
				t.Logf("step %d: %s", i, s.name)
				s.do(t, tr)
			}
		})
	}
}

func TestTrackerWaitDrained(t *testing.T) {
	tr := NewTracker(0)
	ctx := context.Background()
	if err := tr.WaitDrained(ctx); err != nil {
		t.Fatalf("WaitDrained on an empty tracker: %v", err)
	}

	seq := tr.Begin()
	tr.Add(seq, 2)
	done, waiting := startWaitDrained(t, tr)
	tr.Ack(seq, 1)
	// One event is still unacked: the waiter's channel stays open, so it
	// has not returned, nor can it without another ack.
	select {
	case <-waiting:
		t.Fatal("Ack with one event left woke WaitDrained")
	case err := <-done:
		t.Fatalf("WaitDrained returned %v with one event unacked", err)
	default:
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := tr.WaitDrained(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitDrained with unacked events = %v, want deadline exceeded", err)
	}
	tr.Ack(seq, 1) // drained although the txn is still open
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WaitDrained: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitDrained did not return after the last ack")
	}

	tr.Add(seq, 1)
	done, _ = startWaitDrained(t, tr)
	tr.Reset(0)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WaitDrained after Reset: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitDrained did not return after Reset")
	}
}

// startWaitDrained calls WaitDrained on a new goroutine and returns once that
// call waits: when it made the channel the tracker closes once drained (and
// returns that channel), so what the caller does next wakes a waiter rather
// than meeting a late call on a drained tracker.
func startWaitDrained(t *testing.T, tr *Tracker) (<-chan error, <-chan struct{}) {
	t.Helper()
	tr.mu.Lock()
	left := tr.drained != nil
	tr.mu.Unlock()
	if left {
		t.Fatal("a WaitDrained channel is left over: a new waiter would not show")
	}
	done := make(chan error, 1)
	go func() { done <- tr.WaitDrained(context.Background()) }()
	var ch chan struct{}
	testenv.Eventually(t, 5*time.Second, func() error {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if ch = tr.drained; ch == nil {
			return errors.New("WaitDrained is not waiting yet")
		}
		return nil
	})
	return done, ch
}

// shadowTxn is the test's own record of one transaction, written before the Tracker
// is told, so that it is never behind what the Tracker knows.
type shadowTxn struct {
	added     int
	end       pglogrepl.LSN
	committed atomic.Bool
	acked     atomic.Int64
}

// TestTrackerConcurrent acks random partitions of events from many goroutines while the
// replication side keeps opening and committing transactions, and checks at every
// observed point that the watermark is not past the first transaction that the shadow
// model does not yet see as committed and fully acknowledged.
func TestTrackerConcurrent(t *testing.T) {
	const (
		txns    = 3000
		ackers  = 8
		maxSize = 20
		start   = pglogrepl.LSN(1 << 32)
	)
	rng := rand.New(rand.NewPCG(1, 2))
	shadow := make([]shadowTxn, txns)
	for i := range shadow {
		shadow[i].added = rng.IntN(maxSize + 1) // some transactions are empty
		shadow[i].end = start + pglogrepl.LSN(100*(i+1))
	}

	type chunk struct {
		seq uint64
		n   int
	}
	tr := NewTracker(start)
	work := make([]chan chunk, ackers)
	for i := range work {
		work[i] = make(chan chunk, 64)
	}

	var wg sync.WaitGroup
	for i := range ackers {
		wg.Add(1)
		go func(in <-chan chunk, seed uint64) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, 7))
			var held []chunk // acked in random order, a few at a time
			flush := func(keep int) {
				for len(held) > keep {
					j := r.IntN(len(held))
					c := held[j]
					held[j] = held[len(held)-1]
					held = held[:len(held)-1]
					shadow[c.seq].acked.Add(int64(c.n))
					tr.Ack(c.seq, c.n)
				}
			}
			for c := range in {
				held = append(held, c)
				flush(r.IntN(4))
			}
			flush(0)
		}(work[i], uint64(i))
	}

	stop := make(chan struct{})
	var observations atomic.Int64
	observerErr := make(chan error, 1)
	go func() {
		cursor := 0 // shadow[:cursor] are all committed and fully acked
		// Observe first, then wait: on a busy machine the whole run can end
		// before a first wait would, and one observation is still owed.
		for ; ; observations.Add(1) {
			if observations.Load() > 0 {
				select {
				case <-stop:
					observerErr <- nil
					return
				case <-time.After(time.Millisecond):
				}
			}
			w := tr.Watermark()
			for cursor < txns && shadow[cursor].committed.Load() &&
				shadow[cursor].acked.Load() == int64(shadow[cursor].added) {
				cursor++
			}
			limit := start
			if cursor > 0 {
				limit = shadow[cursor-1].end
			}
			if w > limit {
				observerErr <- errors.New("watermark " + w.String() + " past " + limit.String() +
					", the end of the last transaction before the first unfinished one")
				return
			}
		}
	}()

	for i := range shadow {
		seq := tr.Begin()
		if seq != uint64(i) {
			t.Fatalf("Begin() = %d, want %d", seq, i)
		}
		// Add everything first, then hand out random partitions; commit at a random
		// point so that some acks arrive before the commit.
		tr.Add(seq, shadow[i].added)
		commitAfter := rng.IntN(3)
		left := shadow[i].added
		for k := 0; left > 0; k++ {
			if k == commitAfter {
				shadow[i].committed.Store(true)
				tr.Commit(seq, shadow[i].end, at(shadow[i].end))
			}
			n := 1 + rng.IntN(left)
			left -= n
			work[rng.IntN(ackers)] <- chunk{seq, n}
		}
		if !shadow[i].committed.Load() {
			shadow[i].committed.Store(true)
			tr.Commit(seq, shadow[i].end, at(shadow[i].end))
		}
	}
	for _, c := range work {
		close(c)
	}
	wg.Wait()
	if err := tr.WaitDrained(context.Background()); err != nil {
		t.Fatalf("WaitDrained: %v", err)
	}
	close(stop)
	if err := <-observerErr; err != nil {
		t.Fatal(err)
	}

	if got, want := tr.Watermark(), shadow[txns-1].end; got != want {
		t.Errorf("final Watermark() = %s, want %s", got, want)
	}
	if gt, ge := tr.InFlight(); gt != 0 || ge != 0 {
		t.Errorf("final InFlight() = (%d, %d), want (0, 0)", gt, ge)
	}
	if n, last := tr.Anomalies(); n != 0 {
		t.Errorf("Anomalies() = %d, last: %v", n, last)
	}
	if observations.Load() == 0 {
		t.Error("the observer never checked the watermark")
	}
	t.Logf("%d observations", observations.Load())
}

// BenchmarkTrackerAddAck measures the per-event cost: one Add and one Ack per event,
// ten events per transaction.
func BenchmarkTrackerAddAck(b *testing.B) {
	tr := NewTracker(0)
	const perTxn = 10
	b.ReportAllocs()
	var seq uint64
	for i := 0; b.Loop(); i++ {
		if i%perTxn == 0 {
			seq = tr.Begin()
		}
		tr.Add(seq, 1)
		tr.Ack(seq, 1)
		if i%perTxn == perTxn-1 {
			tr.Commit(seq, pglogrepl.LSN(i), at(pglogrepl.LSN(i)))
		}
	}
}

// BenchmarkTrackerAckParallel measures acknowledgements of single events from several
// goroutines at once, all into one large transaction.
func BenchmarkTrackerAckParallel(b *testing.B) {
	tr := NewTracker(0)
	seq := tr.Begin()
	tr.Add(seq, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tr.Ack(seq, 1)
		}
	})
	b.StopTimer()
	tr.Commit(seq, 1, at(1))
	if got := tr.Watermark(); got != 1 {
		b.Fatalf("Watermark() = %s after acking every event, want 0/1", got)
	}
}
