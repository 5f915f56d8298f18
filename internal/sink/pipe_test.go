package sink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestBrokerStopsReading stops the broker reading while the producer's
// pipe is open and sends more than the socket buffers hold, so the pipe's
// writer blocks: every request, written or awaited, fails at the request
// timeout, the producer says it is retrying (log, metric, Retrying), and
// once the broker reads again every event is acknowledged once and is in
// Kafka once, in per-key order.
func TestBrokerStopsReading(t *testing.T) {
	t.Parallel()
	const (
		topic   = "outbox.events"
		timeout = 2 * time.Second
		buffer  = 4096 // SO_RCVBUF/SO_SNDBUF on both sides: writes block early
	)
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{topic}, SocketBuffer: buffer})
	testenv.RequireLocalKafka(t, kafka)
	dialer := &net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, buffer)
		}); err != nil {
			return err
		}
		return serr
	}}
	logs := &sandbox.Buffer{}
	m := metrics.New(prometheus.NewRegistry())
	k := openSink(t, Config{
		Brokers: kafka.Brokers(), Topics: []string{topic}, Idempotent: true, Retry: fastRetry,
		RequestTimeout: timeout, Logger: zerolog.New(logs), Metrics: m,
		Transport: &kafkago.Transport{Dial: dialer.DialContext},
	})

	// Small events first: the pipe to the broker is open when it stops reading.
	const keys = 8
	var evs []*outbox.Event
	next := make([]int, keys)
	add := func(n, pad int) []*outbox.Event {
		from := len(evs)
		for i := 0; i < n; i++ {
			key := len(evs) % keys
			evs = append(evs, paddedEvent(fmt.Sprintf("agg-%d", key), next[key], uint64(len(evs)), pad))
			next[key]++
		}
		return evs[from:]
	}
	warm := add(keys, 0)
	acks := newAckLog(keys + 48)
	sendAll(t, k, topic, warm, acks.ack)
	testenv.Eventually(t, 20*time.Second, func() error {
		if n := acks.count(); n < len(warm) {
			return fmt.Errorf("%d of %d warm-up events acknowledged", n, len(warm))
		}
		return nil
	})

	if err := kafka.StopReading(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	// 48 events of 100 KB: each request is far more than the buffers hold.
	sendAll(t, k, topic, add(48, 100<<10), acks.ack)
	transient := m.ProduceErrors.WithLabelValues("transient")
	testenv.Eventually(t, 5*timeout, func() error {
		if !k.Retrying() || testutil.ToFloat64(transient) == 0 {
			return errors.New("the producer does not say it is retrying while the broker reads nothing")
		}
		return nil
	})
	noticed := time.Since(stopped)
	t.Logf("retrying %v after the broker stopped reading (request timeout %v)", noticed.Round(time.Millisecond), timeout)
	if !strings.Contains(logs.String(), "Kafka produce failing") {
		t.Errorf("no \"Kafka produce failing\" line while the broker reads nothing:\n%s", logs.String())
	}
	if got := acks.count(); got != len(warm) {
		t.Errorf("%d events acknowledged while the broker read nothing, want %d", got, len(warm))
	}

	kafka.ResumeReading()
	acks.wait(t, 60*time.Second)
	acks.checkExactlyOnce(t, evs)
	recs := readAll(t, kafka, topic)
	if len(recs) != len(evs) {
		t.Errorf("%d records in Kafka for %d events: the idempotent producer must leave no duplicate", len(recs), len(evs))
	}
	for i, n := range checkOrder(t, recs) {
		if want := len(evs) / keys; n != want {
			t.Errorf("key %s: %d events, want %d", i, n, want)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if k.Retrying() {
			return errors.New("still retrying after everything was acknowledged")
		}
		return nil
	})
	if !strings.Contains(logs.String(), "Kafka produce recovered") {
		t.Errorf("no \"Kafka produce recovered\" line once the broker read again")
	}
}

