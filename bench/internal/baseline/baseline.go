// Package baseline keeps the relay's CPU per event of each drain cell as
// recorded on a quiet machine, and compares a run against it: the regression
// guard of issue 38. A rise counts only when the relay rose against the lean
// pglogrepl loop measured in the same run too, so a slower machine or a busy
// neighbour, which slow the lean loop as well, raise no alarm.
package baseline

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"time"

	"github.com/cdc-relay/cdc-relay/bench/internal/results"
)

// LeanRun is the name of the lean reader's run in results.Cell.LimitRuns.
const LeanRun = "lean pglogrepl loop"

// The marks of a Verdict.
const (
	Rise      = "RISE"         // the relay rose, and against the lean loop too
	UpLean    = "up, lean too" // the relay rose, the lean loop as much
	Lower     = "lower"        // the relay fell, and against the lean loop too
	OK        = "ok"           // within the threshold
	NoFigures = "no figures"   // the run measured no effectively-once drain or no lean loop
)

// The bounds of a cell's threshold: its spread, but at least MinThreshold
// and at most MaxThreshold.
const (
	MinThreshold = 0.05
	MaxThreshold = 0.20
)

// File is the baseline file: the cells by name (drain/txn=100, …).
type File struct {
	Note  string          `json:"note"`
	Cells map[string]Cell `json:"cells"`
}

// Cell is one drain cell's figures as recorded.
type Cell struct {
	Commit   string  `json:"commit"`   // the repository's commit that was measured
	Recorded string  `json:"recorded"` // when the run started (RFC 3339)
	Load     float64 `json:"loadavg"`  // 1-minute load average at the start
	// EOUS, ALOUS and LeanUS are the lowest CPU µs per event of the relay's
	// effectively-once rounds, its at-least-once rounds and the lean
	// pglogrepl loop's run.
	EOUS   float64 `json:"eo_cpu_us_per_event"`
	ALOUS  float64 `json:"alo_cpu_us_per_event"`
	LeanUS float64 `json:"lean_cpu_us_per_event"`
	// Spread is the largest relative spread, (max-min)/min, among the rounds
	// of one delivery mode and between the relay's read path before and
	// after the relay: the noise of the recording run.
	Spread float64 `json:"spread"`
	// RowsPerSecond is a table cell's rows/s (replay/rows=N, join/rows=N;
	// the figures above are then zero): see CompareRate.
	RowsPerSecond float64 `json:"rows_per_second,omitempty"`
}

