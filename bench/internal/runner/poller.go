package runner

// The poller: each drain cell's backlog copied into a fresh database and drained; the steady loads.

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cdc-relay/cdc-relay/bench/internal/child"
	"github.com/cdc-relay/cdc-relay/bench/internal/pgload"
	"github.com/cdc-relay/cdc-relay/bench/internal/results"
)

// pollerDrain loads the cell's backlog into a fresh database, drains it with
// the poller into the cell's poller topics, checks them and drops the
// database.
func (b *bench) pollerDrain(ctx context.Context, c DrainCell, cell *results.Cell) error {
	db := "poller_" + c.Tag
	var err error
	if b.pollerURL, err = b.pg.CreateDatabase(ctx, db); err != nil {
		return fmt.Errorf("create poller database: %w", err)
	}
	if err := pgload.ApplyMigrations(ctx, b.pollerURL, filepath.Join(b.root, "migrations"), "001_outbox.sql"); err != nil {
		return err
	}
	prefix := pollerTopicPrfx + c.Tag + "."
	if err := b.createTopics(ctx, c.topics(prefix), c.Shape.Partitions); err != nil {
		return err
	}
	b.say("  poller: committing the same backlog into a fresh database")
	secs, err := b.loadBacklog(ctx, b.pollerURL, c)
	if err != nil {
		return err
	}
	if c.Headline {
		b.res.PollerLoadSeconds = secs
	}

	b.say("  poller: draining %d events (batch %d, idle sleep %s)", c.Events, b.cfg.PollerBatch, b.cfg.PollerIdle)
	d := results.Drain{Name: "poller", Events: c.Events, Transactions: c.Transactions()}
	w, err := b.beginWindow(ctx, b.pollerURL)
	if err != nil {
		return err
	}
	defer w.close()
	p, err := b.startPoller(c.Events, prefix, c.Shape.Payload)
	if err != nil {
		return err
	}
	defer func() { _, _ = p.Stop(stopGrace) }() // a no-op once stopped; cleanup on early return
	end, err := waitDone(ctx, p, b.drainTimeout())
	if err != nil {
		return err
	}
	bd, err := w.pg.Breakdown()
	if err != nil {
		return err
	}
	d.PGByProcess = perEvent(bd, d.Events)
	usage, err := p.Wait(exitWait, stopGrace) // it exits by itself
	if err != nil {
		return err
	}
	if err := b.endWindow(ctx, w, b.pollerURL, usage, &d); err != nil {
		return err
	}
	d.Seconds = end.Sub(p.Started()).Seconds()
	d.Fill()
	cell.Poller = d
	b.say("    %.0f events/s, CPU %.2fs (%.2f µs/ev), Postgres CPU %.2fs, WAL %d B", d.Rate, d.CPUSeconds, d.CPUPerEventUS, d.PGCPUSeconds, d.WALBytes)

	v, err := verifyDrain(ctx, b.brokers, c.Name+" poller", c.topics(prefix), c.Events)
	if err != nil {
		return err
	}
	cell.Verify = append(cell.Verify, v)
	return b.dropDatabase(ctx, db)
}

// pollerLatencyPhase runs the steady loads through the poller, on a
// database of its own.
func (b *bench) pollerLatencyPhase(ctx context.Context) error {
	var err error
	if b.pollerURL, err = b.pg.CreateDatabase(ctx, "poller_latency"); err != nil {
		return fmt.Errorf("create poller database: %w", err)
	}
	if err := pgload.ApplyMigrations(ctx, b.pollerURL, filepath.Join(b.root, "migrations"), "001_outbox.sql"); err != nil {
		return err
	}
	prefix := pollerTopicPrfx + "lat."
	for _, lc := range b.latencyCells() {
		if err := b.createTopics(ctx, []string{prefix + latAggType(lc)}, b.cfg.Headline().Partitions); err != nil {
			return err
		}
	}
	b.say("poller latency: starting the poller")
	lp, err := b.startPoller(0, prefix, b.cfg.Headline().Payload)
	if err != nil {
		return err
	}
	defer func() { _, _ = lp.Stop(stopGrace) }() // a no-op once stopped; cleanup on early return
	alive := func() error {
		select {
		case <-lp.Done():
			return fmt.Errorf("poller exited: %v%s", lp.ExitError(), stderrSuffix(lp.StderrTail()))
		default:
			return nil
		}
	}
	if err := b.latencyRuns(ctx, "poller", relayRun{}, b.pollerURL, prefix, lp, alive, nil); err != nil {
		return err
	}
	if _, err := lp.Stop(stopGrace); err != nil {
		return fmt.Errorf("stop poller after the latency runs: %w", err)
	}
	return nil
}

// startPoller starts the poller child writing topics prefix+aggregate_type;
// count 0 runs it until stopped. Its produce batches have room for events of
// payload bytes.
func (b *bench) startPoller(count int, prefix string, payload int) (*child.Process, error) {
	return child.Start(child.Options{Name: "poller", Path: b.cfg.Self, Args: []string{"poller",
		"-url", b.pollerURL, "-brokers", strings.Join(b.brokers, ","), "-topic-prefix", prefix,
		"-batch", strconv.Itoa(b.cfg.PollerBatch), "-batch-bytes", strconv.Itoa(max(1<<20, 2*payload+64<<10)),
		"-idle", b.cfg.PollerIdle.String(), "-count", strconv.Itoa(count)}})
}
