package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// schedWriters is how many writers commit at once during a schedule.
const schedWriters = 2

// ScheduleResult is the outcome of one seed's schedule.
type ScheduleResult struct {
	Plan Plan
	// StepsRun is how many steps ran to the end.
	StepsRun int
	Verdict  Verdict
	// DuplicatesReason says why this run may have duplicates (at-least-once
	// delivery, or a fallback the relay counted that docs/guarantee.md
	// names); "" when it may have none.
	DuplicatesReason string
	// Err is set when a step failed, the relay exited or did not stop
	// cleanly, or Kafka could not be read.
	Err error
	// Waits is how long the writers' transactions (their INSERTs and
	// COMMIT) took: a seed fails when one waited more than maxWriterWait.
	Waits    WaitStats
	Notes    []string
	Duration time.Duration
	LogFile  string
	Skipped  string
}

// Failed reports whether the schedule broke the guarantee or did not run.
func (r ScheduleResult) Failed() bool {
	if r.Skipped != "" {
		return false
	}
	return r.Err != nil || !r.Verdict.ok(r.DuplicatesReason != "") || r.Waits.BlockedByRelay >= maxWriterWait
}

// maxWriterWait is the longest a writer's transaction may wait on a lock
// the relay holds: the application's INSERT and COMMIT must not wait on the
// relay (issue 42). Its whole transaction time is a figure, not a bound: on
// a shared 2-core machine under load, Postgres alone took over a second
// (insert_wait_max=1.085s at a broker restart, load average 16, no lock).
const maxWriterWait = time.Second

// WaitStats sums up the writers' transaction times.
type WaitStats struct {
	N        int
	Max, P99 time.Duration
	// MaxStep is the step during which the longest ran (0: before the
	// first).
	MaxStep int
	// BlockedByRelay is the longest a writer's transaction was seen
	// waiting on a lock a relay connection held, within a poll (lockWatch);
	// BlockedBy what the relay ran then.
	BlockedByRelay time.Duration
	BlockedBy      string
}

// String prints the figures as the seed's line shows them.
func (w WaitStats) String() string {
	return fmt.Sprintf("insert_wait_max=%v (step %d) insert_wait_p99=%v blocked_by_relay_max=%v", w.Max.Round(time.Millisecond), w.MaxStep, w.P99.Round(time.Millisecond), w.BlockedByRelay.Round(time.Millisecond))
}

// waitStats sums up waits.
func waitStats(waits []writerWait) WaitStats {
	if len(waits) == 0 {
		return WaitStats{}
	}
	sorted := slices.SortedFunc(slices.Values(waits), func(a, b writerWait) int { return cmp.Compare(a.took, b.took) })
	last := sorted[len(sorted)-1]
	return WaitStats{N: len(waits), Max: last.took, MaxStep: last.step, P99: sorted[(len(sorted)-1)*99/100].took}
}

// Report describes the result over several lines; the last names the seed
// and its whole schedule, so the last line of a log replays a failure.
func (r ScheduleResult) Report() string {
	var b strings.Builder
	status := "ok"
	if r.Failed() {
		status = "FAIL"
	}
	if r.Skipped != "" {
		status = "skipped: " + r.Skipped
	}
	fmt.Fprintf(&b, "schedule %s: %d of %d steps in %v: %s\n", status, r.StepsRun, len(r.Plan.Steps), r.Duration.Round(100*time.Millisecond), r.Verdict)
	if r.DuplicatesReason != "" {
		fmt.Fprintf(&b, "  duplicates allowed: %s\n", r.DuplicatesReason)
	}
	if r.Err != nil {
		fmt.Fprintf(&b, "  error: %v\n", r.Err)
	}
	if r.Waits.N > 0 {
		over := ""
		switch {
		case r.Waits.BlockedByRelay >= maxWriterWait:
			over = fmt.Sprintf(": a writer waited %v or more on a lock the relay held (%s)", maxWriterWait, r.Waits.BlockedBy)
		case r.Waits.Max > maxWriterWait:
			over = fmt.Sprintf(" (over %v, on no lock of the relay's: Postgres was slow)", maxWriterWait)
		}
		fmt.Fprintf(&b, "  writers' INSERT/COMMIT over %d transactions: %s%s\n", r.Waits.N, r.Waits, over)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  %s\n", n)
	}
	for _, s := range r.Verdict.Samples {
		fmt.Fprintf(&b, "  %s\n", s)
	}
	if r.LogFile != "" {
		fmt.Fprintf(&b, "  relay log: %s\n", r.LogFile)
	}
	fmt.Fprintf(&b, "%s %s", status, r.Plan)
	return b.String()
}

