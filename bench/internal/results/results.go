// Package results holds what one benchmark run measured, its JSON form, the
// table printed at the end and the check of the targets.
package results

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cdc-relay/cdc-relay/bench/internal/latency"
)

// The relay's --delivery modes the benchmark compares.
const (
	EffectivelyOnce = "effectively-once"
	AtLeastOnce     = "at-least-once"
)

// Results is one run.
type Results struct {
	Started time.Time `json:"started"`
	Seconds float64   `json:"seconds"` // wall time of the whole run
	Host    Host      `json:"host"`
	Config  Config    `json:"config"`

	BacklogLoadSeconds float64 `json:"backlog_load_seconds"` // committing the relay's backlog
	PollerLoadSeconds  float64 `json:"poller_load_seconds"`  // committing the poller's copy

	// Cells are the drain cells of the matrix in the order they ran (see
	// Cell). The fields below, Limit to Poller, repeat the headline cell's.
	Cells []Cell `json:"cells,omitempty"`
	// FailedCells are drain and table cells that failed; the run went on
	// without them.
	FailedCells []FailedCell `json:"failed_cells,omitempty"`
	// TableCells are the replay and join cells (issue 42), in the order
	// they ran.
	TableCells []TableCell `json:"table_cells,omitempty"`

	// LimitRuns are the limit reader (the relay's read path) before and
	// after the relay, then the lean pglogrepl loop; Limit is the fastest.
	LimitRuns []Drain `json:"limit_runs"`
	Limit     Drain   `json:"limit"`
	// RelayRuns are the relay's drains in the order they ran: each round
	// drains once with --delivery effectively-once, then at-least-once.
	// Relay is the faster effectively-once drain (the default mode).
	RelayRuns []Drain `json:"relay_runs,omitempty"`
	Relay     Drain   `json:"relay"`
	Poller    Drain   `json:"poller"`
	// Delivery compares the relay's two delivery modes (Evaluate fills it).
	Delivery Delivery `json:"delivery"`
	// Reconcile is the relay's start-up reconciliation after a kill -9 in
	// the middle of a drain, per topic partition count.
	Reconcile []Reconcile `json:"reconcile,omitempty"`

	Latency []Latency `json:"latency"`
	Verify  []Verify  `json:"verify"`
	Ratios  Ratios    `json:"ratios"`
	Targets []Target  `json:"targets"`
	Notes   []string  `json:"notes"`
}

// Host describes the machine.
type Host struct {
	CPUs      int    `json:"cpus"`
	GoVersion string `json:"go_version"`
	Postgres  string `json:"postgres"`
	// 1-minute load average when the run started and ended.
	LoadAvgStart float64 `json:"loadavg_start"`
	LoadAvgEnd   float64 `json:"loadavg_end"`
}

// Config is how the run was configured.
type Config struct {
	Events         int     `json:"events"`
	Aggregates     int     `json:"aggregates"`
	TxnSize        int     `json:"txn_size"`
	Payload        int     `json:"payload_bytes"`
	Rates          []int   `json:"rates"`
	LatencySeconds float64 `json:"latency_seconds"`
	WarmupSeconds  float64 `json:"warmup_seconds"`
	Quick          bool    `json:"quick"`
	// RelayFlags were added to every relay and limit reader run.
	RelayFlags []string `json:"relay_flags,omitempty"`
	// PGSocket: the relay and the limit reader connected through the Unix socket.
	PGSocket     bool    `json:"pg_socket,omitempty"`
	PollerBatch  int     `json:"poller_batch"`
	PollerIdleMs float64 `json:"poller_idle_ms"`
	Partitions   int     `json:"partitions"`
	// QuietWaitSeconds bounds the wait for a quiet machine before each
	// measurement.
	QuietWaitSeconds float64           `json:"quiet_wait_seconds"`
	PGSettings       map[string]string `json:"pg_settings"`
	// DeliveryRounds is how often the relay's drain and latency runs ran in
	// each delivery mode, alternating (ABAB).
	DeliveryRounds int `json:"delivery_rounds"`
	// ReconcilePartitions are the partition counts of the kill -9 runs.
	ReconcilePartitions []int `json:"reconcile_partitions,omitempty"`
	// The matrix: the values of each dimension of the drain cells (the first
	// of each is the headline's), the steady-load cells, and the cells
	// selected with -cell ("" ran every one).
	TxnSizes     []int         `json:"txn_sizes,omitempty"`
	PartitionSet []int         `json:"partition_counts,omitempty"`
	TopicCounts  []int         `json:"topic_counts,omitempty"`
	Payloads     []int         `json:"payloads,omitempty"`
	LatencyCells []LatencyCell `json:"latency_cells,omitempty"`
	Cells        []string      `json:"cells,omitempty"`
	// TableRows are the table cells' sizes (a replay and a join cell each).
	TableRows []int `json:"table_rows,omitempty"`
}

// Shape is what a drain cell's backlog and topics look like.
type Shape struct {
	TxnSize    int `json:"txn_size"`   // events per transaction
	Partitions int `json:"partitions"` // of every topic
	Topics     int `json:"topics"`     // aggregate types, one topic each (the relay's topic template)
	Payload    int `json:"payload_bytes"`
}

// Cell is one drain cell of the matrix: one backlog of Shape, drained by
// the limit reader before and after the relay, by the relay in each delivery
// mode, and (a copy in another database) by the poller.
type Cell struct {
	Name         string `json:"name"`
	Shape        Shape  `json:"shape"`
	Events       int    `json:"events"`
	Transactions int    `json:"transactions"`
	// LimitRuns are the limit reader (the relay's read path) before and
	// after the relay, then the lean pglogrepl loop; Limit is the fastest.
	// Relay is the faster effectively-once drain.
	LimitRuns []Drain  `json:"limit_runs"`
	Limit     Drain    `json:"limit"`
	RelayRuns []Drain  `json:"relay_runs"`
	Relay     Drain    `json:"relay"`
	Poller    Drain    `json:"poller"`
	Verify    []Verify `json:"verify"`
	// RelayOverLimit is relay/limit of the drain rates; RelayOverLimitCPU
	// of the CPU per event; RelayOverPoller of the drain rates.
	RelayOverLimit    float64 `json:"relay_over_limit_rate"`
	RelayOverLimitCPU float64 `json:"relay_over_limit_cpu_per_event"`
	RelayOverPoller   float64 `json:"relay_over_poller_rate"`
	// DecodeAloneUSPerEvent is the CPU per event of decoding the backlog
	// with SQL in one backend, with no reader: the walsender's own work,
	// which serving a reader adds to.
	DecodeAloneUSPerEvent float64 `json:"decode_alone_us_per_event,omitempty"`
}

// FailedCell is a drain cell that failed, and why.
type FailedCell struct {
	Name  string `json:"name"`
	Error string `json:"error"`
}

// Fill computes the cell's ratios.
func (c *Cell) Fill() {
	c.RelayOverLimit = ratio(c.Relay.Rate, c.Limit.Rate)
	c.RelayOverLimitCPU = ratio(c.Relay.CPUPerEventUS, c.Limit.CPUPerEventUS)
	c.RelayOverPoller = ratio(c.Relay.Rate, c.Poller.Rate)
}

// LatencyCell is one steady load: events per second, events per transaction.
type LatencyCell struct {
	Rate    int `json:"rate"`
	TxnSize int `json:"txn_size"`
}

