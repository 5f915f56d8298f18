package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// The application's trace context, as an outbox row carries it.
const (
	appTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	appSpanID  = "00f067aa0ba902b7"
	appState   = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
)

// appParent is the application's traceparent with the given flags.
func appParent(flags string) []byte {
	return []byte("00-" + appTraceID + "-" + appSpanID + "-" + flags)
}

// clearOTelEnv unsets every OTEL_* variable for the test (restored after),
// so a developer's settings cannot change what the exporter does.
func clearOTelEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "OTEL_") {
			t.Setenv(k, "")
			if err := os.Unsetenv(k); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// event is an outbox event as the decoder and the router leave it.
func event(id, key string, headers ...outbox.Header) *outbox.Event {
	return &outbox.Event{
		ID: []byte(id), AggregateType: []byte("order"), AggregateID: []byte(key), EventType: []byte("OrderPlaced"),
		Payload: []byte(`{"total": 7}`), Headers: headers, CommitLSN: pglogrepl.LSN(0x16B3748), Index: 2,
	}
}

// testOrigin is the stream the tests' events were read from.
var testOrigin = outbox.NewOrigin("7300000000000000001", 1, "cdc_relay")

// message is ev as the relay produces it: read from testOrigin, routed to
// outbox.order.
func message(ev *outbox.Event) sink.Message {
	return sink.Message{Topic: "outbox.order", Event: ev, Origin: testOrigin}
}

func traced(id, key, flags string) *outbox.Event {
	return event(id, key,
		outbox.Header{Key: "correlation_id", Value: []byte("c-1")},
		outbox.Header{Key: outbox.HeaderTraceParent, Value: appParent(flags)},
		outbox.Header{Key: outbox.HeaderTraceState, Value: []byte(appState)})
}

func headerValue(ev *outbox.Event, key string) string {
	if i := header(ev.Headers, key); i >= 0 {
		return string(ev.Headers[i].Value)
	}
	return ""
}

// requireSDKStopped fails t unless every goroutine of the SDK's batch span
// processor and of the exporter has ended: the exporter starts none of its
// own, but its HTTP connections have theirs (and the package's tests make no
// other HTTP requests). It waits a moment: a closed connection's goroutines
// end just after it.
func requireSDKStopped(t *testing.T) {
	t.Helper()
	testenv.Eventually(t, 2*time.Second, func() error {
		var left []string
		for _, g := range testenv.GoroutineStacks() {
			if strings.Contains(g, "go.opentelemetry.io/otel/sdk/trace.") ||
				strings.Contains(g, "net/http.(*persistConn)") || strings.Contains(g, "net/http.(*http2ClientConn)") {
				left = append(left, g)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("%d SDK goroutines left after Shutdown:\n\n%s", len(left), strings.Join(left, "\n\n"))
		}
		return nil
	})
}

// TestSpans exports the spans of events through the exporter to an
// in-process OTLP/HTTP receiver, which decodes them with the official OTLP
// types, and checks each span as the receiver decoded it: parent, kind, name, attributes, status, resource;
// the rewritten traceparent header; no span for an event without a trace
// context, for an unsampled one or for one never ended; the headers of
// OTEL_EXPORTER_OTLP_HEADERS; and that Shutdown flushed the queue (the
// processor's schedule delay, 5 s by default, has not passed) and stopped
// the processor's goroutine.
func TestSpans(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		service string
		gzip    bool
	}{
		{name: "http/protobuf", service: DefaultServiceName},
		{name: "http/protobuf gzip, service name from the environment",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_SERVICE_NAME": "orders-relay"},
			service: "orders-relay", gzip: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearOTelEnv(t)
			rcv := testenv.NewOTLPReceiver(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.HTTPURL())
			t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20sekret")
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			reg := prometheus.NewRegistry()
			m := metrics.New(reg)
			s, err := New(context.Background(), Config{ServiceVersion: "v9.9.9-test", Logger: zerolog.Nop(), Metrics: m})
			if err != nil {
				t.Fatal(err)
			}
			if s.Protocol() != protoHTTPProtobuf {
				t.Errorf("Protocol() = %q, want %q", s.Protocol(), protoHTTPProtobuf)
			}

			before := time.Now()
			delivered := traced("ev-1", "order-1", "01")
			plain := event("ev-2", "order-2", outbox.Header{Key: "correlation_id", Value: []byte("c-2")})
			deadLettered := traced("ev-3", "order-3", "01")
			halted := traced("ev-4", "order-4", "01")
			unsampled := traced("ev-5", "order-5", "00")
			skipped := traced("ev-6", "order-6", "01")
			unrouted := traced("ev-7", "order-7", "01")
			all := []*outbox.Event{delivered, plain, deadLettered, halted, unsampled, skipped, unrouted}
			msgs := map[*outbox.Event]sink.Message{}
			started := map[*outbox.Event]trace.Span{}
			parents := map[*outbox.Event]string{} // the traceparent Start gave the record
			for _, ev := range all {
				m := message(ev)
				if ev == unrouted {
					m.Topic = ""
				}
				msgs[ev] = m
				var tp []byte
				started[ev], tp = s.Start(m)
				parents[ev] = string(tp)
			}
			end := func(ev *outbox.Event, at sink.Stored, err error, deadLetter bool) {
				s.End(msgs[ev], started[ev], at, err, deadLetter)
			}
			end(delivered, sink.Stored{Partition: 2, Offset: 41}, nil, false)
			end(plain, sink.Stored{}, nil, false)
			end(deadLettered, sink.Stored{}, &outbox.EventError{Code: "message_too_large", Err: errors.New("MESSAGE_SIZE_TOO_LARGE")}, true)
			end(halted, sink.Stored{}, errors.New("store dead letter: context canceled"), false)
			end(unsampled, sink.Stored{}, nil, false)
			end(unrouted, sink.Stored{}, &outbox.EventError{Code: "invalid_topic", Err: errors.New("topic name is empty")}, true)
			// skipped: started, never ended (already in Kafka).

			if err := s.Shutdown(context.Background()); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			requireSDKStopped(t)

			// Headers: the relay's span replaces the app's as the parent of
			// whoever consumes the record (the traceparent Start gives the
			// record); the event itself keeps its headers as decoded.
			if got := parents[plain]; got != "" || started[plain] != nil {
				t.Errorf("event without trace context got traceparent %q", got)
			}
			for _, ev := range []*outbox.Event{delivered, deadLettered, halted, unsampled, skipped, unrouted} {
				tp := parents[ev]
				flags := "01"
				if ev == unsampled {
					flags = "00"
				}
				if !strings.HasPrefix(tp, "00-"+appTraceID+"-") || !strings.HasSuffix(tp, "-"+flags) || len(tp) != 55 || strings.Contains(tp, appSpanID) {
					t.Errorf("%s: traceparent %q, want 00-%s-<the relay's span id>-%s", ev.ID, tp, appTraceID, flags)
				}
				if got := headerValue(ev, outbox.HeaderTraceParent); got != string(appParent(flags)) {
					t.Errorf("%s: the event's traceparent header is %q, want it as decoded: %q", ev.ID, got, appParent(flags))
				}
				if got := headerValue(ev, outbox.HeaderTraceState); got != appState {
					t.Errorf("%s: tracestate %q, want it unchanged: %q", ev.ID, got, appState)
				}
				if got := headerValue(ev, "correlation_id"); got == "" {
					t.Errorf("%s: other headers lost: %v", ev.ID, ev.Headers)
				}
				if started[ev] == nil {
					t.Errorf("%s: Start gave no span", ev.ID)
				}
			}

			spans := map[string]testenv.ReceivedSpan{}
			for _, sp := range rcv.Spans() {
				id, _ := sp.Attrs["messaging.message.id"].(string)
				if _, dup := spans[id]; dup {
					t.Errorf("two spans for event %q", id)
				}
				spans[id] = sp
			}
			if len(spans) != 4 {
				t.Errorf("%d spans, want 4 (ev-1, ev-3, ev-4, ev-7): %v", len(spans), keys(spans))
			}
			for _, id := range []string{"ev-2", "ev-5", "ev-6"} {
				if _, ok := spans[id]; ok {
					t.Errorf("span exported for %s (no trace context, unsampled, never ended)", id)
				}
			}
			for _, c := range []struct {
				ev     *outbox.Event
				name   string
				status tracepb.Status_StatusCode
				attrs  map[string]any
			}{
				{delivered, "outbox.order publish", tracepb.Status_STATUS_CODE_UNSET, map[string]any{
					"messaging.kafka.destination.partition": int64(2), "messaging.kafka.message.offset": int64(41),
					"messaging.destination.name": "outbox.order"}},
				{deadLettered, "outbox.order publish", tracepb.Status_STATUS_CODE_ERROR, map[string]any{
					"error.type": "message_too_large", "cdc_relay.dead_letter": true, "messaging.destination.name": "outbox.order"}},
				{halted, "outbox.order publish", tracepb.Status_STATUS_CODE_ERROR, map[string]any{
					"error.type": "_OTHER", "cdc_relay.dead_letter": false}},
				{unrouted, "publish", tracepb.Status_STATUS_CODE_ERROR, map[string]any{
					"error.type": "invalid_topic", "cdc_relay.dead_letter": true}},
			} {
				id := string(c.ev.ID)
				sp, ok := spans[id]
				if !ok {
					continue
				}
				if sp.TraceID() != appTraceID || sp.ParentSpanID() != appSpanID {
					t.Errorf("%s: trace %s parent %s, want the app's %s and %s", id, sp.TraceID(), sp.ParentSpanID(), appTraceID, appSpanID)
				}
				if want := "00-" + appTraceID + "-" + sp.SpanID() + "-01"; parents[c.ev] != want {
					t.Errorf("%s: traceparent %q, want the span's own context %q", id, parents[c.ev], want)
				}
				if sp.Span.GetKind() != tracepb.Span_SPAN_KIND_PRODUCER || sp.Span.GetName() != c.name {
					t.Errorf("%s: kind %v name %q, want PRODUCER %q", id, sp.Span.GetKind(), sp.Span.GetName(), c.name)
				}
				if sp.Span.GetTraceState() != appState {
					t.Errorf("%s: trace state %q, want %q", id, sp.Span.GetTraceState(), appState)
				}
				if got := sp.Span.GetStatus().GetCode(); got != c.status {
					t.Errorf("%s: status %v (%q), want %v", id, got, sp.Span.GetStatus().GetMessage(), c.status)
				}
				if c.status == tracepb.Status_STATUS_CODE_ERROR && sp.Span.GetStatus().GetMessage() == "" {
					t.Errorf("%s: error status without a message", id)
				}
				start, end := time.Unix(0, int64(sp.Span.GetStartTimeUnixNano())), time.Unix(0, int64(sp.Span.GetEndTimeUnixNano()))
				if start.Before(before) || end.Before(start) || end.After(time.Now()) {
					t.Errorf("%s: span from %v to %v, want between %v and now, start before end", id, start, end, before)
				}
				want := map[string]any{
					"messaging.system": "kafka", "messaging.operation": "publish", "messaging.message.id": id,
					"messaging.kafka.message.key": string(c.ev.AggregateID), "cdc_relay.commit_lsn": "0/16B3748",
					"cdc_relay.source_position": "7300000000000000001:1:cdc_relay:0/16B3748:2",
					"cdc_relay.event_type":      "OrderPlaced", "cdc_relay.aggregate_type": "order",
				}
				for k, v := range c.attrs {
					want[k] = v
				}
				for k, v := range want {
					if sp.Attrs[k] != v {
						t.Errorf("%s: attribute %s = %#v, want %#v (all: %v)", id, k, sp.Attrs[k], v, sp.Attrs)
					}
				}
				for k, v := range map[string]any{"service.name": tc.service, "service.version": "v9.9.9-test",
					"deployment.environment": "test", "telemetry.sdk.language": "go"} {
					if sp.Resource[k] != v {
						t.Errorf("%s: resource %s = %#v, want %#v", id, k, sp.Resource[k], v)
					}
				}
				if sp.Scope != scopeName || sp.SchemaURL != "https://opentelemetry.io/schemas/1.24.0" {
					t.Errorf("%s: scope %q schema %q", id, sp.Scope, sp.SchemaURL)
				}
			}
			if len(rcv.Requests()) == 0 {
				t.Error("no request")
			}
			for _, req := range rcv.Requests() {
				if got := req.Header.Get("Authorization"); got != "Bearer sekret" {
					t.Errorf("request to %s: authorization %q, want OTEL_EXPORTER_OTLP_HEADERS' Bearer sekret", req.Path, got)
				}
				if req.Path != "/v1/traces" {
					t.Errorf("request to %s", req.Path)
				}
				if got, want := req.Header.Get("Content-Encoding") == "gzip", tc.gzip; got != want {
					t.Errorf("request gzipped: %v, want %v", got, want)
				}
			}
			if got := testutil.ToFloat64(m.TraceSpans.WithLabelValues("exported")); got != 4 {
				t.Errorf("trace_spans_total{result=exported} = %v, want 4", got)
			}
		})
	}
}

