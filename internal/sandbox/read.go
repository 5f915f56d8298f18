package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// metadataRetryBackoff is how long ReadAll waits before asking again while a
// partition has no leader yet or a request failed transiently.
const metadataRetryBackoff = 100 * time.Millisecond

// Record is one Kafka record as read back by kgo.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte // nil for a null key
	Value     []byte // nil for a null value
	// Headers maps each header key to its value; for a key that appears
	// more than once the last value wins. nil when there are none.
	Headers   map[string]string
	Timestamp time.Time
}

// ReadAll reads every record of topics from the start of each partition up
// to its end offset as of the call, then returns them ordered by topic,
// partition and offset. Topics that do not exist count as empty and are not
// created; no topics means no records. Records of aborted transactions are
// included; transaction markers are not. Pass a ctx with a deadline: if the
// brokers go away, ReadAll waits for them until ctx is done.
func ReadAll(ctx context.Context, brokers []string, topics ...string) ([]Record, error) {
	return readAll(ctx, endpoint{brokers: brokers}, topics)
}

// ReadAll is the package's ReadAll on k's brokers, over TLS and SASL when k
// was started with them.
func (k *Kafka) ReadAll(ctx context.Context, topics ...string) ([]Record, error) {
	return readAll(ctx, k.endpoint(), topics)
}

func readAll(ctx context.Context, ep endpoint, topics []string) ([]Record, error) {
	if len(topics) == 0 {
		return nil, nil // a metadata request without topics asks for all
	}
	ranges, err := offsetRanges(ctx, ep, topics)
	if err != nil {
		return nil, err
	}
	start := make(map[string]map[int32]kgo.Offset)
	remaining := 0
	for tp, r := range ranges {
		if r.start >= r.end {
			continue
		}
		if start[tp.topic] == nil {
			start[tp.topic] = make(map[int32]kgo.Offset)
		}
		start[tp.topic][tp.partition] = kgo.NewOffset().At(r.start)
		remaining++
	}
	if remaining == 0 {
		return nil, nil
	}
	cl, err := ep.client(
		kgo.ConsumePartitions(start),
		// Control records take offsets too; we need to see them to know
		// when a partition whose last offset is a marker is done.
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(250*time.Millisecond),
	)
	if err != nil {
		return nil, err
	}
	defer cl.Close()

	var out []Record
	var transient error
	for remaining > 0 {
		fetches := cl.PollFetches(ctx)
		fetches.EachRecord(func(r *kgo.Record) {
			tp := topicPartition{r.Topic, r.Partition}
			rg, ok := ranges[tp]
			if !ok || rg.done || r.Offset >= rg.end {
				return // produced after we listed the end offsets
			}
			if !r.Attrs.IsControl() {
				out = append(out, toRecord(r))
			}
			if r.Offset >= rg.end-1 {
				rg.done = true
				ranges[tp] = rg
				remaining--
			}
		})
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read topics %v: %w (last fetch error: %v)", topics, ctx.Err(), transient)
		}
		fatal, last := fetchErrors(fetches)
		if fatal != nil {
			return nil, fmt.Errorf("read topics %v: %w", topics, fatal)
		}
		if last != nil {
			transient = last
		}
	}
	sortRecords(out)
	return out, nil
}

// WaitForRecords consumes topics from the start until it has at least n
// records, and returns them ordered by topic, partition and offset. Topics
// that do not exist yet are waited for, not created. If ctx ends first it
// returns the records it got and an error wrapping ctx.Err().
func WaitForRecords(ctx context.Context, brokers []string, n int, topics ...string) ([]Record, error) {
	return waitForRecords(ctx, endpoint{brokers: brokers}, n, topics)
}

// WaitForRecords is the package's WaitForRecords on k's brokers, over TLS
// and SASL when k was started with them.
func (k *Kafka) WaitForRecords(ctx context.Context, n int, topics ...string) ([]Record, error) {
	return waitForRecords(ctx, k.endpoint(), n, topics)
}

func waitForRecords(ctx context.Context, ep endpoint, n int, topics []string) ([]Record, error) {
	cl, err := ep.client(
		kgo.ConsumeTopics(topics...),
		// Notice topics that appear while we wait.
		kgo.MetadataMinAge(100*time.Millisecond),
		kgo.MetadataMaxAge(time.Second),
		kgo.FetchMaxWait(250*time.Millisecond),
	)
	if err != nil {
		return nil, err
	}
	defer cl.Close()

	var out []Record
	var transient error
	for len(out) < n {
		fetches := cl.PollFetches(ctx)
		fetches.EachRecord(func(r *kgo.Record) { out = append(out, toRecord(r)) })
		if len(out) >= n {
			break
		}
		if ctx.Err() != nil {
			sortRecords(out)
			return out, fmt.Errorf("wait for %d records on %v: got %d: %w (last fetch error: %v)", n, topics, len(out), ctx.Err(), transient)
		}
		fatal, last := fetchErrors(fetches)
		if fatal != nil {
			sortRecords(out)
			return out, fmt.Errorf("wait for %d records on %v: got %d: %w", n, topics, len(out), fatal)
		}
		if last != nil {
			transient = last
		}
	}
	sortRecords(out)
	return out, nil
}

