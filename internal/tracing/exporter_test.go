package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// stubSpans are n ended spans as the processor hands them to the exporter.
func stubSpans(n int) []sdktrace.ReadOnlySpan {
	spans := make([]sdktrace.ReadOnlySpan, n)
	for i := range spans {
		spans[i] = tracetest.SpanStub{
			Name: fmt.Sprintf("span %d", i),
			SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: encTraceID, SpanID: trace.SpanID{byte(i + 1)},
				TraceFlags: trace.FlagsSampled}),
			SpanKind: trace.SpanKindProducer, StartTime: encStart, EndTime: encEnd,
		}.Snapshot()
	}
	return spans
}

// testExporter is an exporter configured by env (OTEL_* variables; the
// process's are not read), with the first backoff shortened to 10 ms, and
// what it counts and logs. It is shut down when t ends.
type testExporter struct {
	*exporter
	m    *metrics.Metrics
	logs *sandbox.Buffer
}

func newTestExporter(t *testing.T, env map[string]string) testExporter {
	t.Helper()
	dest, err := readEnv(func(k string) string { return env[k] }, os.ReadFile)
	if err != nil {
		t.Fatal(err)
	}
	te := testExporter{m: metrics.New(prometheus.NewRegistry()), logs: &sandbox.Buffer{}}
	te.exporter = newExporter(dest, "v1.0.0-test", zerolog.New(te.logs), te.m)
	te.backoff = 10 * time.Millisecond
	t.Cleanup(func() {
		if err := te.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		requireSDKStopped(t)
	})
	return te
}

func (te testExporter) counts() (exported, failed float64) {
	return testutil.ToFloat64(te.m.TraceSpans.WithLabelValues("exported")), testutil.ToFloat64(te.m.TraceSpans.WithLabelValues("failed"))
}

// reply is one answer of a scripted receiver.
type reply struct {
	status int
	header map[string]string
	body   []byte
	// retryAfterDate, when set, sends Retry-After as the HTTP date this
	// much after the reply (to the second: from 1 s less).
	retryAfterDate time.Duration
}

// received is one request as a scripted receiver decoded it.
type received struct {
	at     time.Time
	header http.Header
	req    *coltracepb.ExportTraceServiceRequest
	tls    *tls.ConnectionState
}

// scriptedReceiver answers the requests to /v1/traces with replies in turn,
// then with 200 and an empty ExportTraceServiceResponse; it decodes each
// request with the official types.
type scriptedReceiver struct {
	t       *testing.T
	mu      sync.Mutex
	replies []reply
	got     []received
}

func (s *scriptedReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := received{at: time.Now(), header: r.Header.Clone(), tls: r.TLS}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			s.t.Errorf("gzip: %v", err)
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
	rec.req = &coltracepb.ExportTraceServiceRequest{}
	if err := proto.Unmarshal(b, rec.req); err != nil {
		s.t.Errorf("decode the request: %v", err)
	}
	if r.URL.Path != "/v1/traces" || r.Method != http.MethodPost {
		s.t.Errorf("%s %s", r.Method, r.URL.Path)
	}
	s.mu.Lock()
	s.got = append(s.got, rec)
	rp := reply{status: http.StatusOK, header: map[string]string{"Content-Type": "application/x-protobuf"}}
	if len(s.replies) > 0 {
		rp, s.replies = s.replies[0], s.replies[1:]
	}
	s.mu.Unlock()
	for k, v := range rp.header {
		w.Header().Set(k, v)
	}
	if rp.retryAfterDate > 0 {
		w.Header().Set("Retry-After", time.Now().Add(rp.retryAfterDate).UTC().Format(http.TimeFormat))
	}
	w.WriteHeader(rp.status)
	_, _ = w.Write(rp.body)
}

func (s *scriptedReceiver) requests() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]received(nil), s.got...)
}

func marshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestExportResponses: how the exporter treats each answer of an OTLP/HTTP
// receiver, as the specification has it: 2xx is success (with the partial
// success counted and logged), 429, 502, 503 and 504 are retried after
// Retry-After or a backoff until the export's timeout, any other status
// fails the batch at once.
func TestExportResponses(t *testing.T) {
	protobuf := map[string]string{"Content-Type": "application/x-protobuf"}
	status := func(msg string) []byte { return marshal(t, &statuspb.Status{Code: 3, Message: msg}) }
	for _, tc := range []struct {
		name     string
		replies  []reply
		always   *reply // instead of 200 once replies are used up
		timeout  string // OTEL_EXPORTER_OTLP_TIMEOUT
		requests int    // 0: at least 2
		minGap   time.Duration
		exported float64
		failed   float64
		logs     []string
	}{
		{name: "200", requests: 1, exported: 3},
		{name: "204 without a body", replies: []reply{{status: http.StatusNoContent}}, requests: 1, exported: 3},
		{name: "503 with Retry-After in seconds, then 200",
			replies:  []reply{{status: http.StatusServiceUnavailable, header: map[string]string{"Retry-After": "1"}}},
			requests: 2, minGap: time.Second, exported: 3},
		{name: "429 with Retry-After as a date, then 200",
			replies:  []reply{{status: http.StatusTooManyRequests, retryAfterDate: 2 * time.Second}},
			requests: 2, minGap: 900 * time.Millisecond, exported: 3},
		{name: "429, 502, 503, 504 without Retry-After: backoff, then 200",
			replies: []reply{{status: http.StatusTooManyRequests}, {status: http.StatusBadGateway},
				{status: http.StatusServiceUnavailable}, {status: http.StatusGatewayTimeout}},
			requests: 5, exported: 3},
		{name: "400 with a google.rpc.Status: permanent",
			replies:  []reply{{status: http.StatusBadRequest, header: protobuf, body: status("span 2: invalid span id")}},
			requests: 1, failed: 3, logs: []string{"400 Bad Request: span 2: invalid span id", "cannot export trace spans"}},
		{name: "500 with a text body: permanent",
			replies:  []reply{{status: http.StatusInternalServerError, body: []byte("<html>upstream\n\x00broke</html>")}},
			requests: 1, failed: 3, logs: []string{"500 Internal Server Error: <html>upstream broke</html>"}},
		{name: "401: permanent",
			replies:  []reply{{status: http.StatusUnauthorized}},
			requests: 1, failed: 3, logs: []string{"401 Unauthorized"}},
		{name: "a redirect is not followed",
			replies:  []reply{{status: http.StatusTemporaryRedirect, header: map[string]string{"Location": "http://elsewhere:4318/v1/traces"}}},
			requests: 1, failed: 3, logs: []string{"307 Temporary Redirect", "redirects"}},
		{name: "Retry-After past the export timeout: not retried", timeout: "3000",
			replies:  []reply{{status: http.StatusServiceUnavailable, header: map[string]string{"Retry-After": "60"}}},
			requests: 1, failed: 3, logs: []string{"503 Service Unavailable", "Retry-After: 1m0s", "not retried", "after the export's deadline"}},
		{name: "503 until the export timeout", timeout: "300", always: &reply{status: http.StatusServiceUnavailable},
			failed: 3, logs: []string{"503 Service Unavailable"}},
		{name: "partial success: the rejected spans fail",
			replies: []reply{{status: http.StatusOK, header: protobuf, body: marshal(t, &coltracepb.ExportTraceServiceResponse{
				PartialSuccess: &coltracepb.ExportTracePartialSuccess{RejectedSpans: 1, ErrorMessage: "span 1 is too old"}})}},
			requests: 1, exported: 2, failed: 1, logs: []string{"rejected trace spans", "span 1 is too old"}},
		{name: "a warning with full success",
			replies: []reply{{status: http.StatusOK, header: protobuf, body: marshal(t, &coltracepb.ExportTraceServiceResponse{
				PartialSuccess: &coltracepb.ExportTracePartialSuccess{ErrorMessage: "attribute foo is deprecated"}})}},
			requests: 1, exported: 3, logs: []string{"with a warning", "attribute foo is deprecated"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rcv := &scriptedReceiver{t: t, replies: tc.replies}
			handler := http.Handler(rcv)
			if tc.always != nil {
				handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					rcv.ServeHTTP(httptest.NewRecorder(), r) // records it
					w.WriteHeader(tc.always.status)
				})
			}
			srv := httptest.NewServer(handler)
			defer srv.Close()
			env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL}
			if tc.timeout != "" {
				env["OTEL_EXPORTER_OTLP_TIMEOUT"] = tc.timeout
			}
			te := newTestExporter(t, env)
			start := time.Now()
			if err := te.ExportSpans(context.Background(), stubSpans(3)); err != nil {
				t.Errorf("ExportSpans = %v, want nil (the failure is handled)", err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("ExportSpans took %v", took)
			}
			got := rcv.requests()
			if n := len(got); (tc.requests == 0 && n < 2) || (tc.requests > 0 && n != tc.requests) {
				t.Errorf("%d requests, want %d (0: at least 2)", n, tc.requests)
			}
			for i, r := range got {
				if n := len(r.req.GetResourceSpans()[0].GetScopeSpans()[0].GetSpans()); n != 3 {
					t.Errorf("request %d: %d spans, want 3", i, n)
				}
			}
			if tc.minGap > 0 && len(got) >= 2 {
				if gap := got[1].at.Sub(got[0].at); gap < tc.minGap {
					t.Errorf("retried after %v, want at least %v", gap, tc.minGap)
				}
			}
			if exported, failed := te.counts(); exported != tc.exported || failed != tc.failed {
				t.Errorf("exported %v failed %v, want %v and %v", exported, failed, tc.exported, tc.failed)
			}
			for _, want := range tc.logs {
				if !strings.Contains(te.logs.String(), want) {
					t.Errorf("log lacks %q:\n%s", want, te.logs.String())
				}
			}
		})
	}
}