// Name is the cell's name for -cell: latency/rate=R,txn=T.
func (l LatencyCell) Name() string { return fmt.Sprintf("latency/rate=%d,txn=%d", l.Rate, l.TxnSize) }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Drain is one drain of the backlog by one consumer of it.
type Drain struct {
	Name string `json:"name"`
	// Delivery and Round name a relay drain's --delivery mode and round.
	Delivery      string  `json:"delivery,omitempty"`
	Round         int     `json:"round,omitempty"`
	Events        int     `json:"events"`
	Transactions  int     `json:"transactions,omitempty"`
	Seconds       float64 `json:"seconds"` // process start → last event done
	Rate          float64 `json:"rate"`    // events per second
	CPUSeconds    float64 `json:"cpu_seconds"`
	CPUPerEventUS float64 `json:"cpu_us_per_event"`
	PeakRSSBytes  int64   `json:"peak_rss_bytes"`
	// Postgres, over the process's whole life.
	PGCPUSeconds    float64 `json:"pg_cpu_seconds"`
	PGCPUPerEventUS float64 `json:"pg_cpu_us_per_event"`
	WALBytes        int64   `json:"wal_bytes"`
	WALPerEvent     float64 `json:"wal_bytes_per_event"`
	// WalsenderCPUSeconds is the CPU time (utime+stime from /proc) of the
	// walsender serving the drain's slot, over its life until the last event
	// was done: logical decoding, the ceiling of any logical-replication
	// reader. Per event and per transaction below (none for the poller).
	WalsenderCPUSeconds float64 `json:"walsender_cpu_seconds,omitempty"`
	WalsenderUSPerEvent float64 `json:"walsender_cpu_us_per_event,omitempty"`
	WalsenderUSPerTxn   float64 `json:"walsender_cpu_us_per_txn,omitempty"`
	// ReaderReads are the reading process's read system calls over its life
	// (syscr of /proc/<pid>/io: the socket reads, and the few other reads it
	// made), and per transaction: how finely it took the stream. An eager
	// reader wakes and reads for nearly every message, and so makes the
	// walsender send nearly every message alone (its send calls are not in
	// /proc/<pid>/io).
	ReaderReads       int64   `json:"reader_read_syscalls,omitempty"`
	ReaderReadsPerTxn float64 `json:"reader_reads_per_txn,omitempty"`
	// PGByProcess is Postgres CPU µs per event by kind of server process
	// (walsender, backend, autovacuum, background, exited), from the start
	// until the last event was done.
	PGByProcess map[string]float64 `json:"pg_cpu_us_per_event_by_process,omitempty"`
	// CheckpointSaves is the relay's checkpoint row writes (relay only).
	CheckpointSaves int `json:"checkpoint_saves,omitempty"`
	// CatchUpBatches are the relay's catch-up batches in the drain
	// (cdc_relay_catch_up_batches_total): a drain with any read its backlog
	// with SQL peeks, not through the walsender (relay only).
	CatchUpBatches int `json:"catch_up_batches,omitempty"`
	// CPUSplit is the share (percent) of the relay's CPU profile per part:
	// read, decode, encode+produce, checkpoint+ack, gc, other (bench
	// -profile; the first effectively-once drain of a cell only).
	CPUSplit map[string]float64 `json:"cpu_split_percent,omitempty"`
	// The machine over the same window: CPU time of the benchmark process
	// (Kafka broker, consumer) and of processes outside the benchmark, and
	// that outside share of the machine's capacity.
	WindowSeconds     float64 `json:"window_seconds"`
	BenchCPUSeconds   float64 `json:"bench_process_cpu_seconds"`
	ForeignCPUSeconds float64 `json:"foreign_cpu_seconds"`
	ForeignShare      float64 `json:"foreign_share"`
	// CPUWaitShare is the share of the window in which some runnable task
	// waited for a CPU (Linux PSI; -1 unknown, 0 in results from before it
	// was measured).
	CPUWaitShare float64 `json:"cpu_wait_share"`
	// ProduceRequests and MeanBatch are the relay's produce batches (one
	// partition's records in a request; cdc_relay_produce_batches_total)
	// during the drain and their mean size in events (relay only).
	ProduceRequests int     `json:"produce_requests,omitempty"`
	MeanBatch       float64 `json:"mean_batch_events,omitempty"`
	// ProduceP50Ms and ProduceP99Ms: produce request sent → acknowledged
	// (cdc_relay_produce_latency_seconds), per request.
	ProduceP50Ms float64 `json:"produce_p50_ms,omitempty"`
	ProduceP99Ms float64 `json:"produce_p99_ms,omitempty"`
}

// Fill computes the per-event and rate fields from the totals.
func (d *Drain) Fill() {
	if d.Seconds > 0 {
		d.Rate = float64(d.Events) / d.Seconds
	}
	if d.Events > 0 {
		n := float64(d.Events)
		d.CPUPerEventUS = d.CPUSeconds * 1e6 / n
		d.PGCPUPerEventUS = d.PGCPUSeconds * 1e6 / n
		d.WALPerEvent = float64(d.WALBytes) / n
		d.WalsenderUSPerEvent = d.WalsenderCPUSeconds * 1e6 / n
	}
	if d.Transactions > 0 {
		t := float64(d.Transactions)
		d.WalsenderUSPerTxn = d.WalsenderCPUSeconds * 1e6 / t
		d.ReaderReadsPerTxn = float64(d.ReaderReads) / t
	}
}

// Latency is one steady-load run.
type Latency struct {
	System string `json:"system"` // reader, relay or poller
	// Delivery and Round name a relay run's --delivery mode and round.
	Delivery     string  `json:"delivery,omitempty"`
	Round        int     `json:"round,omitempty"`
	Rate         int     `json:"offered_rate"`
	TxnSize      int     `json:"txn_size"`
	Committed    int     `json:"committed"`
	AchievedRate float64 `json:"achieved_rate"`
	Missing      int     `json:"missing"`
	latency.Summary
	// CPU per committed event during the run: the system under test's
	// process, and Postgres; ForeignShare as in Drain.
	CPUPerEventUS   float64            `json:"cpu_us_per_event"`
	PGCPUPerEventUS float64            `json:"pg_cpu_us_per_event"`
	PGByProcess     map[string]float64 `json:"pg_cpu_us_per_event_by_process,omitempty"`
	ForeignShare    float64            `json:"foreign_share"`
	CPUWaitShare    float64            `json:"cpu_wait_share"` // as in Drain
	// The relay's own view (relay only), from its metrics over the run:
	// cdc_relay_end_to_end_latency_seconds (commit → Kafka ack of the oldest
	// event of each produce request, estimated from histogram buckets), and
	// produce requests with their mean size.
	RelayAckP50Ms   float64 `json:"relay_ack_p50_ms,omitempty"`
	RelayAckP99Ms   float64 `json:"relay_ack_p99_ms,omitempty"`
	ProduceRequests int     `json:"produce_requests,omitempty"`
	MeanBatch       float64 `json:"mean_batch_events,omitempty"`
	// ProduceP50Ms and ProduceP99Ms: produce request sent → acknowledged
	// (cdc_relay_produce_latency_seconds), per request.
	ProduceP50Ms float64 `json:"produce_p50_ms,omitempty"`
	ProduceP99Ms float64 `json:"produce_p99_ms,omitempty"`
	// Where the commit → ack time goes before the request
	// (cdc_relay_event_read_latency_seconds: commit → handed to the
	// producer; cdc_relay_event_queue_latency_seconds: → request sent), per
	// request, its oldest event; the request → ack part is Produce*.
	ReadP50Ms  float64 `json:"read_p50_ms,omitempty"`
	ReadP99Ms  float64 `json:"read_p99_ms,omitempty"`
	QueueP50Ms float64 `json:"queue_p50_ms,omitempty"`
	QueueP99Ms float64 `json:"queue_p99_ms,omitempty"`
}

// Verify is the check of what a drain left in Kafka.
type Verify struct {
	System          string `json:"system"`
	Topic           string `json:"topic"`
	Records         int    `json:"records"`
	Unique          int    `json:"unique"`
	Duplicates      int    `json:"duplicates"`
	Missing         int    `json:"missing"`
	OrderViolations int    `json:"order_violations"`
	OK              bool   `json:"ok"`
}

