package results

import (
	"fmt"
	"io"
	"sort"
)

// The table cells (issue 42 point 7): rows already in an outbox table
// published by `cdc-relay replay`, and by the relay when the table joins the
// publication of its slot, with an application inserting into it meanwhile.

// The kinds of table cell.
const (
	KindReplay = "replay"
	KindJoin   = "join"
)

// The goals of issue 42 point 7.
const (
	GoalRowsPerSecond = 50000 // rows/s of every table cell
	GoalLinearity     = 0.8   // rows/s at the most rows over at the fewest, per kind
	GoalAppP99Ms      = 50    // the application's INSERT+COMMIT during a join
	GoalAppMaxMs      = 1000
)

// TableCell is one table cell: Rows rows in an outbox table, published to
// Kafka by the replay command or by a relay the table joins.
type TableCell struct {
	Name string `json:"name"` // replay/rows=N, join/rows=N
	Kind string `json:"kind"` // KindReplay or KindJoin
	Rows int    `json:"rows"`
	// FillStatements is how many INSERT … SELECT statements filled the
	// table: each statement's rows share one created_at.
	FillStatements int     `json:"fill_statements"`
	FillSeconds    float64 `json:"fill_seconds"`
	// Run is the measured process: the replay from its start to its exit,
	// or the relay from its start to the joined rows all being in Kafka (its
	// "join snapshot done" line). Run.Rate is the cell's rows/s.
	Run Drain `json:"run"`
	// Published is the rows the process said it published: the replay's
	// summary ("published N"), the relay's join snapshot done line
	// ("events"). Below Rows, the process's reader missed rows; at Rows
	// with rows lost in Kafka, it published some twice and others never.
	Published int `json:"published"`
	// Kafka is the check of the rows' topic: every row of the table once.
	Kafka Verify `json:"kafka"`
	// App is the application's writer during a join (join cells only).
	App *AppInserts `json:"app_inserts,omitempty"`
}

// AppInserts are the application's INSERTs into the joining table during a
// join: one autocommitted INSERT every 10-20 ms, on its own connection each
// when the previous is still waiting (open loop), each timed from when it was
// due until its COMMIT returned.
type AppInserts struct {
	// Count, P50Ms, P99Ms and MaxMs are the INSERTs due between the relay's
	// start and the joined rows all being in Kafka.
	Count int     `json:"count"`
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
	// Total is every INSERT the writer committed, before and after too;
	// Kafka checks that the stream carried each once.
	Total int    `json:"total"`
	Kafka Verify `json:"kafka"`
}

