package sink

// Metadata: broker reachability, topic partitions and their leaders.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/waitlog"
)

// probe asks the brokers for metadata every interval, so an outage shows in
// Healthy even when there is nothing to produce. kafka-go refreshes its cached
// metadata every MetadataTTL, so an outage shows within that plus interval.
func (k *Kafka) probe(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-k.ctx.Done():
			return
		case <-t.C:
		}
		_, err := k.metadata(k.ctx, []string{})
		if k.ctx.Err() != nil {
			return
		}
		ok := err == nil
		if k.reachable.Swap(ok) != ok {
			if ok {
				k.log.Info().Msg("Kafka brokers answer again")
			} else {
				k.log.Warn().Err(err).Msg("Kafka brokers do not answer")
			}
		}
	}
}

// Healthy reports whether Kafka accepts events: the brokers answered the last
// probe, no partition is retrying, and the producer has not halted.
func (k *Kafka) Healthy() bool {
	return k.reachable.Load() && !k.Retrying() && k.Err() == nil
}

// check waits until the brokers answer metadata requests and until the
// partitions of each of cfg.Topics are known.
func (k *Kafka) check(ctx context.Context) error {
	if len(k.cfg.Topics) == 0 {
		_, err := k.await(ctx, "")
		return err
	}
	for _, t := range k.cfg.Topics {
		if err := k.WaitTopic(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// WaitTopic waits, within ctx, until the partitions of topic are known (the
// broker is asked to create a missing topic). It returns an error that says
// what to fix when the topic cannot be used.
func (k *Kafka) WaitTopic(ctx context.Context, topic string) error {
	if ts := k.topics[topic]; ts != nil {
		select {
		case <-ts.known:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("wait for topic %q: %w", topic, ctx.Err())
		}
	}
	leaders, err := k.await(ctx, topic)
	if err != nil {
		return err
	}
	ts := &topicState{name: topic, known: make(chan struct{})}
	k.topics[topic] = ts
	ts.mu.Lock()
	k.addPartitions(ts, leaders)
	ts.mu.Unlock()
	return nil
}

// await retries until the brokers answer and, unless topic is "", until the
// topic's leaders are known, which it returns.
func (k *Kafka) await(ctx context.Context, topic string) ([]int32, error) {
	brokers := strings.Join(k.cfg.Brokers, ",")
	what := "Kafka brokers"
	if topic != "" {
		what = fmt.Sprintf("topic %q on Kafka brokers", topic)
	}
	hint := "check the brokers " + k.cfg.Names.Name("Brokers")
	if dl, ok := ctx.Deadline(); ok {
		hint += fmt.Sprintf("; giving up in %s", time.Until(dl).Round(time.Second))
	}
	wait := waitlog.Start(k.log, what, brokers, hint)
	defer wait.Done(false) // after a success, Done(true) has logged the answer
	var brokerAnswer error // the last answer from a broker, preferred over timeouts
	// lastCause is the last failure that was not the deadline: the attempt
	// the deadline cuts short ends with the deadline, not with why the
	// attempts before it failed (a TLS name mismatch, a refused login).
	var lastCause error
	for attempt := 0; ; attempt++ {
		var err error
		if topic != "" {
			var leaders []int32
			if leaders, err = k.leaders(ctx, topic); err == nil {
				wait.Done(true)
				return leaders, nil
			}
		} else if _, err = k.metadata(ctx, []string{}); err == nil {
			wait.Done(true)
			return nil, nil
		}
		wait.Failed(err)
		if !cutShort(err) {
			lastCause = err
		}
		var ke kafka.Error
		if errors.As(err, &ke) {
			brokerAnswer = err
			if ke == kafka.InvalidTopic || ke == kafka.TopicAuthorizationFailed {
				return nil, fmt.Errorf("topic %q on %s (check the topic %s and the broker's ACLs): %w", topic, brokers, k.cfg.Names.Name("Topics"), err)
			}
		}
		if serr := k.cfg.Retry.Sleep(ctx, attempt); serr != nil {
			if errors.As(brokerAnswer, &ke) && ke == kafka.UnknownTopicOrPartition {
				return nil, fmt.Errorf("topic %q does not exist and the broker does not create it automatically: create it, or fix the topic %s (%s): %w", topic, k.cfg.Names.Name("Topics"), wait.Summary(), brokerAnswer)
			}
			return nil, fmt.Errorf("reach Kafka brokers %s (check the brokers %s; %s): %w", brokers, k.cfg.Names.Name("Brokers"), wait.Summary(), awaitFailure(err, lastCause, brokerAnswer))
		}
	}
}

// awaitFailure is what await reports when it gives up after last: a
// broker's answer before anything else, and the last cause that was not the
// deadline before the deadline (with the last attempt's). The attempt that
// began as the deadline passed fails with the deadline (kafka-go's
// transport picks at random between its cached failure and the context's
// end).
func awaitFailure(last, lastCause, brokerAnswer error) error {
	switch {
	case brokerAnswer != nil:
		return brokerAnswer
	case lastCause != nil && cutShort(last):
		return fmt.Errorf("%w (the last attempt: %v)", lastCause, last)
	}
	return last
}

// cutShort reports whether err is a context's end rather than a failure of
// the attempt itself.
func cutShort(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// metadata asks for metadata of topics, allowing their auto-creation. kafka-go's
// Transport answers from its cache (refreshed every MetadataTTL) unless a topic
// is unknown there.
func (k *Kafka) metadata(ctx context.Context, topics []string) (*metadataAPI.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.RequestTimeout)
	defer cancel()
	m, err := k.transport.RoundTrip(ctx, k.addr, &metadataAPI.Request{
		TopicNames:             topics,
		AllowAutoTopicCreation: true,
	})
	if err != nil {
		return nil, err
	}
	res, ok := m.(*metadataAPI.Response)
	if !ok {
		return nil, fmt.Errorf("unexpected metadata response %T", m)
	}
	return res, nil
}

// leaders returns the leader broker of each partition of topic (-1 if none).
func (k *Kafka) leaders(ctx context.Context, topic string) ([]int32, error) {
	res, err := k.metadata(ctx, []string{topic})
	if err != nil {
		return nil, fmt.Errorf("fetch metadata of topic %q: %w", topic, err)
	}
	for _, t := range res.Topics {
		if t.Name != topic {
			continue
		}
		if t.ErrorCode != 0 {
			return nil, fmt.Errorf("fetch metadata of topic %q: %w", topic, kafka.Error(t.ErrorCode))
		}
		if len(t.Partitions) == 0 {
			return nil, fmt.Errorf("fetch metadata of topic %q: %w", topic, kafka.LeaderNotAvailable)
		}
		leaders := make([]int32, len(t.Partitions))
		for _, p := range t.Partitions {
			if int(p.PartitionIndex) < len(leaders) {
				leaders[p.PartitionIndex] = p.LeaderID
			}
		}
		return leaders, nil
	}
	return nil, fmt.Errorf("fetch metadata of topic %q: %w", topic, kafka.UnknownTopicOrPartition)
}

// topicState holds a topic's partitions once known, and the events that arrived
// before (kept in order until the partitions are known).
type topicState struct {
	name    string
	known   chan struct{} // closed once parts are set
	mu      sync.Mutex
	parts   []*partition
	ids     []int
	pending []item
}

// addPartitions creates ts's partitions, hands them the pending events in order
// and registers them with the dispatcher. Called with ts.mu held, or before ts
// is shared.
func (k *Kafka) addPartitions(ts *topicState, leaders []int32) {
	parts := make([]*partition, len(leaders))
	ids := make([]int, len(leaders))
	for i := range parts {
		ids[i] = i
		parts[i] = newPartition(k, ts.name, i, leaders[i])
	}
	var refused []failure
	now := time.Now().UnixNano()
	for _, it := range ts.pending {
		p, err := k.partitionFor(it.m.Event, ids)
		if err != nil {
			refused = append(refused, failure{it, err})
			continue
		}
		parts[p].push(it, now)
	}
	ts.pending = nil
	ts.ids = ids
	ts.parts = parts
	close(ts.known)
	k.mu.Lock()
	k.refused = append(k.refused, refused...)
	k.newTopics = append(k.newTopics, ts)
	k.mu.Unlock()
	k.signal()
	k.log.Info().Str("topic", ts.name).Int("partitions", len(parts)).Msg("producing to topic")
}

// resolve looks up a new topic's partitions, retrying until it succeeds or the
// producer closes, then releases the events that waited for it.
func (k *Kafka) resolve(ts *topicState) {
	for attempt := 0; ; attempt++ {
		leaders, err := k.leaders(k.ctx, ts.name)
		if err == nil {
			ts.mu.Lock()
			k.addPartitions(ts, leaders)
			ts.mu.Unlock()
			return
		}
		if k.ctx.Err() != nil {
			return
		}
		var ke kafka.Error
		if errors.As(err, &ke) && ke == kafka.InvalidTopic {
			// The broker refuses the name (e.g. it collides with another topic):
			// every event for it fails permanently. Later events keep queueing and
			// are failed after the next lookup.
			ts.mu.Lock()
			pending := ts.pending
			ts.pending = nil
			ts.mu.Unlock()
			k.mu.Lock()
			for _, it := range pending {
				k.refused = append(k.refused, failure{it, &outbox.EventError{Code: "invalid_topic", Err: err}})
			}
			k.mu.Unlock()
			k.signal()
		} else if attempt == 0 {
			k.log.Warn().Err(err).Str("topic", ts.name).Msg("topic not available yet; retrying with backoff")
		}
		if k.cfg.Retry.Sleep(k.ctx, attempt) != nil {
			return
		}
	}
}

// refresh looks up the leaders of every known topic in the background.
func (k *Kafka) refresh(parts []*partition, out chan<- map[string][]int32) bool {
	topics := map[string]bool{}
	for _, p := range parts {
		topics[p.topic] = true
	}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		leaders := map[string][]int32{}
		for t := range topics {
			if l, err := k.leaders(k.ctx, t); err == nil {
				leaders[t] = l
			}
		}
		select {
		case out <- leaders:
		case <-k.ctx.Done():
		}
	}()
	return true
}
