package cli

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

const testToken = "m3trics-t0ken"

// TestMetricsToken: --metrics-token, --metrics-token-file and their variables
// set the token; errors name the flag and never show the token.
func TestMetricsToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("token", testToken+"\n")
	empty := write("empty", " \n")
	spaced := write("spaced", testToken+" "+testToken)
	base := []string{"run", "--pg-url", "postgres://db/app", "--kafka-brokers", "k:9092"}
	tests := []struct {
		name       string
		args       []string
		env        map[string]string
		want       string // the token after parsing
		wantErr    []string
		openProbes bool
	}{
		{name: "none"},
		{name: "flag", args: []string{"--metrics-token", testToken}, want: testToken},
		{name: "env", env: map[string]string{"CDC_RELAY_METRICS_TOKEN": testToken}, want: testToken},
		{name: "file flag", args: []string{"--metrics-token-file", good}, want: testToken},
		{name: "file env", env: map[string]string{"CDC_RELAY_METRICS_TOKEN_FILE": good}, want: testToken},
		{name: "open probes", args: []string{"--metrics-token-file", good, "--metrics-open-probes"}, want: testToken, openProbes: true},
		{name: "open probes env", env: map[string]string{"CDC_RELAY_METRICS_TOKEN": testToken, "CDC_RELAY_METRICS_OPEN_PROBES": "true"}, want: testToken, openProbes: true},
		{
			name: "both flags", args: []string{"--metrics-token", testToken, "--metrics-token-file", good},
			wantErr: []string{"--metrics-token-file (CDC_RELAY_METRICS_TOKEN_FILE)", "--metrics-token (CDC_RELAY_METRICS_TOKEN)", "both set"},
		},
		{
			name: "both variables", env: map[string]string{"CDC_RELAY_METRICS_TOKEN": testToken, "CDC_RELAY_METRICS_TOKEN_FILE": good},
			wantErr: []string{"--metrics-token-file (CDC_RELAY_METRICS_TOKEN_FILE)", "--metrics-token (CDC_RELAY_METRICS_TOKEN)", "both set"},
		},
		{name: "missing file", args: []string{"--metrics-token-file", filepath.Join(dir, "nope")}, wantErr: []string{"--metrics-token-file", "cannot be read"}},
		{name: "empty file", args: []string{"--metrics-token-file", empty}, wantErr: []string{"--metrics-token-file", "is empty"}},
		{name: "space in file", args: []string{"--metrics-token-file", spaced}, wantErr: []string{"--metrics-token-file", "printable ASCII"}},
		{name: "space in flag", args: []string{"--metrics-token", testToken + " x"}, wantErr: []string{"--metrics-token (CDC_RELAY_METRICS_TOKEN)", "printable ASCII"}},
		{name: "control character", args: []string{"--metrics-token", testToken + "\x01"}, wantErr: []string{"--metrics-token (CDC_RELAY_METRICS_TOKEN)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			c, err := parseArgs(t, append(append([]string(nil), base...), tt.args...)...)
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("parsed, want an error containing %q", tt.wantErr)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("err = %v, want it to contain %q", err, w)
					}
				}
				if strings.Contains(err.Error(), testToken) {
					t.Errorf("error shows the token: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Run.MetricsToken != tt.want || c.Run.MetricsOpenProbes != tt.openProbes {
				t.Errorf("MetricsToken %q, MetricsOpenProbes %v; want %q, %v", c.Run.MetricsToken, c.Run.MetricsOpenProbes, tt.want, tt.openProbes)
			}
			if c.Run.MetricsTokenFile != "" {
				t.Errorf("MetricsTokenFile = %q after parsing, want it read and cleared", c.Run.MetricsTokenFile)
			}
		})
	}
}

// TestStartAdmin starts the server as run does: the token guards it, and a
// warning is logged exactly when other hosts can reach it without a token.
func TestStartAdmin(t *testing.T) {
	tests := []struct {
		name  string
		flags AdminFlags
		warn  bool
	}{
		{name: "loopback, no token", flags: AdminFlags{MetricsAddr: "127.0.0.1:0"}},
		{name: "localhost, no token", flags: AdminFlags{MetricsAddr: "localhost:0"}},
		{name: "all interfaces, no token", flags: AdminFlags{MetricsAddr: ":0"}, warn: true},
		{name: "0.0.0.0, no token", flags: AdminFlags{MetricsAddr: "0.0.0.0:0"}, warn: true},
		{name: "all interfaces, token", flags: AdminFlags{MetricsAddr: ":0", MetricsToken: testToken}},
		{name: "loopback, token", flags: AdminFlags{MetricsAddr: "127.0.0.1:0", MetricsToken: testToken}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			srv, err := tt.flags.startAdmin(prometheus.NewRegistry(), func() bool { return true }, nil, zerolog.New(&logs))
			if err != nil {
				t.Fatal(err)
			}
			addr := *srv.Addr().(*net.TCPAddr)
			if addr.IP.IsUnspecified() { // connect over loopback, in the listener's family
				if addr.IP.To4() != nil {
					addr.IP = net.IPv4(127, 0, 0, 1)
				} else {
					addr.IP = net.IPv6loopback
				}
			}
			for _, auth := range []string{"", "Bearer " + testToken} {
				req, err := http.NewRequest(http.MethodGet, "http://"+addr.String()+"/healthz", nil)
				if err != nil {
					t.Fatal(err)
				}
				if auth != "" {
					req.Header.Set("Authorization", auth)
				}
				resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				if err := resp.Body.Close(); err != nil {
					t.Fatal(err)
				}
				want := http.StatusOK
				if tt.flags.MetricsToken != "" && auth == "" {
					want = http.StatusUnauthorized
				}
				if resp.StatusCode != want {
					t.Errorf("GET /healthz with %q: status %d, want %d", auth, resp.StatusCode, want)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			warned := strings.Contains(logs.String(), `"level":"warn"`) && strings.Contains(logs.String(), "without a token")
			if warned != tt.warn {
				t.Errorf("warned %v, want %v; logs:\n%s", warned, tt.warn, logs.String())
			}
			if strings.Contains(logs.String(), testToken) {
				t.Errorf("logs show the token:\n%s", logs.String())
			}
		})
	}
	srv, err := (&AdminFlags{}).startAdmin(prometheus.NewRegistry(), func() bool { return true }, nil, zerolog.Nop())
	if srv != nil || err != nil {
		t.Errorf("startAdmin with no address = %v, %v; want nil, nil (disabled)", srv, err)
	}
}

// TestRunNeverPrintsMetricsToken runs the relay against closed ports with a
// token, at debug level: the run fails, and neither logs nor error show it.
func TestRunNeverPrintsMetricsToken(t *testing.T) {
	clearEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, format := range []string{"json", "console"} {
		err, out, errOut := run(t, ctx, "run", "--pg-url", "postgres://u@"+closedAddr(t)+"/db", "--kafka-brokers", closedAddr(t),
			"--metrics-addr", "127.0.0.1:0", "--metrics-token", testToken, "--log-level", "debug", "--log-format", format)
		if err == nil {
			t.Fatalf("run against closed ports returned nil")
		}
		if !strings.Contains(errOut, "serving /metrics") {
			t.Errorf("%s logs lack the metrics server's start line:\n%s", format, errOut)
		}
		for what, s := range map[string]string{"error": err.Error(), "stdout": out, "stderr": errOut} {
			if strings.Contains(s, testToken) {
				t.Errorf("%s (%s logs) shows the token:\n%s", what, format, s)
			}
		}
	}
}
