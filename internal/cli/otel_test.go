package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// clearOTelEnv unsets every OTEL_* variable for the test (restored after).
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

// TestOtelExporterFlag: --otel-exporter is none by default and set like
// every run flag, by flag, CDC_RELAY_OTEL_EXPORTER or the config file key
// otel-exporter, which config print names as its source; other values are
// refused naming the flag.
func TestOtelExporterFlag(t *testing.T) {
	for _, tc := range []struct {
		name, env, file string
		args            []string
		want, source    string
		wantErr         string
	}{
		{name: "default", want: "none", source: sourceDefault},
		{name: "flag", args: []string{"--otel-exporter", "otlp"}, want: "otlp", source: sourceFlag},
		{name: "env", env: "otlp", want: "otlp", source: sourceEnv},
		{name: "file", file: "otel-exporter: otlp\n", want: "otlp", source: sourceFile},
		{name: "flag over env", env: "otlp", args: []string{"--otel-exporter", "none"}, want: "none", source: sourceFlag},
		{name: "unknown", args: []string{"--otel-exporter", "jaeger"}, wantErr: "--otel-exporter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			if tc.env != "" {
				t.Setenv("CDC_RELAY_OTEL_EXPORTER", tc.env)
			}
			args := append([]string{"--pg-url", "postgres://db/app", "--kafka-brokers", "k:9092"}, tc.args...)
			if tc.file != "" {
				args = append(args, "--config", writeFile(t, t.TempDir(), "relay.yaml", tc.file))
			}
			c, err := parseArgs(t, append([]string{"run"}, args...)...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Run.OtelExporter != tc.want {
				t.Errorf("OtelExporter = %q, want %q", c.Run.OtelExporter, tc.want)
			}
			if got := configPrint(t, args...).source("otel-exporter"); got != tc.source {
				t.Errorf("config print: source %q, want %q", got, tc.source)
			}
		})
	}
}

// TestRunOtelExporter: run with --otel-exporter otlp refuses a bad OTEL_*
// variable before connecting, naming it and the flag; with good ones it logs
// where spans go, and stops the exporter when the relay stops (here: it
// cannot reach Postgres).
func TestRunOtelExporter(t *testing.T) {
	clearEnv(t)
	clearOTelEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	args := []string{"run", "--pg-url", "postgres://u@" + closedAddr(t) + "/db?connect_timeout=1", "--kafka-brokers", closedAddr(t),
		"--metrics-addr", "", "--log-format", "json", "--otel-exporter", "otlp"}

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")
	err, _, _ := run(t, ctx, args...)
	if err == nil || !strings.Contains(err.Error(), "--otel-exporter (CDC_RELAY_OTEL_EXPORTER) otlp: OTEL_EXPORTER_OTLP_ENDPOINT") {
		t.Fatalf("error %v, want one naming --otel-exporter and OTEL_EXPORTER_OTLP_ENDPOINT", err)
	}

	rcv := testenv.NewOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.HTTPURL())
	err, _, stderr := run(t, ctx, args...)
	if err == nil || !strings.Contains(err.Error(), "connect") {
		t.Fatalf("run against a closed Postgres port: %v", err)
	}
	if !strings.Contains(stderr, `"endpoint":"`+rcv.HTTPURL()+`/v1/traces"`) || !strings.Contains(stderr, "exporting a span per event") {
		t.Errorf("the log does not say where spans go:\n%s", stderr)
	}
	testenv.Eventually(t, 2*time.Second, func() error {
		for _, g := range testenv.GoroutineStacks() {
			if strings.Contains(g, "go.opentelemetry.io/otel/sdk/trace.") {
				return fmt.Errorf("the span processor still runs after run returned:\n%s", g)
			}
		}
		return nil
	})
}
