package sink

// Fencing: an idempotent producer's session ends with its process, but not
// its requests. A run killed with produce requests written and unanswered may
// have them appended after the next run read the partitions back to find what
// is in Kafka (the broker reads them off the dead connection, or appends one
// it was handling): the next run does not see them and sends those events
// again, under a producer id the broker cannot tell from the old one. Chaos
// seed 60 appended 1129 events twice so, each copy 33 offsets after the first.
//
// Kafka's own answer is the transactional id: InitProducerId with one gives
// its producer id a new epoch, and a transaction's abort marker, written with
// that epoch to every partition of the transaction, makes each partition
// refuse the older epochs from then on. Fence does that (one empty
// transaction over a topic's partitions, aborted) before the partitions are
// read, and the producer then writes under the fenced id's newest epoch, so
// the next run fences this one in turn. Its batches stay idempotent, outside
// any transaction.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// fenceTxnTimeout is the transaction timeout of fencing transactions. They
// hold no records and end at once; one a run left open when it died is
// aborted by the next InitProducerId of its id.
const fenceTxnTimeout = time.Minute

// fencing is a producer's state of its transactional id (Fence).
type fencing struct {
	mu     sync.Mutex
	id     string          // the transactional id, once a session was got with it
	sess   session         // its newest session (gen unset)
	topics map[string]bool // topics fenced
	off    error           // why this producer fences no more
}

// Claim moves the producer to the newest session of the transactional id id
// (once per producer), so that the next run of the same stream can fence
// this one's requests (Fence). Call it once the stream is this process's
// (the relay holds the slot): taking the id's next session fences the
// process that wrote under it before. A broker that refuses transactional
// ids, or that has no transaction coordinator within the request timeout,
// leaves the producer on its own producer id: Claim logs why and counts
// cdc_relay_delivery_fallbacks_total{reason="unfenced"} once, and returns
// nil. It returns an error when Kafka does not answer or ctx ends: call it
// again later. Safe for concurrent use.
func (k *Kafka) Claim(ctx context.Context, id string) error {
	if id == "" || !k.idempotent.Load() {
		return nil
	}
	f := &k.fencing
	f.mu.Lock()
	defer f.mu.Unlock()
	return k.claim(ctx, id)
}

// claim is Claim with the fencing lock held.
func (k *Kafka) claim(ctx context.Context, id string) error {
	f := &k.fencing
	if f.id == id || f.off != nil {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, k.cfg.RequestTimeout)
	defer cancel()
	s, err := k.txnSession(cctx, id)
	if err == nil {
		err = k.handOver(cctx, s)
	}
	if err != nil {
		if err := k.giveUp(ctx, err); err != nil {
			return fmt.Errorf("take a session of transactional id %s: %w", id, err)
		}
		k.unfenced("", f.off, true)
		return nil
	}
	f.id, f.sess = id, s
	k.log.Info().Str("transactional_id", id).Int64("producer_id", s.id).Int16("epoch", s.epoch).
		Msg("idempotent producer session of the stream's transactional id: earlier runs' sessions are fenced as the partitions are read")
	return nil
}

// Fence makes sure that no earlier session of the transactional id id (an
// earlier run of the same stream, Claim) can append to the first partitions
// partitions of topic any more, and moves the producer to the id's newest
// session. Call it before reading the partitions for what earlier runs
// delivered; the read then sees all they ever will. When the broker refuses
// (an ACL, no transactions) or has no transaction coordinator within the
// request timeout, the producer goes on unfenced: Fence logs why once,
// counts cdc_relay_delivery_fallbacks_total{reason="unfenced"} for the topic
// and returns nil; a killed run's last produce requests may then be appended
// after the read, and their events twice. Fence returns an error when Kafka
// does not answer or ctx ends: call it again later. A topic is fenced once
// per producer. Safe for concurrent use.
func (k *Kafka) Fence(ctx context.Context, id, topic string, partitions int) error {
	if id == "" || !k.idempotent.Load() {
		return nil
	}
	f := &k.fencing
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := k.claim(ctx, id); err != nil {
		return err
	}
	if f.topics[topic] {
		return nil
	}
	if f.off != nil {
		k.unfenced(topic, f.off, false)
		return nil
	}
	fctx, cancel := context.WithTimeout(ctx, k.cfg.RequestTimeout)
	defer cancel()
	if err := k.fenceTopic(fctx, id, topic, partitions); err != nil {
		if err := k.giveUp(ctx, err); err != nil {
			return fmt.Errorf("fence earlier producer sessions on topic %q: %w", topic, err)
		}
		k.unfenced(topic, f.off, true)
		return nil
	}
	if f.topics == nil {
		f.topics = map[string]bool{}
	}
	f.topics[topic] = true
	k.log.Info().Str("topic", topic).Str("transactional_id", id).Int64("producer_id", f.sess.id).Int16("epoch", f.sess.epoch).
		Msg("earlier runs' producer sessions fenced on the topic: what they appended is in Kafka now or never")
	return nil
}

// giveUp decides what a failure to fence (err) means, with the fencing lock
// held. The broker answered, refusing or with a coordinator that is not
// there within the request timeout (transaction.state.log.replication.factor
// above the brokers there are never gets one): fencing is off for this
// producer, and giveUp returns nil. Kafka did not answer, or ctx ended: it
// returns the error, and the caller tries again later (the relay reconnects),
// as it does for anything else that needs Kafka.
func (k *Kafka) giveUp(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var refused *txnRefused
	var ke kafka.Error
	if !errors.As(err, &refused) && !errors.As(err, &ke) {
		return err
	}
	k.fencing.off = err
	return nil
}