// TestExportUnreachable: a receiver that is not there is retried, with
// backoff, until the export's timeout.
func TestExportUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	te := newTestExporter(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + addr, "OTEL_EXPORTER_OTLP_TIMEOUT": "300"})
	start := time.Now()
	if err := te.ExportSpans(context.Background(), stubSpans(2)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("ExportSpans took %v with a 300 ms timeout", took)
	}
	if _, failed := te.counts(); failed != 2 {
		t.Errorf("failed %v, want 2", failed)
	}
	out := te.logs.String()
	if !strings.Contains(out, "connection refused") || !strings.Contains(out, "(attempts: ") || strings.Contains(out, "(attempts: 1)") {
		t.Errorf("log does not say it retried a refused connection: %s", out)
	}
}

// TestExportTimeout: OTEL_EXPORTER_OTLP_TIMEOUT bounds an export that gets
// no answer, and the error names it.
func TestExportTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // then the server sees the client leave
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	te := newTestExporter(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "200"})
	start := time.Now()
	if err := te.ExportSpans(context.Background(), stubSpans(1)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 200*time.Millisecond || took > 3*time.Second {
		t.Errorf("ExportSpans took %v with a 200 ms timeout", took)
	}
	if _, failed := te.counts(); failed != 1 {
		t.Errorf("failed %v, want 1", failed)
	}
	if out := te.logs.String(); !strings.Contains(out, "the export timeout passed (OTEL_EXPORTER_OTLP_TRACES_TIMEOUT=200 ms)") {
		t.Errorf("log does not name the timeout: %s", out)
	}
}

// TestExportRequest: the request's headers (OTEL_EXPORTER_OTLP_HEADERS,
// URL-decoded; content type; user agent; the endpoint's credentials as basic
// authentication) and its body, plain or gzipped.
func TestExportRequest(t *testing.T) {
	for _, tc := range []struct {
		name        string
		compression string
		gzip        bool
	}{
		{name: "none", compression: "none"},
		{name: "default: none"},
		{name: "gzip", compression: "gzip", gzip: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rcv := &scriptedReceiver{t: t}
			srv := httptest.NewServer(rcv)
			defer srv.Close()
			env := map[string]string{
				"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": strings.Replace(srv.URL, "://", "://relay:hunter2@", 1) + "/v1/traces?tenant=7",
				"OTEL_EXPORTER_OTLP_HEADERS":         "x-api-key=k%3D1%2C2, x-scope = orders , content-type=text/plain",
			}
			if tc.compression != "" {
				env["OTEL_EXPORTER_OTLP_COMPRESSION"] = tc.compression
			}
			te := newTestExporter(t, env)
			if err := te.ExportSpans(context.Background(), stubSpans(2)); err != nil {
				t.Fatal(err)
			}
			got := rcv.requests()
			if len(got) != 1 {
				t.Fatalf("%d requests, want 1", len(got))
			}
			h := got[0].header
			user, pass, _ := (&http.Request{Header: h}).BasicAuth()
			for name, want := range map[string]string{
				"X-Api-Key": "k=1,2", "X-Scope": "orders", "Content-Type": "application/x-protobuf",
				"User-Agent": "cdc-relay/v1.0.0-test", "basic auth": "relay:hunter2",
			} {
				v := h.Get(name)
				if name == "basic auth" {
					v = user + ":" + pass
				}
				if v != want {
					t.Errorf("%s: %q, want %q", name, v, want)
				}
			}
			if enc := h.Get("Content-Encoding"); (enc == "gzip") != tc.gzip || (!tc.gzip && enc != "") {
				t.Errorf("Content-Encoding %q, want gzip: %v", enc, tc.gzip)
			}
			if n := len(got[0].req.GetResourceSpans()[0].GetScopeSpans()[0].GetSpans()); n != 2 {
				t.Errorf("%d spans decoded, want 2", n)
			}
			if exported, _ := te.counts(); exported != 2 {
				t.Errorf("exported %v, want 2", exported)
			}
		})
	}
}

