package sink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/protocol"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// wireRequest builds a produce request of three partitions, the first and
// the third of one topic, with n events each.
func wireRequest(t *testing.T, n int) (*request, *produceExchange) {
	t.Helper()
	k := &Kafka{cfg: Config{RequestTimeout: 7 * time.Second}, clientID: "cdc-relay-test"}
	k.corr.Store(41)
	r := &request{broker: 1}
	for i, tp := range []struct {
		topic string
		id    int
	}{{"orders", 0}, {"payments", 1}, {"orders", 2}} {
		items := make([]item, n)
		for j, ev := range stream(2, n) {
			items[j] = item{m: Message{Event: ev}}
		}
		r.parts = append(r.parts, &partition{topic: tp.topic, id: tp.id})
		r.flights = append(r.flights, &flight{b: batch{items: items, times: timesOf(items, 1700000000000), pf: producerFields{id: 9, epoch: 2, seq: int32(10 * i)}}})
	}
	var e encoder
	x, err := e.build(k, r)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	return r, x
}

// kmsgAnswer is the response franz-go encodes for the request's partitions
// (topics grouped as the request grouped them), with one partition failing.
func kmsgAnswer(v int16) *kmsg.ProduceResponse {
	res := kmsg.NewPtrProduceResponse()
	res.Version = v
	res.ThrottleMillis = 3
	msg, rec := "not the leader any more", "record 1 is bad"
	for _, tp := range []struct {
		topic string
		parts []int32
	}{{"orders", []int32{0, 2}}, {"payments", []int32{1}}} {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = tp.topic
		for _, p := range tp.parts {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition, rp.BaseOffset, rp.LogAppendTime, rp.LogStartOffset = p, 1000*int64(p+1), -1, 5
			if p == 2 {
				rp.ErrorCode, rp.BaseOffset, rp.ErrorMessage = 6, -1, &msg
				rp.ErrorRecords = []kmsg.ProduceResponseTopicPartitionErrorRecord{{RelativeOffset: 1, ErrorMessage: &rec}}
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		res.Topics = append(res.Topics, rt)
	}
	return res
}

// wantAnswer is kmsgAnswer as the sink decodes it at version v.
func wantAnswer(v int16) *produceAPI.Response {
	want := &produceAPI.Response{ThrottleTimeMs: 3}
	for _, tp := range []struct {
		topic string
		parts []int32
	}{{"orders", []int32{0, 2}}, {"payments", []int32{1}}} {
		rt := produceAPI.ResponseTopic{Topic: tp.topic}
		for _, p := range tp.parts {
			rp := produceAPI.ResponsePartition{Partition: p, BaseOffset: 1000 * int64(p+1), LogAppendTime: -1}
			if v >= 5 {
				rp.LogStartOffset = 5
			}
			if v >= 8 {
				rp.RecordErrors = []produceAPI.ResponseError{}
			}
			if p == 2 {
				rp.ErrorCode, rp.BaseOffset = 6, -1
				if v >= 8 {
					rp.ErrorMessage = "not the leader any more"
					rp.RecordErrors = []produceAPI.ResponseError{{BatchIndex: 1, BatchIndexErrorMessage: "record 1 is bad"}}
				}
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		want.Topics = append(want.Topics, rt)
	}
	return want
}

// TestProduceExchange writes requests at every version the sink speaks to a
// connection whose other end decodes them with franz-go and answers with
// franz-go's encoding of a response: what the sink wrote is a valid request
// with every batch intact, and what it read is the response.
func TestProduceExchange(t *testing.T) {
	for _, v := range []int16{3, 5, 7, 8} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			r, x := wireRequest(t, 5)
			if !x.Required(map[protocol.ApiKey]int16{protocol.Produce: v}) {
				t.Fatal("Required = false: the exchange must always be the sink's")
			}
			client, server := net.Pipe()
			defer client.Close()
			served := make(chan error, 1)
			go func() { served <- serveProduce(server, v, r) }()
			m, err := x.RawExchange(client)
			if err != nil {
				t.Fatalf("RawExchange: %v", err)
			}
			if err := <-served; err != nil {
				t.Fatal(err)
			}
			if got, want := m.(*produceAPI.Response), wantAnswer(v); !reflect.DeepEqual(got, want) {
				t.Fatalf("response\n got %+v\nwant %+v", got, want)
			}
			if n := r.buf.readers.Load(); n != 0 {
				t.Fatalf("buffer readers %d after the exchange, want 0 (reusable)", n)
			}
		})
	}
	t.Run("a newer broker gets v8", func(t *testing.T) {
		_, x := wireRequest(t, 1)
		x.Required(map[protocol.ApiKey]int16{protocol.Produce: 12})
		if x.version != maxProduceVersion {
			t.Fatalf("version %d, want %d", x.version, maxProduceVersion)
		}
	})
}

// serveProduce reads one produce request from c at version v, checks it
// against r with franz-go's decoder, and answers kmsgAnswer(v).
func serveProduce(c net.Conn, v int16, r *request) error {
	defer c.Close()
	var size [4]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		return fmt.Errorf("read size: %w", err)
	}
	frame := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(c, frame); err != nil {
		return fmt.Errorf("read frame: %w", err)
	}
	key, ver, corr := int16(binary.BigEndian.Uint16(frame)), int16(binary.BigEndian.Uint16(frame[2:])), int32(binary.BigEndian.Uint32(frame[4:]))
	idLen := int(binary.BigEndian.Uint16(frame[8:]))
	if key != 0 || ver != v || corr != 42 || string(frame[10:10+idLen]) != "cdc-relay-test" {
		return fmt.Errorf("header: key %d version %d correlation %d client %q; want 0, %d, 42, cdc-relay-test", key, ver, corr, frame[10:10+idLen], v)
	}
	req := kmsg.NewPtrProduceRequest()
	req.Version = v
	if err := req.ReadFrom(frame[10+idLen:]); err != nil {
		return fmt.Errorf("franz-go cannot read the request: %w", err)
	}
	if req.TransactionID != nil || req.Acks != -1 || req.TimeoutMillis != 7000 {
		return fmt.Errorf("transactional id %v, acks %d, timeout %d; want null, -1, 7000", req.TransactionID, req.Acks, req.TimeoutMillis)
	}
	var got []string
	for _, rt := range req.Topics {
		for _, rp := range rt.Partitions {
			got = append(got, fmt.Sprintf("%s/%d", rt.Topic, rp.Partition))
			var b kmsg.RecordBatch
			if err := b.ReadFrom(rp.Records); err != nil {
				return fmt.Errorf("%s/%d: read record batch: %w", rt.Topic, rp.Partition, err)
			}
			i := 0
			for i < len(r.parts) && (r.parts[i].topic != rt.Topic || int32(r.parts[i].id) != rp.Partition) {
				i++
			}
			if i == len(r.parts) || b.NumRecords != int32(len(r.flights[i].b.items)) || b.FirstSequence != r.flights[i].b.pf.seq || int(b.Length) != len(rp.Records)-12 {
				return fmt.Errorf("%s/%d: %d records, sequence %d, length %d of %d bytes: not the batch built for it", rt.Topic, rp.Partition, b.NumRecords, b.FirstSequence, b.Length, len(rp.Records))
			}
		}
	}
	if fmt.Sprint(got) != "[orders/0 orders/2 payments/1]" {
		return fmt.Errorf("partitions %v, want orders/0 orders/2 payments/1 (grouped by topic)", got)
	}
	body := kmsgAnswer(v).AppendTo(nil)
	out := binary.BigEndian.AppendUint32(nil, uint32(len(body)+4))
	out = binary.BigEndian.AppendUint32(out, uint32(corr))
	if _, err := c.Write(append(out, body...)); err != nil {
		return fmt.Errorf("write response: %w", err)
	}
	return nil
}

