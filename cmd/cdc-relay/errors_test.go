package main

// The binary's failures as a newcomer meets them: the exit code, the one
// shape of the error on each output, the "waiting for" lines while a
// dependency does not answer, and a wrong Postgres password.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/relayproc/relaytest"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// started is a binary run whose output the test polls while it runs.
type started struct {
	*relaytest.Proc
	start time.Time
}

// startBinary runs the binary with args; it is killed when t ends.
func startBinary(t *testing.T, args ...string) *started {
	t.Helper()
	p := relaytest.New(t, relayproc.Options{Path: relayBin, Args: args})
	p.Start()
	return &started{Proc: p, start: time.Now()}
}

// waitLine waits up to timeout for a line of output containing substr (in
// its message, for a JSON line) and returns it and how long after the start it was there.
func (s *started) waitLine(substr string, timeout time.Duration) (string, time.Duration) {
	return s.WaitLog(substr, timeout), time.Since(s.start)
}

// exitCode waits up to timeout for the process to exit and returns its code.
func (s *started) exitCode(t *testing.T, timeout time.Duration) int {
	t.Helper()
	code, ok := s.Wait(timeout)
	if !ok {
		t.Fatalf("still running after %v", timeout)
	}
	return code
}

// lastLine is the output's last non-empty line.
func (s *started) lastLine() string {
	lines := strings.Split(strings.TrimSpace(s.Output()), "\n")
	return lines[len(lines)-1]
}

// jsonRecord parses a JSON log line, failing t when it is not one.
func jsonRecord(t *testing.T, line string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		t.Fatalf("not a JSON line: %q", line)
	}
	return m
}

// checkPlainError checks the plain shape: one line "cdc-relay: ..." with want.
func checkPlainError(t *testing.T, line string, want ...string) {
	t.Helper()
	if !strings.HasPrefix(line, "cdc-relay: ") || strings.Contains(line, `\n`) || strings.Contains(line, "\t") || strings.HasPrefix(line, "{") {
		t.Errorf("want one plain line \"cdc-relay: ...\", got %q", line)
	}
	for _, w := range want {
		if !strings.Contains(line, w) {
			t.Errorf("error lacks %q: %s", w, line)
		}
	}
}

// TestWaitingForKafka starts the relay against a broker address where
// nothing listens: within a couple of seconds a line says what it waits for
// and where, progress follows, and when it gives up (--kafka-start-timeout)
// it exits 1 with an error that says the same, in the output's one shape.
func TestWaitingForKafka(t *testing.T) {
	f := newFixture(t, sharedPG, t.Name(), false)
	port, err := sandbox.FreePort() // nothing listens on it
	if err != nil {
		t.Fatal(err)
	}
	broker := "127.0.0.1:" + strconv.Itoa(port)
	for _, format := range []string{"json", "console"} {
		t.Run(format, func(t *testing.T) {
			// Each waits --kafka-start-timeout; with halt neither creates the
			// dead-letter table (two runs creating it at once would race).
			t.Parallel()
			s := startBinary(t, "run", "--pg-url", f.url, "--kafka-brokers", broker, "--topic", f.topic, "--slot", f.slot, "--on-error", "halt",
				"--metrics-addr", "127.0.0.1:0", "--log-format", format, "--kafka-start-timeout", "7s")
			// The relay has a fixed topic: it waits for the topic's partitions.
			awaited := fmt.Sprintf("topic %q on Kafka brokers at %s", f.topic, broker)
			line, after := s.waitLine("waiting for "+awaited, 10*time.Second)
			t.Logf("%s: the waiting line came %v after the start: %s", format, after.Round(time.Millisecond), line)
			if !strings.Contains(line, "--kafka-brokers") || !strings.Contains(line, "giving up in 7s") {
				t.Errorf("the waiting line does not say what to check and when it gives up: %s", line)
			}
			if strings.Count(strings.ReplaceAll(s.Output(), `\"`, `"`), "waiting for "+awaited) != 1 {
				t.Errorf("want ONE waiting line, then progress lines:\n%s", s.Output())
			}
			s.waitLine("still waiting for "+awaited, 10*time.Second)
			if code := s.exitCode(t, 20*time.Second); code != 1 {
				t.Errorf("exit code %d, want 1 (a runtime failure)", code)
			}
			want := []string{"reach Kafka brokers " + broker, "--kafka-brokers", "waited 7s for " + awaited, "failed attempts", "connection refused"}
			last := s.lastLine()
			if format == "console" {
				checkPlainError(t, last, want...)
				return
			}
			rec := jsonRecord(t, last)
			msg, _ := rec["error"].(string)
			for _, w := range want {
				if !strings.Contains(msg, w) {
					t.Errorf("error lacks %q: %s", w, last)
				}
			}
			if rec["exit_code"] != 1.0 || rec["level"] != "error" {
				t.Errorf("last line: %s", last)
			}
			for _, l := range strings.Split(strings.TrimSpace(s.Output()), "\n") {
				jsonRecord(t, l) // every line of a JSON run is JSON
			}
		})
	}
}

