// Package chart draws a run's results as PNGs: the summary (a) headline
// drain rate of the limit reader, the relay and the poller, (b) latency
// p50/p99 at each steady load; and the matrix's curves (curves.go).
package chart

import (
	"fmt"
	"image/color"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/cdc-relay/cdc-relay/bench/internal/results"
)

var (
	colorLimit  = color.RGBA{R: 0x88, G: 0x88, B: 0x88, A: 0xff}
	colorRelay  = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	colorPoller = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
)

// Write draws r into a PNG file at path.
func Write(r *results.Results, path string) error {
	drain, err := drainPlot(r)
	if err != nil {
		return err
	}
	lat, err := latencyPlot(r)
	if err != nil {
		return err
	}
	img := vgimg.NewWith(vgimg.UseWH(13*vg.Inch, 5*vg.Inch), vgimg.UseDPI(110), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Inch / 2, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 8}
	plots := [][]*plot.Plot{{drain, lat}}
	canvases := plot.Align(plots, tiles, dc)
	drain.Draw(canvases[0][0])
	lat.Draw(canvases[0][1])

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

// drainPlot is panel (a): one bar per system, labelled with its rate, and
// the walsender's ceiling across them.
func drainPlot(r *results.Results) (*plot.Plot, error) {
	p := plot.New()
	h := r.Config.Headline()
	p.Title.Text = fmt.Sprintf("(a) headline drain: %d events, %d per transaction", r.Config.Events, h.TxnSize)
	p.Y.Label.Text = "events/s (process start → last event done)"
	bars := []struct {
		name string
		rate float64
		c    color.Color
	}{
		{"limit reader", r.Limit.Rate, colorLimit},
		{"relay", r.Relay.Rate, colorRelay},
		{"poller", r.Poller.Rate, colorPoller},
	}
	p.Add(plotter.NewGrid())
	names := make([]string, 0, len(bars))
	var labels plotter.XYLabels
	top := 0.0
	for i, b := range bars {
		bc, err := plotter.NewBarChart(plotter.Values{b.rate}, vg.Points(60))
		if err != nil {
			return nil, fmt.Errorf("draw drain bars: %w", err)
		}
		bc.XMin = float64(i)
		bc.Color = b.c
		bc.LineStyle.Width = 0
		p.Add(bc)
		names = append(names, b.name)
		labels.XYs = append(labels.XYs, plotter.XY{X: float64(i), Y: b.rate})
		labels.Labels = append(labels.Labels, fmt.Sprintf("%.0f", b.rate))
		top = math.Max(top, b.rate)
	}
	l, err := plotter.NewLabels(labels)
	if err != nil {
		return nil, fmt.Errorf("draw drain labels: %w", err)
	}
	for i := range l.TextStyle {
		l.TextStyle[i].XAlign = draw.XCenter
		l.TextStyle[i].YAlign = draw.YBottom
	}
	p.Add(l)
	if ceil := (results.Cell{Limit: r.Limit, Relay: r.Relay}).WalsenderCeiling(); ceil > 0 {
		line, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: ceil}, {X: float64(len(bars)) - 0.5, Y: ceil}})
		if err != nil {
			return nil, fmt.Errorf("draw walsender ceiling: %w", err)
		}
		line.Color = colorWalsender
		line.Width = vg.Points(2)
		line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		p.Add(line)
		p.Legend.Add(fmt.Sprintf("walsender ceiling: one core ÷ %.1f µs/ev = %.0f ev/s", 1e6/ceil, ceil), line)
		p.Legend.Top = true
		top = math.Max(top, ceil)
	}
	p.NominalX(names...)
	p.Y.Min = 0
	p.Y.Max = math.Max(top*1.2, 1) // an empty axis when the headline drain did not run
	return p, nil
}

// latencyPlot is panel (b): p50 and p99 per offered rate, log scale.
func latencyPlot(r *results.Results) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "(b) latency: commit → consumer (limit reader: → decoded), log scale"
	p.Add(plotter.NewGrid())
	p.Y.Label.Text = "ms"
	p.X.Label.Text = "offered load"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.Legend.Left = true
	cells := r.LatencyCells()
	names := make([]string, 0, len(cells))
	for _, lc := range cells {
		name := fmt.Sprintf("%d ev/s", lc.Rate)
		if lc.TxnSize > 0 {
			name += fmt.Sprintf(", %d/txn", lc.TxnSize)
		}
		names = append(names, name)
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	series := []struct {
		system, pct string
		c           color.Color
		dashed      bool
	}{
		{"reader", "p50", colorLimit, false},
		{"reader", "p99", colorLimit, true},
		{"relay", "p50", colorRelay, false},
		{"relay", "p99", colorRelay, true},
		{"poller", "p50", colorPoller, false},
		{"poller", "p99", colorPoller, true},
	}
	for _, s := range series {
		var xys plotter.XYs
		for i, lc := range cells {
			l, ok := r.LatencyOf(s.system, lc.Rate, lc.TxnSize)
			if !ok || l.Samples == 0 {
				continue
			}
			v := l.P50
			if s.pct == "p99" {
				v = l.P99
			}
			v = math.Max(v, 0.01) // a log axis has no zero
			lo, hi = math.Min(lo, v), math.Max(hi, v)
			xys = append(xys, plotter.XY{X: float64(i), Y: v})
		}
		if len(xys) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, fmt.Errorf("draw latency %s %s: %w", s.system, s.pct, err)
		}
		line.Color = s.c
		line.Width = vg.Points(2)
		if s.dashed {
			line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		points.Color = s.c
		points.Radius = vg.Points(3.5)
		p.Add(line, points)
		p.Legend.Add(s.system+" "+s.pct, line, points)
	}
	if len(names) == 0 {
		names = []string{"no steady-load cell ran"}
	}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.3, float64(len(names))-0.7
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	p.Y.Min, p.Y.Max = lo/2, hi*40 // room for the legend above the lines
	return p, nil
}
