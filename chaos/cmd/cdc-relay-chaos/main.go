// Command cdc-relay-chaos runs the built relay through injected faults (see
// chaos/internal/chaos) and prints a table: faults injected, events committed,
// lost, duplicated and per-key order violations for each scenario. It exits
// 1 when any scenario lost an event, broke per-key order, delivered
// duplicates without a reason the delivery guarantee names (see
// chaos.Scenario.DuplicatesReason), injected fewer faults than planned or did
// not run to the end.
//
// With -schedule it runs seeded random schedules of operations instead,
// each checked against a ledger of every event tried (see schedule.go).
//
//	make chaos
//	make chaos CHAOSFLAGS='-only sigkill|pg-restart -kills 50'
//	make chaos CHAOSFLAGS='-schedule -duration 1h'
//	make chaos CHAOSFLAGS='-schedule -seed 42 -seeds 1'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	zlog "github.com/rs/zerolog/log"

	"github.com/cdc-relay/cdc-relay/chaos/internal/chaos"
	"github.com/cdc-relay/cdc-relay/internal/relayproc"
)

func main() {
	// toxiproxy's toxics log through zerolog's global logger.
	zlog.Logger = zerolog.Nop()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cdc-relay-chaos: %v\n", err)
		os.Exit(1)
	}
}

// errFailed means at least one scenario failed; the table says which.
var errFailed = errors.New("scenarios failed")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cdc-relay-chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	only := fs.String("only", "", "run only the scenarios whose name matches this regular expression")
	list := fs.Bool("list", false, "list the scenarios and exit")
	kills := fs.Int("kills", 20, "SIGKILLs of the relay in the sigkill-loop scenario")
	rate := fs.Float64("events-per-sec", 500, "outbox events written per second during each scenario")
	episodes := fs.Int("episodes", 3, "repetitions of short faults (restarts, resets, cuts)")
	window := fs.Duration("window", 3*time.Second, "how long lasting faults (latency, throttling, broker errors) stay on")
	seed := fs.Uint64("seed", 0, "seed of the random choices (0: random; the table prints the seed used)")
	logs := fs.String("logs", "", "directory for each scenario's relay log (default: a new temporary directory)")
	relayBin := fs.String("relay-bin", "", "cdc-relay binary to test (default: build ./cmd/cdc-relay)")
	race := fs.Bool("race", false, "build the relay with the race detector")
	var sf scheduleFlags
	sf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if sf.on && *list {
		listOps(stdout)
		return nil
	}
	filter, err := regexp.Compile(*only)
	if err != nil {
		return fmt.Errorf("-only: %w", err)
	}
	if *list {
		for _, s := range chaos.Scenarios(chaos.Options{Kills: *kills, Episodes: *episodes, Window: *window}) {
			if filter.MatchString(s.Name) {
				fmt.Fprintf(stdout, "%-28s %s\n", s.Name, s.Fault)
			}
		}
		return nil
	}
	if *logs == "" {
		if *logs, err = os.MkdirTemp("", "cdc-relay-chaos-"); err != nil {
			return fmt.Errorf("create log directory: %w", err)
		}
	}
	if *relayBin == "" {
		fmt.Fprintln(stderr, "building cdc-relay...")
		if *relayBin, err = relayproc.Build(ctx, *logs, relayproc.BuildOptions{Version: "chaos", Race: *race}); err != nil {
			return err
		}
	}
	opts := chaos.Options{
		RelayBin: *relayBin, Kills: *kills, EventsPerSec: *rate, Episodes: *episodes, Window: *window,
		Seed: *seed, LogDir: *logs,
		Logf: func(format string, args ...any) {
			fmt.Fprintf(stderr, "%s "+format+"\n", append([]any{time.Now().Format(time.TimeOnly)}, args...)...)
		},
	}
	fmt.Fprintln(stderr, "starting PostgreSQL...")
	env, err := chaos.NewEnv(ctx, opts)
	if err != nil {
		return err
	}
	defer env.Close()
	if sf.on {
		return runSchedules(ctx, env, sf, *seed, stdout)
	}
	var scenarios []chaos.Scenario
	for _, s := range chaos.Scenarios(opts) {
		if filter.MatchString(s.Name) {
			scenarios = append(scenarios, s)
		}
	}
	if len(scenarios) == 0 {
		return fmt.Errorf("-only %q matches no scenario (see -list)", *only)
	}

	start := time.Now()
	var results []chaos.Result
	var failed []string
	for _, s := range scenarios {
		if ctx.Err() != nil {
			break
		}
		res := env.Run(ctx, s)
		results = append(results, res)
		if res.Failed() {
			failed = append(failed, s.Name)
			for _, line := range res.Samples {
				fmt.Fprintf(stderr, "  %s: %s\n", s.Name, line)
			}
		}
	}
	fmt.Fprintf(stdout, "\ncdc-relay chaos: %d scenarios, %.0f events/s, seed %d, %v (relay logs in %s)\n\n",
		len(results), *rate, env.Options().Seed, time.Since(start).Round(time.Second), *logs)
	if err := chaos.WriteTable(stdout, results); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if len(failed) > 0 {
		fmt.Fprintf(stdout, "\nFAILED: %d of %d scenarios (lost events, order violations, unexplained duplicates, missing faults or errors above)\n", len(failed), len(results))
		seed := env.Options().Seed
		only := make([]string, len(failed))
		for i, name := range failed {
			only[i] = regexp.QuoteMeta(name)
		}
		// main prints it last.
		return fmt.Errorf("%d of %d %w: %s; rerun: make chaos CHAOSFLAGS=\"-seed %d -only '^(%s)$'\"",
			len(failed), len(results), errFailed, chaos.FailureLine(seed, failed...), seed, strings.Join(only, "|"))
	}
	fmt.Fprintln(stdout, "\nOK: nothing lost, per-key order kept, no unexplained duplicates in every scenario")
	return nil
}
