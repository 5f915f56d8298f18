package sink

// Produce requests on the wire. The sink writes each request and reads its
// answer itself, on a connection kafka-go's Transport keeps (dialling, TLS,
// SASL, API versions): kafka-go's codec walks requests and responses by
// reflection and copies every encoded batch once more, which per partition
// batch was the largest cost left at many partitions.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/segmentio/kafka-go/protocol"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"
)

// Produce API versions the sink speaks: from v3 (record batches v2, Kafka
// 0.11) to v8, the last before flexible versions (KIP-482). Their requests are
// the same bytes; their responses add fields.
const (
	minProduceVersion = 3
	maxProduceVersion = 8
)

// maxAnswerBytes bounds a produce response: a corrupt size must not make the
// sink allocate gigabytes.
const maxAnswerBytes = 64 << 20

// produceExchange is one encoded produce request. kafka-go hands it the
// connection of the broker Broker chooses (protocol.RawExchanger), on which it
// writes buf and reads the answer.
type produceExchange struct {
	buf     *wireBuf // the whole frame; readers is 1 until it was written
	parts   []wirePartition
	topics  []string // the distinct topics of parts, in their order
	corr    int32
	version int16
}

// wirePartition is a topic-partition of the request, in request order.
type wirePartition struct {
	topic string
	id    int32
}

// noRouteError says kafka-go's metadata names no leader for a partition of the
// request: it was not sent.
type noRouteError struct{ err error }

func (e *noRouteError) Error() string { return "route produce request: " + e.err.Error() }
func (e *noRouteError) Unwrap() error { return e.err }

// ApiKey is Produce's.
func (x *produceExchange) ApiKey() protocol.ApiKey { return protocol.Produce }

// Broker routes the request to the leader of its partitions, which must all
// have the same one (the dispatcher builds one request per leader).
func (x *produceExchange) Broker(c protocol.Cluster) (protocol.Broker, error) {
	broker := protocol.Broker{ID: -1}
	for _, p := range x.parts {
		t, ok := c.Topics[p.topic]
		if !ok {
			return broker, &noRouteError{protocol.NewErrNoTopic(p.topic)}
		}
		part, ok := t.Partitions[p.id]
		if !ok {
			return broker, &noRouteError{protocol.NewErrNoPartition(p.topic, p.id)}
		}
		b, ok := c.Brokers[part.Leader]
		switch {
		case !ok:
			return broker, &noRouteError{protocol.NewErrNoLeader(p.topic, p.id)}
		case broker.ID < 0:
			broker = b
		case b.ID != broker.ID:
			return broker, &noRouteError{fmt.Errorf("partitions of one request led by brokers %d and %d", broker.ID, b.ID)}
		}
	}
	return broker, nil
}

// Required takes the Produce version the connection negotiated; the exchange
// is always the sink's own.
func (x *produceExchange) Required(versions map[protocol.ApiKey]int16) bool {
	x.version = min(versions[protocol.Produce], maxProduceVersion)
	return true
}

// RawExchange writes the request on rw and reads its answer. An error leaves
// the connection in an unknown state; kafka-go then closes it.
func (x *produceExchange) RawExchange(rw io.ReadWriter) (protocol.Message, error) {
	if err := x.write(rw, x.version); err != nil {
		return nil, err
	}
	return x.read(rw)
}

// write writes the request on w as Produce version v. Once it returns, the
// buffer is not read any more (readers drops to 0) and the dispatcher may
// reuse it.
func (x *produceExchange) write(w io.Writer, v int16) error {
	if v < minProduceVersion {
		x.buf.readers.Add(-1)
		return fmt.Errorf("the broker speaks Produce up to v%d; record batches with idempotence need v%d (Kafka 0.11 or later)", v, minProduceVersion)
	}
	x.version = v
	b := x.buf.b
	binary.BigEndian.PutUint16(b[6:], uint16(v))
	_, err := w.Write(b)
	x.buf.readers.Add(-1)
	if err != nil {
		return fmt.Errorf("write produce request: %w", err)
	}
	return nil
}

// read reads the request's answer from r, the next one on its connection.
func (x *produceExchange) read(r io.Reader) (*produceAPI.Response, error) {
	var head [8]byte // size, correlation id (response header v0)
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, fmt.Errorf("read produce response: %w", err)
	}
	size := int32(binary.BigEndian.Uint32(head[:]))
	if size < 4 || size > maxAnswerBytes {
		return nil, fmt.Errorf("read produce response: implausible size %d", size)
	}
	if corr := int32(binary.BigEndian.Uint32(head[4:])); corr != x.corr {
		return nil, fmt.Errorf("read produce response: correlation id %d, want %d", corr, x.corr)
	}
	body := make([]byte, size-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, fmt.Errorf("read produce response: %w", err)
	}
	res, err := decodeProduceResponse(body, x.version, x.topics, len(x.parts))
	if err != nil {
		return nil, fmt.Errorf("decode produce response v%d: %w", x.version, err)
	}
	return res, nil
}

