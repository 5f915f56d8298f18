package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// TestExitCode checks the classification main exits with.
func TestExitCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"success", nil, 0},
		{"runtime failure", errors.New("connect to Postgres: refused"), ExitFailure},
		{"usage", &usageError{errors.New("--pg-url is required")}, ExitUsage},
		{"usage, reported", &reportedError{&usageError{errors.New("bad")}}, ExitUsage},
		{"field error from the relay's Validate", fmt.Errorf("relay: %w", setting.Namer{}.Errorf("Topic", "is empty")), ExitUsage},
		{"server-side check naming a setting", &replication.ConfigError{Msg: "table missing", Err: setting.Namer{}.Errorf("Decoder.Table", "does not exist")}, ExitFailure},
		{"explicit code", &ExitError{Code: 2, Err: errors.New("slot lost")}, 2},
		{"runtime failure, reported", &reportedError{errors.New("halted")}, ExitFailure},
	}
	for _, tt := range tests {
		if got := ExitCode(tt.err); got != tt.want {
			t.Errorf("%s: ExitCode(%v) = %d, want %d", tt.name, tt.err, got, tt.want)
		}
	}
}

// TestErrorShape runs commands that fail, each in one log format, and checks
// the one shape of the failure on that output: a JSON log line (exit_code
// included) that main does not print again, or nothing on stderr and an
// error whose ErrorLine is one plain line; and the exit code: 2 for the
// command line, environment or config file, 1 for a runtime failure.
func TestErrorShape(t *testing.T) {
	refused := closedAddr(t)
	pgURL := "postgres://relay:pw-Secret-1@" + refused + "/app?sslmode=disable&connect_timeout=5"
	runArgs := func(extra ...string) []string {
		return append([]string{"run", "--metrics-addr", "127.0.0.1:0", "--topic", "t"}, extra...)
	}
	badYAML := writeFile(t, t.TempDir(), "relay.yaml", "pg-url: x\nkafka-brokers: [k:9092\nslot: s\n")
	tests := []struct {
		name string
		args []string
		env  map[string]string
		json bool // want a JSON line, else a plain error
		code int
		want string // in the error
	}{
		{"missing flag, JSON (stderr is no terminal)", runArgs("--kafka-brokers", "k:9092"), nil, true, ExitUsage, "--pg-url"},
		{"missing flag, console", runArgs("--kafka-brokers", "k:9092", "--log-format", "console"), nil, false, ExitUsage, "--pg-url"},
		{"unknown flag, JSON by flag", runArgs("--log-format=json", "--no-such-flag"), nil, true, ExitUsage, "--no-such-flag"},
		{"unknown flag, console by environment", runArgs("--no-such-flag"), map[string]string{"CDC_RELAY_LOG_FORMAT": "console"}, false, ExitUsage, "--no-such-flag"},
		{"bad config file, JSON", runArgs("--config", badYAML), nil, true, ExitUsage, "relay.yaml, line 2: not valid YAML"},
		{"bad config file, console", runArgs("--config", badYAML, "--log-format", "console"), nil, false, ExitUsage, "line 2"},
		{"bad value", runArgs("--pg-url", pgURL, "--kafka-brokers", "k:9092", "--status-interval=-1s", "--log-format", "console"), nil, false, ExitUsage, "--status-interval"},
		{"status usage error, plain (no log)", []string{"status"}, nil, false, ExitUsage, "--pg-url"},
		{"Postgres refused, JSON", runArgs("--pg-url", pgURL, "--kafka-brokers", "k:9092", "--log-format", "json"), nil, true, ExitFailure, "connect to Postgres"},
		{"Postgres refused, console", runArgs("--pg-url", pgURL, "--kafka-brokers", "k:9092", "--log-format", "console"), nil, false, ExitFailure, "connect to Postgres"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var stdout, stderr bytes.Buffer
			err := Run(ctx, tt.args, Env{Stdout: &stdout, Stderr: &stderr, Version: "test"})
			if err == nil {
				t.Fatal("no error")
			}
			if code := ExitCode(err); code != tt.code {
				t.Errorf("exit code %d, want %d: %v", code, tt.code, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error lacks %q: %v", tt.want, err)
			}
			if strings.Contains(stderr.String(), "pw-Secret-1") || strings.Contains(err.Error(), "pw-Secret-1") {
				t.Errorf("the password is shown:\n%v\n%s", err, stderr.String())
			}
			lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
			if !tt.json {
				if Reported(err) {
					t.Errorf("reported, want it left to main as a plain line; stderr:\n%s", stderr.String())
				}
				for _, l := range lines {
					if strings.HasPrefix(l, "{") || strings.Contains(l, "ERR") {
						t.Errorf("stderr has an error log line besides the plain error: %s", l)
					}
				}
				if line := ErrorLine(err); !strings.HasPrefix(line, "cdc-relay: ") || strings.ContainsAny(line, "\n\t") || strings.Contains(line, `\n`) {
					t.Errorf("ErrorLine is not one plain line: %q", line)
				}
				return
			}
			if !Reported(err) {
				t.Errorf("not reported: main would print it a second time, as plain text")
			}
			last := lines[len(lines)-1]
			for _, l := range lines {
				var rec map[string]any
				if err := json.Unmarshal([]byte(l), &rec); err != nil {
					t.Errorf("stderr line is not JSON: %q", l)
				}
			}
			var rec struct {
				Level    string `json:"level"`
				Error    string `json:"error"`
				ExitCode int    `json:"exit_code"`
				Message  string `json:"message"`
			}
			if err := json.Unmarshal([]byte(last), &rec); err != nil {
				t.Fatalf("last stderr line: %v: %q", err, last)
			}
			if rec.Level != "error" || rec.ExitCode != tt.code || !strings.Contains(rec.Error, tt.want) || strings.Contains(rec.Error, "\n") {
				t.Errorf("last line %q: want level error, exit_code %d, a one-line error with %q", last, tt.code, tt.want)
			}
		})
	}
}

// TestUsageLogFormat checks how the format of a failed parse is found.
func TestUsageLogFormat(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "CDC_RELAY_LOG_FORMAT" {
				return v
			}
			return ""
		}
	}
	tests := []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"run", "--log-format=json"}, "", "json"},
		{[]string{"run", "--log-format", "console"}, "json", "console"},
		{[]string{"run"}, "console", "console"},
		{[]string{"run"}, "", "auto"},
		{[]string{"--config", "run", "status"}, "", ""}, // run is the file's name
		{[]string{"--config", "f.yaml", "run", "--bad"}, "", "auto"},
		{[]string{"dlq", "replay", "--topic", "run"}, "json", ""},
		{[]string{"status", "--pg-url", "x"}, "", ""},
	}
	for _, tt := range tests {
		if got := usageLogFormat(&CLI{}, tt.args, env(tt.env)); got != tt.want {
			t.Errorf("usageLogFormat(%q, CDC_RELAY_LOG_FORMAT=%q) = %q, want %q", tt.args, tt.env, got, tt.want)
		}
	}
}