// Delivery compares the relay's --delivery modes. Each mode's figure is its
// best of the rounds (the faster drain, the latency run with the lower p99),
// as the limit is the faster of the two limit-reader runs: noise from the
// machine only ever slows a run down.
type Delivery struct {
	Rounds int `json:"rounds"`
	// Drain rates, events/s, of each mode's best drain and every round's.
	EffectivelyOnceRate  float64           `json:"effectively_once_rate"`
	AtLeastOnceRate      float64           `json:"at_least_once_rate"`
	EffectivelyOnceRates []float64         `json:"effectively_once_rates"`
	AtLeastOnceRates     []float64         `json:"at_least_once_rates"`
	RateRatio            float64           `json:"rate_ratio"` // effectively-once / at-least-once
	Latency              []DeliveryLatency `json:"latency"`
}

// DeliveryLatency compares the modes at one offered load.
type DeliveryLatency struct {
	Rate    int `json:"offered_rate"`
	TxnSize int `json:"txn_size,omitempty"`
	// p50 and p99 of each mode's run with the lower p99, in ms, and every
	// round's p99.
	EffectivelyOnceP50  float64   `json:"effectively_once_p50_ms"`
	EffectivelyOnceP99  float64   `json:"effectively_once_p99_ms"`
	AtLeastOnceP50      float64   `json:"at_least_once_p50_ms"`
	AtLeastOnceP99      float64   `json:"at_least_once_p99_ms"`
	EffectivelyOnceP99s []float64 `json:"effectively_once_p99s_ms"`
	AtLeastOnceP99s     []float64 `json:"at_least_once_p99s_ms"`
	// P99DiffMs is effectively-once p99 − at-least-once p99.
	P99DiffMs float64 `json:"p99_diff_ms"`
	// The tail windows (latency.Summary.TailWindows) of the runs compared.
	EffectivelyOnceTailWindows int `json:"effectively_once_tail_windows"`
	AtLeastOnceTailWindows     int `json:"at_least_once_tail_windows"`
	// Unreached says the load generator committed less than 90% of the
	// offered rate in a run compared ("" when both reached it): the
	// latencies then measure its queue, and the target is not judged.
	Unreached string `json:"unreached,omitempty"`
}

// Reconcile is one kill -9 of the relay (effectively-once) in the middle of
// a drain into a topic of TopicPartitions partitions, and its restart.
type Reconcile struct {
	TopicPartitions int `json:"topic_partitions"`
	Events          int `json:"events"`
	// KilledAfter is how many events Kafka had acknowledged when the relay
	// was killed (its metric, read just before the kill).
	KilledAfter int `json:"killed_after_acked"`
	// From the restarted relay's "reconciled N partitions in X ms, K events
	// already in Kafka" log line.
	Partitions     int   `json:"partitions"`
	DurationMs     int64 `json:"duration_ms"`
	AlreadyInKafka int   `json:"already_in_kafka"`
	// ReadySeconds is restart → /readyz answered 200 (polled every 50 ms).
	ReadySeconds float64 `json:"ready_seconds"`
	// FirstAckSeconds is process start → first event acknowledged by Kafka
	// (cdc_relay_events_published_total ≥ 1, polled every 50 ms), for the
	// first start on the slot and for the restart after the kill.
	FirstAckSeconds        float64 `json:"first_ack_seconds"`
	RestartFirstAckSeconds float64 `json:"restart_first_ack_seconds"`
	// Verify is the topic after the restarted relay finished the drain.
	Verify Verify `json:"verify"`
}

// Ratios compare the systems.
type Ratios struct {
	RelayOverLimitRate   float64 `json:"relay_over_limit_rate"`
	RelayOverReaderCPU   float64 `json:"relay_over_reader_cpu_per_event"`
	RelayOverPollerRate  float64 `json:"relay_over_poller_rate"`
	RelayOverPollerPGCPU float64 `json:"relay_over_poller_pg_cpu_per_event"`
	RelayOverPollerWAL   float64 `json:"relay_over_poller_wal_per_event"`
	RelayOverPollerCPU   float64 `json:"relay_over_poller_cpu_per_event"`
	// LimitOverPollerRate and LimitOverPollerPGCPU are the limit reader's: the
	// best any relay reading the WAL can do against the poller on this machine.
	LimitOverPollerRate   float64 `json:"limit_over_poller_rate"`
	LimitOverPollerPGCPU  float64 `json:"limit_over_poller_pg_cpu_per_event"`
	RelayWALAllowance     int64   `json:"relay_wal_allowance_bytes"`
	RelayLatencyPeakRSS   int64   `json:"relay_latency_peak_rss_bytes"`
	RelayLatencyCPUSecond float64 `json:"relay_latency_cpu_seconds"`
}

// Target is one goal of the issue and whether this run met it.
type Target struct {
	Name string `json:"name"`
	Got  string `json:"got"`
	Pass bool   `json:"pass"`
	NA   bool   `json:"na,omitempty"` // not measured in this run
}

// walAllowanceFixed and walAllowancePerSave bound the WAL the relay may cause
// during a drain: its checkpoint row upsert (a heap tuple and a commit record)
// per save, plus the server's own periodic records (running_xacts).
const (
	walAllowanceFixed   = 8 << 10
	walAllowancePerSave = 1 << 10
)

// Evaluate computes Ratios and Targets.
func (r *Results) Evaluate() {
	div := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	q := &r.Ratios
	q.RelayOverLimitRate = div(r.Relay.Rate, r.Limit.Rate)
	q.RelayOverReaderCPU = div(r.Relay.CPUPerEventUS, r.Limit.CPUPerEventUS)
	q.RelayOverPollerRate = div(r.Relay.Rate, r.Poller.Rate)
	q.RelayOverPollerPGCPU = div(r.Relay.PGCPUPerEventUS, r.Poller.PGCPUPerEventUS)
	q.RelayOverPollerWAL = div(r.Relay.WALPerEvent, r.Poller.WALPerEvent)
	q.RelayOverPollerCPU = div(r.Relay.CPUPerEventUS, r.Poller.CPUPerEventUS)
	q.LimitOverPollerRate = div(r.Limit.Rate, r.Poller.Rate)
	q.LimitOverPollerPGCPU = div(r.Limit.PGCPUPerEventUS, r.Poller.PGCPUPerEventUS)
	q.RelayWALAllowance = walAllowanceFixed + walAllowancePerSave*int64(r.Relay.CheckpointSaves)

	for i := range r.Cells {
		r.Cells[i].Fill()
	}
	r.evaluateDelivery()
	r.Targets = append(r.matrixTargets(), r.tableTargets()...)
	if r.Relay.Rate == 0 {
		r.Targets = append(r.Targets, Target{Name: "headline vs poller, WAL", Got: "not measured (the headline drain cell did not run)", NA: true})
		r.Targets = append(r.Targets, r.deliveryTargets()...)
		return
	}
	r.Targets = append(r.Targets,
		Target{Name: "≥ 2.5 × poller drain rate", Got: fmt.Sprintf("%.2f× (the limit reader, the ceiling of any WAL reader here: %.2f×)", q.RelayOverPollerRate, q.LimitOverPollerRate), Pass: q.RelayOverPollerRate >= 2.5},
		Target{Name: "≤ 0.5 × poller PG CPU per event", Got: fmt.Sprintf("relay/poller %.2f (%.2f vs %.2f µs; the limit reader's: %.2f)", q.RelayOverPollerPGCPU, r.Relay.PGCPUPerEventUS, r.Poller.PGCPUPerEventUS, q.LimitOverPollerPGCPU), Pass: r.Poller.PGCPUPerEventUS > 0 && q.RelayOverPollerPGCPU <= 0.5},
		Target{Name: "no extra WAL for the relay", Got: fmt.Sprintf("%s during the drain, allowance %s (%d checkpoint saves)", bytesStr(r.Relay.WALBytes), bytesStr(q.RelayWALAllowance), r.Relay.CheckpointSaves), Pass: r.Relay.WALBytes <= q.RelayWALAllowance},
	)
	r.Targets = append(r.Targets, r.deliveryTargets()...)
}

