package baseline

// The table cells (replay/rows=N, join/rows=N; issue 42 point 7) are guarded
// by their rows/s. Each runs once, so a recording has no spread of its own
// and the widest threshold applies; and no lean loop runs beside them to
// tell a slow relay from a slow machine, so a fall in a run where processes
// outside the benchmark took more than BusyShare of the machine is said but
// not counted.

import (
	"fmt"
	"math"

	"github.com/cdc-relay/cdc-relay/bench/internal/results"
)

// The marks of a RateVerdict besides OK and NoFigures.
const (
	Drop     = "DROP"               // rows/s fell more than the threshold on a quiet machine
	DownBusy = "down, machine busy" // it fell, with others taking more than BusyShare of the machine
	Higher   = "higher"             // rows/s rose more than the threshold
)

// BusyShare is the share of the machine that processes outside the
// benchmark may take during a table cell's run for a fall to count.
const BusyShare = 0.10

// recordTable takes the baseline figures of a table cell: its rows/s. A
// cell whose rows did not all reach Kafka once is no baseline.
func recordTable(c results.TableCell, rec Cell) (Cell, error) {
	if !c.Kafka.OK || c.Run.Rate <= 0 {
		return rec, fmt.Errorf("record baseline of %s: %.0f rows/s with %d rows lost and %d duplicates in Kafka: not a baseline", c.Name, c.Run.Rate, c.Kafka.Missing, c.Kafka.Duplicates)
	}
	rec.RowsPerSecond = c.Run.Rate
	return rec, nil
}

// RateVerdict is one table cell of a run against its baseline. Change is
// relative (-0.25 is 25 % fewer rows/s).
type RateVerdict struct {
	Mark      string
	Base, Now float64 // rows/s
	Change    float64
	Threshold float64
	Busy      float64 // the share of the machine that other processes took
}

// CompareRate judges a table cell's rows/s against base: DROP when it fell
// more than the threshold (base's spread clamped to
// MinThreshold..MaxThreshold; MaxThreshold when base has none, as a single
// run has) while others took at most BusyShare of the machine, down,
// machine busy when they took more; higher when it rose more than the
// threshold; ok otherwise.
func CompareRate(base Cell, now results.TableCell) RateVerdict {
	v := RateVerdict{Base: base.RowsPerSecond, Now: now.Run.Rate, Busy: now.Run.ForeignShare, Threshold: MaxThreshold}
	if base.Spread > 0 {
		v.Threshold = math.Min(math.Max(base.Spread, MinThreshold), MaxThreshold)
	}
	if v.Base <= 0 || v.Now <= 0 {
		v.Mark = NoFigures
		return v
	}
	v.Change = v.Now/v.Base - 1
	switch {
	case v.Change < -v.Threshold && v.Busy > BusyShare:
		v.Mark = DownBusy
	case v.Change < -v.Threshold:
		v.Mark = Drop
	case v.Change > v.Threshold:
		v.Mark = Higher
	default:
		v.Mark = OK
	}
	return v
}

// String is the verdict as the benchmark prints it after the cell's name.
func (v RateVerdict) String() string {
	if v.Mark == NoFigures {
		return v.Mark
	}
	return fmt.Sprintf("%.0f rows/s (baseline %.0f, %+.1f%%), other processes %.0f%% of the machine, threshold %.0f%%: %s",
		v.Now, v.Base, 100*v.Change, 100*v.Busy, 100*v.Threshold, v.Mark)
}