var (
	_ protocol.BrokerMessage = (*produceExchange)(nil)
	_ protocol.RawExchanger  = (*produceExchange)(nil)
)

// appendFrameHead appends a produce request's size (0, set by
// finishFrame), request header v1 (version 0, set at the exchange) and the
// body up to its topic count.
func appendFrameHead(dst []byte, corr int32, clientID string, acks int16, timeoutMs int32, topics int) []byte {
	dst = binary.BigEndian.AppendUint32(dst, 0) // size
	dst = binary.BigEndian.AppendUint16(dst, uint16(protocol.Produce))
	dst = binary.BigEndian.AppendUint16(dst, 0) // api version
	dst = binary.BigEndian.AppendUint32(dst, uint32(corr))
	dst = appendString16(dst, clientID)
	dst = binary.BigEndian.AppendUint16(dst, 0xffff) // transactional id: null
	dst = binary.BigEndian.AppendUint16(dst, uint16(acks))
	dst = binary.BigEndian.AppendUint32(dst, uint32(timeoutMs))
	return binary.BigEndian.AppendUint32(dst, uint32(topics))
}

// finishFrame sets the size of the frame that starts at start of b.
func finishFrame(b []byte, start int) {
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
}

func appendString16(dst []byte, s string) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

// errShortAnswer is a response that ends before its fields do.
var errShortAnswer = errors.New("response ends early")

// answerReader reads a response body; the first error sticks.
type answerReader struct {
	b   []byte
	err error
}

func (r *answerReader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.b) < n {
		r.err = errShortAnswer
		r.b = nil
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *answerReader) int16() int16 {
	if v := r.take(2); v != nil {
		return int16(binary.BigEndian.Uint16(v))
	}
	return 0
}

func (r *answerReader) int32() int32 {
	if v := r.take(4); v != nil {
		return int32(binary.BigEndian.Uint32(v))
	}
	return 0
}

func (r *answerReader) int64() int64 {
	if v := r.take(8); v != nil {
		return int64(binary.BigEndian.Uint64(v))
	}
	return 0
}

// bytes16 reads a string's bytes (nil for a null string).
func (r *answerReader) bytes16() []byte {
	n := r.int16()
	if n < 0 || r.err != nil {
		return nil
	}
	return r.take(int(n))
}

// count reads an array length, bounded by what is left (each element takes
// at least each bytes), so a corrupt one cannot make the sink allocate much.
func (r *answerReader) count(each int) int {
	n := int(r.int32())
	if r.err == nil && (n < 0 || n*each > len(r.b)) {
		r.err = fmt.Errorf("array of %d elements in %d bytes", n, len(r.b))
	}
	if r.err != nil {
		return 0
	}
	return n
}

// decodeProduceResponse decodes a Produce response body of version v (3–8)
// to a request of parts partitions. Topic names the request sent (topics) are
// reused instead of allocated, and the partitions' answers share one slice.
func decodeProduceResponse(body []byte, v int16, topics []string, parts int) (*produceAPI.Response, error) {
	r := &answerReader{b: body}
	res := &produceAPI.Response{}
	res.Topics = make([]produceAPI.ResponseTopic, r.count(6))
	answers := make([]produceAPI.ResponsePartition, 0, parts)
	for i := range res.Topics {
		t := &res.Topics[i]
		name := r.bytes16()
		t.Topic = topicName(name, topics, i)
		if n := r.count(14); len(answers)+n <= cap(answers) {
			t.Partitions = answers[len(answers) : len(answers)+n : len(answers)+n]
			answers = answers[:len(answers)+n]
		} else {
			t.Partitions = make([]produceAPI.ResponsePartition, n)
		}
		for j := range t.Partitions {
			p := &t.Partitions[j]
			p.Partition = r.int32()
			p.ErrorCode = r.int16()
			p.BaseOffset = r.int64()
			p.LogAppendTime = r.int64() // v2+
			if v >= 5 {
				p.LogStartOffset = r.int64()
			}
			if v >= 8 {
				p.RecordErrors = make([]produceAPI.ResponseError, r.count(6))
				for k := range p.RecordErrors {
					p.RecordErrors[k].BatchIndex = r.int32()
					p.RecordErrors[k].BatchIndexErrorMessage = string(r.bytes16())
				}
				p.ErrorMessage = string(r.bytes16())
			}
		}
	}
	res.ThrottleTimeMs = r.int32() // v1+
	if r.err != nil {
		return nil, r.err
	}
	return res, nil
}

// topicName returns name as a string, the request's own when it is one of
// its topics; the i-th is tried first.
func topicName(name []byte, topics []string, i int) string {
	if i < len(topics) && topics[i] == string(name) {
		return topics[i]
	}
	for _, t := range topics {
		if t == string(name) {
			return t
		}
	}
	return string(name)
}
