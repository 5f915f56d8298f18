package runner

// The latency runs under steady load: relay and poller through Kafka, the limit reader alone.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cdc-relay/cdc-relay/bench/internal/child"
	"github.com/cdc-relay/cdc-relay/bench/internal/hoststat"
	"github.com/cdc-relay/cdc-relay/bench/internal/latency"
	"github.com/cdc-relay/cdc-relay/bench/internal/pgload"
	"github.com/cdc-relay/cdc-relay/bench/internal/pgstat"
	"github.com/cdc-relay/cdc-relay/bench/internal/results"
)

// latencyPhase runs the selected steady-load cells: through the relay, then
// the limit reader alone, on a database of their own, then the poller.
func (b *bench) latencyPhase(ctx context.Context) error {
	cells := b.latencyCells()
	if len(cells) == 0 {
		return nil
	}
	var err error
	if b.relayURL, err = b.pg.CreateDatabase(ctx, "latency"); err != nil {
		return fmt.Errorf("create latency database: %w", err)
	}
	if err := pgload.ApplyMigrations(ctx, b.relayURL, filepath.Join(b.root, "migrations"), "001_outbox.sql", "002_checkpoints.sql", "005_dead_letters.sql"); err != nil {
		return err
	}
	if err := pgload.CreatePublicationAndSlots(ctx, b.relayURL, publication); err != nil {
		return err
	}
	names := make([]string, len(cells))
	for i, lc := range cells {
		names[i] = lc.Name()
	}
	b.say("steady-load cells %s", strings.Join(names, ", "))
	if err := b.relayLatencyPhase(ctx); err != nil {
		return err
	}
	if err := b.readerLatencyPhase(ctx); err != nil {
		return err
	}
	return b.pollerLatencyPhase(ctx)
}

// relayLatencyPhase runs the steady loads through the relay once per
// delivery mode and round, alternating the modes (ABAB): each run is a
// freshly started relay on a slot of its own, created at the end of the WAL,
// writing topics of its own; the slot is dropped after the run.
func (b *bench) relayLatencyPhase(ctx context.Context) error {
	for _, run := range b.relayRuns() {
		if err := b.relayLatencyRun(ctx, run); err != nil {
			return err
		}
	}
	return nil
}

// relayLatencyRun is one relay process through every offered load.
func (b *bench) relayLatencyRun(ctx context.Context, run relayRun) error {
	b.say("relay latency (--delivery %s, round %d): starting the relay on slot %s", run.delivery, run.round, run.latSlot())
	prefix := run.topicPrefix("lat")
	for _, lc := range b.latencyCells() {
		if err := b.createTopics(ctx, []string{prefix + latAggType(lc)}, b.cfg.Headline().Partitions); err != nil {
			return err
		}
	}
	r, err := b.startRelay(relayOptions{slot: run.latSlot(), topicPrefix: prefix, delivery: run.delivery})
	if err != nil {
		return err
	}
	defer func() { _, _ = r.Stop(stopGrace) }() // a no-op once stopped; cleanup on early return
	if err := r.waitReady(ctx, time.Minute); err != nil {
		return err
	}
	if err := b.latencyRuns(ctx, "relay", run, b.relayURL, prefix, r.Process, r.exited, r); err != nil {
		return err
	}
	usage, err := r.Stop(stopGrace)
	if err != nil {
		return fmt.Errorf("stop relay after the latency runs (%s): %w", run, err)
	}
	if err := waitQuiet(ctx, b.relayURL); err != nil {
		return err
	}
	if err := execSQL(ctx, b.relayURL, fmt.Sprintf("SELECT pg_drop_replication_slot('%s')", run.latSlot())); err != nil {
		return err
	}
	if run.delivery == results.EffectivelyOnce {
		// The targets are the default mode's: its largest peak, its CPU.
		b.res.Ratios.RelayLatencyPeakRSS = max(b.res.Ratios.RelayLatencyPeakRSS, usage.MaxRSS)
		b.res.Ratios.RelayLatencyCPUSecond += usage.CPU().Seconds()
	}
	return nil
}