// matrixTargets are issue 14's targets over the cells: relay ≥ 0.9 × limit
// in every drain cell, CPU per event against the limit's, its growth from
// the fewest to the most partitions and topics, peak RSS in every cell and
// the p99 at the steady loads.
func (r *Results) matrixTargets() []Target {
	var out []Target
	cells := r.Cells
	if len(cells) == 0 && r.Limit.Rate > 0 {
		// Results from before the matrix: their one drain.
		cells = []Cell{{Name: "drain", Limit: r.Limit, Relay: r.Relay, Poller: r.Poller}}
		cells[0].Fill()
	}
	if len(cells) == 0 {
		out = append(out, Target{Name: "relay ≥ 0.9 × limit, every drain cell", Got: "no drain cell ran", NA: true})
	} else {
		out = append(out, r.drainTargets(cells)...)
	}
	for _, f := range r.FailedCells {
		out = append(out, Target{Name: "cell " + f.Name, Got: "FAILED, not measured: " + f.Error})
	}
	peak, peakCell := peakRSS(cells)
	peak = max(peak, r.Ratios.RelayLatencyPeakRSS)
	if r.Ratios.RelayLatencyPeakRSS >= peak {
		peakCell = "the latency runs"
	}
	if peak > 0 {
		out = append(out, Target{Name: "peak RSS ≤ 64 MiB, every cell", Got: fmt.Sprintf("highest %s (%s)", mib(peak), peakCell), Pass: peak <= 64<<20})
	} else {
		out = append(out, Target{Name: "peak RSS ≤ 64 MiB, every cell", Got: "not measured (no relay drain or steady load ran)", NA: true})
	}
	for _, txn := range []int{1, 10} {
		name := fmt.Sprintf("p99 ≤ 5 ms at 10k/s, %d ev/txn", txn)
		l, ok := r.LatencyOf("relay", 10000, txn)
		if !ok || l.Samples == 0 {
			out = append(out, Target{Name: name, Got: "not measured", NA: true})
			continue
		}
		if l.AchievedRate < 0.9*float64(l.Rate) {
			// The latency then measures the load generator's queue.
			out = append(out, Target{Name: name, Got: fmt.Sprintf("not measured: the load generator committed only %.0f of %d ev/s (p99 %.0f ms)", l.AchievedRate, l.Rate, l.P99), NA: true})
			continue
		}
		out = append(out, Target{Name: name, Got: fmt.Sprintf("p99 %.2f ms (p50 %.2f, max %.2f; tail in %s)", l.P99, l.P50, l.Max, tailWindows(l.TailWindows)), Pass: l.P99 <= 5})
	}
	for _, lc := range r.LatencyCells() {
		if lc.Rate != 30000 {
			continue
		}
		rl, rok := r.LatencyOf("relay", lc.Rate, lc.TxnSize)
		ll, lok := r.LatencyOf("reader", lc.Rate, lc.TxnSize)
		if rok && lok {
			out = append(out, Target{Name: "p99 at 30k/s next to the limit's @" + loadLabel(lc.Rate, lc.TxnSize),
				Got: fmt.Sprintf("relay %.2f ms, limit reader %.2f ms", rl.P99, ll.P99), NA: true})
		}
	}
	return out
}

// Headline is the shape of the headline drain cell: the first value of each
// dimension.
func (c Config) Headline() Shape {
	first := func(v []int, def int) int {
		if len(v) == 0 {
			return def
		}
		return v[0]
	}
	return Shape{TxnSize: first(c.TxnSizes, c.TxnSize), Partitions: first(c.PartitionSet, c.Partitions),
		Topics: first(c.TopicCounts, 1), Payload: first(c.Payloads, c.Payload)}
}

// peakRSS returns the highest peak RSS of the relay's drains in cells, and
// which drain it was.
func peakRSS(cells []Cell) (int64, string) {
	var peak int64
	where := ""
	for _, c := range cells {
		for _, d := range append([]Drain{c.Relay}, c.RelayRuns...) {
			if d.PeakRSSBytes > peak {
				peak, where = d.PeakRSSBytes, c.Name+" "+d.Name
			}
		}
	}
	return peak, where
}

// cpuAllowanceTarget judges the relay's CPU per event against the limit
// reader's plus what encoding, producing and the acknowledgement bookkeeping
// cost, which only a CPU profile (bench -profile) splits out: the profiled
// relay drain's encode+produce and checkpoint+ack shares of its CPU per event.
// Without a profile the ratio is reported, not judged.
func cpuAllowanceTarget(cells []Cell, worstCPU Cell) Target {
	name := "relay CPU/ev ≤ limit's + encode/produce"
	var profiled, failed []string
	worstExcess, worstAt := math.Inf(-1), ""
	for _, c := range cells {
		for _, d := range c.RelayRuns {
			if d.CPUSplit == nil || c.Limit.CPUPerEventUS == 0 {
				continue
			}
			produce := (d.CPUSplit["encode+produce"] + d.CPUSplit["checkpoint+ack"]) / 100 * d.CPUPerEventUS
			allowed := c.Limit.CPUPerEventUS + produce
			excess := d.CPUPerEventUS - allowed
			profiled = append(profiled, c.Name)
			if excess > worstExcess {
				worstExcess = excess
				worstAt = fmt.Sprintf("%s: relay %.2f µs/ev vs limit %.2f + encode/produce/ack %.2f (%.0f%%; gc %.0f%%, read %.0f%%, decode %.0f%%)",
					c.Name, d.CPUPerEventUS, c.Limit.CPUPerEventUS, produce, d.CPUSplit["encode+produce"]+d.CPUSplit["checkpoint+ack"],
					d.CPUSplit["gc"], d.CPUSplit["read"], d.CPUSplit["decode"])
			}
			if excess > 0 {
				failed = append(failed, c.Name)
			}
			break // the first profiled run of a cell
		}
	}
	if len(profiled) == 0 {
		return Target{Name: name, NA: true,
			Got: fmt.Sprintf("highest relay/limit CPU per event %.2f in %s (%.2f vs %.2f µs); the encode/produce share needs a CPU profile (bench -profile DIR)", worstCPU.RelayOverLimitCPU, worstCPU.Name, worstCPU.Relay.CPUPerEventUS, worstCPU.Limit.CPUPerEventUS)}
	}
	got := fmt.Sprintf("%d profiled cells; tightest %s", len(profiled), worstAt)
	if len(failed) > 0 {
		got += "; over in " + strings.Join(failed, ", ")
	}
	return Target{Name: name, Got: got, Pass: len(failed) == 0}
}

