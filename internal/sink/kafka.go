// Package sink produces outbox events to Kafka: the relay's producer.
//
// Delivery contract (see Done): every event given to Produce is reported exactly
// once, either acknowledged by Kafka with acks=all or failed permanently, unless
// the producer is closed or halted first; until then it is retried forever with
// exponential backoff and full jitter. Events with the same key go to the same
// partition (Java-compatible murmur2). A failed batch is re-sent unchanged and
// ahead of anything newer, so events of one key reach Kafka in the order
// Produce saw them and a retry never lets a later event overtake an earlier
// one: with idempotence up to Config.MaxInFlight batches of a partition are in
// flight, which the broker appends only in sequence order (one while the
// broker may have forgotten the producer, by its records' timestamps: see
// Config.ProducerIdle); without it, one.
//
// The producer is given each event's topic beside it (Message): routing
// (internal/route) happens once, in the caller, so the live relay and every
// replay publish through this same code. The producer writes nothing into
// the event; where Kafka stored it comes back to Done.
//
// One dispatcher goroutine owns the partitions' state. For every broker with
// room for another request in flight it builds one produce request carrying a
// batch of each ready partition that broker leads, so under load requests grow
// instead of multiplying, and with nothing queued an event goes out at once (no
// linger). Requests to one broker are written back to back on one connection
// and answered in order (pipe.go), so a slow answer does not hold the next
// request back.
//
// With Config.Idempotent the producer is idempotent, as Kafka's own clients
// are: Open gets a producer id (InitProducerId), every batch carries it with
// the partition's next sequence number, and a batch re-sent after an attempt
// whose fate is unknown (timeout, connection lost) carries the same ones, so
// the broker drops the copy when the first attempt was appended after all. The
// sequence advances only when a batch is acknowledged. When the broker loses
// or rejects the session (UNKNOWN_PRODUCER_ID, OUT_OF_ORDER_SEQUENCE_NUMBER,
// a fenced epoch), the sink gets a new producer id in the background, and
// every partition restarts at sequence 0 with it, re-sending its failed batch
// first, unchanged, so no key is reordered. A batch with an unknown earlier
// attempt is first looked up in its partition, and Config.Verifier decides
// whether Kafka holds it (verify.go); when it cannot tell, the batch is
// re-sent and may be duplicated, which the sink logs and counts
// (cdc_relay_delivery_fallbacks_total{reason="producer_reset"}). A broker
// that gives no producer id makes the sink produce without idempotence
// ({reason="producer_id_unavailable"}); Idempotent says which. Claim and
// Fence (fence.go) put the producer on the newest session of the stream's
// transactional id and fence earlier runs' sessions on a topic before its
// partitions are read, so a killed run's last requests cannot land after
// the read. The sink writes
// the RecordBatch v2 format itself (batch.go), because kafka-go's encoder
// cannot carry a producer id, and the produce requests and their answers too
// (wire.go), on connections kafka-go's Transport keeps.
//
// Retries are owned here and only here: requests go through kafka-go's Transport,
// which does not retry, instead of kafka-go's Writer, whose own MaxAttempts would
// multiply ours and whose next batch for a partition goes out after an earlier
// batch has given up, reordering the key.
package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/conntrack"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// Config configures the Kafka sink.
type Config struct {
	Brokers []string
	// Topics are waited for at Open (their partitions known, the broker asked to
	// create them): a fixed topic, so a relay that cannot produce to it does not
	// start. Other topics are looked up on first use.
	Topics []string
	// BatchMaxEvents and BatchMaxBytes bound one partition's batch; keep the bytes
	// below the broker's message.max.bytes. MaxRequestBytes bounds one request.
	BatchMaxEvents  int
	BatchMaxBytes   int
	MaxRequestBytes int
	Compression     kafka.Compression
	// Idempotent makes the producer idempotent (see the package doc): a
	// batch re-sent after a lost answer is not appended twice. Open falls
	// back to producing without it when the broker gives no producer id.
	Idempotent bool
	// Verifier decides whether Kafka holds a batch of unknown fate once its
	// producer session is gone (see Verifier; internal/dedup's Decider).
	// Nil: such a batch is re-sent blind, counted as the producer_reset
	// fallback.
	Verifier Verifier
	// CloudEventsSource, when set, makes every record a CloudEvent in the
	// Kafka binding's binary content mode: ce_specversion 1.0, ce_id the event
	// id, ce_source this value, ce_type the event type, ce_time the commit
	// time; the value stays the payload.
	CloudEventsSource string
	// CloudEventsMode is the content mode of those records: binary (the
	// zero value, as above) or structured, where the value is the event in
	// the JSON event format, the payload its data (see cloudevents.go), with
	// header content-type ContentTypeCloudEventsJSON and no ce_ headers; the
	// other headers are as without CloudEvents. A structured event whose
	// text payload the content type calls JSON but is not fails permanently
	// (code "invalid_json"). Structured needs CloudEventsSource and excludes
	// TombstoneOnEmptyPayload: its value is never null.
	CloudEventsMode CloudEventsMode
	// TombstoneOnEmptyPayload sends an event whose payload is NULL or empty
	// with a null value, a Kafka tombstone (format.tombstone_on_empty_payload);
	// otherwise its value is empty, never null.
	TombstoneOnEmptyPayload bool
	// RequestTimeout bounds one produce attempt, from when the request is
	// sent: its writing and its answer (DefaultRequestTimeout when 0).
	RequestTimeout time.Duration
	Retry          backoff.Policy
	// Transport carries TLS/SASL settings; nil means plain TCP. Open copies
	// its settings into a Transport of its own, whose Dial it wraps so Close
	// can end connections with requests in flight.
	Transport *kafka.Transport
	Logger    zerolog.Logger
	Metrics   *metrics.Metrics
	// Linger bounds how long events may wait for more to join their request
	// while the input is still flowing (default 2ms); QuietGap is how long the
	// input must pause for the stream to count as having nothing more buffered
	// (default 250µs); FlushEvents sends at once when that many are queued
	// (default 1000). With a quiet input an event goes out at once; with a busy
	// one, requests grow instead of multiplying.
	Linger      time.Duration
	QuietGap    time.Duration
	FlushEvents int
	// BacklogEvents and BacklogLinger: once BacklogEvents are queued the
	// input is a backlog, not a steady load (30,000 events a second queue
	// about 60 per Linger), and requests wait up to BacklogLinger instead
	// (defaults 400 and 5ms), so that a drain sends fewer, larger requests:
	// a request costs the relay and the broker about the same whatever its
	// size. FlushEvents still sends at once.
	BacklogEvents int
	BacklogLinger time.Duration
	// MinInterval spaces requests: unless FlushEvents are queued, a request
	// waits until MinInterval after the previous one (default 1ms). At high
	// rates each request then carries what arrived meanwhile, instead of one
	// transaction's worth (a request costs ~300µs of CPU whatever its size).
	MinInterval time.Duration
	// MaxInFlight bounds the produce requests in flight per broker and the
	// batches in flight per partition while the producer is idempotent
	// (default DefaultMaxInFlight, at most MaxInFlightLimit): the broker
	// appends a producer's batches of a partition only in sequence order,
	// so a failed batch is never overtaken. Without idempotence one request
	// per broker is in flight, whatever this says. Requests to one broker
	// share one connection, written back to back (pipe.go).
	MaxInFlight int
	// ProducerIdle is how old the records of a partition's last batch may
	// be before the producer assumes the broker forgot it: Kafka drops an
	// idempotent producer's state of a partition once the greatest record
	// timestamp of its last batch there is producer.id.expiration.ms (one
	// day by default) old. Without a timestamp column that is when the
	// batch was built, so a partition idle this long; with one it is the
	// rows' own time, which a backlog or a replay has old from the start.
	// The partition's next batch then goes alone, as in a new session,
	// until Kafka acknowledges one, and no batch goes beside one in flight
	// whose records are this old, so records older than this go one batch
	// at a time (default DefaultProducerIdle). Keep it below the broker's
	// producer.id.expiration.ms.
	ProducerIdle time.Duration
	// BreakerThreshold is how many produce requests in a row must fail before
	// the circuit opens (default 5). While it is open the caller should stop
	// reading (see CircuitOpen); retries go on as probes and one success closes it.
	BreakerThreshold int
	// Names names the fields of this Config in errors and log lines (see
	// package setting).
	Names setting.Namer
	// DecoderNames names the fields of the decoder configuration that made
	// the events (decoder.Config): its ContentType, which a structured
	// CloudEvent's data must match.
	DecoderNames setting.Namer
}

