// Package sink delivers outbox events to Kafka.
//
// Delivery contract: every event given to Send is eventually either acknowledged by
// Kafka with acks=all (reported through Config.OnAck), or reported once as a
// permanent failure (Config.OnPermanent); until then it is retried forever with
// exponential backoff and full jitter. Events with the same key go to the same
// partition (Java-compatible murmur2), and each partition has at most one produce
// request in flight, re-sent unchanged on failure, so events of one key reach Kafka
// in the order Send saw them and a retry never lets a later event overtake an
// earlier one.
//
// Retries are owned here and only here: the sink talks to kafka-go's low-level
// Client.Produce, which does not retry, instead of kafka-go's Writer, whose own
// MaxAttempts would multiply ours and whose next batch for a partition goes out
// after an earlier batch has given up, reordering the key.
package sink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

// Header keys the sink sets on every message.
const (
	HeaderID            = "id"
	HeaderEventType     = "event_type"
	HeaderAggregateType = "aggregate_type"
	HeaderCommitLSN     = "commit_lsn"
	HeaderCommitTime    = "commit_time"
)

// Config configures the Kafka sink.
type Config struct {
	Brokers []string
	// Topic is a topic template, e.g. "outbox.events" or "outbox.{aggregate_type}".
	Topic string
	// BatchMaxEvents and BatchMaxBytes bound one produce request. A batch goes out as
	// soon as the partition has no request in flight (no linger): under load, events
	// queue while the previous request is in flight and the next batch grows by itself.
	BatchMaxEvents int
	BatchMaxBytes  int
	Compression    kafka.Compression
	// RequestTimeout bounds one produce attempt.
	RequestTimeout time.Duration
	Retry          backoff.Policy
	// Transport carries TLS/SASL settings; nil means plain TCP.
	Transport *kafka.Transport
	Logger    zerolog.Logger
	Metrics   *metrics.Metrics

	// OnAck is called, from the partition's goroutine, with each batch Kafka
	// acknowledged. The slice is reused after OnAck returns.
	OnAck func(batch []*outbox.Event)
	// OnPermanent is called once for an event that failed permanently. Returning
	// nil means the caller took care of it (dead-lettered it) and the sink goes on
	// with the partition's next events; an error halts the sink (see Err).
	OnPermanent func(ctx context.Context, ev *outbox.Event, err error) error
}

func (c *Config) setDefaults() {
	if c.BatchMaxEvents <= 0 {
		c.BatchMaxEvents = 10000
	}
	if c.BatchMaxBytes <= 0 {
		c.BatchMaxBytes = 900 << 10 // under Kafka's default message.max.bytes (1 MB)
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 30 * time.Second
	}
	if c.Retry.Base <= 0 {
		c.Retry = backoff.Default
	}
	if c.Metrics == nil {
		c.Metrics = metrics.Discard()
	}
	if c.OnAck == nil {
		c.OnAck = func([]*outbox.Event) {}
	}
	if c.OnPermanent == nil {
		c.OnPermanent = func(_ context.Context, ev *outbox.Event, err error) error {
			return fmt.Errorf("event %s: %w", ev.ID, err)
		}
	}
}

// Kafka is the Kafka sink. Send is called from one goroutine; acknowledgements
// arrive on per-partition goroutines that Close stops.
type Kafka struct {
	cfg       Config
	log       zerolog.Logger
	client    *kafka.Client
	transport *kafka.Transport
	addr      net.Addr
	router    *Router
	balancer  kafka.Murmur2Balancer

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	topics map[string]*topicState // owned by the Send goroutine

	failing atomic.Int32 // partitions currently retrying
	errOnce sync.Once
	err     error
	failed  chan struct{}
}

