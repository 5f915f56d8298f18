// Package chaos runs the built cdc-relay binary through injected faults and
// checks the delivery guarantee after each: nothing committed lost, per-key
// order kept, and no duplicates unless the scenario names why the guarantee
// lets it have some (Scenario.DuplicatesReason: it runs --delivery
// at-least-once, or injects a fault the docs/guarantee.md names as
// degrading effectively-once to at-least-once).
//
// Every scenario gets its own database, slot, topic and Kafka broker(s) on a
// Postgres cluster the Env shares between scenarios. It starts the relay,
// writes a steady load of numbered outbox events over many aggregates
// (verify.Writer), injects its fault while the load runs, stops the load,
// waits for the relay to catch up and compares Kafka with what committed
// (verify.Check). Faults: SIGKILL of the relay, Postgres restarts, network
// faults on the replication connection and on the Kafka connections
// (toxiproxy, in-process), a produce stall long enough to exceed
// wal_sender_timeout while backpressured, and broker errors, slowness,
// restarts and leadership moves (kfake).
//
// cmd/cdc-relay-chaos runs every scenario and prints the table (make chaos);
// chaos_test.go runs them all, smaller, in the test suite. Schedules
// (schedule.go) combine faults: a seed draws a sequence of operations, run
// while writers commit, checked against a ledger of every event tried.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// Options configure the scenarios (Scenarios uses Kills, Episodes and
// Window) and the Env that runs them (the rest). Zero values take the
// defaults of `make chaos`.
type Options struct {
	// RelayBin is the cdc-relay binary to run (see relayproc.Build). Required.
	RelayBin string
	// Kills is how many times the SIGKILL scenario kills the relay (20).
	Kills int
	// EventsPerSec is the rate of the outbox load (500).
	EventsPerSec float64
	// Aggregates is how many aggregate ids the load spreads over (200).
	Aggregates int
	// Episodes is how often a short fault (a restart, a reset, a cut) is
	// repeated (3).
	Episodes int
	// Window is how long a lasting fault (latency, throttling, broker
	// errors) stays on (3s).
	Window time.Duration
	// CatchUp bounds the wait for the relay to deliver everything after the
	// load stopped (60s); events still missing then count as lost.
	CatchUp time.Duration
	// Seed seeds the scenarios' random choices (kill times, fault timing,
	// aggregates); 0 picks one at random. Results carry the seed used.
	Seed uint64
	// Logf, when set, is called with progress lines.
	Logf func(format string, args ...any)
	// LogDir, when set, receives each scenario's relay log as
	// <scenario>.log.
	LogDir string
}