// latencyRuns offers each steady-load cell for the configured duration to
// system, which reads url and writes topics topicPrefix+latAggType; alive reports whether
// the system under test, proc, still runs. run names the relay's delivery
// mode and round (zero for other systems). With relay set, the relay's own
// metrics (commit → ack histogram, produce batches) are read around each run.
func (b *bench) latencyRuns(ctx context.Context, system string, run relayRun, url, topicPrefix string, proc *child.Process, alive func() error, relay *relayProc) error {
	for _, lc := range b.latencyCells() {
		rate := lc.Rate
		agg := latAggType(lc)
		topic := topicPrefix + agg
		c := latency.Start(ctx, b.brokers, topic)
		// Let the consumer join before the first commit.
		select {
		case <-ctx.Done():
			_, _ = c.Close() // canceled: nothing to report
			return ctx.Err()
		case <-time.After(time.Second):
		}
		var before relayMetrics
		if relay != nil {
			var err error
			if before, err = relay.metrics(ctx); err != nil {
				_, _ = c.Close() // the relay is what failed
				return fmt.Errorf("relay latency at %d/s: %w", rate, err)
			}
		}
		if err := b.waitForQuietMachine(ctx); err != nil {
			_, _ = c.Close() // canceled: nothing to report
			return err
		}
		m0, err := b.sampleCPU(proc)
		if err != nil {
			_, _ = c.Close() // reporting the sampling error
			return err
		}
		start := time.Now()
		c.KeepFrom(start.Add(b.warmup()))
		sr, err := pgload.RunSteady(ctx, url, pgload.Steady{
			Rate: rate, TxnSize: lc.TxnSize, Duration: b.cfg.Duration, AggregateType: agg,
			Aggregates: b.cfg.Aggregates, Payload: b.cfg.Headline().Payload,
		})
		if err != nil {
			_, _ = c.Close() // the load error is what matters
			return fmt.Errorf("%s latency at %d/s: %w", system, rate, err)
		}
		got := c.WaitFor(ctx, sr.Committed, 30*time.Second)
		m1, err := b.sampleCPU(proc)
		if err != nil {
			_, _ = c.Close() // reporting the sampling error
			return err
		}
		sum, err := c.Close()
		if err != nil {
			return fmt.Errorf("%s latency at %d/s: %w", system, rate, err)
		}
		if err := alive(); err != nil {
			return fmt.Errorf("%s latency at %d/s: %w", system, rate, err)
		}
		l := results.Latency{System: system, Rate: rate, TxnSize: sr.TxnSize, Committed: sr.Committed,
			AchievedRate: sr.Rate(), Missing: max(0, sr.Committed-got), Summary: sum,
			Delivery: run.delivery, Round: run.round}
		if sr.Committed > 0 {
			n := float64(sr.Committed)
			l.CPUPerEventUS = float64(m1.proc-m0.proc) / float64(time.Microsecond) / n
			l.PGCPUPerEventUS = float64(m1.pg.Sub(m0.pg)) / float64(time.Microsecond) / n
			l.PGByProcess = perEvent(m1.pg.Breakdown(m0.pg), sr.Committed)
			hd := m1.host.Sub(m0.host)
			l.ForeignShare = hd.Foreign(m1.proc-m0.proc, m1.pg.Sub(m0.pg)).Seconds() / hd.Capacity().Seconds()
			l.CPUWaitShare = hd.WaitShare()
		}
		if relay != nil {
			after, err := relay.metrics(ctx)
			if err != nil {
				return fmt.Errorf("relay latency at %d/s: %w", rate, err)
			}
			const e2e = "cdc_relay_end_to_end_latency_seconds"
			l.RelayAckP50Ms = finite(after.quantileSince(before, e2e, 0.5) * 1000)
			l.RelayAckP99Ms = finite(after.quantileSince(before, e2e, 0.99) * 1000)
			const produce = "cdc_relay_produce_latency_seconds"
			l.ProduceP50Ms = finite(after.quantileSince(before, produce, 0.5) * 1000)
			l.ProduceP99Ms = finite(after.quantileSince(before, produce, 0.99) * 1000)
			const read, queue = "cdc_relay_event_read_latency_seconds", "cdc_relay_event_queue_latency_seconds"
			l.ReadP50Ms = finite(after.quantileSince(before, read, 0.5) * 1000)
			l.ReadP99Ms = finite(after.quantileSince(before, read, 0.99) * 1000)
			l.QueueP50Ms = finite(after.quantileSince(before, queue, 0.5) * 1000)
			l.QueueP99Ms = finite(after.quantileSince(before, queue, 0.99) * 1000)
			l.ProduceRequests = int(after.sum("cdc_relay_produce_batches_total") - before.sum("cdc_relay_produce_batches_total"))
			if l.ProduceRequests > 0 {
				l.MeanBatch = (after.sum("cdc_relay_events_published_total") - before.sum("cdc_relay_events_published_total")) / float64(l.ProduceRequests)
			}
		}
		b.res.Latency = append(b.res.Latency, l)
		name := system
		if run.delivery != "" {
			name = fmt.Sprintf("%s (%s)", system, run)
		}
		b.say("  %s %s: achieved %.0f ev/s, p50 %.2f ms, p99 %.2f ms, max %.2f ms (%d samples, %d missing)",
			name, lc.Name(), l.AchievedRate, l.P50, l.P99, l.Max, l.Samples, l.Missing)
		if relay != nil {
			b.say("    p50/p99 ms: commit → read %.2f/%.2f, → request sent %.2f/%.2f, → ack %.2f/%.2f; commit → ack %.2f/%.2f (the relay's histograms)",
				l.ReadP50Ms, l.ReadP99Ms, l.QueueP50Ms, l.QueueP99Ms, l.ProduceP50Ms, l.ProduceP99Ms, l.RelayAckP50Ms, l.RelayAckP99Ms)
		}
	}
	return nil
}

