package chaos

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/verify"
)

// Timing of a run's phases.
const (
	readyTimeout   = 30 * time.Second // relay start to /readyz 200
	warmupTimeout  = 30 * time.Second // load start to the first record in Kafka
	tailAfterFault = 500 * time.Millisecond
	stopTimeout    = 10 * time.Second // SIGTERM to exit 0
	setupTimeout   = 30 * time.Second
	// relayShutdownTimeout is the relay's --shutdown-timeout: it exits within
	// it whatever Kafka does, so stopTimeout leaves 2 s for a loaded machine
	// to run and reap the process (with the relay's default, 10 s, a stop
	// while the broker answered nothing ended just past stopTimeout).
	relayShutdownTimeout = stopTimeout - 2*time.Second
)

// run is one scenario's world: its database, slot, topic, Kafka, proxies,
// relay process and writer. The scenario's inject counts faults and adds
// notes through it.
type run struct {
	env  *Env
	sc   Scenario
	opts Options
	rng  *rand.Rand // used by the scenario's goroutine only

	db, url  string // the database, as the writer reaches it
	relayURL string // as the relay reaches it (through pgProxy, with options)
	slot     string
	topic    string
	kafka    *kafkaEnv
	pgProxy  *netProxy
	relay    *relayproc.Process
	args     []string
	writer   *verify.Writer

	stopWriter chan struct{}
	stopOnce   sync.Once
	writerErr  <-chan error

	faults int
	notes  []string
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

func newRun(e *Env, s Scenario) *run {
	h := fnv.New64a()
	h.Write([]byte(s.Name))
	name := nonIdent.ReplaceAllString(strings.ToLower(s.Name), "_")
	opts := e.opts
	opts.Kills, opts.Episodes, opts.Window = s.size.kills, s.size.episodes, s.size.window
	return &run{
		env: e, sc: s, opts: opts,
		rng:   rand.New(rand.NewPCG(e.opts.Seed, h.Sum64())),
		db:    "chaos_" + name,
		slot:  "chaos_" + name,
		topic: "outbox.chaos." + name,
	}
}

// note adds a line to the result's notes.
func (r *run) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// between returns a random duration in [lo, hi).
func (r *run) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.rng.Int64N(int64(hi-lo)))
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// execute runs the scenario's phases and fills res.
func (r *run) execute(ctx context.Context, res *Result) {
	if err := r.setup(ctx); err != nil {
		res.Err = err
		return
	}
	if r.sc.prepare != nil {
		if err := r.sc.prepare(ctx, r); err != nil {
			res.Err = fmt.Errorf("prepare: %w", err)
			return
		}
	}
	r.args = r.relayArgs()
	r.relay = relayproc.New(relayproc.Options{Path: r.opts.RelayBin, Args: r.args, AddMetricsAddr: true})
	if err := r.relay.Start(); err != nil {
		res.Err = err
		return
	}
	if err := r.relay.WaitReady(ctx, readyTimeout); err != nil {
		res.Err = fmt.Errorf("first start: %w", err)
		return
	}
	r.startLoad(ctx)
	wctx, cancel := context.WithTimeout(ctx, warmupTimeout)
	_, err := sandbox.WaitForRecords(wctx, r.kafka.brokers, 1, r.topic)
	cancel()
	if err != nil {
		res.Err = fmt.Errorf("warm-up: no record in Kafka: %w", err)
		return
	}

	injectErr := r.sc.inject(ctx, r)
	if injectErr == nil {
		injectErr = sleep(ctx, tailAfterFault)
	}
	writeErr := r.stopLoad()
	st := r.writer.Stats()
	if st.Reconnects > 0 || st.Uncertain > 0 {
		r.note("writer reconnected %d times, %d commits with no answer (%d of them had committed)", st.Reconnects, st.Uncertain, st.Uncertain-st.Failed)
	}
	// Even when the scenario stopped early, check what was delivered: the
	// fault that stopped it may have cost events too.
	res.Err = errors.Join(injectErr, writeErr)
	check, _, err := verify.Await(ctx, r.kafka.brokers, r.topic, r.writer.Committed, r.opts.CatchUp, 500*time.Millisecond)
	if err != nil {
		res.Err = errors.Join(res.Err, err)
		return
	}
	res.Committed = check.Committed
	res.Lost = len(check.Missing)
	res.Duplicated = check.Duplicates
	res.OrderViolations = len(check.OrderViolations)
	res.Unexpected = check.Unknown + len(check.Mismatches)
	res.Samples = append(res.Samples, first(check.OrderViolations, 5)...)
	res.Samples = append(res.Samples, first(check.Mismatches, 5)...)
	if res.Lost > 0 {
		res.Samples = append(res.Samples, "missing event ids: "+strings.Join(first(check.Missing, 5), ", "))
		res.Err = errors.Join(res.Err, fmt.Errorf("%d events missing %v after the load stopped: %s", res.Lost, r.opts.CatchUp, r.diagnose(ctx)))
	}
	if !r.relay.Running() {
		res.Err = errors.Join(res.Err, fmt.Errorf("relay exited with code %d", r.relay.ExitCode()))
		return
	}
	if err := r.relay.Stop(stopTimeout); err != nil {
		res.Err = errors.Join(res.Err, err)
	}
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }

// setup creates the database with the migrations applied, the Kafka, the
// Postgres proxy when the scenario needs one, and the writer.
func (r *run) setup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	var err error
	if r.url, err = r.env.pg.CreateDatabase(ctx, r.db); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	for _, sql := range r.env.migrations {
		if err := r.env.pg.Exec(ctx, r.db, sql); err != nil {
			return fmt.Errorf("setup: apply migrations: %w", err)
		}
	}
	r.relayURL = r.url
	if r.sc.pgProxy {
		u, err := url.Parse(r.url)
		if err != nil {
			return fmt.Errorf("setup: parse postgres url: %w", err)
		}
		if r.pgProxy, err = startProxy(r.env.proxies, "pg-"+r.db, "127.0.0.1:0", u.Host); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		u.Host = r.pgProxy.addr()
		r.relayURL = u.String()
	}
	if r.kafka, err = startKafka(r.sc.kafka, r.topic, r.env.proxies); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	r.writer = verify.NewWriter(r.url, "agg-", r.opts.Aggregates, r.rng.Uint64())
	r.writer.Reconnect = true
	return nil
}

// relayArgs returns the relay's run arguments (without --metrics-addr): the
// defaults, with the scenario's flags replacing or extending them.
func (r *run) relayArgs() []string {
	flags := [][2]string{
		{"--pg-url", r.relayURL},
		{"--kafka-brokers", strings.Join(r.kafka.brokers, ",")},
		{"--topic", r.topic},
		{"--slot", r.slot},
		{"--log-format", "json"},
		{"--status-interval", "200ms"},
		{"--retry-cap", "1s"},
		{"--shutdown-timeout", relayShutdownTimeout.String()},
		{"--relay-name", "chaos"},
		{"--delivery", "effectively-once"}, // the default, named so the log says it
	}
	extra := r.sc.relayArgs
	for i := 0; i+1 < len(extra); i += 2 {
		replaced := false
		for j := range flags {
			if flags[j][0] == extra[i] {
				flags[j][1], replaced = extra[i+1], true
			}
		}
		if !replaced {
			flags = append(flags, [2]string{extra[i], extra[i+1]})
		}
	}
	args := []string{"run"}
	for _, f := range flags {
		args = append(args, f[0], f[1])
	}
	return args
}

// startLoad starts the writer at the configured rate.
func (r *run) startLoad(ctx context.Context) {
	r.stopWriter = make(chan struct{})
	r.writerErr = r.writer.GoRun(ctx, r.stopWriter, 0, r.opts.EventsPerSec)
}

// stopLoad stops the writer and returns its error.
func (r *run) stopLoad() error {
	if r.writerErr == nil {
		return nil
	}
	r.stopOnce.Do(func() { close(r.stopWriter) })
	err := <-r.writerErr
	r.writerErr = nil
	return err
}

// diagnose says where the relay stands, for a run that did not deliver
// everything.
func (r *run) diagnose(ctx context.Context) string {
	var parts []string
	if r.relay.Running() {
		parts = append(parts, fmt.Sprintf("relay running, ready=%v", r.relay.Readyz(ctx) == http.StatusOK))
	} else {
		parts = append(parts, fmt.Sprintf("relay exited with code %d", r.relay.ExitCode()))
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(qctx, r.url)
	if err != nil {
		return strings.Join(append(parts, "postgres: "+err.Error()), ", ")
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var confirmed, wal string
	var active bool
	err = conn.QueryRow(qctx, `SELECT coalesce(confirmed_flush_lsn::text, ''), pg_current_wal_lsn()::text, active
		FROM pg_replication_slots WHERE slot_name = $1`, r.slot).Scan(&confirmed, &wal, &active)
	if err != nil {
		return strings.Join(append(parts, "read slot: "+err.Error()), ", ")
	}
	return strings.Join(append(parts, fmt.Sprintf("slot confirmed %s of WAL %s, active=%v", confirmed, wal, active)), ", ")
}

// teardown stops everything the run started and drops its slot and
// database.
func (r *run) teardown() {
	_ = r.stopLoad() // reported by execute when it ran
	if r.relay != nil {
		r.relay.Kill()
	}
	if r.pgProxy != nil {
		r.pgProxy.close()
	}
	if r.kafka != nil {
		r.kafka.close()
	}
	if r.url == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Best effort: the next CreateDatabase of the same name drops it anyway.
	_ = r.env.pg.Exec(ctx, "postgres", `SELECT pg_terminate_backend(active_pid, 5000) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, r.slot)
	_ = r.env.pg.Exec(ctx, "postgres", `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, r.slot)
	_ = r.env.pg.Exec(ctx, "postgres", "DROP DATABASE IF EXISTS "+pgx.Identifier{r.db}.Sanitize()+" WITH (FORCE)")
}

// metric reads one sample of the relay's metrics (0 when unavailable).
func (r *run) metric(ctx context.Context, sample string) float64 {
	m, err := r.relay.Scrape(ctx)
	if err != nil {
		return 0
	}
	return m[sample]
}

// waitMetricAbove waits up to timeout until sample exceeds v, and reports
// whether it did.
func (r *run) waitMetricAbove(ctx context.Context, sample string, v float64, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if r.metric(ctx, sample) > v {
			return true
		}
		if time.Now().After(deadline) || sleep(ctx, 100*time.Millisecond) != nil {
			return false
		}
	}
}
