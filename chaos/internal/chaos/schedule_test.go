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
// but standby-lag (16+), on both publication layouts: 13 (root: SIGKILLs,
// Postgres restarted, a partition detached then dropped, the broker
// restarted, a table leaving), 16 (listed: SIGKILL and SIGTERM, a partition
// attached, a table joining after a SIGKILL, the broker reading no more
// twice, a partition detached; the catch-up world, both restarts reading a
// backlog in batches), and issue 43 point 4's two, which a broker
// that stopped reading made fail: 4247 (root, an initial snapshot: a table
// leaves right after the broker stopped reading, so the slot must confirm
// within 30 s of it; the circuit stayed open 26 s), 4244 (listed: SIGTERM
// right after the broker stopped reading, which must exit 0 within 10 s; on
// PostgreSQL 16+, CDC_RELAY_PG_BINDIR, it draws the standby world: the
// broker reading no more four times among SIGKILLs and a restart), and 60
// (listed, the combinations of issue 42: an initial snapshot of tables
// holding bulk-written rows, two replays beside the stream, a 50k-row table
// joining with the broker stopped mid-join, the broker reading no more and
// restarted), which found two defects: events sent twice after the broker
// stopped reading (the restart now fences the killed run's producer) and a
// bulk statement's rows read from the table out of order (the reader now
// orders them by the insertion-order column).
var scheduleSeeds = []uint64{13, 16, 60, 4247, 4244}

// TestSchedule runs a fixed set of seeded schedules: each draws a sequence
// of operations (tables joining and leaving, a large one among them,
// partitions attached, detached and dropped, relay kills and stops, broker
// restarts and a broker that stops reading, Postgres restarts, replays
// beside the stream), sometimes after an initial snapshot, run while
// writers commit rows and messages, then checks Kafka against the ledger of
// every event tried and the writers' INSERT/COMMIT times.
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
