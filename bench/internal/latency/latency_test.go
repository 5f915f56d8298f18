package latency

import (
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	// steady returns n samples committed every gap from t0, latency 1 ms,
	// unsorted on purpose.
	steady := func(n int, gap time.Duration) []Sample {
		var out []Sample
		for i := n - 1; i >= 0; i-- {
			out = append(out, Sample{Commit: t0.Add(time.Duration(i) * gap), Latency: ms})
		}
		return out
	}
	// stalled is 1,000 samples 1 ms apart, of which the 11 committed in
	// [500 ms, 511 ms) waited 80 ms: more than 1%, all in one window.
	stalled := steady(1000, ms)
	for i := range stalled {
		if at := stalled[i].Commit.Sub(t0); at >= 500*ms && at < 511*ms {
			stalled[i].Latency = 80 * ms
		}
	}
	// spread has 12 slow samples, one every 90 ms: in ten windows.
	spread := steady(1000, ms)
	for i := range spread {
		if spread[i].Commit.Sub(t0)%(90*ms) == 0 {
			spread[i].Latency = 80 * ms
		}
	}
	// paused stops committing for 250 ms after 400 ms.
	paused := steady(1000, ms)
	for i := range paused {
		if paused[i].Commit.Sub(t0) >= 400*ms {
			paused[i].Commit = paused[i].Commit.Add(250 * ms)
		}
	}
	var ranks []Sample
	for i := 100; i >= 1; i-- {
		ranks = append(ranks, Sample{Commit: t0, Latency: time.Duration(i) * ms})
	}
	tests := []struct {
		name    string
		samples []Sample
		want    Summary
	}{
		{"none", nil, Summary{}},
		{"one", []Sample{{Commit: t0, Latency: 3 * ms}}, Summary{Samples: 1, P50: 3, P99: 3, Max: 3}},
		{"nearest rank", ranks, Summary{Samples: 100, P50: 50, P99: 99, Max: 100, TailWindows: 1}},
		{"tail in one stall", stalled, Summary{Samples: 1000, P50: 1, P99: 80, Max: 80, TailWindows: 1, CommitPause: 1}},
		{"tail spread over the run", spread, Summary{Samples: 1000, P50: 1, P99: 80, Max: 80, TailWindows: 10, CommitPause: 1}},
		{"commits paused, no tail", paused, Summary{Samples: 1000, P50: 1, P99: 1, Max: 1, CommitPause: 251}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Summarize(tt.samples); got != tt.want {
				t.Fatalf("Summarize = %+v, want %+v", got, tt.want)
			}
		})
	}
}
