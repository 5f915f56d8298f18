package sink

import (
	"testing"

	produceAPI "github.com/segmentio/kafka-go/protocol/produce"
)

func TestResponseIndex(t *testing.T) {
	res := func(topics ...produceAPI.ResponseTopic) *produceAPI.Response {
		return &produceAPI.Response{Topics: topics}
	}
	topic := func(name string, parts ...int32) produceAPI.ResponseTopic {
		rt := produceAPI.ResponseTopic{Topic: name}
		for _, p := range parts {
			rt.Partitions = append(rt.Partitions, produceAPI.ResponsePartition{Partition: p, BaseOffset: int64(p) * 100})
		}
		return rt
	}
	type look struct {
		topic string
		part  int32
		found bool
	}
	tests := []struct {
		name  string
		res   *produceAPI.Response
		looks []look
		// partsMap: the lookups need the map of every answer; without it
		// each topic's answers were found in order.
		partsMap bool
	}{
		{"in the request's order", res(topic("a", 0, 1, 2), topic("b", 0)),
			[]look{{"a", 0, true}, {"a", 1, true}, {"a", 2, true}, {"b", 0, true}}, false},
		{"topics in another order", res(topic("c", 0, 1), topic("a", 0, 1, 2), topic("b", 0)),
			[]look{{"a", 0, true}, {"a", 1, true}, {"a", 2, true}, {"b", 0, true}, {"c", 0, true}, {"c", 1, true}}, false},
		{"reversed", res(topic("b", 0), topic("a", 2, 1, 0)),
			[]look{{"a", 0, true}, {"a", 1, true}, {"a", 2, true}, {"b", 0, true}}, true},
		{"one missing", res(topic("a", 0, 2)),
			[]look{{"a", 0, true}, {"a", 1, false}, {"a", 2, true}}, true},
		{"a topic missing", res(topic("a", 0), topic("c", 0)),
			[]look{{"a", 0, true}, {"b", 0, false}, {"c", 0, true}}, true},
		{"same partition, other topic", res(topic("b", 1), topic("a", 1)),
			[]look{{"a", 1, true}, {"b", 1, true}, {"c", 1, false}}, true},
		{"a topic twice", res(topic("a", 0), topic("b", 0), topic("a", 1)),
			[]look{{"a", 0, true}, {"b", 0, true}, {"a", 1, true}}, false},
		{"empty", res(), []look{{"a", 0, false}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var x responseIndex
			x.init(tt.res)
			for _, l := range tt.looks {
				rp, ok := x.find(l.topic, l.part)
				if ok != l.found {
					t.Fatalf("find(%s, %d): found %v, want %v", l.topic, l.part, ok, l.found)
				}
				if ok && (rp.Partition != l.part || rp.BaseOffset != int64(l.part)*100) {
					t.Fatalf("find(%s, %d) = partition %d at %d", l.topic, l.part, rp.Partition, rp.BaseOffset)
				}
			}
			if built := x.byPart != nil; built != tt.partsMap {
				t.Errorf("map of every answer built: %v, want %v", built, tt.partsMap)
			}
		})
	}
}