// Tail consumes every topic matching the regular expression topicRegex from
// the start, including topics created later, and calls fn for each record in
// offset order per partition, until ctx is done. It returns nil when ctx is
// done and an error if consuming fails for good. fn runs on Tail's goroutine.
func Tail(ctx context.Context, brokers []string, topicRegex string, fn func(Record)) error {
	return tail(ctx, endpoint{brokers: brokers}, topicRegex, fn)
}

// Tail is the package's Tail on k's brokers, over TLS and SASL when k was
// started with them.
func (k *Kafka) Tail(ctx context.Context, topicRegex string, fn func(Record)) error {
	return tail(ctx, k.endpoint(), topicRegex, fn)
}

func tail(ctx context.Context, ep endpoint, topicRegex string, fn func(Record)) error {
	if _, err := regexp.Compile(topicRegex); err != nil {
		return fmt.Errorf("compile topic regex: %w", err)
	}
	cl, err := ep.client(
		kgo.ConsumeTopics(topicRegex),
		kgo.ConsumeRegex(),
		kgo.MetadataMinAge(100*time.Millisecond),
		kgo.MetadataMaxAge(time.Second),
		// Partitions of a new topic join the next fetch; do not let the
		// one in flight wait the default 5s for data on the old ones.
		kgo.FetchMaxWait(250*time.Millisecond),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		fetches := cl.PollFetches(ctx)
		fetches.EachRecord(func(r *kgo.Record) { fn(toRecord(r)) })
		if ctx.Err() != nil {
			return nil
		}
		if fatal, _ := fetchErrors(fetches); fatal != nil {
			return fmt.Errorf("tail topics %q: %w", topicRegex, fatal)
		}
	}
}

// CreateTopic creates topic with the given number of partitions (<= 0: the
// broker's default) and the broker's default replication factor. If the topic
// exists, the error wraps kerr.TopicAlreadyExists.
func CreateTopic(ctx context.Context, brokers []string, topic string, partitions int) error {
	return createTopic(ctx, endpoint{brokers: brokers}, topic, partitions)
}

// CreateTopic is the package's CreateTopic on k's brokers, over TLS and SASL
// when k was started with them.
func (k *Kafka) CreateTopic(ctx context.Context, topic string, partitions int) error {
	return createTopic(ctx, k.endpoint(), topic, partitions)
}

func createTopic(ctx context.Context, ep endpoint, topic string, partitions int) error {
	cl, err := ep.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	if deadline, ok := ctx.Deadline(); ok {
		req.TimeoutMillis = int32(max(time.Until(deadline).Milliseconds(), 1))
	}
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic = topic
	rt.NumPartitions = int32(partitions)
	if partitions <= 0 {
		rt.NumPartitions = -1
	}
	rt.ReplicationFactor = -1
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	if len(resp.Topics) != 1 {
		return fmt.Errorf("create topic %s: got %d topics in response", topic, len(resp.Topics))
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	return nil
}

// topicPartition names one partition.
type topicPartition struct {
	topic     string
	partition int32
}

// offsetRange is the offsets ReadAll reads from a partition: [start, end).
type offsetRange struct {
	start, end int64
	done       bool
}

// offsetRanges returns the log start and end offsets of every partition of
// topics, skipping topics that do not exist. It retries while partitions have
// no leader, as right after a topic was created.
func offsetRanges(ctx context.Context, ep endpoint, topics []string) (map[topicPartition]offsetRange, error) {
	cl, err := ep.client()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	for {
		ranges, err := listOffsetRanges(ctx, cl, topics)
		if err == nil {
			return ranges, nil
		}
		if !kerr.IsRetriable(err) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-time.After(metadataRetryBackoff):
		}
	}
}

