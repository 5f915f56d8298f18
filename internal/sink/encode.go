package sink

// Encoding: events to Kafka records and produce requests.

import (
	"io"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"
)

// Header keys the sink sets on every message.
const (
	HeaderID            = "id"
	HeaderEventType     = "event_type"
	HeaderAggregateType = "aggregate_type"
	HeaderCommitLSN     = "commit_lsn"
	HeaderCommitTime    = "commit_time"
	// HeaderSource is the event's source position (outbox.Origin.AppendPosition),
	// set only on events read from the replication stream: with the id, it is
	// how a restarted relay recognises records it already delivered.
	HeaderSource = "source_position"
)

// encoder turns batches into a produce request. It keeps the formatted commit
// LSN and time of the last event, which consecutive events mostly share.
type encoder struct {
	lsn     pglogrepl.LSN
	lsnText []byte
	ts      time.Time
	tsText  []byte
}

func (e *encoder) build(k *Kafka, r *request) *produceAPI.Request {
	attrs := protocol.Attributes(k.cfg.Compression) & 0x7
	topics := make([]produceAPI.RequestTopic, 0, 1)
	index := map[string]int{}
	now := time.Now()
	for i, p := range r.parts {
		batch := r.batches[i]
		nh := 0
		for _, it := range batch {
			nh += 5 + len(it.ev.Headers)
		}
		headers := make([]kafka.Header, nh)
		records := make([]kafka.Record, len(batch))
		views := make([]byteView, 2*len(batch))
		for j, it := range batch {
			ev := it.ev
			h := headers[: 0 : 5+len(ev.Headers)]
			headers = headers[5+len(ev.Headers):]
			h = append(h,
				kafka.Header{Key: HeaderID, Value: ev.ID},
				kafka.Header{Key: HeaderEventType, Value: ev.EventType},
				kafka.Header{Key: HeaderAggregateType, Value: ev.AggregateType},
				kafka.Header{Key: HeaderCommitLSN, Value: e.lsnBytes(ev.CommitLSN)},
				kafka.Header{Key: HeaderCommitTime, Value: e.timeBytes(ev.CommitTime)},
			)
			for _, x := range ev.Headers {
				h = append(h, kafka.Header{Key: x.Key, Value: x.Value})
			}
			views[2*j].b = ev.AggregateID
			views[2*j+1].b = ev.Payload
			records[j] = kafka.Record{Time: now, Key: &views[2*j], Value: &views[2*j+1], Headers: h}
		}
		ti, ok := index[p.topic]
		if !ok {
			ti = len(topics)
			index[p.topic] = ti
			topics = append(topics, produceAPI.RequestTopic{Topic: p.topic})
		}
		topics[ti].Partitions = append(topics[ti].Partitions, produceAPI.RequestPartition{
			Partition: int32(p.id),
			RecordSet: protocol.RecordSet{Attributes: attrs, Records: &recordReader{records: records}},
		})
	}
	return &produceAPI.Request{
		Acks:    int16(kafka.RequireAll),
		Timeout: int32(k.cfg.RequestTimeout / time.Millisecond),
		Topics:  topics,
	}
}

// lsnBytes formats lsn, reusing the last result for events of one transaction.
// A new slice is made per LSN, so earlier records keep theirs.
func (e *encoder) lsnBytes(lsn pglogrepl.LSN) []byte {
	if lsn != e.lsn || e.lsnText == nil {
		e.lsn = lsn
		e.lsnText = []byte(lsn.String())
	}
	return e.lsnText
}

// timeBytes formats t as RFC 3339 in UTC, reusing the last result.
func (e *encoder) timeBytes(t time.Time) []byte {
	if !t.Equal(e.ts) || e.tsText == nil {
		e.ts = t
		e.tsText = []byte(t.UTC().Format(time.RFC3339Nano))
	}
	return e.tsText
}

// recordReader reads records from a slice without copying it.
type recordReader struct {
	records []kafka.Record
	i       int
}

func (r *recordReader) ReadRecord() (*kafka.Record, error) {
	if r.i >= len(r.records) {
		return nil, io.EOF
	}
	r.i++
	return &r.records[r.i-1], nil
}

// byteView is a kafka.Bytes over a slice it does not own.
type byteView struct {
	b   []byte
	off int
}

func (v *byteView) Len() int { return len(v.b) - v.off }

func (v *byteView) Read(p []byte) (int, error) {
	if v.off >= len(v.b) {
		return 0, io.EOF
	}
	n := copy(p, v.b[v.off:])
	v.off += n
	return n, nil
}

func (v *byteView) Close() error { return nil }

// WriteTo writes the rest of the slice in one call. io.Copy prefers it to the
// destination's ReadFrom, which matters for compression: lz4's writer rejects
// ReadFrom after a Write ("lz4: unhandled state[writeState]"), and kafka-go
// writes a record's other fields with Write before copying its key and value.
func (v *byteView) WriteTo(w io.Writer) (int64, error) {
	if v.off >= len(v.b) {
		return 0, nil
	}
	n, err := w.Write(v.b[v.off:])
	v.off += n
	return int64(n), err
}