// TestEncoderGroup checks the order build writes partitions in, which apply
// then walks: grouped by topic, topics in order of first appearance, each
// topic's partitions (with their batches) in the request's order.
func TestEncoderGroup(t *testing.T) {
	tests := []struct {
		name   string
		topics string // one letter per partition of the request, in order
		want   string // the partitions' topics and ids after group
		counts []int
	}{
		{"one topic", "aaa", "a0 a1 a2", []int{3}},
		{"already grouped", "aabbbc", "a0 a1 b2 b3 b4 c5", []int{2, 3, 1}},
		{"interleaved", "abab", "a0 a2 b1 b3", []int{2, 2}},
		{"a topic back at the end", "abcda", "a0 a4 b1 c2 d3", []int{2, 1, 1, 1}},
		{"one partition", "z", "z0", []int{1}},
	}
	var e encoder // reused: group's scratch must not leak between requests
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &request{}
			for i, c := range tt.topics {
				r.parts = append(r.parts, &partition{topic: string(c), id: i})
				r.flights = append(r.flights, &flight{b: batch{times: recordTimes{ts: int64(i)}}})
			}
			topics, counts := e.group(r)
			var got []string
			for i, p := range r.parts {
				if r.flights[i].b.times.ts != int64(p.id) {
					t.Fatalf("partition %s/%d has the batch of partition %d", p.topic, p.id, r.flights[i].b.times.ts)
				}
				got = append(got, fmt.Sprintf("%s%d", p.topic, p.id))
			}
			var wantTopics []string
			for _, w := range strings.Fields(tt.want) {
				if len(wantTopics) == 0 || wantTopics[len(wantTopics)-1] != w[:1] {
					wantTopics = append(wantTopics, w[:1])
				}
			}
			if strings.Join(got, " ") != tt.want || !reflect.DeepEqual(topics, wantTopics) || !reflect.DeepEqual(counts, tt.counts) {
				t.Fatalf("group(%s) = %v, topics %v, counts %v; want %s, %v, %v", tt.topics, got, topics, counts, tt.want, wantTopics, tt.counts)
			}
		})
	}
}

