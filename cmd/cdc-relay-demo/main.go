// Command cdc-relay-demo runs the relay for real on embedded defaults: it starts a
// throwaway Postgres (wal_level=logical; server binaries found as
// sandbox.FindPGBin says, e.g. $CDC_RELAY_PG_BINDIR) and an in-process
// Kafka-protocol broker, creates the outbox table, runs cdc-relay against them,
// inserts sample outbox rows in transactions (with some rolled back), and prints
// every Kafka message as a separate consumer receives it.
//
//	go run ./cmd/cdc-relay-demo             # 20 events, then a clean stop
//	go run ./cmd/cdc-relay-demo -events 0   # no sample events: prints a psql command
//	                                        # to insert your own, runs until Ctrl-C
//	go run ./cmd/cdc-relay-demo -events -1  # sample events until Ctrl-C
//
// It writes the demo database's URL to bin/demo-pg-url (-url-file) while it
// runs, for README's walkthrough: psql "$(cat bin/demo-pg-url)". Ctrl-C
// (SIGINT) or SIGTERM stops it cleanly, with exit status 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/cli"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		err = nil // Ctrl-C before the relay streamed: the user's way to stop
	}
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cdc-relay-demo: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cdc-relay-demo", flag.ContinueOnError)
	events := fs.Int("events", 20, "sample outbox events to insert, then stop (0: none, wait for yours until Ctrl-C; -1: keep inserting until Ctrl-C)")
	every := fs.Duration("every", 300*time.Millisecond, "pause between transactions")
	verbose := fs.Bool("relay-logs", false, "show the relay's own log lines")
	urlFile := fs.String("url-file", filepath.Join("bin", "demo-pg-url"), "write the demo database's URL to this file while the demo runs (empty: none)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}

	say("starting a throwaway PostgreSQL (wal_level=logical)...")
	pg, err := sandbox.StartPostgres(ctx, sandbox.PGOptions{})
	if err != nil {
		return err
	}
	defer pg.Close()
	switch b := pg.Bin(); {
	case pg.External():
		say("postgres: %s", pg.Describe())
	case b.Source == sandbox.EnvPGBinDir:
		say("postgres: PostgreSQL %s from %s (%s)", b.Version, b.Dir, b.Source)
	default:
		say("postgres: PostgreSQL %s from %s (found via %s; %s=DIR picks another)", b.Version, b.Dir, b.Source, sandbox.EnvPGBinDir)
	}
	url, err := pg.CreateDatabase(ctx, "shop")
	if err != nil {
		return err
	}
	if err := applyMigrations(ctx, url); err != nil {
		return err
	}
	say("starting an in-process Kafka-protocol broker (kfake)...")
	kf, err := sandbox.StartKafka(sandbox.KafkaOptions{Partitions: 3})
	if err != nil {
		return err
	}
	defer kf.Close()
	brokers := strings.Join(kf.Brokers(), ",")
	say("postgres: %s", url)
	say("kafka:    %s", brokers)
	if *urlFile != "" {
		if err := writeURLFile(*urlFile, url); err != nil {
			return err
		}
		defer os.Remove(*urlFile)
		say("the postgres URL is in %s while the demo runs: psql \"$(cat %s)\"", *urlFile, *urlFile)
	}

	// The relay, exactly as `cdc-relay run` runs it, its endpoints on a port
	// picked here so the demo can say where they are.
	metricsAddr, err := freeAddr()
	if err != nil {
		return err
	}
	relayCtx, stopRelay := context.WithCancel(context.Background())
	defer stopRelay()
	relayDone := make(chan error, 1)
	logs := discard{}
	relays := make(chan *relay.Relay, 1)
	go func() {
		env := cli.Env{Version: "demo", Stdout: os.Stdout, Stderr: logs, OnRelay: func(r *relay.Relay) { relays <- r }}
		if *verbose {
			env.Stderr = os.Stderr
		}
		relayDone <- cli.Run(relayCtx, []string{"run",
			"--pg-url", url, "--kafka-brokers", brokers,
			"--topic", "outbox.{aggregate_type}", "--metrics-addr", metricsAddr,
			"--log-format", "console",
		}, env)
	}()

	// A consumer with a different Kafka client prints what arrives.
	var mu sync.Mutex
	seen := 0
	arrived := make(chan struct{}, 1024)
	tailCtx, stopTail := context.WithCancel(context.Background())
	tailDone := make(chan struct{})
	go func() {
		defer close(tailDone)
		_ = sandbox.Tail(tailCtx, kf.Brokers(), `^outbox\..*`, func(r sandbox.Record) {
			mu.Lock()
			seen++
			mu.Unlock()
			fmt.Printf("  kafka  %-15s p%d@%-3d key=%-10s type=%-14s id=%s payload=%s\n",
				r.Topic, r.Partition, r.Offset, r.Key, r.Headers["event_type"], short(r.Headers["id"]), r.Value)
			arrived <- struct{}{}
		})
	}()
	defer func() {
		stopTail()
		<-tailDone
	}()

	// A new slot starts at its creation point: wait until the relay streams.
	if err := waitReady(ctx, relays, relayDone); err != nil {
		return err
	}
	say("relay is streaming (slot cdc_relay, publication cdc_relay_outbox)")
	for _, line := range lookLines(pg, url, metricsAddr) {
		say("%s", line)
	}

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect to demo database: %w", err)
	}
	defer conn.Close(context.Background())
	committed := 0

	if *events == 0 {
		say("insert a row yourself (in another terminal); it appears below as a kafka line. Ctrl-C stops the demo.")
		say("  %s", psqlInsert(ctx, url))
		<-ctx.Done()
		goto done
	}
	say("inserting outbox rows; each committed INSERT should appear in Kafka (rolled-back ones never do)")
	for i := 0; *events < 0 || committed < *events; i++ {
		select {
		case <-ctx.Done():
			goto done
		case err := <-relayDone:
			return fmt.Errorf("relay stopped: %w", err)
		case <-time.After(*every):
		}
		n, err := insertTxn(ctx, conn, i)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		committed += n
	}
