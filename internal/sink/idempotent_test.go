package sink

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

const idemTopic = "outbox.idem"

// idemRun is one producer on a kfake broker, for the delivery tests below.
type idemRun struct {
	kf   *sandbox.Kafka
	k    *Kafka
	m    *metrics.Metrics
	logs *sandbox.Buffer
	evs  []*outbox.Event
	acks *ackLog
	// origins holds the Origin of the events sent as read from a stream.
	origins map[*outbox.Event]*outbox.Origin
}

// startIdem starts a broker with partitions partitions and a producer with
// small batches, so a stream takes many requests; evs events over 20 keys
// are to be sent.
func startIdem(t *testing.T, idempotent bool, partitions, events int, tweak func(*Config)) *idemRun {
	t.Helper()
	kf := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: partitions, Topics: []string{idemTopic}})
	testenv.RequireLocalKafka(t, kf)
	r := &idemRun{kf: kf, m: metrics.New(prometheus.NewRegistry()), logs: &sandbox.Buffer{}, evs: stream(20, events)}
	r.acks = newAckLog(len(r.evs))
	if TestVerifier == nil {
		t.Fatal("no Verifier: verifier_test.go sets dedup's Decider")
	}
	cfg := Config{
		Brokers: kf.Brokers(), Topics: []string{idemTopic}, Idempotent: idempotent, Verifier: TestVerifier,
		Retry: fastRetry, RequestTimeout: 5 * time.Second, BatchMaxEvents: 10,
		Logger: zerolog.New(r.logs), Metrics: r.m,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	r.k = openSink(t, cfg)
	if r.k.Idempotent() != idempotent {
		t.Fatalf("Idempotent() = %v, want %v", r.k.Idempotent(), idempotent)
	}
	return r
}

// send produces evs in bursts, so that many requests go out.
func (r *idemRun) send(t *testing.T, evs []*outbox.Event) {
	t.Helper()
	for i := 0; i < len(evs); i += 25 {
		sendFrom(t, r.k, idemTopic, evs[i:min(i+25, len(evs))], r.origins, r.acks.ack)
	}
}

// finish waits for every acknowledgement and reads the topic back. It fails t
// when an event is missing from Kafka or was acknowledged other than once,
// and returns the records and how many of them repeat an earlier id.
func (r *idemRun) finish(t *testing.T) ([]sandbox.Record, int) {
	t.Helper()
	r.acks.wait(t, 8*time.Second)
	r.acks.checkExactlyOnce(t, r.evs)
	recs := testenv.MustReadAll(t, r.kf, idemTopic)
	seen := map[string]bool{}
	dupes := 0
	for _, rec := range recs {
		id := rec.Headers[HeaderID]
		if seen[id] {
			dupes++
		}
		seen[id] = true
	}
	for _, ev := range r.evs {
		if !seen[string(ev.ID)] {
			t.Errorf("event %s acknowledged but not in Kafka", ev.ID)
		}
	}
	return recs, dupes
}

// checkClean fails t unless Kafka holds every event exactly once, in order
// per key, and each acknowledged event says where Kafka stored it.
func (r *idemRun) checkClean(t *testing.T, recs []sandbox.Record, dupes int) {
	t.Helper()
	if dupes != 0 || len(recs) != len(r.evs) {
		t.Errorf("%d records for %d events, %d duplicates; want none", len(recs), len(r.evs), dupes)
	}
	checkOrder(t, recs)
	at := map[string]sandbox.Record{}
	for _, rec := range recs {
		at[rec.Headers[HeaderID]] = rec
	}
	for _, ev := range r.evs {
		rec := at[string(ev.ID)]
		if st, _ := r.acks.stored(ev); st.Partition != rec.Partition || st.Offset != rec.Offset {
			t.Errorf("event %s acknowledged at %d@%d, stored at %d@%d", ev.ID, st.Partition, st.Offset, rec.Partition, rec.Offset)
		}
	}
}

// onProduce makes fn see every produce request c gets, numbered from 1; fn
// answers like a kfake control function.
func onProduce(c *kfake.Cluster, fn func(n int, req *kmsg.ProduceRequest) (kmsg.Response, error, bool)) {
	var mu sync.Mutex
	n := 0
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		return fn(i, kreq.(*kmsg.ProduceRequest))
	})
}

