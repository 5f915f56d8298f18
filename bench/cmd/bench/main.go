// Command bench measures cdc-relay side by side with its speed limit and with
// the poller it replaces, in one run on one machine, and writes the results to
// bench/results (latest.json, latest.png and latest-<dimension>.png; an earlier run
// is in git history under the same names).
//
//	make bench                                   # the full matrix
//	make bench BENCHFLAGS=-quick                 # smoke check, under two minutes
//	make bench BENCHFLAGS=-list-cells            # the cells; -cell NAME runs one
//	make bench BENCHFLAGS='-chart-only bench/results/latest.json'
//
// bench is a module of its own (bench/go.mod, the relay replaced by this
// repository's); make builds it into bin/bench and runs it from the repository root.
//
// It re-executes itself for the processes it measures: "bench reader" (the limit:
// the relay's read path with a producer that discards) and "bench poller".
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cdc-relay/cdc-relay/bench/internal/chart"
	"github.com/cdc-relay/cdc-relay/bench/internal/latency"
	"github.com/cdc-relay/cdc-relay/bench/internal/poller"
	"github.com/cdc-relay/cdc-relay/bench/internal/reader"
	"github.com/cdc-relay/cdc-relay/bench/internal/results"
	"github.com/cdc-relay/cdc-relay/bench/internal/runner"
	"github.com/cdc-relay/cdc-relay/internal/cli"
)

func main() {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		if s, ok := <-sigs; ok {
			cancel(fmt.Errorf("%w by %v", context.Canceled, s))
		}
	}()
	err := run(ctx, os.Args[1:])
	interrupted := context.Cause(ctx)
	signal.Stop(sigs)
	close(sigs)
	if err != nil && interrupted != nil && errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "bench: %v; every process and temporary directory it started is gone\n", interrupted)
		os.Exit(1)
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "reader":
			return runReader(ctx, args[1:])
		case "poller":
			return runPoller(ctx, args[1:])
		case "messages":
			return runMessages(ctx, args[1:])
		}
	}
	return runBench(ctx, args)
}

