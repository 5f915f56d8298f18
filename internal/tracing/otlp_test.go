package tracing

import (
	"math"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

// The spans' ids and times in TestAppendExportRequest.
var (
	encTraceID  = trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	encSpanID   = trace.SpanID{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31}
	encParentID = trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}
	encLinkID   = trace.SpanID{0x53, 0x99, 0x5c, 0x3f, 0x42, 0xcd, 0x8a, 0xd8}
	encStart    = time.Unix(1_700_000_000, 123_456_789)
	encEnd      = encStart.Add(1500 * time.Microsecond)
)

const encSchema = "https://opentelemetry.io/schemas/1.24.0"

func spanContext(t *testing.T, id trace.SpanID, flags trace.TraceFlags, state string, remote bool) trace.SpanContext {
	t.Helper()
	ts, err := trace.ParseTraceState(state)
	if err != nil {
		t.Fatal(err)
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: encTraceID, SpanID: id, TraceFlags: flags, TraceState: ts, Remote: remote})
}

// The official types of what the encoder should write.

func kvpb(k string, v *commonpb.AnyValue) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: v}
}
func strpb(s string) *commonpb.AnyValue {
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: s}}
}
func boolpb(b bool) *commonpb.AnyValue {
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: b}}
}
func intpb(i int64) *commonpb.AnyValue {
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: i}}
}
func doublepb(f float64) *commonpb.AnyValue {
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: f}}
}
func bytespb(b []byte) *commonpb.AnyValue {
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_BytesValue{BytesValue: b}}
}
func arraypb(vs ...*commonpb.AnyValue) *commonpb.AnyValue {
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: vs}}}
}
func kvlistpb(kvs ...*commonpb.KeyValue) *commonpb.AnyValue {
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_KvlistValue{KvlistValue: &commonpb.KeyValueList{Values: kvs}}}
}

