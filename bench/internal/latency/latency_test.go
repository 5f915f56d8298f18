package latency

import (
	"testing"
	"time"
)

func TestSummarizeNearestRank(t *testing.T) {
	var samples []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		samples = append(samples, time.Duration(i)*time.Millisecond)
	}
	s := Summarize(samples)
	if s.Samples != 100 || s.P50 != 50 || s.P99 != 99 || s.Max != 100 {
		t.Fatalf("Summarize = %+v, want 100 samples, p50 50, p99 99, max 100", s)
	}
	if got := Summarize(nil); got != (Summary{}) {
		t.Fatalf("Summarize(nil) = %+v, want zero", got)
	}
	if got := Summarize([]time.Duration{3 * time.Millisecond}); got.P50 != 3 || got.P99 != 3 || got.Max != 3 {
		t.Fatalf("Summarize(one) = %+v, want 3 everywhere", got)
	}
}
