package sink

// Encoding: events to Kafka records and produce requests.

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/rawproduce"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
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

// CloudEvents attributes (Kafka protocol binding, binary content mode) the
// sink sets with Config.CloudEventsSource; content-type, when set, comes
// from the event's headers (decoder.Format). The structured content mode
// sets none of them (see cloudevents.go).
const (
	HeaderCESpecVersion = "ce_specversion"
	HeaderCEID          = "ce_id"
	HeaderCESource      = "ce_source"
	HeaderCEType        = "ce_type"
	HeaderCETime        = "ce_time"
)

var ceSpecVersion = []byte("1.0")

// encoder turns batches into produce requests (see batch.go for the wire
// format). It runs on the dispatcher goroutine only. It keeps the formatted
// commit LSN and time of the last event, which consecutive events mostly
// share, and the buffers of finished requests for reuse.
type encoder struct {
	lsn     pglogrepl.LSN
	lsnText []byte
	ts      time.Time
	tsText  []byte
	pos     []byte // the last source_position header value
	// ceSource is Config.CloudEventsSource as bytes; nil: no CloudEvents.
	ceSource []byte
	// ceStructured is Config.CloudEventsMode == CloudEventsStructured;
	// ceSourceJSON is then ceSource as a JSON string, and ceValue the
	// scratch buffer of one record's value.
	ceStructured bool
	ceSourceJSON []byte
	ceValue      []byte
	// tombstones is Config.TombstoneOnEmptyPayload.
	tombstones bool
	raw        []byte     // uncompressed records, when compressing
	free       []*wireBuf // buffers of finished requests
}

// maxFreeBufs bounds the buffers kept for reuse: about one per broker with a
// request in flight.
const maxFreeBufs = 8

// build encodes r's batches, already stamped (see Kafka.stamp), into one
// produce request.
func (e *encoder) build(k *Kafka, r *request) (*rawproduce.Request, error) {
	buf := e.buffer()
	codec := k.cfg.Compression.Codec()
	e.configure(&k.cfg)
	topics := make([]rawproduce.RequestTopic, 0, 1)
	readers := make([]batchReader, len(r.parts))
	ends := make([]int, len(r.parts))
	var err error
	for i := range r.parts {
		b := &r.batches[i]
		// kafka-go copies a raw record set as it is: with its int32 size.
		at := len(buf.b)
		buf.b = append(buf.b, 0, 0, 0, 0)
		if buf.b, err = e.appendBatch(buf.b, b.items, b.ts, b.pf, codec); err != nil {
			e.free = append(e.free, buf)
			return nil, fmt.Errorf("encode %d events for %s/%d: %w", len(b.items), r.parts[i].topic, r.parts[i].id, err)
		}
		binary.BigEndian.PutUint32(buf.b[at:], uint32(len(buf.b)-at-4))
		ends[i] = len(buf.b)
	}
	// Slices into buf.b are taken once it no longer grows.
	buf.readers.Store(int32(len(r.parts)))
	r.buf = buf
	for i, p := range r.parts {
		start := 0
		if i > 0 {
			start = ends[i-1]
		}
		readers[i] = batchReader{buf: buf, b: buf.b[start:ends[i]:ends[i]]}
		ti := -1
		for j := range topics {
			if topics[j].Topic == p.topic {
				ti = j
				break
			}
		}
		if ti < 0 {
			ti = len(topics)
			topics = append(topics, rawproduce.RequestTopic{Topic: p.topic})
		}
		topics[ti].Partitions = append(topics[ti].Partitions, rawproduce.RequestPartition{
			Partition: int32(p.id),
			RecordSet: protocol.RawRecordSet{Reader: &readers[i]},
		})
	}
	return &rawproduce.Request{
		Acks:    int16(kafka.RequireAll),
		Timeout: int32(k.cfg.RequestTimeout / time.Millisecond),
		Topics:  topics,
	}, nil
}

// configure takes the record format of cfg: tombstones and CloudEvents.
func (e *encoder) configure(cfg *Config) {
	e.tombstones = cfg.TombstoneOnEmptyPayload
	if src := cfg.CloudEventsSource; src != "" && string(e.ceSource) != src {
		e.ceSource = []byte(src)
		e.ceSourceJSON = appendJSONString(nil, e.ceSource)
	}
	e.ceStructured = e.ceSource != nil && cfg.CloudEventsMode == CloudEventsStructured
}

// buffer returns a buffer for a new request.
func (e *encoder) buffer() *wireBuf {
	if n := len(e.free); n > 0 {
		buf := e.free[n-1]
		e.free = e.free[:n-1]
		buf.b = buf.b[:0]
		return buf
	}
	return &wireBuf{}
}

// release takes back the buffer of a finished request. One kafka-go has not
// read to the end (the request was abandoned before it was written) may still
// be read: it is left to the garbage collector.
func (e *encoder) release(buf *wireBuf) {
	if buf != nil && buf.readers.Load() == 0 && len(e.free) < maxFreeBufs {
		e.free = append(e.free, buf)
	}
}

// lsnBytes formats lsn, reusing the last result for events of one transaction.
func (e *encoder) lsnBytes(lsn pglogrepl.LSN) []byte {
	if lsn != e.lsn || e.lsnText == nil {
		e.lsn = lsn
		e.lsnText = outbox.AppendLSN(e.lsnText[:0], lsn)
	}
	return e.lsnText
}

// timeBytes formats t as RFC 3339 in UTC, reusing the last result.
func (e *encoder) timeBytes(t time.Time) []byte {
	if !t.Equal(e.ts) || e.tsText == nil {
		e.ts = t
		e.tsText = t.UTC().AppendFormat(e.tsText[:0], time.RFC3339Nano)
	}
	return e.tsText
}