// schedRun is one schedule's world.
type schedRun struct {
	env  *Env
	plan Plan
	opts Options

	db, url, slot, topic string
	// standby is the hot standby the relay decodes on (Plan.Source), and
	// slotURL the database where its slot lives: the standby's or url.
	standby     *sandbox.Postgres
	slotURL     string
	kafka       *stallKafka
	relay       *relayproc.Process
	st          *liveState
	led         *ledger
	writers     []*schedWriter
	stopWriters chan struct{}
	writersDone chan error

	// replays are the cdc-relay replay runs of replay steps.
	replays []replayRun
	waits   WaitStats
	locks   *lockWatch // while the writers run

	// fallbacks are the relay's delivery fallbacks, by reason, summed over
	// its runs; runFallbacks are the current run's as last scraped.
	fallbacks, runFallbacks map[string]float64
	notes                   []string
}

// PGMajor returns the major version of the shared Postgres.
func (e *Env) PGMajor() int { return e.pg.Major() }

// RunSchedule runs plan against the built relay and checks the ledger.
func (e *Env) RunSchedule(ctx context.Context, plan Plan) ScheduleResult {
	start := time.Now()
	res := ScheduleResult{Plan: plan}
	if e.pg.External() {
		res.Skipped = "needs a local Postgres it can restart (" + sandbox.EnvPGURL + " is set)"
		return res
	}
	name := fmt.Sprintf("sched_%d", plan.Seed)
	r := &schedRun{
		env: e, plan: plan, opts: e.opts,
		db: "chaos_" + name, slot: "chaos_" + name, topic: "outbox.chaos." + name,
		st:  &liveState{bMember: plan.BMember, buckets: slices.Clone(plan.Buckets), messages: plan.Messages},
		led: newLedger(), fallbacks: map[string]float64{}, runFallbacks: map[string]float64{},
	}
	defer r.teardown()
	e.opts.Logf("schedule %s", plan)
	res.StepsRun, res.Err = r.execute(ctx)
	v, err := r.finish(ctx)
	res.Notes = r.notes
	res.Verdict = v
	res.Waits = r.waits
	res.Err = errors.Join(res.Err, err)
	res.DuplicatesReason = r.duplicatesReason()
	res.Duration = time.Since(start)
	if e.opts.LogDir != "" && r.relay != nil {
		path := filepath.Join(e.opts.LogDir, name+".log")
		if err := os.WriteFile(path, []byte(r.relay.Logs()), 0o644); err == nil {
			res.LogFile = path
		}
	}
	e.opts.Logf("schedule seed=%d: %d steps, %s %s%s", plan.Seed, res.StepsRun, res.Verdict, res.Waits, errSuffix(res.Err))
	return res
}

func (r *schedRun) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// execute sets the world up, starts the relay and the writers and runs the
// steps; it returns how many steps ran.
func (r *schedRun) execute(ctx context.Context) (int, error) {
	if err := r.setup(ctx); err != nil {
		return 0, fmt.Errorf("setup: %w", err)
	}
	r.relay = relayproc.New(relayproc.Options{Path: r.opts.RelayBin, Args: r.relayArgs(), AddMetricsAddr: true})
	if r.plan.Snapshot {
		if err := r.beforeSnapshot(ctx); err != nil {
			return 0, fmt.Errorf("before the initial snapshot: %w", err)
		}
	}
	if err := r.startRelay(ctx); err != nil {
		return 0, fmt.Errorf("first start: %w", err)
	}
	if r.plan.Snapshot {
		if _, err := r.relay.WaitLog(ctx, "initial snapshot done", readyTimeout); err != nil {
			return 0, fmt.Errorf("initial snapshot: %w: %s", err, lastLines(r.relay.Logs(), 3))
		}
		r.st.mu.Lock()
		r.st.messages = r.plan.Messages
		r.st.mu.Unlock()
	} else {
		r.startWriters(ctx)
	}
	wctx, cancel := context.WithTimeout(ctx, warmupTimeout)
	_, err := sandbox.WaitForRecords(wctx, r.kafka.brokers(), 1, r.topic)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("warm-up: no record in Kafka: %w", err)
	}
	for i, s := range r.plan.Steps {
		if err := sleep(ctx, s.Wait); err != nil {
			return i, err
		}
		r.st.mu.Lock()
		r.st.step = i + 1
		r.st.mu.Unlock()
		r.env.opts.Logf("  step %d: %s", i+1, s)
		if err := r.apply(ctx, s); err != nil {
			return i, fmt.Errorf("step %d %s: %w", i+1, s, err)
		}
		if !r.relay.Running() {
			return i + 1, fmt.Errorf("after step %d %s: the relay exited with code %d: %s", i+1, s, r.relay.ExitCode(), lastLines(r.relay.Logs(), 3))
		}
	}
	return len(r.plan.Steps), sleep(ctx, tailAfterFault)
}