// readerLatencyPhase measures the floor under the relay's latency: the limit
// reader, alone (the relay is stopped), timing commit → decoded on a slot
// created for it, at the same offered loads.
func (b *bench) readerLatencyPhase(ctx context.Context) error {
	const slot = "reader_lat"
	b.say("limit reader latency: slot %s (the relay is stopped)", slot)
	if err := execSQL(ctx, b.relayURL, fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", slot)); err != nil {
		return err
	}
	for _, lc := range b.latencyCells() {
		rate := lc.Rate
		st := pgload.Steady{Rate: rate, TxnSize: lc.TxnSize, Duration: b.cfg.Duration, AggregateType: latAggType(lc),
			Aggregates: b.cfg.Aggregates, Payload: b.cfg.Headline().Payload}
		txnSize, txns, _ := st.Plan()
		expected := txnSize * txns
		if err := b.waitForQuietMachine(ctx); err != nil {
			return err
		}
		args := append([]string{"reader", "-count", strconv.Itoa(expected), "-latency", "-warmup", b.warmup().String(), "--"},
			b.relayArgs(relayOptions{slot: slot, topicPrefix: relayTopicPrefix + "lat.reader.", delivery: results.EffectivelyOnce}, "127.0.0.1:0")...)
		p, err := child.Start(child.Options{Name: "limit reader", Path: b.cfg.Self, Args: args})
		if err != nil {
			return err
		}
		l, err := b.readerLatencyRun(ctx, p, st, expected)
		if _, serr := p.Stop(stopGrace); err == nil && serr != nil {
			err = serr
		}
		if err != nil {
			return fmt.Errorf("limit reader latency, %s: %w", lc.Name(), err)
		}
		b.res.Latency = append(b.res.Latency, l)
		b.say("  limit reader %s: achieved %.0f ev/s, p50 %.2f ms, p99 %.2f ms, max %.2f ms (%d samples, %d missing)",
			lc.Name(), l.AchievedRate, l.P50, l.P99, l.Max, l.Samples, l.Missing)
	}
	return nil
}

