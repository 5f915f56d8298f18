// Package sink delivers outbox events to Kafka.
//
// Delivery contract: every event given to Send is eventually either acknowledged by
// Kafka with acks=all (reported through Config.OnAck), or reported once as a
// permanent failure (Config.OnPermanent); until then it is retried forever with
// exponential backoff and full jitter. Events with the same key go to the same
// partition (Java-compatible murmur2), and each partition has at most one batch in
// flight, re-sent unchanged and ahead of anything newer when it fails, so events of
// one key reach Kafka in the order Send saw them and a retry never lets a later
// event overtake an earlier one.
//
// One dispatcher goroutine owns the partitions' state. For every broker with no
// request in flight it builds one produce request carrying a batch of each ready
// partition that broker leads, so under load requests grow instead of multiplying,
// and with nothing queued an event goes out at once (no linger).
//
// Retries are owned here and only here: requests go through kafka-go's Transport,
// which does not retry, instead of kafka-go's Writer, whose own MaxAttempts would
// multiply ours and whose next batch for a partition goes out after an earlier
// batch has given up, reordering the key.
package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/route"
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
	// BatchMaxEvents and BatchMaxBytes bound one partition's batch; keep the bytes
	// below the broker's message.max.bytes. MaxRequestBytes bounds one request.
	BatchMaxEvents  int
	BatchMaxBytes   int
	MaxRequestBytes int
	Compression     kafka.Compression
	// RequestTimeout bounds one produce attempt.
	RequestTimeout time.Duration
	Retry          backoff.Policy
	// Transport carries TLS/SASL settings; nil means plain TCP. Open copies
	// its settings into a Transport of its own, whose Dial it wraps so Close
	// can end connections with requests in flight.
	Transport *kafka.Transport
	Logger    zerolog.Logger
	Metrics   *metrics.Metrics
	// Linger bounds how long events may wait for more to join their request
	// while the input is still flowing (default 5ms); QuietGap is how long the
	// input must pause for the stream to count as having nothing more buffered
	// (default 250µs); FlushEvents sends at once when that many are queued
	// (default 1000). With a quiet input an event goes out at once; with a busy
	// one, requests grow instead of multiplying.
	Linger      time.Duration
	QuietGap    time.Duration
	FlushEvents int
	// MinInterval spaces requests: unless FlushEvents are queued, a request
	// waits until MinInterval after the previous one (default 1ms). At high
	// rates each request then carries what arrived meanwhile, instead of one
	// transaction's worth (a request costs ~300µs of CPU whatever its size).
	MinInterval time.Duration
	// BreakerThreshold is how many produce requests in a row must fail before
	// the circuit opens (default 5). While it is open the caller should stop
	// reading (see CircuitOpen); retries go on as probes and one success closes it.
	BreakerThreshold int

	// OnAck is called with each batch Kafka acknowledged, from the sink's
	// dispatcher goroutine. The slice is reused after OnAck returns.
	OnAck func(batch []*outbox.Event)
	// OnPermanent is called once for an event that failed permanently, from the
	// goroutine that calls Send (empty key, invalid topic) or from the dispatcher
	// (rejected by Kafka), so it must be safe for concurrent use. Returning nil
	// means the caller took care of the event (dead-lettered it) and the sink goes
	// on; an error halts the sink (see Err): no partition produces anything more.
	OnPermanent func(ctx context.Context, ev *outbox.Event, err error) error
}