// lastLines returns the last n lines of s, joined with " | ".
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// setup creates the database, the tables, the publication of a listed
// layout and the broker.
func (r *schedRun) setup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	var err error
	if r.url, err = r.env.pg.CreateDatabase(ctx, r.db); err != nil {
		return err
	}
	stmts := slices.Clone(r.env.migrations)
	stmts = append(stmts,
		`CREATE TABLE public.chaos_txns (txid uuid PRIMARY KEY)`,
		`CREATE TABLE public.`+tableB+` (LIKE public.`+tableMain+` INCLUDING ALL)`,
		`CREATE TABLE public.`+tableP+` (id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
			event_type text NOT NULL, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
			bucket int NOT NULL, PRIMARY KEY (id, bucket)) PARTITION BY LIST (bucket)`)
	for _, b := range r.plan.Buckets {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE public.%s PARTITION OF public.%s FOR VALUES IN (%d)`, partitionName(b), tableP, b))
	}
	if r.plan.Layout == "listed" {
		tables := []string{"public." + tableMain}
		for _, b := range r.plan.Buckets {
			tables = append(tables, "public."+partitionName(b))
		}
		if r.plan.BMember {
			tables = append(tables, "public."+tableB)
		}
		stmts = append(stmts, `CREATE PUBLICATION cdc_relay_outbox FOR TABLE `+strings.Join(tables, ", ")+` WITH (publish = 'insert')`)
	}
	for _, sql := range stmts {
		if err := r.env.pg.Exec(ctx, r.db, sql); err != nil {
			return fmt.Errorf("%.60s…: %w", sql, err)
		}
	}
	r.slotURL = r.url
	if r.plan.Source == "standby" {
		r.standby, err = r.env.pg.StartStandby(ctx, sandbox.StandbyOptions{
			Slot: r.slot + "_phys", Database: r.db, Settings: map[string]string{"hot_standby_feedback": "on"},
		})
		if err != nil {
			return err
		}
		r.slotURL = r.standby.URL(r.db)
	}
	r.kafka, err = startStallKafka(r.topic)
	return err
}

// relayArgs returns the relay's arguments for the tables written now.
func (r *schedRun) relayArgs() []string {
	tables := []string{"public." + tableMain, "public." + tableP}
	if r.st.bMember {
		tables = append(tables, "public."+tableB)
	}
	args := []string{"run",
		"--pg-url", relayURL(r.slotURL),
		"--kafka-brokers", strings.Join(r.kafka.brokers(), ","),
		"--topic", r.topic,
		"--slot", r.slot,
		"--table", strings.Join(tables, ","),
		"--log-format", "json",
		"--status-interval", "200ms",
		"--retry-cap", "1s",
		// A broker that stops reading is noticed at the request timeout:
		// short here, so a seed with that step fits in CI's time.
		"--request-timeout", scheduleRequestTimeout.String(),
		"--shutdown-timeout", relayShutdownTimeout.String(),
		"--relay-name", "chaos",
		"--delivery", r.plan.Delivery,
	}
	if r.plan.Messages {
		args = append(args, "--messages-prefix", messagePrefix)
	}
	if r.plan.Snapshot {
		// Taken when the first start creates the slot; later starts find
		// it and take none.
		args = append(args, "--snapshot", "initial")
	}
	if r.standby != nil {
		args = append(args, "--primary-pg-url", relayURL(r.url))
	}
	if r.plan.CatchUp {
		args = append(args, "--catch-up-threshold-mib", "1", "--catch-up-batch", "1500")
	}
	return args
}

// startRelay starts the relay with the arguments for the tables written now
// and waits until it is ready.
func (r *schedRun) startRelay(ctx context.Context) error {
	r.relay.SetArgs(r.relayArgs())
	if err := r.relay.Start(); err != nil {
		return err
	}
	if err := r.relay.WaitReady(ctx, readyTimeout); err != nil {
		return fmt.Errorf("%w: %s", err, lastLines(r.relay.Logs(), 3))
	}
	return nil
}

// stopRelay stops the relay with SIGKILL ("kill") or SIGTERM ("term", which
// must exit 0), keeping the run's fallback counts.
func (r *schedRun) stopRelay(ctx context.Context, mode string) error {
	r.scrapeFallbacks(ctx)
	r.fallbacks = addCounts(r.fallbacks, r.runFallbacks)
	clear(r.runFallbacks)
	if mode == "term" {
		return r.relay.Stop(stopTimeout)
	}
	if !r.relay.Kill() {
		return fmt.Errorf("kill: the relay had exited by itself with code %d", r.relay.ExitCode())
	}
	return nil
}

func addCounts(a, b map[string]float64) map[string]float64 {
	out := maps.Clone(a)
	for k, v := range b {
		out[k] += v
	}
	return out
}

// metricFallbacks is the relay's delivery fallback counter.
const metricFallbacks = "cdc_relay_delivery_fallbacks_total"

// scrapeFallbacks reads the current run's fallback counts.
func (r *schedRun) scrapeFallbacks(ctx context.Context) {
	m, err := r.relay.Scrape(ctx)
	if err != nil {
		return
	}
	for k, v := range m {
		if reason, ok := strings.CutPrefix(k, metricFallbacks+`{reason="`); ok {
			r.runFallbacks[strings.TrimSuffix(reason, `"}`)] = v
		}
	}
}