// readerLatencyRun runs one steady load while the started reader p decodes it.
func (b *bench) readerLatencyRun(ctx context.Context, p *child.Process, st pgload.Steady, expected int) (results.Latency, error) {
	l := results.Latency{System: "reader", Rate: st.Rate}
	select { // let it connect and start streaming
	case <-ctx.Done():
		return l, ctx.Err()
	case <-p.Done():
		return l, fmt.Errorf("reader exited at start: %v%s", p.ExitError(), stderrSuffix(p.StderrTail()))
	case <-time.After(time.Second):
	}
	pg0, err := b.cpu.Snapshot()
	if err != nil {
		return l, err
	}
	h0, err := hoststat.Take()
	if err != nil {
		return l, err
	}
	sr, err := pgload.RunSteady(ctx, b.relayURL, st)
	if err != nil {
		return l, err
	}
	wait := exitWait
	if _, err := waitDone(ctx, p, 30*time.Second); err != nil {
		if ctx.Err() != nil {
			return l, err
		}
		wait = 0 // stopping it makes it report what it read
	}
	// Sampled before the reader exits, while its walsender still lives.
	pg1, err := b.cpu.Snapshot()
	if err != nil {
		return l, err
	}
	h1, err := hoststat.Take()
	if err != nil {
		return l, err
	}
	usage, err := p.Wait(wait, stopGrace)
	if err != nil {
		return l, err
	}
	var read int
	var sum latency.Summary
	found := false
	for _, line := range drainLines(p) {
		if rest, ok := strings.CutPrefix(line, LatencyLine+" "); ok {
			n, js, _ := strings.Cut(rest, " ")
			read, _ = strconv.Atoi(n)
			if err := json.Unmarshal([]byte(js), &sum); err != nil {
				return l, fmt.Errorf("parse reader latency %q: %w", line, err)
			}
			found = true
		}
	}
	if !found {
		return l, fmt.Errorf("reader printed no latency line%s", stderrSuffix(p.StderrTail()))
	}
	sum.Received = read
	l.TxnSize, l.Committed, l.AchievedRate, l.Summary = sr.TxnSize, sr.Committed, sr.Rate(), sum
	l.Missing = max(0, min(expected, sr.Committed)-read)
	if sr.Committed > 0 {
		n := float64(sr.Committed)
		l.CPUPerEventUS = float64(usage.CPU()) / float64(time.Microsecond) / n
		l.PGCPUPerEventUS = float64(pg1.Sub(pg0)) / float64(time.Microsecond) / n
		l.PGByProcess = perEvent(pg1.Breakdown(pg0), sr.Committed)
		hd := h1.Sub(h0)
		l.ForeignShare = hd.Foreign(usage.CPU(), pg1.Sub(pg0)).Seconds() / hd.Capacity().Seconds()
		l.CPUWaitShare = hd.WaitShare()
	}
	return l, nil
}

// cpuSample is the CPU time of the system under test, Postgres and the
// machine at one moment of a latency run.
type cpuSample struct {
	proc time.Duration
	pg   pgstat.CPUSnapshot
	host hoststat.Snapshot
}

func (b *bench) sampleCPU(p *child.Process) (cpuSample, error) {
	var s cpuSample
	var err error
	if s.proc, err = pgstat.ProcessCPU(p.PID()); err != nil {
		return s, err
	}
	if s.pg, err = b.cpu.Snapshot(); err != nil {
		return s, err
	}
	if s.host, err = hoststat.Take(); err != nil {
		return s, err
	}
	return s, nil
}

// perEvent converts a CPU breakdown to µs per event.
func perEvent(m map[string]time.Duration, events int) map[string]float64 {
	if events <= 0 {
		return nil
	}
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = float64(v) / float64(time.Microsecond) / float64(events)
	}
	return out
}

// finite maps NaN (no observations) to 0, which JSON can hold.
func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}
