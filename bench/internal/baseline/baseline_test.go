package baseline

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/bench/internal/results"
)

// cell builds a drain cell: the relay's rounds (eo and alo CPU µs/ev), the
// limit reader before and after, and the lean loop.
func cell(name string, eo, alo []float64, before, after, lean float64) results.Cell {
	c := results.Cell{Name: name}
	for i, us := range eo {
		c.RelayRuns = append(c.RelayRuns, results.Drain{Delivery: results.EffectivelyOnce, Round: i + 1, CPUPerEventUS: us})
	}
	for i, us := range alo {
		c.RelayRuns = append(c.RelayRuns, results.Drain{Delivery: results.AtLeastOnce, Round: i + 1, CPUPerEventUS: us})
	}
	c.LimitRuns = []results.Drain{
		{Name: "limit before", CPUPerEventUS: before},
		{Name: "limit after", CPUPerEventUS: after},
		{Name: LeanRun, CPUPerEventUS: lean},
	}
	return c
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestCompare(t *testing.T) {
	base := Cell{EOUS: 4, LeanUS: 2, Spread: 0.08}
	tests := []struct {
		name      string
		base      Cell
		now       results.Cell
		mark      string
		change    float64
		threshold float64
	}{
		{"25% rise, lean unchanged", base, cell("c", []float64{5, 5.5}, nil, 1, 1, 2), Rise, 0.25, 0.08},
		{"25% rise, lean +25%", base, cell("c", []float64{5}, nil, 1, 1, 2.5), UpLean, 0.25, 0.08},
		{"noise within the spread", base, cell("c", []float64{4.3, 4.6}, nil, 1, 1, 2), OK, 0.075, 0.08},
		{"ratio up, raw not", base, cell("c", []float64{4.1}, nil, 1, 1, 1.5), OK, 0.025, 0.08},
		{"both fell", base, cell("c", []float64{3}, nil, 1, 1, 2), Lower, -0.25, 0.08},
		{"fell with lean", base, cell("c", []float64{3}, nil, 1, 1, 1.5), OK, -0.25, 0.08},
		{"small spread: at least 5%", Cell{EOUS: 4, LeanUS: 2, Spread: 0.01}, cell("c", []float64{4.24}, nil, 1, 1, 2), Rise, 0.06, 0.05},
		{"large spread: at most 20%", Cell{EOUS: 4, LeanUS: 2, Spread: 0.5}, cell("c", []float64{4.84}, nil, 1, 1, 2), Rise, 0.21, 0.20},
		{"no effectively-once drain", base, cell("c", nil, []float64{5}, 1, 1, 2), NoFigures, 0, 0.08},
		{"no lean loop", base, results.Cell{RelayRuns: []results.Drain{{Delivery: results.EffectivelyOnce, CPUPerEventUS: 5}}}, NoFigures, 0, 0.08},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Compare(tt.base, tt.now)
			if v.Mark != tt.mark || !near(v.Change, tt.change) || !near(v.Threshold, tt.threshold) {
				t.Errorf("Compare = %+v, want mark %q, change %v, threshold %v", v, tt.mark, tt.change, tt.threshold)
			}
		})
	}
}

func TestVerdictString(t *testing.T) {
	v := Compare(Cell{EOUS: 3.10, LeanUS: 5, Spread: 0.12}, cell("c", []float64{3.31, 3.5}, nil, 1, 1, 5))
	want := "relay eo 3.31 µs/ev (baseline 3.10, +6.8%), relay/lean 0.66 (baseline 0.62, +6.8%), threshold 12%: ok"
	if got := v.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestRecord(t *testing.T) {
	started := time.Date(2026, 12, 5, 7, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		cells   []results.Cell
		want    map[string]Cell
		wantErr string
	}{
		{
			name: "spread of the delivery rounds",
			cells: []results.Cell{
				cell("drain/txn=1", []float64{4.4, 4}, []float64{3, 3.3}, 1, 1.02, 2),
				cell("drain/txn=100", []float64{2, 2.1}, []float64{1.5, 1.5}, 1, 1.15, 0.5),
			},
			want: map[string]Cell{
				"drain/txn=1":   {Recorded: "2026-12-05T07:00:00Z", Load: 0.3, EOUS: 4, ALOUS: 3, LeanUS: 2, Spread: 0.1},
				"drain/txn=100": {Recorded: "2026-12-05T07:00:00Z", Load: 0.3, EOUS: 2, ALOUS: 1.5, LeanUS: 0.5, Spread: 0.15},
			},
		},
		{name: "one round", cells: []results.Cell{cell("drain/txn=1", []float64{4}, []float64{3}, 1, 1, 2)}, wantErr: "need at least 2"},
		{name: "one at-least-once round", cells: []results.Cell{cell("drain/txn=1", []float64{4, 4}, []float64{3}, 1, 1, 2)}, wantErr: "1 at-least-once rounds"},
		{name: "no lean loop", cells: []results.Cell{{Name: "drain/txn=1", RelayRuns: cell("x", []float64{4, 4}, []float64{3, 3}, 1, 1, 2).RelayRuns}}, wantErr: "no lean pglogrepl loop run"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := &results.Results{Started: started, Host: results.Host{LoadAvgStart: 0.3}, Cells: tt.cells}
			got, err := Record(res)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Record error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("Record = %+v, want %+v", got, tt.want)
			}
			for name, w := range tt.want {
				g := got[name]
				if !near(g.Spread, w.Spread) {
					t.Errorf("%s: spread %v, want %v", name, g.Spread, w.Spread)
				}
				g.Spread = w.Spread
				if g != w {
					t.Errorf("%s: %+v, want %+v", name, g, w)
				}
			}
		})
	}
}

func TestLoadSave(t *testing.T) {
	dir := t.TempDir()
	missing, err := Load(filepath.Join(dir, "none.json"))
	if err != nil || missing.Cells == nil || len(missing.Cells) != 0 {
		t.Fatalf("Load(missing) = %+v, %v; want an empty file, no error", missing, err)
	}
	path := filepath.Join(dir, "baseline.json")
	f := File{Note: "record with …", Cells: map[string]Cell{
		"drain/txn=100": {Commit: "2c8b680", Recorded: "2026-12-05T07:00:00Z", Load: 0.2, EOUS: 3.1, ALOUS: 2.9, LeanUS: 5, Spread: 0.12},
	}}
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, f) {
		t.Errorf("Load after Save = %+v, want %+v", got, f)
	}
	if err := os.WriteFile(path, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil {
		t.Error("Load of a malformed file: no error")
	}
}

// TestCommittedBaseline checks that bench/baseline.json reads.
func TestCommittedBaseline(t *testing.T) {
	if _, err := Load(filepath.Join("..", "..", "baseline.json")); err != nil {
		t.Fatal(err)
	}
}
