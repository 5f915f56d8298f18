package testenv

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// OTLPReceiver is an in-process OpenTelemetry trace receiver, as a
// collector's OTLP/HTTP endpoint is one: POST /v1/traces, binary protobuf,
// optionally gzip, on HTTPURL. It decodes every request with the official
// OTLP collector types (an independent check of the relay's own encoder)
// and keeps the spans. It answers every valid request with success.
type OTLPReceiver struct {
	http *httptest.Server

	mu       sync.Mutex
	spans    []ReceivedSpan
	requests []OTLPRequest
}

// OTLPRequest is one export request as the receiver got it.
type OTLPRequest struct {
	Path   string // the HTTP path
	Header http.Header
	Spans  int
}

// ReceivedSpan is one span with the resource and scope it was exported under.
type ReceivedSpan struct {
	Span *tracepb.Span
	// Resource holds the resource's attributes, Attrs the span's, each as
	// a string, int64, float64 or bool.
	Resource  map[string]any
	Attrs     map[string]any
	Scope     string
	SchemaURL string // the scope's
}

// TraceID, SpanID and ParentSpanID are the span's ids in lower-case hex, as
// a traceparent header writes them ("" for none).
func (s ReceivedSpan) TraceID() string      { return hex.EncodeToString(s.Span.GetTraceId()) }
func (s ReceivedSpan) SpanID() string       { return hex.EncodeToString(s.Span.GetSpanId()) }
func (s ReceivedSpan) ParentSpanID() string { return hex.EncodeToString(s.Span.GetParentSpanId()) }

// NewOTLPReceiver starts a receiver, stopped when t ends.
func NewOTLPReceiver(t testing.TB) *OTLPReceiver {
	t.Helper()
	r, err := StartOTLPReceiver()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// StartOTLPReceiver starts a receiver on a loopback port; Close stops it.
func StartOTLPReceiver() (*OTLPReceiver, error) {
	r := &OTLPReceiver{}
	mux := http.NewServeMux()
	mux.HandleFunc("/", r.serveHTTP)
	r.http = httptest.NewServer(mux)
	return r, nil
}

// HTTPURL is the receiver's OTLP/HTTP base URL, for OTEL_EXPORTER_OTLP_ENDPOINT
// (the exporter appends /v1/traces).
func (r *OTLPReceiver) HTTPURL() string { return r.http.URL }

// Close stops the server and waits for its handlers.
func (r *OTLPReceiver) Close() { r.http.Close() }

// Spans returns the spans received so far, in the order they arrived.
func (r *OTLPReceiver) Spans() []ReceivedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ReceivedSpan(nil), r.spans...)
}

// Requests returns the export requests received so far.
func (r *OTLPReceiver) Requests() []OTLPRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]OTLPRequest(nil), r.requests...)
}

func (r *OTLPReceiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	if req.URL.Path != "/v1/traces" {
		http.Error(w, "this receiver takes traces at /v1/traces", http.StatusNotFound)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "content type "+ct+": this receiver decodes application/x-protobuf", http.StatusUnsupportedMediaType)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		http.Error(w, "decode ExportTraceServiceRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	r.record(&msg, OTLPRequest{Path: req.URL.Path, Header: req.Header.Clone()})
	out, err := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = io.Copy(w, bytes.NewReader(out))
}

func (r *OTLPReceiver) record(msg *coltracepb.ExportTraceServiceRequest, req OTLPRequest) {
	var got []ReceivedSpan
	for _, rs := range msg.GetResourceSpans() {
		res := attrMap(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				got = append(got, ReceivedSpan{
					Span: sp, Resource: res, Attrs: attrMap(sp.GetAttributes()),
					Scope: ss.GetScope().GetName(), SchemaURL: ss.GetSchemaUrl(),
				})
			}
		}
	}
	req.Spans = len(got)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans = append(r.spans, got...)
	r.requests = append(r.requests, req)
}

func attrMap(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = v.IntValue
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = v.DoubleValue
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = v.BoolValue
		default:
			m[kv.GetKey()] = kv.GetValue().String()
		}
	}
	return m
}
