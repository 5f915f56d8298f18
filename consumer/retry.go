package consumer

import (
	"errors"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
)

// DefaultRetryPolicy is the policy of a Config whose Retry fields are zero:
// up to 5 attempts within 30 s, waiting rand(0, min(5s, 100ms·2^n)) between them.
var DefaultRetryPolicy = RetryPolicy{
	Base:        100 * time.Millisecond,
	Cap:         5 * time.Second,
	MaxAttempts: 5,
	MaxTotal:    30 * time.Second,
}

// RetryPolicy bounds the retries of a message whose handler fails
// transiently: exponential backoff with full jitter, the n-th wait (n from 0)
// a random duration in [0, min(Cap, Base·2^n)), and a budget in attempts and
// in time. When either runs out, the message is dead-lettered with
// CodeRetriesExhausted.
//
// Only handler failures count: when the consumer's own database cannot begin
// a transaction or record the claim, the consumer waits for it with the same
// backoff without end (the message is not at fault), and that time is not
// part of MaxTotal. So an outage of the consumer's database delays messages
// but does not dead-letter them; an outage of something the handler calls
// does, after the budget: alert on cdc_relay_consumer_dead_letters_total and
// reprocess after the fix.
type RetryPolicy struct {
	// Base is the first wait's ceiling, doubled every attempt; 0 means
	// DefaultRetryPolicy.Base.
	Base time.Duration
	// Cap is the largest ceiling; 0 means DefaultRetryPolicy.Cap.
	Cap time.Duration
	// MaxAttempts is how many times the handler is called for a message in
	// all, the first time included (1: never retry); 0 means
	// DefaultRetryPolicy.MaxAttempts.
	MaxAttempts int
	// MaxTotal bounds the time from the first failure to the start of the
	// last attempt: no attempt starts later; 0 means
	// DefaultRetryPolicy.MaxTotal.
	MaxTotal time.Duration
}

// withDefaults fills zero fields from DefaultRetryPolicy.
func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.Base == 0 {
		p.Base = DefaultRetryPolicy.Base
	}
	if p.Cap == 0 {
		p.Cap = DefaultRetryPolicy.Cap
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultRetryPolicy.MaxAttempts
	}
	if p.MaxTotal == 0 {
		p.MaxTotal = DefaultRetryPolicy.MaxTotal
	}
	return p
}

// validate reports a negative field or a Cap below Base (after defaults).
func (p RetryPolicy) validate() error {
	switch {
	case p.Base < 0 || p.Cap < 0 || p.MaxAttempts < 0 || p.MaxTotal < 0:
		return errors.New("field Retry: Base, Cap, MaxAttempts and MaxTotal must not be negative (0 means the default)")
	case p.Cap < p.Base:
		return errors.New("field Retry: Cap must not be below Base")
	}
	return nil
}

// jitter is the full-jitter backoff of p.
func (p RetryPolicy) jitter() backoff.Policy {
	return backoff.Policy{Base: p.Base, Cap: p.Cap}
}

// next is called after attempt (from 1) failed transiently, elapsed after the
// first failure. It returns how long to wait before attempt+1, or false when
// the budget is used up: attempt was the last of MaxAttempts, or attempt+1
// would start more than MaxTotal after the first failure. p has its defaults.
func (p RetryPolicy) next(attempt int, elapsed time.Duration) (time.Duration, bool) {
	if attempt >= p.MaxAttempts {
		return 0, false
	}
	d := p.jitter().Delay(attempt - 1)
	if elapsed+d > p.MaxTotal {
		return 0, false
	}
	return d, true
}
