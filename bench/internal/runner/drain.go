package runner

// The backlog drains: the bare reader, the relay and the check of what reached Kafka.

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cdc-relay/cdc-relay/bench/internal/child"
	"github.com/cdc-relay/cdc-relay/bench/internal/pgload"
	"github.com/cdc-relay/cdc-relay/bench/internal/results"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// drainPhase loads the backlog and drains it with the bare reader, the relay
// and the bare reader again.
func (b *bench) drainPhase(ctx context.Context) error {
	var err error
	if b.relayURL, err = b.pg.CreateDatabase(ctx, "relay"); err != nil {
		return fmt.Errorf("create relay database: %w", err)
	}
	if err := pgload.ApplyMigrations(ctx, b.relayURL, filepath.Join(b.root, "migrations"), "001_outbox.sql", "002_checkpoints.sql", "005_dead_letters.sql"); err != nil {
		return err
	}
	slots := []string{"reader_a", "reader_b"}
	for _, run := range b.relayRuns() {
		slots = append(slots, run.drainSlot())
	}
	for _, n := range b.cfg.ReconcilePartitions {
		slots = append(slots, reconcileSlot(n))
	}
	if err := pgload.CreatePublicationAndSlots(ctx, b.relayURL, publication, slots...); err != nil {
		return err
	}
	b.res.Host.Postgres, err = serverVersion(ctx, b.relayURL)
	if err != nil {
		return err
	}
	b.say("slots %s created together; committing the backlog: %d events, %d per transaction, %d aggregates, ~%d B payload",
		strings.Join(slots, ", "), b.cfg.Events, b.cfg.TxnSize, b.cfg.Aggregates, b.cfg.Payload)
	secs, err := b.loadBacklog(ctx, b.relayURL)
	if err != nil {
		return err
	}
	b.res.BacklogLoadSeconds = secs

	a, err := b.readerDrain(ctx, "reader_a")
	if err != nil {
		return err
	}
	for _, run := range b.relayRuns() {
		d, err := b.relayDrain(ctx, run)
		if err != nil {
			return err
		}
		b.res.RelayRuns = append(b.res.RelayRuns, d)
	}
	bb, err := b.readerDrain(ctx, "reader_b")
	if err != nil {
		return err
	}
	a.Name, bb.Name = "reader_a (before)", "reader_b (after)"
	b.res.LimitRuns = []results.Drain{a, bb}
	b.res.Limit = a
	if bb.Rate > a.Rate {
		b.res.Limit = bb
	}
	b.res.Relay, _ = b.res.BestDrain(results.EffectivelyOnce)

	b.say("verifying the relay's Kafka records")
	for _, run := range b.relayRuns() {
		v, err := verifyDrain(ctx, b.brokers, "relay "+run.tag(), run.topicPrefix()+drainAggType, b.cfg.Events)
		if err != nil {
			return err
		}
		b.res.Verify = append(b.res.Verify, v)
	}
	return nil
}

// loadBacklog commits the backlog on url, then vacuums and checkpoints so the
// drains that follow do not pay for it.
func (b *bench) loadBacklog(ctx context.Context, url string) (float64, error) {
	start := time.Now()
	lastSaid := start
	err := pgload.LoadBacklog(ctx, url, pgload.Backlog{
		Events: b.cfg.Events, Aggregates: b.cfg.Aggregates, TxnSize: b.cfg.TxnSize,
		Payload: b.cfg.Payload, AggregateType: drainAggType,
	}, func(done int) {
		if time.Since(lastSaid) > 5*time.Second {
			lastSaid = time.Now()
			b.say("  %d events committed", done)
		}
	})
	if err != nil {
		return 0, err
	}
	secs := time.Since(start).Seconds()
	b.say("backlog committed in %.1fs (%.0f events/s); VACUUM ANALYZE and CHECKPOINT", secs, float64(b.cfg.Events)/secs)
	for _, sql := range []string{"VACUUM (ANALYZE) public.outbox_events", "CHECKPOINT"} {
		if err := execSQL(ctx, url, sql); err != nil {
			return 0, err
		}
	}
	return secs, nil
}

// drainTimeout bounds one drain: at least 1,000 events/s, plus start-up.
func (b *bench) drainTimeout() time.Duration {
	return 2*time.Minute + time.Duration(b.cfg.Events)*time.Millisecond
}

