package sink

// Idempotence: producer sessions (a producer id and epoch from the broker) and
// the per-partition sequence numbers that let the broker drop a batch it
// already appended.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/initproducerid"
)

// session is a producer session: the producer id and epoch batches carry
// (id -1 when the producer is not idempotent). gen numbers the sessions of
// one producer.
type session struct {
	gen   int
	id    int64
	epoch int16
}

// errNoProducerID wraps why the broker refuses to give a producer id, for
// which the sink falls back to non-idempotent produce.
type errNoProducerID struct{ err error }

func (e *errNoProducerID) Error() string {
	return "broker gives no producer id: " + e.err.Error()
}

func (e *errNoProducerID) Unwrap() error { return e.err }

// apiInitProducerID is the InitProducerId API key.
const apiInitProducerID = 22

// producerID asks the broker for a producer id. The error is an
// *errNoProducerID when the broker refuses (it lacks the API, or the
// principal may not write idempotently); other errors are worth retrying.
func (k *Kafka) producerID(ctx context.Context) (int64, int16, error) {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.RequestTimeout)
	defer cancel()
	client := kafka.Client{Addr: k.addr, Transport: k.transport}
	av, err := client.ApiVersions(ctx, &kafka.ApiVersionsRequest{Addr: k.addr})
	if err != nil {
		return 0, 0, fmt.Errorf("ask the broker for its API versions: %w", err)
	}
	supported := false
	for _, a := range av.ApiKeys {
		if a.ApiKey == apiInitProducerID {
			supported = true
		}
	}
	if !supported {
		return 0, 0, &errNoProducerID{errors.New("the broker does not support InitProducerId (Kafka < 0.11)")}
	}
	m, err := k.transport.RoundTrip(ctx, k.addr, &anyBrokerInit{
		TransactionTimeoutMs: -1, ProducerID: -1, ProducerEpoch: -1,
	})
	if err != nil {
		return 0, 0, fmt.Errorf("init producer id: %w", err)
	}
	res, ok := m.(*initproducerid.Response)
	if !ok {
		return 0, 0, fmt.Errorf("init producer id: unexpected response %T", m)
	}
	if res.ErrorCode != 0 {
		err := fmt.Errorf("init producer id: %w", kafka.Error(res.ErrorCode))
		if Classify(err) == Configuration || kafka.Error(res.ErrorCode) == kafka.InvalidRequest {
			return 0, 0, &errNoProducerID{err}
		}
		return 0, 0, err
	}
	return res.ProducerID, res.ProducerEpoch, nil
}

// openSession gets the first producer session at Open, retrying within ctx.
// When the broker refuses, the producer is not idempotent.
func (k *Kafka) openSession(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		id, epoch, err := k.producerID(ctx)
		if err == nil {
			k.sess = session{gen: 1, id: id, epoch: epoch}
			k.idempotent.Store(true)
			k.log.Info().Int64("producer_id", id).Int16("epoch", epoch).Msg("idempotent producer")
			return nil
		}
		var refused *errNoProducerID
		if errors.As(err, &refused) {
			k.fallBack(err)
			k.sess = session{gen: 1, id: -1, epoch: -1}
			return nil
		}
		if serr := k.cfg.Retry.Sleep(ctx, attempt); serr != nil {
			return fmt.Errorf("get a producer id for idempotent produce from %s (or turn idempotence off): %w", k.cfg.Brokers, err)
		}
	}
}

// fallBack records that the producer is not idempotent after all.
func (k *Kafka) fallBack(err error) {
	k.idempotent.Store(false)
	k.cfg.Metrics.DeliveryFallbacks.WithLabelValues("producer_id_unavailable").Inc()
	k.log.Warn().Err(err).Msg("idempotence unavailable: producing without it; a re-sent batch may be duplicated in Kafka")
}

// renewSession gets a new producer session in the background, retrying
// until it succeeds or the producer closes, and hands it to the dispatcher.
// A producer that fenced with a transactional id (Fence) takes the id's next
// session, which the next run fences in turn.
func (k *Kafka) renewSession() {
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		s := session{id: -1, epoch: -1}
		for attempt := 0; ; attempt++ {
			id, epoch, err := k.renewedID(k.ctx)
			if err == nil {
				s.id, s.epoch = id, epoch
				k.log.Info().Int64("producer_id", id).Int16("epoch", epoch).Msg("new idempotent producer session")
				break
			}
			var refused *errNoProducerID
			if errors.As(err, &refused) {
				k.fallBack(err)
				break
			}
			if k.cfg.Retry.Sleep(k.ctx, attempt) != nil {
				return
			}
		}
		select {
		case k.sessions <- s:
		case <-k.ctx.Done():
		}
	}()
}

// renewedID returns a producer id and epoch for a renewed session: the next
// session of the transactional id Fence used, or a new producer id.
func (k *Kafka) renewedID(ctx context.Context) (int64, int16, error) {
	f := &k.fencing
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.id == "" || f.off != nil {
		return k.producerID(ctx)
	}
	tctx, cancel := context.WithTimeout(ctx, k.cfg.RequestTimeout)
	defer cancel()
	s, err := k.txnSession(tctx, f.id)
	var refused *txnRefused
	if errors.As(err, &refused) {
		// Refused now (an ACL withdrawn): produce unfenced from here on.
		f.off = err
		k.log.Warn().Err(err).Msg("cannot take the next session of the transactional id: a new producer id, which the next run cannot fence")
		return k.producerID(ctx)
	}
	if err != nil {
		return 0, 0, err
	}
	f.sess = s
	return s.id, s.epoch, nil
}

