package main

import (
	"slices"
	"testing"
)

func TestSplitCells(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"drain/txn=1", []string{"drain/txn=1"}},
		{"drain/txn=1,drain/txn=10", []string{"drain/txn=1", "drain/txn=10"}},
		{"latency/rate=10000,txn=10", []string{"latency/rate=10000,txn=10"}},
		{"latency/rate=10000,txn=10,drain/txn=1 startup/partitions=8", []string{"latency/rate=10000,txn=10", "drain/txn=1", "startup/partitions=8"}},
		{" ", nil},
	}
	for _, tt := range tests {
		if got := splitCells(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("splitCells(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
