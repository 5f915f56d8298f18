package sink

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

// decodeBatch parses one RecordBatch v2 with franz-go and returns it with its
// records, failing t on any mismatch of the framing.
func decodeBatch(t *testing.T, raw []byte) (kmsg.RecordBatch, []kmsg.Record) {
	t.Helper()
	var b kmsg.RecordBatch
	if err := b.ReadFrom(raw); err != nil {
		t.Fatalf("read record batch: %v", err)
	}
	if int(b.Length) != len(raw)-12 {
		t.Fatalf("batchLength %d, want %d", b.Length, len(raw)-12)
	}
	if b.Magic != 2 || b.FirstOffset != 0 || b.PartitionLeaderEpoch != -1 {
		t.Fatalf("magic %d, baseOffset %d, leader epoch %d; want 2, 0, -1", b.Magic, b.FirstOffset, b.PartitionLeaderEpoch)
	}
	if want := int32(crc32.Checksum(raw[21:], crc32.MakeTable(crc32.Castagnoli))); b.CRC != want {
		t.Fatalf("crc %x, want %x", b.CRC, want)
	}
	records, err := kgo.DefaultDecompressor().Decompress(b.Records, kgo.CompressionCodecType(b.Attributes&0x7))
	if err != nil {
		t.Fatalf("decompress records (attributes %#x): %v", b.Attributes, err)
	}
	var recs []kmsg.Record
	for len(records) > 0 {
		l, n := binary.Varint(records)
		if n <= 0 || int(l)+n > len(records) {
			t.Fatalf("record %d: bad length prefix", len(recs))
		}
		var r kmsg.Record
		if err := r.ReadFrom(records[:n+int(l)]); err != nil {
			t.Fatalf("record %d: %v", len(recs), err)
		}
		recs = append(recs, r)
		records = records[n+int(l):]
	}
	if len(recs) != int(b.NumRecords) || b.LastOffsetDelta != b.NumRecords-1 {
		t.Fatalf("%d records, count %d, lastOffsetDelta %d", len(recs), b.NumRecords, b.LastOffsetDelta)
	}
	return b, recs
}

// TestBatchEncoding encodes batches with every codec, idempotent and not, and
// decodes them with franz-go: the framing, producer fields and every record's
// key, value and headers come back as written.
func TestBatchEncoding(t *testing.T) {
	origin := outbox.NewOrigin("7312345678901234567", 1, "cdc_relay")
	evs := stream(7, 40)
	origins := make([]*outbox.Origin, len(evs))
	for i, ev := range evs {
		switch i % 4 {
		case 0:
			origins[i], ev.Index = origin, uint32(i)
		case 1:
			ev.Headers = []outbox.Header{{Key: "tenant", Value: []byte("acme")}, {Key: "null", Value: nil}}
		case 2:
			ev.Payload = nil // a NULL payload is an empty value, not a null one (a tombstone)
		case 3:
			ev.Payload = []byte(strings.Repeat("x", 300)) // lengths past one varint byte
		}
	}
	items := make([]item, len(evs))
	for i, ev := range evs {
		items[i] = item{m: Message{Event: ev, Origin: origins[i]}}
	}
	ts := time.Date(2025, 1, 2, 3, 4, 5, 6e6, time.UTC).UnixMilli()
	for _, c := range []kafkago.Compression{0, kafkago.Gzip, kafkago.Snappy, kafkago.Lz4, kafkago.Zstd} {
		for _, pf := range []producerFields{noProducer, {id: 4242, epoch: 3, seq: math.MaxInt32 - 10}} {
			t.Run(fmt.Sprintf("%s/pid=%d", c, pf.id), func(t *testing.T) {
				var e encoder
				prefix := []byte("earlier batch")
				raw, err := e.appendBatch(prefix, items, timesOf(items, ts), pf, c.Codec())
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(raw[:len(prefix)], prefix) {
					t.Fatal("appendBatch overwrote what dst held")
				}
				b, recs := decodeBatch(t, raw[len(prefix):])
				if b.ProducerID != pf.id || b.ProducerEpoch != pf.epoch || b.FirstSequence != pf.seq {
					t.Errorf("producer %d/%d/%d, want %d/%d/%d", b.ProducerID, b.ProducerEpoch, b.FirstSequence, pf.id, pf.epoch, pf.seq)
				}
				if b.FirstTimestamp != ts || b.MaxTimestamp != ts {
					t.Errorf("timestamps %d..%d, want %d", b.FirstTimestamp, b.MaxTimestamp, ts)
				}
				if int(b.Attributes&0x7) != int(c) || b.Attributes&^0x7 != 0 {
					t.Errorf("attributes %#x, want codec %d only", b.Attributes, c)
				}
				for i, r := range recs {
					ev := evs[i]
					if r.OffsetDelta != int32(i) || r.TimestampDelta64 != 0 || r.Attributes != 0 {
						t.Errorf("record %d: offsetDelta %d, timestampDelta %d, attributes %d", i, r.OffsetDelta, r.TimestampDelta64, r.Attributes)
					}
					if !bytes.Equal(r.Key, ev.AggregateID) || !bytes.Equal(r.Value, ev.Payload) || r.Key == nil || r.Value == nil {
						t.Errorf("record %d: key %q value %q, want %q %q", i, r.Key, r.Value, ev.AggregateID, ev.Payload)
					}
					want := []kmsg.Header{
						{Key: HeaderID, Value: ev.ID},
						{Key: HeaderEventType, Value: ev.EventType},
						{Key: HeaderAggregateType, Value: ev.AggregateType},
						{Key: HeaderCommitLSN, Value: []byte(ev.CommitLSN.String())},
						{Key: HeaderCommitTime, Value: []byte(ev.CommitTime.UTC().Format(time.RFC3339Nano))},
					}
					if o := origins[i]; o != nil {
						want = append(want, kmsg.Header{Key: HeaderSource, Value: o.AppendPosition(nil, ev.CommitLSN, ev.Index)})
					}
					for _, h := range ev.Headers {
						want = append(want, kmsg.Header{Key: h.Key, Value: h.Value})
					}
					if got, want := fmt.Sprintf("%q", r.Headers), fmt.Sprintf("%q", want); got != want {
						t.Errorf("record %d headers\n got %s\nwant %s", i, got, want)
					}
					for j, h := range r.Headers {
						if j < len(want) && (h.Value == nil) != (want[j].Value == nil) {
							t.Errorf("record %d header %s: null %v, want %v", i, h.Key, h.Value == nil, want[j].Value == nil)
						}
					}
				}
			})
		}
	}
}