done:
	// Wait for the last events to arrive, then stop the relay as SIGTERM would.
	deadline := time.After(15 * time.Second)
	for {
		mu.Lock()
		s := seen
		mu.Unlock()
		if s >= committed {
			break
		}
		select {
		case <-arrived:
		case <-deadline:
			return fmt.Errorf("only %d of %d committed events arrived in Kafka", s, committed)
		}
	}
	if *events == 0 {
		mu.Lock()
		noun := "events"
		if seen == 1 {
			noun = "event"
		}
		say("%d %s arrived in Kafka; stopping the relay cleanly", seen, noun)
		mu.Unlock()
	} else {
		say("all %d committed events arrived; stopping the relay cleanly", committed)
	}
	stopRelay()
	if err := <-relayDone; err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	if *events > 0 {
		say("to insert rows yourself: make demo DEMOFLAGS='-events 0' (or go run ./cmd/cdc-relay-demo -events 0)")
	}
	say("done. Next: `make test` runs the whole suite; README.md shows production setup, docs/ the rest.")
	return nil
}

// freeAddr returns a loopback address with a port free a moment ago, for
// the relay's --metrics-addr.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("pick a port for the metrics endpoint: %w", err)
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// lookLines are the lines that say how to look at the running demo: its
// metrics and readiness URLs, a cdc-relay status line to paste (bin/cdc-relay,
// which make demo builds, else go run), and how to stop its Postgres to see
// both change (as root the server runs as the postgres OS user).
func lookLines(pg *sandbox.Postgres, url, metricsAddr string) []string {
	status := "go run ./cmd/cdc-relay"
	if _, err := os.Stat(filepath.Join("bin", "cdc-relay")); err == nil {
		status = "bin/cdc-relay"
	}
	lines := []string{
		"look at it (in another terminal):",
		"  metrics  curl -s http://" + metricsAddr + "/metrics | grep ^cdc_relay_state",
		"  ready    curl -s http://" + metricsAddr + "/readyz   (503 naming what is down: Postgres, Kafka, or not streaming yet)",
		"  status   " + status + ` status --pg-url "` + url + `"`,
		`  psql     psql "` + url + `"`,
	}
	if pg.External() {
		return lines
	}
	stop := filepath.Join(pg.Bin().Dir, "pg_ctl") + " -D " + pg.DataDir() + " stop -m fast"
	if os.Geteuid() == 0 {
		stop = "runuser -u postgres -- " + stop // as root, the server runs as postgres
	}
	return append(lines, "  stop Postgres to see them change: "+stop)
}

