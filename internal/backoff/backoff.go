// Package backoff computes retry delays: exponential backoff with full jitter,
// sleep = rand(0, min(cap, base·2^attempt)).
//
// It is written here rather than taken from a library because the well-kept Go
// backoff libraries implement "randomization factor" jitter around the exponential
// value, not full jitter, and full jitter is what spreads many relays' retries best
// after a shared broker outage. The whole algorithm is a few lines.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Policy is an exponential backoff with full jitter.
type Policy struct {
	Base time.Duration // first ceiling; doubled every attempt
	Cap  time.Duration // largest ceiling
}

// Default is the policy used when none is configured: 100ms doubling up to 30s.
var Default = Policy{Base: 100 * time.Millisecond, Cap: 30 * time.Second}

// Ceiling is min(Cap, Base·2^attempt), the upper bound of attempt's delay.
func (p Policy) Ceiling(attempt int) time.Duration {
	base, limit := p.Base, p.Cap
	if base <= 0 {
		base = Default.Base
	}
	if limit < base {
		limit = base
	}
	d := base
	for i := 0; i < attempt && d < limit; i++ {
		d *= 2
	}
	if d > limit {
		d = limit
	}
	return d
}

// Delay returns a random delay in [0, Ceiling(attempt)).
func (p Policy) Delay(attempt int) time.Duration {
	c := p.Ceiling(attempt)
	return time.Duration(rand.Int64N(int64(c)))
}

// Sleep waits for Delay(attempt) or until ctx is done, returning ctx.Err() then.
func (p Policy) Sleep(ctx context.Context, attempt int) error {
	return SleepFor(ctx, p.Delay(attempt))
}

// SleepFor waits d or until ctx is done, returning ctx.Err() then.
func SleepFor(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
