package deadletter

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// Publisher publishes replayed events.
//
// Publish returns nil once Kafka acknowledged every event with acks=all. When
// some events failed for good and the others were acknowledged, it returns a
// *PublishError naming the failed ones. Any other error (the context ended, the
// topic could not be opened) means no event may be assumed delivered. The
// topic is an argument, not part of the event, because outbox.Event has no topic:
// the relay renders it from a template, while a dead letter stores it.
type Publisher interface {
	Publish(ctx context.Context, topic string, events []*outbox.Event) error
}

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

var _ Publisher = (*KafkaPublisher)(nil)

// KafkaPublisher publishes through the relay's own Kafka sink (internal/sink):
// acks=all, per-key order, the same headers. It opens one sink per topic, as
// a topic is first published to, because the sink routes by a template over
// event columns and a replayed event's topic is given, not derived. Publish
// calls are serialized.
type KafkaPublisher struct {
	cfg sink.Config
	// TopicWait bounds how long Publish waits for a topic it has not used yet
	// to exist (the broker creates it, when allowed, on first use). Default 30s.
	TopicWait time.Duration

	mu    sync.Mutex // serializes Publish: a sink's Send is single-goroutine
	sinks map[string]*sink.Kafka

	track   sync.Mutex // guards pending; taken by the sinks' callbacks
	pending map[*outbox.Event]pendingEvent
}

// pendingEvent is an event of a Publish call that Kafka has not answered yet.
type pendingEvent struct {
	call  *publishCall
	index int
}

// publishCall tracks the events of one Publish call.
type publishCall struct {
	left int
	errs map[int]error
	done chan struct{}
}

// probeTopic is a topic template: sink.Open with a template (not a fixed topic)
// only checks that the brokers answer, and creates nothing.
const probeTopic = "cdc-relay.replay.{event_type}"

// NewKafkaPublisher checks, within ctx, that the brokers of cfg answer and
// returns a publisher producing with cfg (cfg.Topic, OnAck and OnPermanent are
// set per topic by the publisher). Close it when done.
func NewKafkaPublisher(ctx context.Context, cfg sink.Config) (*KafkaPublisher, error) {
	probe := cfg
	probe.Topic = probeTopic
	k, err := sink.Open(ctx, probe)
	if err != nil {
		return nil, err
	}
	if err := k.Close(); err != nil {
		return nil, fmt.Errorf("close Kafka probe: %w", err)
	}
	return &KafkaPublisher{
		cfg:       cfg,
		TopicWait: 30 * time.Second,
		sinks:     map[string]*sink.Kafka{},
		pending:   map[*outbox.Event]pendingEvent{},
	}, nil
}

// Publish sends events to topic, in order, and waits until Kafka acknowledged
// all of them or reported the failure of some (see Publisher). Transient
// failures are retried until ctx ends, like the relay does.
func (p *KafkaPublisher) Publish(ctx context.Context, topic string, events []*outbox.Event) error {
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
	k, err := p.sink(ctx, topic)
	if err != nil {
		return err
	}
	c := &publishCall{left: len(events), errs: map[int]error{}, done: make(chan struct{})}
	p.track.Lock()
	for i, ev := range events {
		p.pending[ev] = pendingEvent{call: c, index: i}
	}
	p.track.Unlock()
	for _, ev := range events {
		if err := k.Send(ctx, ev); err != nil { // only when OnPermanent refuses, which ours never does
			p.forget(events)
			return fmt.Errorf("send to topic %q: %w", topic, err)
		}
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		p.forget(events)
		return fmt.Errorf("publish %d events to topic %q: %w", len(events), topic, ctx.Err())
	case <-k.Failed():
		p.forget(events)
		return fmt.Errorf("publish %d events to topic %q: %w", len(events), topic, k.Err())
	}
	if len(c.errs) > 0 {
		return &PublishError{Errs: c.errs}
	}
	return nil
}

// sink returns the sink of topic, opening it on first use.
func (p *KafkaPublisher) sink(ctx context.Context, topic string) (*sink.Kafka, error) {
	if k := p.sinks[topic]; k != nil {
		return k, nil
	}
	cfg := p.cfg
	cfg.Topic = topic
	cfg.OnAck = p.acked
	cfg.OnPermanent = p.failed
	wait := p.TopicWait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	octx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	k, err := sink.Open(octx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open topic %q: %w", topic, err)
	}
	p.sinks[topic] = k
	return k, nil
}

// forget drops the events of a Publish call that gave up waiting.
func (p *KafkaPublisher) forget(events []*outbox.Event) {
	p.track.Lock()
	defer p.track.Unlock()
	for _, ev := range events {
		delete(p.pending, ev)
	}
}

// acked is the sinks' OnAck.
func (p *KafkaPublisher) acked(batch []*outbox.Event) {
	p.track.Lock()
	defer p.track.Unlock()
	for _, ev := range batch {
		p.resolve(ev, nil)
	}
}

// failed is the sinks' OnPermanent: the event is reported to its Publish call,
// and the sink goes on with the others.
func (p *KafkaPublisher) failed(_ context.Context, ev *outbox.Event, err error) error {
	p.track.Lock()
	defer p.track.Unlock()
	p.resolve(ev, err)
	return nil
}

// resolve records the outcome of ev. Called with p.track held.
func (p *KafkaPublisher) resolve(ev *outbox.Event, err error) {
	pe, ok := p.pending[ev]
	if !ok {
		return // its Publish call gave up
	}
	delete(p.pending, ev)
	if err != nil {
		pe.call.errs[pe.index] = err
	}
	if pe.call.left--; pe.call.left == 0 {
		close(pe.call.done)
	}
}

// Close closes every sink. Events not acknowledged by then stay so.
func (p *KafkaPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	topics := make([]string, 0, len(p.sinks))
	for t := range p.sinks {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	var errs []error
	for _, t := range topics {
		if err := p.sinks[t].Close(); err != nil {
			errs = append(errs, fmt.Errorf("close producer of topic %q: %w", t, err))
		}
		delete(p.sinks, t)
	}
	return errors.Join(errs...)
}