// psqlInsert returns a shell command that inserts one outbox row into the
// demo database at url: psql from PATH (else the one beside the server
// binaries), stopping with a non-zero exit on any error. The payload is built
// with jsonb_build_object so the command needs no nested quotes in any shell.
func psqlInsert(ctx context.Context, url string) string {
	psql := "psql"
	if _, err := exec.LookPath("psql"); err != nil {
		if p, err := sandbox.PGClient(ctx, "psql"); err == nil {
			psql = p
		}
	}
	return psql + ` "` + url + `" -v ON_ERROR_STOP=1 -c "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'order-42', 'OrderPlaced', jsonb_build_object('total', 42))"`
}

func waitReady(ctx context.Context, relays <-chan *relay.Relay, done <-chan error) error {
	var r *relay.Relay
	timeout := time.After(60 * time.Second)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-done:
			return fmt.Errorf("relay stopped: %w", err)
		case <-timeout:
			return fmt.Errorf("relay did not become ready within 60s (rerun with -relay-logs)")
		case r = <-relays:
		case <-time.After(50 * time.Millisecond):
		}
		if r != nil && r.Ready() {
			return nil
		}
	}
}

var (
	aggregates = []string{"order", "customer", "payment"}
	types      = map[string][]string{
		"order":    {"OrderPlaced", "OrderPaid", "OrderShipped"},
		"customer": {"CustomerRegistered", "AddressChanged"},
		"payment":  {"PaymentAuthorized", "PaymentCaptured"},
	}
)

// insertTxn writes one business transaction with an outbox event; every fifth
// one is rolled back to show that it never reaches Kafka.
func insertTxn(ctx context.Context, conn *pgx.Conn, i int) (int, error) {
	agg := aggregates[i%len(aggregates)]
	id := fmt.Sprintf("%s-%d", agg, 1+i%4)
	typ := types[agg][(i/len(aggregates))%len(types[agg])]
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.Background())
	payload := fmt.Sprintf(`{"seq": %d, "note": "demo event %d"}`, i, i)
	if _, err := tx.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4)`,
		agg, id, typ, payload); err != nil {
		return 0, fmt.Errorf("insert outbox row: %w", err)
	}
	if i%5 == 4 {
		say("  pg     rolled back %s %s (must not appear)", id, typ)
		return 0, tx.Rollback(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	say("  pg     committed   %s %s", id, typ)
	return 1, nil
}

// applyMigrations runs the outbox and checkpoint migrations the way an operator
// would (the publication and slot are created by the relay).
func applyMigrations(ctx context.Context, url string) error {
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "migrations")
	if _, err := os.Stat(dir); err != nil {
		dir = "migrations"
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect to demo database: %w", err)
	}
	defer conn.Close(context.Background())
	for _, f := range []string{"001_outbox.sql", "002_checkpoints.sql"} {
		sql, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return fmt.Errorf("read migration: %w", err)
		}
		if _, err := conn.Exec(ctx, string(sql)); err != nil {
			return fmt.Errorf("apply migration %s: %w", f, err)
		}
	}
	return nil
}

// writeURLFile writes url to path, creating its directory, so that another
// terminal reads the demo's URL (its port changes every run).
func writeURLFile(path, url string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write the demo's URL to %s (-url-file): %w", path, err)
	}
	if err := os.WriteFile(path, []byte(url+"\n"), 0o644); err != nil {
		return fmt.Errorf("write the demo's URL to %s (-url-file): %w", path, err)
	}
	return nil
}

func say(format string, args ...any) {
	fmt.Printf(format+"\n", args...)
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8] + "…"
	}
	return id
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