// drainTargets are the targets over the drain cells.
func (r *Results) drainTargets(cells []Cell) []Target {
	var out []Target
	worst, worstCPU := cells[0], cells[0]
	for _, c := range cells {
		if c.RelayOverLimit < worst.RelayOverLimit {
			worst = c
		}
		if c.RelayOverLimitCPU > worstCPU.RelayOverLimitCPU {
			worstCPU = c
		}
	}
	got := fmt.Sprintf("lowest relay/limit %.2f in %s (%.0f vs %.0f ev/s; %d cells)", worst.RelayOverLimit, worst.Name, worst.Relay.Rate, worst.Limit.Rate, len(cells))
	var above []string
	for _, c := range cells {
		if c.RelayOverLimit > 1 {
			above = append(above, c.Name)
		}
	}
	if len(above) > 0 {
		// An eager reader makes the walsender dearer (bench/README.md): there
		// the limit reader is no ceiling, the walsender's figures are.
		got += fmt.Sprintf("; above 1 in %s: no ceiling there, read the walsender's CPU per transaction", strings.Join(above, ", "))
	}
	for _, c := range cells {
		if c.RelayOverLimit < 0.9 && c.Limit.Rate > 0 {
			if bound := c.Relay.CPUBoundRate(r.Host.CPUs); bound > 0 {
				// Below the target: say whether the machine's CPU allows it at all.
				got += fmt.Sprintf("; %s: the relay, Postgres and the broker took %.0f µs of CPU per event, so %d cores bound it at %.0f ev/s (%.2f × limit) with every core busy",
					c.Name, c.Relay.MachineCPUPerEventUS(), r.Host.CPUs, bound, bound/c.Limit.Rate)
			}
		}
	}
	out = append(out, Target{Name: "relay ≥ 0.9 × limit, every drain cell", Got: got, Pass: worst.RelayOverLimit >= 0.9})
	out = append(out, cpuAllowanceTarget(cells, worstCPU))
	for _, g := range []struct {
		name    string
		of      func(Shape) int
		without func(Shape) Shape
	}{
		{"partitions", func(s Shape) int { return s.Partitions }, func(s Shape) Shape { s.Partitions = 0; return s }},
		{"topics", func(s Shape) int { return s.Topics }, func(s Shape) Shape { s.Topics = 0; return s }},
	} {
		lo, hi, ok := r.spread(g.of, g.without)
		if !ok {
			out = append(out, Target{Name: "CPU/ev growth over " + g.name + " ≤ 1.2×", Got: "not measured (one " + g.name + " count)", NA: true})
			continue
		}
		grow := ratio(hi.Relay.CPUPerEventUS, lo.Relay.CPUPerEventUS)
		out = append(out, Target{Name: "CPU/ev growth over " + g.name + " ≤ 1.2×",
			Got:  fmt.Sprintf("%.2f× from %d to %d (%.2f → %.2f µs/ev)", grow, g.of(lo.Shape), g.of(hi.Shape), lo.Relay.CPUPerEventUS, hi.Relay.CPUPerEventUS),
			Pass: grow > 0 && grow <= 1.2})
	}
	return out
}

// spread returns, of the cells that differ from the headline in one
// dimension only (of; without zeroes it), the ones with the fewest and the
// most of it, if two such differ.
func (r *Results) spread(of func(Shape) int, without func(Shape) Shape) (lo, hi Cell, ok bool) {
	head := without(r.Config.Headline())
	found := false
	for _, c := range r.Cells {
		if without(c.Shape) != head {
			continue
		}
		switch {
		case !found:
			lo, hi, found = c, c, true
		case of(c.Shape) < of(lo.Shape):
			lo = c
		case of(c.Shape) > of(hi.Shape):
			hi = c
		}
	}
	return lo, hi, found && of(lo.Shape) != of(hi.Shape)
}

// evaluateDelivery fills Delivery from RelayRuns and the relay's latency runs.
func (r *Results) evaluateDelivery() {
	d := Delivery{Rounds: r.Config.DeliveryRounds}
	for _, run := range r.RelayRuns {
		switch run.Delivery {
		case EffectivelyOnce:
			d.EffectivelyOnceRates = append(d.EffectivelyOnceRates, run.Rate)
		case AtLeastOnce:
			d.AtLeastOnceRates = append(d.AtLeastOnceRates, run.Rate)
		}
	}
	eo, _ := r.BestDrain(EffectivelyOnce)
	alo, _ := r.BestDrain(AtLeastOnce)
	d.EffectivelyOnceRate, d.AtLeastOnceRate = eo.Rate, alo.Rate
	if alo.Rate > 0 {
		d.RateRatio = eo.Rate / alo.Rate
	}
	for _, lc := range r.LatencyCells() {
		e, eok := r.BestLatency("relay", EffectivelyOnce, lc.Rate, lc.TxnSize)
		a, aok := r.BestLatency("relay", AtLeastOnce, lc.Rate, lc.TxnSize)
		if !eok || !aok {
			continue
		}
		dl := DeliveryLatency{Rate: lc.Rate, TxnSize: lc.TxnSize, EffectivelyOnceP50: e.P50, EffectivelyOnceP99: e.P99,
			AtLeastOnceP50: a.P50, AtLeastOnceP99: a.P99, P99DiffMs: e.P99 - a.P99,
			EffectivelyOnceTailWindows: e.TailWindows, AtLeastOnceTailWindows: a.TailWindows}
		if low := 0.9 * float64(lc.Rate); e.AchievedRate < low || a.AchievedRate < low {
			dl.Unreached = fmt.Sprintf("the load generator committed only %.0f and %.0f of %d ev/s", e.AchievedRate, a.AchievedRate, lc.Rate)
		}
		for _, l := range r.Latency {
			if l.System != "relay" || l.Rate != lc.Rate || (lc.TxnSize != 0 && l.TxnSize != lc.TxnSize) || l.Samples == 0 {
				continue
			}
			switch l.Delivery {
			case EffectivelyOnce:
				dl.EffectivelyOnceP99s = append(dl.EffectivelyOnceP99s, l.P99)
			case AtLeastOnce:
				dl.AtLeastOnceP99s = append(dl.AtLeastOnceP99s, l.P99)
			}
		}
		d.Latency = append(d.Latency, dl)
	}
	r.Delivery = d
}

// deliveryTargets are the targets for effectively-once against
// at-least-once: drain rate ≥ 0.95 ×, p99 within 1 ms at every load.
func (r *Results) deliveryTargets() []Target {
	d := r.Delivery
	out := []Target{{Name: "eo drain ≥ 0.95 × at-least-once", Got: "not measured (no at-least-once drain)", NA: true}}
	if d.AtLeastOnceRate > 0 {
		out[0] = Target{
			Name: "eo drain ≥ 0.95 × at-least-once",
			Got:  fmt.Sprintf("ratio %.3f (%.0f vs %.0f ev/s)", d.RateRatio, d.EffectivelyOnceRate, d.AtLeastOnceRate),
			Pass: d.RateRatio >= 0.95,
		}
	}
	for _, l := range d.Latency {
		if l.Unreached != "" {
			out = append(out, Target{Name: "eo p99 ≤ at-least-once + 1 ms @" + loadLabel(l.Rate, l.TxnSize),
				Got: fmt.Sprintf("not measured: %s (p99 %.0f vs %.0f ms)", l.Unreached, l.EffectivelyOnceP99, l.AtLeastOnceP99), NA: true})
			continue
		}
		out = append(out, Target{
			Name: "eo p99 ≤ at-least-once + 1 ms @" + loadLabel(l.Rate, l.TxnSize),
			Got: fmt.Sprintf("%+.2f ms (p99 %.2f vs %.2f ms; tails in %d and %d windows of %s)", l.P99DiffMs, l.EffectivelyOnceP99, l.AtLeastOnceP99,
				l.EffectivelyOnceTailWindows, l.AtLeastOnceTailWindows, latency.TailWindow),
			Pass: l.P99DiffMs <= 1,
		})
	}
	return out
}

// BestDrain returns the faster relay drain in the delivery mode.
func (r *Results) BestDrain(delivery string) (Drain, bool) {
	var best Drain
	found := false
	for _, d := range r.RelayRuns {
		if d.Delivery == delivery && (!found || d.Rate > best.Rate) {
			best, found = d, true
		}
	}
	return best, found
}

// BestLatency returns, of system's runs at rate with txn events per
// transaction (0: any) in the delivery mode, the one with the lowest p99
// among those with samples (or the first, when none has any). A run without
// a mode (the reader, the poller, the relay of results from before the modes
// were compared) matches any mode.
func (r *Results) BestLatency(system, delivery string, rate, txn int) (Latency, bool) {
	var best Latency
	found := false
	for _, l := range r.Latency {
		if l.System != system || l.Rate != rate || (l.Delivery != "" && l.Delivery != delivery) || (txn != 0 && l.TxnSize != txn) {
			continue
		}
		better := !found || (l.Samples > 0 && (best.Samples == 0 || l.P99 < best.P99))
		if better {
			best, found = l, true
		}
	}
	return best, found
}