// resends spots the re-sends of produce request 3's first batch: requests of
// later numbers whose first batch has its producer id and first sequence.
// With several requests in flight, request 4 need not be the re-send.
type resends struct {
	mu    sync.Mutex
	first *kmsg.RecordBatch
	seen  int
}

// note records request n's first batch when n is 3 and reports whether
// req is a re-send of it.
func (x *resends) note(n int, req *kmsg.ProduceRequest) bool {
	var b kmsg.RecordBatch
	if err := b.ReadFrom(req.Topics[0].Partitions[0].Records); err != nil {
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if n == 3 {
		x.first = &b
		return false
	}
	if n > 3 && x.first != nil && b.ProducerID == x.first.ProducerID && b.FirstSequence == x.first.FirstSequence {
		x.seen++
		return true
	}
	return false
}

// every reports whether request n is one of the faulted ones: the 3rd,
// 8th, 13th, ... up to the count-th.
func every(n, count int) bool { return n >= 3 && (n-3)%5 == 0 && (n-3)/5 < count }

// loseAnswers makes the broker append the chosen produce requests and the
// producer lose their answers: its connections are cut while the broker
// handles the request.
func loseAnswers(r *idemRun, count int) {
	onProduce(r.kf.Cluster(), func(n int, _ *kmsg.ProduceRequest) (kmsg.Response, error, bool) {
		if every(n, count) {
			r.k.conns.CloseOpen()
		}
		return nil, nil, false // the broker handles (appends) it
	})
}

// TestIdempotentResponseLost: the broker appends a batch but the producer
// never gets the answer. The re-sent batch carries the same producer id and
// sequence, so the broker acknowledges it without a second copy.
func TestIdempotentResponseLost(t *testing.T) {
	t.Parallel()
	r := startIdem(t, true, 4, 600, nil)
	loseAnswers(r, 3)
	r.send(t, r.evs)
	recs, dupes := r.finish(t)
	r.checkClean(t, recs, dupes)
	if got := testutil.ToFloat64(r.m.UnknownFateResent); got == 0 {
		t.Error("unknown_fate_resent_total = 0 after lost answers")
	}
	if got := testutil.ToFloat64(r.m.DeliveryFallbacks.WithLabelValues("producer_reset")); got != 0 {
		t.Errorf("delivery_fallbacks_total{producer_reset} = %v, want 0", got)
	}
}

// TestPlainResponseLostDuplicates is the positive control of
// TestIdempotentResponseLost: without idempotence the same faults leave
// duplicates in Kafka, so the test above can tell.
func TestPlainResponseLostDuplicates(t *testing.T) {
	t.Parallel()
	r := startIdem(t, false, 4, 600, nil)
	loseAnswers(r, 3)
	r.send(t, r.evs)
	_, dupes := r.finish(t)
	if dupes == 0 {
		t.Error("no duplicates without idempotence after lost answers: the fault did not happen")
	}
	if got := testutil.ToFloat64(r.m.UnknownFateResent); got == 0 {
		t.Error("unknown_fate_resent_total = 0 after lost answers")
	}
}

// TestIdempotentConnectionCut cuts the connection with a request in flight,
// alternately before the broker looked at it (nothing appended) and while it
// appends it.
func TestIdempotentConnectionCut(t *testing.T) {
	t.Parallel()
	r := startIdem(t, true, 4, 600, nil)
	onProduce(r.kf.Cluster(), func(n int, _ *kmsg.ProduceRequest) (kmsg.Response, error, bool) {
		switch {
		case !every(n, 6):
		case n%2 == 0:
			return nil, errors.New("cut"), true // kfake closes the connection unhandled
		default:
			r.k.conns.CloseOpen()
		}
		return nil, nil, false
	})
	r.send(t, r.evs)
	recs, dupes := r.finish(t)
	r.checkClean(t, recs, dupes)
}

// TestIdempotentSlowAcks holds chosen produce requests in the broker until
// the producer has given up on them (its request timeout) and retried, and
// only then lets the broker append them: the late copy and the retry are one.
func TestIdempotentSlowAcks(t *testing.T) {
	t.Parallel()
	for _, idempotent := range []bool{true, false} {
		t.Run(fmt.Sprint("idempotent=", idempotent), func(t *testing.T) {
			t.Parallel()
			r := startIdem(t, idempotent, 4, 400, func(c *Config) { c.RequestTimeout = 300 * time.Millisecond })
			c := r.kf.Cluster()
			onProduce(c, func(n int, _ *kmsg.ProduceRequest) (kmsg.Response, error, bool) {
				if every(n, 2) {
					retries := testutil.ToFloat64(r.m.ProduceRetries)
					c.SleepControl(func() {
						// Until the producer counted this attempt as failed.
						for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
							if testutil.ToFloat64(r.m.ProduceRetries) > retries {
								return
							}
						}
					})
				}
				return nil, nil, false
			})
			r.send(t, r.evs)
			recs, dupes := r.finish(t)
			if idempotent {
				r.checkClean(t, recs, dupes)
			} else if dupes == 0 {
				t.Error("no duplicates without idempotence after acks slower than the timeout: the fault did not happen")
			}
			if got := testutil.ToFloat64(r.m.UnknownFateResent); got == 0 {
				t.Error("unknown_fate_resent_total = 0 after timeouts")
			}
		})
	}
}