// Idempotent reports whether the producer produces idempotently: Config asked
// for it and the broker gave a producer id.
func (k *Kafka) Idempotent() bool { return k.idempotent.Load() }

// stamp sets a batch's producer fields before it is sent. A re-send within
// its session repeats them, so the broker drops it if an earlier attempt was
// appended. Otherwise the partition joins the current session (sequence 0 in
// a new one) and the batch takes the partition's next sequence, which then
// moves past it: batches in flight together have consecutive sequences.
func (k *Kafka) stamp(p *partition, b *batch, now time.Time) {
	if b.built && b.gen == k.sess.gen {
		return
	}
	if b.built && b.everUnknown && b.pf.id >= 0 {
		// An earlier attempt may be in Kafka under the old producer id,
		// which the new session cannot recognise.
		k.cfg.Metrics.DeliveryFallbacks.WithLabelValues("producer_reset").Inc()
		if k.resetWarned != k.sess.gen {
			k.resetWarned = k.sess.gen
			k.log.Warn().Str("topic", p.topic).Int("partition", p.id).Int("events", len(b.items)).
				Msg("producer session reset while a batch's fate was unknown: re-sending it; events may be duplicated in Kafka")
		}
	}
	if p.sess.gen != k.sess.gen {
		p.sess, p.seq, p.confirmed = k.sess, 0, false
	}
	if !b.built {
		b.times = timesOf(b.items, now.UnixMilli())
	}
	b.built, b.gen, b.everUnknown, b.undecided = true, k.sess.gen, false, false
	b.pf = noProducer
	if k.sess.id >= 0 {
		b.pf = producerFields{id: k.sess.id, epoch: k.sess.epoch, seq: p.seq}
		p.seq = nextSeq(p.seq, len(b.items))
	}
}

// nextSeq is the sequence after n records from seq; it wraps from
// math.MaxInt32 to 0, as Kafka's sequences do.
func nextSeq(seq int32, n int) int32 {
	return int32((int64(seq) + int64(n)) % (math.MaxInt32 + 1))
}

// sessionError reports whether a produce error code says the broker lost or
// rejects the producer's session or sequence: only a new session helps.
func sessionError(code kafka.Error) bool {
	switch code {
	case kafka.OutOfOrderSequenceNumber, kafka.UnknownProducerId, kafka.InvalidProducerEpoch,
		kafka.InvalidProducerIDMapping, kafka.ProducerFenced:
		return true
	}
	return false
}

// unknownFate reports whether a failed attempt may still have been appended:
// the request may have reached the broker and its answer was lost, or the
// broker said it timed out or appended without enough replicas.
func unknownFate(reqErr error, code kafka.Error, answered bool) bool {
	if reqErr != nil {
		var rerr *noRouteError // kafka-go's metadata names no broker to send to
		var oerr *net.OpError
		if errors.As(reqErr, &rerr) || errors.As(reqErr, &oerr) && oerr.Op == "dial" {
			return false
		}
		return true
	}
	if !answered {
		return true
	}
	return code == kafka.RequestTimedOut || code == kafka.NotEnoughReplicasAfterAppend
}

// anyBrokerInit is an InitProducerId request without a transactional id,
// sent to any broker. kafka-go routes its own initproducerid.Request, which
// has a Transaction method, through a FindCoordinator lookup, here with an
// empty key, which a real broker may answer with COORDINATOR_NOT_AVAILABLE
// (while it creates __transaction_state) or refuse under ACLs; an idempotent
// producer's id comes from any broker. It is registered as an override type
// of the API, with initproducerid.Request's
// fields, so kafka-go encodes it by its own layout.
type anyBrokerInit struct {
	_                    struct{} `kafka:"min=v2,max=v4,tag"`
	TransactionalID      string   `kafka:"min=v0,max=v4,nullable"`
	TransactionTimeoutMs int32    `kafka:"min=v0,max=v4"`
	ProducerID           int64    `kafka:"min=v3,max=v4"`
	ProducerEpoch        int16    `kafka:"min=v3,max=v4"`
}

// anyBrokerInitOverride is anyBrokerInit's override key (kafka-go uses 0 for
// its rawproduce, of another API).
const anyBrokerInitOverride protocol.OverrideTypeKey = 1

func init() {
	protocol.RegisterOverride(&anyBrokerInit{}, &initproducerid.Response{}, anyBrokerInitOverride)
}

// ApiKey is InitProducerId's.
func (r *anyBrokerInit) ApiKey() protocol.ApiKey { return protocol.InitProducerId }

// TypeKey selects the override type.
func (r *anyBrokerInit) TypeKey() protocol.OverrideTypeKey { return anyBrokerInitOverride }

// Broker routes the request to any known broker.
func (r *anyBrokerInit) Broker(c protocol.Cluster) (protocol.Broker, error) {
	for _, b := range c.Brokers {
		return b, nil
	}
	return protocol.Broker{}, errors.New("no broker known yet")
}

var (
	_ protocol.BrokerMessage       = (*anyBrokerInit)(nil)
	_ protocol.OverrideTypeMessage = (*anyBrokerInit)(nil)
)
