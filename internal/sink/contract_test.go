package sink_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/sink/sinktest"
)

var _ sinktest.Producer = (*sink.Kafka)(nil)

// TestContract runs the producer contract suite against the Kafka producer,
// plain and idempotent. The idempotent producer must have pipelined: in every
// Order case some broker had several requests in flight at once; the plain
// one never more than one.
//
// Not parallel: the suite looks at every goroutine and at the heap of the
// process.
func TestContract(t *testing.T) {
	for _, idempotent := range []bool{false, true} {
		name := "plain"
		if idempotent {
			name = "idempotent"
		}
		var (
			mu   sync.Mutex
			peak = map[string]int{} // case -> the most requests in flight to a broker
		)
		t.Run(name, func(t *testing.T) {
			sinktest.Run(t, func(t *testing.T, brokers, topics []string, opts sinktest.Options) sinktest.Producer {
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				k, err := sink.Open(ctx, sink.Config{
					Brokers: brokers, Topics: topics, Idempotent: idempotent,
					BatchMaxEvents: opts.BatchMaxEvents, Retry: opts.Retry, RequestTimeout: opts.RequestTimeout,
					MaxInFlight: opts.MaxInFlight, Logger: zerolog.Nop(),
				})
				if err != nil {
					t.Fatalf("open producer: %v", err)
				}
				if k.Idempotent() != idempotent {
					t.Fatalf("Idempotent() = %v, want %v", k.Idempotent(), idempotent)
				}
				t.Cleanup(func() {
					mu.Lock()
					defer mu.Unlock()
					peak[t.Name()] = max(peak[t.Name()], sink.PeakInFlight(k))
				})
				return k
			})
		})
		mu.Lock()
		for c, n := range peak {
			if !strings.Contains(c, "/Order/") {
				continue
			}
			t.Logf("%s: up to %d requests in flight to a broker", c, n)
			if idempotent && n < 2 {
				t.Errorf("%s: at most %d request in flight to a broker; the idempotent producer should pipeline up to 5", c, n)
			}
			if !idempotent && n != 1 {
				t.Errorf("%s: %d requests in flight to a broker at once; without idempotence one at a time keeps order", c, n)
			}
		}
		mu.Unlock()
	}
}
