package sink

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// BenchmarkSinkThroughput sends b.N events of about 300 bytes over 1,000 keys
// into a 4-partition kfake topic and waits until Kafka acknowledged all of them.
func BenchmarkSinkThroughput(b *testing.B) { benchThroughput(b, false) }

// BenchmarkSinkThroughputIdempotent is BenchmarkSinkThroughput with an
// idempotent producer.
func BenchmarkSinkThroughputIdempotent(b *testing.B) { benchThroughput(b, true) }

func benchThroughput(b *testing.B, idempotent bool) {
	const topic = "outbox.bench"
	kafka := testenv.NewKafka(b, testenv.KafkaOptions{Partitions: 4, Topics: []string{topic}})
	evs := make([]*outbox.Event, b.N)
	next := make(map[string]int)
	size := 0
	for i := range evs {
		key := fmt.Sprintf("agg-%04d", i%1000)
		evs[i] = paddedEvent(key, next[key], uint64(i), 230)
		next[key]++
		size += evs[i].Size() - 64
	}
	acks := newAckLog(b.N)
	m := metrics.New(prometheus.NewRegistry())
	k := openSink(b, Config{Brokers: kafka.Brokers(), Topics: []string{topic}, Retry: fastRetry, Idempotent: idempotent, Logger: zerolog.Nop(), Metrics: m})
	b.SetBytes(int64(size / max(b.N, 1)))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	sendAll(b, k, topic, evs, acks.ack)
	acks.wait(b, 5*time.Minute)
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(b.N)/max(testutil.ToFloat64(m.ProduceBatches), 1), "events/batch")
}
