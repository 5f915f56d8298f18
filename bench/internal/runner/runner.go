// Package runner runs the whole benchmark in one process: a throwaway Postgres
// 15, an in-process Kafka broker (kfake), and, as separate processes so the
// kernel accounts their CPU and memory, the limit reader (the speed limit), the
// relay binary and the poller it replaces. It measures backlog drains, latency
// under steady load and what Postgres spends, and returns the results.
package runner

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/bench/internal/hoststat"
	"github.com/cdc-relay/cdc-relay/bench/internal/latency"
	"github.com/cdc-relay/cdc-relay/bench/internal/pgstat"
	"github.com/cdc-relay/cdc-relay/bench/internal/results"
	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// Names shared by the phases.
const (
	modulePath       = "github.com/cdc-relay/cdc-relay"
	publication      = "cdc_relay_outbox"
	relayTopicPrefix = "bench."
	pollerTopicPrfx  = "poller."
	drainAggType     = "drain" // aggregate_type, and so topic suffix, of the backlog
	stopGrace        = 15 * time.Second
	exitWait         = 10 * time.Second // for a child that exits by itself
	// DoneLine starts the line the reader and poller children print when they
	// reached their count.
	DoneLine = "done"
	// LatencyLine starts the reader's last line with -latency: the events it
	// read and the JSON of a latency.Summary.
	LatencyLine = "latency"
)

// Config configures a run.
type Config struct {
	Events     int // backlog size of a drain cell (fewer for large payloads)
	Aggregates int // distinct aggregate ids
	// The drain cells' dimensions: the first value of each is the
	// headline's, and every other value is a cell that differs from the
	// headline in that dimension only (see DrainCells).
	TxnSizes        []int // events per transaction
	PartitionCounts []int // partitions of every topic
	TopicCounts     []int // aggregate types, one topic each
	Payloads        []int // approximate payload bytes
	// TableRows are the table cells' sizes: a replay cell and a join cell of
	// each (issue 42 point 7).
	TableRows []int
	// TableTimeout bounds each table cell's replay or join; 0: two minutes
	// plus 2 ms a row (500 rows/s).
	TableTimeout time.Duration
	// Rates and LatencyTxnSizes make the steady-load cells (LatencyCells).
	Rates           []int
	LatencyTxnSizes []int
	Duration        time.Duration // of each steady load
	Quick           bool          // recorded only
	// Cells, when not empty, are the only cells that run (CellNames).
	Cells []string
	// DeliveryRounds is how many times the relay's drain and latency runs
	// are repeated in each --delivery mode, alternating
	// effectively-once, at-least-once, effectively-once, … (ABAB).
	DeliveryRounds int
	// ReconcilePartitions are the partition counts of the start-up cells:
	// the relay drains the headline backlog into a topic of that many
	// partitions, is killed -9 and restarted.
	ReconcilePartitions []int

	PollerBatch int
	PollerIdle  time.Duration
	// QuietWait bounds how long each measurement waits for processes outside
	// the benchmark to use less than a tenth of the machine; 0 measures at once.
	QuietWait time.Duration

	// ProfileDir, when set, receives a CPU and a heap profile of the
	// relay's first effectively-once drain of every drain cell
	// (<cell>-cpu.pprof, <cell>-heap.pprof), and the CPU profile's split by
	// part is printed and recorded.
	ProfileDir string

	// RelayLogDir, when set, receives each relay process's log as
	// <slot>.log (at --log-level info), to see what a run did (a catch-up's
	// batches, a switch to streaming).
	RelayLogDir string

	// PGSocket makes the relay and the limit reader connect through the
	// server's Unix socket instead of loopback TCP.
	PGSocket bool

	// RelayBin is a cdc-relay binary to measure; "" builds ./cmd/cdc-relay.
	RelayBin string
	// RelayFlags are added to the flags of every relay and limit reader run
	// (e.g. --read-coalesce 0), after the benchmark's own.
	RelayFlags []string
	// BrokerLatency delays every answer of the broker by this much, as a
	// network to a remote broker would (one way); 0: none.
	BrokerLatency time.Duration
	// Self is the benchmark executable, re-executed as "reader" and "poller".
	Self string
	// Out receives progress lines.
	Out io.Writer
}

// PGSettings are the server settings of the run, on top of sandbox's
// (wal_level=logical, fsync=off, full_page_writes=off).
var PGSettings = map[string]string{
	"shared_buffers":     "256MB",
	"max_wal_size":       "4GB",
	"checkpoint_timeout": "30min",
	"synchronous_commit": "on",
	// The poller reads commit times with pg_xact_commit_timestamp, so both
	// designs' latency starts at the same instant.
	"track_commit_timestamp": "on",
}