// readerDrain runs the bare reader on slot until it decoded the backlog.
func (b *bench) readerDrain(ctx context.Context, slot string) (results.Drain, error) {
	b.say("bare reader on slot %s: decoding %d events", slot, b.cfg.Events)
	d := results.Drain{Name: slot, Events: b.cfg.Events}
	w, err := b.beginWindow(ctx, b.relayURL)
	if err != nil {
		return d, err
	}
	defer w.close()
	p, err := child.Start(child.Options{Name: "bare reader", Path: b.cfg.Self, Args: []string{"reader",
		"-url", b.relayURL, "-slot", slot, "-publication", publication, "-count", strconv.Itoa(b.cfg.Events)}})
	if err != nil {
		return d, err
	}
	defer func() { _, _ = p.Stop(stopGrace) }() // a no-op once stopped; cleanup on early return
	end, err := waitDone(ctx, p, b.drainTimeout())
	if err != nil {
		return d, err
	}
	bd, err := w.pg.Breakdown()
	if err != nil {
		return d, err
	}
	d.PGByProcess = perEvent(bd, d.Events)
	usage, err := p.Wait(exitWait, stopGrace) // it exits by itself after confirming
	if err != nil {
		return d, err
	}
	if err := b.endWindow(ctx, w, b.relayURL, usage, &d); err != nil {
		return d, err
	}
	d.Seconds = end.Sub(p.Started()).Seconds()
	d.Fill()
	b.say("  %.0f events/s, CPU %.2fs, Postgres CPU %.2fs, WAL %d B", d.Rate, d.CPUSeconds, d.PGCPUSeconds, d.WALBytes)
	return d, nil
}

// relayDrain runs the relay binary in run's delivery mode on its slot until
// Kafka acknowledged the backlog, then stops it with SIGTERM.
func (b *bench) relayDrain(ctx context.Context, run relayRun) (results.Drain, error) {
	b.say("relay (built binary, --delivery %s, round %d) on slot %s: until Kafka acknowledged %d events",
		run.delivery, run.round, run.drainSlot(), b.cfg.Events)
	d := results.Drain{Name: "relay " + run.tag(), Events: b.cfg.Events, Delivery: run.delivery, Round: run.round}
	w, err := b.beginWindow(ctx, b.relayURL)
	if err != nil {
		return d, err
	}
	defer w.close()
	r, err := b.startRelay(relayOptions{slot: run.drainSlot(), topicPrefix: run.topicPrefix(), delivery: run.delivery})
	if err != nil {
		return d, err
	}
	defer func() { _, _ = r.Stop(stopGrace) }() // a no-op once stopped; cleanup on early return
	end, err := r.waitPublished(ctx, b.cfg.Events, b.drainTimeout())
	if err != nil {
		return d, err
	}
	bd, err := w.pg.Breakdown()
	if err != nil {
		return d, err
	}
	d.PGByProcess = perEvent(bd, d.Events)
	if m, err := r.metrics(ctx); err == nil {
		// The clean stop saves once more.
		d.CheckpointSaves = int(m.sum("cdc_relay_checkpoint_saves_total")) + 1
		d.ProduceRequests = int(m.sum("cdc_relay_produce_batches_total"))
		if d.ProduceRequests > 0 {
			d.MeanBatch = m.sum("cdc_relay_events_published_total") / float64(d.ProduceRequests)
		}
	}
	usage, err := r.Stop(stopGrace)
	if err != nil {
		return d, fmt.Errorf("stop relay after the drain: %w", err)
	}
	if err := b.endWindow(ctx, w, b.relayURL, usage, &d); err != nil {
		return d, err
	}
	d.Seconds = end.Sub(r.Started()).Seconds()
	d.Fill()
	b.say("  %.0f events/s, CPU %.2fs, peak RSS %.1f MiB, Postgres CPU %.2fs, WAL %d B", d.Rate, d.CPUSeconds, float64(d.PeakRSSBytes)/(1<<20), d.PGCPUSeconds, d.WALBytes)
	return d, nil
}

// verifyDrain reads a drain's topic back with kgo and checks that every event
// arrived and that, per aggregate, the payload's seq increases in offset order
// (repeats of an event id count as duplicates, not as order violations).
func verifyDrain(ctx context.Context, brokers []string, system, topic string, n int) (results.Verify, error) {
	v := results.Verify{System: system, Topic: topic}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	recs, err := testenv.ReadAll(rctx, brokers, topic)
	if err != nil {
		return v, fmt.Errorf("read back %s: %w", topic, err)
	}
	seen := make(map[string]struct{}, len(recs))
	last := make(map[string]int64)
	for _, r := range recs {
		v.Records++
		id := r.Headers["id"]
		if _, dup := seen[id]; dup {
			v.Duplicates++
			continue
		}
		seen[id] = struct{}{}
		var p struct {
			Seq *int64 `json:"seq"`
		}
		if err := json.Unmarshal(r.Value, &p); err != nil || p.Seq == nil {
			return v, fmt.Errorf("read back %s: record %d/%d has no seq: %q", topic, r.Partition, r.Offset, r.Value)
		}
		key := string(r.Key)
		if prev, ok := last[key]; ok && *p.Seq <= prev {
			v.OrderViolations++
		}
		last[key] = *p.Seq
	}
	v.Unique = len(seen)
	v.Missing = max(0, n-v.Unique)
	v.OK = v.Missing == 0 && v.OrderViolations == 0 && v.Unique == n
	return v, nil
}
