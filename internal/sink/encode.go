package sink

// Encoding: events to Kafka records and produce requests.

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/segmentio/kafka-go"

	"github.com/cdc-relay/cdc-relay/internal/jsonstr"
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
	// how internal/dedup's Decider recognises records the relay already
	// delivered (at start-up, and for a batch of unknown fate; see Verifier).
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
	// groupOf and counts are group's scratch: a topic's index in the
	// request, and how many partitions each topic has.
	groupOf map[string]int
	counts  []int
}

// maxFreeBufs bounds the buffers kept for reuse. A backlog's requests go one
// at a time (pipelineBytes), so two suffice there; small pipelined requests
// are cheap to allocate. More large buffers kept were heap for the garbage
// collector to walk: with eight kept and five requests in flight, a drain's
// CPU per event rose by a quarter.
const maxFreeBufs = 2

// build encodes r's batches, already stamped (see Kafka.stamp), into one
// produce request: a frame of its own wire format (wire.go). It first orders
// r's partitions by topic (see group), the order apply then walks.
func (e *encoder) build(k *Kafka, r *request) (*produceExchange, error) {
	buf := e.buffer()
	// Sized for the request at once (its events' bytes and what the
	// relay's headers and the framing add): grown by appends from nothing,
	// a buffer of a megabyte was copied about ten times.
	est := 256
	for _, f := range r.flights {
		est += 128 + len(f.b.items)*96
		for _, it := range f.b.items {
			est += k.eventSize(it.m.Event)
		}
	}
	if cap(buf.b) < est {
		buf.b = make([]byte, 0, est+est/8)
	}
	codec := k.cfg.Compression.Codec()
	e.configure(&k.cfg)
	topics, counts := e.group(r)
	x := &produceExchange{buf: buf, parts: make([]wirePartition, 0, len(r.parts)), topics: topics, corr: k.corr.Add(1)}
	b := appendFrameHead(buf.b[:0], x.corr, k.clientID, int16(kafka.RequireAll), int32(k.cfg.RequestTimeout/time.Millisecond), len(topics))
	var err error
	next := 0 // where the next topic's partitions start
	for i, p := range r.parts {
		if i == next {
			b = appendString16(b, p.topic)
			b = binary.BigEndian.AppendUint32(b, uint32(counts[0]))
			next += counts[0]
			counts = counts[1:]
		}
		b = binary.BigEndian.AppendUint32(b, uint32(p.id))
		at := len(b)
		b = append(b, 0, 0, 0, 0) // the record set's size
		bt := &r.flights[i].b
		if b, err = e.appendBatch(b, bt.items, bt.times, bt.pf, codec); err != nil {
			buf.b = b[:0]
			e.free = append(e.free, buf)
			return nil, fmt.Errorf("encode %d events for %s/%d: %w", len(bt.items), p.topic, p.id, err)
		}
		binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-4))
		x.parts = append(x.parts, wirePartition{topic: p.topic, id: int32(p.id)})
	}
	finishFrame(b, 0)
	buf.b = b
	buf.readers.Store(1)
	r.buf = buf
	return x, nil
}

// group orders r's partitions (and their batches) by topic, topics in order
// of first appearance, as a request must list them, and returns the topics and
// how many partitions each has. The dispatcher lists a topic's partitions
// together, so r is nearly always in that order already: one pass comparing
// neighbours finds that, looking a topic up only where it changes.
func (e *encoder) group(r *request) (topics []string, counts []int) {
	if e.groupOf == nil {
		e.groupOf = map[string]int{}
	}
	clear(e.groupOf)
	counts = e.counts[:0]
	topics = make([]string, 0, max(cap(counts), 1)) // as many as earlier requests had
	sorted := true
	g := 0
	for i, p := range r.parts {
		if i == 0 || p.topic != r.parts[i-1].topic {
			var seen bool
			if g, seen = e.groupOf[p.topic]; !seen {
				g = len(topics)
				e.groupOf[p.topic] = g
				topics = append(topics, p.topic)
				counts = append(counts, 0)
			}
			sorted = sorted && !seen
		}
		counts[g]++
	}
	e.counts = counts
	if sorted {
		return topics, counts
	}
	// A stable counting sort by topic: the order of a topic's partitions is
	// kept.
	at := make([]int, len(topics))
	for g := 1; g < len(topics); g++ {
		at[g] = at[g-1] + counts[g-1]
	}
	parts := make([]*partition, len(r.parts))
	flights := make([]*flight, len(r.flights))
	for i, p := range r.parts {
		g := e.groupOf[p.topic]
		parts[at[g]], flights[at[g]] = p, r.flights[i]
		at[g]++
	}
	r.parts, r.flights = parts, flights
	return topics, counts
}

// configure takes the record format of cfg: tombstones and CloudEvents.
func (e *encoder) configure(cfg *Config) {
	e.tombstones = cfg.TombstoneOnEmptyPayload
	if src := cfg.CloudEventsSource; src != "" && string(e.ceSource) != src {
		e.ceSource = []byte(src)
		e.ceSourceJSON = jsonstr.Append(nil, e.ceSource)
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

// release takes back the buffer of a finished request. One not written yet
// (the request was abandoned before kafka-go handed it a connection) may
// still be: it is left to the garbage collector.
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