// Open validates cfg, checks that the brokers answer and, for a fixed topic, that
// the topic exists (asking the broker to auto-create it), within ctx. The sink's
// goroutines live until Close.
func Open(ctx context.Context, cfg Config) (*Kafka, error) {
	cfg.setDefaults()
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("no Kafka brokers configured (set --kafka-brokers or CDC_RELAY_KAFKA_BROKERS)")
	}
	router, err := NewRouter(cfg.Topic)
	if err != nil {
		return nil, fmt.Errorf("%w (set --topic or CDC_RELAY_TOPIC)", err)
	}
	transport := cfg.Transport
	if transport == nil {
		transport = &kafka.Transport{}
	}
	if transport.MetadataTTL == 0 {
		transport.MetadataTTL = 5 * time.Second
	}
	if transport.ClientID == "" {
		transport.ClientID = "cdc-relay"
	}
	addr := kafka.TCP(cfg.Brokers...)
	runCtx, cancel := context.WithCancel(context.Background())
	k := &Kafka{
		cfg:       cfg,
		log:       cfg.Logger.With().Str("component", "sink").Logger(),
		client:    &kafka.Client{Addr: addr, Transport: transport, Timeout: cfg.RequestTimeout},
		transport: transport,
		addr:      addr,
		router:    router,
		balancer:  kafka.Murmur2Balancer{Consistent: true},
		ctx:       runCtx,
		cancel:    cancel,
		topics:    make(map[string]*topicState),
		failed:    make(chan struct{}),
	}
	if err := k.check(ctx); err != nil {
		cancel()
		transport.CloseIdleConnections()
		return nil, err
	}
	return k, nil
}

// check asks the brokers for metadata: for a fixed topic, its partitions.
func (k *Kafka) check(ctx context.Context) error {
	brokers := strings.Join(k.cfg.Brokers, ",")
	topic, fixed := k.router.Fixed()
	if !fixed {
		if _, err := k.metadata(ctx, []string{}); err != nil {
			return fmt.Errorf("reach Kafka brokers %s (check --kafka-brokers / CDC_RELAY_KAFKA_BROKERS): %w", brokers, err)
		}
		return nil
	}
	var lastErr error
	for attempt := 0; ; attempt++ {
		n, err := k.partitions(ctx, topic)
		if err == nil {
			ts := &topicState{name: topic}
			k.topics[topic] = ts
			k.setPartitions(ts, n)
			return nil
		}
		lastErr = err
		var ke kafka.Error
		if errors.As(err, &ke) && (ke == kafka.InvalidTopic || ke == kafka.TopicAuthorizationFailed) {
			return fmt.Errorf("topic %q on %s (check --topic / CDC_RELAY_TOPIC and the broker's ACLs): %w", topic, brokers, err)
		}
		if err := k.cfg.Retry.Sleep(ctx, attempt); err != nil {
			var hint string
			if errors.As(lastErr, &ke) && ke == kafka.UnknownTopicOrPartition {
				hint = fmt.Sprintf("topic %q does not exist and the broker does not create it automatically: create it, or fix --topic / CDC_RELAY_TOPIC", topic)
			} else {
				hint = fmt.Sprintf("reach Kafka brokers %s (check --kafka-brokers / CDC_RELAY_KAFKA_BROKERS)", brokers)
			}
			return fmt.Errorf("%s: %w", hint, lastErr)
		}
	}
}

// metadata sends a metadata request straight to the brokers (kafka-go's Client
// would answer from its cache) and allows auto-creation of the topics.
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

// partitions returns the partition count of topic.
func (k *Kafka) partitions(ctx context.Context, topic string) (int, error) {
	res, err := k.metadata(ctx, []string{topic})
	if err != nil {
		return 0, fmt.Errorf("fetch metadata of topic %q: %w", topic, err)
	}
	for _, t := range res.Topics {
		if t.Name != topic {
			continue
		}
		if t.ErrorCode != 0 {
			return 0, fmt.Errorf("fetch metadata of topic %q: %w", topic, kafka.Error(t.ErrorCode))
		}
		if len(t.Partitions) == 0 {
			return 0, fmt.Errorf("fetch metadata of topic %q: %w", topic, kafka.LeaderNotAvailable)
		}
		return len(t.Partitions), nil
	}
	return 0, fmt.Errorf("fetch metadata of topic %q: %w", topic, kafka.UnknownTopicOrPartition)
}

// topicState holds a topic's partitions once known, and the events that arrived
// before (kept in order until the partitions are known).
type topicState struct {
	name    string
	mu      sync.Mutex
	parts   []*partition
	ids     []int
	pending []*outbox.Event
}

