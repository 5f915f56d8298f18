package deadletter

import (
	"context"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// Publisher publishes replayed events; sink.Publisher is the relay's.
//
// Publish returns nil once Kafka acknowledged every event with acks=all. When
// some events failed for good and the others were acknowledged, it returns a
// *sink.PublishError naming the failed ones. Any other error (the context
// ended, the topic could not be opened) means no event may be assumed
// delivered. The
// topic travels beside the events, as every fact a stage learns about an
// event does (sink.Message), never in them: the relay renders it from a
// template, a dead letter stores it, a replay may override it. Replayed
// events carry no source position (no Origin): Kafka's copy is never taken
// for the stream's.
type Publisher interface {
	Publish(ctx context.Context, topic string, events []*outbox.Event) error
}

var _ Publisher = (*sink.Publisher)(nil)
