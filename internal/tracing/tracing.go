// Package tracing exports the relay's own OpenTelemetry span of each event
// that carries a trace context (operations.otel_exporter otlp), so a trace shows the
// application's transaction, the relay, Kafka and the consumer in one line.
//
// The application writes a W3C trace context into the outbox row (the tracing
// column, see decoder.ParseTraceContext); the decoder turns it into the
// event's traceparent and tracestate headers. With spans exported, Start
// begins a PRODUCER span as a child of that context when the relay reads the
// event, and gives the traceparent that names the relay's span, which the
// record carries instead of the event's (sink.Message.TraceParent; the event
// is not changed): the consumer's span then becomes a child of the relay's. End finishes the span when Kafka acknowledged the event
// (with its partition and offset) or when it failed for good. Spans follow
// the OpenTelemetry messaging semantic conventions v1.24.0 (the span name
// "<topic> publish", messaging.* attributes); the SDK's batch span processor
// hands them to the package's own OTLP/HTTP exporter (binary protobuf,
// encoded with protowire: the official exporters would link gRPC into the
// binary), configured by the standard OTEL_* variables.
//
// Without operations.otel_exporter otlp nothing of this package runs: the relay holds
// no Spans and its headers stay as the row had them.
package tracing

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.24.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// Exporters (operations.otel_exporter).
const (
	// ExporterNone exports no spans; trace headers go out as the row has them.
	ExporterNone = "none"
	// ExporterOTLP exports a span per traced event over OTLP.
	ExporterOTLP = "otlp"
)

// FlushTimeout bounds Shutdown's export of the spans still queued when the
// relay stops; spans not exported by then are dropped.
const FlushTimeout = 5 * time.Second

// DefaultServiceName is the resource's service.name unless OTEL_SERVICE_NAME
// or OTEL_RESOURCE_ATTRIBUTES names another.
const DefaultServiceName = "cdc-relay"

// scopeName is the instrumentation scope of the relay's spans.
const scopeName = "github.com/cdc-relay/cdc-relay/internal/tracing"

// Attributes of the relay's spans beyond the messaging conventions.
const (
	attrCommitLSN      = attribute.Key("cdc_relay.commit_lsn")
	attrSourcePosition = attribute.Key("cdc_relay.source_position")
	attrEventType      = attribute.Key("cdc_relay.event_type")
	attrAggregateType  = attribute.Key("cdc_relay.aggregate_type")
	attrDeadLetter     = attribute.Key("cdc_relay.dead_letter")
)

// Config configures New.
type Config struct {
	// ServiceVersion is the resource's service.version and the scope's
	// version: the relay's version.
	ServiceVersion string
	// Logger gets export failures (at most 5 lines a minute).
	Logger zerolog.Logger
	// Metrics counts the spans' export results (trace_spans_total).
	Metrics *metrics.Metrics
}

// Spans records and exports the relay's span of each traced event. Start and
// End may be called from different goroutines, each once per event; Shutdown
// once, after the last End.
type Spans struct {
	tp       *sdktrace.TracerProvider
	tracer   trace.Tracer
	exp      *exporter
	endpoint string
	protocol string
}

// New reads the OTEL_* environment (an error names the variable to fix)
// and starts an OTLP/HTTP exporter behind the SDK's batch span processor.
// The exporter reads OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, _HEADERS,
// _INSECURE, _CERTIFICATE, _CLIENT_CERTIFICATE, _CLIENT_KEY, _COMPRESSION
// and _TIMEOUT, and refuses a _PROTOCOL other than http/protobuf; the SDK
// reads OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
// OTEL_TRACES_SAMPLER[_ARG] and OTEL_BSP_*. Nothing connects until the
// first spans are exported. The caller must call Shutdown.
func New(ctx context.Context, cfg Config) (*Spans, error) {
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.Discard()
	}
	dest, err := readEnv(os.Getenv, os.ReadFile)
	if err != nil {
		return nil, err
	}
	res, err := newResource(ctx, cfg.ServiceVersion)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With().Str("component", "tracing").Logger().Sample(&zerolog.BurstSampler{Burst: 5, Period: time.Minute})
	exp := newExporter(dest, cfg.ServiceVersion, log, cfg.Metrics)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Spans{
		tp:       tp,
		tracer:   tp.Tracer(scopeName, trace.WithInstrumentationVersion(cfg.ServiceVersion), trace.WithSchemaURL(semconv.SchemaURL)),
		exp:      exp,
		endpoint: dest.endpoint,
		protocol: dest.protocol,
	}, nil
}

