package admin_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/admin"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
)

const token = "s3cret-T0ken_value.~+/="

// TestToken checks every endpoint against every way of (not) sending the
// token, with and without --metrics-open-probes.
func TestToken(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics.New(reg).SetState(metrics.StateStreaming)

	auths := []struct {
		name   string
		header string // Authorization; none when empty
		ok     bool
	}{
		{"missing header", "", false},
		{"right token", "Bearer " + token, true},
		{"scheme in lower case", "bearer " + token, true},
		{"wrong token", "Bearer not-the-token", false},
		{"wrong token of the same length", "Bearer " + strings.Repeat("x", len(token)), false},
		{"token prefix", "Bearer " + token[:len(token)-1], false},
		{"token and more", "Bearer " + token + "x", false},
		{"empty bearer", "Bearer ", false},
		{"scheme only", "Bearer", false},
		{"token without scheme", token, false},
		{"other scheme", "Basic " + token, false},
		{"basic auth with the token as password", "Basic dXNlcjpzM2NyZXQtVDBrZW5fdmFsdWUufisvPQ==", false},
	}
	endpoints := []struct {
		path  string
		probe bool   // /healthz, /readyz: open with OpenProbes
		body  string // in a 200 body
	}{
		{"/metrics", false, `cdc_relay_state{state="streaming"} 1`},
		{"/healthz", true, "ok"},
		{"/readyz", true, "ready"},
	}
	for _, cfg := range []struct {
		name       string
		token      string
		openProbes bool
	}{
		{"no token", "", false},
		{"no token, open probes", "", true},
		{"token", token, false},
		{"token, open probes", token, true},
	} {
		h := admin.Handler(admin.Config{Registry: reg, Ready: func() bool { return true }, Token: cfg.token, OpenProbes: cfg.openProbes})
		for _, ep := range endpoints {
			for _, a := range auths {
				t.Run(cfg.name+"/"+ep.path+"/"+a.name, func(t *testing.T) {
					req := httptest.NewRequest(http.MethodGet, ep.path, nil)
					if a.header != "" {
						req.Header.Set("Authorization", a.header)
					}
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					body := rec.Body.String()

					open := cfg.token == "" || a.ok || (cfg.openProbes && ep.probe)
					if !open {
						if rec.Code != http.StatusUnauthorized {
							t.Fatalf("status %d, want 401; body %q", rec.Code, body)
						}
						if got := rec.Header().Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
							t.Errorf("WWW-Authenticate = %q, want a Bearer challenge", got)
						}
						if strings.Contains(body, "cdc_relay_") || strings.Contains(body, token) {
							t.Errorf("401 body shows metrics or the token: %q", body)
						}
						return
					}
					if rec.Code != http.StatusOK {
						t.Fatalf("status %d, want 200; body %q", rec.Code, body)
					}
					if !strings.Contains(body, ep.body) {
						t.Errorf("body lacks %q:\n%s", ep.body, body)
					}
					if got := rec.Header().Get("WWW-Authenticate"); got != "" {
						t.Errorf("WWW-Authenticate = %q on a 200", got)
					}
				})
			}
		}
	}
}