// TestAppendExportRequest encodes spans as the SDK hands them to the
// exporter and decodes the request with the official OTLP types
// (proto.Unmarshal), which must equal the request written out here field by
// field: resource and scope, ids, parent or none, trace state and flags,
// kind, times, every attribute type, events, links, dropped counts, status;
// grouping by resource and scope; strings that are not UTF-8; lengths of
// more than one varint byte.
func TestAppendExportRequest(t *testing.T) {
	res := resource.NewWithAttributes(encSchema, attribute.String("service.name", "cdc-relay"), attribute.Int64("process.pid", 7))
	resPB := &resourcepb.Resource{Attributes: []*commonpb.KeyValue{ // sorted by key, as the resource keeps them
		kvpb("process.pid", intpb(7)), kvpb("service.name", strpb("cdc-relay"))}}
	otherRes := resource.NewSchemaless(attribute.String("service.name", "other"))
	otherResPB := &resourcepb.Resource{Attributes: []*commonpb.KeyValue{kvpb("service.name", strpb("other"))}}
	scope := instrumentation.Scope{Name: scopeName, Version: "v1.2.3", SchemaURL: encSchema,
		Attributes: attribute.NewSet(attribute.Bool("scope.b", true), attribute.String("scope.a", "x"))}
	scopePB := &commonpb.InstrumentationScope{Name: scopeName, Version: "v1.2.3", Attributes: []*commonpb.KeyValue{
		kvpb("scope.a", strpb("x")), kvpb("scope.b", boolpb(true))}}
	otherScope := instrumentation.Scope{Name: "other"}
	otherScopePB := &commonpb.InstrumentationScope{Name: "other"}

	const state = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
	sampled := spanContext(t, encSpanID, trace.FlagsSampled, state, false)
	// span is a minimal sampled span of res and scope, named name.
	span := func(name string, r *resource.Resource, sc instrumentation.Scope) tracetest.SpanStub {
		return tracetest.SpanStub{Name: name, SpanContext: spanContext(t, encSpanID, trace.FlagsSampled, "", false),
			SpanKind: trace.SpanKindInternal, StartTime: encStart, EndTime: encEnd, Resource: r, InstrumentationScope: sc}
	}
	spanPB := func(name string) *tracepb.Span {
		return &tracepb.Span{TraceId: encTraceID[:], SpanId: encSpanID[:], Name: name, Kind: tracepb.Span_SPAN_KIND_INTERNAL,
			StartTimeUnixNano: uint64(encStart.UnixNano()), EndTimeUnixNano: uint64(encEnd.UnixNano()), Flags: 0x101}
	}
	one := func(r *resourcepb.Resource, sc *commonpb.InstrumentationScope, spans ...*tracepb.Span) *coltracepb.ExportTraceServiceRequest {
		return &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
			Resource: r, SchemaUrl: encSchema,
			ScopeSpans: []*tracepb.ScopeSpans{{Scope: sc, SchemaUrl: encSchema, Spans: spans}},
		}}}
	}
	long := strings.Repeat("x", 20_000) // a length of three varint bytes, in messages of two and three

	for _, tc := range []struct {
		name  string
		spans []tracetest.SpanStub
		want  *coltracepb.ExportTraceServiceRequest
	}{
		{name: "no spans", want: &coltracepb.ExportTraceServiceRequest{}},
		{
			name: "the relay's span: remote parent, trace state, error status",
			spans: []tracetest.SpanStub{{
				Name: "outbox.order publish", SpanContext: sampled,
				Parent:   spanContext(t, encParentID, trace.FlagsSampled, state, true),
				SpanKind: trace.SpanKindProducer, StartTime: encStart, EndTime: encEnd,
				Attributes: []attribute.KeyValue{attribute.String("messaging.system", "kafka"),
					attribute.Int64("messaging.kafka.destination.partition", 2), attribute.Bool("cdc_relay.dead_letter", false)},
				Status:   sdktrace.Status{Code: codes.Error, Description: "MESSAGE_SIZE_TOO_LARGE"},
				Resource: res, InstrumentationScope: scope,
			}},
			want: one(resPB, scopePB, &tracepb.Span{
				TraceId: encTraceID[:], SpanId: encSpanID[:], TraceState: state, ParentSpanId: encParentID[:],
				Flags: 0x01 | 0x100 | 0x200, Name: "outbox.order publish", Kind: tracepb.Span_SPAN_KIND_PRODUCER,
				StartTimeUnixNano: uint64(encStart.UnixNano()), EndTimeUnixNano: uint64(encEnd.UnixNano()),
				Attributes: []*commonpb.KeyValue{kvpb("messaging.system", strpb("kafka")),
					kvpb("messaging.kafka.destination.partition", intpb(2)), kvpb("cdc_relay.dead_letter", boolpb(false))},
				Status: &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: "MESSAGE_SIZE_TOO_LARGE"},
			}),
		},
		{
			name: "root span: no parent, not sampled, status ok, local parent flags",
			spans: []tracetest.SpanStub{{
				Name: "root", SpanContext: spanContext(t, encSpanID, 0, "", false), SpanKind: trace.SpanKindServer,
				StartTime: encStart, EndTime: encEnd, Status: sdktrace.Status{Code: codes.Ok},
				Resource: res, InstrumentationScope: scope,
			}},
			want: one(resPB, scopePB, &tracepb.Span{
				TraceId: encTraceID[:], SpanId: encSpanID[:], Flags: 0x100, Name: "root", Kind: tracepb.Span_SPAN_KIND_SERVER,
				StartTimeUnixNano: uint64(encStart.UnixNano()), EndTimeUnixNano: uint64(encEnd.UnixNano()),
				Status: &tracepb.Status{Code: tracepb.Status_STATUS_CODE_OK},
			}),
		},
		{
			name: "local parent; unspecified kind; unset status; no end",
			spans: []tracetest.SpanStub{{
				Name: "child", SpanContext: sampled, Parent: spanContext(t, encParentID, trace.FlagsSampled, "", false),
				StartTime: encStart, Resource: res, InstrumentationScope: scope,
			}},
			want: one(resPB, scopePB, &tracepb.Span{
				TraceId: encTraceID[:], SpanId: encSpanID[:], TraceState: state, ParentSpanId: encParentID[:], Flags: 0x101,
				Name: "child", StartTimeUnixNano: uint64(encStart.UnixNano()),
			}),
		},
		{
			name: "every attribute type",
			spans: []tracetest.SpanStub{func() tracetest.SpanStub {
				s := span("attrs", res, scope)
				s.Attributes = []attribute.KeyValue{
					attribute.String("s", "text"), attribute.String("s.empty", ""),
					attribute.Bool("b.true", true), attribute.Bool("b.false", false),
					attribute.Int64("i", 42), attribute.Int64("i.zero", 0), attribute.Int64("i.neg", -7),
					attribute.Int64("i.max", math.MaxInt64), attribute.Int64("i.min", math.MinInt64),
					attribute.Float64("f", 2.5), attribute.Float64("f.zero", 0), attribute.Float64("f.inf", math.Inf(-1)),
					attribute.StringSlice("ss", []string{"a", "", "c"}), attribute.BoolSlice("bs", []bool{true, false}),
					attribute.Int64Slice("is", []int64{1, -1, 0}), attribute.Float64Slice("fs", []float64{0.5, 0}),
					attribute.StringSlice("ss.empty", []string{}),
					attribute.ByteSlice("bytes", []byte{0, 1, 0xff}),
					attribute.Slice("mixed", attribute.StringValue("x"), attribute.IntValue(3), attribute.Int64SliceValue([]int64{9})),
					attribute.Map("map", attribute.String("k", "v"), attribute.Map("inner", attribute.Bool("deep", true))),
					{Key: "empty"},
					attribute.String("not utf-8", "a\xffb"),
					attribute.String("long", long),
				}
				return s
			}()},
			want: one(resPB, scopePB, func() *tracepb.Span {
				s := spanPB("attrs")
				s.Attributes = []*commonpb.KeyValue{
					kvpb("s", strpb("text")), kvpb("s.empty", strpb("")),
					kvpb("b.true", boolpb(true)), kvpb("b.false", boolpb(false)),
					kvpb("i", intpb(42)), kvpb("i.zero", intpb(0)), kvpb("i.neg", intpb(-7)),
					kvpb("i.max", intpb(math.MaxInt64)), kvpb("i.min", intpb(math.MinInt64)),
					kvpb("f", doublepb(2.5)), kvpb("f.zero", doublepb(0)), kvpb("f.inf", doublepb(math.Inf(-1))),
					kvpb("ss", arraypb(strpb("a"), strpb(""), strpb("c"))), kvpb("bs", arraypb(boolpb(true), boolpb(false))),
					kvpb("is", arraypb(intpb(1), intpb(-1), intpb(0))), kvpb("fs", arraypb(doublepb(0.5), doublepb(0))),
					kvpb("ss.empty", arraypb()),
					kvpb("bytes", bytespb([]byte{0, 1, 0xff})),
					kvpb("mixed", arraypb(strpb("x"), intpb(3), arraypb(intpb(9)))),
					kvpb("map", kvlistpb(kvpb("inner", kvlistpb(kvpb("deep", boolpb(true)))), kvpb("k", strpb("v")))), // sorted, as attribute.Map keeps it
					kvpb("empty", &commonpb.AnyValue{}),
					kvpb("not utf-8", strpb("a\uFFFDb")),
					kvpb("long", strpb(long)),
				}
				return s
			}()),
		},
		{
			name: "events and links, dropped counts",
			spans: []tracetest.SpanStub{func() tracetest.SpanStub {
				s := span("events", res, scope)
				s.Events = []sdktrace.Event{
					{Name: "retry", Time: encStart.Add(time.Millisecond), Attributes: []attribute.KeyValue{attribute.Int("attempt", 2)}, DroppedAttributeCount: 1},
					{Name: "bare", Time: encStart.Add(2 * time.Millisecond)},
				}
				s.Links = []sdktrace.Link{
					{SpanContext: spanContext(t, encLinkID, 0, "vendor=x", true), Attributes: []attribute.KeyValue{attribute.String("why", "batch")}, DroppedAttributeCount: 3},
					{SpanContext: spanContext(t, encParentID, trace.FlagsSampled, "", false)},
				}
				s.DroppedAttributes, s.DroppedEvents, s.DroppedLinks = 4, 5, 6
				return s
			}()},
			want: one(resPB, scopePB, func() *tracepb.Span {
				s := spanPB("events")
				s.Events = []*tracepb.Span_Event{
					{Name: "retry", TimeUnixNano: uint64(encStart.Add(time.Millisecond).UnixNano()),
						Attributes: []*commonpb.KeyValue{kvpb("attempt", intpb(2))}, DroppedAttributesCount: 1},
					{Name: "bare", TimeUnixNano: uint64(encStart.Add(2 * time.Millisecond).UnixNano())},
				}
				s.Links = []*tracepb.Span_Link{
					{TraceId: encTraceID[:], SpanId: encLinkID[:], TraceState: "vendor=x", Flags: 0x300,
						Attributes: []*commonpb.KeyValue{kvpb("why", strpb("batch"))}, DroppedAttributesCount: 3},
					{TraceId: encTraceID[:], SpanId: encParentID[:], Flags: 0x101},
				}
				s.DroppedAttributesCount, s.DroppedEventsCount, s.DroppedLinksCount = 4, 5, 6
				return s
			}()),
		},
		{
			name: "grouped by resource, then scope, in the order of their first span",
			spans: []tracetest.SpanStub{
				span("a", res, scope), span("b", otherRes, scope), span("c", res, otherScope), span("d", res, scope), span("e", nil, scope),
			},
			want: &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{
				{Resource: resPB, SchemaUrl: encSchema, ScopeSpans: []*tracepb.ScopeSpans{
					{Scope: scopePB, SchemaUrl: encSchema, Spans: []*tracepb.Span{spanPB("a"), spanPB("d")}},
					{Scope: otherScopePB, Spans: []*tracepb.Span{spanPB("c")}},
				}},
				{Resource: otherResPB, ScopeSpans: []*tracepb.ScopeSpans{
					{Scope: scopePB, SchemaUrl: encSchema, Spans: []*tracepb.Span{spanPB("b")}},
				}},
				{ScopeSpans: []*tracepb.ScopeSpans{
					{Scope: scopePB, SchemaUrl: encSchema, Spans: []*tracepb.Span{spanPB("e")}},
				}},
			}},
		},
		{
			name:  "a name that is not UTF-8, and a long one",
			spans: []tracetest.SpanStub{span("\xc3(", res, scope), span(long, res, scope)},
			want:  one(resPB, scopePB, spanPB("\uFFFD("), spanPB(long)),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spans := make([]sdktrace.ReadOnlySpan, len(tc.spans))
			for i, s := range tc.spans {
				spans[i] = s.Snapshot()
			}
			b := appendExportRequest([]byte("prefix"), spans)
			if !strings.HasPrefix(string(b), "prefix") {
				t.Fatal("appendExportRequest changed what b held")
			}
			var got coltracepb.ExportTraceServiceRequest
			if err := proto.Unmarshal(b[len("prefix"):], &got); err != nil {
				t.Fatalf("proto.Unmarshal: %v", err)
			}
			if !proto.Equal(&got, tc.want) {
				t.Errorf("decoded request differs from the one wanted:\n%s", textDiff(prototext.Format(&got), prototext.Format(tc.want)))
			}
		})
	}
}