// What the relay logs when a table joins the publication, when that join
// is done, and when it takes again an initial snapshot that did not
// complete (internal/relay).
const (
	logJoinBegins      = "joins publication"
	logJoinDone        = "join snapshot done"
	logSnapshotRetaken = "the initial snapshot did not complete"
)

// duplicatesReason says why the run may have duplicates, or "".
func (r *schedRun) duplicatesReason() string {
	var why []string
	if r.plan.Delivery == "at-least-once" {
		why = append(why, "--delivery at-least-once: events sent but not checkpointed before a stop are sent again")
	}
	if r.relay != nil {
		logs := r.relay.Logs()
		// docs/guarantee.md: a join or an initial snapshot cut short is
		// taken again, so the rows the first attempt published arrive twice.
		if began, done := strings.Count(logs, logJoinBegins), strings.Count(logs, logJoinDone); began > done {
			why = append(why, fmt.Sprintf("%d of %d joins of a table were cut short and taken again (docs/guarantee.md)", began-done, began))
		}
		if n := strings.Count(logs, logSnapshotRetaken); n > 0 {
			why = append(why, fmt.Sprintf("the initial snapshot was cut short and taken again %d times (docs/guarantee.md)", n))
		}
	}
	all := addCounts(r.fallbacks, r.runFallbacks)
	for _, k := range slices.Sorted(maps.Keys(all)) {
		if all[k] > 0 {
			why = append(why, fmt.Sprintf("the relay counted %v delivery fallbacks with reason %s (docs/guarantee.md)", all[k], k))
		}
	}
	return strings.Join(why, "; ")
}

// startWriters starts the writers.
func (r *schedRun) startWriters(ctx context.Context) {
	r.stopWriters = make(chan struct{})
	r.writersDone = make(chan error, 1)
	wurl, err := withAppName(r.url, writerAppName)
	if err != nil {
		r.writersDone <- err
		return
	}
	r.locks = watchLocks(ctx, r.url)
	aggs := max(r.opts.Aggregates/schedWriters, 1)
	var wg sync.WaitGroup
	errs := make([]error, schedWriters)
	for i := range schedWriters {
		w := &schedWriter{id: i + 1, url: wurl, aggs: aggs, st: r.st, led: r.led, next: map[string]int{},
			rng: rand.New(rand.NewPCG(r.plan.Seed, uint64(i+1)))}
		r.writers = append(r.writers, w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.run(ctx, r.stopWriters, r.opts.EventsPerSec/schedWriters)
		}()
	}
	go func() {
		wg.Wait()
		r.writersDone <- errors.Join(errs...)
	}()
}