func (o *Options) setDefaults() {
	if o.Kills <= 0 {
		o.Kills = 20
	}
	if o.EventsPerSec <= 0 {
		o.EventsPerSec = 500
	}
	if o.Aggregates <= 0 {
		o.Aggregates = 200
	}
	if o.Episodes <= 0 {
		o.Episodes = 3
	}
	if o.Window <= 0 {
		o.Window = 3 * time.Second
	}
	if o.CatchUp <= 0 {
		o.CatchUp = 60 * time.Second
	}
	if o.Seed == 0 {
		o.Seed = rand.Uint64()
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
}

// Result is the outcome of one scenario.
type Result struct {
	Scenario string
	// Faults is how many faults were injected and seen to take effect;
	// MinFaults is how many the scenario sets out to inject.
	Faults, MinFaults int
	// Committed events, Lost ones (committed, never in Kafka), Duplicated
	// records (beyond the first of each event) and OrderViolations (per-key
	// order broken, or a key on two partitions).
	Committed, Lost, Duplicated, OrderViolations int
	// Unexpected records: not committed, or not as committed.
	Unexpected int
	Duration   time.Duration
	// Notes say what happened: timings, reconnects, the writer's view.
	Notes []string
	// DuplicatesReason is the scenario's: why duplicates are expected, or ""
	// when there must be none.
	DuplicatesReason string
	// Samples are the first problems found, for diagnosis.
	Samples []string
	// Err is set when the scenario could not run to the end or the relay
	// misbehaved otherwise: it exited, hung, or did not stop cleanly.
	Err error
	// Skipped says why the scenario did not run (external servers).
	Skipped string
	Seed    uint64
	// LogFile is where the relay's log was written (Options.LogDir).
	LogFile string
}

// Failed reports whether the scenario broke the delivery guarantee (lost an
// event, broke per-key order, delivered something not committed, or
// delivered duplicates it has no DuplicatesReason for), did not inject its
// faults, or did not run to the end.
func (r Result) Failed() bool {
	if r.Skipped != "" {
		return false
	}
	return r.Err != nil || r.Lost > 0 || r.OrderViolations > 0 || r.Unexpected > 0 || r.Faults < r.MinFaults ||
		r.UnexplainedDuplicates()
}

// FailureLine says which scenarios of a run failed and the seed that replays
// them, for the last line a failure prints.
func FailureLine(seed uint64, scenarios ...string) string {
	return fmt.Sprintf("FAILED chaos scenario %s, seed %d", strings.Join(scenarios, ", "), seed)
}

// UnexplainedDuplicates reports whether the scenario delivered duplicates
// though it has no reason to: with the default effectively-once delivery and
// a fault the guarantee covers, every event is in Kafka once.
func (r Result) UnexplainedDuplicates() bool {
	return r.Duplicated > 0 && r.DuplicatesReason == ""
}

// Scenario is one kind of fault, injected while the load runs.
type Scenario struct {
	Name string
	// Fault says in one line what is injected.
	Fault string
	// MinFaults is how many faults a run injects at least.
	MinFaults int
	// DuplicatesReason says why this scenario may deliver an event more than
	// once: it runs --delivery at-least-once, or its fault is one the
	// docs/guarantee.md names as degrading effectively-once
	// to at-least-once. Empty means duplicates fail the scenario.
	DuplicatesReason string

	size       size
	kafka      kafkaKind
	pgProxy    bool     // the relay reaches Postgres through a proxy
	localPG    bool     // restarts or reconfigures the cluster
	localKafka bool     // injects faults through kfake
	relayArgs  []string // flags added to (or overriding) the defaults
	prepare    func(ctx context.Context, r *run) error
	inject     func(ctx context.Context, r *run) error
}

// size is how big a scenario is: the Options it was made with.
type size struct {
	kills, episodes int
	window          time.Duration
}

// Env is the shared part of every scenario: the Postgres cluster and the
// in-process toxiproxy server. Create it with NewEnv and Close it.
type Env struct {
	opts       Options
	pg         *sandbox.Postgres
	proxies    *toxiproxy.ApiServer
	migrations []string
}

// NewEnv starts the Postgres cluster the scenarios share (sandbox: a
// throwaway PostgreSQL 15, or CDC_RELAY_TEST_PG_URL) and reads the
// migrations.
func NewEnv(ctx context.Context, opts Options) (*Env, error) {
	opts.setDefaults()
	if opts.RelayBin == "" {
		return nil, errors.New("chaos: Options.RelayBin is required (see relayproc.Build)")
	}
	migrations, err := readMigrations()
	if err != nil {
		return nil, err
	}
	// Commit timestamps: the table reader (replay, the initial snapshot, a
	// join) then publishes in commit order, as docs/postgres.md recommends.
	pg, err := sandbox.StartPostgres(ctx, sandbox.PGOptions{Settings: map[string]string{"track_commit_timestamp": "on"}})
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	return &Env{opts: opts, pg: pg, proxies: newToxiServer(), migrations: migrations}, nil
}

// Options returns the options with defaults applied; Seed is the seed used.
func (e *Env) Options() Options { return e.opts }

// Close stops the Postgres cluster.
func (e *Env) Close() error { return e.pg.Close() }

// readMigrations reads the outbox and checkpoint migrations, as an operator
// runs them (the relay creates the publication and the slot).
func readMigrations() ([]string, error) {
	dir := "migrations"
	if root, err := relayproc.ModuleRoot(); err == nil {
		dir = filepath.Join(root, "migrations")
	}
	var out []string
	for _, f := range []string{"001_outbox.sql", "002_checkpoints.sql"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return nil, fmt.Errorf("read migration: %w", err)
		}
		out = append(out, string(b))
	}
	return out, nil
}