// TestIdempotentBrokerRestart loses the answer to a request the broker
// appended, then restarts the broker on its data directory before the
// re-send: the producer state the broker persisted recognises the batch.
func TestIdempotentBrokerRestart(t *testing.T) {
	t.Parallel()
	r := startIdem(t, true, 4, 600, nil)
	chunk := len(r.evs) / 4
	for round := 0; round < 3; round++ {
		took := make(chan struct{})
		var once sync.Once
		onProduce(r.kf.Cluster(), func(int, *kmsg.ProduceRequest) (kmsg.Response, error, bool) {
			once.Do(func() {
				r.k.conns.CloseOpen()
				close(took)
			})
			return nil, nil, false
		})
		r.send(t, r.evs[round*chunk:(round+1)*chunk])
		select {
		case <-took:
		case <-time.After(5 * time.Second):
			t.Fatal("no produce request reached the broker")
		}
		r.kf.Stop()
		if err := r.kf.Start(); err != nil {
			t.Fatal(err)
		}
	}
	r.send(t, r.evs[3*chunk:])
	recs, dupes := r.finish(t)
	r.checkClean(t, recs, dupes)
	if got := testutil.ToFloat64(r.m.UnknownFateResent); got == 0 {
		t.Error("unknown_fate_resent_total = 0: no answer was lost")
	}
}

// TestIdempotentLeadershipMoves moves partition leaders between three brokers
// while events flow: the producer follows them and the sequences stay valid.
func TestIdempotentLeadershipMoves(t *testing.T) {
	t.Parallel()
	r := startIdem(t, true, 4, 800, func(c *Config) {
		c.Transport = &kafkago.Transport{MetadataTTL: 50 * time.Millisecond}
	})
	c := r.kf.Cluster()
	for range 2 {
		if _, _, err := c.AddNode(-1, 0); err != nil {
			t.Fatalf("add broker: %v", err)
		}
	}
	chunk := len(r.evs) / 8
	for i := 0; i < 8; i++ {
		r.send(t, r.evs[i*chunk:(i+1)*chunk])
		if i%2 == 0 {
			c.ShufflePartitionLeaders()
		} else if err := c.MoveTopicPartition(idemTopic, int32(i%4), int32(i%3)); err != nil {
			t.Fatalf("move partition: %v", err)
		}
	}
	recs, dupes := r.finish(t)
	r.checkClean(t, recs, dupes)
	if got := testutil.ToFloat64(r.m.ProduceRetries); got == 0 {
		t.Log("no retries: leadership moved between requests only")
	}
}

