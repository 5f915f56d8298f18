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

// TestContract runs the producer contract suite against the Kafka producer.
//
// Not parallel: the suite looks at every goroutine and at the heap of the
// process.
func TestContract(t *testing.T) {
	sinktest.Run(t, func(t *testing.T, brokers, topics []string, opts sinktest.Options) sinktest.Producer {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		k, err := sink.Open(ctx, sink.Config{
			Brokers: brokers, Topics: topics,
			BatchMaxEvents: opts.BatchMaxEvents, Retry: opts.Retry, RequestTimeout: opts.RequestTimeout,
			Logger: zerolog.Nop(),
		})
		if err != nil {
			t.Fatalf("open producer: %v", err)
		}
		return k
	})
}
