// Package waitlog says in the log that the relay is waiting for a dependency
// (Postgres, the Kafka brokers, a topic), so a start against an address where
// nothing answers is never silent. A wait that ends within First logs
// nothing; a longer one logs one line at First saying what is awaited and
// where, then a progress line at growing intervals (Progress, doubled each
// time up to MaxProgress) with the attempts so far and the last error, and a
// line when the dependency answers. The caller's error when it gives up
// carries Wait.Summary, so the final error says the same.
package waitlog

import (
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// The cadence of the lines: the first after First, the next Progress later,
// then at doubling intervals up to MaxProgress.
const (
	First       = time.Second
	Progress    = 4 * time.Second
	MaxProgress = time.Minute
)

// Wait is one wait on a dependency. Its methods are safe for concurrent use.
// Done must be called when the wait ends, however it ends.
type Wait struct {
	log         zerolog.Logger
	what, where string
	hint        string
	start       time.Time
	first, next time.Duration // First and Progress, shorter in tests
	stop        chan struct{}
	stopped     chan struct{}
	once        sync.Once

	mu       sync.Mutex
	attempts int   // failed attempts so far
	last     error // the last attempt's error
	logged   bool  // the first line was written
}

// Start begins a wait for what (e.g. "Kafka brokers") at where (an address
// with no password, e.g. "k1:9092,k2:9092"); hint, if not empty, says what
// to check or how long the wait lasts (e.g. "check the brokers kafka.brokers;
// gives up after 30s"). Nothing is logged unless the
// wait lasts First.
func Start(log zerolog.Logger, what, where, hint string) *Wait {
	return start(log, what, where, hint, First, Progress)
}

func start(log zerolog.Logger, what, where, hint string, first, next time.Duration) *Wait {
	w := &Wait{log: log, what: what, where: where, hint: hint, start: time.Now(), first: first, next: next,
		stop: make(chan struct{}), stopped: make(chan struct{})}
	go w.watch()
	return w
}

// Failed records a failed attempt and its error.
func (w *Wait) Failed(err error) {
	w.mu.Lock()
	w.attempts++
	w.last = err
	w.mu.Unlock()
}

// Done ends the wait. When the wait was logged and ok, it logs that the
// dependency answered; when not ok the caller reports the failure (with
// Summary). Calling Done again does nothing.
func (w *Wait) Done(ok bool) {
	w.once.Do(func() {
		close(w.stop)
		<-w.stopped
		w.mu.Lock()
		logged, attempts := w.logged, w.attempts
		w.mu.Unlock()
		if logged && ok {
			w.log.Info().Str("waiting_for", w.what).Str("at", w.where).Int("failed_attempts", attempts).
				Str("waited", round(time.Since(w.start)).String()).
				Msgf("%s at %s answered after %s", w.what, w.where, round(time.Since(w.start)))
		}
	})
}

// Logged reports whether the wait lasted long enough to be logged.
func (w *Wait) Logged() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.logged
}

// Summary says how long the wait lasted and how many attempts failed, for
// the error of a wait given up: "waited 30s for Kafka brokers at k:9092, 12
// failed attempts".
func (w *Wait) Summary() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Sprintf("waited %s for %s at %s, %s", round(time.Since(w.start)), w.what, w.where, attemptsText(w.attempts))
}

// watch writes the first line after First and the progress lines until Done.
func (w *Wait) watch() {
	defer close(w.stopped)
	t := time.NewTimer(w.first)
	defer t.Stop()
	next := w.next
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		w.mu.Lock()
		first := !w.logged
		w.logged = true
		attempts, last := w.attempts, w.last
		w.mu.Unlock()
		elapsed := round(time.Since(w.start))
		ev := w.log.Warn().Str("waiting_for", w.what).Str("at", w.where).Int("failed_attempts", attempts).Str("waited", elapsed.String())
		if last != nil {
			ev = ev.AnErr("last_error", last)
		}
		if first {
			msg := fmt.Sprintf("waiting for %s at %s", w.what, w.where)
			if w.hint != "" {
				msg += " (" + w.hint + ")"
			}
			ev.Msg(msg)
		} else {
			ev.Msgf("still waiting for %s at %s after %s, %s", w.what, w.where, elapsed, attemptsText(attempts))
		}
		t.Reset(next)
		next = min(2*next, MaxProgress)
	}
}

func attemptsText(n int) string {
	switch n {
	case 0:
		return "the first attempt still unanswered"
	case 1:
		return "1 failed attempt"
	}
	return fmt.Sprintf("%d failed attempts", n)
}

// round keeps durations readable in messages: 1.2s, 35s, 2m5s.
func round(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}