// TestProduceExchangeRefuses checks the exchanges that must fail: a broker
// too old for record batches (nothing written), an answer to another
// request, an implausible size, a connection closed mid-answer.
func TestProduceExchangeRefuses(t *testing.T) {
	answer := func(corr int32, size int32, body []byte) []byte {
		out := binary.BigEndian.AppendUint32(nil, uint32(size))
		out = binary.BigEndian.AppendUint32(out, uint32(corr))
		return append(out, body...)
	}
	body := kmsgAnswer(8).AppendTo(nil)
	tests := []struct {
		name    string
		version int16
		answer  []byte
		want    string
	}{
		{"broker too old", 2, nil, "need v3"},
		{"another request's answer", 8, answer(7, int32(len(body)+4), body), "correlation id 7, want 42"},
		{"implausible size", 8, answer(42, 1<<30, body), "implausible size"},
		{"closed mid-answer", 8, answer(42, int32(len(body)+4), body[:len(body)/2]), "unexpected EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, x := wireRequest(t, 2)
			x.Required(map[protocol.ApiKey]int16{protocol.Produce: tt.version})
			conn := &scriptedConn{in: bytes.NewReader(tt.answer)}
			_, err := x.RawExchange(conn)
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tt.want)) {
				t.Fatalf("RawExchange error %v, want one containing %q", err, tt.want)
			}
			if tt.version < minProduceVersion && conn.out.Len() != 0 {
				t.Fatalf("wrote %d bytes to a broker that cannot read them", conn.out.Len())
			}
			if n := r.buf.readers.Load(); n != 0 {
				t.Fatalf("buffer readers %d after a failed exchange, want 0", n)
			}
		})
	}
}

// scriptedConn answers reads from in and keeps what is written.
type scriptedConn struct {
	in  io.Reader
	out bytes.Buffer
}

func (c *scriptedConn) Read(b []byte) (int, error)  { return c.in.Read(b) }
func (c *scriptedConn) Write(b []byte) (int, error) { return c.out.Write(b) }

// TestDecodeProduceResponseTruncated cuts a valid v8 body at every length:
// each prefix is an error, never a panic or a partial answer, and a count
// larger than the bytes left is refused before anything is allocated for it.
func TestDecodeProduceResponseTruncated(t *testing.T) {
	body := kmsgAnswer(8).AppendTo(nil)
	if _, err := decodeProduceResponse(body, 8, nil, 0); err != nil {
		t.Fatalf("whole body: %v", err)
	}
	for n := 0; n < len(body); n++ {
		if res, err := decodeProduceResponse(body[:n], 8, nil, 0); err == nil {
			t.Fatalf("%d of %d bytes decoded as %+v, want an error", n, len(body), res)
		}
	}
	huge := binary.BigEndian.AppendUint32(nil, 1<<30)
	if _, err := decodeProduceResponse(huge, 8, nil, 0); err == nil {
		t.Fatal("a topic count of 2^30 in 4 bytes decoded, want an error")
	}
}

