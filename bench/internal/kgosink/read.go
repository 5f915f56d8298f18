package kgosink

// Reading back what the partitions hold (dedup.Reader), for the relay's
// start-up reconciliation, through the producer's client.

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// topicMeta is what a metadata request says of a topic.
type topicMeta struct {
	id      [16]byte
	leaders []int32 // by partition
}

// meta waits, within ctx, until topic's partitions are known, asking the
// broker to create a missing topic. A topic the broker refuses
// (INVALID_TOPIC_EXCEPTION, TOPIC_AUTHORIZATION_FAILED) is an error at once.
func (k *Kafka) meta(ctx context.Context, topic string) (topicMeta, error) {
	for attempt := 0; ; attempt++ {
		req := kmsg.NewPtrMetadataRequest()
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
		req.AllowAutoTopicCreation = true
		resp, err := req.RequestWith(ctx, k.cl)
		if err == nil {
			err = fmt.Errorf("the broker does not list topic %q", topic)
			for _, t := range resp.Topics {
				if t.Topic == nil || *t.Topic != topic {
					continue
				}
				err = kerr.ErrorForCode(t.ErrorCode)
				if err == nil && len(t.Partitions) == 0 {
					err = fmt.Errorf("topic %q has no partitions yet", topic)
				}
				if err == nil {
					tm := topicMeta{id: t.TopicID, leaders: make([]int32, len(t.Partitions))}
					for _, p := range t.Partitions {
						if p.Partition >= 0 && int(p.Partition) < len(tm.leaders) {
							tm.leaders[p.Partition] = p.Leader
						}
					}
					return tm, nil
				}
			}
		}
		if err == kerr.InvalidTopicException || err == kerr.TopicAuthorizationFailed {
			return topicMeta{}, fmt.Errorf("topic %q cannot be used: %w", topic, err)
		}
		if werr := backoff.SleepFor(ctx, min(backoff.Policy{Base: 50 * time.Millisecond, Cap: time.Second}.Ceiling(attempt), time.Second)); werr != nil {
			return topicMeta{}, fmt.Errorf("wait for topic %q: %w (last: %v)", topic, werr, err)
		}
	}
}

// PartitionCount returns the number of partitions keys of topic are mapped
// onto, waiting (within ctx) until they are known.
func (k *Kafka) PartitionCount(ctx context.Context, topic string) (int, error) {
	tm, err := k.meta(ctx, topic)
	return len(tm.leaders), err
}

// Ranges returns the offsets each of the first n partitions of topic holds:
// from its log start to its high watermark.
func (k *Kafka) Ranges(ctx context.Context, topic string, n int) ([]sink.Range, error) {
	out := make([]sink.Range, n)
	for _, ts := range []int64{-2, -1} { // earliest, latest
		req := kmsg.NewPtrListOffsetsRequest()
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		for p := range n {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition = int32(p)
			rp.Timestamp = ts
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, k.cl) // kgo sends each partition to its leader
		if err != nil {
			return nil, fmt.Errorf("list offsets of topic %q: %w", topic, err)
		}
		seen := make([]bool, n)
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					return nil, fmt.Errorf("list offsets of %s/%d: %w", topic, p.Partition, err)
				}
				if t.Topic != topic || p.Partition < 0 || int(p.Partition) >= n {
					continue
				}
				if ts == -2 {
					out[p.Partition].Start = p.Offset
				} else {
					out[p.Partition].End = p.Offset
				}
				seen[p.Partition] = true
			}
		}
		for p, ok := range seen {
			if !ok {
				return nil, fmt.Errorf("list offsets of %s/%d: no answer for the partition", topic, p)
			}
		}
	}
	return out, nil
}

// Scan reads the records of one partition with offsets in [from, to) from
// its leader and calls fn with each record's offset and its id and source
// position headers (nil when absent). Records removed meanwhile (retention,
// compaction) are simply not reported. A non-nil error from fn ends the
// scan with it.
func (k *Kafka) Scan(ctx context.Context, topic string, partition int, from, to int64, fn func(offset int64, id, source []byte) error) error {
	if from >= to {
		return nil
	}
	tm, err := k.meta(ctx, topic)
	if err != nil {
		return err
	}
	if partition < 0 || partition >= len(tm.leaders) {
		return fmt.Errorf("read %s/%d: the topic has %d partitions", topic, partition, len(tm.leaders))
	}
	leader := k.cl.Broker(int(tm.leaders[partition]))
	for off := from; off < to; {
		req := kmsg.NewPtrFetchRequest()
		req.MaxWaitMillis, req.MinBytes, req.MaxBytes = 100, 1, 8<<20
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = topic, tm.id
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = int32(partition), off, 8<<20
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, leader)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err != nil {
			return fmt.Errorf("read %s/%d from offset %d: %w", topic, partition, off, err)
		}
		var got *kmsg.FetchResponseTopicPartition
		for i := range resp.Topics {
			for j := range resp.Topics[i].Partitions {
				if resp.Topics[i].Partitions[j].Partition == int32(partition) {
					got = &resp.Topics[i].Partitions[j]
				}
			}
		}
		if got == nil {
			return fmt.Errorf("read %s/%d from offset %d: no answer for the partition", topic, partition, off)
		}
		fp, _ := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Offset: off, Topic: topic, Partition: int32(partition)}, got, kgo.DefaultDecompressor(), nil)
		if fp.Err != nil {
			return fmt.Errorf("read %s/%d from offset %d: %w", topic, partition, off, fp.Err)
		}
		next := off
		for _, r := range fp.Records {
			if r.Offset < off {
				continue
			}
			if r.Offset >= to {
				return nil
			}
			var id, src []byte
			for _, h := range r.Headers {
				switch h.Key {
				case sink.HeaderID:
					id = h.Value
				case sink.HeaderSource:
					src = h.Value
				}
			}
			if err := fn(r.Offset, id, src); err != nil {
				return fmt.Errorf("read %s/%d from offset %d: %w", topic, partition, off, err)
			}
			next = r.Offset + 1
		}
		if next == off {
			// Nothing at off: the records there are gone (compacted, or
			// the log moved on); go on from what the broker says is there.
			if fp.HighWatermark <= off {
				return nil
			}
			if fp.LogStartOffset > off {
				next = fp.LogStartOffset
			} else {
				next = off + 1
			}
		}
		off = next
	}
	return nil
}
