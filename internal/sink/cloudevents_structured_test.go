package sink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/testenv/cetest"
)

const testSource = "/cdc-relay/app/public.outbox_events"

var structuredCfg = Config{CloudEventsSource: testSource, CloudEventsMode: CloudEventsStructured}

const testTraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// TestStructuredRecords encodes events of every payload type in the
// structured content mode and checks each record: the value is a JSON
// CloudEvent (read back by the CloudEvents Go SDK where it follows the JSON
// format's rules, validated, and member by member with encoding/json) whose
// data follows the JSON event format's rules, and the headers are the native
// ones with the JSON format's content-type instead of the event's and no ce_
// header.
func TestStructuredRecords(t *testing.T) {
	jsonCT := outbox.Header{Key: outbox.HeaderContentType, Value: []byte("application/json")}
	text := "a \"quoted\" back\\slash,\nnew line, tab\t, bell \x07, </script> & emoji 🦀, ünïcode"
	tests := []struct {
		name    string
		typ     outbox.PayloadType
		payload []byte
		headers []outbox.Header
		noTime  bool
		id      string
		// want: the data member ("data" or "data_base64") and its JSON, or
		// none; datacontenttype ("" for none).
		member, data, dct string
		// sdkData is what the SDK's Event.Data gives; skipSDK when the SDK
		// departs from the JSON format (it takes only application/json and
		// text/json for JSON).
		sdkData string
		skipSDK bool
	}{
		{name: "jsonb with application/json", typ: outbox.PayloadJSON, payload: []byte(`{"total": 7, "items": [1, 2]}`), headers: []outbox.Header{jsonCT},
			member: "data", data: `{"total": 7, "items": [1, 2]}`, dct: "application/json", sdkData: `{"total": 7, "items": [1, 2]}`},
		{name: "jsonb without content type is JSON", typ: outbox.PayloadJSON, payload: []byte(`[1,"x",null]`),
			member: "data", data: `[1,"x",null]`, sdkData: `[1,"x",null]`},
		{name: "jsonb scalar", typ: outbox.PayloadJSON, payload: []byte(`"just a string"`), headers: []outbox.Header{jsonCT},
			member: "data", data: `"just a string"`, dct: "application/json", sdkData: `"just a string"`},
		{name: "bytea in base64", typ: outbox.PayloadBinary, payload: []byte{0, 1, 0xfe, 0xff, '"'},
			member: "data_base64", data: `"AAH+/yI="`, sdkData: "\x00\x01\xfe\xff\""},
		{name: "bytea with its content type", typ: outbox.PayloadBinary, payload: []byte{0, 0, 0, 0, 42, 2, 'h', 'i'},
			headers: []outbox.Header{{Key: outbox.HeaderContentType, Value: []byte("application/vnd.apache.avro+binary")}},
			member:  "data_base64", data: `"AAAAACoCaGk="`, dct: "application/vnd.apache.avro+binary", sdkData: "\x00\x00\x00\x00\x2a\x02hi"},
		{name: "bytea that says JSON stays binary", typ: outbox.PayloadBinary, payload: []byte(`{"a":1}`), headers: []outbox.Header{jsonCT},
			member: "data_base64", data: `"eyJhIjoxfQ=="`, dct: "application/json", sdkData: `{"a":1}`},
		{name: "text without content type is a JSON string", typ: outbox.PayloadText, payload: []byte(text),
			member: "data", data: jsonQuote(t, text), sdkData: jsonQuote(t, text)},
		{name: "text as XML", typ: outbox.PayloadText, payload: []byte(`<much wow="xml"/>`),
			headers: []outbox.Header{{Key: outbox.HeaderContentType, Value: []byte("application/xml")}},
			member:  "data", data: `"<much wow=\"xml\"/>"`, dct: "application/xml", sdkData: `<much wow="xml"/>`},
		{name: "text that --content-type calls JSON", typ: outbox.PayloadText, payload: []byte(`{"from":"varchar"}`), headers: []outbox.Header{jsonCT},
			member: "data", data: `{"from":"varchar"}`, dct: "application/json", sdkData: `{"from":"varchar"}`},
		{name: "text with a +json type", typ: outbox.PayloadText, payload: []byte(`{"v":2}`),
			headers: []outbox.Header{{Key: outbox.HeaderContentType, Value: []byte("application/vnd.acme.order+json; charset=utf-8")}},
			member:  "data", data: `{"v":2}`, dct: "application/vnd.acme.order+json; charset=utf-8", skipSDK: true},
		{name: "jsonb labelled text/plain is a string", typ: outbox.PayloadJSON, payload: []byte(`{"a": 1}`),
			headers: []outbox.Header{{Key: outbox.HeaderContentType, Value: []byte("text/plain")}},
			member:  "data", data: `"{\"a\": 1}"`, dct: "text/plain", sdkData: `{"a": 1}`},
		{name: "text that is not UTF-8 goes in base64", typ: outbox.PayloadText, payload: []byte("caf\xe9"),
			member: "data_base64", data: `"Y2Fm6Q=="`, sdkData: "caf\xe9"},
		{name: "NULL payload: no data", typ: outbox.PayloadJSON, payload: nil, headers: []outbox.Header{jsonCT}, dct: "application/json"},
		{name: "empty payload: no data", typ: outbox.PayloadText, payload: []byte{}},
		{name: "trace context as the distributed tracing extension", typ: outbox.PayloadJSON, payload: []byte(`{}`),
			headers: []outbox.Header{jsonCT, {Key: outbox.HeaderTraceParent, Value: []byte(testTraceParent)}, {Key: outbox.HeaderTraceState, Value: []byte("rojo=00f067aa0ba902b7")}},
			member:  "data", data: `{}`, dct: "application/json", sdkData: `{}`},
		{name: "unknown commit time: no time", typ: outbox.PayloadJSON, payload: []byte(`{}`), noTime: true,
			member: "data", data: `{}`, sdkData: `{}`},
		{name: "id and type escaped", id: `evt "1" \ ü`, typ: outbox.PayloadJSON, payload: []byte(`1`),
			member: "data", data: `1`, sdkData: `1`},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := testEvent("agg-1", i, uint64(i))
			if tc.id != "" {
				ev.ID, ev.EventType = []byte(tc.id), []byte("type "+tc.id)
			}
			origin := outbox.NewOrigin("7312345678901234567", 1, "cdc_relay")
			ev.Index = uint32(i)
			ev.Payload, ev.PayloadType = tc.payload, tc.typ
			ev.Headers = append([]outbox.Header{{Key: "tenant", Value: []byte("acme")}}, tc.headers...)
			if tc.noTime {
				ev.CommitTime = time.Time{}
			}
			r := encodeOne(t, structuredCfg, Message{Event: ev, Origin: origin})

			// Headers: the native ones, the event's but content-type, and the
			// JSON format's content-type, once.
			want := []kmsg.Header{
				{Key: HeaderID, Value: ev.ID},
				{Key: HeaderEventType, Value: ev.EventType},
				{Key: HeaderAggregateType, Value: ev.AggregateType},
				{Key: HeaderCommitLSN, Value: []byte(ev.CommitLSN.String())},
				{Key: HeaderCommitTime, Value: []byte(ev.CommitTime.UTC().Format(time.RFC3339Nano))},
				{Key: HeaderSource, Value: origin.AppendPosition(nil, ev.CommitLSN, ev.Index)},
			}
			for _, h := range ev.Headers {
				if h.Key != outbox.HeaderContentType {
					want = append(want, kmsg.Header{Key: h.Key, Value: h.Value})
				}
			}
			want = append(want, kmsg.Header{Key: outbox.HeaderContentType, Value: []byte(ContentTypeCloudEventsJSON)})
			if got, want := fmt.Sprintf("%q", r.Headers), fmt.Sprintf("%q", want); got != want {
				t.Errorf("headers\n got %s\nwant %s", got, want)
			}
			if !bytes.Equal(r.Key, ev.AggregateID) {
				t.Errorf("key %q, want the aggregate id %q", r.Key, ev.AggregateID)
			}

			// The value, member by member.
			if !json.Valid(r.Value) {
				t.Fatalf("value is not JSON: %s", r.Value)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(r.Value, &m); err != nil {
				t.Fatal(err)
			}
			str := func(k string) string {
				var s string
				if raw, ok := m[k]; ok {
					if err := json.Unmarshal(raw, &s); err != nil {
						t.Errorf("member %s = %s: %v", k, raw, err)
					}
				}
				return s
			}
			wantTime := ""
			if !tc.noTime {
				wantTime = ev.CommitTime.UTC().Format(time.RFC3339Nano)
			}
			for k, v := range map[string]string{"specversion": "1.0", "id": string(ev.ID), "source": testSource,
				"type": string(ev.EventType), "time": wantTime, "datacontenttype": tc.dct} {
				if got := str(k); got != v {
					t.Errorf("%s = %q, want %q (value %s)", k, got, v, r.Value)
				}
			}
			if got := str("traceparent"); got != string(eventHeader(ev, outbox.HeaderTraceParent)) {
				t.Errorf("traceparent = %q, want the trace header's %q", got, eventHeader(ev, outbox.HeaderTraceParent))
			}
			for _, member := range []string{"data", "data_base64"} {
				raw, ok := m[member]
				switch {
				case member != tc.member && ok:
					t.Errorf("member %s = %s, want none (value %s)", member, raw, r.Value)
				case member == tc.member && string(raw) != tc.data:
					t.Errorf("member %s = %s, want %s", member, raw, tc.data)
				}
			}
			wantMembers := 4 // specversion, id, source, type
			for _, v := range []string{wantTime, tc.dct, tc.member, string(eventHeader(ev, outbox.HeaderTraceParent)), string(eventHeader(ev, outbox.HeaderTraceState))} {
				if v != "" {
					wantMembers++
				}
			}
			if len(m) != wantMembers {
				t.Errorf("%d members, want %d: %s", len(m), wantMembers, r.Value)
			}

			// The CloudEvents Go SDK reads the record as a receiver would.
			if tc.skipSDK {
				return
			}
			ce, enc, err := cetest.ToEvent(recordOf(r))
			if err != nil {
				t.Fatal(err)
			}
			if enc != binding.EncodingStructured {
				t.Errorf("SDK read the record in %s mode, want structured", enc)
			}
			if ce.ID() != string(ev.ID) || ce.Source() != testSource || ce.Type() != string(ev.EventType) || ce.SpecVersion() != "1.0" {
				t.Errorf("SDK event id %q source %q type %q specversion %q", ce.ID(), ce.Source(), ce.Type(), ce.SpecVersion())
			}
			if !tc.noTime && !ce.Time().Equal(ev.CommitTime) {
				t.Errorf("SDK time %s, want %s", ce.Time(), ev.CommitTime)
			}
			if ce.DataContentType() != tc.dct || ce.DataBase64 != (tc.member == "data_base64") {
				t.Errorf("SDK datacontenttype %q, base64 %v", ce.DataContentType(), ce.DataBase64)
			}
			if string(ce.Data()) != tc.sdkData {
				t.Errorf("SDK data %q, want %q", ce.Data(), tc.sdkData)
			}
			if tp := eventHeader(ev, outbox.HeaderTraceParent); tp != nil {
				ext := ce.Extensions()
				if ext["traceparent"] != string(tp) || ext["tracestate"] != string(eventHeader(ev, outbox.HeaderTraceState)) {
					t.Errorf("SDK extensions %v, want the trace context", ext)
				}
			}
			if tc.typ == outbox.PayloadText && tc.dct == "" && tc.member == "data" {
				// No datacontenttype: the data is a JSON value, here a string
				// holding the text.
				var s string
				if err := ce.DataAs(&s); err != nil || s != string(tc.payload) {
					t.Errorf("SDK DataAs string = %q, %v; want the text", s, err)
				}
			}
		})
	}
}

