package testenv

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// ProduceError answers req with code for every partition it carries, in place
// of the broker handling it (from a kfake Control function): nothing is
// written.
func ProduceError(req *kmsg.ProduceRequest, code int16) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic = rt.Topic
		st.TopicID = rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = code
			sp.BaseOffset = -1
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// HoldProduce makes k, a local kfake broker (t skips otherwise), let the
// next pass produce requests through and hold every one after them until
// release, which t's end calls at the latest; held reports how many it
// holds. Requests that arrive after release pass.
func HoldProduce(t testing.TB, k *sandbox.Kafka, pass int) (release func(), held func() int64) {
	t.Helper()
	RequireLocalKafka(t, k)
	c := k.Cluster()
	ch := make(chan struct{})
	var once sync.Once
	var seen, n atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if seen.Add(1) <= int64(pass) {
			return nil, nil, false
		}
		select {
		case <-ch:
		default:
			n.Add(1)
			c.SleepControl(func() { <-ch })
		}
		return nil, nil, false
	})
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	return release, n.Load
}