// TestTokenBeforeRouting: without the token, unknown paths and wrong methods
// get 401 too, so a client learns nothing about the routes; open probes are
// exactly /healthz and /readyz.
func TestTokenBeforeRouting(t *testing.T) {
	h := admin.Handler(admin.Config{Registry: prometheus.NewRegistry(), Ready: func() bool { return false }, Token: token, OpenProbes: true})
	tests := []struct {
		method, path string
		auth         bool
		code         int
	}{
		{http.MethodGet, "/debug/pprof/", false, http.StatusUnauthorized},
		{http.MethodGet, "/debug/pprof/", true, http.StatusNotFound},
		{http.MethodPost, "/metrics", false, http.StatusUnauthorized},
		{http.MethodPost, "/metrics", true, http.StatusMethodNotAllowed},
		{http.MethodGet, "/healthz/", false, http.StatusUnauthorized},
		{http.MethodGet, "/readyz/x", false, http.StatusUnauthorized},
		{http.MethodGet, "/metrics/../healthz", false, http.StatusUnauthorized},
		{http.MethodGet, "/readyz", false, http.StatusServiceUnavailable}, // open probe, not ready
		{http.MethodPost, "/healthz", false, http.StatusMethodNotAllowed}, // open probe, still read-only
	}
	for _, tt := range tests {
		req := httptest.NewRequest(tt.method, tt.path, nil)
		if tt.auth {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tt.code {
			t.Errorf("%s %s (token %v): status %d, want %d", tt.method, tt.path, tt.auth, rec.Code, tt.code)
		}
	}
}

// TestTokenServer runs the token check over a real server and checks that the
// token appears in none of its log lines.
func TestTokenServer(t *testing.T) {
	var logs bytes.Buffer
	srv, err := admin.Start(admin.Config{
		Addr: "127.0.0.1:0", Registry: prometheus.NewRegistry(), Ready: func() bool { return true },
		Token: token, Logger: zerolog.New(&logs).Level(zerolog.DebugLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + srv.Addr().String()
	c := &http.Client{Timeout: 5 * time.Second}
	for _, tt := range []struct {
		header string
		code   int
	}{
		{"", http.StatusUnauthorized},
		{"Bearer wrong", http.StatusUnauthorized},
		{"Bearer " + token, http.StatusOK},
	} {
		req, err := http.NewRequest(http.MethodGet, base+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		if tt.header != "" {
			req.Header.Set("Authorization", tt.header)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if err := resp.Body.Close(); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != tt.code {
			t.Errorf("GET /metrics with %q: status %d, want %d", tt.header, resp.StatusCode, tt.code)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), `"token":true`) {
		t.Errorf("start line does not say a token is required:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), token) {
		t.Errorf("logs show the token:\n%s", logs.String())
	}
}

func TestLoopback(t *testing.T) {
	tests := []struct {
		addr net.Addr
		want bool
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9187}, true},
		{&net.TCPAddr{IP: net.IPv4(127, 1, 2, 3), Port: 9187}, true},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 9187}, true},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 9187}, false},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 9187}, false},
		{&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 9187}, false},
		{&net.UnixAddr{Name: "/tmp/x", Net: "unix"}, false},
	}
	for _, tt := range tests {
		if got := admin.Loopback(tt.addr); got != tt.want {
			t.Errorf("Loopback(%v) = %v, want %v", tt.addr, got, tt.want)
		}
	}
}

// TestOpenWithoutTokenWarns: a server reachable from other hosts without a
// token says so, naming the settings through the caller's Namer; with a
// token, or on loopback, it says nothing of the kind.
func TestOpenWithoutTokenWarns(t *testing.T) {
	for _, tt := range []struct {
		name, addr, token string
		warn              bool
	}{
		{"all interfaces, no token", "0.0.0.0:0", "", true},
		{"all interfaces, token", "0.0.0.0:0", "secret", false},
		{"loopback, no token", "127.0.0.1:0", "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs strings.Builder
			srv, err := admin.Start(admin.Config{Addr: tt.addr, Registry: prometheus.NewRegistry(), Ready: func() bool { return true },
				Token: tt.token, Logger: zerolog.New(&logs)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
			got := strings.Contains(logs.String(), "reachable from other hosts without a token")
			if got != tt.warn {
				t.Errorf("warned %v, want %v: %s", got, tt.warn, logs.String())
			}
			if tt.warn && !strings.Contains(logs.String(), "(setting Token)") {
				t.Errorf("the warning does not name the token setting: %s", logs.String())
			}
		})
	}
}

// TestValidToken: a token goes into a header as is, so spaces and bytes
// outside visible ASCII are refused.
func TestValidToken(t *testing.T) {
	for token, want := range map[string]bool{"abc-123_~": true, "a b": false, "tab\t": false, "é": false, "": true} {
		if got := admin.ValidToken(token); got != want {
			t.Errorf("ValidToken(%q) = %v, want %v", token, got, want)
		}
	}
}
