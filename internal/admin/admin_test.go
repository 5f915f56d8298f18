package admin_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/admin"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
)

type response struct {
	code int
	body string
}

func do(t *testing.T, method, url string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return response{resp.StatusCode, string(b)}
}

func TestServer(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	m.EventsPublished.WithLabelValues("outbox.events").Add(3)
	m.SetState(metrics.StateStreaming)
	var ready atomic.Bool

	srv, err := admin.Start(admin.Config{Addr: "127.0.0.1:0", Registry: reg, Ready: ready.Load, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = srv.Shutdown(context.Background())
		}
	})
	addr := srv.Addr().String()
	base := "http://" + addr

	tests := []struct {
		name, method, path string
		ready              bool
		code               int
		exact              string   // the whole body, trimmed, when set
		body               []string // substrings the body must contain
	}{
		{"healthz", http.MethodGet, "/healthz", false, http.StatusOK, "ok", nil},
		{"readyz not ready", http.MethodGet, "/readyz", false, http.StatusServiceUnavailable, "", []string{"not ready"}},
		{"readyz ready", http.MethodGet, "/readyz", true, http.StatusOK, "ready", nil},
		{"readyz not ready again", http.MethodGet, "/readyz", false, http.StatusServiceUnavailable, "", []string{"not ready"}},
		{"healthz ignores readiness", http.MethodGet, "/healthz", false, http.StatusOK, "ok", nil},
		{"metrics", http.MethodGet, "/metrics", false, http.StatusOK, "", []string{
			`cdc_relay_events_published_total{topic="outbox.events"} 3`,
			`cdc_relay_state{state="streaming"} 1`,
			`cdc_relay_state{state="starting"} 0`,
		}},
		{"HEAD metrics", http.MethodHead, "/metrics", false, http.StatusOK, "", nil}, // GET patterns match HEAD
		{"POST metrics", http.MethodPost, "/metrics", false, http.StatusMethodNotAllowed, "", nil},
		{"POST readyz", http.MethodPost, "/readyz", true, http.StatusMethodNotAllowed, "", nil},
		{"DELETE healthz", http.MethodDelete, "/healthz", false, http.StatusMethodNotAllowed, "", nil},
		{"unknown path", http.MethodGet, "/debug/pprof/", false, http.StatusNotFound, "", nil},
		{"root", http.MethodGet, "/", false, http.StatusNotFound, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ready.Store(tt.ready)
			got := do(t, tt.method, base+tt.path)
			if got.code != tt.code {
				t.Errorf("%s %s: status %d, want %d; body %q", tt.method, tt.path, got.code, tt.code, got.body)
			}
			if tt.exact != "" && strings.TrimSpace(got.body) != tt.exact {
				t.Errorf("%s %s: body %q, want %q", tt.method, tt.path, got.body, tt.exact)
			}
			for _, want := range tt.body {
				if !strings.Contains(got.body, want) {
					t.Errorf("%s %s: body lacks %q:\n%s", tt.method, tt.path, want, got.body)
				}
			}
		})
	}

	// What is served passes promlint (the registry itself is linted in
	// internal/metrics).
	problems, err := promlint.New(strings.NewReader(do(t, http.MethodGet, base+"/metrics").body)).Lint()
	if err != nil {
		t.Fatalf("lint /metrics: %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint /metrics: %s: %s", p.Metric, p.Text)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	stopped = true
	// The port is released: it can be listened on again, and the old server no
	// longer answers.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("port %s not released after Shutdown: %v", addr, err)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := (&http.Client{Timeout: time.Second}).Get(base + "/healthz"); err == nil {
		t.Errorf("GET /healthz succeeded after Shutdown")
	}
}

func TestStartBadAddr(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	reg := prometheus.NewRegistry()
	for _, addr := range []string{ln.Addr().String(), "127.0.0.1:notaport"} {
		srv, err := admin.Start(admin.Config{Addr: addr, Registry: reg, Ready: func() bool { return true }, Logger: zerolog.Nop()})
		if err == nil {
			_ = srv.Shutdown(context.Background())
			t.Errorf("Start(%q) succeeded, want an error", addr)
			continue
		}
		if !strings.Contains(err.Error(), addr) {
			t.Errorf("Start(%q) error %q does not name the address", addr, err)
		}
	}
}

