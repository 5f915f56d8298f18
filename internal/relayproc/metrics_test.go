package relayproc

import (
	"io"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// TestParseMetrics parses what client_golang's handler serves for every
// kind of metric and checks that each sample's Key and Value are what the
// exposition's line says (the line up to its last space, then the value).
func TestParseMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_events_total", Help: "h"}, []string{"topic", "result"})
	c.WithLabelValues("a", "ok").Add(42)
	c.WithLabelValues(`q"uote\back`+"\nline", "error").Add(1)
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "t_in_flight", Help: "h"})
	g.Set(-2.5)
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "t_wait_seconds", Help: "h", Buckets: []float64{0.005, 1, 10}}, []string{"topic"})
	h.WithLabelValues("a").Observe(0.5)
	h.WithLabelValues("a").Observe(20)
	s := prometheus.NewSummary(prometheus.SummaryOpts{Name: "t_size_bytes", Help: "h", Objectives: map[float64]float64{0.5: 0.05, 0.99: 0.001}})
	s.Observe(3)
	reg.MustRegister(c, g, h, s)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	get := func() string {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	text := get()
	want := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		want[line[:i]] = v
	}
	got, err := ParseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, s := range got {
		keys[s.Key()] = true
		if v, ok := want[s.Key()]; !ok || v != s.Value {
			t.Errorf("sample %s = %v; the exposition has %v (present %v)", s.Key(), s.Value, v, ok)
		}
	}
	for k := range want {
		if !keys[k] {
			t.Errorf("the exposition's %s is not among the parsed samples", k)
		}
	}
	if len(want) != 13 { // 2 counters, 1 gauge, 4 buckets + sum + count, 2 quantiles + sum + count
		t.Errorf("only %d samples exposed:\n%s", len(want), text)
	}
	if _, err := ParseMetrics(strings.NewReader("t_x{topic=\"a\" 1\n")); err == nil {
		t.Error("ParseMetrics accepted a line with an unclosed label set")
	}
}