// encodeOne encodes m as the only record of a batch with cfg's record
// format and decodes it with franz-go.
func encodeOne(t *testing.T, cfg Config, m Message) kmsg.Record {
	t.Helper()
	var e encoder
	e.configure(&cfg)
	raw, err := e.appendBatch(nil, []item{{m: m}}, timesOf([]item{{m: m}}, commitBase.UnixMilli()), noProducer, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, recs := decodeBatch(t, raw)
	return recs[0]
}

// recordOf is r as sandbox.ReadAll returns records.
func recordOf(r kmsg.Record) sandbox.Record {
	rec := sandbox.Record{Key: r.Key, Value: r.Value, Headers: map[string]string{}}
	for _, h := range r.Headers {
		rec.Headers[h.Key] = string(h.Value)
	}
	return rec
}

func jsonQuote(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func TestIsJSONMediaType(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json": true, "Application/JSON": true, "application/json; charset=utf-8": true, " text/json ": true,
		"application/cloudevents+json": true, "application/vnd.acme.order+JSON;v=2": true,
		"application/xjson": false, "application/json-seq": false, "application/xml": false, "json": false,
		"/json": false, "text/plain": false, "application/vnd.apache.avro+binary": false, "": false,
	} {
		if got := isJSONMediaType([]byte(ct)); got != want {
			t.Errorf("isJSONMediaType(%q) = %v, want %v", ct, got, want)
		}
	}
}

// TestCloudEventsStructuredMode produces structured CloudEvents through the
// sink into kfake: every record reads back as a valid CloudEvent, an event
// whose text payload --content-type wrongly calls JSON fails permanently as
// invalid_json (and the others are delivered), and the effectively-once
// reconciliation's Scan still finds each record's id and source position.
func TestCloudEventsStructuredMode(t *testing.T) {
	t.Parallel()
	const topic = "outbox.ce.structured"
	kf := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 2, Topics: []string{topic}})
	origin := outbox.NewOrigin("7312345678901234567", 1, "cdc_relay")
	evs := stream(4, 30)
	origins := map[*outbox.Event]*outbox.Origin{}
	for i, ev := range evs {
		origins[ev], ev.Index = origin, uint32(i)
		ev.PayloadType = outbox.PayloadJSON
		ev.Headers = []outbox.Header{{Key: outbox.HeaderContentType, Value: []byte("application/json")}}
	}
	bad := evs[7]
	bad.PayloadType, bad.Payload = outbox.PayloadText, []byte("not { json")
	var failed []error
	acks := newAckLog(len(evs) - 1)
	done := acks.doneWith(func(ev *outbox.Event, err error) error {
		if ev != bad {
			t.Errorf("event %s failed: %v", ev.ID, err)
		}
		failed = append(failed, err)
		return nil
	})
	k := openSink(t, Config{Brokers: kf.Brokers(), Topics: []string{topic}, Retry: fastRetry, Logger: zerolog.Nop(),
		CloudEventsSource: testSource, CloudEventsMode: CloudEventsStructured})
	sendFrom(t, k, topic, evs, origins, done)
	acks.wait(t, 30*time.Second)
	var ee *outbox.EventError
	if len(failed) != 1 || !errors.As(failed[0], &ee) || ee.Code != "invalid_json" {
		t.Fatalf("failures %v, want one invalid_json", failed)
	}

	recs := readAll(t, kf, topic)
	if len(recs) != len(evs)-1 {
		t.Fatalf("%d records, want %d", len(recs), len(evs)-1)
	}
	byID := map[string]*outbox.Event{}
	for _, ev := range evs {
		byID[string(ev.ID)] = ev
	}
	for _, r := range recs {
		ce, _, err := cetest.ToEvent(r)
		if err != nil {
			t.Fatal(err)
		}
		ev := byID[ce.ID()]
		if ev == nil || string(ce.Data()) != string(ev.Payload) || r.Headers[HeaderID] != ce.ID() {
			t.Fatalf("record %d: event %q data %q, header id %q", r.Offset, ce.ID(), ce.Data(), r.Headers[HeaderID])
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ranges, err := k.Ranges(ctx, topic, 2)
	if err != nil {
		t.Fatal(err)
	}
	scanned := 0
	for p, rg := range ranges {
		err := k.Scan(ctx, topic, p, rg.Start, rg.End, func(off int64, id, src []byte) error {
			ev := byID[string(id)]
			if ev == nil || string(src) != string(origin.AppendPosition(nil, ev.CommitLSN, ev.Index)) {
				return fmt.Errorf("offset %d: id %q source %q", off, id, src)
			}
			scanned++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if scanned != len(recs) {
		t.Fatalf("Scan reported %d records, want %d", scanned, len(recs))
	}
}

// TestStructuredConfig: structured mode needs a source and refuses
// tombstones.
func TestStructuredConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Brokers: []string{"127.0.0.1:1"}, CloudEventsMode: CloudEventsStructured},
		{Brokers: []string{"127.0.0.1:1"}, CloudEventsMode: CloudEventsStructured, CloudEventsSource: testSource, TombstoneOnEmptyPayload: true},
	} {
		if _, err := Open(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "structured") {
			t.Errorf("Open(%+v) = %v, want an error about structured CloudEvents", cfg, err)
		}
	}
}

// BenchmarkEncodeRecord encodes one record of a ~300-byte jsonb payload (with
// content-type, traceparent and a source position) in each format, and a
// bytea payload of the same size in the structured mode (base64).
func BenchmarkEncodeRecord(b *testing.B) {
	origin := outbox.NewOrigin("7312345678901234567", 1, "cdc_relay")
	ev := paddedEvent("agg-0042", 7, 42, 230)
	ev.Index = 3
	ev.PayloadType = outbox.PayloadJSON
	ev.Headers = []outbox.Header{
		{Key: outbox.HeaderContentType, Value: []byte("application/json")},
		{Key: outbox.HeaderTraceParent, Value: []byte(testTraceParent)},
	}
	bin := *ev
	bin.PayloadType = outbox.PayloadBinary
	bin.Headers = bin.Headers[1:]
	for _, bc := range []struct {
		name string
		cfg  Config
		ev   *outbox.Event
	}{
		{"native", Config{}, ev},
		{"binary", Config{CloudEventsSource: testSource}, ev},
		{"structured", structuredCfg, ev},
		{"structured-bytea", structuredCfg, &bin},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var e encoder
			e.configure(&bc.cfg)
			m := Message{Topic: "outbox.bench", Event: bc.ev, Origin: origin}
			buf := e.appendRecord(nil, 0, 0, m)
			b.SetBytes(int64(len(bc.ev.Payload)))
			b.ReportMetric(float64(len(buf)), "record-bytes")
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				buf = e.appendRecord(buf[:0], i&63, 0, m)
			}
		})
	}
}