// TestWaitingForPostgres starts the relay against a Postgres address that
// accepts connections and never answers: a line says so within a couple of
// seconds, and the error when connect_timeout gives up says how long it
// waited, for what and where, without the password.
func TestWaitingForPostgres(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accept, never answer
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	addr := ln.Addr().String()
	s := startBinary(t, "run", "--pg-url", "postgres://relay:pg-Secret-5@"+addr+"/app?connect_timeout=6",
		"--kafka-brokers", "127.0.0.1:9", "--topic", "t", "--metrics-addr", "127.0.0.1:0", "--log-format", "console")
	line, after := s.waitLine("waiting for Postgres at "+addr, 10*time.Second)
	t.Logf("the waiting line came %v after the start: %s", after.Round(time.Millisecond), line)
	if !strings.Contains(line, "--pg-url") || !strings.Contains(line, "connect_timeout") {
		t.Errorf("the waiting line does not say what to check: %s", line)
	}
	s.waitLine("still waiting for Postgres at "+addr, 10*time.Second)
	if code := s.exitCode(t, 20*time.Second); code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	checkPlainError(t, s.lastLine(), "connect to Postgres postgres://relay:REDACTED@"+addr, "for Postgres at "+addr)
	if strings.Contains(s.Output(), "pg-Secret-5") {
		t.Errorf("the output shows the password:\n%s", s.Output())
	}
}

// TestWrongPostgresPassword runs the relay with a wrong password against a
// server without TLS, with pgx's default sslmode=prefer: the error leads with
// the refused password and what to check, on one line, without the TLS
// attempt's "server refused TLS connection", and exits 1.
func TestWrongPostgresPassword(t *testing.T) {
	pg := testenv.NewPostgres(t, sandbox.PGOptions{HBA: []string{"host all pw_relay 127.0.0.1/32 scram-sha-256"}})
	testenv.RequireLocal(t, pg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pg.Exec(ctx, "postgres", "CREATE ROLE pw_relay LOGIN REPLICATION PASSWORD 'right-Secret-2'"); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("pw_relay", "wrong-Secret-3")
	u.RawQuery = "" // sslmode=prefer: a TLS attempt, then a plaintext one
	for _, format := range []string{"console", "json"} {
		t.Run(format, func(t *testing.T) {
			s := startBinary(t, "run", "--pg-url", u.String(), "--kafka-brokers", "127.0.0.1:9", "--topic", "t",
				"--metrics-addr", "127.0.0.1:0", "--log-format", format)
			if code := s.exitCode(t, 20*time.Second); code != 1 {
				t.Errorf("exit code %d, want 1", code)
			}
			out := s.Output()
			want := []string{"wrong password: check the user and password in the Postgres URL source.pg_url (--pg-url / CDC_RELAY_PG_URL)", `password authentication failed for user "pw_relay"`}
			if strings.Contains(out, "refused TLS") || strings.Contains(out, "wrong-Secret-3") {
				t.Errorf("output has the TLS attempt or the password:\n%s", out)
			}
			last := s.lastLine()
			if format == "console" {
				checkPlainError(t, last, want...)
			} else {
				msg, _ := jsonRecord(t, last)["error"].(string)
				for _, w := range want {
					if !strings.Contains(msg, w) {
						t.Errorf("error lacks %q: %s", w, last)
					}
				}
			}
			t.Logf("%s: %s", format, last)
		})
	}
}

// TestUsageExitCodes checks that mistakes in the command line, environment
// or config file exit 2, in the output's one shape, and that help exits 0.
func TestUsageExitCodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	badYAML := filepath.Join(dir, "relay.yaml")
	if err := os.WriteFile(badYAML, []byte("pg-url: postgres://db/app\nkafka-brokers: [k:9092\ntopic: t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		code int
		json bool
		want string
	}{
		{"unknown flag, console", []string{"run", "--log-format", "console", "--no-such-flag"}, 2, false, "--no-such-flag"},
		{"unknown flag, JSON", []string{"run", "--log-format", "json", "--no-such-flag"}, 2, true, "--no-such-flag"},
		{"missing flag, auto off a terminal is JSON", []string{"run", "--kafka-brokers", "k:9092"}, 2, true, "--pg-url"},
		{"bad YAML", []string{"run", "--config", badYAML, "--log-format", "console"}, 2, false, "relay.yaml, line 2: not valid YAML"},
		{"bad value", []string{"run", "--pg-url", "postgres://db/app", "--kafka-brokers", "k:9092", "--batch-max-events", "0", "--log-format", "console"}, 2, false, "--batch-max-events"},
		{"unknown command", []string{"frobnicate"}, 2, false, "frobnicate"},
		{"status without --pg-url", []string{"status"}, 2, false, "--pg-url"},
		{"help", []string{"run", "--help"}, 0, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCommand(ctx, t, 20*time.Second, tt.args...)
			if code != tt.code {
				t.Fatalf("exit code %d, want %d\n%s%s", code, tt.code, stdout, stderr)
			}
			if tt.code == 0 {
				return
			}
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if len(lines) != 1 {
				t.Errorf("want one line on stderr, got %d:\n%s", len(lines), stderr)
			}
			if !tt.json {
				checkPlainError(t, lines[0], tt.want)
				return
			}
			rec := jsonRecord(t, lines[0])
			if msg, _ := rec["error"].(string); !strings.Contains(msg, tt.want) || rec["exit_code"] != 2.0 {
				t.Errorf("want a JSON error with %q and exit_code 2: %s", tt.want, lines[0])
			}
		})
	}
}