// stopWritersWait stops the writers and returns their error.
func (r *schedRun) stopWritersWait() error {
	if r.writersDone == nil {
		return nil
	}
	close(r.stopWriters)
	err := <-r.writersDone
	r.writersDone = nil
	var txns, rollbacks, uncertain, reconnects int64
	var waits []writerWait
	for _, w := range r.writers {
		waits = append(waits, w.waits...)
		txns += w.txns.Load()
		rollbacks += w.rollbacks.Load()
		uncertain += w.uncertain.Load()
		reconnects += w.reconnects.Load()
	}
	r.note("writers: %d transactions committed, %d rolled back, %d with no answer looked up, %d reconnects", txns, rollbacks, uncertain, reconnects)
	r.waits = waitStats(waits)
	if r.locks != nil {
		var lerr error
		r.waits.BlockedByRelay, r.waits.BlockedBy, lerr = r.locks.end()
		r.locks = nil
		err = errors.Join(err, lerr)
	}
	return err
}

// finish stops the writers, waits for the relay to deliver everything,
// stops it with SIGTERM and checks Kafka against the ledger.
func (r *schedRun) finish(ctx context.Context) (Verdict, error) {
	werr := r.stopWritersWait()
	if r.kafka == nil {
		return Verdict{}, werr
	}
	committed, aborted := r.led.snapshot()
	deadline := time.Now().Add(r.catchUp())
	var v Verdict
	for {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		recs, err := sandbox.ReadAll(rctx, r.kafka.brokers(), r.topic)
		cancel()
		if err != nil {
			return v, errors.Join(werr, fmt.Errorf("read topic %s: %w", r.topic, err))
		}
		dead, err := r.deadLetters(ctx)
		if err != nil {
			return v, errors.Join(werr, err)
		}
		v = r.check(committed, aborted, recs, dead)
		if v.Lost == 0 || time.Now().After(deadline) || sleep(ctx, 500*time.Millisecond) != nil {
			break
		}
	}
	if v.Lost > 0 {
		werr = errors.Join(werr, fmt.Errorf("%d events missing %v after the writers stopped: %s", v.Lost, r.catchUp(), r.diagnose(ctx)))
	}
	if r.relay == nil || !r.relay.Running() {
		return v, werr
	}
	if err := r.stopRelay(ctx, "term"); err != nil {
		return v, errors.Join(werr, fmt.Errorf("final stop: %w", err))
	}
	// Read once more after the clean stop: it may not add anything.
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	recs, err := sandbox.ReadAll(rctx, r.kafka.brokers(), r.topic)
	if err != nil {
		return v, errors.Join(werr, fmt.Errorf("read topic %s: %w", r.topic, err))
	}
	dead, err := r.deadLetters(ctx)
	if err != nil {
		return v, errors.Join(werr, err)
	}
	return r.check(committed, aborted, recs, dead), werr
}

// check checks the stream's records against the ledger and the replays'
// records against their windows.
func (r *schedRun) check(committed, aborted map[string]ledgerEvent, recs []sandbox.Record, dead []deadLetter) Verdict {
	stream, replayed := splitReplayed(recs, r.replays)
	v := checkLedger(committed, aborted, stream, dead, r.deadLetterAllowed)
	checkReplays(&v, committed, r.replays, replayed)
	return v
}

// beforeSnapshot fills the tables before the relay's first start creates
// its slot with --snapshot initial: the writers run (and go on through the
// snapshot) and a bulk burst writes outbox_events.
//
// Messages wait until the snapshot is done: a message has no row, so one
// committed before the slot exists is in no snapshot and never streamed.
func (r *schedRun) beforeSnapshot(ctx context.Context) error {
	r.st.mu.Lock()
	r.st.messages = false
	r.st.mu.Unlock()
	r.startWriters(ctx)
	if err := r.bulkBurst(ctx, "s", 0); err != nil {
		return err
	}
	// Some of the writers' transactions too, whatever the machine's pace.
	ctx, cancel := context.WithTimeout(ctx, warmupTimeout)
	defer cancel()
	for {
		var n int64
		for _, w := range r.writers {
			n += w.txns.Load()
		}
		if n >= 20 {
			return nil
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("the writers committed %d transactions: %w", n, err)
		}
	}
}