// TestIdempotentSessionErrors answers a produce request with
// UNKNOWN_PRODUCER_ID and a later one with OUT_OF_ORDER_SEQUENCE_NUMBER
// (nothing appended): the producer gets a new producer id each time and
// re-sends first what failed, so nothing is lost, duplicated or reordered.
func TestIdempotentSessionErrors(t *testing.T) {
	t.Parallel()
	r := startIdem(t, true, 4, 600, nil)
	first := r.k.sess.id
	var mu sync.Mutex
	pids := map[int64]bool{}
	onProduce(r.kf.Cluster(), func(n int, req *kmsg.ProduceRequest) (kmsg.Response, error, bool) {
		var b kmsg.RecordBatch
		if err := b.ReadFrom(req.Topics[0].Partitions[0].Records); err == nil {
			mu.Lock()
			pids[b.ProducerID] = true
			mu.Unlock()
		}
		switch n {
		case 3:
			return testenv.ProduceError(req, kerr.UnknownProducerID.Code), nil, true
		case 12:
			return testenv.ProduceError(req, kerr.OutOfOrderSequenceNumber.Code), nil, true
		}
		return nil, nil, false
	})
	r.send(t, r.evs)
	recs, dupes := r.finish(t)
	r.checkClean(t, recs, dupes)
	mu.Lock()
	defer mu.Unlock()
	if len(pids) != 3 || !pids[first] {
		t.Errorf("batches carried producer ids %v; want the first, %d, and two new ones", pids, first)
	}
	if n := strings.Count(r.logs.String(), "new idempotent producer session"); n != 2 {
		t.Errorf("%d new sessions, want 2", n)
	}
	if got := testutil.ToFloat64(r.m.DeliveryFallbacks.WithLabelValues("producer_reset")); got != 0 {
		t.Errorf("delivery_fallbacks_total{producer_reset} = %v, want 0: no batch had an unknown fate", got)
	}
}

// TestIdempotentResetAfterUnknownFate: a batch's answer is lost after the
// broker appended it, and the re-send is refused with UNKNOWN_PRODUCER_ID, so
// the new producer session cannot deduplicate it. Events of the replication
// stream (with a source position) are looked up in the partition and not sent
// again; others are re-sent, counted as a producer_reset fallback, with one
// warning.
func TestIdempotentResetAfterUnknownFate(t *testing.T) {
	t.Parallel()
	origin := outbox.NewOrigin("7312345678901234567", 1, "cdc_relay")
	for _, tc := range []struct{ stamped, appended bool }{{true, true}, {true, false}, {false, true}} {
		stamped := tc.stamped
		t.Run(fmt.Sprintf("source position %v, appended %v", tc.stamped, tc.appended), func(t *testing.T) {
			t.Parallel()
			r := startIdem(t, true, 1, 100, nil)
			if stamped {
				r.origins = map[*outbox.Event]*outbox.Origin{}
				for i, ev := range r.evs {
					r.origins[ev], ev.Index = origin, uint32(i)
				}
			}
			var re resends
			onProduce(r.kf.Cluster(), func(n int, req *kmsg.ProduceRequest) (kmsg.Response, error, bool) {
				if re.note(n, req) && re.seen == 1 {
					return testenv.ProduceError(req, kerr.UnknownProducerID.Code), nil, true
				}
				if n == 3 {
					if !tc.appended {
						// The connection drops before the broker reads the request.
						return nil, errors.New("connection lost"), true
					}
					r.k.conns.CloseOpen()
				}
				return nil, nil, false
			})
			r.send(t, r.evs)
			recs, dupes := r.finish(t)
			if !tc.appended {
				checkOrder(t, recs)
				if dupes != 0 || testutil.ToFloat64(r.m.DeliveryFallbacks.WithLabelValues("producer_reset")) != 0 ||
					testutil.ToFloat64(r.m.DuplicatesSuppressed) != 0 {
					t.Errorf("%d duplicates, or a fallback or a suppression for a batch verifiably not in Kafka", dupes)
				}
				if testutil.ToFloat64(r.m.UnknownFateResent) == 0 {
					t.Error("no unknown-fate re-send: the fault did not happen")
				}
				return
			}
			fallbacks := testutil.ToFloat64(r.m.DeliveryFallbacks.WithLabelValues("producer_reset"))
			warned := strings.Count(r.logs.String(), "events may be duplicated")
			if stamped {
				checkOrder(t, recs)
				if dupes != 0 || fallbacks != 0 || warned != 0 {
					t.Errorf("%d duplicates, %v fallbacks, %d warnings; want none: the batch is in Kafka and was looked up", dupes, fallbacks, warned)
				}
				if n := testutil.ToFloat64(r.m.DuplicatesSuppressed); n == 0 {
					t.Error("no duplicate suppressed: the fault did not happen")
				}
				for _, ev := range r.evs {
					if st, _ := r.acks.stored(ev); st.Offset < 0 {
						t.Fatalf("event %s acknowledged without its offset", ev.ID)
					}
				}
				return
			}
			if dupes == 0 {
				t.Error("no duplicates: the fault did not happen")
			}
			if fallbacks != 1 {
				t.Errorf("delivery_fallbacks_total{producer_reset} = %v, want 1", fallbacks)
			}
			if warned != 1 {
				t.Errorf("%d warnings about duplicates, want 1", warned)
			}
		})
	}
}

