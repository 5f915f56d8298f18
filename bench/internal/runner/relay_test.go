package runner

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// exposition renders an end-to-end histogram with the given cumulative
// bucket counts for le = 0.001, 0.002, 0.004, +Inf.
func exposition(published int, counts [4]int) string {
	return fmt.Sprintf(`# HELP cdc_relay_events_published_total Outbox events acknowledged by Kafka (acks=all).
# TYPE cdc_relay_events_published_total counter
cdc_relay_events_published_total{topic="a"} %d
cdc_relay_events_published_total{topic="b"} 5
cdc_relay_checkpoint_saves_total 3
cdc_relay_end_to_end_latency_seconds_bucket{le="0.001"} %d
cdc_relay_end_to_end_latency_seconds_bucket{le="0.002"} %d
cdc_relay_end_to_end_latency_seconds_bucket{le="0.004"} %d
cdc_relay_end_to_end_latency_seconds_bucket{le="+Inf"} %d
cdc_relay_end_to_end_latency_seconds_sum 1.5
cdc_relay_end_to_end_latency_seconds_count %d
`, published, counts[0], counts[1], counts[2], counts[3], counts[3])
}

// TestRelayMetrics reads sums and a histogram's quantiles, with the
// histogram untyped and, as the relay exposes it, typed.
func TestRelayMetrics(t *testing.T) {
	for _, typeLine := range []string{"", "# TYPE cdc_relay_end_to_end_latency_seconds histogram\n"} {
		t.Run(fmt.Sprintf("typed=%v", typeLine != ""), func(t *testing.T) { testRelayMetrics(t, typeLine) })
	}
}

func testRelayMetrics(t *testing.T, typeLine string) {
	exposition := func(published int, counts [4]int) string {
		return strings.Replace(exposition(published, counts), "cdc_relay_end_to_end_latency_seconds_bucket{le=\"0.001\"}", typeLine+"cdc_relay_end_to_end_latency_seconds_bucket{le=\"0.001\"}", 1)
	}
	body := exposition(10, [4]int{0, 0, 0, 0})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, body)
	}))
	defer srv.Close()
	r := &relayProc{base: srv.URL}

	before, err := r.metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := before.sum("cdc_relay_events_published_total"); got != 15 {
		t.Fatalf("published = %v, want 15 (summed over topics)", got)
	}
	if got := before.sum("cdc_relay_checkpoint_saves_total"); got != 3 {
		t.Fatalf("checkpoint saves = %v, want 3", got)
	}
	if q := before.quantileSince(before, "cdc_relay_end_to_end_latency_seconds", 0.5); !math.IsNaN(q) {
		t.Fatalf("quantile without observations = %v, want NaN", q)
	}

	// 100 observations: 50 in (0, 1ms], 40 in (1ms, 2ms], 10 in (2ms, 4ms].
	body = exposition(20, [4]int{50, 90, 100, 100})
	after, err := r.metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ q, want float64 }{
		{0.5, 0.001},
		{0.7, 0.0015},
		{0.95, 0.003},
	} {
		got := after.quantileSince(before, "cdc_relay_end_to_end_latency_seconds", tc.q)
		if math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("quantile %v = %v, want %v", tc.q, got, tc.want)
		}
	}
}

func TestPollDelay(t *testing.T) {
	tests := []struct {
		name       string
		elapsed    time.Duration
		done, want float64
		delay      time.Duration
	}{
		{"nothing yet", 300 * time.Millisecond, 0, 1000, pollFine},
		{"done", 3 * time.Second, 1000, 1000, pollFine},
		{"far from the end", 2 * time.Second, 100, 1000, time.Second},
		{"a quarter of what is left", time.Second, 500, 1000, 250 * time.Millisecond},
		{"near the end", time.Second, 990, 1000, pollFine},
	}
	for _, tt := range tests {
		if got := pollDelay(tt.elapsed, tt.done, tt.want); got != tt.delay {
			t.Errorf("%s: pollDelay(%s, %v, %v) = %s, want %s", tt.name, tt.elapsed, tt.done, tt.want, got, tt.delay)
		}
	}
}

func TestRelayMetricsByName(t *testing.T) {
	var query []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		query = req.URL.Query()["name[]"]
		fmt.Fprint(w, exposition(10, [4]int{0, 0, 0, 0}))
	}))
	defer srv.Close()
	r := &relayProc{base: srv.URL}
	if _, err := r.metrics(context.Background(), "cdc_relay_events_published_total"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(query, []string{"cdc_relay_events_published_total"}) {
		t.Fatalf("name[] = %q, want the one metric asked for", query)
	}
}