// LatencyCells are the run's steady loads: Config.LatencyCells (the cells
// that ran), or, in results from before the matrix, one per rate with any
// transaction size.
func (r *Results) LatencyCells() []LatencyCell {
	if len(r.Config.LatencyCells) > 0 || len(r.Config.TxnSizes) > 0 {
		return r.Config.LatencyCells
	}
	out := make([]LatencyCell, 0, len(r.Config.Rates))
	for _, rate := range r.Config.Rates {
		out = append(out, LatencyCell{Rate: rate})
	}
	return out
}

// Save writes r as indented JSON to path.
func (r *Results) Save(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

// Load reads results written by Save.
func Load(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read results: %w", err)
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode results %s: %w", path, err)
	}
	return &r, nil
}

// LatencyOf returns the run of system at rate and txn events per
// transaction (0: any); for the relay, the best effectively-once run (see
// BestLatency), the default mode's.
func (r *Results) LatencyOf(system string, rate, txn int) (Latency, bool) {
	return r.BestLatency(system, EffectivelyOnce, rate, txn)
}

// Print writes the table, the ratios, the verification and the targets.
func (r *Results) Print(w io.Writer) {
	if len(r.Cells) > 0 {
		r.printCells(w)
		fmt.Fprintln(w)
	}
	if len(r.Cells) > 0 {
		r.printAgainstPoller(w)
		fmt.Fprintln(w)
	}
	if len(r.TableCells) > 0 {
		r.printTableCells(w)
		fmt.Fprintln(w)
	}
	r.printHeadline(w)
	r.printDelivery(w)
	r.printDetails(w)
}

// printAgainstPoller prints, for each drain cell, the relay (its faster
// effectively-once drain) against the batch poller and against decoding
// alone (SQL in one backend: the most any reader of the slot can get from
// Postgres' decoding on one core): rate, Postgres' CPU per event and WAL per
// event (the poller's DELETEs write WAL, the relay's checkpoints a little).
func (r *Results) printAgainstPoller(w io.Writer) {
	fmt.Fprintln(w, "the relay against the poller and decoding alone (rate ev/s; PG CPU µs/ev: every server process, walsender, backends and autovacuum; decoding alone: its CPU per event as a rate on one core):")
	rows := [][]string{{"cell", "relay", "poller", "relay/poller", "decoding alone", "relay/alone",
		"PG CPU relay", "PG CPU poller", "PG CPU relay/poller", "decoding alone µs/ev", "WAL B/ev relay", "WAL B/ev poller"}}
	for _, c := range r.Cells {
		alone, overAlone := "-", "-"
		if c.DecodeAloneUSPerEvent > 0 {
			rate := 1e6 / c.DecodeAloneUSPerEvent
			alone, overAlone = fmt.Sprintf("%.0f", rate), fmt.Sprintf("%.2f", ratio(c.Relay.Rate, rate))
		}
		rows = append(rows, []string{c.Name,
			fmt.Sprintf("%.0f", c.Relay.Rate), fmt.Sprintf("%.0f", c.Poller.Rate), fmt.Sprintf("%.2f", ratio(c.Relay.Rate, c.Poller.Rate)),
			alone, overAlone,
			fmt.Sprintf("%.2f", c.Relay.PGCPUPerEventUS), fmt.Sprintf("%.2f", c.Poller.PGCPUPerEventUS),
			fmt.Sprintf("%.2f", ratio(c.Relay.PGCPUPerEventUS, c.Poller.PGCPUPerEventUS)),
			fmt.Sprintf("%.2f", c.DecodeAloneUSPerEvent),
			fmt.Sprintf("%.2f", c.Relay.WALPerEvent), fmt.Sprintf("%.1f", c.Poller.WALPerEvent)})
	}
	writeTable(w, rows)
}

// printHeadline prints the headline cell's systems side by side with their
// latency at every steady load.
func (r *Results) printHeadline(w io.Writer) {
	cells := r.LatencyCells()
	if r.Limit.Rate == 0 && len(cells) == 0 {
		return
	}
	drained := r.Limit.Rate > 0 || r.Relay.Rate > 0
	header := []string{"headline", "rate ev/s", "CPU µs/ev", "walsender µs/ev", "PG CPU µs/ev", "WAL B/ev"}
	if !drained {
		header = []string{"steady loads"}
	}
	for i, lc := range cells {
		label := "@" + loadLabel(lc.Rate, lc.TxnSize)
		if i == 0 {
			label = "p50/p99/max ms " + label
		}
		header = append(header, label)
	}
	if drained {
		header = append(header, "peak RSS")
	}
	row := func(name, system, delivery string, d Drain) []string {
		cells := []string{name}
		if drained {
			cells = append(cells, fmt.Sprintf("%.0f", d.Rate), fmt.Sprintf("%.2f", d.CPUPerEventUS),
				fmt.Sprintf("%.2f", d.WalsenderUSPerEvent), fmt.Sprintf("%.2f", d.PGCPUPerEventUS), fmt.Sprintf("%.1f", d.WALPerEvent))
		}
		for _, lc := range r.LatencyCells() {
			l, ok := r.BestLatency(system, delivery, lc.Rate, lc.TxnSize)
			if !ok || l.Samples == 0 {
				cells = append(cells, "-")
				continue
			}
			cell := fmt.Sprintf("%s/%s/%s", ms(l.P50), ms(l.P99), ms(l.Max))
			if l.AchievedRate < 0.9*float64(l.Rate) {
				cell += fmt.Sprintf(" (only %.0f ev/s committed)", l.AchievedRate)
			}
			cells = append(cells, cell)
		}
		if !drained {
			return cells
		}
		return append(cells, mib(d.PeakRSSBytes))
	}
	rows := [][]string{header, row("limit reader", "reader", "", r.Limit)}
	if alo, ok := r.BestDrain(AtLeastOnce); ok {
		rows = append(rows, row("relay effectively-once", "relay", EffectivelyOnce, r.Relay),
			row("relay at-least-once", "relay", AtLeastOnce, alo))
	} else {
		rows = append(rows, row("relay", "relay", EffectivelyOnce, r.Relay))
	}
	writeTable(w, append(rows, row("poller", "poller", "", r.Poller)))
	if !drained {
		return
	}
	q := r.Ratios
	fmt.Fprintf(w, "relay/limit = %.2f   relay CPU/limit CPU = %.2f   relay vs poller (relay/poller): rate %.2f×, PG CPU/ev %.2f×, WAL/ev %.4f×, own CPU/ev %.2f×\n",
		q.RelayOverLimitRate, q.RelayOverReaderCPU, q.RelayOverPollerRate, q.RelayOverPollerPGCPU, q.RelayOverPollerWAL, q.RelayOverPollerCPU)
}

// cpuWait says how oversubscribed the machine's CPUs were (WaitShare).
func cpuWait(share float64) string {
	if share < 0 {
		return "CPU pressure unknown (no /proc/pressure/cpu)"
	}
	return fmt.Sprintf("some task waited for a CPU %.0f%% of the time", 100*share)
}

// tailWindows says in how many windows of commit time a latency tail lies.
func tailWindows(n int) string {
	w := latency.TailWindow.String()
	switch n {
	case 0:
		return "no window (p99 is p50: there is no tail)"
	case 1:
		return "one " + w + " window"
	}
	return fmt.Sprintf("%d windows of %s", n, w)
}

