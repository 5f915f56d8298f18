package chart

// The matrix's curves: one PNG per dimension of the drain cells, and p99
// against the offered rate.

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/cdc-relay/cdc-relay/bench/internal/results"
)

var (
	colorWalsender      = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	colorWalsenderRelay = color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff}
)

// Dimension is one dimension of the drain cells.
type Dimension struct {
	Name  string // file suffix and axis label: txn, partitions, topics, payload
	Label string
	of    func(results.Shape) int
	// without zeroes the dimension, so cells that differ from the headline
	// in it only compare equal.
	without func(results.Shape) results.Shape
}

// Dimensions are the drain cells' dimensions, in the order of the README.
var Dimensions = []Dimension{
	{"txn", "events per transaction", func(s results.Shape) int { return s.TxnSize }, func(s results.Shape) results.Shape { s.TxnSize = 0; return s }},
	{"partitions", "partitions per topic", func(s results.Shape) int { return s.Partitions }, func(s results.Shape) results.Shape { s.Partitions = 0; return s }},
	{"topics", "topics (aggregate types)", func(s results.Shape) int { return s.Topics }, func(s results.Shape) results.Shape { s.Topics = 0; return s }},
	{"payload", "payload bytes", func(s results.Shape) int { return s.Payload }, func(s results.Shape) results.Shape { s.Payload = 0; return s }},
}

// cellsAlong returns the cells that differ from the headline in d only,
// ordered by d's value.
func cellsAlong(r *results.Results, d Dimension) []results.Cell {
	head := d.without(r.Config.Headline())
	var out []results.Cell
	for _, c := range r.Cells {
		if d.without(c.Shape) == head {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b results.Cell) int { return d.of(a.Shape) - d.of(b.Shape) })
	return out
}

// WriteCurves draws, for each dimension with at least two cells, base +
// "-<dimension>.png" (events/s and CPU µs per event against the dimension),
// and with steady-load cells base + "-latency.png" (p99 against the offered
// rate). It returns the files written.
func WriteCurves(r *results.Results, base string) ([]string, error) {
	var written []string
	for _, d := range Dimensions {
		cells := cellsAlong(r, d)
		if len(cells) < 2 {
			continue
		}
		rate, cpu, err := dimensionPlots(d, cells)
		if err != nil {
			return written, err
		}
		path := base + "-" + d.Name + ".png"
		if err := writePNG(path, rate, cpu); err != nil {
			return written, err
		}
		written = append(written, path)
	}
	if len(r.LatencyCells()) > 0 {
		p, err := p99Plot(r)
		if err != nil {
			return written, err
		}
		cpu, err := latencyCPUPlot(r)
		if err != nil {
			return written, err
		}
		path := base + "-latency.png"
		if err := writePNG(path, p, cpu); err != nil {
			return written, err
		}
		written = append(written, path)
	}
	return written, nil
}

// series is one line of a curve.
type series struct {
	name   string
	c      color.Color
	dashed bool
	xys    plotter.XYs
}

// dimensionPlots are the two panels of a dimension: drain rate with the
// walsender's ceiling, and CPU µs per event of the processes and of the
// walsender.
func dimensionPlots(d Dimension, cells []results.Cell) (*plot.Plot, *plot.Plot, error) {
	var ticks []plot.Tick
	rate := []series{{name: "limit reader", c: colorLimit}, {name: "relay", c: colorRelay}, {name: "poller", c: colorPoller},
		{name: "walsender ceiling (one core)", c: colorWalsender, dashed: true}}
	cpu := []series{{name: "limit reader", c: colorLimit}, {name: "relay", c: colorRelay}, {name: "poller", c: colorPoller},
		{name: "walsender, limit's drain", c: colorWalsender, dashed: true}, {name: "walsender, relay's drain", c: colorWalsenderRelay, dashed: true}}
	for _, c := range cells {
		x := float64(d.of(c.Shape))
		ticks = append(ticks, plot.Tick{Value: x, Label: strconv.Itoa(d.of(c.Shape))})
		for i, v := range []float64{c.Limit.Rate, c.Relay.Rate, c.Poller.Rate, c.WalsenderCeiling()} {
			if v > 0 {
				rate[i].xys = append(rate[i].xys, plotter.XY{X: x, Y: v})
			}
		}
		for i, v := range []float64{c.Limit.CPUPerEventUS, c.Relay.CPUPerEventUS, c.Poller.CPUPerEventUS, c.Limit.WalsenderUSPerEvent, c.Relay.WalsenderUSPerEvent} {
			if v > 0 {
				cpu[i].xys = append(cpu[i].xys, plotter.XY{X: x, Y: v})
			}
		}
	}
	ylabel, logY := "events/s (process start → last event)", spansDecades(rate)
	if logY {
		ylabel += " (log)"
	}
	rp, err := linePlot("drain rate by "+d.Label, d.Label, ylabel, ticks, rate, true, logY)
	if err != nil {
		return nil, nil, err
	}
	cp, err := linePlot("CPU per event by "+d.Label, d.Label, "CPU µs per event (log)", ticks, cpu, true, true)
	if err != nil {
		return nil, nil, err
	}
	return rp, cp, nil
}

