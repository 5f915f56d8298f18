package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/cdc-relay/cdc-relay/chaos/internal/chaos"
)

// scheduleFlags are the flags of -schedule.
type scheduleFlags struct {
	on       bool
	seeds    int
	duration time.Duration
	steps    int
}

func (f *scheduleFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.on, "schedule", false, "run seeded random schedules of operations (tables join and leave, partitions attached, detached and dropped, "+
		"relay SIGKILL/SIGTERM, broker restarts and a broker that stops reading, Postgres restarts, a large table joining, cdc-relay replay beside the stream; "+
		"sometimes an initial snapshot first) while writers commit rows and messages, "+
		"each checked against a ledger of every event and the writers' INSERT/COMMIT times (none over 1s); -seed N is the first seed (seeds N, N+1, …), -list lists the operations")
	fs.IntVar(&f.seeds, "seeds", 0, "with -schedule: how many seeds to run (default 10; with -duration, as many as fit unless this caps them)")
	fs.DurationVar(&f.duration, "duration", 0, "with -schedule: start no new seed after this long (0: run -seeds seeds)")
	fs.IntVar(&f.steps, "steps", 8, "with -schedule: operations per seed")
}

// errScheduleFailed means at least one schedule failed; the reports above
// say which.
var errScheduleFailed = errors.New("schedules failed")

// listOps prints the operations a schedule draws from.
func listOps(w io.Writer) {
	for _, o := range chaos.OpDocs() {
		fmt.Fprintf(w, "%-22s %s\n", o[0], o[1])
	}
}

// runSchedules runs seeds first, first+1, … and prints a line for each, then
// the reports of the failures, so the last line of the output names the
// last failing seed and its schedule.
func runSchedules(ctx context.Context, env *chaos.Env, f scheduleFlags, first uint64, stdout io.Writer) error {
	if first == 0 {
		first = rand.Uint64N(1 << 32)
	}
	if f.seeds < 0 || f.duration < 0 {
		return errors.New("-schedule: -seeds and -duration cannot be negative")
	}
	if f.seeds == 0 && f.duration == 0 {
		f.seeds = 10
	}
	start := time.Now()
	var failed []chaos.ScheduleResult
	seeds, steps := 0, 0
	for seed := first; ctx.Err() == nil; seed++ {
		if f.duration > 0 && time.Since(start) >= f.duration || f.seeds > 0 && seeds >= f.seeds {
			break
		}
		res := env.RunSchedule(ctx, chaos.NewPlan(seed, chaos.PlanConfig{Steps: f.steps, PGMajor: env.PGMajor()}))
		seeds++
		steps += res.StepsRun
		status := "ok  "
		if res.Failed() {
			status = "FAIL"
			failed = append(failed, res)
		}
		fmt.Fprintf(stdout, "%s seed=%d steps=%d/%d %v %s %s\n", status, seed, res.StepsRun, len(res.Plan.Steps), res.Duration.Round(100*time.Millisecond), res.Verdict, res.Waits)
	}
	fmt.Fprintf(stdout, "\ncdc-relay chaos schedules: %d seeds from %d, %d operations, %d failed, %v\n", seeds, first, steps, len(failed), time.Since(start).Round(time.Second))
	for _, r := range failed {
		fmt.Fprintf(stdout, "\n%s\n", r.Report())
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d %w (rerun one with -schedule -seeds 1 -seed N)", len(failed), seeds, errScheduleFailed)
	}
	return nil
}