// setPartitions creates n partition workers for ts and hands them the pending
// events in order. Called with ts.mu held, or before ts is shared.
func (k *Kafka) setPartitions(ts *topicState, n int) {
	parts := make([]*partition, n)
	ids := make([]int, n)
	for i := range parts {
		ids[i] = i
		parts[i] = newPartition(k, ts.name, i)
		k.wg.Add(1)
		go func(p *partition) {
			defer k.wg.Done()
			p.run(k.ctx)
		}(parts[i])
	}
	for _, ev := range ts.pending {
		parts[k.balancer.Balance(kafka.Message{Key: ev.AggregateID}, ids...)].push(ev)
	}
	ts.pending = nil
	ts.ids = ids
	ts.parts = parts
	k.log.Info().Str("topic", ts.name).Int("partitions", n).Msg("producing to topic")
}

// Send queues ev for delivery. It does not block on Kafka. Events with an empty
// key or a topic the template cannot name are permanent failures, handed to
// OnPermanent at once. Send must be called from one goroutine.
func (k *Kafka) Send(ctx context.Context, ev *outbox.Event) error {
	if len(ev.AggregateID) == 0 {
		return k.permanent(ctx, ev, &EventError{Code: "empty_key", Err: errors.New("aggregate_id is NULL or empty; events need a key to keep their order")})
	}
	topic, err := k.router.Topic(ev)
	if err != nil {
		return k.permanent(ctx, ev, err)
	}
	ts := k.topics[topic]
	if ts == nil {
		ts = &topicState{name: topic}
		k.topics[topic] = ts
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			k.resolve(ts)
		}()
	}
	ts.mu.Lock()
	if ts.parts == nil {
		ts.pending = append(ts.pending, ev)
		ts.mu.Unlock()
		return nil
	}
	ts.mu.Unlock()
	ts.parts[k.balancer.Balance(kafka.Message{Key: ev.AggregateID}, ts.ids...)].push(ev)
	return nil
}

// resolve looks up a new topic's partitions, retrying until it succeeds or the
// sink closes, then releases the events that waited for it.
func (k *Kafka) resolve(ts *topicState) {
	for attempt := 0; ; attempt++ {
		n, err := k.partitions(k.ctx, ts.name)
		if err == nil {
			ts.mu.Lock()
			k.setPartitions(ts, n)
			ts.mu.Unlock()
			return
		}
		if k.ctx.Err() != nil {
			return
		}
		var ke kafka.Error
		if errors.As(err, &ke) && ke == kafka.InvalidTopic {
			ts.mu.Lock()
			pending := ts.pending
			ts.pending = nil
			ts.mu.Unlock()
			// Later events for this topic keep queueing in pending; the topic is
			// looked up again (and fails again) for them.
			for _, ev := range pending {
				if k.permanent(k.ctx, ev, &EventError{Code: "invalid_topic", Err: err}) != nil {
					return
				}
			}
			continue
		}
		if attempt == 0 {
			k.log.Warn().Err(err).Str("topic", ts.name).Msg("topic not available yet; retrying with backoff")
		}
		if k.cfg.Retry.Sleep(k.ctx, attempt) != nil {
			return
		}
	}
}

// permanent reports a permanent failure of ev to OnPermanent; when that refuses
// it, the sink halts.
func (k *Kafka) permanent(ctx context.Context, ev *outbox.Event, err error) error {
	k.cfg.Metrics.ProduceErrors.WithLabelValues("permanent").Inc()
	k.cfg.Metrics.PermanentFailures.WithLabelValues(Code(err)).Inc()
	if herr := k.cfg.OnPermanent(ctx, ev, err); herr != nil {
		k.halt(herr)
		return herr
	}
	return nil
}

// halt records the first fatal error and closes Failed.
func (k *Kafka) halt(err error) {
	k.errOnce.Do(func() {
		k.err = err
		close(k.failed)
	})
}

// Failed is closed when the sink halted on a permanent failure; Err says why.
func (k *Kafka) Failed() <-chan struct{} { return k.failed }

// Err returns the error that halted the sink, or nil.
func (k *Kafka) Err() error {
	select {
	case <-k.failed:
		return k.err
	default:
		return nil
	}
}

// Retrying reports whether any partition is currently retrying a failed request.
func (k *Kafka) Retrying() bool { return k.failing.Load() > 0 }

// Close stops every goroutine of the sink. Events not yet acknowledged stay
// unacknowledged: the caller drains first when it wants them delivered.
func (k *Kafka) Close() error {
	k.cancel()
	k.wg.Wait()
	k.transport.CloseIdleConnections()
	return nil
}