// Quantiles returns p50, p99 and the max of ms (0s for none), nearest rank.
func Quantiles(ms []float64) (p50, p99, maxMs float64) {
	if len(ms) == 0 {
		return 0, 0, 0
	}
	s := append([]float64(nil), ms...)
	sort.Float64s(s)
	at := func(q float64) float64 {
		i := int(q*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return at(0.50), at(0.99), s[len(s)-1]
}

// tableTargets are issue 42 point 7's goals over the table cells: rows/s of
// each cell and that Kafka holds each row once, the ratio of rows/s at the
// most rows to the fewest per kind (linearity), and the application's
// INSERT latency during each join.
func (r *Results) tableTargets() []Target {
	var out []Target
	for _, c := range r.TableCells {
		out = append(out, Target{Name: c.Name + " ≥ 50k rows/s", Got: fmt.Sprintf("%.0f rows/s (%d rows in %.2fs)", c.Run.Rate, c.Rows, c.Run.Seconds),
			Pass: c.Run.Rate >= GoalRowsPerSecond})
		out = append(out, Target{Name: c.Name + " every row in Kafka once", Got: fmt.Sprintf("%d lost, %d duplicates", c.Kafka.Missing, c.Kafka.Duplicates), Pass: c.Kafka.OK})
		if c.App != nil {
			a := c.App
			out = append(out,
				Target{Name: c.Name + " app INSERT p99 ≤ 50 ms", Got: fmt.Sprintf("p99 %.1f ms (p50 %.1f, %d INSERTs during the join)", a.P99Ms, a.P50Ms, a.Count), Pass: a.Count > 0 && a.P99Ms <= GoalAppP99Ms},
				Target{Name: c.Name + " app INSERT max ≤ 1 s", Got: fmt.Sprintf("max %.1f ms", a.MaxMs), Pass: a.Count > 0 && a.MaxMs <= GoalAppMaxMs},
				Target{Name: c.Name + " app rows streamed once", Got: fmt.Sprintf("%d of %d, %d duplicates", a.Kafka.Unique, a.Total, a.Kafka.Duplicates), Pass: a.Kafka.OK})
		}
	}
	for _, kind := range []string{KindReplay, KindJoin} {
		lo, hi, ok := r.tableSpan(kind)
		if !ok {
			continue
		}
		lin := ratio(hi.Run.Rate, lo.Run.Rate)
		out = append(out, Target{Name: fmt.Sprintf("%s linear: rows/s %s / %s ≥ %.1f", kind, rowsLabel(hi.Rows), rowsLabel(lo.Rows), GoalLinearity),
			Got: fmt.Sprintf("%.2f (%.0f / %.0f rows/s)", lin, hi.Run.Rate, lo.Run.Rate), Pass: lin >= GoalLinearity})
	}
	return out
}

// tableSpan returns the kind's cells of the fewest and the most rows, when
// there are two sizes.
func (r *Results) tableSpan(kind string) (lo, hi TableCell, ok bool) {
	for _, c := range r.TableCells {
		if c.Kind != kind || c.Run.Rate <= 0 {
			continue
		}
		if !ok || c.Rows < lo.Rows {
			lo = c
		}
		if !ok || c.Rows > hi.Rows {
			hi = c
		}
		ok = true
	}
	return lo, hi, ok && hi.Rows > lo.Rows
}

// rowsLabel is 100k, 1M, …
func rowsLabel(n int) string {
	switch {
	case n >= 1000000 && n%1000000 == 0:
		return fmt.Sprintf("%dM", n/1000000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// printTableCells prints one line per table cell, its figures beside its
// goals.
func (r *Results) printTableCells(w io.Writer) {
	fmt.Fprintln(w, "table cells (replay: `cdc-relay replay --rate 0` from its start to its exit; join: the relay's start to the joined rows all in Kafka; app: the application's INSERT+COMMIT during the join, from when it was due; said published: the rows the process said it published; lost, dup: the table's rows missing from Kafka, and records of a row seen before; other: the share of the machine that processes outside the benchmark took; CPU wait: the share of the time some task waited for a CPU):")
	rows := [][]string{{"cell", "rows", "seconds", "rows/s (goal ≥ 50k)", "CPU µs/row", "PG CPU µs/row", "app INSERTs", "p50 ms", "p99 ms (goal ≤ 50)", "max ms (goal ≤ 1000)", "said published", "lost", "dup", "other", "CPU wait"}}
	mark := func(s string, ok bool) string {
		if ok {
			return s
		}
		return s + " MISS"
	}
	for _, c := range r.TableCells {
		row := []string{c.Name, fmt.Sprint(c.Rows), fmt.Sprintf("%.2f", c.Run.Seconds), mark(fmt.Sprintf("%.0f", c.Run.Rate), c.Run.Rate >= GoalRowsPerSecond),
			fmt.Sprintf("%.2f", c.Run.CPUPerEventUS), fmt.Sprintf("%.2f", c.Run.PGCPUPerEventUS)}
		if a := c.App; a != nil {
			row = append(row, fmt.Sprint(a.Count), fmt.Sprintf("%.1f", a.P50Ms), mark(fmt.Sprintf("%.1f", a.P99Ms), a.P99Ms <= GoalAppP99Ms), mark(fmt.Sprintf("%.1f", a.MaxMs), a.MaxMs <= GoalAppMaxMs))
		} else {
			row = append(row, "-", "-", "-", "-")
		}
		row = append(row, fmt.Sprint(c.Published), mark(fmt.Sprint(c.Kafka.Missing), c.Kafka.Missing == 0), mark(fmt.Sprint(c.Kafka.Duplicates), c.Kafka.Duplicates == 0),
			fmt.Sprintf("%.0f%%", 100*c.Run.ForeignShare), waitShare(c.Run.CPUWaitShare))
		rows = append(rows, row)
	}
	writeTable(w, rows)
	for _, kind := range []string{KindReplay, KindJoin} {
		if lo, hi, ok := r.tableSpan(kind); ok {
			lin := ratio(hi.Run.Rate, lo.Run.Rate)
			fmt.Fprintf(w, "  %s linearity: rows/s at %s / at %s = %s (goal ≥ %.1f)\n", kind, rowsLabel(hi.Rows), rowsLabel(lo.Rows), mark(fmt.Sprintf("%.2f", lin), lin >= GoalLinearity), GoalLinearity)
		}
	}
}

// waitShare is a CPU wait share as a table shows it ("?" unknown).
func waitShare(share float64) string {
	if share < 0 {
		return "?"
	}
	return fmt.Sprintf("%.0f%%", 100*share)
}
