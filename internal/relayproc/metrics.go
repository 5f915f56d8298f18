package relayproc

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one sample of a Prometheus text exposition, as it was exposed:
// a histogram's bucket is Name "<family>_bucket" with the label le, a
// summary's quantile the label quantile, each last.
type Sample struct {
	Name   string
	Labels []Label // in the exposition's order
	Value  float64
}

// Label is one label of a Sample.
type Label struct{ Name, Value string }

// Label returns the value of the label name, and whether the sample has it.
func (s Sample) Label(name string) (string, bool) {
	for _, l := range s.Labels {
		if l.Name == name {
			return l.Value, true
		}
	}
	return "", false
}

// Key is the sample as the exposition writes it before its value:
// name{label="value",…}, or the name alone.
func (s Sample) Key() string {
	if len(s.Labels) == 0 {
		return s.Name
	}
	var b strings.Builder
	b.WriteString(s.Name)
	b.WriteByte('{')
	for i, l := range s.Labels {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(l.Name)
		b.WriteString(`="`)
		b.WriteString(labelEscaper.Replace(l.Value))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// labelEscaper escapes a label value as the text format does.
var labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)

// ParseMetrics reads a Prometheus text exposition (what /metrics serves)
// with prometheus/common's parser and returns its samples.
func ParseMetrics(r io.Reader) ([]Sample, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	var out []Sample
	for name, f := range families {
		for _, m := range f.GetMetric() {
			out = append(out, samples(name, f.GetType(), m)...)
		}
	}
	return out, nil
}

// samples are the samples the text format writes for metric m of the family
// name of type typ.
func samples(name string, typ dto.MetricType, m *dto.Metric) []Sample {
	labels := make([]Label, 0, len(m.GetLabel())+1)
	for _, l := range m.GetLabel() {
		labels = append(labels, Label{l.GetName(), l.GetValue()})
	}
	with := func(extra, value string) []Label {
		return append(labels[:len(labels):len(labels)], Label{extra, value})
	}
	switch typ {
	case dto.MetricType_COUNTER:
		return []Sample{{name, labels, m.GetCounter().GetValue()}}
	case dto.MetricType_GAUGE:
		return []Sample{{name, labels, m.GetGauge().GetValue()}}
	case dto.MetricType_SUMMARY:
		s := m.GetSummary()
		var out []Sample
		for _, q := range s.GetQuantile() {
			out = append(out, Sample{name, with(model.QuantileLabel, formatFloat(q.GetQuantile())), q.GetValue()})
		}
		return append(out, Sample{name + "_sum", labels, s.GetSampleSum()}, Sample{name + "_count", labels, float64(s.GetSampleCount())})
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		h := m.GetHistogram()
		var out []Sample
		for _, b := range h.GetBucket() {
			out = append(out, Sample{name + "_bucket", with(model.BucketLabel, formatFloat(b.GetUpperBound())), bucketCount(b)})
		}
		count := float64(h.GetSampleCount())
		if h.GetSampleCountFloat() > 0 {
			count = h.GetSampleCountFloat()
		}
		return append(out, Sample{name + "_sum", labels, h.GetSampleSum()}, Sample{name + "_count", labels, count})
	default:
		return []Sample{{name, labels, m.GetUntyped().GetValue()}}
	}
}

func bucketCount(b *dto.Bucket) float64 {
	if b.GetCumulativeCountFloat() > 0 {
		return b.GetCumulativeCountFloat()
	}
	return float64(b.GetCumulativeCount())
}

// formatFloat writes f as the text format does ("+Inf", "0.005").
func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}
