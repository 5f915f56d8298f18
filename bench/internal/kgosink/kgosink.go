// Package kgosink is a Kafka producer for the relay on franz-go's kgo
// client, for the benchmark only: relay.Config.OpenProducer opens it in
// place of the relay's own producer (internal/sink), so that one build of
// the relay runs with either and the benchmark measures them side by side
// (bench/cmd/relay-kgo; issue 38). The relay's command never uses it.
//
// It keeps sink.Kafka's contract (relay.Producer): every message is
// reported to its Done exactly once, with where Kafka stored it once Kafka
// acknowledged it with acks=all, or with its permanent failure as an
// *outbox.EventError, unless the producer was closed or halted first; a
// Done that returns an error halts it. Ordering and retries are kgo's: its
// idempotent producer (unless Config.Idempotent is false) with up to
// Config.MaxInFlight produce requests in flight per broker, which the
// broker appends only in sequence order, retried without limit. kgo calls
// the promises of one client one at a time, in order per partition, so the
// Dones do not overlap. Keys land on the partitions sink.Kafka picks: the
// event's TargetPartition, or else Kafka's Java murmur2 of its key over
// every partition of the topic (kgo.KafkaHasher, as sink's
// kafka.Murmur2Balancer{Consistent: true}). The records carry the value and
// headers sink.Kafka writes in its default format (record.go): CloudEvents
// and TLS/SASL are not supported, and Open refuses them.
//
// Where it differs from sink.Kafka, by what kgo offers:
//
//   - Linger: kgo waits Config.Linger (default 2ms, sink's) for every batch;
//     sink.Kafka sends at once when its input is quiet and lingers only
//     while events keep coming. Config.QuietGap, FlushEvents, MinInterval,
//     BatchMaxEvents and ProducerIdle have no kgo counterpart and are
//     ignored; BatchMaxBytes caps a batch (kgo.ProducerBatchMaxBytes).
//   - Failures: kgo retries every retriable error without limit and fails
//     a record only for a non-retriable one, which this package reports as
//     permanent (codes as sink.Code's where the error is a Kafka one). It
//     does not split a batch a broker refuses as too large: the events of
//     that batch fail with the large one (see the contract test).
//   - A batch of unknown fate (a lost answer, a timeout) is kgo's: re-sent
//     in its producer session, which the broker deduplicates; when kgo
//     resets the session it decides alone, so Config.Verifier (the relay's
//     dedup.Decider) is not used.
//   - Retrying and the circuit breaker see only failed requests (a
//     connection lost, a timeout: kgo's BrokerE2E hook), not errors the
//     broker answers per partition, which kgo retries out of sight.
//   - Metrics: events_published, bytes_published, produce_batches and the
//     batch size count as sink.Kafka counts them; produce_latency is per
//     produce request (kgo's end-to-end time of the request), and
//     end_to_end and read latency are observed per event, not per batch;
//     queue latency is not observed.
//   - Reading back (PartitionCount, Ranges, Scan) goes through the same
//     client: metadata, ListOffsets and Fetch requests.
package kgosink

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/conntrack"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

var _ relay.Producer = (*Kafka)(nil)

// DefaultLinger is how long a batch waits for more records: sink.Config's
// Linger default.
const DefaultLinger = 2 * time.Millisecond

// Kafka is the kgo producer. Produce is called from one goroutine.
type Kafka struct {
	cfg    sink.Config
	cl     *kgo.Client
	log    zerolog.Logger
	m      *metrics.Metrics
	stopBg context.CancelFunc
	wg     sync.WaitGroup // the probe, and a client's Close started by a halt

	// mu is held while a promise reports to a Done; closed is set under it,
	// so no Done runs after Close returned.
	mu     sync.Mutex
	closed bool

	conns     conntrack.Conns // the client's connections, which a halt cuts
	haltOnce  sync.Once
	halted    chan struct{}
	err       error
	closeOnce sync.Once

	// The circuit breaker and Retrying, from the client's hooks.
	circuitMu sync.Mutex
	failedRun int           // produce requests failed in a row
	closing   chan struct{} // non-nil while the circuit is open
	reachable bool          // the last probe reached a broker
}

// Open returns a producer for cfg, the sink.Config the relay would give
// sink.Open (relay.Config.OpenProducer), once the brokers answer, the
// producer id is known (when cfg.Idempotent) and each of cfg.Topics exists
// (the broker is asked to create it), all within ctx.
func Open(ctx context.Context, cfg sink.Config) (*Kafka, error) {
	return OpenWith(ctx, cfg)
}

