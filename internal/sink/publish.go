package sink

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/route"
)

// PublishError lists the events of one Publish call that failed for good, by
// their index in the slice given to Publish; every other event was acknowledged.
type PublishError struct {
	Errs map[int]error
}

func (e *PublishError) Error() string {
	first := -1
	for i := range e.Errs {
		if first < 0 || i < first {
			first = i
		}
	}
	return fmt.Sprintf("%d events failed, the first (#%d): %v", len(e.Errs), first, e.Errs[first])
}

// Publisher publishes batches of events outside the relay's stream (the
// replays of dead letters and outbox rows, the backfill) through the relay's
// own producer: acks=all, per-key order, the same headers, one producer for
// every topic. Publish calls are serialized.
type Publisher struct {
	// TopicWait bounds how long Publish waits for a topic it has not used yet
	// to exist (the broker creates it, when allowed, on first use). Default 30s.
	TopicWait time.Duration

	mu sync.Mutex // serializes Publish: the producer's Produce is single-goroutine
	k  *Kafka
}

// publishCall tracks the events of one Publish call.
type publishCall struct {
	mu   sync.Mutex
	left int
	errs map[int]error
	done chan struct{}
}

// NewPublisher checks, within ctx, that the brokers of cfg answer and
// returns a publisher producing with cfg. Close it when done.
func NewPublisher(ctx context.Context, cfg Config) (*Publisher, error) {
	cfg.Topics = nil // topics are given per Publish call, and waited for then
	k, err := Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Publisher{TopicWait: 30 * time.Second, k: k}, nil
}

// Publish sends events to topic, in order, and returns nil once Kafka
// acknowledged every one with acks=all. When some failed for good and the
// others were acknowledged, it returns a *PublishError naming the failed ones.
// Any other error (ctx ended, the topic could not be opened) means no event
// may be assumed delivered. Transient failures are retried until ctx ends,
// like the relay does. The events carry no source position: Kafka's copy is
// never taken for the stream's.
func (p *Publisher) Publish(ctx context.Context, topic string, events []*outbox.Event) error {
	if len(events) == 0 {
		return nil
	}
	if err := route.ValidTopic(topic); err != nil {
		errs := make(map[int]error, len(events))
		for i := range events {
			errs[i] = &outbox.EventError{Code: "invalid_topic", Err: err}
		}
		return &PublishError{Errs: errs}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	wait := p.TopicWait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	err := p.k.WaitTopic(wctx, topic)
	cancel()
	if err != nil {
		return fmt.Errorf("open topic %q: %w", topic, err)
	}
	c := &publishCall{left: len(events), errs: map[int]error{}, done: make(chan struct{})}
	for i, ev := range events {
		done := func(_ Message, _ Stored, err error) error {
			c.mu.Lock()
			defer c.mu.Unlock()
			if err != nil {
				c.errs[i] = err
			}
			if c.left--; c.left == 0 {
				close(c.done)
			}
			return nil // the producer goes on with the other events
		}
		if err := p.k.Produce(Message{Topic: topic, Event: ev}, done); err != nil { // only once halted, which our Done never does
			return fmt.Errorf("send to topic %q: %w", topic, err)
		}
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return fmt.Errorf("publish %d events to topic %q: %w", len(events), topic, ctx.Err())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errs) > 0 {
		return &PublishError{Errs: c.errs}
	}
	return nil
}

// Close closes the producer. Events not acknowledged by then stay so.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.k.Close(); err != nil {
		return fmt.Errorf("close Kafka producer: %w", err)
	}
	return nil
}