// bench is one run's state.
type bench struct {
	cfg      Config
	out      io.Writer
	started  time.Time
	root     string // module root
	tmp      string
	relayBin string
	pg       *sandbox.Postgres
	cpu      *pgstat.CPUSampler
	brokers  []string
	res      *results.Results
	// relayURL is the database the relay and the limit reader read now (a
	// drain cell's, the steady loads'); pollerURL the poller's; cell is the
	// drain cell running.
	relayURL  string
	pollerURL string
	cell      DrainCell
	// limitSeconds is the current cell's first limit drain's length: how long
	// the relay's CPU profile of the cell lasts (bench -profile).
	limitSeconds float64
}

// Run runs every phase in order and returns the evaluated results. It stops
// every process it started and removes its temporary files before returning,
// also when ctx is canceled.
func Run(ctx context.Context, cfg Config) (*results.Results, error) {
	b := &bench{cfg: cfg, out: cfg.Out, started: time.Now()}
	if b.out == nil {
		b.out = io.Discard
	}
	head := cfg.Headline()
	b.res = &results.Results{
		Started: b.started,
		Host:    results.Host{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()},
		Config: results.Config{
			Events: cfg.Events, Aggregates: cfg.Aggregates, TxnSize: head.TxnSize, Payload: head.Payload,
			Rates: cfg.Rates, LatencySeconds: cfg.Duration.Seconds(), WarmupSeconds: b.warmup().Seconds(),
			Quick: cfg.Quick, RelayFlags: cfg.RelayFlags, PGSocket: cfg.PGSocket, PollerBatch: cfg.PollerBatch, PollerIdleMs: float64(cfg.PollerIdle) / float64(time.Millisecond),
			Partitions: head.Partitions, PGSettings: PGSettings, QuietWaitSeconds: cfg.QuietWait.Seconds(),
			DeliveryRounds: cfg.DeliveryRounds, ReconcilePartitions: cfg.ReconcilePartitions,
			TxnSizes: cfg.TxnSizes, PartitionSet: cfg.PartitionCounts, TopicCounts: cfg.TopicCounts, Payloads: cfg.Payloads,
			LatencyCells: b.latencyCells(), Cells: cfg.Cells, TableRows: cfg.TableRows,
		},
	}
	var err error
	if b.res.Host.LoadAvgStart, err = hoststat.LoadAvg(); err != nil {
		return nil, err
	}
	if b.res.Host.LoadAvgStart > float64(runtime.NumCPU())/2 {
		b.say("note: load average %.1f on %d CPUs before the start: other processes compete for the CPUs, expect noisy figures", b.res.Host.LoadAvgStart, runtime.NumCPU())
	}
	if b.root, err = moduleRoot(); err != nil {
		return nil, err
	}
	if b.tmp, err = os.MkdirTemp("", "cdc-relay-bench-"); err != nil {
		return nil, fmt.Errorf("create temp dir: %w", err)
	}
	defer os.RemoveAll(b.tmp)

	if cfg.RelayBin != "" {
		if b.relayBin, err = filepath.Abs(cfg.RelayBin); err != nil {
			return nil, fmt.Errorf("locate relay binary: %w", err)
		}
		if _, err := os.Stat(b.relayBin); err != nil {
			return nil, fmt.Errorf("relay binary (-relay-bin): %w", err)
		}
		b.say("measuring the relay binary %s", b.relayBin)
	} else {
		if err := b.buildRelay(ctx); err != nil {
			return nil, err
		}
	}
	b.say("starting PostgreSQL 15 and the in-process Kafka broker (kfake)")
	if b.pg, err = sandbox.StartPostgres(ctx, sandbox.PGOptions{Settings: PGSettings}); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	defer func() {
		if err := b.pg.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: stop postgres: %v\n", err)
		}
	}()
	if b.pg.External() {
		return nil, fmt.Errorf("the benchmark measures Postgres processes through /proc: unset %s", sandbox.EnvPGURL)
	}
	// initdb leaves the catalogs of template1 and postgres unanalysed;
	// autovacuum's first visit then ANALYZEs them, ~120 KiB of WAL that
	// landed in the first relay drain's window and was counted as the relay's.
	for _, db := range []string{"template1", "postgres"} {
		if err := b.pg.Exec(ctx, db, "VACUUM (ANALYZE)"); err != nil {
			return nil, fmt.Errorf("vacuum database %s before measuring: %w", db, err)
		}
	}
	if b.cpu, err = pgstat.NewCPUSampler(b.pg.DataDir()); err != nil {
		return nil, err
	}
	if b.res.Host.Postgres, err = serverVersion(ctx, b.pg.URL("postgres")); err != nil {
		return nil, err
	}
	// The broker persists its log although nothing here restarts it: kept in
	// memory (InMemory), the full matrix's records outgrew this machine's
	// 24 GiB, as kfake then keeps every batch. Persisting costs ~6 µs of the
	// machine's CPU per partition batch (internal/sink's BenchmarkSinkPaced),
	// which the broker spends beside the relay at 256 partitions.
	kafka, err := sandbox.StartKafka(sandbox.KafkaOptions{Partitions: head.Partitions, NoAutoCreate: true,
		BrokerConfigs: map[string]string{"message.max.bytes": strconv.Itoa(brokerMaxMessageBytes)},
		Latency:       cfg.BrokerLatency})
	if err != nil {
		return nil, fmt.Errorf("start kafka: %w", err)
	}
	defer kafka.Close()
	b.brokers = kafka.Brokers()

	if err := b.drainPhase(ctx); err != nil {
		return nil, err
	}
	if err := b.tablePhase(ctx); err != nil {
		return nil, err
	}
	if err := b.latencyPhase(ctx); err != nil {
		return nil, err
	}
	b.res.Seconds = time.Since(b.started).Seconds()
	if b.res.Host.LoadAvgEnd, err = hoststat.LoadAvg(); err != nil {
		return nil, err
	}
	b.res.Notes = b.notes()
	b.res.Evaluate()
	return b.res, nil
}