// spansDecades reports whether the lines' values span more than a factor of
// 20, where a linear axis would flatten the small ones to its floor (the
// payload cells drain at 60k and 200 events/s).
func spansDecades(lines []series) bool {
	lo, hi := math.Inf(1), 0.0
	for _, s := range lines {
		for _, xy := range s.xys {
			lo, hi = math.Min(lo, xy.Y), math.Max(hi, xy.Y)
		}
	}
	return lo > 0 && hi/lo > 20
}

// p99Plot is p99 (commit → consumer-visible; the limit reader's commit →
// decoded) against the offered rate, one line per system and transaction size.
func p99Plot(r *results.Results) (*plot.Plot, error) {
	return latencyLines(r, "p99 latency by offered load", "p99 ms (log)", func(l results.Latency) float64 { return math.Max(l.P99, 0.01) })
}

// latencyCPUPlot is the CPU per event of the process under test at each load.
func latencyCPUPlot(r *results.Results) (*plot.Plot, error) {
	return latencyLines(r, "CPU per event under steady load", "process CPU µs per event (log)", func(l results.Latency) float64 { return l.CPUPerEventUS })
}

func latencyLines(r *results.Results, title, ylabel string, value func(results.Latency) float64) (*plot.Plot, error) {
	var txns []int
	var ticks []plot.Tick
	for _, lc := range r.LatencyCells() {
		if !slices.Contains(txns, lc.TxnSize) {
			txns = append(txns, lc.TxnSize)
		}
		if !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Value == float64(lc.Rate) }) {
			ticks = append(ticks, plot.Tick{Value: float64(lc.Rate), Label: strconv.Itoa(lc.Rate)})
		}
	}
	var lines []series
	for k, txn := range txns {
		for _, sys := range []struct {
			system, name string
			c            color.Color
		}{{"reader", "limit reader", colorLimit}, {"relay", "relay", colorRelay}, {"poller", "poller", colorPoller}} {
			s := series{name: fmt.Sprintf("%s, %d ev/txn", sys.name, txn), c: sys.c, dashed: k > 0}
			for _, lc := range r.LatencyCells() {
				if lc.TxnSize != txn {
					continue
				}
				if l, ok := r.LatencyOf(sys.system, lc.Rate, lc.TxnSize); ok && l.Samples > 0 && value(l) > 0 {
					s.xys = append(s.xys, plotter.XY{X: float64(lc.Rate), Y: value(l)})
				}
			}
			lines = append(lines, s)
		}
	}
	return linePlot(title, "offered load, events/s", ylabel, ticks, lines, true, true)
}

// linePlot draws lines against x at ticks, on log axes as asked.
func linePlot(title, xlabel, ylabel string, ticks []plot.Tick, lines []series, logX, logY bool) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	if logX {
		p.X.Scale = plot.LogScale{}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range lines {
		if len(s.xys) == 0 {
			continue
		}
		for _, xy := range s.xys {
			lo, hi = math.Min(lo, xy.Y), math.Max(hi, xy.Y)
		}
		line, points, err := plotter.NewLinePoints(s.xys)
		if err != nil {
			return nil, fmt.Errorf("draw %s: %w", s.name, err)
		}
		line.Color, points.Color = s.c, s.c
		line.Width = vg.Points(2)
		if s.dashed {
			line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		points.Radius = vg.Points(3)
		p.Add(line, points)
		p.Legend.Add(s.name, line, points)
	}
	if len(ticks) > 0 {
		p.X.Min, p.X.Max = ticks[0].Value, ticks[0].Value
		for _, t := range ticks {
			p.X.Min, p.X.Max = math.Min(p.X.Min, t.Value), math.Max(p.X.Max, t.Value)
		}
		p.X.Min, p.X.Max = p.X.Min/1.5, p.X.Max*1.5
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Min, p.Y.Max = lo/2, hi*8 // room for the legend
	} else {
		p.Y.Min, p.Y.Max = 0, hi*1.45
	}
	return p, nil
}

// writePNG draws the panels side by side into path.
func writePNG(path string, panels ...*plot.Plot) error {
	img := vgimg.NewWith(vgimg.UseWH(13*vg.Inch, 5*vg.Inch), vgimg.UseDPI(100), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Inch / 2, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 8}
	canvases := plot.Align([][]*plot.Plot{panels}, tiles, dc)
	for i, p := range panels {
		p.Draw(canvases[0][i])
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create chart: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write chart %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write chart %s: %w", path, err)
	}
	return nil
}
