package runner

// The matrix: drain cells (one dimension away from the headline at a time),
// steady-load cells and start-up cells, and their selection with -cell.

import (
	"fmt"
	"strconv"

	"github.com/cdc-relay/cdc-relay/bench/internal/results"
)

// DrainCell is one backlog shape drained by the limit reader, the relay and
// the poller.
type DrainCell struct {
	Name  string // e.g. drain/txn=1, drain/partitions=256
	Tag   string // for database and topic names: txn1, partitions256, …
	Shape results.Shape
	// Events is the backlog size: Config.Events, fewer for large payloads
	// (see cellEvents).
	Events   int
	Headline bool
}

// Transactions is the number of transactions the backlog is committed in.
func (c DrainCell) Transactions() int { return (c.Events + c.Shape.TxnSize - 1) / c.Shape.TxnSize }

// aggTypes are the backlog's aggregate types, one topic each under the
// relay's topic template: drain, or drain0 … drain<Topics-1>.
func (c DrainCell) aggTypes() []string {
	if c.Shape.Topics <= 1 {
		return []string{drainAggType}
	}
	out := make([]string, c.Shape.Topics)
	for i := range out {
		out[i] = drainAggType + strconv.Itoa(i)
	}
	return out
}

// topics are the cell's topics under prefix.
func (c DrainCell) topics(prefix string) []string {
	out := make([]string, 0, c.Shape.Topics)
	for _, t := range c.aggTypes() {
		out = append(out, prefix+t)
	}
	return out
}

// payloadBudget bounds a drain cell's backlog bytes: Config.Events events of
// the headline's 300 B; a cell of larger events has fewer of them.
const payloadBudget = 300

// minCellBytes is the least payload a cell of large events drains: with
// 256 MiB a 64 KiB cell drained in 1.1-1.8 s, so the relay's start-up (0.1-0.25
// s to its first acknowledgement, against the limit reader's few tens of ms)
// and the noise of one second moved relay/limit by 0.2 between runs.
const minCellBytes = 1 << 30

// minCellEvents is the fewest events a cell drains, whatever their size.
const minCellEvents = 200

// cellEvents is the backlog size of a cell with payload-byte events: never
// more than events, otherwise the budget's bytes but at least minCellBytes.
func cellEvents(events, payload int) int {
	if payload <= payloadBudget {
		return events
	}
	budget := max(int64(events)*payloadBudget, minCellBytes)
	return min(events, max(minCellEvents, int(budget/int64(payload))))
}

// DrainCells lists the drain cells in the order they run: the headline (the
// first value of every dimension), then each other value of one dimension
// with the rest as in the headline.
func (c Config) DrainCells() []DrainCell {
	head := c.Headline()
	out := []DrainCell{c.drainCell("txn", head.TxnSize, head, true)}
	add := func(dim string, values []int, set func(*results.Shape, int)) {
		for _, v := range values[min(1, len(values)):] {
			s := head
			set(&s, v)
			if s != head {
				out = append(out, c.drainCell(dim, v, s, false))
			}
		}
	}
	add("txn", c.TxnSizes, func(s *results.Shape, v int) { s.TxnSize = v })
	add("partitions", c.PartitionCounts, func(s *results.Shape, v int) { s.Partitions = v })
	add("topics", c.TopicCounts, func(s *results.Shape, v int) { s.Topics = v })
	add("payload", c.Payloads, func(s *results.Shape, v int) { s.Payload = v })
	return out
}

func (c Config) drainCell(dim string, v int, s results.Shape, headline bool) DrainCell {
	return DrainCell{Name: fmt.Sprintf("drain/%s=%d", dim, v), Tag: dim + strconv.Itoa(v), Shape: s,
		Events: cellEvents(c.Events, s.Payload), Headline: headline}
}

// Headline is the headline drain cell's shape: the first value of each
// dimension.
func (c Config) Headline() results.Shape {
	first := func(v []int, def int) int {
		if len(v) == 0 {
			return def
		}
		return v[0]
	}
	return results.Shape{TxnSize: first(c.TxnSizes, 1), Partitions: first(c.PartitionCounts, 8),
		Topics: first(c.TopicCounts, 1), Payload: first(c.Payloads, 300)}
}

// maxCommitsPerSecond is the most transactions per second a steady-load
// cell offers; faster combinations of rate and transaction size are left out
// (the load generator could not commit them on this machine).
const maxCommitsPerSecond = 10000

// LatencyCells lists the steady loads: each rate with each of
// LatencyTxnSizes, up to maxCommitsPerSecond transactions per second; a rate
// no size fits gets the smallest size that does.
func (c Config) LatencyCells() []results.LatencyCell {
	var out []results.LatencyCell
	for _, rate := range c.Rates {
		n := len(out)
		for _, txn := range c.LatencyTxnSizes {
			if rate/txn <= maxCommitsPerSecond {
				out = append(out, results.LatencyCell{Rate: rate, TxnSize: txn})
			}
		}
		if len(out) == n {
			out = append(out, results.LatencyCell{Rate: rate, TxnSize: (rate + maxCommitsPerSecond - 1) / maxCommitsPerSecond})
		}
	}
	return out
}

// startupCellName names the start-up cell (kill -9 and restart) into a
// topic of n partitions.
func startupCellName(n int) string { return "startup/partitions=" + strconv.Itoa(n) }

// CellNames lists every cell of the configuration, in the order they run.
func (c Config) CellNames() []string {
	var out []string
	for _, d := range c.DrainCells() {
		out = append(out, d.Name)
	}
	for _, n := range c.ReconcilePartitions {
		out = append(out, startupCellName(n))
	}
	for _, t := range c.tableCells() {
		out = append(out, t.name())
	}
	for _, l := range c.LatencyCells() {
		out = append(out, l.Name())
	}
	return out
}

// RunsDrainCells reports whether a drain cell runs (the regression guard
// records those only with two rounds per delivery mode).
func (c Config) RunsDrainCells() bool {
	for _, d := range c.DrainCells() {
		if c.selected(d.Name) {
			return true
		}
	}
	return false
}

// selected reports whether the cell name runs: every cell when Config.Cells
// is empty.
func (c Config) selected(name string) bool {
	if len(c.Cells) == 0 {
		return true
	}
	for _, n := range c.Cells {
		if n == name {
			return true
		}
	}
	return false
}

// CheckCells returns an error naming a cell of Config.Cells that the
// configuration does not have.
func (c Config) CheckCells() error {
	known := map[string]bool{}
	for _, n := range c.CellNames() {
		known[n] = true
	}
	for _, n := range c.Cells {
		if !known[n] {
			return fmt.Errorf("-cell: no cell %q in this configuration (-list-cells shows them)", n)
		}
	}
	return nil
}
