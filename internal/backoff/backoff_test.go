package backoff

import (
	"context"
	"testing"
	"time"
)

func TestCeiling(t *testing.T) {
	p := Policy{Base: 100 * time.Millisecond, Cap: 2 * time.Second}
	tests := []struct {
		attempt int
		want    time.Duration
	}{
		{0, 100 * time.Millisecond},
		{1, 200 * time.Millisecond},
		{2, 400 * time.Millisecond},
		{4, 1600 * time.Millisecond},
		{5, 2 * time.Second},
		{60, 2 * time.Second},
		{1 << 20, 2 * time.Second},
	}
	for _, tt := range tests {
		if got := p.Ceiling(tt.attempt); got != tt.want {
			t.Errorf("Ceiling(%d) = %v, want %v", tt.attempt, got, tt.want)
		}
	}
}

func TestCeilingDefaults(t *testing.T) {
	if got := (Policy{}).Ceiling(0); got != Default.Base {
		t.Fatalf("zero policy ceiling = %v, want %v", got, Default.Base)
	}
	if got := (Policy{Base: time.Second, Cap: time.Millisecond}).Ceiling(3); got != time.Second {
		t.Fatalf("cap below base: ceiling = %v, want base", got)
	}
}

// TestDelayBoundsAndSpread checks full jitter: every delay is in [0, ceiling) and
// the delays spread over the whole range rather than clustering near the ceiling.
func TestDelayBoundsAndSpread(t *testing.T) {
	p := Policy{Base: 10 * time.Millisecond, Cap: time.Second}
	for _, attempt := range []int{0, 3, 10} {
		ceil := p.Ceiling(attempt)
		const n = 4000
		var buckets [4]int
		var sum time.Duration
		for i := 0; i < n; i++ {
			d := p.Delay(attempt)
			if d < 0 || d >= ceil {
				t.Fatalf("attempt %d: delay %v outside [0, %v)", attempt, d, ceil)
			}
			buckets[int(d*4/ceil)]++
			sum += d
		}
		for i, b := range buckets {
			if b < n/8 { // uniform expects n/4 per quarter
				t.Errorf("attempt %d: quarter %d has %d of %d delays; full jitter should be uniform", attempt, i, b, n)
			}
		}
		mean := sum / n
		if mean < ceil*4/10 || mean > ceil*6/10 {
			t.Errorf("attempt %d: mean delay %v, want about %v", attempt, mean, ceil/2)
		}
	}
}

func TestSleepForHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := SleepFor(ctx, time.Hour); err != context.Canceled {
		t.Fatalf("SleepFor on canceled ctx = %v, want context.Canceled", err)
	}
	if time.Since(start) > time.Second {
		t.Fatal("SleepFor did not return promptly on a canceled context")
	}
	if err := SleepFor(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("SleepFor = %v", err)
	}
}
