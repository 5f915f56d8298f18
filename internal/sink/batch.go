package sink

// RecordBatch v2: the wire format of one partition's batch. The sink writes it
// itself because kafka-go's encoder always writes producer id, epoch and base
// sequence as -1, which rules out idempotent produce.

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"sync/atomic"

	"github.com/segmentio/kafka-go/compress"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// Offsets into a RecordBatch v2 header (KIP-98): baseOffset int64, batchLength
// int32, partitionLeaderEpoch int32, magic int8, crc uint32, then the part the
// CRC covers: attributes int16, lastOffsetDelta int32, baseTimestamp int64,
// maxTimestamp int64, producerId int64, producerEpoch int16, baseSequence
// int32, record count int32.
const (
	batchLengthAt    = 8
	batchCRCAt       = 17
	batchAttrsAt     = 21
	batchHeaderBytes = 61
)

// producerFields are a batch's idempotence fields; noProducer (all -1) when
// the producer is not idempotent.
type producerFields struct {
	id    int64
	epoch int16
	seq   int32
}

var noProducer = producerFields{id: -1, epoch: -1, seq: -1}

// appendBatch appends the RecordBatch v2 of items to dst: each record stamped
// with its event's Timestamp (Unix ms) or, when that is zero, with times.ts,
// the batch's; the base timestamp is times.base, the max timestamp
// times.max, each record's timestampDelta its own less the base; offset
// deltas 0..n-1; the records section compressed with codec unless it is nil.
func (e *encoder) appendBatch(dst []byte, items []item, times recordTimes, pf producerFields, codec compress.Codec) ([]byte, error) {
	start := len(dst)
	ts, base, maxTS := times.ts, times.base, times.max
	var attrs int16
	if codec != nil {
		attrs = int16(codec.Code()) & 0x7
	}
	dst = binary.BigEndian.AppendUint64(dst, 0)                    // baseOffset: the broker assigns offsets
	dst = binary.BigEndian.AppendUint32(dst, 0)                    // batchLength, set below
	dst = binary.BigEndian.AppendUint32(dst, 0xffffffff)           // partitionLeaderEpoch -1: the broker sets it
	dst = append(dst, 2)                                           // magic
	dst = binary.BigEndian.AppendUint32(dst, 0)                    // crc, set below
	dst = binary.BigEndian.AppendUint16(dst, uint16(attrs))        // compression codec; not transactional, not control
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(items)-1)) // lastOffsetDelta
	dst = binary.BigEndian.AppendUint64(dst, uint64(base))         // baseTimestamp
	dst = binary.BigEndian.AppendUint64(dst, uint64(maxTS))        // maxTimestamp
	dst = binary.BigEndian.AppendUint64(dst, uint64(pf.id))
	dst = binary.BigEndian.AppendUint16(dst, uint16(pf.epoch))
	dst = binary.BigEndian.AppendUint32(dst, uint32(pf.seq))
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(items)))
	if codec == nil {
		for i, it := range items {
			dst = e.appendRecord(dst, i, recordTimestamp(it.m.Event, ts)-base, it.m)
		}
	} else {
		// Records go to a scratch buffer, then through the codec into dst.
		raw := e.raw[:0]
		for i, it := range items {
			raw = e.appendRecord(raw, i, recordTimestamp(it.m.Event, ts)-base, it.m)
		}
		e.raw = raw
		w := &appendWriter{b: dst}
		cw := codec.NewWriter(w)
		if _, err := cw.Write(raw); err != nil {
			cw.Close()
			return dst[:start], fmt.Errorf("compress records with %s: %w", codec.Name(), err)
		}
		if err := cw.Close(); err != nil {
			return dst[:start], fmt.Errorf("compress records with %s: %w", codec.Name(), err)
		}
		dst = w.b
	}
	b := dst[start:]
	binary.BigEndian.PutUint32(b[batchLengthAt:], uint32(len(b)-batchLengthAt-4))
	binary.BigEndian.PutUint32(b[batchCRCAt:], crc32.Checksum(b[batchAttrsAt:], crc32c))
	return dst, nil
}

// recordTimestamp is ev's record timestamp in Unix ms: its Timestamp
// (outbox.columns.timestamp) or, when that is zero, ts, the batch's.
func recordTimestamp(ev *outbox.Event, ts int64) int64 {
	if ev.Timestamp.IsZero() {
		return ts
	}
	return ev.Timestamp.UnixMilli()
}

