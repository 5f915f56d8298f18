package relayproc

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// shell returns a Process running script with /bin/sh.
func shell(script string) *Process {
	return New(Options{Name: "sh", Path: "/bin/sh", Args: []string{"-c", script}})
}

// loop prints "ready", then waits; SIGTERM makes it print "bye" and exit
// with code.
func loop(code int) string {
	return fmt.Sprintf(`trap 'echo bye; exit %d' TERM; echo ready; while :; do sleep 0.05; done`, code)
}

func TestStopKillRestart(t *testing.T) {
	ctx := context.Background()
	p := shell(loop(0))
	t.Cleanup(func() { p.Kill() })
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err == nil {
		t.Fatal("a second Start while running succeeded")
	}
	if _, err := p.WaitLog(ctx, "ready", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if code := p.ExitCode(); code != 0 || p.Running() {
		t.Fatalf("after Stop: exit code %d, running %v; want 0, false", code, p.Running())
	}
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); strings.Count(p.Output(), "ready") < 2; {
		if time.Now().After(deadline) || !p.Running() {
			t.Fatalf("the second run printed no ready line (running %v):\n%s", p.Running(), p.Logs())
		}
		time.Sleep(10 * time.Millisecond) // polling the output, not a wait-then-assert
	}
	if !p.Kill() {
		t.Fatal("Kill found no running process")
	}
	if code, ok := p.Wait(0); !ok || code != -1 {
		t.Fatalf("after SIGKILL: Wait = %d, %v; want -1, true", code, ok)
	}
	if p.Kill() {
		t.Fatal("Kill of an exited process reported a kill")
	}
	if p.Runs() != 2 {
		t.Fatalf("Runs = %d, want 2", p.Runs())
	}
	if out := p.Output(); out != "ready\nbye\nready\n" {
		t.Fatalf("Output = %q, want both runs' lines without markers", out)
	}
	if logs := p.Logs(); !strings.Contains(logs, "----- sh run 2: ") || !strings.Contains(logs, ": SIGKILL at ") {
		t.Fatalf("Logs lack the run and SIGKILL markers:\n%s", logs)
	}
}

func TestStopReportsExitCode(t *testing.T) {
	p := shell(loop(3))
	t.Cleanup(func() { p.Kill() })
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitLog(context.Background(), "ready", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(10 * time.Second); err == nil || !strings.Contains(err.Error(), "exit code 3") {
		t.Fatalf("Stop = %v, want an error with exit code 3", err)
	}
	if err := p.Stop(time.Second); err == nil {
		t.Fatal("Stop of an exited process succeeded")
	}
}

func TestWaitFailsWhenTheProcessExits(t *testing.T) {
	p := shell(`echo '{"message":"starting"}'; exit 2`)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	_, err := p.WaitLog(context.Background(), "ready", 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "exited with code 2") {
		t.Fatalf("WaitLog = %v, want an error saying it exited with code 2", err)
	}
	// A line written before the exit is still found, by its JSON message.
	if line, err := p.WaitLog(context.Background(), "starting", time.Second); err != nil || !strings.HasPrefix(line, "{") {
		t.Fatalf("WaitLog(starting) = %q, %v", line, err)
	}
	if !p.HasLog("starting") || len(p.LogRecords()) != 1 {
		t.Fatalf("HasLog/LogRecords do not see the one JSON line: %v", p.LogRecords())
	}
}

func TestWaitReady(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/metrics":
			fmt.Fprintln(w, "# HELP x y\nup 1\ncdc_relay_events_total{topic=\"a\"} 42")
		case r.URL.Path == "/readyz" && calls.Add(1) >= 3:
			w.WriteHeader(http.StatusOK)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	p := New(Options{Name: "sh", Path: "/bin/sh", Args: []string{"-c", loop(0)}, MetricsAddr: strings.TrimPrefix(srv.URL, "http://")})
	t.Cleanup(func() { p.Kill() })
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitReady(context.Background(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("ready after %d /readyz calls, want 3", n)
	}
	m, err := p.Scrape(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if m["up"] != 1 || m[`cdc_relay_events_total{topic="a"}`] != 42 || len(m) != 2 {
		t.Fatalf("Scrape = %v", m)
	}
}

func TestAddMetricsAddr(t *testing.T) {
	p := New(Options{Path: "/bin/sh", Args: []string{"-c", `echo "$@"`, "sh"}, AddMetricsAddr: true})
	for run := 1; run <= 2; run++ {
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		if code, ok := p.Wait(10 * time.Second); !ok || code != 0 {
			t.Fatalf("run %d: Wait = %d, %v", run, code, ok)
		}
		want := "--metrics-addr " + p.MetricsAddr()
		if !strings.HasSuffix(strings.TrimSpace(p.Output()), want) || !strings.HasPrefix(p.MetricsAddr(), "127.0.0.1:") {
			t.Fatalf("run %d: output %q, want it to end with %q", run, p.Output(), want)
		}
	}
}

func TestEnvDropsRelaySettings(t *testing.T) {
	t.Setenv("CDC_RELAY_TOPIC", "from-the-developer")
	t.Setenv("RELAYPROC_TEST", "kept")
	p := shell(`echo "[$CDC_RELAY_TOPIC][$RELAYPROC_TEST]"`)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	p.Wait(10 * time.Second)
	if out := p.Output(); out != "[][kept]\n" {
		t.Fatalf("output %q, want CDC_RELAY_* dropped and the rest kept", out)
	}
}

func TestLogKeepsTheNewestLines(t *testing.T) {
	l := NewLog(100)
	for i := 0; i < 30; i++ {
		fmt.Fprintf(l, "line %03d\n", i) // 9 bytes
	}
	s := l.String()
	held := strings.SplitN(s, "\n", 2)
	if !strings.HasPrefix(held[0], "----- ") || !strings.Contains(held[0], "earlier bytes dropped") {
		t.Fatalf("first line %q, want the dropped marker", held[0])
	}
	if len(held[1]) > 100 || !strings.HasPrefix(held[1], "line ") || !strings.HasSuffix(held[1], "line 029\n") {
		t.Fatalf("held %q, want whole lines up to line 029 within 100 bytes", held[1])
	}
	if got := l.Dropped() + int64(len(held[1])); got != 270 {
		t.Fatalf("dropped + held = %d bytes, want the 270 written", got)
	}
}
