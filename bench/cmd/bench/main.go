// Command bench measures cdc-relay side by side with its speed limit and with
// the poller it replaces, in one run on one machine, and writes the results to
// bench/results (<timestamp>.json, latest.json, latest.png).
//
//	go run ./bench/cmd/bench                 # the full run (make bench)
//	go run ./bench/cmd/bench -quick          # 50k events, 5s latency runs
//	go run ./bench/cmd/bench -chart-only bench/results/latest.json
//
// It re-executes itself for the processes it measures: "bench reader" (the bare
// pgoutput reader) and "bench poller".
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
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	interrupted := ctx.Err() != nil
	stop()
	if err != nil && interrupted && errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "bench: interrupted; every process and temporary directory it started is gone")
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
		}
	}
	return runBench(ctx, args)
}

// runBench is the benchmark itself.
func runBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	events := fs.Int("events", 500000, "backlog events to drain")
	aggregates := fs.Int("aggregates", 10000, "distinct aggregate ids (Kafka keys)")
	txnSize := fs.Int("txn-size", 100, "backlog events per transaction (at most -aggregates)")
	payload := fs.Int("payload", 300, "approximate JSON payload size in bytes")
	rates := fs.String("rates", "1000,10000", "offered loads of the latency runs, events/s, comma-separated")
	duration := fs.Duration("duration", 20*time.Second, "length of each latency run")
	quick := fs.Bool("quick", false, "smoke check: 50,000 events, 5s latency runs, 2s quiet waits (unless given explicitly)")
	pollerBatch := fs.Int("poller-batch", 1000, "rows per poller round")
	pollerIdle := fs.Duration("poller-idle", 100*time.Millisecond, "poller sleep after a round that found nothing")
	partitions := fs.Int("partitions", 8, "partitions of every topic")
	rounds := fs.Int("delivery-rounds", 2, "relay drains and latency runs per --delivery mode (effectively-once and at-least-once, alternating)")
	reconcile := fs.String("reconcile-partitions", "8,256", "partition counts of the topics the relay drains into, is killed -9 mid-drain and restarted (start-up reconciliation); \"\" skips it")
	relayBin := fs.String("relay-bin", "", "use this cdc-relay binary instead of building ./cmd/cdc-relay")
	quietWait := fs.Duration("quiet-wait", 20*time.Second, "before each measurement, wait up to this long for processes outside the benchmark to use <10% of the CPUs (-quick: 2s; 0: never wait)")
	chartOnly := fs.String("chart-only", "", "only redraw the chart of this results JSON (next to it, as .png)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *chartOnly != "" {
		r, err := results.Load(*chartOnly)
		if err != nil {
			return err
		}
		png := strings.TrimSuffix(*chartOnly, filepath.Ext(*chartOnly)) + ".png"
		if err := chart.Write(r, png); err != nil {
			return err
		}
		fmt.Println("wrote", png)
		return nil
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *quick {
		if !set["events"] {
			*events = 50000
		}
		if !set["duration"] {
			*duration = 5 * time.Second
		}
		if !set["quiet-wait"] {
			*quietWait = 2 * time.Second
		}
	}
	rateList, err := parseRates(*rates)
	if err != nil {
		return err
	}
	var reconcileList []int
	if strings.TrimSpace(*reconcile) != "" {
		if reconcileList, err = parseCounts("-reconcile-partitions", *reconcile); err != nil {
			return err
		}
	}
	switch {
	case *events <= 0:
		return errors.New("-events must be positive")
	case *aggregates <= 0:
		return errors.New("-aggregates must be positive")
	case *txnSize <= 0 || *txnSize > *aggregates:
		return errors.New("-txn-size must be between 1 and -aggregates (so an aggregate appears at most once per transaction and the poller's created_at order is its commit order)")
	case *duration < time.Second:
		return errors.New("-duration must be at least 1s")
	case *pollerBatch <= 0:
		return errors.New("-poller-batch must be positive")
	case *partitions <= 0:
		return errors.New("-partitions must be positive")
	case *rounds <= 0:
		return errors.New("-delivery-rounds must be positive")
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	dir, err := runner.ResultsDir()
	if err != nil {
		return err
	}

	start := time.Now()
	res, err := runner.Run(ctx, runner.Config{
		Events: *events, Aggregates: *aggregates, TxnSize: *txnSize, Payload: *payload,
		Rates: rateList, Duration: *duration, Quick: *quick,
		DeliveryRounds: *rounds, ReconcilePartitions: reconcileList,
		PollerBatch: *pollerBatch, PollerIdle: *pollerIdle, Partitions: *partitions, QuietWait: *quietWait,
		RelayBin: *relayBin, Self: self, Out: os.Stdout,
	})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create results dir: %w", err)
	}
	stamp := start.Format("20060102-150405")
	for _, name := range []string{stamp, "latest"} {
		if err := res.Save(filepath.Join(dir, name+".json")); err != nil {
			return err
		}
		if err := chart.Write(res, filepath.Join(dir, name+".png")); err != nil {
			return err
		}
	}
	fmt.Println()
	res.Print(os.Stdout)
	fmt.Printf("\nwrote %s/{%s,latest}.{json,png}; total %.0fs\n", dir, stamp, time.Since(start).Seconds())
	return nil
}

func parseRates(s string) ([]int, error) {
	out, err := parseCounts("-rates", s)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("-rates: give at least one rate")
	}
	return out, nil
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

// runReader is the hidden "bench reader" child: the bare pgoutput reader.
func runReader(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench reader", flag.ContinueOnError)
	var cfg reader.Config
	fs.StringVar(&cfg.URL, "url", "", "database URL")
	fs.StringVar(&cfg.Slot, "slot", "", "logical replication slot (pgoutput)")
	fs.StringVar(&cfg.Publication, "publication", "cdc_relay_outbox", "publication")
	fs.IntVar(&cfg.Count, "count", 0, "stop after this many outbox events")
	fs.BoolVar(&cfg.Latency, "latency", false, "measure commit → decoded per event; print a summary line at the end")
	fs.DurationVar(&cfg.WarmUp, "warmup", 0, "with -latency: skip events committed within this time of the first")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.URL == "" || cfg.Slot == "" || cfg.Count <= 0 {
		return errors.New("reader: -url, -slot and a positive -count are required")
	}
	res, err := reader.Run(ctx, cfg, func() { fmt.Println(runner.DoneLine) })
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