// TestExportTLS exports to a TLS receiver with a self-signed certificate:
// trusted through OTEL_EXPORTER_OTLP_CERTIFICATE, refused for good without
// it; with a client certificate the receiver requires, sent from
// OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and _CLIENT_KEY.
func TestExportTLS(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	clientCert, clientKey := selfSigned(t)
	clientPEM, clientKeyFile := write("client.pem", clientCert), write("client.key", clientKey)

	for _, tc := range []struct {
		name       string
		trustCA    bool
		clientAuth tls.ClientAuthType
		sendClient bool
		exported   float64
		conns      int // 0: any
		logs       []string
	}{
		{name: "CA from OTEL_EXPORTER_OTLP_CERTIFICATE", trustCA: true, exported: 1},
		{name: "unknown CA: not retried", conns: 1, logs: []string{"certificate signed by unknown authority"}},
		{name: "client certificate", trustCA: true, clientAuth: tls.RequireAndVerifyClientCert, sendClient: true, exported: 1},
		{name: "client certificate required, none sent", trustCA: true, clientAuth: tls.RequireAndVerifyClientCert,
			logs: []string{"certificate required"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rcv := &scriptedReceiver{t: t}
			srv := httptest.NewUnstartedServer(rcv)
			var conns atomic.Int32
			srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					conns.Add(1)
				}
			}
			srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
			if tc.clientAuth != tls.NoClientCert {
				srv.TLS = &tls.Config{ClientAuth: tc.clientAuth, ClientCAs: pool(t, clientCert)}
			}
			srv.StartTLS()
			defer srv.Close()
			env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL, "OTEL_EXPORTER_OTLP_TIMEOUT": "2000"}
			if tc.trustCA {
				env["OTEL_EXPORTER_OTLP_CERTIFICATE"] = write("ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
			}
			if tc.sendClient {
				env["OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"], env["OTEL_EXPORTER_OTLP_CLIENT_KEY"] = clientPEM, clientKeyFile
			}
			te := newTestExporter(t, env)
			if err := te.ExportSpans(context.Background(), stubSpans(1)); err != nil {
				t.Fatal(err)
			}
			exported, failed := te.counts()
			if exported != tc.exported || failed != 1-tc.exported {
				t.Errorf("exported %v failed %v, want %v exported: %s", exported, failed, tc.exported, te.logs.String())
			}
			for _, want := range tc.logs {
				if !strings.Contains(te.logs.String(), want) {
					t.Errorf("log lacks %q: %s", want, te.logs.String())
				}
			}
			if tc.conns > 0 && int(conns.Load()) != tc.conns {
				t.Errorf("%d connections, want %d", conns.Load(), tc.conns)
			}
			if tc.sendClient {
				got := rcv.requests()
				if len(got) != 1 || len(got[0].tls.PeerCertificates) != 1 || !bytes.Equal(got[0].tls.PeerCertificates[0].Raw, der(t, clientCert)) {
					t.Error("the receiver did not get the client certificate")
				}
			}
		})
	}
}

// TestExporterShutdown: Shutdown cuts the export in progress short when its
// context ends, returns that, closes the connections, and later exports
// fail without a request.
func TestExporterShutdown(t *testing.T) {
	arrived := make(chan struct{}, 1)
	var requests atomic.Int32
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		_, _ = io.Copy(io.Discard, r.Body) // then the server sees the client leave
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	te := newTestExporter(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL, "OTEL_EXPORTER_OTLP_TIMEOUT": "0"})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := te.ExportSpans(context.Background(), stubSpans(1)); err != nil {
			t.Error(err)
		}
	}()
	<-arrived
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := te.Shutdown(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown = %v, want the deadline", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Shutdown took %v with a 200 ms deadline", took)
	}
	<-done
	if err := te.ExportSpans(context.Background(), stubSpans(2)); err != nil {
		t.Error(err)
	}
	if _, failed := te.counts(); failed != 3 {
		t.Errorf("failed %v, want 3", failed)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("%d requests, want 1 (none after Shutdown)", n)
	}
	if out := te.logs.String(); !strings.Contains(out, "context deadline exceeded") || !strings.Contains(out, "shut down") {
		t.Errorf("log: %s", out)
	}
	requireSDKStopped(t)
}

// TestRetryAfter reads the header's two forms.
func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"": -1, "120": 2 * time.Minute, "0": 0, " 3 ": 3 * time.Second, "-1": -1, "1.5": -1, "soon": -1,
		"Sun, 01 Mar 2026 12:00:30 GMT": 30 * time.Second, "Sun, 01 Mar 2026 11:00:00 GMT": 0,
	} {
		if got := retryAfter(v, now); got != want {
			t.Errorf("retryAfter(%q) = %v, want %v", v, got, want)
		}
	}
}

// TestBackoff: each wait is from half to all of the first backoff doubled
// per attempt, up to maxBackoff.
func TestBackoff(t *testing.T) {
	e := &exporter{backoff: time.Second}
	for attempt, full := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 6: 30 * time.Second, 60: 30 * time.Second} {
		for range 20 {
			if d := e.wait(attempt); d < full/2 || d > full {
				t.Errorf("attempt %d: wait %v, want from %v to %v", attempt, d, full/2, full)
			}
		}
	}
}