// say prints a progress line prefixed with the time since the start.
func (b *bench) say(format string, args ...any) {
	fmt.Fprintf(b.out, "[%6.1fs] %s\n", time.Since(b.started).Seconds(), fmt.Sprintf(format, args...))
}

// warmup is the start of each latency run whose samples are not kept.
func (b *bench) warmup() time.Duration { return min(time.Second, b.cfg.Duration/5) }

// brokerMaxMessageBytes is the broker's message.max.bytes: room for the
// 1 MiB-payload cells (the relay sends an event larger than
// --batch-max-bytes alone in its batch).
const brokerMaxMessageBytes = 8 << 20

// latAggType is the aggregate type, and so topic suffix, of a steady load.
func latAggType(lc results.LatencyCell) string {
	return "lat" + strconv.Itoa(lc.Rate) + "x" + strconv.Itoa(lc.TxnSize)
}

// latencyCells are the selected steady-load cells.
func (b *bench) latencyCells() []results.LatencyCell {
	var out []results.LatencyCell
	for _, lc := range b.cfg.LatencyCells() {
		if b.cfg.selected(lc.Name()) {
			out = append(out, lc)
		}
	}
	return out
}

// deliveries are the relay's --delivery modes the benchmark compares, in the
// order each round runs them.
var deliveries = []string{results.EffectivelyOnce, results.AtLeastOnce}

// relayRun is one of the relay's measured runs: a delivery mode in a round.
type relayRun struct {
	delivery string
	round    int
}

// relayRuns lists the relay's drain and latency runs in the order they run:
// each round runs every delivery mode (ABAB), so machine noise hits both.
func (b *bench) relayRuns() []relayRun {
	var out []relayRun
	for round := 1; round <= max(1, b.cfg.DeliveryRounds); round++ {
		for _, d := range deliveries {
			out = append(out, relayRun{delivery: d, round: round})
		}
	}
	return out
}

// tag is a short name of the run for slots and topics: eo1, alo1, eo2, …
func (r relayRun) tag() string {
	short := "eo"
	if r.delivery == results.AtLeastOnce {
		short = "alo"
	}
	return short + strconv.Itoa(r.round)
}

// String names the run in progress lines and results.
func (r relayRun) String() string { return fmt.Sprintf("%s #%d", r.delivery, r.round) }

// drainSlot is the slot the run drains a cell's backlog from, created with
// the cell's other slots before the backlog was committed.
func (r relayRun) drainSlot() string { return "relay_" + r.tag() }

// latSlot is the slot of the run's latency loads; the relay creates it when it
// starts, at the end of the WAL.
func (r relayRun) latSlot() string { return "relay_lat_" + r.tag() }

