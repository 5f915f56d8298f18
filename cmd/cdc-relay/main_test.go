package main

// End-to-end tests of the built cdc-relay binary: TestMain builds it once and
// starts one Postgres cluster for the package; each test creates its own
// database, slot, topic and (usually) kfake broker, runs the binary as a child
// process and checks what reached Kafka with sandbox.ReadAll/WaitForRecords
// (franz-go's kgo, not the relay's kafka-go).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/relayproc/relaytest"
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

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	relayBin, err = relayproc.Build(ctx, dir, relayproc.BuildOptions{Version: buildVersion})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}

	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Minute)
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

// relayProc is the built binary run by the shared harness
// (internal/relayproc), bound to a test.
type relayProc = relaytest.Proc

// newRelay returns a runner of the built binary with args and a fresh
// --metrics-addr per start; the test's cleanup kills a running process and
// prints the logs of all runs when the test failed.
func newRelay(t *testing.T, args []string) *relayProc {
	return relaytest.New(t, relayproc.Options{Path: relayBin, Args: args, AddMetricsAddr: true})
}

// cleanEnv is the test's environment without CDC_RELAY_* variables.
func cleanEnv() []string { return relayproc.CleanEnv() }
