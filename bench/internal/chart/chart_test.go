package chart

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/cdc-relay/cdc-relay/bench/internal/latency"
	"github.com/cdc-relay/cdc-relay/bench/internal/results"
)

func TestWriteDrawsAPNG(t *testing.T) {
	r := &results.Results{
		Config: results.Config{Events: 1000, Rates: []int{1000, 10000}},
		Limit:  results.Drain{Rate: 50000},
		Relay:  results.Drain{Rate: 40000},
		Poller: results.Drain{Rate: 20000},
		Latency: []results.Latency{
			{System: "reader", Rate: 1000, Summary: latency.Summary{Samples: 10, P50: 0.3, P99: 2}},
			{System: "relay", Rate: 1000, Summary: latency.Summary{Samples: 10, P50: 0.8, P99: 4}},
			{System: "relay", Rate: 10000, Summary: latency.Summary{Samples: 10, P50: 0, P99: 0.5}}, // 0 on a log axis
			{System: "poller", Rate: 10000, Summary: latency.Summary{Samples: 10, P50: 20, P99: 100}},
		},
	}
	path := filepath.Join(t.TempDir(), "chart.png")
	if err := Write(r, path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("%s is not a PNG", path)
	}
}

func TestWriteWithoutLatency(t *testing.T) {
	r := &results.Results{Config: results.Config{Events: 10, Rates: []int{1000}}}
	if err := Write(r, filepath.Join(t.TempDir(), "chart.png")); err != nil {
		t.Fatal(err)
	}
}