// newResource describes the relay: service.name cdc-relay (unless the
// environment names another), service.version, host.name and the SDK's
// telemetry.sdk.*; OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME override.
func newResource(ctx context.Context, version string) (*resource.Resource, error) {
	attrs := []attribute.KeyValue{semconv.ServiceName(DefaultServiceName)}
	if version != "" {
		attrs = append(attrs, semconv.ServiceVersion(version))
	}
	// Later detectors win: the environment over the relay's defaults.
	res, err := resource.New(ctx,
		resource.WithHost(),
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attrs...),
		resource.WithFromEnv(),
	)
	if err != nil {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES or OTEL_SERVICE_NAME: %w (use key=value,key=value)", err)
	}
	return res, nil
}

// Endpoint is the URL spans are sent to (scheme, host and path: never
// credentials, which the exporter takes from headers).
func (s *Spans) Endpoint() string { return s.endpoint }

// Protocol is the OTLP transport and encoding: http/protobuf.
func (s *Spans) Protocol() string { return s.protocol }

// Start begins the relay's span of m's event, a child of the trace context
// in its traceparent (and tracestate) header, and returns it with the
// traceparent that names it: the record carries that one instead of the
// event's (sink.Message.TraceParent), so that whoever consumes the record
// continues from the relay's span. The event itself is left as the decoder
// made it. m.Topic is "" when the event cannot be routed. An event without a
// traceparent header gets no span: Start returns nil, nil. A span that End
// never ends (an event skipped as already in Kafka, or abandoned at a stop) is
// never exported.
func (s *Spans) Start(m sink.Message) (trace.Span, []byte) {
	ev := m.Event
	i := header(ev.Headers, outbox.HeaderTraceParent)
	if i < 0 {
		return nil, nil
	}
	var state []byte
	if j := header(ev.Headers, outbox.HeaderTraceState); j >= 0 {
		state = ev.Headers[j].Value
	}
	parent, ok := remoteParent(ev.Headers[i].Value, state)
	if !ok {
		return nil, nil
	}
	start := time.Now()
	name := "publish"
	if m.Topic != "" {
		name = m.Topic + " publish"
	}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), parent)
	_, span := s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(start))
	// An unsampled span is not recorded: its attributes would be thrown away.
	// (The samplers the environment can choose do not look at them.)
	if span.IsRecording() {
		span.SetAttributes(attributes(m)...)
	}
	return span, traceParent(span.SpanContext())
}

// attributes are the messaging and relay attributes of m's span known when
// it starts.
func attributes(m sink.Message) []attribute.KeyValue {
	ev := m.Event
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs, semconv.MessagingSystemKafka, semconv.MessagingOperationPublish)
	if m.Topic != "" {
		attrs = append(attrs, semconv.MessagingDestinationName(m.Topic))
	}
	if ev.ID != nil {
		attrs = append(attrs, semconv.MessagingMessageID(string(ev.ID)))
	}
	// A key without a canonical string form (binary, from a bytea column)
	// is left out, as the conventions ask.
	if len(ev.AggregateID) > 0 && utf8.Valid(ev.AggregateID) {
		attrs = append(attrs, semconv.MessagingKafkaMessageKey(string(ev.AggregateID)))
	}
	attrs = append(attrs, attrCommitLSN.String(ev.CommitLSN.String()))
	if m.Origin != nil {
		attrs = append(attrs, attrSourcePosition.String(string(m.Origin.AppendPosition(nil, ev.CommitLSN, ev.Index))))
	}
	if ev.EventType != nil {
		attrs = append(attrs, attrEventType.String(string(ev.EventType)))
	}
	if ev.AggregateType != nil {
		attrs = append(attrs, attrAggregateType.String(string(ev.AggregateType)))
	}
	return attrs
}