// Run runs one scenario. It does not return an error: problems are in the
// Result (Err, Lost, …).
func (e *Env) Run(ctx context.Context, s Scenario) Result {
	start := time.Now()
	res := Result{Scenario: s.Name, MinFaults: s.MinFaults, DuplicatesReason: s.DuplicatesReason, Seed: e.opts.Seed}
	switch {
	case s.localPG && e.pg.External():
		res.Skipped = "needs a local Postgres it can restart (" + sandbox.EnvPGURL + " is set)"
		return res
	case s.localKafka && s.kafka == kafkaLocal && os.Getenv(sandbox.EnvKafkaBrokers) != "":
		res.Skipped = "needs a local kfake broker (" + sandbox.EnvKafkaBrokers + " is set)"
		return res
	}
	e.opts.Logf("%s: %s", s.Name, s.Fault)
	r := newRun(e, s)
	defer r.teardown()
	r.execute(ctx, &res)
	res.Faults = r.faults
	res.Notes = append(res.Notes, r.notes...)
	res.Duration = time.Since(start)
	if e.opts.LogDir != "" && r.relay != nil {
		path := filepath.Join(e.opts.LogDir, s.Name+".log")
		if err := os.WriteFile(path, []byte(r.relay.Logs()), 0o644); err != nil {
			res.Notes = append(res.Notes, fmt.Sprintf("write relay log: %v", err))
		} else {
			res.LogFile = path
		}
	}
	e.opts.Logf("%s: faults=%d committed=%d lost=%d duplicated=%d order_violations=%d in %v%s",
		s.Name, res.Faults, res.Committed, res.Lost, res.Duplicated, res.OrderViolations,
		res.Duration.Round(100*time.Millisecond), errSuffix(res.Err))
	return res
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return ": " + err.Error()
}

// RelayLog returns the tail of at most n lines of a result's relay log, or ""
// when it was not written.
func (r Result) RelayLog(n int) string {
	if r.LogFile == "" {
		return ""
	}
	b, err := os.ReadFile(r.LogFile)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WriteTable prints results as an aligned table: scenario, faults,
// committed, lost, duplicated, order violations, time and notes. The notes
// start with why duplicates are expected, for a scenario that says so, or
// with UNEXPLAINED DUPLICATES when it has some and no reason.
func WriteTable(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tfaults\tcommitted\tlost\tduplicated\torder violations\ttime\tnotes")
	for _, r := range results {
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\tskipped: %s\n", r.Scenario, r.Skipped)
			continue
		}
		notes := strings.Join(r.Notes, "; ")
		switch {
		case r.DuplicatesReason != "":
			notes = "duplicates expected: " + r.DuplicatesReason + "; " + notes
		case r.Duplicated > 0:
			notes = fmt.Sprintf("%d UNEXPLAINED DUPLICATES (effectively-once); %s", r.Duplicated, notes)
		}
		if r.Faults < r.MinFaults {
			notes = fmt.Sprintf("FEWER FAULTS THAN PLANNED (%d); %s", r.MinFaults, notes)
		}
		if r.Unexpected > 0 {
			notes = fmt.Sprintf("%d UNEXPECTED RECORDS; %s", r.Unexpected, notes)
		}
		if r.Err != nil {
			notes = "ERROR: " + r.Err.Error() + "; " + notes
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.1fs\t%s\n", r.Scenario, r.Faults, r.Committed, r.Lost,
			r.Duplicated, r.OrderViolations, r.Duration.Seconds(), strings.TrimSuffix(notes, "; "))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}