// TestIdempotentDuplicateSequenceIsAck: when the broker answers a re-send
// with DUPLICATE_SEQUENCE_NUMBER it holds the batch; the events are
// acknowledged (offset unknown), not re-sent.
func TestIdempotentDuplicateSequenceIsAck(t *testing.T) {
	t.Parallel()
	r := startIdem(t, true, 1, 100, nil)
	var mu sync.Mutex
	var dupBatch []string
	var re resends
	onProduce(r.kf.Cluster(), func(n int, req *kmsg.ProduceRequest) (kmsg.Response, error, bool) {
		resend := re.note(n, req) && re.seen == 1
		switch {
		case n == 3:
			r.k.conns.CloseOpen()
		case resend:
			var b kmsg.RecordBatch
			if err := b.ReadFrom(req.Topics[0].Partitions[0].Records); err == nil {
				mu.Lock()
				dupBatch = append(dupBatch, fmt.Sprint(b.NumRecords))
				mu.Unlock()
			}
			return testenv.ProduceError(req, kerr.DuplicateSequenceNumber.Code), nil, true
		}
		return nil, nil, false
	})
	r.send(t, r.evs)
	recs, dupes := r.finish(t)
	if dupes != 0 || len(recs) != len(r.evs) {
		t.Errorf("%d records for %d events, %d duplicates", len(recs), len(r.evs), dupes)
	}
	checkOrder(t, recs)
	unknown := 0
	for _, ev := range r.evs {
		if st, _ := r.acks.stored(ev); st.Offset < 0 {
			unknown++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dupBatch) != 1 || fmt.Sprint(unknown) != dupBatch[0] {
		t.Errorf("%d events with an unknown offset; the duplicate batches had %v records", unknown, dupBatch)
	}
}

// TestIdempotentUnavailableFallsBack: a broker that refuses a producer id
// (here: not authorised) leaves the producer working without idempotence,
// with one warning and a metric saying so.
func TestIdempotentUnavailableFallsBack(t *testing.T) {
	t.Parallel()
	kf := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 2, Topics: []string{idemTopic}})
	testenv.RequireLocalKafka(t, kf)
	c := kf.Cluster()
	c.ControlKey(int16(kmsg.InitProducerID), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := kreq.ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
		return resp, nil, true
	})
	var mu sync.Mutex
	pids := map[int64]bool{}
	onProduce(c, func(_ int, req *kmsg.ProduceRequest) (kmsg.Response, error, bool) {
		var b kmsg.RecordBatch
		if err := b.ReadFrom(req.Topics[0].Partitions[0].Records); err == nil {
			mu.Lock()
			pids[b.ProducerID] = true
			mu.Unlock()
		}
		return nil, nil, false
	})
	m := metrics.New(prometheus.NewRegistry())
	logs := &sandbox.Buffer{}
	k := openSink(t, Config{Brokers: kf.Brokers(), Topics: []string{idemTopic}, Idempotent: true, Retry: fastRetry, Logger: zerolog.New(logs), Metrics: m})
	if k.Idempotent() {
		t.Fatal("Idempotent() = true although the broker refused a producer id")
	}
	evs := stream(5, 50)
	acks := newAckLog(len(evs))
	sendAll(t, k, idemTopic, evs, acks.ack)
	acks.wait(t, 8*time.Second)
	acks.checkExactlyOnce(t, evs)
	checkOrder(t, testenv.MustReadAll(t, kf, idemTopic))
	if got := testutil.ToFloat64(m.DeliveryFallbacks.WithLabelValues("producer_id_unavailable")); got != 1 {
		t.Errorf("delivery_fallbacks_total{producer_id_unavailable} = %v, want 1", got)
	}
	if n := strings.Count(logs.String(), "idempotence unavailable"); n != 1 {
		t.Errorf("%d warnings about idempotence being unavailable, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(pids) != 1 || !pids[-1] {
		t.Errorf("batches carried producer ids %v, want only -1", pids)
	}
}

