package results

import (
	"math"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/bench/internal/latency"
)

// twoModes is a run with two rounds per delivery mode at one load.
func twoModes() *Results {
	lat := func(delivery string, round int, p50, p99 float64) Latency {
		return Latency{System: "relay", Delivery: delivery, Round: round, Rate: 1000, AchievedRate: 1000,
			Summary: latency.Summary{Samples: 100, P50: p50, P99: p99}}
	}
	r := &Results{
		Config: Config{Rates: []int{1000}, DeliveryRounds: 2},
		RelayRuns: []Drain{
			{Name: "relay eo1", Delivery: EffectivelyOnce, Round: 1, Rate: 60000},
			{Name: "relay alo1", Delivery: AtLeastOnce, Round: 1, Rate: 64000},
			{Name: "relay eo2", Delivery: EffectivelyOnce, Round: 2, Rate: 62000},
			{Name: "relay alo2", Delivery: AtLeastOnce, Round: 2, Rate: 63000},
		},
		Latency: []Latency{
			lat(EffectivelyOnce, 1, 2, 9), lat(AtLeastOnce, 1, 2, 7.5),
			lat(EffectivelyOnce, 2, 2.5, 8), lat(AtLeastOnce, 2, 2, 8.5),
			{System: "poller", Rate: 1000, Summary: latency.Summary{Samples: 100, P50: 5, P99: 60}},
		},
		Reconcile: []Reconcile{{TopicPartitions: 256, Events: 1000, KilledAfter: 500, Partitions: 256, DurationMs: 40, AlreadyInKafka: 12, ReadySeconds: 0.5}},
	}
	r.Relay, _ = r.BestDrain(EffectivelyOnce)
	r.Evaluate()
	return r
}

func TestDeliveryComparison(t *testing.T) {
	r := twoModes()
	d := r.Delivery
	if d.EffectivelyOnceRate != 62000 || d.AtLeastOnceRate != 64000 || math.Abs(d.RateRatio-62000.0/64000) > 1e-9 {
		t.Errorf("drain: best %v / %v, ratio %v; want each mode's faster run", d.EffectivelyOnceRate, d.AtLeastOnceRate, d.RateRatio)
	}
	if len(d.EffectivelyOnceRates) != 2 || len(d.AtLeastOnceRates) != 2 {
		t.Errorf("drain runs %v, %v: want both rounds of each", d.EffectivelyOnceRates, d.AtLeastOnceRates)
	}
	if len(d.Latency) != 1 {
		t.Fatalf("latency comparisons %+v, want one per rate", d.Latency)
	}
	l := d.Latency[0]
	if l.EffectivelyOnceP99 != 8 || l.EffectivelyOnceP50 != 2.5 || l.AtLeastOnceP99 != 7.5 || l.P99DiffMs != 0.5 {
		t.Errorf("latency %+v: want each mode's run with the lower p99, difference 0.5", l)
	}
	if got, _ := r.LatencyOf("relay", 1000, 0); got.Delivery != EffectivelyOnce || got.P99 != 8 {
		t.Errorf("LatencyOf(relay) = %+v, want the best effectively-once run", got)
	}
	if got, _ := r.LatencyOf("poller", 1000, 0); got.P99 != 60 {
		t.Errorf("LatencyOf(poller) = %+v", got)
	}
	pass := map[string]bool{}
	for _, tg := range r.Targets {
		pass[tg.Name] = tg.Pass
	}
	if v, ok := pass["eo drain ≥ 0.95 × at-least-once"]; !ok || !v {
		t.Errorf("drain target %v (present %v), want PASS at ratio 0.97", v, ok)
	}
	if v, ok := pass["eo p99 ≤ at-least-once + 1 ms @1k"]; !ok || !v {
		t.Errorf("p99 target %v (present %v), want PASS at +0.5 ms", v, ok)
	}
}

func TestDeliveryTargetsMiss(t *testing.T) {
	r := twoModes()
	r.RelayRuns[1].Rate = 70000
	r.Latency[2].P99 = 12 // effectively-once #2; #1 has 9: +1.5 ms over 7.5
	r.Evaluate()
	for _, tg := range r.Targets {
		if strings.HasPrefix(tg.Name, "eo ") && tg.Pass {
			t.Errorf("target %q passed with %s", tg.Name, tg.Got)
		}
	}
}

