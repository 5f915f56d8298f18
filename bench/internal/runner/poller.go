package runner

// The poller phase: the same backlog in a fresh database, drained and then under steady load.

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

// pollerPhase loads the same backlog into a fresh database and drains it with
// the poller, then runs the steady loads through it.
func (b *bench) pollerPhase(ctx context.Context) error {
	var err error
	if b.pollerURL, err = b.pg.CreateDatabase(ctx, "poller"); err != nil {
		return fmt.Errorf("create poller database: %w", err)
	}
	if err := pgload.ApplyMigrations(ctx, b.pollerURL, filepath.Join(b.root, "migrations"), "001_outbox.sql"); err != nil {
		return err
	}
	b.say("poller: committing the same backlog into a fresh database")
	if b.res.PollerLoadSeconds, err = b.loadBacklog(ctx, b.pollerURL); err != nil {
		return err
	}

	b.say("poller: draining %d events (batch %d, idle sleep %s)", b.cfg.Events, b.cfg.PollerBatch, b.cfg.PollerIdle)
	d := results.Drain{Name: "poller", Events: b.cfg.Events}
	w, err := b.beginWindow(ctx, b.pollerURL)
	if err != nil {
		return err
	}
	defer w.close()
	p, err := b.startPoller(b.cfg.Events)
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
	b.res.Poller = d
	b.say("  %.0f events/s, CPU %.2fs, Postgres CPU %.2fs, WAL %d B", d.Rate, d.CPUSeconds, d.PGCPUSeconds, d.WALBytes)

	b.say("verifying the poller's Kafka records")
	v, err := verifyDrain(ctx, b.brokers, "poller", pollerTopicPrfx+drainAggType, b.cfg.Events)
	if err != nil {
		return err
	}
	b.res.Verify = append(b.res.Verify, v)

	b.say("poller latency: starting the poller")
	lp, err := b.startPoller(0)
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
	if err := b.latencyRuns(ctx, "poller", relayRun{}, b.pollerURL, pollerTopicPrfx, lp, alive, nil); err != nil {
		return err
	}
	if _, err := lp.Stop(stopGrace); err != nil {
		return fmt.Errorf("stop poller after the latency runs: %w", err)
	}
	return nil
}

// startPoller starts the poller child; count 0 runs it until stopped.
func (b *bench) startPoller(count int) (*child.Process, error) {
	return child.Start(child.Options{Name: "poller", Path: b.cfg.Self, Args: []string{"poller",
		"-url", b.pollerURL, "-brokers", strings.Join(b.brokers, ","), "-topic-prefix", pollerTopicPrfx,
		"-batch", strconv.Itoa(b.cfg.PollerBatch), "-idle", b.cfg.PollerIdle.String(), "-count", strconv.Itoa(count)}})
}
