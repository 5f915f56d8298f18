package main

// End-to-end tests of the built cdc-relay binary: TestMain builds it once and
// starts one Postgres cluster for the package; each test creates its own
// database, slot, topic and (usually) kfake broker, runs the binary as a child
// process and checks what reached Kafka with sandbox.ReadAll/WaitForRecords
// (franz-go's kgo, not the relay's kafka-go).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/verify"
)

// buildVersion is stamped into the test binary with -ldflags -X main.version.
const buildVersion = "e2e-test"

var (
	// relayBin is the cdc-relay binary TestMain built.
	relayBin string
	// sharedPG is the package's Postgres cluster (wal_level=logical).
	sharedPG *sandbox.Postgres
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "cdc-relay-e2e-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: create temp dir: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)

	relayBin = filepath.Join(dir, "cdc-relay")
	// go test puts its own toolchain's bin directory first on PATH.
	gobin, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: find the go command: %v\n", err)
		return 1
	}
	build := exec.Command(gobin, "build", "-ldflags", "-X main.version="+buildVersion, "-o", relayBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go build cdc-relay: %v\n", err)
		return 1
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	sharedPG, err = sandbox.StartPostgres(ctx, sandbox.PGOptions{})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: start postgres: %v\n", err)
		return 1
	}
	defer sharedPG.Close()
	return m.Run()
}

// fixture is one test's share of the world: a database with the outbox and
// checkpoint migrations applied, a slot name, a topic and a broker.
type fixture struct {
	pg      *sandbox.Postgres
	db      string
	url     string
	slot    string
	topic   string
	kafka   *sandbox.Kafka
	brokers []string
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// newFixture creates database and slot names from name, applies the
// migrations on pg, and starts a kfake broker when withKafka is set.
func newFixture(t *testing.T, pg *sandbox.Postgres, name string, withKafka bool) *fixture {
	t.Helper()
	name = nonIdent.ReplaceAllString(strings.ToLower(name), "_")
	f := &fixture{pg: pg, db: "e2e_" + name, slot: "slot_" + name, topic: "outbox.e2e." + name}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url, err := pg.CreateDatabase(ctx, f.db)
	if err != nil {
		t.Fatalf("create database: %v", err)
	}
	f.url = url
	applyMigrations(t, url)
	t.Cleanup(func() {
		// Free the WAL the slot retains on the shared cluster; best effort (the
		// relay may still hold it if the test failed hard).
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = pg.Exec(ctx, f.db, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", f.slot)
	})
	if withKafka {
		f.kafka = testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4})
		f.brokers = f.kafka.Brokers()
	}
	return f
}

// applyMigrations runs migrations/001_outbox.sql and 002_checkpoints.sql.
func applyMigrations(t *testing.T, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	for _, f := range []string{"001_outbox.sql", "002_checkpoints.sql"} {
		sql, err := os.ReadFile(filepath.Join("..", "..", "migrations", f))
		if err != nil {
			t.Fatalf("read migration: %v", err)
		}
		if _, err := conn.Exec(ctx, string(sql)); err != nil {
			t.Fatalf("apply migration %s: %v", f, err)
		}
	}
}

// relayArgs are the standard run arguments for f, without --metrics-addr
// (relayProc picks a free port per start); extra flags are appended.
func (f *fixture) relayArgs(extra ...string) []string {
	args := []string{"run",
		"--pg-url", f.url,
		"--kafka-brokers", strings.Join(f.brokers, ","),
		"--topic", f.topic,
		"--log-format", "json",
		"--status-interval", "200ms",
		"--retry-cap", "1s",
		"--slot", f.slot,
	}
	return append(args, extra...)
}

// connect opens a connection to f's database, closed when t ends.
func (f *fixture) connect(ctx context.Context, t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatalf("connect to %s: %v", f.db, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// read returns everything in f's topic now.
func (f *fixture) read(ctx context.Context, t *testing.T) []sandbox.Record {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	recs, err := sandbox.ReadAll(rctx, f.brokers, f.topic)
	if err != nil {
		t.Fatalf("read topic %s: %v", f.topic, err)
	}
	return recs
}

// waitRecords waits until f's topic holds at least n records.
func (f *fixture) waitRecords(ctx context.Context, t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := sandbox.WaitForRecords(wctx, f.brokers, n, f.topic); err != nil {
		t.Fatalf("wait for %d records: %v", n, err)
	}
}

// waitDelivered reads the topic until every committed event is there (or the
// timeout passes) and returns the final check of it.
func (f *fixture) waitDelivered(ctx context.Context, t *testing.T, committed func() []verify.Event, timeout time.Duration) (verify.Result, []sandbox.Record) {
	t.Helper()
	res, recs, err := verify.Await(ctx, f.brokers, f.topic, committed, timeout, 250*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	return res, recs
}

// requireComplete fails t unless every committed event arrived, exactly as
// committed, in per-key order. Duplicates are allowed (at-least-once).
func requireComplete(t *testing.T, res verify.Result) {
	t.Helper()
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
}

// relayProc runs the cdc-relay binary, possibly several times in a row with
// the same arguments, collecting stderr of every run in one log.
type relayProc struct {
	t    *testing.T
	args []string
	env  []string
	logs *sandbox.Buffer
	runs int
	// metricsAddr, when set, is the metrics address the arguments (or a
	// config file they name) already set: start adds no --metrics-addr.
	metricsAddr string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	state   *os.ProcessState
	metrics string
}

// newRelay returns a relay runner; the cleanup kills a running process and
// prints the logs of all runs when the test failed.
func newRelay(t *testing.T, args []string) *relayProc {
	r := &relayProc{t: t, args: args, env: cleanEnv(), logs: &sandbox.Buffer{}}
	t.Cleanup(func() {
		r.kill()
		if t.Failed() || os.Getenv("CDC_RELAY_E2E_LOGS") != "" {
			t.Logf("cdc-relay stderr (%d runs):\n%s", r.runs, r.logs.String())
		}
	})
	return r
}

// cleanEnv is the test's environment without CDC_RELAY_* variables, so a
// developer's settings cannot leak into the relay's configuration.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CDC_RELAY_") {
			env = append(env, kv)
		}
	}
	return env
}