// partition owns one topic-partition: a FIFO of events and the goroutine that
// produces them with at most one request in flight.
type partition struct {
	k     *Kafka
	topic string
	id    int

	mu    sync.Mutex
	queue []*outbox.Event
	spare []*outbox.Event
	wake  chan struct{}

	records []kafka.Record
	headers []kafka.Header
	lsn     pglogrepl.LSN
	lsnText []byte
	tsText  []byte
	ts      time.Time

	events prometheusCounter
	bytes  prometheusCounter
}

// prometheusCounter is the part of a Prometheus counter the partition uses.
type prometheusCounter interface{ Add(float64) }

func newPartition(k *Kafka, topic string, id int) *partition {
	return &partition{
		k:      k,
		topic:  topic,
		id:     id,
		wake:   make(chan struct{}, 1),
		events: k.cfg.Metrics.EventsPublished.WithLabelValues(topic),
		bytes:  k.cfg.Metrics.BytesPublished.WithLabelValues(topic),
	}
}

func (p *partition) push(ev *outbox.Event) {
	p.mu.Lock()
	p.queue = append(p.queue, ev)
	first := len(p.queue) == 1
	p.mu.Unlock()
	if first {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// take removes the next batch from the queue, or returns nil when it is empty.
func (p *partition) take() []*outbox.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) == 0 {
		return nil
	}
	maxEvents, maxBytes := p.k.cfg.BatchMaxEvents, p.k.cfg.BatchMaxBytes
	n, size := 0, 0
	for n < len(p.queue) && n < maxEvents {
		s := p.queue[n].Size()
		if n > 0 && size+s > maxBytes {
			break
		}
		size += s
		n++
	}
	if n == len(p.queue) {
		batch := p.queue
		p.queue = p.spare[:0]
		p.spare = nil
		return batch
	}
	batch := make([]*outbox.Event, n)
	copy(batch, p.queue)
	rest := copy(p.queue, p.queue[n:])
	clear(p.queue[rest:])
	p.queue = p.queue[:rest]
	return batch
}

// recycle keeps a delivered batch's slice for reuse.
func (p *partition) recycle(batch []*outbox.Event) {
	clear(batch)
	p.mu.Lock()
	if p.spare == nil || cap(batch) > cap(p.spare) {
		p.spare = batch[:0]
	}
	p.mu.Unlock()
}

func (p *partition) run(ctx context.Context) {
	for {
		batch := p.take()
		if batch == nil {
			select {
			case <-ctx.Done():
				return
			case <-p.wake:
				continue
			}
		}
		if err := p.deliver(ctx, batch); err != nil {
			return
		}
		p.recycle(batch)
	}
}

