package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/bench/internal/baseline"
	"github.com/cdc-relay/cdc-relay/bench/internal/results"
)

// drainCell is a drain cell with two rounds per delivery mode at eo and alo
// CPU µs/ev, and the lean loop at lean.
func drainCell(name string, eo, alo, lean float64) results.Cell {
	return results.Cell{Name: name,
		RelayRuns: []results.Drain{
			{Delivery: results.EffectivelyOnce, Round: 1, CPUPerEventUS: eo},
			{Delivery: results.AtLeastOnce, Round: 1, CPUPerEventUS: alo},
			{Delivery: results.EffectivelyOnce, Round: 2, CPUPerEventUS: eo * 1.1},
			{Delivery: results.AtLeastOnce, Round: 2, CPUPerEventUS: alo},
		},
		LimitRuns: []results.Drain{{Name: "limit before", CPUPerEventUS: 1}, {Name: "limit after", CPUPerEventUS: 1}, {Name: baseline.LeanRun, CPUPerEventUS: lean}},
	}
}

func TestGuard(t *testing.T) {
	path := filepath.Join(t.TempDir(), "baseline.json")
	f := baseline.File{Cells: map[string]baseline.Cell{
		"drain/txn=1":   {Commit: "abc", EOUS: 4, LeanUS: 2, Spread: 0.1},
		"drain/txn=100": {Commit: "abc", EOUS: 3.1, LeanUS: 5, Spread: 0.12},
	}}
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	res := &results.Results{Cells: []results.Cell{
		drainCell("drain/txn=1", 5, 4, 2),      // +25 %, lean unchanged
		drainCell("drain/txn=100", 3.31, 3, 5), // +6.8 %
		drainCell("drain/txn=10", 3, 3, 2),     // not in the baseline
	}}
	var out strings.Builder
	rises := guard(&out, path, "bench/baseline.json", res)
	for _, want := range []string{
		"against the baseline (bench/baseline.json):",
		"drain/txn=1 ", "threshold 10%: RISE",
		"drain/txn=100          relay eo 3.31 µs/ev (baseline 3.10, +6.8%), relay/lean 0.66 (baseline 0.62, +6.8%), threshold 12%: ok",
		"drain/txn=10           no baseline",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("guard printed\n%s\nwithout %q", out.String(), want)
		}
	}
	if len(rises) != 1 || rises[0].Name != "regression guard drain/txn=1" || rises[0].Pass || !strings.HasPrefix(rises[0].Got, "RISE ") {
		t.Errorf("guard targets = %+v, want one missed RISE for drain/txn=1", rises)
	}
}

func TestGuardMissingBaseline(t *testing.T) {
	var out strings.Builder
	res := &results.Results{Cells: []results.Cell{drainCell("drain/txn=1", 5, 4, 2)}}
	if rises := guard(&out, filepath.Join(t.TempDir(), "none.json"), "none.json", res); len(rises) != 0 {
		t.Errorf("targets %+v without a baseline", rises)
	}
	if !strings.Contains(out.String(), "drain/txn=1            no baseline") {
		t.Errorf("guard printed %q", out.String())
	}
}

func TestWriteBaselineMerges(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "baseline.json")
	kept := baseline.Cell{Commit: "old", EOUS: 9, LeanUS: 3, Spread: 0.1}
	f := baseline.File{Note: "the note", Cells: map[string]baseline.Cell{
		"drain/txn=10":  kept,
		"drain/txn=100": {Commit: "old", EOUS: 1},
	}}
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	res := &results.Results{Cells: []results.Cell{drainCell("drain/txn=100", 3, 2.5, 5)}}
	if err := writeBaseline(context.Background(), dir, path, res); err != nil {
		t.Fatal(err)
	}
	got, err := baseline.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Note != "the note" || got.Cells["drain/txn=10"] != kept {
		t.Errorf("note or other cell lost: %+v", got)
	}
	if c := got.Cells["drain/txn=100"]; c.EOUS != 3 || c.ALOUS != 2.5 || c.LeanUS != 5 {
		t.Errorf("drain/txn=100 = %+v, want the run's figures", c)
	}
	one := &results.Results{Cells: []results.Cell{{Name: "drain/txn=1", RelayRuns: drainCell("x", 3, 2, 5).RelayRuns[:2]}}}
	if err := writeBaseline(context.Background(), dir, path, one); err == nil {
		t.Error("one round per mode recorded, want an error")
	}
}

func TestGuardTableCells(t *testing.T) {
	path := filepath.Join(t.TempDir(), "baseline.json")
	f := baseline.File{Cells: map[string]baseline.Cell{
		"replay/rows=100000": {Commit: "abc", RowsPerSecond: 60000},
		"join/rows=100000":   {Commit: "abc", RowsPerSecond: 50000},
		"join/rows=1000000":  {Commit: "abc", RowsPerSecond: 50000},
	}}
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	table := func(name string, rate, busy float64) results.TableCell {
		return results.TableCell{Name: name, Run: results.Drain{Rate: rate, ForeignShare: busy}, Kafka: results.Verify{OK: true}}
	}
	res := &results.Results{TableCells: []results.TableCell{
		table("replay/rows=100000", 30000, 0.02),  // -50 %, quiet
		table("join/rows=100000", 30000, 0.5),     // -40 %, busy
		table("join/rows=1000000", 52000, 0),      // +4 %
		table("replay/rows=1000000", 60000, 0.02), // not in the baseline
	}}
	var out strings.Builder
	drops := guard(&out, path, "bench/baseline.json", res)
	for _, want := range []string{
		"replay/rows=100000     30000 rows/s (baseline 60000, -50.0%), other processes 2% of the machine, threshold 20%: DROP",
		"join/rows=100000       30000 rows/s (baseline 50000, -40.0%), other processes 50% of the machine, threshold 20%: down, machine busy",
		"join/rows=1000000      52000 rows/s (baseline 50000, +4.0%), other processes 0% of the machine, threshold 20%: ok",
		"replay/rows=1000000    no baseline",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("guard printed\n%s\nwithout %q", out.String(), want)
		}
	}
	if len(drops) != 1 || drops[0].Name != "regression guard replay/rows=100000" || drops[0].Pass || !strings.HasPrefix(drops[0].Got, "DROP ") {
		t.Errorf("guard targets = %+v, want one missed DROP for replay/rows=100000", drops)
	}
}

func TestWriteBaselineTableCells(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "baseline.json")
	res := &results.Results{TableCells: []results.TableCell{
		{Name: "join/rows=100000", Run: results.Drain{Rate: 51000}, Kafka: results.Verify{OK: true}},
	}}
	if err := writeBaseline(context.Background(), dir, path, res); err != nil {
		t.Fatal(err)
	}
	got, err := baseline.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c := got.Cells["join/rows=100000"]; c.RowsPerSecond != 51000 {
		t.Errorf("join/rows=100000 = %+v, want 51000 rows/s", c)
	}
}

func TestRepoPath(t *testing.T) {
	if got := repoPath("/repo", "bench/baseline.json"); got != "/repo/bench/baseline.json" {
		t.Errorf("relative: %s", got)
	}
	if got := repoPath("/repo", "/tmp/b.json"); got != "/tmp/b.json" {
		t.Errorf("absolute: %s", got)
	}
}
