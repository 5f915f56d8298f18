package testenv

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// fatalRecorder is a testing.TB whose Fatalf records the message instead of
// ending the test, so Eventually's failure can be checked.
type fatalRecorder struct {
	testing.TB
	msgs []string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

func TestEventually(t *testing.T) {
	t.Parallel()
	t.Run("returns once the condition holds", func(t *testing.T) {
		t.Parallel()
		r := &fatalRecorder{TB: t}
		calls := 0
		Eventually(r, 10*time.Second, func() error {
			if calls++; calls < 5 {
				return fmt.Errorf("call %d", calls)
			}
			return nil
		})
		if calls != 5 || len(r.msgs) != 0 {
			t.Errorf("%d calls, failures %q; want 5 calls and no failure", calls, r.msgs)
		}
	})
	t.Run("fails with the last error after the timeout", func(t *testing.T) {
		t.Parallel()
		r := &fatalRecorder{TB: t}
		start := time.Now()
		calls := 0
		var last time.Time
		Eventually(r, 200*time.Millisecond, func() error {
			calls++
			last = time.Now()
			return errors.New("still waiting")
		})
		if len(r.msgs) != 1 || !strings.Contains(r.msgs[0], "still waiting") || !strings.Contains(r.msgs[0], "200ms") {
			t.Errorf("failures %q; want one naming the timeout and the last error", r.msgs)
		}
		// Checked at the start and once more when the time is up.
		if calls < 2 || last.Sub(start) < 200*time.Millisecond {
			t.Errorf("condition checked %d times, last %v after the start; want a last check at or after the 200ms timeout", calls, last.Sub(start))
		}
	})
}