// OpenWith is Open with more options of kgo's, applied after the
// producer's own (tests: protocol versions, batch size).
func OpenWith(ctx context.Context, cfg sink.Config, extra ...kgo.Opt) (*Kafka, error) {
	if len(cfg.Brokers) == 0 {
		return nil, cfg.Names.Errorf("Brokers", "no Kafka brokers configured: set them")
	}
	if cfg.CloudEventsSource != "" {
		return nil, errors.New("the kgo producer (benchmark only) does not write CloudEvents")
	}
	if t := cfg.Transport; t != nil && (t.TLS != nil || t.SASL != nil) {
		return nil, errors.New("the kgo producer (benchmark only) has no TLS or SASL")
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = sink.DefaultMaxInFlight
	}
	if cfg.MaxInFlight > sink.MaxInFlightLimit {
		return nil, cfg.Names.Errorf("MaxInFlight", "%d requests in flight: Kafka keeps an idempotent producer's order across at most %d", cfg.MaxInFlight, sink.MaxInFlightLimit)
	}
	if cfg.Linger <= 0 {
		cfg.Linger = DefaultLinger
	}
	if cfg.BatchMaxBytes <= 0 {
		cfg.BatchMaxBytes = sink.DefaultBatchMaxBytes
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = sink.DefaultRequestTimeout
	}
	if cfg.Retry.Base <= 0 {
		cfg.Retry = backoff.Default
	}
	if cfg.BreakerThreshold <= 0 {
		cfg.BreakerThreshold = 5
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.Discard()
	}
	codec, err := compression(cfg.Compression)
	if err != nil {
		return nil, cfg.Names.Errorf("Compression", "%v", err)
	}
	k := &Kafka{
		cfg:       cfg,
		log:       cfg.Logger.With().Str("component", "sink").Str("producer", "kgo").Logger(),
		m:         cfg.Metrics,
		halted:    make(chan struct{}),
		reachable: true,
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID("cdc-relay"),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(cfg.Linger),
		kgo.ProducerBatchMaxBytes(int32(cfg.BatchMaxBytes)),
		kgo.ProducerBatchCompression(codec),
		kgo.ProduceRequestTimeout(cfg.RequestTimeout),
		kgo.RetryBackoffFn(func(tries int) time.Duration { return cfg.Retry.Delay(tries - 1) }),
		kgo.RecordPartitioner(partitioner{kgo.StickyKeyPartitioner(nil)}),
		// The relay bounds what it has in flight (MaxInFlightBytes):
		// Produce must not block on kgo's own bound.
		kgo.MaxBufferedRecords(math.MaxInt32),
		kgo.MetadataMaxAge(5 * time.Second), // sink's MetadataTTL
		// kgo retries a partition's failed batch only after a metadata
		// refresh, and refreshes at most every MetadataMinAge (default 5s):
		// sink.Kafka retries after its backoff, so the refresh may come as
		// soon as the first retry would.
		kgo.MetadataMinAge(max(cfg.Retry.Base, 10*time.Millisecond)),
		kgo.AllowAutoTopicCreation(),
		kgo.WithHooks(hooks{k}),
		kgo.WithLogger(logger{k.log}),
		kgo.Dialer(k.conns.Dial),
	}
	k.conns.Next = (&net.Dialer{Timeout: 10 * time.Second}).DialContext // kgo's own dialer's timeout
	if cfg.Idempotent {
		// kgo's idempotent producer keeps 5 requests in flight per broker
		// (once the broker's first answer shows it is Kafka 1.0 or later)
		// and refuses kgo.MaxProduceRequestsInflightPerBroker: "invalid
		// usage of MaxProduceRequestsInflightPerBroker with idempotency
		// enabled". So MaxInFlight must be 5 here.
		if cfg.MaxInFlight != 0 && cfg.MaxInFlight != sink.MaxInFlightLimit {
			return nil, cfg.Names.Errorf("MaxInFlight", "the kgo producer keeps %d requests in flight per broker when idempotent; %d cannot be set", sink.MaxInFlightLimit, cfg.MaxInFlight)
		}
	} else {
		// Without idempotence one request at a time keeps the order, as
		// sink.Kafka does.
		opts = append(opts, kgo.DisableIdempotentWrite(), kgo.MaxProduceRequestsInflightPerBroker(1))
	}
	if k.cl, err = kgo.NewClient(append(opts, extra...)...); err != nil {
		return nil, fmt.Errorf("open the kgo producer: %w", err)
	}
	if err := k.start(ctx); err != nil {
		k.cl.Close()
		return nil, err
	}
	bg, stop := context.WithCancel(context.Background())
	k.stopBg = stop
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		k.probe(bg, 2*time.Second)
	}()
	return k, nil
}