// deadLetters reads the relay's dead letters in the schedule's database
// (the primary's, where a relay on a standby writes them too).
func (r *schedRun) deadLetters(ctx context.Context) ([]deadLetter, error) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(qctx, r.url)
	if err != nil {
		return nil, fmt.Errorf("read the dead letters: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(qctx, `SELECT event_id, error_code FROM public.cdc_relay_dead_letters`)
	if err != nil {
		return nil, fmt.Errorf("read the dead letters: %w", err)
	}
	dead, err := pgx.CollectRows(rows, pgx.RowToStructByPos[deadLetter])
	if err != nil {
		return nil, fmt.Errorf("read the dead letters: %w", err)
	}
	return dead, nil
}

// codeUnattributed is the dead letter code of a former partition's row the
// relay cannot attribute (decoder.CodeUnattributed).
const codeUnattributed = "unattributed_partition"

// deadLetterAllowed is the schedule's deadLetterAllowed: docs/guarantee.md
// ("Rows of a former partition are never skipped silently") lets the relay
// dead-letter as unattributed_partition only a row of a partition detached
// or dropped before it read the row; here, one a step at or after the
// row's detached or dropped. No other dead letter is promised.
func (r *schedRun) deadLetterAllowed(ev ledgerEvent, code string) string {
	if code != codeUnattributed {
		return "no dead letter code is allowed for a schedule's rows but " + codeUnattributed + " of a former partition"
	}
	if ev.bucket == 0 {
		return "not a row of a partition"
	}
	for i, s := range r.plan.Steps {
		if (s.Op == "partition-detach" || s.Op == "partition-drop") && s.Bucket == ev.bucket && i+1 >= ev.Step {
			return ""
		}
	}
	return fmt.Sprintf("no step detached or dropped %s after the row was written", partitionName(ev.bucket))
}

// scheduleRequestTimeout is the relay's --request-timeout in a schedule.
const scheduleRequestTimeout = 5 * time.Second

// minScheduleCatchUp is the least catch-up time of a schedule: after the
// broker stopped reading a connection, the relay notices by its request
// timeout, and the schedule may end right after that step; then it retries
// with backoff and the broker takes the backlog.
const minScheduleCatchUp = scheduleRequestTimeout + 25*time.Second

// catchUp is how long the relay gets to deliver after the writers stopped.
func (r *schedRun) catchUp() time.Duration { return max(r.opts.CatchUp, minScheduleCatchUp) }

// diagnose says where the relay and its slot stand.
func (r *schedRun) diagnose(ctx context.Context) string {
	state := fmt.Sprintf("relay exited with code %d", r.relay.ExitCode())
	if r.relay.Running() {
		state = fmt.Sprintf("relay running, /readyz %d", r.relay.Readyz(ctx))
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(qctx, r.slotURL)
	if err != nil {
		return state
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var confirmed, wal string
	// On a standby the WAL end is what it replayed.
	if err := conn.QueryRow(qctx, `SELECT coalesce(confirmed_flush_lsn::text, ''),
		(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text
		FROM pg_replication_slots WHERE slot_name = $1`, r.slot).Scan(&confirmed, &wal); err != nil {
		return fmt.Sprintf("%s, read slot: %v", state, err)
	}
	return fmt.Sprintf("%s, slot confirmed %s of WAL %s", state, confirmed, wal)
}

// teardown stops everything and drops the slot and the database.
func (r *schedRun) teardown() {
	_ = r.stopWritersWait()
	if r.relay != nil {
		r.relay.Kill()
	}
	if r.kafka != nil {
		r.kafka.close()
	}
	if r.url == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if r.standby != nil {
		_ = r.standby.Close()
		_ = r.env.pg.Exec(ctx, "postgres", `SELECT pg_drop_replication_slot($1)`, r.slot+"_phys")
	}
	_ = r.env.pg.Exec(ctx, "postgres", `SELECT pg_terminate_backend(active_pid, 5000) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, r.slot)
	_ = r.env.pg.Exec(ctx, "postgres", `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, r.slot)
	_ = r.env.pg.Exec(ctx, "postgres", "DROP DATABASE IF EXISTS "+pgx.Identifier{r.db}.Sanitize()+" WITH (FORCE)")
}

// RelayLogTail returns the last n lines of the run's relay log, or "".
func (r ScheduleResult) RelayLogTail(n int) string {
	return Result{LogFile: r.LogFile}.RelayLog(n)
}

// relayURL is u as the relay connects with it: under relayAppName, which the
// lock watch looks for.
func relayURL(u string) string {
	if v, err := withAppName(u, relayAppName); err == nil {
		return v
	}
	return u
}