// Defaults of Config that the command line offers as flags, stated once.
const (
	DefaultBatchMaxEvents = 10000
	// DefaultRequestTimeout is Kafka's producers' request.timeout.ms.
	DefaultRequestTimeout = 30 * time.Second
	// DefaultBatchMaxBytes is under Kafka's default message.max.bytes (1 MB).
	DefaultBatchMaxBytes = 900 << 10
	// DefaultMaxInFlight is Kafka's own clients' default with idempotence.
	DefaultMaxInFlight = 5
	// MaxInFlightLimit is the most in-flight batches per partition for which
	// Kafka keeps an idempotent producer's order: the broker remembers the
	// last five batches of each producer and partition.
	MaxInFlightLimit = 5
	// DefaultProducerIdle is far below any producer.id.expiration.ms a
	// broker is likely to run with (Kafka's default is a day, and it looks
	// for expired producers every ten minutes): a partition idle this long
	// costs one round trip before its batches are pipelined again, and
	// records this old (rows' timestamps) go one batch at a time.
	DefaultProducerIdle = 10 * time.Second
)

func (c *Config) setDefaults() {
	if c.BatchMaxEvents <= 0 {
		c.BatchMaxEvents = DefaultBatchMaxEvents
	}
	if c.BatchMaxBytes <= 0 {
		c.BatchMaxBytes = DefaultBatchMaxBytes
	}
	if c.MaxRequestBytes <= 0 {
		c.MaxRequestBytes = 8 << 20
	}
	if c.MaxRequestBytes < c.BatchMaxBytes {
		c.MaxRequestBytes = c.BatchMaxBytes
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.ProducerIdle <= 0 {
		c.ProducerIdle = DefaultProducerIdle
	}
	if c.BreakerThreshold <= 0 {
		c.BreakerThreshold = 5
	}
	if c.Linger <= 0 {
		c.Linger = 2 * time.Millisecond
	}
	if c.QuietGap <= 0 {
		c.QuietGap = 250 * time.Microsecond
	}
	if c.FlushEvents <= 0 {
		c.FlushEvents = 1000
	}
	if c.BacklogEvents <= 0 {
		c.BacklogEvents = 400
	}
	if c.BacklogLinger <= 0 {
		c.BacklogLinger = 5 * time.Millisecond
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
}

// Message is one event to produce, with what the producer needs beside it:
// where it goes and where it was read. The producer never writes to the
// event; what it learns of the message (where Kafka stored it) it reports to
// Done.
type Message struct {
	// Topic is where the message goes: the caller routed it (internal/route).
	Topic string
	// Event is the decoded event, as its decoder made it.
	Event *outbox.Event
	// Origin is the replication stream Event was read from. With it the
	// record carries the event's source position (HeaderSource: Origin,
	// Event.CommitLSN, Event.Index), so that a restarted relay can recognise
	// its own records. Nil for events not read from the stream (replays,
	// backfills, snapshots): their records carry no position and are never
	// taken for the stream's.
	Origin *outbox.Origin
	// TraceParent, when set, is the record's traceparent header (and the
	// structured CloudEvent's traceparent) instead of the event's
	// (outbox.HeaderTraceParent): the relay's own span of the event
	// (internal/tracing), which consumers then continue from. The event's
	// header stays as its decoder made it.
	TraceParent []byte
	// Tag is the caller's: the producer carries it to Done untouched (the
	// relay's transaction of the event), so the caller needs no record of
	// its own beside each event in flight.
	Tag uint64
}

// headerValue is the value m's record carries for h, one of its event's
// headers: h's own, unless TraceParent replaces it.
func (m *Message) headerValue(h outbox.Header) []byte {
	if m.TraceParent != nil && h.Key == outbox.HeaderTraceParent {
		return m.TraceParent
	}
	return h.Value
}

// Stored is where Kafka stored an acknowledged message.
type Stored struct {
	Partition int32
	// Offset is the record's offset, -1 when the broker did not say.
	Offset int64
}

// Done reports the fate of one message given to Produce: err is nil once
// Kafka acknowledged it with acks=all (at then says where Kafka stored it,
// Offset -1 when the broker did not say), and otherwise the permanent failure
// (an *outbox.EventError whose Code says why, e.g. "message_too_large",
// "empty_key", "invalid_topic"; at is then zero); transient failures are
// retried, never reported. m is the Message given to Produce. Done is called
// exactly once per message, unless the producer was closed or halted first;
// messages of one partition are reported in the order they were produced. It
// runs on the producer's dispatcher goroutine (or inside Produce, for a
// failure known at once), so no later message of the partition is sent before
// it returns. A non-nil return halts the producer: nothing more is sent,
// every message not yet reported is abandoned, and Err returns that error.
type Done func(m Message, at Stored, err error) error

// Kafka is the Kafka producer. Produce and WaitTopic are called from one
// goroutine.
type Kafka struct {
	cfg       Config
	log       zerolog.Logger
	transport *kafka.Transport
	conns     *conntrack.Conns
	addr      net.Addr
	balancer  kafka.Murmur2Balancer
	// structured: records are structured CloudEvents (Config.CloudEventsMode).
	structured bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	topics map[string]*topicState // owned by the Produce goroutine

	// Dispatcher inbox: a wake-up signal and topics whose partitions are known.
	wake      chan struct{}
	mu        sync.Mutex
	newTopics []*topicState
	refused   []failure // events of topics the broker refuses, to report

	lastPush atomic.Int64 // UnixNano of the newest Produce
	lastSent int64        // UnixNano of the newest request (dispatcher-owned)
	failing  atomic.Int32 // partitions currently retrying
	// peakInFlight: the most requests one broker had in flight at once.
	peakInFlight atomic.Int32
	reachable    atomic.Bool  // the last metadata probe succeeded
	circuit      atomic.Int32 // circuitClosed, circuitOpen, circuitHalfOpen
	failedRun    int          // produce requests failed in a row (dispatcher-owned)
	circuitMu    sync.Mutex
	closing      chan struct{} // closed when an open circuit closes
	// Producer sessions (dispatcher-owned once Open returns).
	sess        session
	resetting   bool // a new session is being asked for
	resetWarned int  // the session whose reset was last warned about
	idempotent  atomic.Bool
	sessions    chan session // new sessions for the dispatcher, which numbers them
	verified    chan verdict // batches of unknown fate looked up in their partition
	fencing     fencing      // the transactional id earlier sessions are fenced with (fence.go)

	// Produce requests on the wire (wire.go): the client id they carry and
	// the counter of their correlation ids.
	clientID string
	corr     atomic.Int32

	errOnce sync.Once
	err     error
	halted  chan struct{}
}

// Open validates cfg, waits (within ctx) until the brokers answer and until each
// of cfg.Topics exists (asking the broker to auto-create it). The producer's
// goroutines live until Close.
func Open(ctx context.Context, cfg Config) (*Kafka, error) {
	cfg.setDefaults()
	if len(cfg.Brokers) == 0 {
		return nil, cfg.Names.Errorf("Brokers", "no Kafka brokers configured: set them")
	}
	if cfg.MaxInFlight > MaxInFlightLimit {
		return nil, cfg.Names.Errorf("MaxInFlight", "%d requests in flight: Kafka keeps an idempotent producer's order across at most %d; set %s to 1..%d",
			cfg.MaxInFlight, MaxInFlightLimit, cfg.Names.Name("MaxInFlight"), MaxInFlightLimit)
	}
	if cfg.CloudEventsMode == CloudEventsStructured {
		if cfg.CloudEventsSource == "" {
			return nil, errors.New("structured CloudEvents need a source (CloudEventsSource)")
		}
		if cfg.TombstoneOnEmptyPayload {
			return nil, errors.New("structured CloudEvents exclude tombstones: a structured event's value is never null")
		}
	}
	// A Transport of its own, with the settings of cfg's: Open wraps its Dial
	// and Close ends its connections, so producers opened with one Config must
	// not share one.
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
	conns := &conntrack.Conns{Next: transport.Dial}
	transport.Dial = conns.Dial
	runCtx, cancel := context.WithCancel(context.Background())
	k := &Kafka{
		cfg:       cfg,
		log:       cfg.Logger.With().Str("component", "sink").Logger(),
		transport: transport,
		clientID:  transport.ClientID,
		conns:     conns,
		addr:      kafka.TCP(cfg.Brokers...),
		balancer:  kafka.Murmur2Balancer{Consistent: true},
		ctx:       runCtx,
		cancel:    cancel,
		topics:    make(map[string]*topicState),
		wake:      make(chan struct{}, 1),
		halted:    make(chan struct{}),
		sess:      session{gen: 1, id: -1, epoch: -1},
		sessions:  make(chan session),
		verified:  make(chan verdict),
	}
	k.structured = cfg.CloudEventsSource != "" && cfg.CloudEventsMode == CloudEventsStructured
	err := k.check(ctx)
	if err == nil && cfg.Idempotent {
		err = k.openSession(ctx)
	}
	if err != nil {
		cancel()
		transport.CloseIdleConnections()
		conns.CloseAll()
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

// Produce queues m for m.Topic, on the partition its event's AggregateID
// maps to (or its TargetPartition; see partitionFor); done is told its fate
// (see Done). It does not block on Kafka. An event with an empty key fails at
// once: events need a key to keep their order; so does a structured
// CloudEvent whose payload cannot be its data (see Config.CloudEventsMode).
// Produce returns an error only when the producer has halted (see Err).
func (k *Kafka) Produce(m Message, done Done) error {
	if err := k.Err(); err != nil {
		return err
	}
	it := item{m: m, done: done, at: time.Now()}
	ev := m.Event
	if len(ev.AggregateID) == 0 {
		return k.fail(it, &outbox.EventError{Code: "empty_key", Err: errors.New("aggregate_id is NULL or empty; events need a key to keep their order")})
	}
	if k.structured {
		if ct := eventHeader(ev, outbox.HeaderContentType); needsJSONCheck(ev, ct) && !json.Valid(ev.Payload) {
			return k.fail(it, &outbox.EventError{Code: "invalid_json",
				Err: fmt.Errorf("the payload is not JSON, but its content-type %q says it is, so it cannot be a structured CloudEvent's data (set the content type %s to what the payload is)", ct, k.cfg.DecoderNames.Name("ContentType"))})
		}
	}
	ts := k.topic(m.Topic)
	ts.mu.Lock()
	if ts.parts == nil {
		ts.pending = append(ts.pending, it)
		ts.mu.Unlock()
		return nil
	}
	ts.mu.Unlock()
	p, err := k.partitionFor(ev, ts.ids)
	if err != nil {
		return k.fail(it, err)
	}
	ts.parts[p].push(it, it.at.UnixNano()) // one clock read per event
	return nil
}

// eventSize is what ev counts for in a batch's bytes: its Size, and what a
// structured CloudEvent adds to it.
func (k *Kafka) eventSize(ev *outbox.Event) int {
	if k.structured {
		return ev.Size() + structuredOverhead(ev, len(k.cfg.CloudEventsSource))
	}
	return ev.Size()
}

// partitionFor returns the partition of ids, a topic's, that ev goes to: its
// TargetPartition (outbox.columns.partition) when it has one, else the murmur2
// hash of its key. A target partition the topic does not have is a
// permanent failure of the event (code "invalid_partition").
func (k *Kafka) partitionFor(ev *outbox.Event, ids []int) (int, error) {
	if !ev.HasTargetPartition {
		return k.balancer.Balance(kafka.Message{Key: ev.AggregateID}, ids...), nil
	}
	if ev.TargetPartition < 0 || ev.TargetPartition >= int64(len(ids)) {
		return 0, &outbox.EventError{Code: "invalid_partition",
			Err: fmt.Errorf("the partition column holds %d, but the topic has partitions 0 to %d", ev.TargetPartition, len(ids)-1)}
	}
	return int(ev.TargetPartition), nil
}

// failure is an event that failed permanently outside the dispatcher, for the
// dispatcher to report.
type failure struct {
	it  item
	err error
}

// topic returns the state of a topic, starting the lookup of its partitions
// when it is new.
func (k *Kafka) topic(name string) *topicState {
	ts := k.topics[name]
	if ts == nil {
		ts = &topicState{name: name, known: make(chan struct{})}
		k.topics[name] = ts
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			k.resolve(ts)
		}()
	}
	return ts
}

// report tells the message's Done its fate (at: where Kafka stored it, when
// err is nil); when Done refuses it, the producer halts.
func (k *Kafka) report(it *item, at Stored, err error) error {
	if herr := it.done(it.m, at, err); herr != nil {
		k.halt(herr)
		return herr
	}
	return nil
}

// fail reports a permanent failure of it.
func (k *Kafka) fail(it item, err error) error {
	k.cfg.Metrics.ProduceErrors.WithLabelValues("permanent").Inc()
	k.cfg.Metrics.PermanentFailures.WithLabelValues(Code(err)).Inc()
	return k.report(&it, Stored{}, err)
}

// halt records the first error a Done returned and stops producing.
func (k *Kafka) halt(err error) {
	k.errOnce.Do(func() {
		k.err = err
		close(k.halted)
		k.cancel()
	})
}

// Err returns the error a Done returned, which halted the producer, or nil.
func (k *Kafka) Err() error {
	select {
	case <-k.halted:
		return k.err
	default:
		return nil
	}
}

// Retrying reports whether any partition is currently retrying a failed request.
func (k *Kafka) Retrying() bool { return k.failing.Load() > 0 }

// Close stops every goroutine of the producer and closes its connections.
// Events not reported yet are abandoned (their Done is never called): the
// caller waits for them first when it wants them delivered.
func (k *Kafka) Close() error {
	k.cancel()
	k.conns.CloseAll() // ends requests in flight, which kafka-go would wait out
	k.wg.Wait()
	k.transport.CloseIdleConnections()
	return nil
}