// TestProduceExchangeBroker routes requests with kafka-go's view of the
// cluster: to the leader their partitions share, or an error that says the
// request was not sent.
func TestProduceExchangeBroker(t *testing.T) {
	cluster := protocol.Cluster{
		Brokers: map[int32]protocol.Broker{1: {ID: 1}, 2: {ID: 2}},
		Topics: map[string]protocol.Topic{
			"orders":   {Partitions: map[int32]protocol.Partition{0: {Leader: 1}, 1: {Leader: 2}, 2: {Leader: 1}, 3: {Leader: 9}}},
			"payments": {Partitions: map[int32]protocol.Partition{0: {Leader: 1}}},
		},
	}
	tests := []struct {
		name  string
		parts []wirePartition
		want  int32 // -1: no route
	}{
		{"one leader", []wirePartition{{"orders", 0}, {"orders", 2}, {"payments", 0}}, 1},
		{"unknown topic", []wirePartition{{"refunds", 0}}, -1},
		{"unknown partition", []wirePartition{{"orders", 7}}, -1},
		{"leader not a known broker", []wirePartition{{"orders", 3}}, -1},
		{"two leaders", []wirePartition{{"orders", 0}, {"orders", 1}}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := (&produceExchange{parts: tt.parts}).Broker(cluster)
			var nr *noRouteError
			switch {
			case tt.want < 0 && !errors.As(err, &nr):
				t.Fatalf("Broker = %v, %v; want a noRouteError", b, err)
			case tt.want >= 0 && (err != nil || b.ID != tt.want):
				t.Fatalf("Broker = %v, %v; want broker %d", b, err, tt.want)
			}
		})
	}
}

// BenchmarkProduceExchange encodes a request of two events per partition,
// writes it and decodes a franz-go-encoded answer: the sink's CPU per request
// outside the broker, which grows with the partition batches in it.
func BenchmarkProduceExchange(b *testing.B) {
	for _, c := range []struct{ topics, parts int }{{1, 8}, {1, 256}, {50, 8}} {
		b.Run(fmt.Sprintf("topics=%d,partitions=%d", c.topics, c.parts), func(b *testing.B) {
			k := &Kafka{clientID: "cdc-relay"}
			r := &request{}
			evs := stream(c.parts, 2*c.parts*c.topics)
			res := kmsg.NewPtrProduceResponse()
			res.Version = 8
			for tp := range c.topics {
				rt := kmsg.NewProduceResponseTopic()
				rt.Topic = fmt.Sprintf("bench.orders%d", tp)
				for i := range c.parts {
					e := 2 * (tp*c.parts + i)
					r.parts = append(r.parts, &partition{topic: rt.Topic, id: i})
					items := []item{{m: Message{Event: evs[e]}}, {m: Message{Event: evs[e+1]}}}
					r.flights = append(r.flights, &flight{b: batch{items: items, times: timesOf(items, 1), pf: producerFields{id: 1, seq: 5}}})
					rp := kmsg.NewProduceResponseTopicPartition()
					rp.Partition, rp.BaseOffset = int32(i), int64(100*i)
					rt.Partitions = append(rt.Partitions, rp)
				}
				res.Topics = append(res.Topics, rt)
			}
			// kfake answers topics in its map's order, and Kafka promises
			// none: the answer lists them backwards.
			slices.Reverse(res.Topics)
			body := res.AppendTo(nil)
			answer := binary.BigEndian.AppendUint32(nil, uint32(len(body)+4))
			answer = binary.BigEndian.AppendUint32(answer, 1)
			answer = append(answer, body...)
			var e encoder
			in := bytes.NewReader(answer)
			conn := struct {
				io.Reader
				io.Writer
			}{in, io.Discard}
			b.ReportAllocs()
			for b.Loop() {
				k.corr.Store(0)
				x, err := e.build(k, r)
				if err != nil {
					b.Fatal(err)
				}
				x.Required(map[protocol.ApiKey]int16{protocol.Produce: maxProduceVersion})
				in.Reset(answer)
				m, err := x.RawExchange(conn)
				if err != nil {
					b.Fatal(err)
				}
				// apply's lookups of every partition's answer.
				var answers responseIndex
				answers.init(m.(*produceAPI.Response))
				for _, p := range r.parts {
					if _, ok := answers.find(p.topic, int32(p.id)); !ok {
						b.Fatalf("no answer for %s/%d", p.topic, p.id)
					}
				}
				e.release(r.buf)
			}
		})
	}
}