// textDiff shows the lines of got and want from the first that differs,
// with the three before it.
func textDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	i := 0
	for i < len(g) && i < len(w) && g[i] == w[i] {
		i++
	}
	from := max(i-3, 0)
	end := func(lines []string) int { return min(len(lines), i+8) }
	return "got:\n" + strings.Join(g[from:end(g)], "\n") + "\nwant:\n" + strings.Join(w[from:end(w)], "\n")
}

// TestSpanKinds: every kind of the trace API is OTLP's of the same name.
func TestSpanKinds(t *testing.T) {
	for kind, want := range map[trace.SpanKind]tracepb.Span_SpanKind{
		trace.SpanKindUnspecified: tracepb.Span_SPAN_KIND_UNSPECIFIED,
		trace.SpanKindInternal:    tracepb.Span_SPAN_KIND_INTERNAL,
		trace.SpanKindServer:      tracepb.Span_SPAN_KIND_SERVER,
		trace.SpanKindClient:      tracepb.Span_SPAN_KIND_CLIENT,
		trace.SpanKindProducer:    tracepb.Span_SPAN_KIND_PRODUCER,
		trace.SpanKindConsumer:    tracepb.Span_SPAN_KIND_CONSUMER,
		trace.SpanKind(99):        tracepb.Span_SPAN_KIND_UNSPECIFIED,
	} {
		if got := otlpSpanKind(kind); got != uint64(want) {
			t.Errorf("%v: %d, want %d (%v)", kind, got, want, want)
		}
	}
}