// deliver produces batch until Kafka acknowledges it, splitting it when Kafka
// rejects it as too large, and reporting single events that fail permanently.
// It returns an error only when ctx is done or the sink halted.
func (p *partition) deliver(ctx context.Context, batch []*outbox.Event) error {
	failing := false
	defer func() {
		if failing {
			p.k.setFailing(false, nil, p)
		}
	}()
	for attempt := 0; ; attempt++ {
		start := time.Now()
		err := p.produce(ctx, batch)
		if err == nil {
			p.acked(batch, start)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		class := Classify(err)
		if class == Permanent {
			if len(batch) > 1 {
				// The batch as a whole may be what is too large: halve it, in order.
				half := len(batch) / 2
				if err := p.deliver(ctx, batch[:half]); err != nil {
					return err
				}
				return p.deliver(ctx, batch[half:])
			}
			return p.k.permanent(ctx, batch[0], &EventError{Code: Code(err), Err: err})
		}
		p.k.cfg.Metrics.ProduceErrors.WithLabelValues("transient").Inc()
		p.k.cfg.Metrics.ProduceRetries.Inc()
		if !failing {
			failing = true
			p.k.setFailing(true, err, p)
		}
		if err := p.k.cfg.Retry.Sleep(ctx, attempt); err != nil {
			return err
		}
	}
}

// setFailing tracks how many partitions are retrying and logs only the first
// failure and the last recovery, not every attempt.
func (k *Kafka) setFailing(on bool, err error, p *partition) {
	if on {
		if k.failing.Add(1) == 1 {
			ev := k.log.Warn()
			if Classify(err) == Configuration {
				ev = k.log.Error()
			}
			ev.Err(err).Str("topic", p.topic).Int("partition", p.id).Str("class", Classify(err).String()).
				Msg("Kafka produce failing; retrying with backoff, nothing is confirmed meanwhile")
		}
		return
	}
	if k.failing.Add(-1) == 0 {
		k.log.Info().Str("topic", p.topic).Int("partition", p.id).Msg("Kafka produce recovered")
	}
}

func (p *partition) acked(batch []*outbox.Event, start time.Time) {
	now := time.Now()
	m := p.k.cfg.Metrics
	m.ProduceBatches.Inc()
	m.ProduceBatchSize.Observe(float64(len(batch)))
	m.ProduceLatency.Observe(now.Sub(start).Seconds())
	m.EndToEndLatency.Observe(now.Sub(batch[0].CommitTime).Seconds())
	var bytes int
	for _, ev := range batch {
		bytes += len(ev.Payload)
	}
	p.events.Add(float64(len(batch)))
	p.bytes.Add(float64(bytes))
	p.k.cfg.OnAck(batch)
}

// produce sends batch as one produce request with acks=all.
func (p *partition) produce(ctx context.Context, batch []*outbox.Event) error {
	records := p.records[:0]
	nh := 0
	for _, ev := range batch {
		nh += 5 + len(ev.Headers)
	}
	if cap(p.headers) < nh {
		p.headers = make([]kafka.Header, nh)
	}
	headers := p.headers[:nh]
	now := time.Now()
	for _, ev := range batch {
		h := headers[: 0 : 5+len(ev.Headers)]
		headers = headers[5+len(ev.Headers):]
		h = append(h,
			kafka.Header{Key: HeaderID, Value: ev.ID},
			kafka.Header{Key: HeaderEventType, Value: ev.EventType},
			kafka.Header{Key: HeaderAggregateType, Value: ev.AggregateType},
			kafka.Header{Key: HeaderCommitLSN, Value: p.lsnBytes(ev.CommitLSN)},
			kafka.Header{Key: HeaderCommitTime, Value: p.timeBytes(ev.CommitTime)},
		)
		for _, x := range ev.Headers {
			h = append(h, kafka.Header{Key: x.Key, Value: x.Value})
		}
		records = append(records, kafka.Record{
			Time:    now,
			Key:     kafka.NewBytes(ev.AggregateID),
			Value:   kafka.NewBytes(ev.Payload),
			Headers: h,
		})
	}
	p.records = records
	defer clear(p.records)

	ctx, cancel := context.WithTimeout(ctx, p.k.cfg.RequestTimeout)
	defer cancel()
	res, err := p.k.client.Produce(ctx, &kafka.ProduceRequest{
		Topic:        p.topic,
		Partition:    p.id,
		RequiredAcks: kafka.RequireAll,
		Records:      kafka.NewRecordReader(records...),
		Compression:  p.k.cfg.Compression,
	})
	if err != nil {
		return fmt.Errorf("produce %d events to %s/%d: %w", len(batch), p.topic, p.id, err)
	}
	if res.Error != nil {
		return fmt.Errorf("produce %d events to %s/%d: %w", len(batch), p.topic, p.id, res.Error)
	}
	for i, rerr := range res.RecordErrors {
		return fmt.Errorf("produce %d events to %s/%d: record %d: %w", len(batch), p.topic, p.id, i, rerr)
	}
	return nil
}

// lsnBytes formats lsn, reusing the last result for events of one transaction.
// The returned slice is not modified afterwards (a new one is made per LSN).
func (p *partition) lsnBytes(lsn pglogrepl.LSN) []byte {
	if lsn != p.lsn || p.lsnText == nil {
		p.lsn = lsn
		p.lsnText = []byte(lsn.String())
	}
	return p.lsnText
}

// timeBytes formats t as RFC 3339 in UTC, reusing the last result.
func (p *partition) timeBytes(t time.Time) []byte {
	if !t.Equal(p.ts) || p.tsText == nil {
		p.ts = t
		p.tsText = []byte(t.UTC().Format(time.RFC3339Nano))
	}
	return p.tsText
}
