package results

import (
	"strings"
	"testing"
)

func TestQuantiles(t *testing.T) {
	tests := []struct {
		name          string
		ms            []float64
		p50, p99, max float64
	}{
		{"none", nil, 0, 0, 0},
		{"one", []float64{7}, 7, 7, 7},
		{"1..100, shuffled", shuffled(100), 50, 99, 100},
		{"one stall among 200", append(ones(199), 900), 1, 1, 900},
		{"three stalls among 200", append(ones(197), 900, 800, 700), 1, 700, 900},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p50, p99, mx := Quantiles(tt.ms)
			if p50 != tt.p50 || p99 != tt.p99 || mx != tt.max {
				t.Errorf("Quantiles = %v, %v, %v; want %v, %v, %v", p50, p99, mx, tt.p50, tt.p99, tt.max)
			}
		})
	}
}

func shuffled(n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = float64((i*37)%n + 1) // 37 is prime to 100: a permutation
	}
	return out
}

func ones(n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

func TestTableTargets(t *testing.T) {
	cell := func(kind string, rows int, rate float64, lost int, app *AppInserts) TableCell {
		return TableCell{Name: kind + "/rows=" + rowsLabel(rows), Kind: kind, Rows: rows, Run: Drain{Rate: rate},
			Kafka: Verify{Missing: lost, OK: lost == 0}, App: app}
	}
	okApp := &AppInserts{Count: 100, P50Ms: 2, P99Ms: 30, MaxMs: 200, Total: 120, Kafka: Verify{Unique: 120, OK: true}}
	slowApp := &AppInserts{Count: 100, P50Ms: 600, P99Ms: 1400, MaxMs: 1500, Total: 120, Kafka: Verify{Unique: 120, OK: true}}
	r := &Results{TableCells: []TableCell{
		cell(KindReplay, 100000, 80000, 0, nil),
		cell(KindJoin, 100000, 60000, 0, okApp),
		cell(KindReplay, 1000000, 56000, 2, nil), // 0.70 of 100k's
		cell(KindJoin, 1000000, 40000, 0, slowApp),
	}}
	got := map[string]bool{}
	for _, tg := range r.tableTargets() {
		got[tg.Name] = tg.Pass
	}
	want := map[string]bool{
		"replay/rows=100k ≥ 50k rows/s":            true,
		"replay/rows=100k every row in Kafka once": true,
		"join/rows=100k ≥ 50k rows/s":              true,
		"join/rows=100k every row in Kafka once":   true,
		"join/rows=100k app INSERT p99 ≤ 50 ms":    true,
		"join/rows=100k app INSERT max ≤ 1 s":      true,
		"join/rows=100k app rows streamed once":    true,
		"replay/rows=1M ≥ 50k rows/s":              true,
		"replay/rows=1M every row in Kafka once":   false,
		"join/rows=1M ≥ 50k rows/s":                false,
		"join/rows=1M every row in Kafka once":     true,
		"join/rows=1M app INSERT p99 ≤ 50 ms":      false,
		"join/rows=1M app INSERT max ≤ 1 s":        false,
		"replay linear: rows/s 1M / 100k ≥ 0.8":    false,
		"join linear: rows/s 1M / 100k ≥ 0.8":      false,
		"join/rows=1M app rows streamed once":      true,
	}
	if len(got) != len(want) {
		t.Errorf("targets %v, want %v", got, want)
	}
	for name, pass := range want {
		if p, ok := got[name]; !ok || p != pass {
			t.Errorf("target %q: present %v, pass %v; want pass %v", name, ok, p, pass)
		}
	}
	var out strings.Builder
	r.printTableCells(&out)
	for _, s := range []string{"40000 MISS", "2 MISS", "1400.0 MISS", "replay linearity: rows/s at 1M / at 100k = 0.70 MISS (goal ≥ 0.8)", "join linearity: rows/s at 1M / at 100k = 0.67 MISS"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("printed\n%s\nwithout %q", out.String(), s)
		}
	}
}