// TestReadResponses reads response bodies the official types wrote.
func TestReadResponses(t *testing.T) {
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name     string
		body     []byte
		rejected int64
		message  string
		wantErr  bool
	}{
		{name: "full success", body: marshal(&coltracepb.ExportTraceServiceResponse{})},
		{name: "partial success", body: marshal(&coltracepb.ExportTraceServiceResponse{PartialSuccess: &coltracepb.ExportTracePartialSuccess{
			RejectedSpans: 3, ErrorMessage: "spans older than 1h"}}), rejected: 3, message: "spans older than 1h"},
		{name: "a warning", body: marshal(&coltracepb.ExportTraceServiceResponse{PartialSuccess: &coltracepb.ExportTracePartialSuccess{
			ErrorMessage: "deprecated attribute"}}), message: "deprecated attribute"},
		{name: "truncated", body: marshal(&coltracepb.ExportTraceServiceResponse{PartialSuccess: &coltracepb.ExportTracePartialSuccess{
			RejectedSpans: 3, ErrorMessage: "spans older than 1h"}})[:5], wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rejected, message, err := partialSuccess(tc.body)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want one: %v", err, tc.wantErr)
			}
			if !tc.wantErr && (rejected != tc.rejected || message != tc.message) {
				t.Errorf("rejected %d %q, want %d %q", rejected, message, tc.rejected, tc.message)
			}
		})
	}
	msg, err := rpcStatusText(marshal(&statuspb.Status{Code: 3, Message: "invalid span id"}))
	if err != nil || msg != "invalid span id" {
		t.Errorf("google.rpc.Status message %q, %v", msg, err)
	}
}