// End finishes span, the one Start returned for m (nil: none, and End does
// nothing). err nil means Kafka acknowledged the event: the span gets the
// partition and offset at says it is stored at. Otherwise the event failed
// for good with err: the span's status is an error, with error.type the
// failure's code, and deadLetter says whether the event was stored as a dead
// letter (or halted the relay).
func (s *Spans) End(_ sink.Message, span trace.Span, at sink.Stored, err error, deadLetter bool) {
	if span == nil {
		return
	}
	if err == nil {
		span.SetAttributes(semconv.MessagingKafkaDestinationPartition(int(at.Partition)))
		if at.Offset >= 0 {
			span.SetAttributes(semconv.MessagingKafkaMessageOffset(int(at.Offset)))
		}
	} else {
		code := "_OTHER" // the conventions' error.type when there is no better one
		var ee *outbox.EventError
		if errors.As(err, &ee) {
			code = ee.Code
		}
		span.SetAttributes(semconv.ErrorTypeKey.String(code), attrDeadLetter.Bool(deadLetter))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End(trace.WithTimestamp(time.Now()))
}

// Shutdown exports the spans still queued and stops the batch processor's
// goroutine and the exporter. When ctx ends first (use FlushTimeout), the
// exports in progress are cut short and the rest is dropped: Shutdown still
// returns only once the processor stopped, and then reports ctx's error.
func (s *Spans) Shutdown(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.exp.abort(context.Cause(ctx)) })
	defer stop()
	// Not ctx itself: the provider would return at ctx's end and leave its
	// goroutine exporting; aborting the exporter makes every export return
	// at once instead. The provider shuts the exporter down last.
	err := s.tp.Shutdown(context.WithoutCancel(ctx))
	if ctx.Err() != nil {
		return fmt.Errorf("flush trace spans to %s: %w (the spans not yet exported were dropped)", s.endpoint, context.Cause(ctx))
	}
	if err != nil {
		return fmt.Errorf("flush trace spans to %s: %w", s.endpoint, err)
	}
	return nil
}

// header returns the index of the header key in hs, or -1.
func header(hs []outbox.Header, key string) int {
	for i := range hs {
		if hs[i].Key == key {
			return i
		}
	}
	return -1
}

// remoteParent reads a traceparent header as the decoder checked it
// (decoder.ParseTraceContext: "<version>-<32 hex>-<16 hex>-<2 hex>", lower
// case, ids not zero; a later version may append fields) into a remote span
// context, with the tracestate when it parses.
func remoteParent(traceparent, tracestate []byte) (trace.SpanContext, bool) {
	var cfg trace.SpanContextConfig
	if len(traceparent) < 55 {
		return trace.SpanContext{}, false
	}
	if _, err := hex.Decode(cfg.TraceID[:], traceparent[3:35]); err != nil {
		return trace.SpanContext{}, false
	}
	if _, err := hex.Decode(cfg.SpanID[:], traceparent[36:52]); err != nil {
		return trace.SpanContext{}, false
	}
	var flags [1]byte
	if _, err := hex.Decode(flags[:], traceparent[53:55]); err != nil {
		return trace.SpanContext{}, false
	}
	cfg.TraceFlags = trace.TraceFlags(flags[0])
	if tracestate != nil {
		if ts, err := trace.ParseTraceState(string(tracestate)); err == nil {
			cfg.TraceState = ts
		}
	}
	cfg.Remote = true
	sc := trace.NewSpanContext(cfg)
	return sc, sc.IsValid()
}

// traceParent formats sc as a version 00 traceparent header value.
func traceParent(sc trace.SpanContext) []byte {
	b := make([]byte, 55)
	copy(b, "00-")
	tid, sid := sc.TraceID(), sc.SpanID()
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	hex.Encode(b[53:55], []byte{byte(sc.TraceFlags())})
	return b
}