// recordTimes are a batch's record timestamps, Unix ms: ts, when the relay
// built the batch, for records whose event has none; base and max, the least
// and greatest of all its records'. The broker keeps max as the producer's
// last timestamp on the partition, from which it expires the producer (see
// partition.stale).
type recordTimes struct{ ts, base, max int64 }

// timesOf returns the record times of items in a batch built at ts. The
// batch's one pass over its events' timestamps: the encoder and the
// dispatcher read the result.
func timesOf(items []item, ts int64) recordTimes {
	r := recordTimes{ts: ts}
	for i, it := range items {
		t := recordTimestamp(it.m.Event, ts)
		if i == 0 || t < r.base {
			r.base = t
		}
		if i == 0 || t > r.max {
			r.max = t
		}
	}
	return r
}

// appendRecord appends m as the i-th record of a batch, delta ms after the
// batch's base timestamp. Its headers are the
// sink's (id, event_type, aggregate_type, commit_lsn, commit_time, then
// source_position for events of the replication stream: m.Origin set)
// followed by the event's own; a nil header value is null.
func (e *encoder) appendRecord(dst []byte, i int, delta int64, m Message) []byte {
	if e.ceStructured {
		return e.appendStructuredRecord(dst, i, delta, m)
	}
	ev := m.Event
	lsn := e.lsnBytes(ev.CommitLSN)
	ct := e.timeBytes(ev.CommitTime)
	var pos []byte
	nh := 5 + len(ev.Headers)
	if m.Origin != nil {
		e.pos = m.Origin.AppendPosition(e.pos[:0], ev.CommitLSN, ev.Index)
		pos = e.pos
		nh++
	}
	ce := e.ceSource != nil
	ceTime := ce && !ev.CommitTime.IsZero()
	if ce {
		nh += 4
		if ceTime {
			nh++
		}
	}
	size := 1 + varintLen(delta) + varintLen(int64(i)) + // attributes, timestampDelta, offsetDelta
		valueLen(ev.AggregateID) + e.payloadLen(ev.Payload) + varintLen(int64(nh)) +
		headerLen(HeaderID, ev.ID) + headerLen(HeaderEventType, ev.EventType) +
		headerLen(HeaderAggregateType, ev.AggregateType) + headerLen(HeaderCommitLSN, lsn) +
		headerLen(HeaderCommitTime, ct)
	if pos != nil {
		size += headerLen(HeaderSource, pos)
	}
	if ce {
		size += headerLen(HeaderCESpecVersion, ceSpecVersion) + headerLen(HeaderCEID, ev.ID) +
			headerLen(HeaderCESource, e.ceSource) + headerLen(HeaderCEType, ev.EventType)
		if ceTime {
			size += headerLen(HeaderCETime, ct)
		}
	}
	for _, h := range ev.Headers {
		size += headerLen(h.Key, m.headerValue(h))
	}
	dst = binary.AppendVarint(dst, int64(size))
	dst = append(dst, 0) // attributes
	dst = binary.AppendVarint(dst, delta)
	dst = binary.AppendVarint(dst, int64(i))
	// The key is never null. Nor is the value, unless tombstones are asked
	// for: a NULL payload is an empty value, not a tombstone that log
	// compaction would act on.
	dst = appendValue(dst, ev.AggregateID)
	if e.tombstones && len(ev.Payload) == 0 {
		dst = binary.AppendVarint(dst, -1)
	} else {
		dst = appendValue(dst, ev.Payload)
	}
	dst = binary.AppendVarint(dst, int64(nh))
	dst = appendHeader(dst, HeaderID, ev.ID)
	dst = appendHeader(dst, HeaderEventType, ev.EventType)
	dst = appendHeader(dst, HeaderAggregateType, ev.AggregateType)
	dst = appendHeader(dst, HeaderCommitLSN, lsn)
	dst = appendHeader(dst, HeaderCommitTime, ct)
	if pos != nil {
		dst = appendHeader(dst, HeaderSource, pos)
	}
	if ce {
		// CloudEvents' Kafka binding, binary content mode: the attributes as
		// ce_ headers, the payload as the data, unchanged.
		dst = appendHeader(dst, HeaderCESpecVersion, ceSpecVersion)
		dst = appendHeader(dst, HeaderCEID, ev.ID)
		dst = appendHeader(dst, HeaderCESource, e.ceSource)
		dst = appendHeader(dst, HeaderCEType, ev.EventType)
		if ceTime {
			dst = appendHeader(dst, HeaderCETime, ct) // RFC 3339, as the spec's time attribute
		}
	}
	for _, h := range ev.Headers {
		dst = appendHeader(dst, h.Key, m.headerValue(h))
	}
	return dst
}