func keys(m map[string]testenv.ReceivedSpan) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestExportFailure: spans a receiver refuses are counted as failed and
// logged, and nothing reaches OpenTelemetry's global error handler (whose
// default writes to the process's stderr in the standard log's format).
func TestExportFailure(t *testing.T) {
	clearOTelEnv(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no", http.StatusBadRequest) // not retryable
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", srv.URL+"/custom/path")
	var logs sandbox.Buffer
	m := metrics.New(prometheus.NewRegistry())
	s, err := New(context.Background(), Config{Logger: zerolog.New(&logs), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	if want := srv.URL + "/custom/path"; s.Endpoint() != want {
		t.Errorf("Endpoint() = %q, want %q (the per-signal URL as it is)", s.Endpoint(), want)
	}
	for i := range 3 {
		m := message(traced(fmt.Sprintf("ev-%d", i), "k", "01"))
		span, _ := s.Start(m)
		s.End(m, span, sink.Stored{}, nil, false)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if got := testutil.ToFloat64(m.TraceSpans.WithLabelValues("failed")); got != 3 {
		t.Errorf("trace_spans_total{result=failed} = %v, want 3", got)
	}
	if out := logs.String(); !strings.Contains(out, "cannot export trace spans") || !strings.Contains(out, "400") {
		t.Errorf("log does not say the export failed: %s", out)
	}
}

// TestShutdownBounded: with a receiver that never answers, Shutdown gives up
// at its context's deadline, cuts the export short and still leaves no
// goroutine of the processor behind.
func TestShutdownBounded(t *testing.T) {
	clearOTelEnv(t)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	s, err := New(context.Background(), Config{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	m := message(traced("ev-1", "k", "01"))
	span, _ := s.Start(m)
	s.End(m, span, sink.Stored{}, nil, false)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = s.Shutdown(ctx)
	took := time.Since(start)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown against a silent receiver = %v, want the deadline", err)
	}
	if took > 5*time.Second {
		t.Errorf("Shutdown took %v with a 300ms deadline", took)
	}
	requireSDKStopped(t)
}

// TestNewRefusesBadEnv: New reports a bad variable before anything starts,
// and a protocol other than http/protobuf.
func TestNewRefusesBadEnv(t *testing.T) {
	for _, protocol := range []string{"thrift", "grpc", "http/json"} {
		clearOTelEnv(t)
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
		if _, err := New(context.Background(), Config{}); err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_PROTOCOL") {
			t.Errorf("New with OTEL_EXPORTER_OTLP_PROTOCOL=%s: %v", protocol, err)
		}
	}
	clearOTelEnv(t)
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "no-equals-sign")
	if _, err := New(context.Background(), Config{}); err == nil || !strings.Contains(err.Error(), "OTEL_RESOURCE_ATTRIBUTES") {
		t.Errorf("New with OTEL_RESOURCE_ATTRIBUTES=no-equals-sign: %v", err)
	}
	requireSDKStopped(t)
}

// TestRemoteParent reads traceparent values as the decoder accepts them.
func TestRemoteParent(t *testing.T) {
	for _, tc := range []struct {
		name, traceparent, tracestate string
		ok, sampled                   bool
		state                         string
	}{
		{name: "sampled", traceparent: string(appParent("01")), ok: true, sampled: true},
		{name: "not sampled", traceparent: string(appParent("00")), ok: true},
		{name: "with tracestate", traceparent: string(appParent("01")), tracestate: appState, ok: true, sampled: true, state: appState},
		{name: "tracestate the SDK cannot parse is dropped", traceparent: string(appParent("01")), tracestate: "not a list member", ok: true, sampled: true},
		{name: "later version with more fields", traceparent: "01-" + appTraceID + "-" + appSpanID + "-01-what-comes-next", ok: true, sampled: true},
		{name: "too short", traceparent: "00-abc-01"},
		{name: "not hex", traceparent: "00-" + strings.Repeat("z", 32) + "-" + appSpanID + "-01"},
		{name: "zero trace id", traceparent: "00-" + strings.Repeat("0", 32) + "-" + appSpanID + "-01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var state []byte
			if tc.tracestate != "" {
				state = []byte(tc.tracestate)
			}
			sc, ok := remoteParent([]byte(tc.traceparent), state)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if sc.TraceID().String() != appTraceID || sc.SpanID().String() != appSpanID || !sc.IsRemote() || sc.IsSampled() != tc.sampled {
				t.Errorf("span context %v / %v remote %v sampled %v", sc.TraceID(), sc.SpanID(), sc.IsRemote(), sc.IsSampled())
			}
			if sc.TraceState().String() != tc.state {
				t.Errorf("trace state %q, want %q", sc.TraceState().String(), tc.state)
			}
			if got := string(traceParent(sc)); got != "00-"+appTraceID+"-"+appSpanID+"-"+map[bool]string{true: "01", false: "00"}[tc.sampled] {
				t.Errorf("traceParent = %q", got)
			}
		})
	}
}

// BenchmarkStartEnd is the relay's cost per traced event with spans
// exported: Start (with the record's traceparent), End, the batch span processor
// and the exporter's encoding and request, to a server that discards
// them (the test receiver would keep every span). Building the event is
// part of each iteration, as the decoder's allocation is per event.
func BenchmarkStartEnd(b *testing.B) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
			b.Setenv(k, "")
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer srv.Close()
	b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	s, err := New(context.Background(), Config{Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := s.Shutdown(context.Background()); err != nil {
			b.Fatal(err)
		}
	}()
	for _, bc := range []struct {
		name  string
		event func() *outbox.Event
	}{
		{"sampled", func() *outbox.Event { return traced("ev-1", "order-1", "01") }},
		{"unsampled", func() *outbox.Event { return traced("ev-1", "order-1", "00") }},
		{"no trace context", func() *outbox.Event { return event("ev-1", "order-1") }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m := message(bc.event())
				span, _ := s.Start(m)
				s.End(m, span, sink.Stored{Partition: 1, Offset: 7}, nil, false)
			}
		})
	}
}
