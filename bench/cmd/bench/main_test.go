package main

import (
	"crypto/sha256"
	"os"
	"path/filepath"
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
		{"replay/rows=100000,join/rows=100000 latency/rate=1000,txn=1", []string{"replay/rows=100000", "join/rows=100000", "latency/rate=1000,txn=1"}},
		{" ", nil},
	}
	for _, tt := range tests {
		if got := splitCells(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("splitCells(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestResultsHeldOnce checks that bench/results holds no file twice (the
// latest run was once written under its timestamp and as latest-*, 1.5 MB
// in every clone for nothing).
func TestResultsHeldOnce(t *testing.T) {
	dir := filepath.Join("..", "..", "results")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[[sha256.Size]byte]string{}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		if first, ok := seen[sum]; ok {
			t.Errorf("bench/results/%s is a copy of %s: keep the run once", e.Name(), first)
			continue
		}
		seen[sum] = e.Name()
	}
	if _, err := os.Stat(filepath.Join(dir, "latest.json")); err != nil {
		t.Errorf("bench/results has no latest.json, which README.md and bench/README.md show: %v", err)
	}
}
