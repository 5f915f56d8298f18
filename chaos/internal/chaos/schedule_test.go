package chaos_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/chaos/internal/chaos"
)

// Environment variables of TestSchedule.
const (
	// EnvScheduleSeeds replaces the fixed seeds: a comma-separated list.
	EnvScheduleSeeds = "CDC_RELAY_CHAOS_SCHEDULE_SEEDS"
	// EnvScheduleSteps replaces the steps per seed (8).
	EnvScheduleSteps = "CDC_RELAY_CHAOS_SCHEDULE_STEPS"
)

// scheduleSeeds are the seeds CI runs. Together they draw every operation
// but standby-lag (16+), on both publication layouts: 7 (root: a table
// leaves and joins after a SIGKILL, a partition attached and detached,
// Postgres restarted), 22 (listed: SIGTERMs, a table joining after one,
// the broker reading no more, then restarted), 30 (listed: the broker
// restarted and reading no more, partitions detached, dropped and
// attached, the last detached with the relay down).
var scheduleSeeds = []uint64{7, 22, 30}

// TestSchedule runs a fixed set of seeded schedules: each draws a sequence
// of operations (tables joining and leaving, partitions attached, detached
// and dropped, relay kills and stops, broker restarts and a broker that
// stops reading, Postgres restarts) run while writers commit rows and
// messages, then checks Kafka against the ledger of every event tried.
func TestSchedule(t *testing.T) {
	seeds, steps, err := scheduleConfig()
	if err != nil {
		t.Fatal(err)
	}
	for _, seed := range seeds {
		plan := chaos.NewPlan(seed, chaos.PlanConfig{Steps: steps, PGMajor: env.PGMajor()})
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			res := env.RunSchedule(ctx, plan)
			if res.Skipped != "" {
				t.Skip(res.Skipped)
			}
			if res.Verdict.Committed == 0 {
				t.Errorf("no event committed")
			}
			if res.Failed() {
				if log := res.RelayLogTail(60); log != "" {
					t.Logf("relay log (last 60 lines):\n%s", log)
				}
				// The last line names the seed and its schedule.
				t.Errorf("rerun with %s=%d\n%s", EnvScheduleSeeds, seed, res.Report())
				return
			}
			t.Log(res.Report())
		})
	}
}

// scheduleConfig reads the seeds and steps, from the environment when set.
func scheduleConfig() ([]uint64, int, error) {
	seeds, steps := scheduleSeeds, 8
	if s := os.Getenv(EnvScheduleSeeds); s != "" {
		seeds = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				return nil, 0, fmt.Errorf("%s: %q is not a seed: %w", EnvScheduleSeeds, f, err)
			}
			seeds = append(seeds, n)
		}
	}
	if s := os.Getenv(EnvScheduleSteps); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return nil, 0, fmt.Errorf("%s: %q is not a positive number", EnvScheduleSteps, s)
		}
		steps = n
	}
	return seeds, steps, nil
}
