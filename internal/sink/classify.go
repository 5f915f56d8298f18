package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/segmentio/kafka-go"
)

// Class says how the relay must treat a failure.
type Class int

const (
	// Transient failures go away by themselves (broker restarting, leader moving,
	// timeouts, connections dropped): retry forever with backoff, confirm nothing.
	Transient Class = iota
	// Permanent failures belong to one event and will fail the same way on every
	// retry (too large, invalid topic, missing key): apply the failure policy.
	Permanent
	// Configuration failures need an operator (authorization, SASL, unsupported
	// settings). At runtime they are retried like transient ones, so a fixed ACL
	// resumes delivery in order, but they are logged as errors.
	Configuration
)

// String names the class for logs and metric labels.
func (c Class) String() string {
	switch c {
	case Permanent:
		return "permanent"
	case Configuration:
		return "configuration"
	default:
		return "transient"
	}
}

// Classify returns the class of err. Errors it does not know are Transient: the
// safe choice for an at-least-once relay is to keep retrying (and say so) rather
// than to drop or dead-letter an event for a reason nobody understood.
func Classify(err error) Class {
	var ee *outbox.EventError
	if errors.As(err, &ee) {
		return Permanent
	}
	var ke kafka.Error
	if errors.As(err, &ke) {
		switch ke {
		case kafka.MessageSizeTooLarge, kafka.RecordListTooLarge, kafka.InvalidRecord,
			kafka.InvalidTopic, kafka.InvalidMessageSize, kafka.InvalidTimestamp,
			kafka.UnsupportedForMessageFormat:
			return Permanent
		case kafka.TopicAuthorizationFailed, kafka.ClusterAuthorizationFailed,
			kafka.SASLAuthenticationFailed, kafka.UnsupportedSASLMechanism,
			kafka.IllegalSASLState, kafka.InvalidRequiredAcks, kafka.UnsupportedVersion,
			kafka.UnsupportedCompressionType, kafka.PolicyViolation,
			kafka.TransactionalIDAuthorizationFailed, kafka.SecurityDisabled:
			return Configuration
		case kafka.OutOfOrderSequenceNumber, kafka.UnknownProducerId, kafka.InvalidProducerEpoch,
			kafka.InvalidProducerIDMapping, kafka.ProducerFenced, kafka.DuplicateSequenceNumber:
			// The producer session or its sequence, not the event: a new
			// session (see sessionError) delivers it, so it is never
			// dead-lettered.
			return Transient
		}
		return Transient
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return Transient
	}
	return Transient
}

// Code returns a short stable code for err, used as a metric label and stored
// with dead letters.
func Code(err error) string {
	var ee *outbox.EventError
	if errors.As(err, &ee) {
		return ee.Code
	}
	var ke kafka.Error
	if errors.As(err, &ke) {
		switch ke {
		case kafka.MessageSizeTooLarge, kafka.RecordListTooLarge, kafka.InvalidMessageSize:
			return "message_too_large"
		case kafka.InvalidTopic:
			return "invalid_topic"
		case kafka.InvalidRecord:
			return "invalid_record"
		case kafka.TopicAuthorizationFailed:
			return "topic_authorization_failed"
		case kafka.UnknownTopicOrPartition:
			return "unknown_topic_or_partition"
		}
		return fmt.Sprintf("kafka_%d", int(ke))
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "unknown"
}