// listOffsetRanges is one attempt of offsetRanges.
func listOffsetRanges(ctx context.Context, cl *kgo.Client, topics []string) (map[topicPartition]offsetRange, error) {
	mreq := kmsg.NewPtrMetadataRequest()
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		mreq.Topics = append(mreq.Topics, rt)
	}
	mreq.AllowAutoTopicCreation = false
	mresp, err := mreq.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("request metadata: %w", err)
	}
	parts := make(map[string][]int32)
	for _, t := range mresp.Topics {
		var name string
		if t.Topic != nil {
			name = *t.Topic
		}
		err := kerr.ErrorForCode(t.ErrorCode)
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			continue // does not exist yet: empty
		}
		if err != nil {
			return nil, fmt.Errorf("load metadata of topic %s: %w", name, err)
		}
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("load metadata of %s/%d: %w", name, p.Partition, err)
			}
			parts[name] = append(parts[name], p.Partition)
		}
	}
	if len(parts) == 0 {
		return nil, nil
	}
	starts, err := listOffsets(ctx, cl, parts, -2) // earliest
	if err != nil {
		return nil, err
	}
	ends, err := listOffsets(ctx, cl, parts, -1) // latest
	if err != nil {
		return nil, err
	}
	ranges := make(map[topicPartition]offsetRange, len(ends))
	for tp, end := range ends {
		ranges[tp] = offsetRange{start: starts[tp], end: end}
	}
	return ranges, nil
}

// listOffsets returns the offset at timestamp (-2 earliest, -1 latest) of
// every partition in parts.
func listOffsets(ctx context.Context, cl *kgo.Client, parts map[string][]int32, timestamp int64) (map[topicPartition]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	for topic, ps := range parts {
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		for _, p := range ps {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition = p
			rp.Timestamp = timestamp
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("list offsets: %w", err)
	}
	offsets := make(map[topicPartition]int64)
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("list offsets of %s/%d: %w", t.Topic, p.Partition, err)
			}
			offsets[topicPartition{t.Topic, p.Partition}] = p.Offset
		}
	}
	return offsets, nil
}

// fetchErrors sorts the errors in fetches into the first fatal one and the
// last transient one, which the client retries by itself. Context errors are
// left to the caller, which checks its ctx.
func fetchErrors(fetches kgo.Fetches) (fatal, transient error) {
	for _, fe := range fetches.Errors() {
		err := fmt.Errorf("fetch %s/%d: %w", fe.Topic, fe.Partition, fe.Err)
		var dataLoss *kgo.ErrDataLoss
		var kafkaErr *kerr.Error
		switch {
		case errors.Is(fe.Err, context.Canceled), errors.Is(fe.Err, context.DeadlineExceeded):
		case errors.Is(fe.Err, kgo.ErrClientClosed):
			if fatal == nil {
				fatal = err
			}
		case errors.As(fe.Err, &kafkaErr) && !kafkaErr.Retriable:
			if fatal == nil {
				fatal = err
			}
		case errors.As(fe.Err, &dataLoss):
			transient = err // informational: the client resumed
		default:
			transient = err // retriable Kafka error or network trouble
		}
	}
	return fatal, transient
}

// toRecord converts a kgo record.
func toRecord(r *kgo.Record) Record {
	var headers map[string]string
	if len(r.Headers) > 0 {
		headers = make(map[string]string, len(r.Headers))
		for _, h := range r.Headers {
			headers[h.Key] = string(h.Value)
		}
	}
	return Record{
		Topic:     r.Topic,
		Partition: r.Partition,
		Offset:    r.Offset,
		Key:       r.Key,
		Value:     r.Value,
		Headers:   headers,
		Timestamp: r.Timestamp,
	}
}

// sortRecords orders records by topic, partition and offset.
func sortRecords(records []Record) {
	slices.SortFunc(records, func(a, b Record) int {
		return cmp.Or(
			cmp.Compare(a.Topic, b.Topic),
			cmp.Compare(a.Partition, b.Partition),
			cmp.Compare(a.Offset, b.Offset),
		)
	})
}

// endpoint is how the helpers reach Kafka: the seed brokers, and the TLS and
// SASL options of a secured broker.
type endpoint struct {
	brokers []string
	opts    []kgo.Opt
}

// client returns a kgo client for ep with opts.
func (ep endpoint) client(opts ...kgo.Opt) (*kgo.Client, error) {
	if len(ep.brokers) == 0 {
		return nil, errors.New("create kafka client: no brokers")
	}
	all := append([]kgo.Opt{kgo.SeedBrokers(ep.brokers...)}, ep.opts...)
	cl, err := kgo.NewClient(append(all, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	return cl, nil
}

// IDs returns the "id" headers (the event ids) of recs, sorted.
func IDs(recs []Record) []string {
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.Headers["id"]
	}
	slices.Sort(ids)
	return ids
}