// TestShutdownExpiredContext checks that Shutdown with an already expired context
// still returns (with the context's error) and waits for the serve goroutine.
func TestShutdownExpiredContext(t *testing.T) {
	srv, err := admin.Start(admin.Config{Addr: "127.0.0.1:0", Registry: prometheus.NewRegistry(), Ready: func() bool { return false }, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }()
	select {
	case <-done: // nil (no open connections) or ctx.Err(): either way it returned
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown with a canceled context did not return")
	}
}

// TestPprof: the profiles are served only when asked for, and behind the
// token like /metrics.
func TestPprof(t *testing.T) {
	reg := prometheus.NewRegistry()
	tests := []struct {
		name   string
		cfg    admin.Config
		header string
		path   string
		code   int
		body   string // a substring the body must contain
	}{
		{"off by default", admin.Config{}, "", "/debug/pprof/", http.StatusNotFound, ""},
		{"index", admin.Config{Pprof: true}, "", "/debug/pprof/", http.StatusOK, "heap"},
		{"heap profile", admin.Config{Pprof: true}, "", "/debug/pprof/heap?debug=1", http.StatusOK, "heap profile"},
		{"cpu profile", admin.Config{Pprof: true}, "", "/debug/pprof/profile?seconds=1", http.StatusOK, ""},
		{"needs the token", admin.Config{Pprof: true, Token: "s3cret", OpenProbes: true}, "", "/debug/pprof/heap", http.StatusUnauthorized, ""},
		{"with the token", admin.Config{Pprof: true, Token: "s3cret"}, "Bearer s3cret", "/debug/pprof/goroutine?debug=1", http.StatusOK, "goroutine profile"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Registry, tt.cfg.Ready, tt.cfg.Logger = reg, func() bool { return true }, zerolog.Nop()
			srv := httptest.NewServer(admin.Handler(tt.cfg))
			defer srv.Close()
			req, err := http.NewRequest(http.MethodGet, srv.URL+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tt.header != "" {
				req.Header.Set("Authorization", tt.header)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.code {
				t.Fatalf("GET %s: status %d, want %d; body %.200q", tt.path, resp.StatusCode, tt.code, b)
			}
			if !strings.Contains(string(b), tt.body) {
				t.Errorf("GET %s: body lacks %q: %.300q", tt.path, tt.body, b)
			}
			if tt.code == http.StatusOK && len(b) == 0 {
				t.Errorf("GET %s: empty body", tt.path)
			}
		})
	}
}

// TestShutdownEndsAProfile: a CPU profile being taken (30 s asked for) does
// not hold a clean stop up: Shutdown returns within its 10 s bound, without
// an error, and the profile's request ends.
func TestShutdownEndsAProfile(t *testing.T) {
	srv, err := admin.Start(admin.Config{Addr: "127.0.0.1:0", Registry: prometheus.NewRegistry(),
		Ready: func() bool { return true }, Pprof: true, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + srv.Addr().String()
	var ended chan int
	profile := func() {
		ended = make(chan int, 1)
		go func(ended chan<- int) {
			resp, err := http.Get(base + "/debug/pprof/profile?seconds=30")
			if err != nil {
				ended <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			ended <- resp.StatusCode
		}(ended)
	}
	profile()
	// The profile is being taken once a second one is refused (one at a
	// time). A probe that won the race instead made the 30 s one fail: ask
	// again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(base + "/debug/pprof/profile?seconds=1")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusInternalServerError {
				break
			}
		}
		select {
		case <-ended:
			profile()
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the 30 s profile never started")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown during a profile: %v", err)
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the profile's request did not end after Shutdown")
	}
}

// TestReadyzSaysWhatIsDown: a 503 from /readyz names what NotReady says is
// down, and without NotReady says what may be.
func TestReadyzSaysWhatIsDown(t *testing.T) {
	for _, tt := range []struct {
		name     string
		notReady func() string
		want     string
	}{
		{"postgres", func() string { return "Postgres: the replication connection failed, reconnecting: EOF" },
			"not ready: Postgres: the replication connection failed, reconnecting: EOF\n"},
		{"kafka", func() string { return "Kafka: not accepting events (produce requests failing, retrying)" },
			"not ready: Kafka: not accepting events (produce requests failing, retrying)\n"},
		{"no reason", func() string { return "" }, "not ready: not streaming, or Kafka is not accepting events\n"},
		{"no NotReady", nil, "not ready: not streaming, or Kafka is not accepting events\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := admin.Handler(admin.Config{Registry: prometheus.NewRegistry(), Ready: func() bool { return false }, NotReady: tt.notReady})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			if rec.Code != http.StatusServiceUnavailable || rec.Body.String() != tt.want {
				t.Errorf("/readyz: %d %q, want 503 %q", rec.Code, rec.Body.String(), tt.want)
			}
		})
	}
}
