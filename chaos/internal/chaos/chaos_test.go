package chaos_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	zlog "github.com/rs/zerolog/log"

	"github.com/cdc-relay/cdc-relay/chaos/internal/chaos"
	"github.com/cdc-relay/cdc-relay/internal/relayproc"
)

// EnvSeed names the environment variable that fixes the scenarios' seed, to
// replay a failed run (the seed is logged).
const EnvSeed = "CDC_RELAY_CHAOS_SEED"

// EnvLogDir names the environment variable of a directory that keeps the
// relay logs of the run (by default they are removed with the temp dir).
const EnvLogDir = "CDC_RELAY_CHAOS_LOG_DIR"

// env is the package's chaos environment: one Postgres cluster, the built
// relay.
var env *chaos.Env

// testOptions size the scenarios for the suite: the full set of faults and
// the 20-kill loop, with shorter windows and fewer repetitions than `make
// chaos`.
func testOptions(bin, logDir string) (chaos.Options, error) {
	opts := chaos.Options{
		RelayBin:     bin,
		Kills:        20,
		EventsPerSec: 300,
		Aggregates:   100,
		Episodes:     2,
		Window:       1500 * time.Millisecond,
		CatchUp:      30 * time.Second,
		LogDir:       logDir,
	}
	if s := os.Getenv(EnvSeed); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return opts, fmt.Errorf("parse %s: %w", EnvSeed, err)
		}
		opts.Seed = seed
	}
	return opts, nil
}

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	// toxiproxy's toxics log through zerolog's global logger.
	zlog.Logger = zerolog.Nop()
	dir, err := os.MkdirTemp("", "cdc-relay-chaos-test-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: create temp dir: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := relayproc.Build(ctx, dir, relayproc.BuildOptions{Version: "chaos"})
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 1
	}
	logDir := dir
	if d := os.Getenv(EnvLogDir); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "chaos: %s: %v\n", EnvLogDir, err)
			return 1
		}
		logDir = d
	}
	opts, err := testOptions(bin, logDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 1
	}
	env, err = chaos.NewEnv(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 1
	}
	defer env.Close()
	return m.Run()
}

// TestScenarios runs every scenario against the built relay: no committed
// event may be lost, per-key order must hold, no event may be duplicated
// unless the scenario names why (Scenario.DuplicatesReason), and each
// scenario must have injected the faults it planned (and seen them take
// effect).
func TestScenarios(t *testing.T) {
	t.Logf("seed %d (rerun with %s=%d)", env.Options().Seed, EnvSeed, env.Options().Seed)
	for _, s := range chaos.Scenarios(env.Options()) {
		t.Run(s.Name, func(t *testing.T) {
			// Registered first, so it runs last: a failure's last line names
			// the scenario and the seed that replays it.
			t.Cleanup(func() {
				if t.Failed() {
					seed := env.Options().Seed
					t.Logf("%s; rerun: %s=%d go -C chaos test -run 'TestScenarios/^%s$' ./internal/chaos",
						chaos.FailureLine(seed, s.Name), EnvSeed, seed, regexp.QuoteMeta(s.Name))
				}
			})
			// A panic fails the scenario instead of the whole run, so that
			// line still comes.
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("panic: %v\n%s", p, debug.Stack())
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			res := env.Run(ctx, s)
			if res.Skipped != "" {
				t.Skip(res.Skipped)
			}
			var table strings.Builder
			if err := chaos.WriteTable(&table, []chaos.Result{res}); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s\n%s", s.Fault, table.String())
			if res.Err != nil {
				t.Errorf("scenario error: %v", res.Err)
			}
			if res.Lost != 0 {
				t.Errorf("%d committed events lost", res.Lost)
			}
			if res.OrderViolations != 0 {
				t.Errorf("%d per-key order violations", res.OrderViolations)
			}
			if res.UnexplainedDuplicates() {
				t.Errorf("%d duplicates with effectively-once delivery and no reason the guarantee names", res.Duplicated)
			}
			if res.Unexpected != 0 {
				t.Errorf("%d records not committed or not as committed", res.Unexpected)
			}
			if res.Faults < res.MinFaults {
				t.Errorf("%d faults took effect, want at least %d", res.Faults, res.MinFaults)
			}
			if res.Committed == 0 {
				t.Errorf("no events committed during the scenario")
			}
			if t.Failed() {
				t.Logf("problems: %s", strings.Join(res.Samples, "\n"))
				t.Logf("relay log (last 100 lines):\n%s", res.RelayLog(100))
			}
		})
	}
}
