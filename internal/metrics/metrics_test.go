package metrics_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
)

// TestNewOnSeparateRegistries checks that New registers only on the registry it
// is given: two relays (or two tests) in one process must not collide.
func TestNewOnSeparateRegistries(t *testing.T) {
	for i := range 2 {
		reg := prometheus.NewRegistry()
		m := metrics.New(reg)
		if m == nil {
			t.Fatalf("New #%d returned nil", i)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatalf("gather #%d: %v", i, err)
		}
		if len(mfs) == 0 {
			t.Fatalf("New #%d registered nothing that gathers", i)
		}
	}
	// Discard uses a private registry too, so it can be called repeatedly.
	_ = metrics.Discard()
	_ = metrics.Discard()
}

func TestNewTwiceOnOneRegistryPanics(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics.New(reg)
	defer func() {
		if recover() == nil {
			t.Fatal("second New on the same registry did not panic; duplicate registration went unnoticed")
		}
	}()
	metrics.New(reg)
}

func TestSetState(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	for _, s := range metrics.States {
		if got := testutil.ToFloat64(m.State.WithLabelValues(s)); got != 0 {
			t.Errorf("after New: state %q = %v, want 0", s, got)
		}
	}
	for _, cur := range slices.Concat(metrics.States, []string{metrics.StateStreaming}) { // and back again
		m.SetState(cur)
		for _, s := range metrics.States {
			want := 0.0
			if s == cur {
				want = 1
			}
			if got := testutil.ToFloat64(m.State.WithLabelValues(s)); got != want {
				t.Errorf("SetState(%q): state %q = %v, want %v", cur, s, got, want)
			}
		}
	}
	if n := testutil.CollectAndCount(m.State); n != len(metrics.States) {
		t.Errorf("state series = %d, want %d (one per state, no others)", n, len(metrics.States))
	}
}

// TestLint runs promlint over every metric, with each vector given one child so
// that it is gathered.
func TestLint(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	m.EventsPublished.WithLabelValues("t")
	m.BytesPublished.WithLabelValues("t")
	m.PermanentFailures.WithLabelValues("c")
	m.SlotProblems.WithLabelValues("k")
	m.BuildInfo.WithLabelValues("v", "go")
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n == 0 {
		t.Fatalf("gathered %d series, err %v", n, err)
	}
}

// TestObserveOutboxWaitBoundsLabels: each event type gets its own series
// up to metrics.MaxEventTypeLabels; later types share metrics.OtherEventType.
func TestObserveOutboxWaitBoundsLabels(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	for i := range metrics.MaxEventTypeLabels + 50 {
		m.ObserveOutboxWait([]byte(fmt.Sprintf("type-%d", i)), time.Duration(i)*time.Millisecond)
	}
	m.ObserveOutboxWait([]byte("type-0"), time.Second)
	if n := testutil.CollectAndCount(m.OutboxWait); n != metrics.MaxEventTypeLabels+1 {
		t.Errorf("%d outbox_wait_seconds series, want %d types and %s", n, metrics.MaxEventTypeLabels, metrics.OtherEventType)
	}
	if got := testutil.ToFloat64(histCount(t, m, metrics.OtherEventType)); got != 50 {
		t.Errorf("%s counted %v observations, want 50", metrics.OtherEventType, got)
	}
	if got := testutil.ToFloat64(histCount(t, m, "type-0")); got != 2 {
		t.Errorf("type-0 counted %v observations, want 2", got)
	}
}

// histCount returns the observation count of OutboxWait's series for label
// as a gauge, for testutil.ToFloat64.
func histCount(t *testing.T, m *metrics.Metrics, label string) prometheus.Gauge {
	t.Helper()
	var out dto.Metric
	if err := m.OutboxWait.WithLabelValues(label).(prometheus.Histogram).Write(&out); err != nil {
		t.Fatal(err)
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "n"})
	g.Set(float64(out.GetHistogram().GetSampleCount()))
	return g
}
