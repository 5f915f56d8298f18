package sink

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
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
	kafka := testenv.NewKafka(b, sandbox.KafkaOptions{Partitions: 4, Topics: []string{topic}})
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

// BenchmarkSinkPaced produces b.N events of about 300 bytes at 30,000 a
// second (30 every millisecond, as the stream delivers them) into 8 or 256
// partitions, and reports the process's CPU per event: the sink's and the
// in-process broker's, which persists its log or keeps it in memory. Run it
// with a fixed count, e.g. -benchtime 100000x.
func BenchmarkSinkPaced(b *testing.B) {
	for _, parts := range []int{8, 256} {
		for _, mem := range []bool{false, true} {
			b.Run(fmt.Sprintf("partitions=%d/broker-in-memory=%v", parts, mem), func(b *testing.B) { benchPaced(b, parts, mem) })
		}
	}
}

func benchPaced(b *testing.B, parts int, inMemory bool) {
	const topic, perTick = "outbox.paced", 30
	kafka := testenv.NewKafka(b, sandbox.KafkaOptions{Partitions: parts, Topics: []string{topic}, InMemory: inMemory})
	evs := make([]*outbox.Event, b.N)
	next := make(map[string]int)
	for i := range evs {
		key := fmt.Sprintf("agg-%04d", i%10000)
		evs[i] = paddedEvent(key, next[key], uint64(i), 230)
		next[key]++
	}
	acks := newAckLog(b.N)
	m := metrics.New(prometheus.NewRegistry())
	k := openSink(b, Config{Brokers: kafka.Brokers(), Topics: []string{topic}, Retry: fastRetry, Idempotent: true, Logger: zerolog.Nop(), Metrics: m})
	before := cpuTime(b)
	b.ResetTimer()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for i := 0; i < len(evs); i += perTick {
		<-tick.C
		sendAll(b, k, topic, evs[i:min(i+perTick, len(evs))], acks.ack)
	}
	acks.wait(b, 5*time.Minute)
	b.StopTimer()
	b.ReportMetric(float64((cpuTime(b)-before).Microseconds())/float64(max(b.N, 1)), "cpu-µs/event")
	b.ReportMetric(float64(b.N)/max(testutil.ToFloat64(m.ProduceBatches), 1), "events/batch")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
