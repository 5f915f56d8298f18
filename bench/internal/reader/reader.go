// Package reader is the benchmark's speed limit: the relay's own read path
// with a producer that discards. It streams a logical replication slot with
// internal/replication (the relay's stream loop, standby status updates and
// keepalive handling), decodes every message with internal/decoder configured
// exactly as the relay is (the configuration comes from the relay's command
// line, see cli.RelayConfig), routes each event to its topic with the relay's
// router, and counts. Everything the relay does on top — Kafka, the
// checkpoint store, backpressure — shows up as the gap between its rate and
// this one: relay/limit is what Kafka costs.
package reader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/bench/internal/latency"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/route"
)

// Config configures a read.
type Config struct {
	// Relay is the configuration the relay would run with; the reader uses
	// its PGURL, Slot, Publication, StatusInterval, Decoder, Topic and
	// TopicRegex.
	Relay relay.Config
	Count int // stop after this many outbox events
	// Hold keeps the connection (and so the server's walsender) open after
	// the count, still answering keepalives, until ctx ends: the benchmark
	// reads the walsender's CPU time before it exits.
	Hold bool
	// Latency, when set, keeps for every event the time from its commit to
	// its decoding, except for events committed within WarmUp of the first.
	Latency bool
	WarmUp  time.Duration
}

// Result is what a read saw.
type Result struct {
	Events       int
	Transactions int
	// Bytes is the events' size as the relay accounts it (outbox.Event.Size).
	Bytes int64
	// Confirmed is the last position confirmed to the slot: the end of the
	// last complete transaction read, never beyond.
	Confirmed pglogrepl.LSN
	// Latencies are commit → decoded times (Config.Latency only).
	Latencies []latency.Sample
}

// Run streams cfg.Relay.Slot from its confirmed position until cfg.Count
// events were decoded, then calls reached (if not nil), reads the rest of the
// current transaction, confirms its end and, unless cfg.Hold, disconnects.
// When ctx ends before the count it returns what it read so far with ctx's
// error; after the count, the end of ctx is a clean stop (nil).
func Run(ctx context.Context, cfg Config, reached func()) (Result, error) {
	rc := cfg.Relay
	if rc.StatusInterval <= 0 {
		rc.StatusInterval = relay.DefaultStatusInterval
	}
	dec, err := decoder.New(rc.Decoder)
	if err != nil {
		return Result{}, fmt.Errorf("build decoder: %w", err)
	}
	router, err := route.NewWithRegex(rc.Topic, rc.TopicRegex)
	if err != nil {
		return Result{}, fmt.Errorf("build topic router: %w", err)
	}
	h := &counter{dec: dec, router: router, count: cfg.Count, reached: reached, stop: make(chan struct{}),
		latency: cfg.Latency, warmUp: cfg.WarmUp}
	s, err := replication.Open(ctx, replication.StreamConfig{
		URL: rc.PGURL, Slot: rc.Slot, Publication: rc.Publication,
		StatusInterval: rc.StatusInterval, ReadCoalesce: rc.ReadCoalesce, ReadBuffer: rc.ReadBuffer, Logger: zerolog.Nop(), Metrics: metrics.Discard(),
	}, 0)
	if err != nil {
		return Result{}, err
	}
	defer s.Close(context.Background())
	err = s.Run(ctx, h.stop, h)
	h.res.Confirmed = h.Flushed()
	if h.res.Events >= cfg.Count && ctx.Err() != nil {
		// Stopped after the count was reached (the parent may stop the
		// reader as soon as it read the done line): a clean end.
		return h.res, nil
	}
	if !errors.Is(err, replication.ErrStopped) {
		return h.res, err
	}
	if err := s.SendStatus(ctx, h.Flushed()); err != nil {
		if h.res.Events >= cfg.Count && ctx.Err() != nil {
			return h.res, nil
		}
		return h.res, err
	}
	if cfg.Hold {
		// Nothing more is expected; the loop answers keepalives until ctx ends.
		if err := s.Run(ctx, nil, h); err != nil && ctx.Err() == nil {
			return h.res, err
		}
		h.res.Confirmed = h.Flushed()
	}
	return h.res, nil
}

// counter is the reader's replication.Handler: the relay's handler without
// the producer and the checkpoint tracker. It decodes, routes and counts;
// the position it reports as flushed is the end of the last transaction it
// read, which the relay reports once Kafka acknowledged and the store
// persisted it.
type counter struct {
	dec     *decoder.Decoder
	router  *route.Router
	count   int
	reached func()
	stop    chan struct{} // closed at the count: Run stops at the next boundary
	latency bool
	warmUp  time.Duration

	res     Result
	inTxn   bool
	flushed pglogrepl.LSN
	first   time.Time // commit time of the first event (Latency)
}

var _ replication.Handler = (*counter)(nil)

// HandleData decodes one pgoutput message.
func (c *counter) HandleData(_ context.Context, walStart pglogrepl.LSN, data []byte) error {
	msg, err := c.dec.Decode(data)
	if err != nil {
		return fmt.Errorf("decode pgoutput message at %s: %w", walStart, err)
	}
	switch msg.Kind {
	case decoder.KindBegin:
		c.inTxn = true
	case decoder.KindEvent:
		if !c.inTxn {
			return errors.New("decode pgoutput message: insert outside a transaction")
		}
		ev := msg.Event
		if _, err := c.router.Topic(ev); err != nil {
			return fmt.Errorf("route event %s: %w", ev.ID, err)
		}
		c.res.Events++
		c.res.Bytes += int64(ev.Size())
		if c.latency {
			if c.first.IsZero() {
				c.first = msg.CommitTime
			}
			if msg.CommitTime.Sub(c.first) >= c.warmUp {
				c.res.Latencies = append(c.res.Latencies, latency.Sample{Commit: msg.CommitTime, Latency: time.Since(msg.CommitTime)})
			}
		}
		c.dec.Recycle(ev) // done with it, as the relay is once Kafka acknowledged it
		if c.res.Events == c.count {
			if c.reached != nil {
				c.reached()
			}
			close(c.stop)
		}
	case decoder.KindCommit:
		c.res.Transactions++
		c.flushed = msg.EndLSN
		c.inTxn = false
	}
	return nil
}

// Keepalive moves the flushed position to the server's WAL end between
// transactions, as the relay's tracker does for an idle stream.
func (c *counter) Keepalive(serverWALEnd pglogrepl.LSN, _ time.Time) {
	if !c.inTxn && serverWALEnd > c.flushed {
		c.flushed = serverWALEnd
	}
}

// Flushed is the end of the last complete transaction read.
func (c *counter) Flushed() pglogrepl.LSN { return c.flushed }

// Backpressure never applies: nothing is in flight.
func (c *counter) Backpressure() <-chan struct{} { return nil }

// AtBoundary reports whether no transaction is partly read.
func (c *counter) AtBoundary() bool { return !c.inTxn }
