package chart

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"gonum.org/v1/plot/plotter"

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

func TestWriteWithoutSomeCells(t *testing.T) {
	tests := []struct {
		name string
		r    *results.Results
	}{
		{"no latency run", &results.Results{Config: results.Config{Events: 10, Rates: []int{1000}}}},
		{"matrix without steady loads", &results.Results{Config: results.Config{Events: 10, TxnSizes: []int{1}, Rates: []int{1000}}}},
		{"nothing ran", &results.Results{Config: results.Config{TxnSizes: []int{1}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := Write(tt.r, filepath.Join(t.TempDir(), "chart.png")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestWriteCurves(t *testing.T) {
	head := results.Shape{TxnSize: 1, Partitions: 8, Topics: 1, Payload: 300}
	txn10, p256 := head, head
	txn10.TxnSize, p256.Partitions = 10, 256
	d := func(rate, cpu float64) results.Drain {
		return results.Drain{Rate: rate, CPUPerEventUS: cpu, WalsenderUSPerEvent: cpu / 2}
	}
	r := &results.Results{
		Config: results.Config{TxnSizes: []int{1, 10}, PartitionSet: []int{8, 256}, TopicCounts: []int{1}, Payloads: []int{300},
			LatencyCells: []results.LatencyCell{{Rate: 1000, TxnSize: 1}, {Rate: 10000, TxnSize: 10}}},
		Cells: []results.Cell{
			{Name: "drain/txn=1", Shape: head, Limit: d(50000, 10), Relay: d(45000, 12), Poller: d(30000, 20)},
			{Name: "drain/txn=10", Shape: txn10, Limit: d(90000, 6), Relay: d(80000, 7)}, // no poller figure
			{Name: "drain/partitions=256", Shape: p256, Limit: d(50000, 10), Relay: d(44000, 13), Poller: d(30000, 20)},
		},
		Latency: []results.Latency{
			{System: "relay", Delivery: results.EffectivelyOnce, Rate: 1000, TxnSize: 1, Summary: latency.Summary{Samples: 10, P99: 3}, CPUPerEventUS: 20},
			{System: "reader", Rate: 10000, TxnSize: 10, Summary: latency.Summary{Samples: 10, P99: 1}, CPUPerEventUS: 9},
		},
	}
	dir := t.TempDir()
	written, err := WriteCurves(r, filepath.Join(dir, "run"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"run-txn.png", "run-partitions.png", "run-latency.png"} // one topics count, one payload: no curve
	if len(written) != len(want) {
		t.Fatalf("wrote %v, want %v", written, want)
	}
	for i, p := range written {
		if filepath.Base(p) != want[i] {
			t.Errorf("file %d = %s, want %s", i, p, want[i])
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
			t.Errorf("%s is not a PNG", p)
		}
	}
}

func TestSpansDecades(t *testing.T) {
	line := func(ys ...float64) series {
		var s series
		for i, y := range ys {
			s.xys = append(s.xys, plotter.XY{X: float64(i + 1), Y: y})
		}
		return s
	}
	tests := []struct {
		name  string
		lines []series
		want  bool
	}{
		{"payload cells", []series{line(49031, 41140, 6015, 203), line(51907, 173)}, true},
		{"partition cells", []series{line(49031, 50688, 53325), line(25223, 58333)}, false},
		{"across lines", []series{line(100), line(2100)}, true},
		{"a zero (not measured) keeps linear", []series{line(0, 50000)}, false},
		{"empty", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := spansDecades(tt.lines); got != tt.want {
				t.Errorf("spansDecades = %v, want %v", got, tt.want)
			}
		})
	}
}
