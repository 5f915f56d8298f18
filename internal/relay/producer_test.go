package relay_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// countingProducer is sink.Kafka counting the messages given to it and
// whether it was closed.
type countingProducer struct {
	*sink.Kafka
	produced atomic.Int64
	closed   atomic.Bool
}

// Produce counts m and hands it to sink.Kafka.
func (p *countingProducer) Produce(m sink.Message, done sink.Done) error {
	p.produced.Add(1)
	return p.Kafka.Produce(m, done)
}

// Close notes the close and closes sink.Kafka.
func (p *countingProducer) Close() error {
	p.closed.Store(true)
	return p.Kafka.Close()
}

// TestOpenProducer runs the relay with Config.OpenProducer set: it is
// called once, with the sink configuration the relay would give sink.Open
// (the fixed topic, idempotence for effectively-once, the relay's
// metrics), every event goes through the producer it returns, and Run
// closes that producer before it returns.
func TestOpenProducer(t *testing.T) {
	e := newEnv(t)
	var (
		mu     sync.Mutex
		opened []sink.Config
		p      *countingProducer
	)
	e.cfgHook = func(c *relay.Config) {
		c.OpenProducer = func(ctx context.Context, cfg sink.Config) (relay.Producer, error) {
			k, err := sink.Open(ctx, cfg)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			defer mu.Unlock()
			opened = append(opened, cfg)
			p = &countingProducer{Kafka: k}
			return p, nil
		}
	}
	e.start()
	e.tx(func(tx pgx.Tx) error {
		for i := range 3 {
			if _, err := insert(tx, "order", fmt.Sprintf("o-%d", i), "created", `{}`); err != nil {
				return err
			}
		}
		return nil
	})
	e.waitRecords(3)
	if err := e.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(opened) != 1 {
		t.Fatalf("OpenProducer called %d times, want once", len(opened))
	}
	cfg := opened[0]
	if !slices.Equal(cfg.Topics, []string{e.topic}) || !cfg.Idempotent || cfg.Metrics != e.m || cfg.Verifier == nil {
		t.Errorf("OpenProducer given Topics %v, Idempotent %v, the relay's metrics %v, a Verifier %v; want [%s], true, true, true",
			cfg.Topics, cfg.Idempotent, cfg.Metrics == e.m, cfg.Verifier != nil, e.topic)
	}
	if n := p.produced.Load(); n != 3 {
		t.Errorf("%d events produced through the producer OpenProducer opened, want 3", n)
	}
	if !p.closed.Load() {
		t.Errorf("Run returned without closing the producer OpenProducer opened")
	}
}