// TestBrokerDownEveryRequestComesBack keeps the broker down while the
// producer retries every few milliseconds: each attempt opens a pipe whose
// connection is refused at once. Every request must come back from its
// pipe, failed, to be retried: once the broker is back, every event is
// acknowledged once and the producer stops retrying. A request handed to a
// pipe that had already failed was lost, and its partition stalled for ever.
func TestBrokerDownEveryRequestComesBack(t *testing.T) {
	t.Parallel()
	const topic = "outbox.events"
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4, Topics: []string{topic}})
	testenv.RequireLocalKafka(t, kafka)
	m := metrics.New(prometheus.NewRegistry())
	k := openSink(t, Config{
		Brokers: kafka.Brokers(), Topics: []string{topic}, Idempotent: true, Metrics: m,
		Retry: backoff.Policy{Base: time.Millisecond, Cap: 2 * time.Millisecond}, RequestTimeout: 5 * time.Second,
		BatchMaxEvents: 1, Logger: zerolog.Nop(),
	})
	evs := stream(16, 400)
	acks := newAckLog(len(evs))
	sendAll(t, k, topic, evs[:16], acks.ack)
	testenv.Eventually(t, 20*time.Second, func() error {
		if n := acks.count(); n < 16 {
			return fmt.Errorf("%d of 16 events acknowledged before the outage", n)
		}
		return nil
	})
	kafka.Stop()
	sendAll(t, k, topic, evs[16:], acks.ack)
	// Many attempts, each on a pipe of its own that fails at once.
	retries := m.ProduceRetries
	testenv.Eventually(t, 20*time.Second, func() error {
		if n := testutil.ToFloat64(retries); n < 2000 {
			return fmt.Errorf("%v attempts failed while the broker is down, want 2000", n)
		}
		return nil
	})
	if err := kafka.Start(); err != nil {
		t.Fatalf("start the broker again: %v", err)
	}
	acks.wait(t, 30*time.Second)
	acks.checkExactlyOnce(t, evs)
	testenv.Eventually(t, 10*time.Second, func() error {
		if k.Retrying() {
			return errors.New("still retrying after everything was acknowledged")
		}
		return nil
	})
	t.Logf("%v failed attempts while the broker was down", testutil.ToFloat64(retries))
}

// TestBrokerHangsOnOpenConnections: the broker stops reading every
// connection the producer has open, its idle pooled ones too (left by
// reads of the partitions), while it serves new ones, as a broker whose
// network thread hung on them. The producer must deliver within about the
// request timeout plus the first steps of its backoff, not a request
// timeout per connection opened before the hang: kafka-go hands out idle
// connections first, and 11 hung ones took 9.7 s with a 1 s request timeout
// before the producer closed them at the first timeout (now 1.1 s).
func TestBrokerHangsOnOpenConnections(t *testing.T) {
	t.Parallel()
	const (
		topic   = "outbox.events"
		timeout = time.Second
	)
	retry := backoff.Policy{Base: 100 * time.Millisecond, Cap: time.Second}
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 8, Topics: []string{topic}})
	testenv.RequireLocalKafka(t, kafka)
	logs := &sandbox.Buffer{}
	k := openSink(t, Config{
		Brokers: kafka.Brokers(), Topics: []string{topic}, Idempotent: true, Verifier: TestVerifier, Retry: retry,
		RequestTimeout: timeout, Logger: zerolog.New(logs), Metrics: metrics.New(prometheus.NewRegistry()),
	})
	evs := stream(8, 400)
	acks := newAckLog(len(evs))
	sendAll(t, k, topic, evs[:8], acks.ack)
	testenv.Eventually(t, 20*time.Second, func() error {
		if n := acks.count(); n < 8 {
			return fmt.Errorf("%d of 8 events acknowledged before the hang", n)
		}
		return nil
	})
	// Reads of each partition at its end wait on the broker (MaxWait) at
	// once, each on a connection of its own, which kafka-go then keeps idle.
	ranges, err := k.Ranges(context.Background(), topic, 8)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for p, r := range ranges {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := k.Scan(context.Background(), topic, p, r.End, r.End+1, func(int64, []byte, []byte) error { return nil }); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	n, err := kafka.StallConnections()
	if err != nil {
		t.Fatal(err)
	}
	if n < 5 {
		t.Fatalf("%d connections open at the hang, want the pipe's, metadata's and reads' (5 or more)", n)
	}
	hung := time.Now()
	sendAll(t, k, topic, evs[8:], acks.ack)
	acks.wait(t, 60*time.Second)
	took := time.Since(hung)
	// The request timeout, the backoff's first three steps at their longest
	// (100, 200, 400 ms), and slack for a busy machine.
	bound := timeout + 700*time.Millisecond + 1500*time.Millisecond
	t.Logf("%d connections hung; every event acknowledged %v later (request timeout %v)", n, took.Round(time.Millisecond), timeout)
	if took > bound {
		t.Errorf("delivered %v after the broker hung %d connections, want within %v: about the request timeout plus the backoff's first steps", took, n, bound)
	}
	acks.checkExactlyOnce(t, evs)
	recs := readAll(t, kafka, topic)
	if len(recs) != len(evs) {
		t.Errorf("%d records for %d events", len(recs), len(evs))
	}
	checkOrder(t, recs)
}
