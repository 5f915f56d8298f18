package sink_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/sink/sinktest"
)

var _ sinktest.Producer = (*sink.Kafka)(nil)

// TestContract runs the producer contract suite against the Kafka producer,
// plain and idempotent.
//
// Not parallel: the suite looks at every goroutine and at the heap of the
// process.
func TestContract(t *testing.T) {
	for _, idempotent := range []bool{false, true} {
		name := "plain"
		if idempotent {
			name = "idempotent"
		}
		t.Run(name, func(t *testing.T) {
			sinktest.Run(t, func(t *testing.T, brokers, topics []string, opts sinktest.Options) sinktest.Producer {
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				k, err := sink.Open(ctx, sink.Config{
					Brokers: brokers, Topics: topics, Idempotent: idempotent,
					BatchMaxEvents: opts.BatchMaxEvents, Retry: opts.Retry, RequestTimeout: opts.RequestTimeout,
					Logger: zerolog.Nop(),
				})
				if err != nil {
					t.Fatalf("open producer: %v", err)
				}
				if k.Idempotent() != idempotent {
					t.Fatalf("Idempotent() = %v, want %v", k.Idempotent(), idempotent)
				}
				return k
			})
		})
	}
}