// start waits until the brokers answer, the producer id is known and every
// topic of cfg.Topics exists.
func (k *Kafka) start(ctx context.Context) error {
	if err := k.cl.Ping(ctx); err != nil {
		return fmt.Errorf("reach Kafka at %v: %w", k.cfg.Brokers, err)
	}
	if k.cfg.Idempotent {
		if _, _, err := k.cl.ProducerID(ctx); err != nil {
			return fmt.Errorf("get a producer id: %w", err)
		}
	}
	for _, t := range k.cfg.Topics {
		if _, err := k.PartitionCount(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// compression returns kgo's codec of c.
func compression(c kafka.Compression) (kgo.CompressionCodec, error) {
	switch c {
	case 0:
		return kgo.NoCompression(), nil
	case kafka.Gzip:
		return kgo.GzipCompression(), nil
	case kafka.Snappy:
		return kgo.SnappyCompression(), nil
	case kafka.Lz4:
		return kgo.Lz4Compression(), nil
	case kafka.Zstd:
		return kgo.ZstdCompression(), nil
	}
	return kgo.CompressionCodec{}, fmt.Errorf("compression %v is unknown", c)
}

// Produce queues m for m.Topic; done is told its fate (see sink.Done). It
// does not block on Kafka. An event with an empty key, or a target
// partition out of range, fails at once, within Produce. Produce returns an
// error only once the producer has halted.
func (k *Kafka) Produce(m sink.Message, done sink.Done) error {
	if err := k.Err(); err != nil {
		return err
	}
	ev := m.Event
	if len(ev.AggregateID) == 0 {
		return k.failNow(m, done, &outbox.EventError{Code: "empty_key", Err: errors.New("aggregate_id is NULL or empty; events need a key to keep their order")})
	}
	r := k.record(m)
	if ev.HasTargetPartition {
		if ev.TargetPartition < 0 || ev.TargetPartition > math.MaxInt32 {
			return k.failNow(m, done, invalidPartition(ev.TargetPartition))
		}
		r.Partition = int32(ev.TargetPartition)
	}
	at := time.Now()
	k.cl.Produce(context.Background(), r, func(r *kgo.Record, err error) { k.promise(m, done, at, r, err) })
	return nil
}

// invalidPartition is the failure of an event whose target partition its
// topic lacks.
func invalidPartition(p int64) error {
	return &outbox.EventError{Code: "invalid_partition", Err: fmt.Errorf("the partition column holds %d, which the topic does not have", p)}
}

// promise reports r, m's record, to done: acknowledged, or failed for good.
// kgo runs promises one at a time.
func (k *Kafka) promise(m sink.Message, done sink.Done, at time.Time, r *kgo.Record, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed || k.Err() != nil {
		return // abandoned
	}
	if err != nil {
		if m.Event.HasTargetPartition && !isKafkaError(err) {
			err = invalidPartition(m.Event.TargetPartition) // kgo's own refusal of the partition
		}
		k.fail(m, done, permanent(err))
		return
	}
	now := time.Now()
	ev := m.Event
	k.m.EventsPublished.WithLabelValues(m.Topic).Inc()
	k.m.BytesPublished.WithLabelValues(m.Topic).Add(float64(len(ev.Payload)))
	k.m.EndToEndLatency.Observe(now.Sub(ev.CommitTime).Seconds())
	if ev.CommitLSN != 0 { // read from the stream, not a replay
		k.m.ReadLatency.Observe(at.Sub(ev.CommitTime).Seconds())
		from := ev.CreatedAt
		if from.IsZero() {
			from = ev.CommitTime
		}
		k.m.ObserveOutboxWait(ev.EventType, now.Sub(from))
	}
	k.report(m, done, sink.Stored{Partition: r.Partition, Offset: r.Offset}, nil)
}

// isKafkaError reports whether err is an error a broker answered.
func isKafkaError(err error) bool {
	var ke *kerr.Error
	return errors.As(err, &ke)
}

// permanent is err, a failure kgo gave up on, as the *outbox.EventError the
// relay's failure policy takes, with sink.Code's codes for Kafka's errors.
func permanent(err error) error {
	var ee *outbox.EventError
	if errors.As(err, &ee) {
		return err
	}
	code := "unknown"
	var ke *kerr.Error
	if errors.As(err, &ke) {
		switch ke {
		case kerr.MessageTooLarge, kerr.RecordListTooLarge:
			code = "message_too_large"
		case kerr.InvalidRecord:
			code = "invalid_record"
		case kerr.InvalidTopicException:
			code = "invalid_topic"
		case kerr.TopicAuthorizationFailed:
			code = "topic_authorization_failed"
		case kerr.UnknownTopicOrPartition:
			code = "unknown_topic_or_partition"
		default:
			code = fmt.Sprintf("kafka_%d", ke.Code)
		}
	}
	return &outbox.EventError{Code: code, Err: err}
}

// failNow reports a failure known within Produce, and returns what
// Produce does: the error that halted the producer when done refused it.
func (k *Kafka) failNow(m sink.Message, done sink.Done, err error) error {
	k.fail(m, done, err)
	return k.Err()
}

// fail reports the permanent failure of m.
func (k *Kafka) fail(m sink.Message, done sink.Done, err error) {
	k.m.ProduceErrors.WithLabelValues("permanent").Inc()
	k.m.PermanentFailures.WithLabelValues(sink.Code(err)).Inc()
	k.report(m, done, sink.Stored{}, err)
}

// report tells done m's fate; when done refuses it, the producer halts.
func (k *Kafka) report(m sink.Message, done sink.Done, at sink.Stored, err error) {
	if herr := done(m, at, err); herr != nil {
		k.halt(herr)
	}
}

// halt records the first error a Done returned and stops producing: the
// client's connections are cut at once and the client is closed in the
// background (a promise must not wait for it), and no promise reports after
// this. kgo's Close alone stops the producer only after its metrics loop
// had up to a second, in which it kept sending what was buffered (10
// requests after the halt in a CI run of the contract, where at most 5 were
// in flight).
func (k *Kafka) halt(err error) {
	k.haltOnce.Do(func() {
		k.err = err
		close(k.halted)
		k.conns.CloseAll()
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			k.closeClient()
		}()
	})
}

// closeClient closes the client once.
func (k *Kafka) closeClient() { k.closeOnce.Do(k.cl.Close) }

// Err returns the error a Done returned, which halted the producer, or nil.
func (k *Kafka) Err() error {
	select {
	case <-k.halted:
		return k.err
	default:
		return nil
	}
}

// Close stops the producer and closes its connections. Messages not
// reported yet are abandoned: no Done runs once Close returned.
func (k *Kafka) Close() error {
	k.mu.Lock()
	k.closed = true
	k.mu.Unlock()
	k.stopBg()
	k.closeClient()
	k.wg.Wait()
	return nil
}

// probe asks a broker every period whether it answers, until ctx ends:
// Healthy says so while nothing is produced.
func (k *Kafka) probe(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, period)
		err := k.cl.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		k.circuitMu.Lock()
		k.reachable = err == nil
		k.circuitMu.Unlock()
	}
}