// appendStructuredRecord is appendRecord in the CloudEvents structured
// content mode: the value is the event as a JSON CloudEvent (never null, so
// never a tombstone), the headers are the sink's and the event's as in every
// mode (id and source_position too, which the effectively-once
// reconciliation reads back), except that content-type is the JSON event
// format's: the event's own is the event's datacontenttype.
func (e *encoder) appendStructuredRecord(dst []byte, i int, delta int64, m Message) []byte {
	ev := m.Event
	lsn := e.lsnBytes(ev.CommitLSN)
	cts := e.timeBytes(ev.CommitTime)
	var pos []byte
	nh := 6 + len(ev.Headers) // with content-type
	if m.Origin != nil {
		e.pos = m.Origin.AppendPosition(e.pos[:0], ev.CommitLSN, ev.Index)
		pos = e.pos
		nh++
	}
	e.ceValue = e.appendStructured(e.ceValue[:0], &m)
	value := e.ceValue
	size := 1 + varintLen(delta) + varintLen(int64(i)) +
		valueLen(ev.AggregateID) + valueLen(value) +
		headerLen(HeaderID, ev.ID) + headerLen(HeaderEventType, ev.EventType) +
		headerLen(HeaderAggregateType, ev.AggregateType) + headerLen(HeaderCommitLSN, lsn) +
		headerLen(HeaderCommitTime, cts) + headerLen(outbox.HeaderContentType, contentTypeCEJSON)
	if pos != nil {
		size += headerLen(HeaderSource, pos)
	}
	for _, h := range ev.Headers {
		if h.Key == outbox.HeaderContentType {
			nh--
			continue
		}
		size += headerLen(h.Key, m.headerValue(h))
	}
	size += varintLen(int64(nh))
	dst = binary.AppendVarint(dst, int64(size))
	dst = append(dst, 0) // attributes
	dst = binary.AppendVarint(dst, delta)
	dst = binary.AppendVarint(dst, int64(i))
	dst = appendValue(dst, ev.AggregateID)
	dst = appendValue(dst, value)
	dst = binary.AppendVarint(dst, int64(nh))
	dst = appendHeader(dst, HeaderID, ev.ID)
	dst = appendHeader(dst, HeaderEventType, ev.EventType)
	dst = appendHeader(dst, HeaderAggregateType, ev.AggregateType)
	dst = appendHeader(dst, HeaderCommitLSN, lsn)
	dst = appendHeader(dst, HeaderCommitTime, cts)
	if pos != nil {
		dst = appendHeader(dst, HeaderSource, pos)
	}
	for _, h := range ev.Headers {
		if h.Key != outbox.HeaderContentType {
			dst = appendHeader(dst, h.Key, m.headerValue(h))
		}
	}
	return appendHeader(dst, outbox.HeaderContentType, contentTypeCEJSON)
}

// payloadLen is the encoded size of the record value for payload p: null (a
// tombstone) when e.tombstones and p is empty, else p as a non-null field.
func (e *encoder) payloadLen(p []byte) int {
	if e.tombstones && len(p) == 0 {
		return 1
	}
	return valueLen(p)
}

// Kafka's varints are zigzag-encoded, as encoding/binary's signed varints are.

func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

// bytesLen is the encoded size of b: its varint length (-1 for nil) and bytes.
func bytesLen(b []byte) int {
	if b == nil {
		return 1
	}
	return varintLen(int64(len(b))) + len(b)
}

// valueLen is the encoded size of b as a non-null field.
func valueLen(b []byte) int { return varintLen(int64(len(b))) + len(b) }

func headerLen(key string, value []byte) int {
	return varintLen(int64(len(key))) + len(key) + bytesLen(value)
}

func appendBytes(dst, b []byte) []byte {
	if b == nil {
		return binary.AppendVarint(dst, -1)
	}
	dst = binary.AppendVarint(dst, int64(len(b)))
	return append(dst, b...)
}

// appendValue appends b as a non-null field, empty when b is nil.
func appendValue(dst, b []byte) []byte {
	dst = binary.AppendVarint(dst, int64(len(b)))
	return append(dst, b...)
}

func appendHeader(dst []byte, key string, value []byte) []byte {
	dst = binary.AppendVarint(dst, int64(len(key)))
	dst = append(dst, key...)
	return appendBytes(dst, value)
}

// appendWriter is an io.Writer appending to a slice.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

// wireBuf holds one encoded produce request (wire.go). It is reused for a
// later request only once the request was written (readers, 1 until then,
// is 0) and is over.
type wireBuf struct {
	b       []byte
	readers atomic.Int32
}