// unfenced counts a session or a topic read without a fence, and logs why
// when first.
func (k *Kafka) unfenced(topic string, err error, first bool) {
	k.cfg.Metrics.DeliveryFallbacks.WithLabelValues("unfenced").Inc()
	if first {
		k.log.Warn().Err(err).Str("topic", topic).
			Msg("cannot fence earlier producer sessions (a transactional id needs Write on the TransactionalId resource, and a transaction coordinator: transaction.state.log.replication.factor within the brokers there are): events of a killed run's last produce requests may be appended twice")
	}
}

// fenceTopic runs one empty transaction over topic's partitions and aborts
// it: once the abort is complete (the next InitProducerId waits for that),
// every partition refuses the id's older epochs. The producer moves to the
// session the last InitProducerId gave. Called with the fencing lock held.
func (k *Kafka) fenceTopic(ctx context.Context, id, topic string, partitions int) error {
	f := &k.fencing
	c := &kafka.Client{Addr: k.addr, Transport: k.transport, Timeout: k.cfg.RequestTimeout}
	parts := make([]kafka.AddPartitionToTxn, partitions)
	for i := range parts {
		parts[i].Partition = i
	}
	err := k.retryTxn(ctx, "add the partitions to a fencing transaction", func() error {
		res, err := c.AddPartitionsToTxn(ctx, &kafka.AddPartitionsToTxnRequest{
			TransactionalID: id, ProducerID: int(f.sess.id), ProducerEpoch: int(f.sess.epoch),
			Topics: map[string][]kafka.AddPartitionToTxn{topic: parts},
		})
		if err != nil {
			return err
		}
		for _, p := range res.Topics[topic] {
			if p.Error != nil {
				return fmt.Errorf("partition %d: %w", p.Partition, p.Error)
			}
		}
		return nil
	}, func() error {
		// Another session of the id came since (a renewal, or another
		// process of this stream): fence from its successor.
		s, err := k.txnSession(ctx, id)
		f.sess = s
		return err
	})
	if err != nil {
		return err
	}
	err = k.retryTxn(ctx, "abort the fencing transaction", func() error {
		res, err := c.EndTxn(ctx, &kafka.EndTxnRequest{
			TransactionalID: id, ProducerID: int(f.sess.id), ProducerEpoch: int(f.sess.epoch), Committed: false,
		})
		if err != nil {
			return err
		}
		return res.Error
	}, nil)
	if err != nil {
		return err
	}
	// Waits for the abort markers on every partition, and moves past the
	// epoch they carry.
	s, err := k.txnSession(ctx, id)
	if err != nil {
		return err
	}
	f.sess = s
	return k.handOver(ctx, s)
}

// handOver gives the dispatcher a session to produce under from now on.
func (k *Kafka) handOver(ctx context.Context, s session) error {
	select {
	case k.sessions <- s:
		return nil
	case <-k.ctx.Done():
		return errors.New("the producer is closed")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// txnSession gets the next session of the transactional id id, retrying
// within ctx while the coordinator is busy (an earlier transaction of the id
// being aborted, the coordinator moving or loading).
func (k *Kafka) txnSession(ctx context.Context, id string) (session, error) {
	c := &kafka.Client{Addr: k.addr, Transport: k.transport, Timeout: k.cfg.RequestTimeout}
	var s session
	err := k.retryTxn(ctx, "get a producer id for transactional id "+id, func() error {
		res, err := c.InitProducerID(ctx, &kafka.InitProducerIDRequest{
			TransactionalID: id, TransactionTimeoutMs: int(fenceTxnTimeout.Milliseconds()), ProducerID: -1, ProducerEpoch: -1,
		})
		if err != nil {
			return err
		}
		if res.Error != nil {
			return res.Error
		}
		s = session{id: int64(res.Producer.ProducerID), epoch: int16(res.Producer.ProducerEpoch)}
		return nil
	}, nil)
	return s, err
}

// txnRefused is an error of the broker refusing what fencing asks for: no
// retry helps.
type txnRefused struct{ err error }

func (e *txnRefused) Error() string { return e.err.Error() }
func (e *txnRefused) Unwrap() error { return e.err }

// retryTxn runs op until it succeeds, fails for good (the broker refuses:
// an ACL, an unsupported request) or ctx ends, with backoff. When op's error
// says the session was fenced and resync is set, resync runs before the
// next attempt.
func (k *Kafka) retryTxn(ctx context.Context, what string, op, resync func() error) error {
	for attempt := 0; ; attempt++ {
		err := op()
		if err == nil {
			return nil
		}
		var ke kafka.Error
		if errors.As(err, &ke) {
			switch {
			case Classify(err) == Configuration, ke == kafka.InvalidRequest, ke == kafka.InvalidTransactionTimeout:
				return &txnRefused{fmt.Errorf("%s: %w", what, err)}
			case resync != nil && (ke == kafka.InvalidProducerEpoch || ke == kafka.ProducerFenced || ke == kafka.InvalidProducerIDMapping):
				if rerr := resync(); rerr != nil {
					return rerr
				}
			}
		}
		if serr := k.cfg.Retry.Sleep(ctx, attempt); serr != nil {
			return fmt.Errorf("%s: %w (last error: %w)", what, serr, err)
		}
	}
}
