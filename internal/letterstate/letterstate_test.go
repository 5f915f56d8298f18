package letterstate

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
)

// TestPolicyFailed: what a letter whose attempt failed becomes.
func TestPolicyFailed(t *testing.T) {
	p := Policy{Budget: 3, MaxAge: time.Hour, Retry: backoff.Policy{Base: time.Second, Cap: 4 * time.Second}}
	boom := errors.New("boom")
	recent, old := time.Now().Add(-time.Minute), time.Now().Add(-2*time.Hour)
	for _, tc := range []struct {
		name      string
		p         Policy
		was       string
		attempts  int
		first     time.Time
		permanent bool
		to        string
		maxWait   time.Duration // RetryWait: the backoff's ceiling for this attempt
		detail    string
	}{
		{"first failure waits", p, Pending, 0, recent, false, RetryWait, time.Second, "boom"},
		{"second failure waits longer", p, RetryWait, 1, recent, false, RetryWait, 2 * time.Second, "boom"},
		{"budget spent", p, RetryWait, 2, recent, false, Dead, 0, "retry budget spent (3 attempts): boom"},
		{"too old", p, RetryWait, 0, old, false, Dead, 0, "first failed more than 1h0m0s ago"},
		{"permanent", p, Pending, 0, recent, true, Dead, 0, "permanent failure: boom"},
		{"dead stays dead", p, Dead, 0, recent, false, Dead, 0, "boom"},
		{"no budget never dies", Policy{Retry: p.Retry}, RetryWait, 100, old, false, RetryWait, 4 * time.Second, "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := 0; i < 50; i++ {
				to, wait, detail := tc.p.Failed(tc.was, tc.attempts, tc.first, tc.permanent, boom)
				if to != tc.to || !strings.Contains(detail, tc.detail) {
					t.Fatalf("Failed = %s, %q; want %s, %q", to, detail, tc.to, tc.detail)
				}
				if wait < 0 || wait >= max(tc.maxWait, 1) || (to != RetryWait && wait != 0) {
					t.Fatalf("wait %v, want in [0, %v)", wait, tc.maxWait)
				}
			}
		})
	}
}

func TestSQLList(t *testing.T) {
	if got, want := SQLList("replayed"), `'pending', 'processing', 'retry_wait', 'completed', 'dead', 'replayed'`; got != want {
		t.Errorf("SQLList = %s, want %s", got, want)
	}
}

func TestLeaseMillis(t *testing.T) {
	for _, tc := range []struct {
		d, def time.Duration
		want   int64
	}{{0, time.Minute, 60000}, {time.Microsecond, time.Minute, 1}, {1500 * time.Millisecond, time.Minute, 1500}} {
		if got := (Lease{Duration: tc.d}).Millis(tc.def); got != tc.want {
			t.Errorf("Lease{%v}.Millis(%v) = %d, want %d", tc.d, tc.def, got, tc.want)
		}
	}
}
