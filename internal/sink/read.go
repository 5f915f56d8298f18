package sink

// Reading back: what the partitions hold, for a relay that must find out
// which events a previous run already delivered.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/segmentio/kafka-go"
)

// PartitionCount returns the number of partitions the producer maps keys of
// topic onto, waiting (within ctx) until they are known.
func (k *Kafka) PartitionCount(ctx context.Context, topic string) (int, error) {
	if err := k.WaitTopic(ctx, topic); err != nil {
		return 0, err
	}
	ts := k.topic(topic)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.parts), nil
}

// Range is the offsets a partition holds: [Start, End), End being the high
// watermark (the offset the next record will get).
type Range struct{ Start, End int64 }

// Ranges returns the Range of each of the first n partitions of topic.
func (k *Kafka) Ranges(ctx context.Context, topic string, n int) ([]Range, error) {
	reqs := make([]kafka.OffsetRequest, 0, 2*n)
	for p := 0; p < n; p++ {
		reqs = append(reqs, kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	c := &kafka.Client{Addr: k.addr, Transport: k.transport, Timeout: k.cfg.RequestTimeout}
	res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("list offsets of topic %q: %w", topic, err)
	}
	out := make([]Range, n)
	seen := make([]bool, n)
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("list offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		if po.Partition < 0 || po.Partition >= n {
			continue
		}
		out[po.Partition] = Range{Start: po.FirstOffset, End: po.LastOffset}
		seen[po.Partition] = true
	}
	for p, ok := range seen {
		if !ok {
			return nil, fmt.Errorf("list offsets of %s/%d: no answer for the partition", topic, p)
		}
	}
	return out, nil
}

// Scan reads the records of one partition with offsets in [from, to) and
// calls fn with each record's offset and its id and source position headers
// (nil when absent). Records removed meanwhile (retention, compaction) are
// simply not reported. A non-nil error from fn ends the scan with it.
func (k *Kafka) Scan(ctx context.Context, topic string, partition int, from, to int64, fn func(offset int64, id, source []byte) error) error {
	c := &kafka.Client{Addr: k.addr, Transport: k.transport, Timeout: k.cfg.RequestTimeout}
	for off := from; off < to; {
		res, err := c.Fetch(ctx, &kafka.FetchRequest{
			Topic: topic, Partition: partition, Offset: off,
			MinBytes: 1, MaxBytes: 8 << 20, MaxWait: 100 * time.Millisecond,
		})
		if err != nil {
			return fmt.Errorf("read %s/%d from offset %d: %w", topic, partition, off, err)
		}
		if res.Error != nil {
			return fmt.Errorf("read %s/%d from offset %d: %w", topic, partition, off, res.Error)
		}
		next, err := scanRecords(res.Records, off, to, fn)
		if err != nil {
			return fmt.Errorf("read %s/%d from offset %d: %w", topic, partition, off, err)
		}
		if next == off {
			// Nothing at off: the records there are gone (compacted, or the
			// log moved on); go on from what the broker says is there.
			if res.HighWatermark <= off {
				return nil
			}
			if res.LogStartOffset > off {
				next = res.LogStartOffset
			} else {
				next = off + 1
			}
		}
		off = next
	}
	return nil
}

// scanRecords reports the records of rr in [from, to) to fn and returns the
// offset after the last record read.
func scanRecords(rr kafka.RecordReader, from, to int64, fn func(offset int64, id, source []byte) error) (int64, error) {
	if rr == nil {
		return from, nil
	}
	next := from
	for {
		r, err := rr.ReadRecord()
		if errors.Is(err, io.EOF) {
			return next, nil
		}
		if err != nil {
			return next, err
		}
		if r.Key != nil {
			r.Key.Close()
		}
		if r.Value != nil {
			r.Value.Close()
		}
		if r.Offset < from {
			continue
		}
		if r.Offset >= to {
			return next, nil
		}
		var id, src []byte
		for _, h := range r.Headers {
			switch h.Key {
			case HeaderID:
				id = h.Value
			case HeaderSource:
				src = h.Value
			}
		}
		if err := fn(r.Offset, id, src); err != nil {
			return next, err
		}
		next = r.Offset + 1
	}
}