func (c *Config) setDefaults() {
	if c.BatchMaxEvents <= 0 {
		c.BatchMaxEvents = 10000
	}
	if c.BatchMaxBytes <= 0 {
		c.BatchMaxBytes = 900 << 10 // under Kafka's default message.max.bytes (1 MB)
	}
	if c.MaxRequestBytes <= 0 {
		c.MaxRequestBytes = 8 << 20
	}
	if c.MaxRequestBytes < c.BatchMaxBytes {
		c.MaxRequestBytes = c.BatchMaxBytes
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 30 * time.Second
	}
	if c.BreakerThreshold <= 0 {
		c.BreakerThreshold = 5
	}
	if c.Linger <= 0 {
		c.Linger = 5 * time.Millisecond
	}
	if c.QuietGap <= 0 {
		c.QuietGap = 250 * time.Microsecond
	}
	if c.FlushEvents <= 0 {
		c.FlushEvents = 1000
	}
	if c.MinInterval <= 0 {
		c.MinInterval = time.Millisecond
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

// Kafka is the Kafka sink. Send is called from one goroutine.
type Kafka struct {
	cfg       Config
	log       zerolog.Logger
	transport *kafka.Transport
	conns     *connTracker
	addr      net.Addr
	router    *route.Router
	balancer  kafka.Murmur2Balancer

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	topics map[string]*topicState // owned by the Send goroutine

	// Dispatcher inbox: a wake-up signal and topics whose partitions are known.
	wake      chan struct{}
	mu        sync.Mutex
	newTopics []*topicState

	lastPush  atomic.Int64 // UnixNano of the newest Send
	lastSent  int64        // UnixNano of the newest request (dispatcher-owned)
	failing   atomic.Int32 // partitions currently retrying
	reachable atomic.Bool  // the last metadata probe succeeded
	circuit   atomic.Int32 // circuitClosed, circuitOpen, circuitHalfOpen
	failedRun int          // produce requests failed in a row (dispatcher-owned)
	circuitMu sync.Mutex
	closing   chan struct{} // closed when an open circuit closes
	errOnce   sync.Once
	err       error
	failed    chan struct{}
}

// Open validates cfg, waits (within ctx) until the brokers answer and, for a fixed
// topic, until the topic exists (asking the broker to auto-create it). The sink's
// goroutines live until Close.
func Open(ctx context.Context, cfg Config) (*Kafka, error) {
	cfg.setDefaults()
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("no Kafka brokers configured (set --kafka-brokers or CDC_RELAY_KAFKA_BROKERS)")
	}
	router, err := route.New(cfg.Topic)
	if err != nil {
		return nil, fmt.Errorf("%w (set --topic or CDC_RELAY_TOPIC)", err)
	}
	// A Transport of its own, with the settings of cfg's: Open wraps its Dial
	// and Close ends its connections, so sinks opened with one Config (the
	// replay publisher opens several) must not share one.
	transport := &kafka.Transport{}
	if t := cfg.Transport; t != nil {
		transport = &kafka.Transport{Dial: t.Dial, DialTimeout: t.DialTimeout, IdleTimeout: t.IdleTimeout,
			MetadataTTL: t.MetadataTTL, MetadataTopics: t.MetadataTopics, ClientID: t.ClientID,
			TLS: t.TLS, SASL: t.SASL, Resolver: t.Resolver, Context: t.Context}
	}
	if transport.MetadataTTL == 0 {
		transport.MetadataTTL = 5 * time.Second
	}
	if transport.ClientID == "" {
		transport.ClientID = "cdc-relay"
	}
	conns := &connTracker{dial: transport.Dial, conns: make(map[net.Conn]struct{})}
	transport.Dial = conns.Dial
	runCtx, cancel := context.WithCancel(context.Background())
	k := &Kafka{
		cfg:       cfg,
		log:       cfg.Logger.With().Str("component", "sink").Logger(),
		transport: transport,
		conns:     conns,
		addr:      kafka.TCP(cfg.Brokers...),
		router:    router,
		balancer:  kafka.Murmur2Balancer{Consistent: true},
		ctx:       runCtx,
		cancel:    cancel,
		topics:    make(map[string]*topicState),
		wake:      make(chan struct{}, 1),
		failed:    make(chan struct{}),
	}
	if err := k.check(ctx); err != nil {
		cancel()
		transport.CloseIdleConnections()
		conns.closeAll()
		return nil, err
	}
	k.reachable.Store(true)
	k.wg.Add(2)
	go func() {
		defer k.wg.Done()
		k.dispatch()
	}()
	go func() {
		defer k.wg.Done()
		k.probe(2 * time.Second)
	}()
	return k, nil
}

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
// probe, no partition is retrying, and the sink has not halted.
func (k *Kafka) Healthy() bool {
	return k.reachable.Load() && !k.Retrying() && k.Err() == nil
}

// check waits until the brokers answer metadata requests and, for a fixed topic,
// until its partitions are known.
func (k *Kafka) check(ctx context.Context) error {
	brokers := strings.Join(k.cfg.Brokers, ",")
	topic, fixed := k.router.Fixed()
	var brokerAnswer error // the last answer from a broker, preferred over timeouts
	for attempt := 0; ; attempt++ {
		var err error
		if fixed {
			var leaders []int32
			if leaders, err = k.leaders(ctx, topic); err == nil {
				ts := &topicState{name: topic}
				k.topics[topic] = ts
				k.addPartitions(ts, leaders)
				return nil
			}
		} else if _, err = k.metadata(ctx, []string{}); err == nil {
			return nil
		}
		var ke kafka.Error
		if errors.As(err, &ke) {
			brokerAnswer = err
			if ke == kafka.InvalidTopic || ke == kafka.TopicAuthorizationFailed {
				return fmt.Errorf("topic %q on %s (check --topic / CDC_RELAY_TOPIC and the broker's ACLs): %w", topic, brokers, err)
			}
		}
		if serr := k.cfg.Retry.Sleep(ctx, attempt); serr != nil {
			if errors.As(brokerAnswer, &ke) && ke == kafka.UnknownTopicOrPartition {
				return fmt.Errorf("topic %q does not exist and the broker does not create it automatically: create it, or fix --topic / CDC_RELAY_TOPIC: %w", topic, brokerAnswer)
			}
			if brokerAnswer != nil {
				err = brokerAnswer
			}
			return fmt.Errorf("reach Kafka brokers %s (check --kafka-brokers / CDC_RELAY_KAFKA_BROKERS): %w", brokers, err)
		}
	}
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
	mu      sync.Mutex
	parts   []*partition
	ids     []int
	pending []*outbox.Event
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
	for _, ev := range ts.pending {
		parts[k.balancer.Balance(kafka.Message{Key: ev.AggregateID}, ids...)].push(ev)
	}
	ts.pending = nil
	ts.ids = ids
	ts.parts = parts
	k.mu.Lock()
	k.newTopics = append(k.newTopics, ts)
	k.mu.Unlock()
	k.signal()
	k.log.Info().Str("topic", ts.name).Int("partitions", len(parts)).Msg("producing to topic")
}

// signal wakes the dispatcher.
func (k *Kafka) signal() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// Send queues ev for delivery. It does not block on Kafka. Events with an empty
// key or a topic the template cannot name are permanent failures, handed to
// OnPermanent at once. Send must be called from one goroutine.
func (k *Kafka) Send(ctx context.Context, ev *outbox.Event) error {
	if len(ev.AggregateID) == 0 {
		return k.permanent(ctx, ev, &outbox.EventError{Code: "empty_key", Err: errors.New("aggregate_id is NULL or empty; events need a key to keep their order")})
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
			for _, ev := range pending {
				if k.permanent(k.ctx, ev, &outbox.EventError{Code: "invalid_topic", Err: err}) != nil {
					return
				}
			}
		} else if attempt == 0 {
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

// halt records the first fatal error, closes Failed and stops producing.
func (k *Kafka) halt(err error) {
	k.errOnce.Do(func() {
		k.err = err
		close(k.failed)
		k.cancel()
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

// Close stops every goroutine of the sink and closes its connections. Events not
// yet acknowledged stay unacknowledged: the caller drains first when it wants
// them delivered.
func (k *Kafka) Close() error {
	k.cancel()
	k.conns.closeAll() // ends requests in flight, which kafka-go would wait out
	k.wg.Wait()
	k.transport.CloseIdleConnections()
	return nil
}

// partition is one topic-partition: its queue (filled by Send) and its delivery
// state (owned by the dispatcher).
type partition struct {
	topic  string
	id     int
	k      *Kafka
	events prometheusCounter
	bytes  prometheusCounter

	mu    sync.Mutex
	queue []*outbox.Event
	since int64 // UnixNano when the queue became non-empty
	// sending mirrors inFlight for push: a partition whose batch is in flight is
	// looked at again when the response comes, so a new event need not wake the
	// dispatcher (each wake-up is a futex call and a scheduler round).
	sending atomic.Bool

	// Dispatcher-owned.
	leader    int32
	inFlight  bool
	retry     []*outbox.Event // the batch to send next, ahead of the queue
	limit     int             // event limit while splitting a rejected batch
	attempt   int
	notBefore time.Time
	failing   bool
	spare     []*outbox.Event
}

// prometheusCounter is the part of a Prometheus counter the partition uses.
type prometheusCounter interface{ Add(float64) }

func newPartition(k *Kafka, topic string, id int, leader int32) *partition {
	return &partition{
		topic: topic, id: id, k: k, leader: leader,
		events: k.cfg.Metrics.EventsPublished.WithLabelValues(topic),
		bytes:  k.cfg.Metrics.BytesPublished.WithLabelValues(topic),
	}
}

// push appends ev to the queue and tells the dispatcher when the queue was empty.
func (p *partition) push(ev *outbox.Event) {
	now := time.Now().UnixNano()
	p.k.lastPush.Store(now)
	p.mu.Lock()
	p.queue = append(p.queue, ev)
	first := len(p.queue) == 1
	if first {
		p.since = now
	}
	p.mu.Unlock()
	if first && !p.sending.Load() {
		p.k.signal()
	}
}

// next returns the partition's next batch within maxBytes (at least one event),
// or nil when it has nothing to send.
func (p *partition) next(maxBytes int) []*outbox.Event {
	if p.retry != nil {
		b := p.retry
		p.retry = nil
		return b
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) == 0 {
		return nil
	}
	maxEvents := p.k.cfg.BatchMaxEvents
	if p.limit > 0 && p.limit < maxEvents {
		maxEvents = p.limit
	}
	if maxBytes > p.k.cfg.BatchMaxBytes {
		maxBytes = p.k.cfg.BatchMaxBytes
	}
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

// unshift puts events back at the front of the queue (the later half of a split
// batch), ahead of everything queued since.
func (p *partition) unshift(events []*outbox.Event) {
	p.mu.Lock()
	q := make([]*outbox.Event, 0, len(events)+len(p.queue))
	q = append(q, events...)
	p.queue = append(q, p.queue...)
	p.mu.Unlock()
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

// queued returns the queue's length and when it became non-empty.
func (p *partition) queued() (int, int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue), p.since
}

// hasQueued reports whether the queue has events.
func (p *partition) hasQueued() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue) > 0
}

// request is one produce request in flight to one broker.
type request struct {
	broker  int32
	parts   []*partition
	batches [][]*outbox.Event
	start   time.Time
	res     *produceAPI.Response
	err     error
}

// dispatch is the sink's state machine: it builds requests for idle brokers,
// applies their responses, and schedules retries.
func (k *Kafka) dispatch() {
	var (
		parts      []*partition
		byBroker   = map[int32]bool{} // brokers with a request in flight
		done       = make(chan *request)
		inFlight   int
		timer      = time.NewTimer(time.Hour)
		refreshing bool
		refreshed  = make(chan map[string][]int32, 1)
		enc        encoder
	)
	defer timer.Stop()
	defer func() {
		// Wait for requests in flight; Close has closed their connections.
		for ; inFlight > 0; inFlight-- {
			<-done
		}
		k.failing.Store(0) // stopped: nothing is retrying any more
	}()
	for {
		if k.ctx.Err() != nil { // closed, or halted by a permanent failure
			return
		}
		k.mu.Lock()
		for _, ts := range k.newTopics {
			parts = append(parts, ts.parts...)
		}
		k.newTopics = nil
		k.mu.Unlock()

		// Build one request per idle broker from its ready partitions, once the
		// input paused, enough is queued, or the oldest event waited Linger.
		now := time.Now()
		wakeAt, send := k.gate(now, parts, byBroker)
		if send {
			var reqs map[int32]*request
			reqs, wakeAt = k.collect(now, parts, byBroker, &refreshing, refreshed)
			if len(reqs) > 0 {
				k.lastSent = now.UnixNano()
			}
			for b, r := range reqs {
				byBroker[b] = true
				inFlight++
				req := enc.build(k, r)
				r.start = time.Now()
				k.wg.Add(1)
				go func() {
					defer k.wg.Done()
					ctx, cancel := context.WithTimeout(k.ctx, k.cfg.RequestTimeout)
					m, err := k.transport.RoundTrip(ctx, k.addr, req)
					cancel()
					if err == nil {
						res, ok := m.(*produceAPI.Response)
						if !ok {
							err = fmt.Errorf("unexpected produce response %T", m)
						}
						r.res = res
					}
					r.err = err
					done <- r
				}()
			}
		}
		if !wakeAt.IsZero() {
			timer.Reset(time.Until(wakeAt))
		}
		select {
		case <-k.ctx.Done():
			return
		case <-k.wake:
		case <-timer.C:
		case r := <-done:
			inFlight--
			byBroker[r.broker] = false
			refresh, ok := k.apply(r)
			if refresh && !refreshing {
				refreshing = k.refresh(parts, refreshed)
			}
			k.breaker(ok, inFlight > 0)
		case leaders := <-refreshed:
			refreshing = false
			for _, p := range parts {
				if l, ok := leaders[p.topic]; ok && p.id < len(l) {
					p.leader = l[p.id]
				}
			}
		}
	}
}

// collect takes the next batch of every ready partition whose broker is idle,
// one request per broker, and says when a backing-off partition is due.
func (k *Kafka) collect(now time.Time, parts []*partition, byBroker map[int32]bool, refreshing *bool, refreshed chan map[string][]int32) (map[int32]*request, time.Time) {
	var wakeAt time.Time
	reqs := map[int32]*request{}
	reqBytes := map[int32]int{}
	for _, p := range parts {
		if p.inFlight || byBroker[p.leader] && reqs[p.leader] == nil {
			continue
		}
		if now.Before(p.notBefore) {
			if wakeAt.IsZero() || p.notBefore.Before(wakeAt) {
				wakeAt = p.notBefore
			}
			continue
		}
		if p.leader < 0 {
			// No leader known (yet): look again after a backoff.
			if p.hasQueued() || p.retry != nil {
				p.notBefore = now.Add(k.cfg.Retry.Delay(p.attempt))
				p.attempt++
				if !*refreshing {
					*refreshing = k.refresh(parts, refreshed)
				}
			}
			continue
		}
		room := k.cfg.MaxRequestBytes - reqBytes[p.leader]
		if room <= 0 {
			continue
		}
		batch := p.next(room)
		if batch == nil {
			continue
		}
		r := reqs[p.leader]
		if r == nil {
			r = &request{broker: p.leader}
			reqs[p.leader] = r
		}
		r.parts = append(r.parts, p)
		r.batches = append(r.batches, batch)
		for _, ev := range batch {
			reqBytes[p.leader] += ev.Size()
		}
		p.inFlight = true
		p.sending.Store(true)
	}
	return reqs, wakeAt
}

// gate decides whether the dispatcher builds requests now: retries that are due
// and batches of an input that paused (the stream has nothing more buffered)
// go at once; while events keep arriving it waits, up to Linger after the
// oldest queued event, for more to join them. When it waits it says until when.
func (k *Kafka) gate(now time.Time, parts []*partition, busy map[int32]bool) (wakeAt time.Time, send bool) {
	total, oldest := 0, int64(0)
	for _, p := range parts {
		if p.inFlight || busy[p.leader] || now.Before(p.notBefore) {
			continue
		}
		if p.retry != nil {
			return time.Time{}, true
		}
		n, since := p.queued()
		if n == 0 {
			continue
		}
		total += n
		if oldest == 0 || since < oldest {
			oldest = since
		}
	}
	if total == 0 || total >= k.cfg.FlushEvents {
		return time.Time{}, true
	}
	nowNs := now.UnixNano()
	quietAt := k.lastPush.Load() + int64(k.cfg.QuietGap)
	lingerAt := oldest + int64(k.cfg.Linger)
	spacedAt := k.lastSent + int64(k.cfg.MinInterval)
	if (nowNs >= quietAt || nowNs >= lingerAt) && nowNs >= spacedAt {
		return time.Time{}, true
	}
	at := max(min(quietAt, lingerAt), spacedAt)
	if at <= nowNs {
		at = nowNs + 1
	}
	return time.Unix(0, at), false
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

// Circuit breaker states.
const (
	circuitClosed   = 0
	circuitOpen     = 1
	circuitHalfOpen = 2
)

// breaker updates the circuit after a request: ok means some partition of it
// was acknowledged; probing means a request (a retry, while open) is in flight.
func (k *Kafka) breaker(ok, probing bool) {
	prev := k.circuit.Load()
	next := prev
	switch {
	case ok:
		k.failedRun = 0
		next = circuitClosed
	default:
		k.failedRun++
		if k.failedRun >= k.cfg.BreakerThreshold {
			next = circuitOpen
		}
	}
	if next == circuitOpen && probing {
		next = circuitHalfOpen
	}
	if next == prev {
		return
	}
	k.circuitMu.Lock()
	k.circuit.Store(next)
	switch {
	case prev == circuitClosed:
		k.closing = make(chan struct{})
	case next == circuitClosed:
		close(k.closing)
		k.closing = nil
	}
	k.circuitMu.Unlock()
	k.cfg.Metrics.CircuitState.Set(float64(next))
	switch {
	case next == circuitClosed:
		k.log.Info().Msg("circuit closed: Kafka accepts events again; replication reading resumes")
	case prev == circuitClosed:
		k.log.Warn().Int("failed_requests", k.failedRun).Msg("circuit open: Kafka keeps failing; replication reading paused, retrying with backoff")
	}
}

// CircuitOpen reports whether the circuit breaker is open or half-open: Kafka
// failed BreakerThreshold requests in a row and has not accepted one since.
func (k *Kafka) CircuitOpen() bool { return k.circuit.Load() != circuitClosed }

// CircuitClosed returns nil while the circuit is closed, and otherwise a
// channel that is closed when it closes again.
func (k *Kafka) CircuitClosed() <-chan struct{} {
	if k.circuit.Load() == circuitClosed {
		return nil
	}
	k.circuitMu.Lock()
	defer k.circuitMu.Unlock()
	if k.closing == nil {
		return nil
	}
	return k.closing
}

// apply handles a finished request partition by partition; it reports whether
// leadership may have moved (metadata should be refreshed) and whether any
// partition was acknowledged.
func (k *Kafka) apply(r *request) (refresh, ok bool) {
	type key struct {
		topic string
		part  int32
	}
	byPart := map[key]produceAPI.ResponsePartition{}
	if r.err == nil {
		for _, t := range r.res.Topics {
			for _, rp := range t.Partitions {
				byPart[key{t.Topic, rp.Partition}] = rp
			}
		}
	}
	for i, p := range r.parts {
		batch := r.batches[i]
		p.inFlight = false
		p.sending.Store(false)
		var err error
		if r.err != nil {
			err = fmt.Errorf("produce %d events to %s/%d: %w", len(batch), p.topic, p.id, r.err)
		} else if rp, ok := byPart[key{p.topic, int32(p.id)}]; !ok {
			err = fmt.Errorf("produce %d events to %s/%d: no answer for the partition", len(batch), p.topic, p.id)
		} else if rp.ErrorCode != 0 {
			err = fmt.Errorf("produce %d events to %s/%d: %w", len(batch), p.topic, p.id, kafka.Error(rp.ErrorCode))
			if rp.ErrorMessage != "" {
				err = fmt.Errorf("%w (%s)", err, rp.ErrorMessage)
			}
		}
		if err == nil {
			ok = true
			k.acked(p, batch, r.start)
			continue
		}
		if k.ctx.Err() != nil {
			return false, ok
		}
		if Classify(err) == Permanent {
			p.attempt = 0
			ok = true // the broker answered: Kafka itself works
			if len(batch) > 1 {
				// The batch as a whole may be what is too large: halve it, in order.
				half := len(batch) / 2
				p.retry = batch[:half:half]
				p.unshift(batch[half:])
				p.limit = half
				continue
			}
			if k.permanent(k.ctx, batch[0], &outbox.EventError{Code: Code(err), Err: err}) != nil {
				return false, ok
			}
			continue
		}
		k.cfg.Metrics.ProduceErrors.WithLabelValues("transient").Inc()
		k.cfg.Metrics.ProduceRetries.Inc()
		if !p.failing {
			p.failing = true
			k.setFailing(true, err, p)
		}
		p.retry = batch
		p.notBefore = time.Now().Add(k.cfg.Retry.Delay(p.attempt))
		p.attempt++
		var ke kafka.Error
		if errors.As(err, &ke) || r.err != nil {
			refresh = true
		}
	}
	return refresh, ok
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

func (k *Kafka) acked(p *partition, batch []*outbox.Event, start time.Time) {
	if p.failing {
		p.failing = false
		k.setFailing(false, nil, p)
	}
	p.attempt = 0
	p.notBefore = time.Time{}
	if p.limit > 0 && !p.hasQueued() {
		p.limit = 0
	}
	now := time.Now()
	m := k.cfg.Metrics
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
	k.cfg.OnAck(batch)
	p.recycle(batch)
}

// encoder turns batches into a produce request. It keeps the formatted commit
// LSN and time of the last event, which consecutive events mostly share.
type encoder struct {
	lsn     pglogrepl.LSN
	lsnText []byte
	ts      time.Time
	tsText  []byte
}

func (e *encoder) build(k *Kafka, r *request) *produceAPI.Request {
	attrs := protocol.Attributes(k.cfg.Compression) & 0x7
	topics := make([]produceAPI.RequestTopic, 0, 1)
	index := map[string]int{}
	now := time.Now()
	for i, p := range r.parts {
		batch := r.batches[i]
		nh := 0
		for _, ev := range batch {
			nh += 5 + len(ev.Headers)
		}
		headers := make([]kafka.Header, nh)
		records := make([]kafka.Record, len(batch))
		views := make([]byteView, 2*len(batch))
		for j, ev := range batch {
			h := headers[: 0 : 5+len(ev.Headers)]
			headers = headers[5+len(ev.Headers):]
			h = append(h,
				kafka.Header{Key: HeaderID, Value: ev.ID},
				kafka.Header{Key: HeaderEventType, Value: ev.EventType},
				kafka.Header{Key: HeaderAggregateType, Value: ev.AggregateType},
				kafka.Header{Key: HeaderCommitLSN, Value: e.lsnBytes(ev.CommitLSN)},
				kafka.Header{Key: HeaderCommitTime, Value: e.timeBytes(ev.CommitTime)},
			)
			for _, x := range ev.Headers {
				h = append(h, kafka.Header{Key: x.Key, Value: x.Value})
			}
			views[2*j].b = ev.AggregateID
			views[2*j+1].b = ev.Payload
			records[j] = kafka.Record{Time: now, Key: &views[2*j], Value: &views[2*j+1], Headers: h}
		}
		ti, ok := index[p.topic]
		if !ok {
			ti = len(topics)
			index[p.topic] = ti
			topics = append(topics, produceAPI.RequestTopic{Topic: p.topic})
		}
		topics[ti].Partitions = append(topics[ti].Partitions, produceAPI.RequestPartition{
			Partition: int32(p.id),
			RecordSet: protocol.RecordSet{Attributes: attrs, Records: &recordReader{records: records}},
		})
	}
	return &produceAPI.Request{
		Acks:    int16(kafka.RequireAll),
		Timeout: int32(k.cfg.RequestTimeout / time.Millisecond),
		Topics:  topics,
	}
}

// lsnBytes formats lsn, reusing the last result for events of one transaction.
// A new slice is made per LSN, so earlier records keep theirs.
func (e *encoder) lsnBytes(lsn pglogrepl.LSN) []byte {
	if lsn != e.lsn || e.lsnText == nil {
		e.lsn = lsn
		e.lsnText = []byte(lsn.String())
	}
	return e.lsnText
}

// timeBytes formats t as RFC 3339 in UTC, reusing the last result.
func (e *encoder) timeBytes(t time.Time) []byte {
	if !t.Equal(e.ts) || e.tsText == nil {
		e.ts = t
		e.tsText = []byte(t.UTC().Format(time.RFC3339Nano))
	}
	return e.tsText
}

// recordReader reads records from a slice without copying it.
type recordReader struct {
	records []kafka.Record
	i       int
}

func (r *recordReader) ReadRecord() (*kafka.Record, error) {
	if r.i >= len(r.records) {
		return nil, io.EOF
	}
	r.i++
	return &r.records[r.i-1], nil
}

// byteView is a kafka.Bytes over a slice it does not own.
type byteView struct {
	b   []byte
	off int
}

func (v *byteView) Len() int { return len(v.b) - v.off }

func (v *byteView) Read(p []byte) (int, error) {
	if v.off >= len(v.b) {
		return 0, io.EOF
	}
	n := copy(p, v.b[v.off:])
	v.off += n
	return n, nil
}

func (v *byteView) Close() error { return nil }

// WriteTo writes the rest of the slice in one call. io.Copy prefers it to the
// destination's ReadFrom, which matters for compression: lz4's writer rejects
// ReadFrom after a Write ("lz4: unhandled state[writeState]"), and kafka-go
// writes a record's other fields with Write before copying its key and value.
func (v *byteView) WriteTo(w io.Writer) (int64, error) {
	if v.off >= len(v.b) {
		return 0, nil
	}
	n, err := w.Write(v.b[v.off:])
	v.off += n
	return int64(n), err
}

// connTracker wraps the Transport's Dial and remembers open connections, so
// Close can end requests kafka-go would otherwise wait on until their timeout.
type connTracker struct {
	dial  func(context.Context, string, string) (net.Conn, error)
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
}

// Dial opens a connection and tracks it until it is closed.
func (t *connTracker) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	dial := t.dial
	if dial == nil {
		d := net.Dialer{Timeout: 5 * time.Second}
		dial = d.DialContext
	}
	c, err := dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		c.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: c, t: t}
	t.conns[tc] = struct{}{}
	return tc, nil
}

func (t *connTracker) closeAll() {
	t.mu.Lock()
	t.done = true
	conns := t.conns
	t.conns = map[net.Conn]struct{}{}
	t.mu.Unlock()
	for c := range conns {
		c.(*trackedConn).Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	t    *connTracker
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns, c)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}
