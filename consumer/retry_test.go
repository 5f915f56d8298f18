package consumer

import (
	"strings"
	"testing"
	"time"
)

// simulate runs the retry loop of one message whose handler always fails
// transiently and takes work per attempt, and returns the attempts made, the
// delays waited, and when (after the first failure) the last attempt
// started.
func simulate(p RetryPolicy, work time.Duration) (attempts int, delays []time.Duration, lastStart time.Duration) {
	elapsed := time.Duration(0) // since the first failure
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			elapsed += work // the attempt ran and failed
		}
		d, ok := p.next(attempt, elapsed)
		if !ok {
			return attempt, delays, lastStart
		}
		delays = append(delays, d)
		elapsed += d
		lastStart = elapsed
	}
}

func TestRetryPolicyBounds(t *testing.T) {
	tests := []struct {
		name   string
		policy RetryPolicy
		work   time.Duration
		// wantAttempts: exact attempts when the time budget cannot bind; 0
		// when it binds (then only the bound is checked).
		wantAttempts int
	}{
		{"attempts bind", RetryPolicy{Base: time.Millisecond, Cap: 10 * time.Millisecond, MaxAttempts: 4, MaxTotal: time.Hour}, 0, 4},
		{"one attempt: no retry", RetryPolicy{Base: time.Millisecond, Cap: time.Millisecond, MaxAttempts: 1, MaxTotal: time.Hour}, 0, 1},
		{"defaults", DefaultRetryPolicy, 0, 5},
		{"time binds", RetryPolicy{Base: 100 * time.Millisecond, Cap: time.Second, MaxAttempts: 1000, MaxTotal: 3 * time.Second}, 0, 0},
		{"time binds, slow handler", RetryPolicy{Base: 10 * time.Millisecond, Cap: 100 * time.Millisecond, MaxAttempts: 1000, MaxTotal: 2 * time.Second}, 150 * time.Millisecond, 0},
		{"cap equals base", RetryPolicy{Base: 50 * time.Millisecond, Cap: 50 * time.Millisecond, MaxAttempts: 10, MaxTotal: time.Hour}, 0, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.policy.withDefaults()
			if err := p.validate(); err != nil {
				t.Fatal(err)
			}
			for trial := 0; trial < 500; trial++ {
				attempts, delays, lastStart := simulate(p, tc.work)
				if attempts > p.MaxAttempts {
					t.Fatalf("trial %d: %d attempts, more than MaxAttempts %d", trial, attempts, p.MaxAttempts)
				}
				if tc.wantAttempts != 0 && attempts != tc.wantAttempts {
					t.Fatalf("trial %d: %d attempts, want %d", trial, attempts, tc.wantAttempts)
				}
				if lastStart > p.MaxTotal {
					t.Fatalf("trial %d: the last attempt started %v after the first failure, beyond MaxTotal %v", trial, lastStart, p.MaxTotal)
				}
				for n, d := range delays {
					if ceil := p.jitter().Ceiling(n); d < 0 || d >= ceil || d > p.Cap {
						t.Fatalf("trial %d: wait %d = %v, outside [0, min(Cap, Base·2^%d) = %v)", trial, n, d, n, ceil)
					}
				}
			}
		})
	}
}

// TestRetryPolicyFullJitter checks the waits are spread over the whole range
// [0, ceiling), not around the exponential value: the mark of full jitter.
func TestRetryPolicyFullJitter(t *testing.T) {
	p := RetryPolicy{Base: 100 * time.Millisecond, Cap: 800 * time.Millisecond, MaxAttempts: 100, MaxTotal: time.Hour}.withDefaults()
	for _, attempt := range []int{1, 3, 6} {
		ceil := p.jitter().Ceiling(attempt - 1)
		low, high := 0, 0
		for i := 0; i < 2000; i++ {
			d, ok := p.next(attempt, 0)
			if !ok {
				t.Fatalf("attempt %d: budget used up", attempt)
			}
			if d < ceil/10 {
				low++
			}
			if d > ceil*9/10 {
				high++
			}
		}
		// Uniform: about 10% each; 2% would be a broken spread.
		if low < 40 || high < 40 {
			t.Errorf("attempt %d (ceiling %v): %d waits below 10%% and %d above 90%% of 2000, want about 200 each", attempt, ceil, low, high)
		}
	}
}

func TestRetryPolicyValidate(t *testing.T) {
	tests := []struct {
		name    string
		policy  RetryPolicy
		wantErr string
	}{
		{"zero is the default", RetryPolicy{}, ""},
		{"negative base", RetryPolicy{Base: -1}, "must not be negative"},
		{"negative attempts", RetryPolicy{MaxAttempts: -1}, "must not be negative"},
		{"negative total", RetryPolicy{MaxTotal: -time.Second}, "must not be negative"},
		{"cap below base", RetryPolicy{Base: time.Second, Cap: time.Millisecond}, "Cap must not be below Base"},
		{"cap below the default base", RetryPolicy{Cap: time.Millisecond}, "Cap must not be below Base"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.policy.withDefaults().validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("validate = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
	if got := (RetryPolicy{}).withDefaults(); got != DefaultRetryPolicy {
		t.Errorf("zero policy with defaults = %+v, want %+v", got, DefaultRetryPolicy)
	}
}