// printDetails prints every drain and latency run, the checks of Kafka, the
// targets and the notes.
func (r *Results) printDetails(w io.Writer) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "drains (process start → last event done; CPU = the process's utime+stime; PG = all server processes):")
	for _, d := range r.drains() {
		extra := ""
		if d.CheckpointSaves > 0 {
			extra = fmt.Sprintf(", %d checkpoint saves, %d produce batches of %.1f events", d.CheckpointSaves, d.ProduceRequests, d.MeanBatch)
		}
		fmt.Fprintf(w, "  %-30s %7d events in %6.2fs = %6.0f ev/s; CPU %5.2fs; PG CPU %5.2fs; WAL %s%s\n",
			d.Name, d.Events, d.Seconds, d.Rate, d.CPUSeconds, d.PGCPUSeconds, bytesStr(d.WALBytes), extra)
		fmt.Fprintf(w, "  %-30s Postgres µs/ev by process: %s; the slot's walsender %.2f µs/ev, %.1f µs/txn (%d transactions); the reading process %.2f reads/txn\n", "", byProcess(d.PGByProcess), d.WalsenderUSPerEvent, d.WalsenderUSPerTxn, d.Transactions, d.ReaderReadsPerTxn)
		fmt.Fprintf(w, "  %-30s benchmark process (kfake) CPU %5.2fs; other processes on the machine %5.2fs = %.0f%% of its capacity; all together %.2f of %d cores busy; %s\n",
			"", d.BenchCPUSeconds, d.ForeignCPUSeconds, 100*d.ForeignShare, d.CoresBusy(), r.Host.CPUs, cpuWait(d.CPUWaitShare))
	}
	fmt.Fprintln(w, "latency (relay, poller: commit_time header → record received by a kgo consumer, i.e. commit → consumer-visible, ≥ commit → ack; limit reader: commit → decoded, alone):")
	for _, l := range r.Latency {
		system := l.System
		if l.Delivery != "" {
			system = fmt.Sprintf("%s %s #%d", l.System, l.Delivery, l.Round)
		}
		fmt.Fprintf(w, "  %-6s offered %6d ev/s (%2d ev/txn): achieved %8.0f ev/s, %7d committed, %7d received, %d missing; p50 %s p99 %s max %s ms over %d samples\n",
			system, l.Rate, l.TxnSize, l.AchievedRate, l.Committed, l.Received, l.Missing, ms(l.P50), ms(l.P99), ms(l.Max), l.Samples)
		fmt.Fprintf(w, "         CPU %.2f µs/ev (%s process), Postgres %.2f µs/ev (%s; backends do the inserts); other processes took %.0f%% of the machine; %s\n",
			l.CPUPerEventUS, l.System, l.PGCPUPerEventUS, byProcess(l.PGByProcess), 100*l.ForeignShare, cpuWait(l.CPUWaitShare))
		fmt.Fprintf(w, "         tail: the samples at or above p99 committed within %s; the longest pause between two commits was %s ms\n",
			tailWindows(l.TailWindows), ms(l.CommitPause))
		if l.ProduceRequests > 0 {
			fmt.Fprintf(w, "         relay's own metrics (per produce batch, histogram estimates): commit → ack p50 %s p99 %s ms, of which send → ack p50 %s p99 %s ms; %d produce batches, %.1f events each\n",
				ms(l.RelayAckP50Ms), ms(l.RelayAckP99Ms), ms(l.ProduceP50Ms), ms(l.ProduceP99Ms), l.ProduceRequests, l.MeanBatch)
			fmt.Fprintf(w, "         where it goes: commit → read and decoded p50 %s p99 %s ms; → produce request sent (batching, waiting for the request in flight) p50 %s p99 %s ms; → ack p50 %s p99 %s ms; the rest of commit → consumer-visible is the consumer's fetch\n",
				ms(l.ReadP50Ms), ms(l.ReadP99Ms), ms(l.QueueP50Ms), ms(l.QueueP99Ms), ms(l.ProduceP50Ms), ms(l.ProduceP99Ms))
		}
	}
	fmt.Fprintln(w, "Kafka contents after each drain:")
	for _, v := range r.Verify {
		status := "OK"
		if !v.OK {
			status = "FAILED"
		}
		fmt.Fprintf(w, "  %-29s %-18s %s: %d records, %d unique, %d duplicates, %d missing, %d per-key order violations\n",
			v.System, v.Topic, status, v.Records, v.Unique, v.Duplicates, v.Missing, v.OrderViolations)
	}
	fmt.Fprintln(w, "targets:")
	for _, t := range r.Targets {
		mark := "MISS"
		switch {
		case t.NA:
			mark = "n/a "
		case t.Pass:
			mark = "PASS"
		}
		fmt.Fprintf(w, "  %s  %-42s %s\n", mark, t.Name, t.Got)
	}
	var foreign, capacity float64
	for _, d := range r.drains() {
		foreign += d.ForeignCPUSeconds
		capacity += d.WindowSeconds * float64(r.Host.CPUs)
	}
	if capacity > 0 && foreign/capacity > 0.1 {
		fmt.Fprintf(w, "WARNING: processes outside the benchmark took %.0f%% of the machine's CPU during the drains (load average %.1f at the start, %.1f at the end, %d CPUs): figures are noisy, compare runs with care\n",
			100*foreign/capacity, r.Host.LoadAvgStart, r.Host.LoadAvgEnd, r.Host.CPUs)
	}
	if len(r.Config.RelayFlags) > 0 {
		fmt.Fprintf(w, "relay and limit reader ran with the extra flags: %s\n", strings.Join(r.Config.RelayFlags, " "))
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w, "notes:")
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  - %s\n", n)
		}
	}
}

// printCells prints one line per drain cell: rates, relay/limit, CPU per
// event of each process and of the walsender, peak RSS, verification.
func (r *Results) printCells(w io.Writer) {
	fmt.Fprintln(w, "drain cells (rate ev/s; CPU µs/ev of the process; walsender ceiling: one core ÷ the lower of the two walsenders' CPU per event, the fastest any reader of the slot could go; walsender µs/ev and µs/txn of the limit's and the relay's drain; CPU bound: the fastest ev/s the machine's cores allow at the CPU per event the process, Postgres and the broker took; peak RSS of the relay):")
	rows := [][]string{{"cell", "events", "limit", "relay", "poller", "walsender ceiling", "relay/limit", "CPU limit", "CPU relay", "CPU poller", "walsender lim/relay", "ws µs/txn lim/relay", "reads/txn lim/relay", "cores busy lim/relay", "CPU bound lim/relay", "relay RSS", "Kafka"}}
	for _, c := range r.Cells {
		ok := "OK"
		for _, v := range c.Verify {
			if !v.OK {
				ok = "FAILED"
			}
		}
		rows = append(rows, []string{c.Name, fmt.Sprint(c.Events), fmt.Sprintf("%.0f", c.Limit.Rate), fmt.Sprintf("%.0f", c.Relay.Rate),
			fmt.Sprintf("%.0f", c.Poller.Rate), fmt.Sprintf("%.0f", c.WalsenderCeiling()), fmt.Sprintf("%.2f", c.RelayOverLimit),
			fmt.Sprintf("%.2f", c.Limit.CPUPerEventUS), fmt.Sprintf("%.2f", c.Relay.CPUPerEventUS), fmt.Sprintf("%.2f", c.Poller.CPUPerEventUS),
			fmt.Sprintf("%.2f/%.2f", c.Limit.WalsenderUSPerEvent, c.Relay.WalsenderUSPerEvent),
			fmt.Sprintf("%.1f/%.1f", c.Limit.WalsenderUSPerTxn, c.Relay.WalsenderUSPerTxn),
			fmt.Sprintf("%.2f/%.2f", c.Limit.ReaderReadsPerTxn, c.Relay.ReaderReadsPerTxn),
			fmt.Sprintf("%.2f/%.2f", c.Limit.CoresBusy(), c.Relay.CoresBusy()),
			fmt.Sprintf("%.0f/%.0f", c.Limit.CPUBoundRate(r.Host.CPUs), c.Relay.CPUBoundRate(r.Host.CPUs)),
			mib(c.Relay.PeakRSSBytes), ok})
	}
	writeTable(w, rows)
}

