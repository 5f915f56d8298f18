// Package sinktest is the contract suite every Kafka producer of the relay
// must pass: Run opens producers through a factory, each on a fresh
// in-process broker (testenv.NewKafka), injects faults with kfake's controls
// and faults, and checks what arrived with sandbox's franz-go reader, a
// different client than the producer under test.
//
// The cases, one subtest each:
//
//   - Order: per-key order and exactly one done(nil) per event across
//     transient produce errors, ambiguous errors after the append, responses
//     lost after the append, a broker restart on its data directory and
//     leadership moves between two brokers, with up to five requests in
//     flight per broker (Options.MaxInFlight).
//   - AckAfterAppend: every produce request asks for acks=all, and each event
//     is in the partition's log when its done(nil) runs.
//   - Permanent: an event over the topic's max.message.bytes, an event with an
//     empty or NULL key and an event for a topic the broker refuses are each
//     reported once with a stable *outbox.EventError code; the others are
//     delivered in order.
//   - CloseAbandons: Close returns promptly while the broker holds every
//     produce request, nothing of the producer runs after it and no done
//     follows it.
//   - HaltOnDoneError: a Done returning an error halts the producer: no
//     other Done runs, nothing more reaches the broker, Produce fails, Err
//     returns that error.
//   - BoundedMemory: while the broker fails every produce, retries do not make
//     the heap grow beyond a bound of the queued bytes.
//   - EventLifetime: every event is poisoned (each of its bytes overwritten)
//     right after its done returns, while retries go on around it: a
//     producer that reads an event after its done puts garbage in the log.
//
// Every case also checks that each produce request asks for acks=all, that
// no Done runs after Close returned, and that Done calls never overlap
// except for those made within Produce.
package sinktest

import (
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// Producer is what the suite requires of a producer.
//
// Produce queues m's event for m.Topic, keyed and partitioned by its
// AggregateID, and does not block on Kafka; it returns an error only once the
// producer has halted. It is called from one goroutine. done is then called
// exactly once for m, unless the producer was closed or halted first: with a
// nil error once Kafka acknowledged the event with acks=all, or with an
// *outbox.EventError (Code "message_too_large", "empty_key",
// "invalid_topic", ...) when it failed permanently. Events of one partition are reported in the order they were
// produced. done runs on the producer's goroutine, one call at a time, or
// within Produce for failures known at once, such as an empty key. A done that returns an error
// halts the producer: nothing more is sent, every event not yet reported is
// abandoned, and Err returns that error.
//
// Once done for m returned, the producer reads nothing of m.Event nor of
// bytes it kept of it: the relay gives the event back to its decoder, which
// fills the same *outbox.Event and buffer with the next row.
//
// Close stops every goroutine of the producer without waiting for Kafka;
// events not yet reported stay unreported. Err returns the error that halted
// the producer, or nil.
type Producer interface {
	Produce(m sink.Message, done sink.Done) error
	Err() error
	Close() error
}

// Options are the producer settings a case chooses; the factory passes each
// one that is set to the producer, and uses the producer's default for the
// others.
type Options struct {
	// BatchMaxEvents caps the events of one partition's batch. Cases set
	// it low so that order has to hold across many produce requests.
	BatchMaxEvents int
	// Retry is the backoff between attempts. Cases set it short so that
	// many attempts fit in a few seconds.
	Retry backoff.Policy
	// RequestTimeout bounds one produce attempt. Cases whose broker holds
	// requests set it long, so that no attempt ends by itself.
	RequestTimeout time.Duration
	// MaxInFlight bounds the produce requests in flight per broker. The
	// Order cases set it to 5, Kafka's most for an idempotent producer, so
	// that order has to hold across retries of requests sent back to back.
	MaxInFlight int
}

// Opener makes a producer for a case: connected to brokers, with the
// partitions of topics known (they exist when it is called), configured
// with opts. It fails t if it cannot. The suite closes every producer it
// opens, so the Opener must not.
type Opener func(t *testing.T, brokers, topics []string, opts Options) Producer

// Run runs every case of the contract against producers made by open, each
// case on a fresh in-process broker. Cases need a local kfake broker and skip
// when CDC_RELAY_TEST_KAFKA_BROKERS points elsewhere.
//
// Run must not be called from a parallel test, nor alongside other tests of
// the process: CloseAbandons and BoundedMemory look at every goroutine and at
// the heap of the process, so they run first and alone, and the other cases
// run in parallel after them.
func Run(t *testing.T, open Opener) {
	t.Run("CloseAbandons", func(t *testing.T) { testCloseAbandons(t, open) })
	t.Run("BoundedMemory", func(t *testing.T) { testBoundedMemory(t, open) })
	// A "/" in a name reads as one more level to go test -run.
	for _, c := range []struct {
		name string
		run  func(*testing.T, Opener)
	}{
		{"Order/TransientErrors", testOrderTransient},
		{"Order/AmbiguousErrors", testOrderAmbiguous},
		{"Order/DroppedResponses", testOrderDroppedResponses},
		{"Order/BrokerRestart", testOrderBrokerRestart},
		{"Order/LeaderMoves", testOrderLeaderMoves},
		{"AckAfterAppend", testAckAfterAppend},
		{"Permanent/MessageTooLarge", testMessageTooLarge},
		{"Permanent/EmptyKey", testEmptyKey},
		{"Permanent/RefusedTopic", testRefusedTopic},
		{"HaltOnDoneError", testHaltOnDoneError},
		{"EventLifetime", testEventLifetime},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, open)
		})
	}
}
