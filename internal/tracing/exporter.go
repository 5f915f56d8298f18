package tracing

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// exporter is the OTLP exporter as the batch span processor calls it. It
// counts every batch's result and logs failures itself, then reports them
// handled: the processor would pass them to OpenTelemetry's global error
// handler, which writes plain lines with the standard library's log into the
// relay's JSON log, and which the relay leaves alone (no global state). Its
// exports end when stop does (Shutdown past its deadline).
type exporter struct {
	next sdktrace.SpanExporter
	stop context.Context
	log  zerolog.Logger // sampled

	exported, failed prometheus.Counter
}

var _ sdktrace.SpanExporter = (*exporter)(nil)

// ExportSpans exports spans; a failure (after the OTLP exporter's own
// retries) drops them. The relay's events are not affected either way.
func (e *exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(e.stop, cancel)()
	if err := e.next.ExportSpans(ctx, spans); err != nil {
		e.failed.Add(float64(len(spans)))
		e.log.Warn().Err(err).Int("spans", len(spans)).
			Msg("cannot export trace spans over OTLP; they are dropped (the events themselves are not affected)")
		return nil
	}
	e.exported.Add(float64(len(spans)))
	return nil
}

// Shutdown shuts the OTLP exporter down.
func (e *exporter) Shutdown(ctx context.Context) error { return e.next.Shutdown(ctx) }
