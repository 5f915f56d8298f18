package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/segmentio/kafka-go"
)

func TestClassifyAndCode(t *testing.T) {
	opErr := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	tests := []struct {
		name      string
		err       error
		wantClass Class
		wantCode  string
	}{
		// Permanent: the event itself is the problem.
		{"message too large", kafka.MessageSizeTooLarge, Permanent, "message_too_large"},
		{"record list too large", kafka.RecordListTooLarge, Permanent, "message_too_large"},
		{"invalid message size", kafka.InvalidMessageSize, Permanent, "message_too_large"},
		{"invalid topic", kafka.InvalidTopic, Permanent, "invalid_topic"},
		{"invalid record", kafka.InvalidRecord, Permanent, "invalid_record"},
		{"invalid timestamp", kafka.InvalidTimestamp, Permanent, fmt.Sprintf("kafka_%d", int(kafka.InvalidTimestamp))},
		{"event error", &outbox.EventError{Code: "empty_key", Err: errors.New("no key")}, Permanent, "empty_key"},
		{"wrapped event error", fmt.Errorf("send: %w", &outbox.EventError{Code: "invalid_topic", Err: errors.New("bad")}), Permanent, "invalid_topic"},

		// Transient: retry forever.
		{"not leader", kafka.NotLeaderForPartition, Transient, "kafka_6"},
		{"request timed out", kafka.RequestTimedOut, Transient, "kafka_7"},
		{"leader not available", kafka.LeaderNotAvailable, Transient, "kafka_5"},
		{"not enough replicas", kafka.NotEnoughReplicas, Transient, "kafka_19"},
		{"unknown topic or partition", kafka.UnknownTopicOrPartition, Transient, "unknown_topic_or_partition"},
		{"deadline exceeded", context.DeadlineExceeded, Transient, "timeout"},
		{"wrapped deadline exceeded", fmt.Errorf("produce 3 events to t/0: %w", context.DeadlineExceeded), Transient, "timeout"},
		{"connection refused", opErr, Transient, "unknown"},
		{"wrapped net error", fmt.Errorf("produce: %w", opErr), Transient, "unknown"},
		{"unexpected EOF", io.ErrUnexpectedEOF, Transient, "unknown"},
		{"unknown error", errors.New("something nobody expected"), Transient, "unknown"},

		// Configuration: an operator must act; retried like transient ones.
		{"topic authorization", kafka.TopicAuthorizationFailed, Configuration, "topic_authorization_failed"},
		{"cluster authorization", kafka.ClusterAuthorizationFailed, Configuration, "kafka_31"},
		{"SASL failed", kafka.SASLAuthenticationFailed, Configuration, "kafka_58"},
		{"unsupported version", kafka.UnsupportedVersion, Configuration, "kafka_35"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.err); got != tt.wantClass {
				t.Errorf("Classify(%v) = %v, want %v", tt.err, got, tt.wantClass)
			}
			if got := Code(tt.err); got != tt.wantCode {
				t.Errorf("Code(%v) = %q, want %q", tt.err, got, tt.wantCode)
			}
			// Every layer wraps once with %w; the meaning must survive it.
			wrapped := fmt.Errorf("deliver: %w", fmt.Errorf("produce 10 events to outbox/3: %w", tt.err))
			if got := Classify(wrapped); got != tt.wantClass {
				t.Errorf("Classify(wrapped %v) = %v, want %v", tt.err, got, tt.wantClass)
			}
			if got := Code(wrapped); got != tt.wantCode {
				t.Errorf("Code(wrapped %v) = %q, want %q", tt.err, got, tt.wantCode)
			}
		})
	}
}

// TestClassifyKafkaGoProduceErrors checks errors in the exact shape the sink sees
// them: kafka-go's makeError wraps the code with the broker's message, and the
// partition adds its own context.
func TestClassifyKafkaGoProduceErrors(t *testing.T) {
	tooLarge := fmt.Errorf("produce 11 events to t/0: %w", fmt.Errorf("%w: %s", kafka.MessageSizeTooLarge, "The message is too large."))
	if Classify(tooLarge) != Permanent || Code(tooLarge) != "message_too_large" {
		t.Errorf("too large: %v/%q", Classify(tooLarge), Code(tooLarge))
	}
	notLeader := fmt.Errorf("produce 11 events to t/0: %w", fmt.Errorf("%w: %s", kafka.NotLeaderForPartition, "Not leader for partition."))
	if Classify(notLeader) != Transient {
		t.Errorf("not leader: %v", Classify(notLeader))
	}
	// The sink wraps a per-event permanent failure in an outbox.EventError carrying Code.
	ee := &outbox.EventError{Code: Code(tooLarge), Err: tooLarge}
	if Code(ee) != "message_too_large" || Classify(ee) != Permanent || !errors.Is(ee, kafka.MessageSizeTooLarge) {
		t.Errorf("outbox.EventError around too large: %v/%q, Is=%v", Classify(ee), Code(ee), errors.Is(ee, kafka.MessageSizeTooLarge))
	}
	if got, want := ee.Error(), "message_too_large: "+tooLarge.Error(); got != want {
		t.Errorf("outbox.EventError.Error() = %q, want %q", got, want)
	}
}

func TestClassString(t *testing.T) {
	for c, want := range map[Class]string{Transient: "transient", Permanent: "permanent", Configuration: "configuration", Class(42): "transient"} {
		if got := c.String(); got != want {
			t.Errorf("Class(%d).String() = %q, want %q", int(c), got, want)
		}
	}
}
