package decoder

import (
	"errors"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/connectjson"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// messageConfig is a message outbox with prefix "outbox" and no table.
func messageConfig() Config {
	return Config{Columns: DefaultColumns(), MessagePrefix: "outbox"}
}

const goodEnvelope = `{"id":"e-1","aggregate_type":"order","aggregate_id":"42","event_type":"OrderPlaced","payload":{"total": 10}}`

// msgEvent is the event of goodEnvelope, the index-th of its transaction.
func msgEvent(index uint32) *outbox.Event {
	return &outbox.Event{
		ID: b("e-1"), AggregateType: b("order"), AggregateID: b("42"), EventType: b("OrderPlaced"),
		Payload: b(`{"total": 10}`), PayloadType: outbox.PayloadJSON, MessagePrefix: "outbox",
		XID: xid1, CommitLSN: lsn1, CommitTime: t1, Index: index,
	}
}

// TestDecodeMessages decodes pgoutput 'M' byte fixtures: transactional
// messages with the outbox's prefix are events in stream order among the
// transaction's inserts; other prefixes are skipped; non-transactional
// ones are reported; content that is no envelope is an event that failed
// with bad_message and carries the raw content.
func TestDecodeMessages(t *testing.T) {
	withTable := messageConfig()
	withTable.Schema, withTable.Table = "public", "outbox_events"
	tests := []struct {
		name  string
		cfg   func(*Config)
		table bool // announce the outbox table first
		in    [][]byte
		want  []Message // for each input; an Event compared whole
	}{
		{
			name: "one message",
			in:   [][]byte{beginMsg(lsn1, t1, xid1), logicalMsg(true, lsn1-8, "outbox", goodEnvelope), commitMsg(lsn1, end1, t1)},
			want: []Message{beginStep.want, eventMsg(msgEvent(0)), commitStep.want},
		},
		{
			name: "other prefix, non-transactional, heartbeat",
			in: [][]byte{
				logicalMsg(false, lsn1-16, "outbox", goodEnvelope),
				logicalMsg(false, lsn1-12, "cdc_relay_heartbeat", ""),
				beginMsg(lsn1, t1, xid1),
				logicalMsg(true, lsn1-8, "outbox2", goodEnvelope),
				logicalMsg(true, lsn1-8, "outbo", goodEnvelope),
				commitMsg(lsn1, end1, t1),
			},
			want: []Message{{Kind: KindNonTransactional}, skip, beginStep.want, skip, skip, commitStep.want},
		},
		{
			name:  "rows and messages of one transaction keep their order and share the index",
			cfg:   func(c *Config) { *c = withTable },
			table: true,
			in: [][]byte{
				beginMsg(lsn1, t1, xid1),
				insertMsg(outboxID, row("r-1")...),
				logicalMsg(true, lsn1-8, "outbox", goodEnvelope),
				insertMsg(outboxID, row("r-2")...),
				commitMsg(lsn1, end1, t1),
			},
			want: []Message{beginStep.want, eventMsg(event("r-1")), eventMsg(msgEvent(1)),
				eventMsg(func() *outbox.Event { e := event("r-2"); e.Index = 2; return e }()), commitStep.want},
		},
		{
			name: "binary payload, headers sorted, content type",
			cfg:  func(c *Config) { c.ContentType = ContentTypeAuto },
			in: [][]byte{beginMsg(lsn1, t1, xid1), logicalMsg(true, 1, "outbox",
				`{"id":"e-2","aggregate_type":"","aggregate_id":"k","event_type":"","payload_base64":"AAEC/w==","headers":{"tenant":"acme","b":"2","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}`)},
			want: []Message{beginStep.want, eventMsg(&outbox.Event{
				ID: b("e-2"), AggregateType: b(""), AggregateID: b("k"), EventType: b(""),
				Payload: []byte{0, 1, 2, 0xff}, PayloadType: outbox.PayloadBinary, MessagePrefix: "outbox",
				Headers: []outbox.Header{{Key: "b", Value: b("2")}, {Key: "tenant", Value: b("acme")},
					{Key: "traceparent", Value: b("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}},
				XID: xid1, CommitLSN: lsn1, CommitTime: t1,
			})},
		},
		{
			name: "JSON content type and null payload",
			cfg:  func(c *Config) { c.ContentType = ContentTypeAuto },
			in: [][]byte{beginMsg(lsn1, t1, xid1), logicalMsg(true, 1, "outbox",
				`{"id":"e-3","aggregate_type":"a","aggregate_id":"k","event_type":"E","payload":null,"headers":null,"extra":1}`)},
			want: []Message{beginStep.want, eventMsg(&outbox.Event{
				ID: b("e-3"), AggregateType: b("a"), AggregateID: b("k"), EventType: b("E"),
				Payload: b("null"), PayloadType: outbox.PayloadJSON, MessagePrefix: "outbox",
				Headers: []outbox.Header{{Key: outbox.HeaderContentType, Value: b("application/json")}},
				XID:     xid1, CommitLSN: lsn1, CommitTime: t1,
			})},
		},
		{
			name: "escapes, white space, a repeated member",
			in: [][]byte{beginMsg(lsn1, t1, xid1), logicalMsg(true, 1, "outbox",
				"{ \"id\" : \"old\",\n\t\"id\":\"e-5\", \"aggregate_type\":\"a\\\"b\", \"aggregate_id\":\"k\\u00e9\", \"event_type\":\"E\", \"unknown\":{\"x\":[1,{\"y\":\"}\"}]}, \"payload\" : [ {\"s\":\"a,b\"} ] ,\"headers\":{\"h\":\"1\",\"h\":\"2\"} }")},
			want: []Message{beginStep.want, eventMsg(&outbox.Event{
				ID: b("e-5"), AggregateType: b(`a"b`), AggregateID: b("k\u00e9"), EventType: b("E"),
				Payload: b(`[ {"s":"a,b"} ]`), PayloadType: outbox.PayloadJSON, MessagePrefix: "outbox",
				Headers: []outbox.Header{{Key: "h", Value: b("2")}},
				XID:     xid1, CommitLSN: lsn1, CommitTime: t1,
			})},
		},
		{
			name: "envelope columns name members and headers",
			cfg: func(c *Config) {
				c.EnvelopeColumns = []EnvelopeColumn{{Column: "id", Alias: "eventId"}, {Column: "tenant", Alias: "tenant"}, {Column: "nothing", Alias: "n"}}
			},
			in: [][]byte{beginMsg(lsn1, t1, xid1), logicalMsg(true, 1, "outbox",
				`{"id":"e-4","aggregate_type":"a","aggregate_id":"k","event_type":"E","payload":[1, 2],"headers":{"tenant":"acme"}}`)},
			want: []Message{beginStep.want, eventMsg(&outbox.Event{
				ID: b("e-4"), AggregateType: b("a"), AggregateID: b("k"), EventType: b("E"),
				Payload: b(`{"payload":[1, 2],"eventId":"e-4","tenant":"acme","n":null}`), PayloadType: outbox.PayloadJSON, MessagePrefix: "outbox",
				Headers: []outbox.Header{{Key: "tenant", Value: b("acme")}},
				XID:     xid1, CommitLSN: lsn1, CommitTime: t1,
			})},
		},
		{
			name: "JSON key and value encodings",
			cfg:  func(c *Config) { c.JSON = connectjson.Options{Key: connectjson.JSON, Value: connectjson.JSON} },
			in:   [][]byte{beginMsg(lsn1, t1, xid1), logicalMsg(true, 1, "outbox", goodEnvelope)},
			want: []Message{beginStep.want, eventMsg(func() *outbox.Event {
				e := msgEvent(0)
				e.AggregateID, e.Payload = b(`"42"`), b(`"{\"total\": 10}"`)
				return e
			}())},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := messageConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			d, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if tt.table {
				if _, err := d.Decode(relationStep.in); err != nil {
					t.Fatal(err)
				}
			}
			for i, in := range tt.in {
				got, err := d.Decode(in)
				if err != nil {
					t.Fatalf("input %d: %v", i, err)
				}
				if got.Failed != nil {
					t.Fatalf("input %d: failed: %v", i, got.Failed)
				}
				if !equalMsg(got, tt.want[i]) {
					t.Errorf("input %d:\n got %s\nwant %s", i, fmtMsg(got), fmtMsg(tt.want[i]))
				}
			}
		})
	}
}

// TestBadMessages: content that is not a valid envelope is an event that
// failed with bad_message, whose payload is the raw content and whose error
// names what is wrong; the decoder goes on with the next message.
func TestBadMessages(t *testing.T) {
	tests := []struct {
		name, content, wantErr string
		wantID                 string // what of the id could be read
	}{
		{"not JSON", `not json`, "not a JSON object", ""},
		{"an array", `[1]`, "not a JSON object", ""},
		{"JSON null", `null`, "not a JSON object", ""},
		{"empty", ``, "not a JSON object", ""},
		{"missing id", `{"aggregate_type":"a","aggregate_id":"k","event_type":"E","payload":1}`, "message content: missing id", ""},
		{"empty id", `{"id":"","aggregate_type":"a","aggregate_id":"k","event_type":"E","payload":1}`, "id is empty", ""},
		{"missing aggregate_id", `{"id":"x","aggregate_type":"a","event_type":"E","payload":1}`, "message content: missing aggregate_id", "x"},
		{"numeric aggregate_id", `{"id":"x","aggregate_type":"a","aggregate_id":42,"event_type":"E","payload":1}`, "aggregate_id is not a string", "x"},
		{"missing event_type", `{"id":"x","aggregate_type":"a","aggregate_id":"k","payload":1}`, "missing event_type", "x"},
		{"missing payload", `{"id":"x","aggregate_type":"a","aggregate_id":"k","event_type":"E"}`, "missing payload (or payload_base64)", "x"},
		{"both payloads", `{"id":"x","aggregate_type":"a","aggregate_id":"k","event_type":"E","payload":1,"payload_base64":"AA=="}`, "both payload and payload_base64", "x"},
		{"bad base64", `{"id":"x","aggregate_type":"a","aggregate_id":"k","event_type":"E","payload_base64":"!!"}`, "payload_base64 is not base64", "x"},
		{"header not a string", `{"id":"x","aggregate_type":"a","aggregate_id":"k","event_type":"E","payload":1,"headers":{"n":1}}`, "headers is not an object of string values", "x"},
		{"reserved header", `{"id":"x","aggregate_type":"a","aggregate_id":"k","event_type":"E","payload":1,"headers":{"commit_lsn":"1"}}`, `header "commit_lsn" is set by the relay`, "x"},
		{"binary garbage", "\xff\x00\xfe", "not a JSON object", ""},
	}
	d, err := New(messageConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Decode(beginMsg(lsn1, t1, xid1)); err != nil {
		t.Fatal(err)
	}
	for i, tt := range tests {
		got, err := d.Decode(logicalMsg(true, 1, "outbox", tt.content))
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		var ee *outbox.EventError
		if got.Kind != KindEvent || !errors.As(got.Failed, &ee) || ee.Code != CodeBadMessage || sink.Code(got.Failed) != "bad_message" {
			t.Errorf("%s: got %s, failed %v; want an event failed with bad_message", tt.name, fmtMsg(got), got.Failed)
			continue
		}
		if !strings.Contains(got.Failed.Error(), tt.wantErr) {
			t.Errorf("%s: error %q, want it to say %q", tt.name, got.Failed, tt.wantErr)
		}
		ev := got.Event
		if string(ev.Payload) != tt.content || ev.Payload == nil || ev.MessagePrefix != "outbox" || ev.Index != uint32(i) || ev.CommitLSN != lsn1 {
			t.Errorf("%s: event %s prefix %q; want the raw content, prefix outbox, index %d", tt.name, fmtMsg(got), ev.MessagePrefix, i)
		}
		if string(ev.ID) != tt.wantID {
			t.Errorf("%s: id %q, want %q", tt.name, ev.ID, tt.wantID)
		}
	}
	// The stream goes on: a valid message after them is an event.
	if got, err := d.Decode(logicalMsg(true, 1, "outbox", goodEnvelope)); err != nil || got.Failed != nil || got.Event == nil || string(got.Event.ID) != "e-1" {
		t.Fatalf("valid message after bad ones: %s, %v, %v", fmtMsg(got), got.Failed, err)
	}
}

// TestMessageStreamErrors: a malformed 'M' message, or a transactional one
// outside a transaction, breaks the stream as any malformed message does.
func TestMessageStreamErrors(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		wantErr string
	}{
		{"length beyond the content", enc{'M'}.u8(1).u64(1).str("outbox").u32(10).raw([]byte("{}")), "content length 10"},
		{"truncated header", enc{'M'}.u8(1).u64(1), "truncated"},
		{"outside a transaction", logicalMsg(true, 1, "outbox", goodEnvelope), "outside a transaction"},
	}
	for _, tt := range tests {
		d, err := New(messageConfig())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Decode(tt.in); err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "logical decoding") {
			t.Errorf("%s: error %v, want one naming the logical decoding message and %q", tt.name, err, tt.wantErr)
		}
	}
}

// TestReservedMessageHeadersAreTheSinks: the headers a message cannot set
// are those the sink sets.
func TestReservedMessageHeadersAreTheSinks(t *testing.T) {
	for _, h := range []string{sink.HeaderID, sink.HeaderEventType, sink.HeaderAggregateType, sink.HeaderCommitLSN, sink.HeaderCommitTime,
		sink.HeaderSource, sink.HeaderCESpecVersion, sink.HeaderCEID, sink.HeaderCESource, sink.HeaderCEType, sink.HeaderCETime, outbox.HeaderContentType} {
		if !reservedMessageHeader(h) {
			t.Errorf("header %q is the relay's but a message may set it", h)
		}
	}
	for _, h := range []string{"tenant", outbox.HeaderTraceParent, outbox.HeaderTraceState} {
		if reservedMessageHeader(h) {
			t.Errorf("header %q is reserved", h)
		}
	}
}

// TestNewMessageOutbox: the table may be empty with a message prefix only.
func TestNewMessageOutbox(t *testing.T) {
	if _, err := New(messageConfig()); err != nil {
		t.Errorf("message outbox without a table: %v", err)
	}
	if _, err := New(Config{Columns: DefaultColumns()}); err == nil || !strings.Contains(err.Error(), "outbox table is empty") {
		t.Errorf("neither table nor prefix: %v, want one asking for a table", err)
	}
}

// BenchmarkDecodeMessage decodes one message of the message outbox with a
// typical payload (~300 bytes), as outbox_emit writes it.
func BenchmarkDecodeMessage(b *testing.B) {
	d, err := New(messageConfig())
	if err != nil {
		b.Fatal(err)
	}
	if _, err := d.Decode(beginMsg(lsn1, t1, xid1)); err != nil {
		b.Fatal(err)
	}
	content := `{"id": "0b6b6c1e-7d5f-4a53-9f4e-3f0d2f8a9c11", "payload": {"agg": 42, "pad": "` + strings.Repeat("x", 260) +
		`", "seq": 7}, "event_type": "OrderPlaced", "aggregate_id": "agg-42", "aggregate_type": "order"}`
	in := logicalMsg(true, lsn1-8, "outbox", content)
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		m, err := d.Decode(in)
		if err != nil || m.Failed != nil {
			b.Fatal(err, m.Failed)
		}
	}
}
