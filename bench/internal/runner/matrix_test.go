package runner

import (
	"slices"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/bench/internal/results"
)

func TestDrainCells(t *testing.T) {
	cfg := Config{Events: 500000, TxnSizes: []int{1, 10, 10000}, PartitionCounts: []int{8, 256},
		TopicCounts: []int{1, 50}, Payloads: []int{300, 1048576}}
	type cell struct {
		name   string
		shape  results.Shape
		events int
	}
	want := []cell{
		{"drain/txn=1", results.Shape{TxnSize: 1, Partitions: 8, Topics: 1, Payload: 300}, 500000},
		{"drain/txn=10", results.Shape{TxnSize: 10, Partitions: 8, Topics: 1, Payload: 300}, 500000},
		{"drain/txn=10000", results.Shape{TxnSize: 10000, Partitions: 8, Topics: 1, Payload: 300}, 500000},
		{"drain/partitions=256", results.Shape{TxnSize: 1, Partitions: 256, Topics: 1, Payload: 300}, 500000},
		{"drain/topics=50", results.Shape{TxnSize: 1, Partitions: 8, Topics: 50, Payload: 300}, 500000},
		{"drain/payload=1048576", results.Shape{TxnSize: 1, Partitions: 8, Topics: 1, Payload: 1048576}, 1024},
	}
	var got []cell
	for i, c := range cfg.DrainCells() {
		got = append(got, cell{c.Name, c.Shape, c.Events})
		if c.Headline != (i == 0) {
			t.Errorf("cell %s: Headline %v", c.Name, c.Headline)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("DrainCells =\n%v\nwant\n%v", got, want)
	}
}

func TestCellEvents(t *testing.T) {
	tests := []struct{ events, payload, want int }{
		{500000, 300, 500000},
		{500000, 100, 500000},
		{500000, 4096, 262144},  // minCellBytes
		{4000000, 4096, 292968}, // the events' budget, above minCellBytes
		{500000, 65536, 16384},
		{500000, 1048576, 1024},
		{500000, 16 << 20, minCellEvents},
		{100, 4096, 100}, // never more than asked
	}
	for _, tt := range tests {
		if got := cellEvents(tt.events, tt.payload); got != tt.want {
			t.Errorf("cellEvents(%d, %d) = %d, want %d", tt.events, tt.payload, got, tt.want)
		}
	}
}

func TestLatencyCells(t *testing.T) {
	tests := []struct {
		rates, txns []int
		want        []results.LatencyCell
	}{
		{[]int{1000, 10000, 30000}, []int{1, 10}, []results.LatencyCell{{Rate: 1000, TxnSize: 1}, {Rate: 1000, TxnSize: 10},
			{Rate: 10000, TxnSize: 1}, {Rate: 10000, TxnSize: 10}, {Rate: 30000, TxnSize: 10}}},
		{[]int{50000}, []int{1}, []results.LatencyCell{{Rate: 50000, TxnSize: 5}}}, // no size fits: the smallest that does
		{nil, []int{1}, nil},
	}
	for _, tt := range tests {
		got := Config{Rates: tt.rates, LatencyTxnSizes: tt.txns}.LatencyCells()
		if !slices.Equal(got, tt.want) {
			t.Errorf("LatencyCells(%v, %v) = %v, want %v", tt.rates, tt.txns, got, tt.want)
		}
	}
}

func TestCheckCells(t *testing.T) {
	base := Config{Events: 10, TxnSizes: []int{1}, PartitionCounts: []int{8}, TopicCounts: []int{1}, Payloads: []int{300},
		Rates: []int{10000}, LatencyTxnSizes: []int{10}, ReconcilePartitions: []int{8}}
	tests := []struct {
		cells   []string
		wantErr string
	}{
		{nil, ""},
		{[]string{"drain/txn=1", "startup/partitions=8", "latency/rate=10000,txn=10"}, ""},
		{[]string{"drain/txn=10"}, `no cell "drain/txn=10"`},
	}
	for _, tt := range tests {
		cfg := base
		cfg.Cells = tt.cells
		err := cfg.CheckCells()
		if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("CheckCells(%v) = %v, want %q", tt.cells, err, tt.wantErr)
		}
	}
	cfg := base
	cfg.Cells = []string{"drain/txn=1"}
	if !cfg.selected("drain/txn=1") || cfg.selected("startup/partitions=8") {
		t.Errorf("selected: want only drain/txn=1")
	}
}

func TestTableCellNames(t *testing.T) {
	cfg := Config{TxnSizes: []int{1}, TableRows: []int{100000, 1000000}, Rates: []int{1000}, LatencyTxnSizes: []int{1}}
	want := []string{"drain/txn=1", "replay/rows=100000", "join/rows=100000", "replay/rows=1000000", "join/rows=1000000", "latency/rate=1000,txn=1"}
	if got := cfg.CellNames(); !slices.Equal(got, want) {
		t.Errorf("CellNames = %q, want %q", got, want)
	}
	cfg.Cells = []string{"join/rows=100000"}
	if err := cfg.CheckCells(); err != nil {
		t.Error(err)
	}
	if cfg.RunsDrainCells() {
		t.Error("RunsDrainCells with only a join cell selected")
	}
	cfg.Cells = append(cfg.Cells, "drain/txn=1")
	if !cfg.RunsDrainCells() {
		t.Error("RunsDrainCells false with drain/txn=1 selected")
	}
}