// topicPrefix starts the names of the run's topics in a drain cell (cell
// tag) or the steady loads ("lat"): they go to topicPrefix + aggregate_type.
func (r relayRun) topicPrefix(cell string) string {
	return relayTopicPrefix + cell + "." + r.tag() + "."
}

// moduleRoot finds the repository root from the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module "+modulePath+"\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("find module root: run the benchmark inside the %s repository", modulePath)
		}
		dir = parent
	}
}

// RepoRoot is the repository's root directory, found from the working
// directory.
func RepoRoot() (string, error) { return moduleRoot() }

// ResultsDir is where results are written: bench/results of the repository.
func ResultsDir() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "bench", "results"), nil
}

func (b *bench) buildRelay(ctx context.Context) error {
	// Built as the Dockerfile builds the shipped binary: static, without
	// symbol tables.
	b.say("building the relay (CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' ./cmd/cdc-relay, as the Dockerfile does)")
	bin, err := relayproc.Build(ctx, b.tmp, relayproc.BuildOptions{Release: true})
	if err != nil {
		return fmt.Errorf("build relay: %w", err)
	}
	b.relayBin = bin
	return nil
}

func execSQL(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("run %q: %w", sql, err)
	}
	return nil
}

func serverVersion(ctx context.Context, url string) (string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "", fmt.Errorf("read server version: %w", err)
	}
	return v, nil
}

// notes explain how to read the figures.
func (b *bench) notes() []string {
	return []string{
		fmt.Sprintf("one %d-CPU machine runs everything: Postgres, the Kafka broker (kfake, inside the benchmark process, persisting its log: a file write per partition batch), the latency consumer, the load generator and the process measured", runtime.NumCPU()),
		"limit reader = the relay's own read path (internal/replication's stream loop, status updates and keepalives; internal/decoder and the topic router configured from the relay's flags, cli.RelayConfig) feeding a handler that counts: everything the relay does but Kafka and the checkpoint store; its slot is created by the same statement as the relay's, and it drains before and after the relay, the faster run kept",
		"rate = events / (process start → last event done): the relay until cdc_relay_events_published_total (Kafka acks=all) reached N, polled every 50 ms near the end (a quarter of the time left, at most 1 s, before); limit reader and poller until they reported N; start-up is included",
		"CPU µs/ev: getrusage of the child process over its whole life (utime+stime); peak RSS: its VmHWM, sampled every 100 ms and before it is stopped; walsender µs/ev and µs/txn: utime+stime in /proc/<pid>/stat of the slot's walsender (pg_replication_slots.active_pid; a new process per connection) when the last event was done, per event and per transaction: the ceiling of any logical-replication reader",
		"PG CPU µs/ev: utime+stime of the postmaster and all its children (live ones from /proc/<pid>/stat, exited ones through the postmaster's cutime/cstime) from just before the process started until its sessions ended, background processes included; WAL = pg_current_wal_insert_lsn() difference over the same window",
		fmt.Sprintf("latency = receive time − commit_time header: commit → consumer-visible, an upper bound of commit → Kafka ack; the limit reader's is commit → decoded, measured alone on its own slot after the relay stopped (the floor Postgres' walsender sets); the first %s of each run is warm-up and not counted; load: 4 connections, each cell's events per autocommitted INSERT; tail: the %s windows of commit time that hold the samples at or above p99 (a few: the tail is a few stalls), and the longest pause between two commits (Postgres or the machine stopped committing)", b.warmup(), latency.TailWindow),
		"CPU pressure: the share of a window in which some runnable task waited for a CPU (Linux PSI, /proc/pressure/cpu \"some\"): how oversubscribed the machine was, which explains tails and rates better than its load average",
		fmt.Sprintf("poller: BEGIN; SELECT … ORDER BY created_at, id LIMIT %d FOR UPDATE SKIP LOCKED; produce with kafka-go's Writer (acks=all, murmur2, whole batch per call, 1 ms batch timeout); DELETE the published rows (delete, not UPDATE published_at); COMMIT; sleeps %s when a poll finds nothing; commit_time from pg_xact_commit_timestamp(xmin)", b.cfg.PollerBatch, b.cfg.PollerIdle),
		"Postgres µs/ev by process: walsender = logical decoding for the limit reader or the relay; backend = client sessions (the poller's SELECT/DELETE, the load generator's INSERTs); exited = sessions that ended before the sample (e.g. the load generator's at the end of a latency run)",
		"Postgres runs with sandbox's fsync=off and full_page_writes=off, so WAL figures hold no full-page images (the poller's DELETEs would add some after every checkpoint) and commits never wait for a disk",
	}
}