// CoresBusy is how many of the machine's cores were busy during the drain:
// the process measured, Postgres, the benchmark process (the broker) and
// everything else, over its window. Near the machine's count, whatever ran
// beside the process measured took CPU it would otherwise have had.
func (d Drain) CoresBusy() float64 {
	if d.WindowSeconds <= 0 {
		return 0
	}
	return (d.CPUSeconds + d.PGCPUSeconds + d.BenchCPUSeconds + d.ForeignCPUSeconds) / d.WindowSeconds
}

// MachineCPUPerEventUS is the CPU the drain took per event on the machine:
// the process measured, Postgres and the benchmark process (the broker), but
// not what ran outside the benchmark. 0 when not measured.
func (d Drain) MachineCPUPerEventUS() float64 {
	if d.Events <= 0 || d.CPUSeconds <= 0 {
		return 0
	}
	return (d.CPUSeconds + d.PGCPUSeconds + d.BenchCPUSeconds) * 1e6 / float64(d.Events)
}

// CPUBoundRate is the fastest the drain could have gone on cores CPUs at the
// CPU per event it took (MachineCPUPerEventUS), with every core busy all the
// time. A drain whose bound is below another's rate cannot reach that rate on
// this machine by waiting less; only by costing the machine less. 0 when not
// measured.
func (d Drain) CPUBoundRate(cores int) float64 {
	us := d.MachineCPUPerEventUS()
	if us <= 0 || cores <= 0 {
		return 0
	}
	return float64(cores) * 1e6 / us
}

// WalsenderCeiling is the fastest the drain's slot could have been read, in
// events/s, at the CPU per event its walsender took: logical decoding of a
// slot runs in that one process, so it gets one core at most, whatever the
// reader does. 0 when not measured (the poller), or when the walsender did
// not decode the backlog (the relay caught up in batches).
func (d Drain) WalsenderCeiling() float64 {
	if d.WalsenderUSPerEvent <= 0 || d.CatchUpBatches > 0 {
		return 0
	}
	return 1e6 / d.WalsenderUSPerEvent
}

// WalsenderCeiling is the higher of the limit reader's and the relay's
// walsender ceilings: the walsender's cost per transaction depends on how it
// is read, so the cheaper of the two is what the cell showed possible.
func (c Cell) WalsenderCeiling() float64 {
	return max(c.Limit.WalsenderCeiling(), c.Relay.WalsenderCeiling())
}

// drains are every drain of the run in the order they ran: the limit reader
// before, the relay's runs, the reader after, the poller. Results from
// before the delivery modes were compared have Relay only.
func (r *Results) drains() []Drain {
	if len(r.Cells) > 0 {
		var out []Drain
		for _, c := range r.Cells {
			for _, d := range c.drains() {
				d.Name = c.Name + " " + d.Name
				out = append(out, d)
			}
		}
		return out
	}
	if r.Relay.Rate == 0 && r.Limit.Rate == 0 {
		return nil // only steady loads or start-up cells ran
	}
	c := Cell{LimitRuns: r.LimitRuns, RelayRuns: r.RelayRuns, Relay: r.Relay, Poller: r.Poller}
	return c.drains()
}

// drains are the cell's drains in the order they ran: the limit before, the
// relay's runs, the limit after, the poller.
func (c Cell) drains() []Drain {
	var out []Drain
	if len(c.LimitRuns) > 0 {
		out = append(out, c.LimitRuns[0])
	}
	if len(c.RelayRuns) > 0 {
		out = append(out, c.RelayRuns...)
	} else {
		out = append(out, c.Relay)
	}
	if len(c.LimitRuns) > 1 {
		out = append(out, c.LimitRuns[1:]...)
	}
	return append(out, c.Poller)
}

// deliveryVerdict is the p99 comparison's verdict: holds, MISSED, or not
// judged where the load was not reached.
func deliveryVerdict(l DeliveryLatency) string {
	if l.Unreached != "" {
		return "not judged, load not reached"
	}
	return holds(l.P99DiffMs <= 1)
}

// printDelivery prints the delivery modes side by side and the start-up
// reconciliation after kill -9.
func (r *Results) printDelivery(w io.Writer) {
	d := r.Delivery
	if d.AtLeastOnceRate > 0 {
		fmt.Fprintf(w, "\ndelivery modes (the relay drained and ran the loads %d× per mode, alternating effectively-once, at-least-once; each mode's best run):\n", d.Rounds)
		fmt.Fprintf(w, "  drain           effectively-once %6.0f ev/s (runs %s)   at-least-once %6.0f ev/s (runs %s)   ratio %.3f (target ≥ 0.95: %s)\n",
			d.EffectivelyOnceRate, floats(d.EffectivelyOnceRates, "%.0f"), d.AtLeastOnceRate, floats(d.AtLeastOnceRates, "%.0f"), d.RateRatio, holds(d.RateRatio >= 0.95))
		for _, l := range d.Latency {
			fmt.Fprintf(w, "  latency @%-11s effectively-once p50/p99 %s/%s ms (p99 runs %s)   at-least-once %s/%s ms (p99 runs %s)   p99 difference %+.2f ms (target ≤ +1 ms: %s)\n",
				loadLabel(l.Rate, l.TxnSize), ms(l.EffectivelyOnceP50), ms(l.EffectivelyOnceP99), floats(l.EffectivelyOnceP99s, "%.2f"),
				ms(l.AtLeastOnceP50), ms(l.AtLeastOnceP99), floats(l.AtLeastOnceP99s, "%.2f"), l.P99DiffMs, deliveryVerdict(l))
		}
	}
	if len(r.Reconcile) > 0 {
		fmt.Fprintln(w, "start-up reconciliation after kill -9 mid-drain (effectively-once; from the restarted relay's \"reconciled …\" log line):")
		for _, c := range r.Reconcile {
			fmt.Fprintf(w, "  %3d-partition topic: first event acknowledged %.2fs after the first start; killed after %d of %d events acknowledged; restart reconciled %d partitions in %d ms, %d events already in Kafka; ready %.2fs and first event acknowledged %.2fs after the restart; Kafka afterwards: %d records, %d duplicates, %d missing\n",
				c.TopicPartitions, c.FirstAckSeconds, c.KilledAfter, c.Events, c.Partitions, c.DurationMs, c.AlreadyInKafka, c.ReadySeconds, c.RestartFirstAckSeconds, c.Verify.Records, c.Verify.Duplicates, c.Verify.Missing)
		}
	}
}

func holds(ok bool) string {
	if ok {
		return "holds"
	}
	return "MISSED"
}

func floats(vs []float64, format string) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf(format, v)
	}
	return strings.Join(parts, ", ")
}

// byProcess formats a Postgres CPU breakdown, largest first.
func byProcess(m map[string]float64) string {
	if len(m) == 0 {
		return "-"
	}
	kinds := make([]string, 0, len(m))
	for k := range m {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return m[kinds[i]] > m[kinds[j]] })
	parts := make([]string, 0, len(kinds))
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// writeTable prints rows with the first column left-aligned and the others
// right-aligned, counting runes (µ is two bytes).
func writeTable(w io.Writer, rows [][]string) {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		for i, c := range row {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			if i == 0 {
				b.WriteString(c + pad)
			} else {
				b.WriteString("   " + pad + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// loadLabel names a steady load: 10k, or 10k×10 with its transaction size.
func loadLabel(rate, txn int) string {
	if txn == 0 {
		return rateLabel(rate)
	}
	return fmt.Sprintf("%s×%d", rateLabel(rate), txn)
}

func rateLabel(rate int) string {
	if rate >= 1000 && rate%1000 == 0 {
		return fmt.Sprintf("%dk", rate/1000)
	}
	return fmt.Sprint(rate)
}

func ms(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func mib(b int64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

func bytesStr(b int64) string {
	switch {
	case b >= 1<<20 || b <= -(1<<20):
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10 || b <= -(1<<10):
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	default:
		return fmt.Sprintf("%d B", b)
	}
}