// Healthy reports whether Kafka accepts events: a broker answered the last
// probe, no produce request failed since the last batch was acknowledged,
// and the producer has not halted.
func (k *Kafka) Healthy() bool {
	k.circuitMu.Lock()
	ok := k.reachable && k.failedRun == 0
	k.circuitMu.Unlock()
	return ok && k.Err() == nil
}

// Retrying reports whether a produce request failed since the last batch
// was acknowledged (kgo retries it).
func (k *Kafka) Retrying() bool {
	k.circuitMu.Lock()
	defer k.circuitMu.Unlock()
	return k.failedRun > 0
}

// CircuitClosed returns nil while the circuit is closed, and otherwise a
// channel that is closed when it closes again: it opens after
// Config.BreakerThreshold produce requests failed in a row and closes when
// a batch is acknowledged.
func (k *Kafka) CircuitClosed() <-chan struct{} {
	k.circuitMu.Lock()
	defer k.circuitMu.Unlock()
	if k.closing == nil {
		return nil
	}
	return k.closing
}

// breaker counts a produce request's outcome: ok, some batch was
// acknowledged; otherwise the request failed.
func (k *Kafka) breaker(ok bool) {
	k.circuitMu.Lock()
	defer k.circuitMu.Unlock()
	if ok {
		k.failedRun = 0
		if k.closing != nil {
			close(k.closing)
			k.closing = nil
			k.m.CircuitState.Set(0)
			k.log.Info().Msg("circuit closed: Kafka accepts events again; replication reading resumes")
		}
		return
	}
	k.failedRun++
	if k.failedRun >= k.cfg.BreakerThreshold && k.closing == nil {
		k.closing = make(chan struct{})
		k.m.CircuitState.Set(1)
		k.log.Warn().Int("failed_requests", k.failedRun).Msg("circuit open: Kafka keeps failing; replication reading paused, retrying with backoff")
	}
}