// TestMessageTraceParent: a Message's TraceParent (the relay's span) is the
// record's traceparent header, and the structured CloudEvent's traceparent,
// instead of the event's; the event's own header is left as it was, and a
// Message without one carries the event's.
func TestMessageTraceParent(t *testing.T) {
	const app = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const relay = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01"
	for _, tc := range []struct {
		name   string
		cfg    Config
		parent []byte
		want   string
	}{
		{"native, the relay's span", Config{}, []byte(relay), relay},
		{"native, none", Config{}, nil, app},
		{"structured, the relay's span", structuredCfg, []byte(relay), relay},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := testEvent("agg-1", 0, 0)
			ev.Headers = []outbox.Header{{Key: "tenant", Value: []byte("acme")}, {Key: outbox.HeaderTraceParent, Value: []byte(app)}}
			r := encodeOne(t, tc.cfg, Message{Event: ev, TraceParent: tc.parent})
			var got []string
			for _, h := range r.Headers {
				if h.Key == outbox.HeaderTraceParent {
					got = append(got, string(h.Value))
				}
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("traceparent headers %q, want one: %q", got, tc.want)
			}
			if tc.cfg.CloudEventsMode == CloudEventsStructured && !bytes.Contains(r.Value, []byte(`"traceparent":"`+tc.want+`"`)) {
				t.Errorf("structured value %s, want traceparent %q", r.Value, tc.want)
			}
			if v := string(ev.Headers[1].Value); v != app {
				t.Errorf("the event's own traceparent header became %q, want it unchanged: %q", v, app)
			}
		})
	}
}

// TestNextSeq checks that sequences wrap from MaxInt32 to 0, as Kafka's do.
func TestNextSeq(t *testing.T) {
	for _, c := range []struct {
		seq  int32
		n    int
		want int32
	}{
		{0, 1, 1},
		{5, 10, 15},
		{math.MaxInt32 - 1, 1, math.MaxInt32},
		{math.MaxInt32, 1, 0},
		{math.MaxInt32 - 2, 5, 2},
	} {
		if got := nextSeq(c.seq, c.n); got != c.want {
			t.Errorf("nextSeq(%d, %d) = %d, want %d", c.seq, c.n, got, c.want)
		}
	}
}