// Load reads the baseline file at path; a missing file is an empty one.
func Load(path string) (File, error) {
	f := File{Cells: map[string]Cell{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return f, fmt.Errorf("read baseline: %w", err)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("read baseline %s: %w", path, err)
	}
	if f.Cells == nil {
		f.Cells = map[string]Cell{}
	}
	return f, nil
}

// Save writes f to path.
func (f File) Save(path string) error {
	if f.Cells == nil {
		f.Cells = map[string]Cell{}
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode baseline: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write baseline: %w", err)
	}
	return nil
}

// Record takes the baseline figures of every drain and table cell of res.
// Each drain cell needs at least two rounds per delivery mode (the spread is
// the threshold) and the lean loop's run; each table cell every row in Kafka
// once. Commit is left for the caller.
func Record(res *results.Results) (map[string]Cell, error) {
	out := map[string]Cell{}
	for _, c := range res.Cells {
		rec := Cell{Recorded: res.Started.UTC().Format(time.RFC3339), Load: res.Host.LoadAvgStart}
		for _, mode := range []struct {
			name string
			into *float64
		}{{results.EffectivelyOnce, &rec.EOUS}, {results.AtLeastOnce, &rec.ALOUS}} {
			us := modeCPU(c, mode.name)
			if len(us) < 2 {
				return nil, fmt.Errorf("record baseline of %s: %d %s rounds, need at least 2 (-delivery-rounds 2)", c.Name, len(us), mode.name)
			}
			*mode.into = minOf(us)
			rec.Spread = math.Max(rec.Spread, spread(us))
		}
		if len(c.LimitRuns) >= 2 {
			rec.Spread = math.Max(rec.Spread, spread([]float64{c.LimitRuns[0].CPUPerEventUS, c.LimitRuns[1].CPUPerEventUS}))
		}
		if rec.LeanUS = leanCPU(c); rec.LeanUS <= 0 {
			return nil, fmt.Errorf("record baseline of %s: no %s run", c.Name, LeanRun)
		}
		out[c.Name] = rec
	}
	for _, c := range res.TableCells {
		rec, err := recordTable(c, Cell{Recorded: res.Started.UTC().Format(time.RFC3339), Load: res.Host.LoadAvgStart})
		if err != nil {
			return nil, err
		}
		out[c.Name] = rec
	}
	return out, nil
}

// Verdict is one cell of a run against its baseline. Changes are relative
// (0.068 is +6.8 %).
type Verdict struct {
	Mark                string
	Base, Now           float64 // best effectively-once relay CPU µs/ev
	Change              float64
	BaseRatio, NowRatio float64 // that over the lean loop's
	RatioChange         float64
	Threshold           float64
}

// Compare judges now against base: RISE when the best effectively-once
// relay CPU per event and its ratio to the lean loop's both rose more than
// the threshold (base's spread, clamped to MinThreshold..MaxThreshold); up,
// lean too when only the former did; lower when both fell more than it; ok
// otherwise.
func Compare(base Cell, now results.Cell) Verdict {
	v := Verdict{Base: base.EOUS, Threshold: math.Min(math.Max(base.Spread, MinThreshold), MaxThreshold)}
	if base.LeanUS > 0 {
		v.BaseRatio = base.EOUS / base.LeanUS
	}
	us, lean := modeCPU(now, results.EffectivelyOnce), leanCPU(now)
	if len(us) == 0 || lean <= 0 || base.EOUS <= 0 || v.BaseRatio <= 0 {
		v.Mark = NoFigures
		return v
	}
	v.Now, v.NowRatio = minOf(us), minOf(us)/lean
	v.Change, v.RatioChange = v.Now/v.Base-1, v.NowRatio/v.BaseRatio-1
	switch {
	case v.Change > v.Threshold && v.RatioChange > v.Threshold:
		v.Mark = Rise
	case v.Change > v.Threshold:
		v.Mark = UpLean
	case v.Change < -v.Threshold && v.RatioChange < -v.Threshold:
		v.Mark = Lower
	default:
		v.Mark = OK
	}
	return v
}

// String is the verdict as the benchmark prints it after the cell's name.
func (v Verdict) String() string {
	if v.Mark == NoFigures {
		return v.Mark
	}
	return fmt.Sprintf("relay eo %.2f µs/ev (baseline %.2f, %+.1f%%), relay/lean %.2f (baseline %.2f, %+.1f%%), threshold %.0f%%: %s",
		v.Now, v.Base, 100*v.Change, v.NowRatio, v.BaseRatio, 100*v.RatioChange, 100*v.Threshold, v.Mark)
}

// modeCPU is the CPU µs per event of the cell's relay drains in mode.
func modeCPU(c results.Cell, mode string) []float64 {
	var us []float64
	for _, d := range c.RelayRuns {
		if d.Delivery == mode && d.CPUPerEventUS > 0 {
			us = append(us, d.CPUPerEventUS)
		}
	}
	return us
}

// leanCPU is the CPU µs per event of the cell's lean loop run (0: none).
func leanCPU(c results.Cell) float64 {
	for _, d := range c.LimitRuns {
		if d.Name == LeanRun {
			return d.CPUPerEventUS
		}
	}
	return 0
}

func minOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs[1:] {
		m = math.Min(m, x)
	}
	return m
}

// spread is (max-min)/min of xs (0 for fewer than two or a zero).
func spread(xs []float64) float64 {
	if len(xs) < 2 {
		return 0
	}
	lo, hi := minOf(xs), xs[0]
	for _, x := range xs {
		hi = math.Max(hi, x)
	}
	if lo <= 0 {
		return 0
	}
	return (hi - lo) / lo
}
