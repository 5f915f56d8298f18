package sandbox

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// AddPartitions adds n partitions to topic.
func (k *Kafka) AddPartitions(ctx context.Context, topic string, n int) error {
	cl, err := k.endpoint().client()
	if err != nil {
		return err
	}
	defer cl.Close()
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	mresp, err := meta.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("add partitions to %s: read metadata: %w", topic, err)
	}
	if len(mresp.Topics) != 1 {
		return fmt.Errorf("add partitions to %s: got %d topics in metadata", topic, len(mresp.Topics))
	}
	if err := kerr.ErrorForCode(mresp.Topics[0].ErrorCode); err != nil {
		return fmt.Errorf("add partitions to %s: %w", topic, err)
	}
	req := kmsg.NewPtrCreatePartitionsRequest()
	rt := kmsg.NewCreatePartitionsRequestTopic()
	rt.Topic = topic
	rt.Count = int32(len(mresp.Topics[0].Partitions) + n)
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 10000
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("add partitions to %s: %w", topic, err)
	}
	if len(resp.Topics) != 1 {
		return fmt.Errorf("add partitions to %s: got %d topics in response", topic, len(resp.Topics))
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil {
		return fmt.Errorf("add partitions to %s: %w", topic, err)
	}
	return nil
}

// RecreateTopic deletes topic and creates it again, empty, with the given
// number of partitions.
func (k *Kafka) RecreateTopic(ctx context.Context, topic string, partitions int) error {
	cl, err := k.endpoint().client()
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrDeleteTopicsRequest()
	dt := kmsg.NewDeleteTopicsRequestTopic()
	dt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, dt)
	req.TopicNames = append(req.TopicNames, topic)
	req.TimeoutMillis = 10000
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("delete topic %s: %w", topic, err)
	}
	if len(resp.Topics) != 1 {
		return fmt.Errorf("delete topic %s: got %d topics in response", topic, len(resp.Topics))
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil {
		return fmt.Errorf("delete topic %s: %w", topic, err)
	}
	return k.CreateTopic(ctx, topic, partitions)
}

// SetTopicConfig sets one config of topic, e.g. max.message.bytes, with an
// IncrementalAlterConfigs request.
func (k *Kafka) SetTopicConfig(ctx context.Context, topic, key, value string) error {
	cl, err := k.endpoint().client()
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	r := kmsg.NewIncrementalAlterConfigsRequestResource()
	r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value = key, &value
	r.Configs = append(r.Configs, c)
	req.Resources = append(req.Resources, r)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("set %s=%s on topic %s: %w", key, value, topic, err)
	}
	for _, res := range resp.Resources {
		if err := kerr.ErrorForCode(res.ErrorCode); err != nil {
			return fmt.Errorf("set %s=%s on topic %s: %w", key, value, topic, err)
		}
	}
	return nil
}