// runBench is the benchmark itself.
func runBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	events := fs.Int("events", 500000, "backlog events of a drain cell (cells of larger payloads drain fewer: the same bytes as 300 B events, but at least 256 MiB and 200 events)")
	aggregates := fs.Int("aggregates", 10000, "distinct aggregate ids (Kafka keys)")
	txnSizes := fs.String("txn-sizes", "1,10,100,10000", "drain cells: events per transaction (the first is the headline's; each at most -aggregates)")
	partitions := fs.String("partitions", "8,64,256", "drain cells: partitions of every topic (the first is the headline's)")
	topics := fs.String("topics", "1,50", "drain cells: topics, one per aggregate type under the relay's {aggregate_type} template (the first is the headline's)")
	payloads := fs.String("payloads", "300,4096,65536,1048576", "drain cells: approximate JSON payload bytes (the first is the headline's)")
	rates := fs.String("rates", "1000,10000,30000", "steady-load cells: offered loads, events/s")
	latTxn := fs.String("latency-txn-sizes", "1,10", "steady-load cells: events per transaction at each rate (a size needing more than 10,000 commits/s is left out)")
	duration := fs.Duration("duration", 20*time.Second, "length of each steady load")
	listCells := fs.Bool("list-cells", false, "print the cells of this configuration and exit")
	quick := fs.Bool("quick", false, "smoke check (under two minutes): 50,000 events, the headline drain cell, the 10k/s×10 steady load for 5s, the 8-partition start-up cell, one round per delivery mode, 1s quiet waits; flags given explicitly win")
	pollerBatch := fs.Int("poller-batch", 1000, "rows per poller round")
	pollerIdle := fs.Duration("poller-idle", 100*time.Millisecond, "poller sleep after a round that found nothing")
	rounds := fs.Int("delivery-rounds", 2, "relay drains and latency runs per --delivery mode (effectively-once and at-least-once, alternating)")
	tableRows := fs.String("table-rows", "100000,1000000", "table cells (issue 42): rows filled into an outbox table, published by cdc-relay replay (replay/rows=N) and by the relay when the table joins its slot's publication while an application inserts into it (join/rows=N); \"\" skips them")
	tableTimeout := fs.Duration("table-timeout", 0, "table cells: give up a replay or join after this long and say how many rows Kafka held by then (0: two minutes plus 2 ms a row)")
	reconcile := fs.String("reconcile-partitions", "8,256", "start-up cells: partition counts of the topics the relay drains the headline backlog into, is killed -9 mid-drain and restarted; \"\" skips them")
	relayBin := fs.String("relay-bin", "", "use this cdc-relay binary instead of building ./cmd/cdc-relay")
	pgSocket := fs.Bool("pg-socket", false, "the relay and the limit reader connect through Postgres' Unix socket instead of loopback TCP (a relay deployed beside Postgres); the poller and the load generators keep TCP")
	relayLog := fs.String("relay-log", "", "write each relay process's log, at --log-level info, to DIR/<slot>.log (what a run did: a catch-up's batches, its switch to streaming)")
	quietWait := fs.Duration("quiet-wait", 20*time.Second, "before each measurement, wait up to this long for processes outside the benchmark to use <10% of the CPUs (-quick: 1s; 0: never wait)")
	brokerLatency := fs.Duration("broker-latency", 0, "delay every answer of the in-process broker by this much, as a network to a remote broker would (one way), e.g. 2ms to see what requests in flight (--max-in-flight-requests) buy")
	relayFlags := fs.String("relay-flags", "", "flags added to every relay and limit reader run, space-separated (e.g. \"--read-coalesce 0\" to compare a setting)")
	profileDir := fs.String("profile", "", "save a CPU and a heap profile of the relay's first effectively-once drain of each drain cell in this directory (<cell>-cpu.pprof, <cell>-heap.pprof; read with go tool pprof), and print the CPU split by part: read, decode, encode+produce, checkpoint+ack, gc")
	baselineFile := fs.String("baseline", "bench/baseline.json", "compare each drain cell's relay CPU per event, and each table cell's rows/s, with this baseline (relative: to the repository's root) and print the verdicts; a RISE or DROP is a missed target, never an error")
	writeBaselineFile := fs.String("write-baseline", "", "record this run's drain and table cells into this baseline file (relative: to the repository's root), replacing those cells; drain cells need -delivery-rounds 2 or more, table cells every row in Kafka once")
	chartOnly := fs.String("chart-only", "", "only print the tables of this results JSON and redraw its charts (next to it, as .png)")
	var cellList []string
	fs.Func("cell", "run only this cell (a name -list-cells prints, e.g. drain/txn=1 or latency/rate=10000,txn=10); give it more than once, or several names separated by commas or spaces, for more", func(v string) error {
		cellList = append(cellList, splitCells(v)...)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *chartOnly != "" {
		r, err := results.Load(*chartOnly)
		if err != nil {
			return err
		}
		r.Evaluate() // this version's targets
		base := strings.TrimSuffix(*chartOnly, filepath.Ext(*chartOnly))
		written, err := writeCharts(r, base)
		if err != nil {
			return err
		}
		r.Print(os.Stdout)
		fmt.Println("\nwrote", strings.Join(written, ", "))
		return nil
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *quick {
		defaults := map[string]func(){
			"events":               func() { *events = 50000 },
			"txn-sizes":            func() { *txnSizes = "1" },
			"partitions":           func() { *partitions = "8" },
			"topics":               func() { *topics = "1" },
			"payloads":             func() { *payloads = "300" },
			"rates":                func() { *rates = "10000" },
			"latency-txn-sizes":    func() { *latTxn = "10" },
			"duration":             func() { *duration = 5 * time.Second },
			"reconcile-partitions": func() { *reconcile = "8" },
			"table-rows":           func() { *tableRows = "" },
			"delivery-rounds":      func() { *rounds = 1 },
			"quiet-wait":           func() { *quietWait = time.Second },
		}
		for name, apply := range defaults {
			if !set[name] {
				apply()
			}
		}
	}
	if *relayLog != "" {
		if err := os.MkdirAll(*relayLog, 0o755); err != nil {
			return fmt.Errorf("-relay-log: %w", err)
		}
	}
	if *profileDir != "" {
		if err := os.MkdirAll(*profileDir, 0o755); err != nil {
			return fmt.Errorf("-profile: %w", err)
		}
	}
	cfg := runner.Config{Events: *events, Aggregates: *aggregates, Duration: *duration, Quick: *quick,
		DeliveryRounds: *rounds, PollerBatch: *pollerBatch, PollerIdle: *pollerIdle, QuietWait: *quietWait,
		RelayBin: *relayBin, RelayLogDir: *relayLog, PGSocket: *pgSocket, TableTimeout: *tableTimeout, ProfileDir: *profileDir, RelayFlags: strings.Fields(*relayFlags), BrokerLatency: *brokerLatency, Out: os.Stdout}
	var err error
	for _, l := range []struct {
		flag  string
		value string
		into  *[]int
		empty bool // may be empty
	}{
		{"-txn-sizes", *txnSizes, &cfg.TxnSizes, false}, {"-partitions", *partitions, &cfg.PartitionCounts, false},
		{"-topics", *topics, &cfg.TopicCounts, false}, {"-payloads", *payloads, &cfg.Payloads, false},
		{"-rates", *rates, &cfg.Rates, true}, {"-latency-txn-sizes", *latTxn, &cfg.LatencyTxnSizes, false},
		{"-reconcile-partitions", *reconcile, &cfg.ReconcilePartitions, true},
		{"-table-rows", *tableRows, &cfg.TableRows, true},
	} {
		if *l.into, err = parseCounts(l.flag, l.value); err != nil {
			return err
		}
		if len(*l.into) == 0 && !l.empty {
			return fmt.Errorf("%s: give at least one value", l.flag)
		}
	}
	cfg.Cells = cellList
	switch {
	case *events <= 0:
		return errors.New("-events must be positive")
	case *aggregates <= 0:
		return errors.New("-aggregates must be positive")
	case slices.Max(cfg.TxnSizes) > *aggregates:
		return errors.New("-txn-sizes must be at most -aggregates (so an aggregate appears at most once per transaction and the poller's created_at order is its commit order)")
	case *duration < time.Second:
		return errors.New("-duration must be at least 1s")
	case *pollerBatch <= 0:
		return errors.New("-poller-batch must be positive")
	case *rounds <= 0:
		return errors.New("-delivery-rounds must be positive")
	}
	if *writeBaselineFile != "" && *rounds < 2 && cfg.RunsDrainCells() {
		return errors.New("-write-baseline needs -delivery-rounds 2 or more for drain cells (the rounds' spread is the guard's threshold)")
	}
	if *listCells {
		for _, n := range cfg.CellNames() {
			fmt.Println(n)
		}
		return nil
	}
	if err := cfg.CheckCells(); err != nil {
		return err
	}
	if cfg.Self, err = os.Executable(); err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	dir, err := runner.ResultsDir()
	if err != nil {
		return err
	}
	root, err := runner.RepoRoot()
	if err != nil {
		return err
	}
	if *quick || len(cfg.Cells) > 0 {
		// Smoke checks and single cells are not the committed figures.
		dir = filepath.Join(dir, "scratch")
	}

	start := time.Now()
	res, err := runner.Run(ctx, cfg)
	if err != nil {
		return err
	}
	// The regression guard (issue 38): its block is printed after the
	// tables, a RISE or DROP is also a missed target.
	var guardOut strings.Builder
	if *baselineFile != "" {
		res.Targets = append(res.Targets, guard(&guardOut, repoPath(root, *baselineFile), *baselineFile, res)...)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create results dir: %w", err)
	}
	// One copy only: latest.json (its "started" names the run) and its charts.
	// An earlier run is in git history under the same names.
	if err := res.Save(filepath.Join(dir, "latest.json")); err != nil {
		return err
	}
	written, err := writeCharts(res, filepath.Join(dir, "latest"))
	if err != nil {
		return err
	}
	fmt.Println()
	res.Print(os.Stdout)
	fmt.Print(guardOut.String())
	fmt.Printf("\nwrote %s/latest.json and %d charts; total %.0fs\n", dir, len(written), time.Since(start).Seconds())
	if *writeBaselineFile != "" {
		if err := writeBaseline(ctx, root, repoPath(root, *writeBaselineFile), res); err != nil {
			return err
		}
		fmt.Printf("recorded %d drain and %d table cells into %s\n", len(res.Cells), len(res.TableCells), *writeBaselineFile)
	}
	return nil
}

// writeCharts draws the summary chart base.png and the curves base-*.png.
func writeCharts(r *results.Results, base string) ([]string, error) {
	if err := chart.Write(r, base+".png"); err != nil {
		return nil, err
	}
	curves, err := chart.WriteCurves(r, base)
	return append([]string{base + ".png"}, curves...), err
}

// splitCells splits a -cell value into cell names: at spaces, and at commas
// that start a new cell (a name starts with drain/, startup/, replay/, join/ or latency/;
// latency/rate=R,txn=T holds a comma itself).
func splitCells(v string) []string {
	var out []string
	for _, f := range strings.Fields(v) {
		parts := strings.Split(f, ",")
		for _, p := range parts {
			if len(out) > 0 && !strings.Contains(p, "/") && strings.HasPrefix(out[len(out)-1], "latency/") {
				out[len(out)-1] += "," + p
				continue
			}
			if p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// parseCounts parses the comma-separated positive numbers of flag.
func parseCounts(flag, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%s: %q is not a positive number", flag, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// runReader is the hidden "bench reader" child: the relay's read path with a
// producer that discards (the limit). Its flags are followed by "--" and the
// flags the relay binary is run with, from which it takes the relay's
// configuration (cli.RelayConfig).
func runReader(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench reader", flag.ContinueOnError)
	var cfg reader.Config
	fs.IntVar(&cfg.Count, "count", 0, "stop after this many outbox events")
	fs.BoolVar(&cfg.Hold, "hold", false, "after the count, keep the connection until SIGTERM (the parent reads the walsender's CPU first)")
	fs.BoolVar(&cfg.Latency, "latency", false, "measure commit → decoded per event; print a summary line at the end")
	fs.DurationVar(&cfg.WarmUp, "warmup", 0, "with -latency: skip events committed within this time of the first")
	lean := fs.Bool("lean", false, "read with the minimal pglogrepl loop (reader.RunLean) instead of the relay's read path")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.Count <= 0 || fs.NArg() == 0 {
		return errors.New("reader: a positive -count and, after --, the relay's run flags are required")
	}
	if *lean && cfg.Latency {
		return errors.New("reader: -lean reads no commit times: no -latency")
	}
	var err error
	if cfg.Relay, err = cli.RelayConfig(fs.Args()); err != nil {
		return fmt.Errorf("reader: %w", err)
	}
	run := reader.Run
	if *lean {
		run = reader.RunLean
	}
	res, err := run(ctx, cfg, func() { fmt.Println(runner.DoneLine) })
	if cfg.Latency {
		// Also after SIGTERM: the parent reads how far it got.
		b, jerr := json.Marshal(latency.Summarize(res.Latencies))
		if jerr != nil {
			return fmt.Errorf("reader: encode latency: %w", jerr)
		}
		fmt.Printf("%s %d %s\n", runner.LatencyLine, res.Events, b)
	}
	if err != nil && !(cfg.Latency && errors.Is(err, context.Canceled)) {
		return fmt.Errorf("reader: %w", err)
	}
	return nil
}

// runPoller is the hidden "bench poller" child.
func runPoller(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench poller", flag.ContinueOnError)
	var cfg poller.Config
	brokers := fs.String("brokers", "", "Kafka brokers, comma-separated")
	fs.StringVar(&cfg.URL, "url", "", "database URL")
	fs.StringVar(&cfg.TopicPrefix, "topic-prefix", "poller.", "topic = prefix + aggregate_type")
	fs.IntVar(&cfg.BatchSize, "batch", 1000, "rows per round")
	fs.IntVar(&cfg.BatchBytes, "batch-bytes", 1<<20, "most bytes in one produce batch (and so the largest event)")
	fs.DurationVar(&cfg.Idle, "idle", 100*time.Millisecond, "sleep after an empty round")
	fs.IntVar(&cfg.Count, "count", 0, "stop after this many events (0: until SIGTERM)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Brokers = strings.Split(*brokers, ",")
	if cfg.URL == "" || *brokers == "" {
		return errors.New("poller: -url and -brokers are required")
	}
	st, err := poller.Run(ctx, cfg, func() { fmt.Println(runner.DoneLine) })
	if err != nil {
		return fmt.Errorf("poller: %w", err)
	}
	fmt.Printf("result events=%d rounds=%d empty_rounds=%d\n", st.Events, st.Rounds, st.EmptyRounds)
	return nil
}