// BenchmarkAppendExportRequest is the encoding of a batch of 512 of the
// relay's spans, into a reused buffer as the exporter does.
func BenchmarkAppendExportRequest(b *testing.B) {
	res := resource.NewWithAttributes(encSchema, attribute.String("service.name", "cdc-relay"), attribute.String("host.name", "relay-1"))
	stub := tracetest.SpanStub{
		Name:        "outbox.order publish",
		SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: encTraceID, SpanID: encSpanID, TraceFlags: trace.FlagsSampled}),
		Parent:      trace.NewSpanContext(trace.SpanContextConfig{TraceID: encTraceID, SpanID: encParentID, Remote: true}),
		SpanKind:    trace.SpanKindProducer, StartTime: encStart, EndTime: encEnd,
		Attributes: []attribute.KeyValue{attribute.String("messaging.system", "kafka"), attribute.String("messaging.operation", "publish"),
			attribute.String("messaging.destination.name", "outbox.order"), attribute.String("messaging.message.id", "6b2f4c8e-1d2a-4f0b-9a51-2c7e1f3d9b10"),
			attribute.String("messaging.kafka.message.key", "order-1"), attribute.String("cdc_relay.commit_lsn", "0/16B3748"),
			attribute.String("cdc_relay.event_type", "OrderPlaced"), attribute.String("cdc_relay.aggregate_type", "order"),
			attribute.Int("messaging.kafka.destination.partition", 2), attribute.Int("messaging.kafka.message.offset", 41)},
		Resource: res, InstrumentationScope: instrumentation.Scope{Name: scopeName, Version: "v1.0.0", SchemaURL: encSchema},
	}
	spans := make([]sdktrace.ReadOnlySpan, 512)
	for i := range spans {
		spans[i] = stub.Snapshot()
	}
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = appendExportRequest(buf[:0], spans)
	}
	b.ReportMetric(float64(len(buf))/512, "bytes/span")
}