// TestIdempotentNoCoordinatorLookup: the producer id of an idempotent
// (non-transactional) producer comes from any broker; a FindCoordinator for
// a transactional id, which a real broker may refuse or answer with
// COORDINATOR_NOT_AVAILABLE, is never asked.
func TestIdempotentNoCoordinatorLookup(t *testing.T) {
	t.Parallel()
	kf := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 2, Topics: []string{idemTopic}})
	testenv.RequireLocalKafka(t, kf)
	c := kf.Cluster()
	var lookups, inits atomic.Int32
	c.ControlKey(int16(kmsg.FindCoordinator), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		lookups.Add(1)
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.InitProducerID), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		inits.Add(1)
		return nil, nil, false
	})
	k := openSink(t, Config{Brokers: kf.Brokers(), Topics: []string{idemTopic}, Idempotent: true, Retry: fastRetry})
	if !k.Idempotent() {
		t.Fatal("Idempotent() = false")
	}
	if inits.Load() == 0 {
		t.Fatal("no InitProducerId request reached the broker")
	}
	if n := lookups.Load(); n != 0 {
		t.Fatalf("%d FindCoordinator requests for a producer id", n)
	}
}

// TestIdempotentRefusedFirstBatchKeepsOrder: a burst goes out as five
// batches in flight to one partition, and the broker refuses the first as too
// large (its two events fit only one at a time) while it takes the rest.
//
//   - producer forgotten: the partition was idle past ProducerIdle and the
//     broker forgot the producer meanwhile, so it takes any first sequence
//     (KIP-360). kfake keeps an idempotent producer's state as long as the log
//     lives (no producer.id.expiration.ms), so the topic is recreated, as
//     Kafka's producer state goes with the log, and another client writes a
//     record (a log that never held one takes only sequence 0, KAFKA-15591).
//     The producer must send the burst's first batch alone, else the second
//     batch is appended before the refused one's halves and a key is
//     reordered.
//   - producer known: the batches behind the refused one come back
//     OUT_OF_ORDER_SEQUENCE_NUMBER; they are re-sent in order behind its
//     halves, counted as such, and are no produce failure.
func TestIdempotentRefusedFirstBatchKeepsOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		forget bool
	}{{"producer forgotten", true}, {"producer known", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const (
				warm, burst = 10, 10
				idle        = 200 * time.Millisecond
				pad         = 2000 // an event with it fits max.message.bytes alone, not two
				maxMessage  = "3000"
			)
			r := startIdem(t, true, 1, warm+burst, func(c *Config) {
				c.BatchMaxEvents, c.MaxInFlight = 2, 5
				// The burst goes out whole, once all of it is queued.
				c.FlushEvents, c.Linger, c.QuietGap = burst, time.Second, time.Second
				c.ProducerIdle = idle
				if !tc.forget {
					c.ProducerIdle = time.Hour
				}
			})
			// Two keys: each batch holds an event of both.
			r.evs = stream(2, warm+burst)
			for i := warm; i < warm+2; i++ {
				ev := r.evs[i]
				var p payload
				if err := json.Unmarshal(ev.Payload, &p); err != nil {
					t.Fatal(err)
				}
				r.evs[i] = paddedEvent(p.Key, p.Seq, uint64(i), pad)
			}
			sendFrom(t, r.k, idemTopic, r.evs[:warm], nil, r.acks.ack)
			testenv.Eventually(t, 10*time.Second, func() error {
				if n := r.acks.count(); n < warm {
					return fmt.Errorf("%d of %d events acknowledged", n, warm)
				}
				return nil
			})
			warmed := time.Now()
			ctx := t.Context()
			if tc.forget {
				if err := r.kf.RecreateTopic(ctx, idemTopic, 1); err != nil {
					t.Fatal(err)
				}
				cl, err := kgo.NewClient(append(r.kf.ClientOpts(), kgo.SeedBrokers(r.kf.Brokers()...))...)
				if err != nil {
					t.Fatal(err)
				}
				err = cl.ProduceSync(ctx, &kgo.Record{Topic: idemTopic, Value: []byte(`{"key":"other"}`)}).FirstErr()
				cl.Close()
				if err != nil {
					t.Fatalf("write another producer's record: %v", err)
				}
				// The partition idles past ProducerIdle.
				time.Sleep(time.Until(warmed.Add(2 * idle)))
			}
			if err := r.kf.SetTopicConfig(ctx, idemTopic, "max.message.bytes", maxMessage); err != nil {
				t.Fatal(err)
			}
			sendFrom(t, r.k, idemTopic, r.evs[warm:], nil, r.acks.ack)
			r.acks.wait(t, 10*time.Second)
			r.acks.checkExactlyOnce(t, r.evs)

			recs := testenv.MustReadAll(t, r.kf, idemTopic)
			var got []string
			for _, rec := range recs {
				if id := rec.Headers[HeaderID]; id != "" {
					got = append(got, id)
				}
			}
			want := make([]string, 0, warm+burst)
			from := 0
			if tc.forget {
				from = warm // the recreated topic holds the burst only
			}
			for _, ev := range r.evs[from:] {
				want = append(want, string(ev.ID))
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("Kafka holds, in order:\n%v\nwant (commit order):\n%v", got, want)
			}
			if n := testutil.ToFloat64(r.m.PermanentFailures.WithLabelValues("message_too_large")); n != 0 {
				t.Errorf("%v events failed as too large; each fits alone", n)
			}
			if n := testutil.ToFloat64(r.m.ProduceBatches); n <= warm/2+burst/2 {
				t.Errorf("%v batches acknowledged: the burst's first batch was not split, the fault did not happen", n)
			}
			if n := testutil.ToFloat64(r.m.ProduceErrors.WithLabelValues("transient")); n != 0 {
				t.Errorf("produce_errors_total{transient} = %v, want 0: nothing failed", n)
			}
			if strings.Contains(r.logs.String(), "Kafka produce failing") {
				t.Error(`"Kafka produce failing" logged; nothing failed`)
			}
			behind := testutil.ToFloat64(r.m.OutOfOrderBehind)
			if tc.forget && behind != 0 {
				t.Errorf("produce_out_of_order_behind_total = %v, want 0: the first batch went alone", behind)
			}
			logged := strings.Count(r.logs.String(), "refused out of order behind one not appended")
			if !tc.forget && (behind == 0 || float64(logged) != behind) {
				t.Errorf("produce_out_of_order_behind_total = %v, %d debug lines saying so; want as many, and some: batches went behind the refused one", behind, logged)
			}
		})
	}
}