// TestDeliveryTargetUnreached: a load the generator did not reach is not
// judged (its latencies measure the generator's queue), whatever they are.
func TestDeliveryTargetUnreached(t *testing.T) {
	r := twoModes()
	for i := range r.Latency {
		r.Latency[i].AchievedRate = 600
	}
	r.Latency[2].P99 = 500 // effectively-once far behind at-least-once
	r.Evaluate()
	found := false
	for _, tg := range r.Targets {
		if tg.Name == "eo p99 ≤ at-least-once + 1 ms @1k" {
			found = true
			if !tg.NA || tg.Pass || !strings.Contains(tg.Got, "committed only 600 and 600 of 1000") {
				t.Errorf("target %+v, want n/a naming the rates reached", tg)
			}
		}
	}
	if !found {
		t.Error("no p99 comparison target")
	}
}

func TestPrintDelivery(t *testing.T) {
	var b strings.Builder
	twoModes().Print(&b)
	out := b.String()
	for _, want := range []string{
		"relay effectively-once", "relay at-least-once",
		"ratio 0.969 (target ≥ 0.95: holds)",
		"p99 difference +0.50 ms (target ≤ +1 ms: holds)",
		"256-partition topic: first event acknowledged 0.00s after the first start; killed after 500 of 1000 events acknowledged; restart reconciled 256 partitions in 40 ms, 12 events already in Kafka; ready 0.50s",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// matrix is a run of four drain cells around the headline (1 ev/txn, 8
// partitions, 1 topic, 300 B) and one steady load.
func matrix(relayCPU256 float64) *Results {
	cell := func(name string, s Shape, limit, relay, relayCPU float64, rss int64) Cell {
		return Cell{Name: name, Shape: s, Limit: Drain{Rate: limit, CPUPerEventUS: 10}, Relay: Drain{Rate: relay, CPUPerEventUS: relayCPU, PeakRSSBytes: rss}, Poller: Drain{Rate: 30000}}
	}
	head := Shape{TxnSize: 1, Partitions: 8, Topics: 1, Payload: 300}
	p256, t50, txn10 := head, head, head
	p256.Partitions, t50.Topics, txn10.TxnSize = 256, 50, 10
	r := &Results{
		Config: Config{TxnSizes: []int{1, 10}, PartitionSet: []int{8, 256}, TopicCounts: []int{1, 50}, Payloads: []int{300},
			LatencyCells: []LatencyCell{{Rate: 10000, TxnSize: 10}}},
		Cells: []Cell{
			cell("drain/txn=1", head, 50000, 47000, 12, 30<<20),
			cell("drain/txn=10", txn10, 100000, 80000, 8, 31<<20),
			cell("drain/partitions=256", p256, 50000, 46000, relayCPU256, 40<<20),
			cell("drain/topics=50", t50, 50000, 46000, 13, 70<<20),
		},
		Latency: []Latency{{System: "relay", Delivery: EffectivelyOnce, Rate: 10000, TxnSize: 10, AchievedRate: 9990, Summary: latency.Summary{Samples: 100, P99: 4}}},
	}
	r.Cells[0].RelayRuns = []Drain{{Name: "relay eo1", Rate: 40000, PeakRSSBytes: 66 << 20}, {Name: "relay eo2", Rate: 47000, PeakRSSBytes: 30 << 20}}
	r.Evaluate()
	return r
}

func TestMatrixTargets(t *testing.T) {
	tests := []struct {
		name        string
		relayCPU256 float64
		want        map[string]bool // target name → PASS
	}{
		{"partitions within 1.2×", 14, map[string]bool{
			"relay ≥ 0.9 × limit, every drain cell": false, // txn=10 at 0.80
			"CPU/ev growth over partitions ≤ 1.2×":  true,
			"CPU/ev growth over topics ≤ 1.2×":      true,
			"peak RSS ≤ 64 MiB, every cell":         false, // topics=50 at 70 MiB, and a slower run of txn=1
			"p99 ≤ 5 ms at 10k/s, 10 ev/txn":        true,
		}},
		{"partitions over 1.2×", 15, map[string]bool{"CPU/ev growth over partitions ≤ 1.2×": false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := matrix(tt.relayCPU256)
			got := map[string]Target{}
			for _, tg := range r.Targets {
				got[tg.Name] = tg
			}
			for name, pass := range tt.want {
				tg, ok := got[name]
				if !ok || tg.NA || tg.Pass != pass {
					t.Errorf("target %q = %+v (present %v), want pass %v", name, tg, ok, pass)
				}
			}
			if tg := got["peak RSS ≤ 64 MiB, every cell"]; !strings.Contains(tg.Got, "70.0 MiB (drain/topics=50") {
				t.Errorf("peak RSS target %+v: want the highest of every run", tg)
			}
			if tg := got["p99 ≤ 5 ms at 10k/s, 1 ev/txn"]; !tg.NA {
				t.Errorf("p99 at 10k/s×1 not run: want n/a, got %+v", tg)
			}
			if c := r.Cells[1]; math.Abs(c.RelayOverLimit-0.8) > 1e-9 || c.RelayOverLimitCPU != 0.8 {
				t.Errorf("cell ratios %+v", c)
			}
		})
	}
}

func TestCPUBoundRate(t *testing.T) {
	tests := []struct {
		name   string
		d      Drain
		cores  int
		wantUS float64
		want   float64
	}{
		// The 64 KiB cell of 2026-12-01: relay 0.80 s, Postgres 1.26 s, broker 0.76 s.
		{"relay beside the broker", Drain{Events: 4096, CPUSeconds: 0.80, PGCPUSeconds: 1.26, BenchCPUSeconds: 0.76}, 2, 688.48, 2904.9},
		{"outside CPU not counted", Drain{Events: 1000, CPUSeconds: 0.5, PGCPUSeconds: 0.5, ForeignCPUSeconds: 9}, 2, 1000, 2000},
		{"not measured", Drain{Events: 1000}, 2, 0, 0},
		{"no events", Drain{CPUSeconds: 1}, 2, 0, 0},
		{"cores unknown", Drain{Events: 1000, CPUSeconds: 1}, 0, 1000, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.d.MachineCPUPerEventUS(); math.Abs(got-tt.wantUS) > 0.01 {
				t.Errorf("MachineCPUPerEventUS = %.2f, want %.2f", got, tt.wantUS)
			}
			if got := tt.d.CPUBoundRate(tt.cores); math.Abs(got-tt.want) > 0.1 {
				t.Errorf("CPUBoundRate(%d) = %.1f, want %.1f", tt.cores, got, tt.want)
			}
		})
	}
}

func TestWalsenderCeiling(t *testing.T) {
	ws := func(us float64) Drain { return Drain{WalsenderUSPerEvent: us} }
	tests := []struct {
		name string
		c    Cell
		want float64
	}{
		// The headline of 2026-12-02: the relay's walsender took 18.9 µs, the limit's 20.2.
		{"the cheaper walsender counts", Cell{Limit: ws(20.2), Relay: ws(18.9)}, 52910.1},
		{"limit only", Cell{Limit: ws(4.0)}, 250000},
		{"not measured", Cell{Poller: ws(0)}, 0},
		// 2026-12-07: a relay that caught up in batches left its walsender
		// 0.04 µs/ev, and the cell printed a ceiling of 25,000,000 ev/s.
		{"the relay caught up: the limit's walsender counts", Cell{Limit: ws(20.2), Relay: Drain{WalsenderUSPerEvent: 0.04, CatchUpBatches: 3}}, 49504.9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.c.WalsenderCeiling(); math.Abs(got-tt.want) > 0.1 {
				t.Errorf("WalsenderCeiling = %.1f, want %.1f", got, tt.want)
			}
		})
	}
}

func TestDrainTargetSaysCPUBound(t *testing.T) {
	r := matrix(14)
	r.Host.CPUs = 2
	// txn=10 is below 0.9: 80,000 against 100,000 ev/s.
	r.Cells[1].Relay.Events, r.Cells[1].Relay.CPUSeconds, r.Cells[1].Relay.PGCPUSeconds, r.Cells[1].Relay.BenchCPUSeconds = 100000, 0.8, 1.2, 0.5
	r.Evaluate()
	for _, tg := range r.Targets {
		if tg.Name != "relay ≥ 0.9 × limit, every drain cell" {
			continue
		}
		want := "drain/txn=10: the relay, Postgres and the broker took 25 µs of CPU per event, so 2 cores bound it at 80000 ev/s (0.80 × limit)"
		if tg.Pass || !strings.Contains(tg.Got, want) {
			t.Errorf("target %+v: want a MISS saying %q", tg, want)
		}
		if strings.Contains(tg.Got, "drain/txn=1:") {
			t.Errorf("target %q: a cell at or above 0.9 needs no bound", tg.Got)
		}
		return
	}
	t.Fatal("no relay ≥ 0.9 × limit target")
}