// TestBatchRecordTimestamps encodes batches whose events carry their own
// timestamps (--column-timestamp), some earlier and some later than the
// batch's, and decodes them with franz-go: the base timestamp is the least,
// the max timestamp the greatest, and every record's base+delta is its own.
func TestBatchRecordTimestamps(t *testing.T) {
	ts := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name string
		evTS []time.Time // per event; zero: the batch's
	}{
		{"none", []time.Time{{}, {}}},
		{"all earlier", []time.Time{ts.Add(-time.Hour), ts.Add(-2 * time.Hour)}},
		{"mixed", []time.Time{{}, ts.Add(-90 * 24 * time.Hour), ts.Add(time.Minute), {}, ts.Add(1500 * time.Microsecond)}},
		{"one later", []time.Time{ts.Add(time.Second)}},
	} {
		for _, c := range []kafkago.Compression{0, kafkago.Zstd} {
			t.Run(fmt.Sprintf("%s/%s", tc.name, c), func(t *testing.T) {
				evs := stream(2, len(tc.evTS))
				items := make([]item, len(evs))
				want := make([]int64, len(evs))
				lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
				for i, ev := range evs {
					ev.Timestamp = tc.evTS[i]
					items[i] = item{m: Message{Event: ev}}
					want[i] = ts.UnixMilli()
					if !ev.Timestamp.IsZero() {
						want[i] = ev.Timestamp.UnixMilli()
					}
					lo, hi = min(lo, want[i]), max(hi, want[i])
				}
				var e encoder
				raw, err := e.appendBatch(nil, items, timesOf(items, ts.UnixMilli()), noProducer, c.Codec())
				if err != nil {
					t.Fatal(err)
				}
				b, recs := decodeBatch(t, raw)
				if b.FirstTimestamp != lo || b.MaxTimestamp != hi {
					t.Errorf("timestamps %d..%d, want %d..%d", b.FirstTimestamp, b.MaxTimestamp, lo, hi)
				}
				for i, r := range recs {
					if got := b.FirstTimestamp + r.TimestampDelta64; got != want[i] {
						t.Errorf("record %d: timestamp %d, want %d", i, got, want[i])
					}
					if !bytes.Equal(r.Value, evs[i].Payload) {
						t.Errorf("record %d: value %q, want %q", i, r.Value, evs[i].Payload)
					}
				}
			})
		}
	}
}

// TestBatchTombstones: with tombstones (--tombstone-on-empty-payload) a NULL
// or empty payload is a null value; without, an empty one; other payloads
// are unchanged either way.
func TestBatchTombstones(t *testing.T) {
	payloads := [][]byte{nil, {}, []byte(`{"a":1}`)}
	for _, tc := range []struct {
		tombstones bool
		wantNull   []bool
	}{
		{false, []bool{false, false, false}},
		{true, []bool{true, true, false}},
	} {
		for _, c := range []kafkago.Compression{0, kafkago.Lz4} {
			t.Run(fmt.Sprintf("tombstones=%v/%s", tc.tombstones, c), func(t *testing.T) {
				evs := stream(1, len(payloads))
				items := make([]item, len(evs))
				for i, ev := range evs {
					ev.Payload = payloads[i]
					items[i] = item{m: Message{Event: ev}}
				}
				e := encoder{tombstones: tc.tombstones}
				raw, err := e.appendBatch(nil, items, timesOf(items, 1), noProducer, c.Codec())
				if err != nil {
					t.Fatal(err)
				}
				_, recs := decodeBatch(t, raw)
				for i, r := range recs {
					if (r.Value == nil) != tc.wantNull[i] || !bytes.Equal(r.Value, payloads[i]) {
						t.Errorf("record %d: value %q (null %v), want %q (null %v)", i, r.Value, r.Value == nil, payloads[i], tc.wantNull[i])
					}
					if !bytes.Equal(r.Key, evs[i].AggregateID) {
						t.Errorf("record %d: key %q, want %q", i, r.Key, evs[i].AggregateID)
					}
				}
			})
		}
	}
}

// TestLingerOfBacklog: a steady load's few queued events wait Linger; a
// backlog's, BacklogLinger, from BacklogEvents on.
func TestLingerOfBacklog(t *testing.T) {
	c := Config{Linger: 2 * time.Millisecond, BacklogLinger: 5 * time.Millisecond, BacklogEvents: 400}
	c.setDefaults()
	k := &Kafka{cfg: c}
	for _, tc := range []struct {
		queued int
		want   time.Duration
	}{
		{0, 2 * time.Millisecond},
		{60, 2 * time.Millisecond}, // 30,000 events a second queue about this many per Linger
		{399, 2 * time.Millisecond},
		{400, 5 * time.Millisecond},
		{5000, 5 * time.Millisecond},
	} {
		if got := k.linger(tc.queued); got != tc.want {
			t.Errorf("linger(%d) = %v, want %v", tc.queued, got, tc.want)
		}
	}
	var d Config
	d.setDefaults()
	if d.BacklogEvents != 400 || d.BacklogLinger != 5*time.Millisecond {
		t.Errorf("defaults: BacklogEvents %d, BacklogLinger %v; want 400, 5ms", d.BacklogEvents, d.BacklogLinger)
	}
}