// start starts the binary with a fresh metrics port.
func (r *relayProc) start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		select {
		case <-r.done:
		default:
			r.t.Fatalf("relay started twice")
		}
	}
	args := append([]string(nil), r.args...)
	if r.metricsAddr != "" {
		r.metrics = r.metricsAddr
	} else {
		port, err := sandbox.FreePort()
		if err != nil {
			r.t.Fatalf("free port: %v", err)
		}
		r.metrics = "127.0.0.1:" + strconv.Itoa(port)
		args = append(args, "--metrics-addr", r.metrics)
	}
	r.runs++
	fmt.Fprintf(r.logs, "----- run %d: %s -----\n", r.runs, time.Now().Format(time.TimeOnly+".000"))
	cmd := exec.Command(relayBin, args...)
	cmd.Env = r.env
	cmd.Stdout = r.logs
	cmd.Stderr = r.logs
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("start relay: %v", err)
	}
	done := make(chan struct{})
	r.cmd, r.done, r.state = cmd, done, nil
	go func() {
		_ = cmd.Wait()
		r.mu.Lock()
		r.state = cmd.ProcessState
		r.mu.Unlock()
		close(done)
	}()
}

func (r *relayProc) current() (*exec.Cmd, chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd, r.done
}

// pid returns the running process's id.
func (r *relayProc) pid() int {
	cmd, _ := r.current()
	return cmd.Process.Pid
}

// exited reports whether the last started process has exited.
func (r *relayProc) exited() bool {
	_, done := r.current()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// signal sends sig to the running process.
func (r *relayProc) signal(sig syscall.Signal) {
	r.t.Helper()
	cmd, _ := r.current()
	if err := cmd.Process.Signal(sig); err != nil {
		r.t.Fatalf("signal %v: %v", sig, err)
	}
}

// wait waits up to timeout for the process to exit and returns its exit code
// (-1 for a signal) and whether it exited in time.
func (r *relayProc) wait(timeout time.Duration) (int, bool) {
	_, done := r.current()
	select {
	case <-done:
	default:
		select {
		case <-done:
		case <-time.After(timeout):
			return 0, false
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state.ExitCode(), true
}

// kill SIGKILLs a running process and waits for it.
func (r *relayProc) kill() {
	cmd, done := r.current()
	if cmd == nil || r.exited() {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
	fmt.Fprintf(r.logs, "----- run %d: SIGKILL at %s -----\n", r.runs, time.Now().Format(time.TimeOnly+".000"))
}

// stop sends SIGTERM and requires exit code 0 within timeout.
func (r *relayProc) stop(timeout time.Duration) {
	r.t.Helper()
	if r.exited() {
		r.t.Fatalf("relay exited before it was stopped")
	}
	r.signal(syscall.SIGTERM)
	code, ok := r.wait(timeout)
	if !ok {
		r.t.Fatalf("relay did not exit within %v of SIGTERM", timeout)
	}
	if code != 0 {
		r.t.Fatalf("relay exited with code %d after SIGTERM, want 0", code)
	}
}

var httpClient = &http.Client{Timeout: time.Second}

// readyz returns the status code of GET /readyz, or 0 when it does not answer.
func (r *relayProc) readyz() int {
	r.mu.Lock()
	addr := r.metrics
	r.mu.Unlock()
	resp, err := httpClient.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitReady waits until /readyz answers 200; it fails the test when the
// process exits first or timeout passes.
func (r *relayProc) waitReady(timeout time.Duration) {
	r.t.Helper()
	testenv.Eventually(r.t, timeout, func() error {
		code := r.readyz()
		if code == http.StatusOK {
			return nil
		}
		if r.exited() {
			code, _ := r.wait(0)
			r.t.Fatalf("relay exited with code %d before it was ready", code)
		}
		return fmt.Errorf("relay not ready (last /readyz: %d)", code)
	})
}

// logLines returns the JSON log records of all runs; other lines (run
// markers, plain-text errors) are skipped.
func (r *relayProc) logLines() []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(r.logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// hasLog reports whether a JSON log record's message contains substr.
func (r *relayProc) hasLog(substr string) bool {
	for _, m := range r.logLines() {
		if msg, _ := m["message"].(string); strings.Contains(msg, substr) {
			return true
		}
	}
	return false
}

// peakRSS returns the process's peak resident set size (VmHWM) in bytes.
func peakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("parse %q", line)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmHWM in /proc/<pid>/status")
}
