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
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/route"
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
