package testenv

import (
	"testing"
	"time"
)

// Poll intervals of Eventually: the first retry comes quickly, later ones
// back off so that an expensive condition (a query, a child process, a Kafka
// read) does not load a busy machine.
const (
	pollFirst = 10 * time.Millisecond
	pollMax   = 100 * time.Millisecond
)

// Eventually calls cond until it returns nil and fails t with cond's last
// error if that has not happened within timeout. It is how tests wait for a
// condition instead of sleeping for a while and hoping it holds by then.
//
// cond runs on the calling goroutine (Eventually must be called from the
// test's goroutine), so it may call t.Fatal itself to give up at once, for
// example when the process under test has exited. cond is called at least
// once, and once more after timeout passed if it was still failing.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	if err := Within(timeout, cond); err != nil {
		t.Fatalf("condition not met within %v: %v", timeout, err)
	}
}

// Within is Eventually for a test that goes on, or skips, when the
// condition is not met: it polls cond as Eventually does and returns nil
// once cond does, or cond's last error when timeout passed.
func Within(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for wait := pollFirst; ; wait = min(2*wait, pollMax) {
		err := cond()
		if err == nil {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return err
		}
		time.Sleep(min(wait, left))
	}
}