// kafkaProducerExpiration is Kafka's default producer.id.expiration.ms.
const kafkaProducerExpiration = 24 * time.Hour

// brokerExpires is Kafka's rule for forgetting an idempotent producer on a
// partition (ProducerStateManager.removeExpiredProducers): the greatest
// record timestamp of the last batch it appended (lastTimestamp) is
// expiration or more before the broker's clock. Record time, not when the
// batch arrived.
func brokerExpires(lastMaxTimestamp, now time.Time, expiration time.Duration) bool {
	return now.Sub(lastMaxTimestamp) >= expiration
}

// TestIdempotentOldRecordsKeepOrder: rows whose record timestamps
// (--column-timestamp) are older than producer.id.expiration.ms, as a
// backlog or a replay has them, go out as five batches in flight to one
// partition, while the relay's own clock says the partition was written a
// moment ago (ProducerIdle an hour). The broker's rule forgets the producer
// by the records' time: kfake keeps producer state for good, so the test
// applies the rule to what the broker appended and, where it says so, makes
// kfake forget the producer as the other test above does (recreate the
// topic, another client writes a record). The burst's first request then
// fails with NOT_ENOUGH_REPLICAS.
//
//   - old rows: the producer must send one batch at a time, else a broker
//     that forgot it appends the second batch before the failed first one
//     and a key is reordered.
//   - fresh rows: the broker knows the producer; the batches behind the
//     failed one come back out of order and go again behind it. Five are in
//     flight: the fast path keeps its pipelining.
func TestIdempotentOldRecordsKeepOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		age  time.Duration // of the rows' record timestamps
	}{{"old rows", 2 * kafkaProducerExpiration}, {"fresh rows", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const warm, burst = 10, 10
			r := startIdem(t, true, 1, warm+burst, func(c *Config) {
				c.BatchMaxEvents, c.MaxInFlight = 2, 5
				c.FlushEvents, c.Linger, c.QuietGap = burst, time.Second, time.Second
				c.ProducerIdle = time.Hour // the relay's clock never calls the partition idle here
			})
			r.evs = stream(2, warm+burst)
			rowTime := time.Now().Add(-tc.age)
			for i, ev := range r.evs {
				ev.Timestamp = rowTime.Add(time.Duration(i) * time.Millisecond)
			}
			sendFrom(t, r.k, idemTopic, r.evs[:warm], nil, r.acks.ack)
			testenv.Eventually(t, 10*time.Second, func() error {
				if n := r.acks.count(); n < warm {
					return fmt.Errorf("%d of %d events acknowledged", n, warm)
				}
				return nil
			})
			ctx := t.Context()
			var last time.Time // an upper bound of the last batch's max timestamp
			for _, rec := range testenv.MustReadAll(t, r.kf, idemTopic) {
				if rec.Timestamp.After(last) {
					last = rec.Timestamp
				}
			}
			forgets := brokerExpires(last, time.Now(), kafkaProducerExpiration)
			if forgets != (tc.age > 0) {
				t.Fatalf("the broker's rule says forgotten: %v (records up to %v)", forgets, last)
			}
			if forgets {
				if err := r.kf.RecreateTopic(ctx, idemTopic, 1); err != nil {
					t.Fatal(err)
				}
				cl, err := kgo.NewClient(append(r.kf.ClientOpts(), kgo.SeedBrokers(r.kf.Brokers()...))...)
				if err != nil {
					t.Fatal(err)
				}
				err = cl.ProduceSync(ctx, &kgo.Record{Topic: idemTopic, Value: []byte(`{"key":"other"}`)}).FirstErr()
				cl.Close()
				if err != nil {
					t.Fatalf("write another producer's record: %v", err)
				}
			}
			var failed atomic.Bool
			onProduce(r.kf.Cluster(), func(_ int, req *kmsg.ProduceRequest) (kmsg.Response, error, bool) {
				if failed.CompareAndSwap(false, true) {
					return testenv.ProduceError(req, kerr.NotEnoughReplicas.Code), nil, true
				}
				return nil, nil, false
			})
			sendFrom(t, r.k, idemTopic, r.evs[warm:], nil, r.acks.ack)
			r.acks.wait(t, 10*time.Second)
			r.acks.checkExactlyOnce(t, r.evs)

			var got []string
			for _, rec := range testenv.MustReadAll(t, r.kf, idemTopic) {
				if id := rec.Headers[HeaderID]; id != "" {
					got = append(got, id)
				}
			}
			from := 0
			if forgets {
				from = warm // the recreated topic holds the burst only
			}
			want := make([]string, 0, warm+burst)
			for _, ev := range r.evs[from:] {
				want = append(want, string(ev.ID))
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("Kafka holds, in order:\n%v\nwant (commit order):\n%v", got, want)
			}
			if !failed.Load() {
				t.Error("no produce request failed: the fault did not happen")
			}
			peak := PeakInFlight(r.k)
			if forgets && peak != 1 {
				t.Errorf("%d batches in flight at once; want 1 while the records are older than ProducerIdle", peak)
			}
			if !forgets && peak != 5 {
				t.Errorf("%d batches in flight at once; want 5 (MaxInFlight) with fresh records", peak)
			}
		})
	}
}
