package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

const fenceID = "cdc-relay:7312345678901234567:1:cdc_relay"

// TestFenceRefusesEarlierSessions: a producer that claimed the stream's
// transactional id is closed (killed) with a produce request in flight,
// which the broker holds. A second producer claims the id and fences the
// topic: each partition gets the abort marker (its end moves by one), and
// the held request, handed to the broker after that, is refused
// (INVALID_PRODUCER_EPOCH), so the second producer's copies of its events
// are the only ones.
func TestFenceRefusesEarlierSessions(t *testing.T) {
	t.Parallel()
	const partitions = 4
	kf := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: partitions, Topics: []string{idemTopic}})
	testenv.RequireLocalKafka(t, kf)
	open := func(logs *sandbox.Buffer, m *metrics.Metrics) *Kafka {
		return openSink(t, Config{
			Brokers: kf.Brokers(), Topics: []string{idemTopic}, Idempotent: true, Verifier: TestVerifier,
			Retry: fastRetry, RequestTimeout: 5 * time.Second, BatchMaxEvents: 10, Logger: zerolog.New(logs), Metrics: m,
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	first := open(&sandbox.Buffer{}, metrics.New(prometheus.NewRegistry()))
	if err := first.Claim(ctx, fenceID); err != nil {
		t.Fatal(err)
	}
	evs := stream(8, 48)
	origin := outbox.NewOrigin("7312345678901234567", 1, "cdc_relay")
	origins := map[*outbox.Event]*outbox.Origin{}
	for i, ev := range evs {
		origins[ev], ev.Index = origin, uint32(i)
	}
	acks := newAckLog(16)
	sendFrom(t, first, idemTopic, evs[:16], origins, acks.ack)
	acks.wait(t, 20*time.Second)

	// The next produce request is held, then handed back by the test.
	var (
		mu   sync.Mutex
		late *kmsg.ProduceRequest
		held = make(chan struct{})
		gone = make(chan struct{})
	)
	c := kf.Cluster()
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		hold := late == nil
		if hold {
			late = req.(*kmsg.ProduceRequest)
		}
		mu.Unlock()
		if !hold {
			return nil, nil, false
		}
		close(held)
		c.SleepControl(func() { <-gone })
		return nil, errors.New("test: the closed producer's request, handed to the broker again by the test"), true
	})
	sendFrom(t, first, idemTopic, evs[16:32], origins, func(Message, Stored, error) error { return nil })
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("no produce request reached the broker")
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	close(gone)

	logs := &sandbox.Buffer{}
	m := metrics.New(prometheus.NewRegistry())
	second := open(logs, m)
	before, err := second.Ranges(ctx, idemTopic, partitions)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Claim(ctx, fenceID); err != nil {
		t.Fatal(err)
	}
	if err := second.Fence(ctx, fenceID, idemTopic, partitions); err != nil {
		t.Fatal(err)
	}
	after, err := second.Ranges(ctx, idemTopic, partitions)
	if err != nil {
		t.Fatal(err)
	}
	for p := range after {
		if after[p].End != before[p].End+1 {
			t.Errorf("partition %d ends at %d after the fence, %d before: want the abort marker", p, after[p].End, before[p].End)
		}
	}

	cl, err := kgo.NewClient(append(kf.ClientOpts(), kgo.MaxVersions(kversion.V3_0_0()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	resp, err := cl.Broker(0).Request(ctx, late)
	if err != nil {
		t.Fatalf("hand the closed producer's request to the broker: %v", err)
	}
	var answers []string
	for _, rt := range resp.(*kmsg.ProduceResponse).Topics {
		for _, rp := range rt.Partitions {
			answers = append(answers, fmt.Sprintf("%d:%v", rp.Partition, kerr.ErrorForCode(rp.ErrorCode)))
			if rp.ErrorCode != kerr.InvalidProducerEpoch.Code && rp.ErrorCode != kerr.ProducerFenced.Code {
				t.Errorf("the closed producer's request appended to partition %d after the fence (%v), want it refused", rp.Partition, kerr.ErrorForCode(rp.ErrorCode))
			}
		}
	}
	t.Logf("the closed producer's request, handed to the broker after the fence: %s", strings.Join(answers, " "))

	acks2 := newAckLog(32)
	sendFrom(t, second, idemTopic, evs[16:], origins, acks2.ack)
	acks2.wait(t, 20*time.Second)
	recs := readAll(t, kf, idemTopic)
	if len(recs) != len(evs) {
		t.Errorf("%d records for %d events", len(recs), len(evs))
	}
	checkOrder(t, recs)
	if n := testutil.ToFloat64(m.DeliveryFallbacks.WithLabelValues("unfenced")); n != 0 {
		t.Errorf("delivery_fallbacks_total{unfenced} = %v, want 0", n)
	}
}

// TestFenceRefusedGoesOnUnfenced: a broker that refuses the transactional
// id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED: no ACL) leaves the producer on
// its own producer id; it says so once, counts the unfenced fallback, and
// delivers every event once.
func TestFenceRefusedGoesOnUnfenced(t *testing.T) {
	t.Parallel()
	r := startIdem(t, true, 4, 100, nil)
	c := r.kf.Cluster()
	c.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		init := req.(*kmsg.InitProducerIDRequest)
		if init.TransactionalID == nil {
			return nil, nil, false
		}
		resp := init.ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
		return resp, nil, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.k.Claim(ctx, fenceID); err != nil {
		t.Fatal(err)
	}
	if err := r.k.Fence(ctx, fenceID, idemTopic, 4); err != nil {
		t.Fatal(err)
	}
	r.send(t, r.evs)
	recs, dupes := r.finish(t)
	r.checkClean(t, recs, dupes)
	if n := testutil.ToFloat64(r.m.DeliveryFallbacks.WithLabelValues("unfenced")); n != 2 {
		t.Errorf("delivery_fallbacks_total{unfenced} = %v, want 2 (the claim, the topic)", n)
	}
	if n := strings.Count(r.logs.String(), "cannot fence earlier producer sessions"); n != 1 {
		t.Errorf("%d warnings about fencing, want 1:\n%s", n, r.logs)
	}
}
