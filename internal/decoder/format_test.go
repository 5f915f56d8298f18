package decoder

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/connectjson"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

const (
	tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ts = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
)

func TestDecodeBytea(t *testing.T) {
	tests := []struct {
		name, in string
		want     []byte
		wantErr  string
	}{
		{"hex", `\x00ff10Ab`, []byte{0, 0xff, 0x10, 0xab}, ""},
		{"hex empty", `\x`, []byte{}, ""},
		{"hex with spaces", `\x00 ff`, []byte{0, 0xff}, ""},
		{"hex odd", `\x0`, nil, "odd number"},
		{"hex bad digit", `\x0g`, nil, "invalid hex digit"},
		{"escape printable", `abc`, []byte("abc"), ""},
		{"escape octal and backslash", `a\000\\\377z`, []byte{'a', 0, '\\', 0xff, 'z'}, ""},
		{"escape empty", ``, []byte{}, ""},
		{"escape lone backslash", `ab\`, nil, "invalid escape"},
		{"escape bad octal", `\400`, nil, "invalid escape"},
		{"escape short octal", `\12`, nil, "invalid escape"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeBytea([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("DecodeBytea(%q) = %x, %v; want error containing %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tt.want) || got == nil {
				t.Fatalf("DecodeBytea(%q) = %x, %v; want %x", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestParseTraceContext(t *testing.T) {
	tests := []struct {
		name, in      string
		parent, state string // "" state: none
		wantErr       string
	}{
		{"traceparent", tp, tp, "", ""},
		{"traceparent with spaces", " " + tp + "\n", tp, "", ""},
		{"future version with more fields", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz", "", ""},
		{"properties", "traceparent=" + tp + "\ntracestate=" + ts + "\n", tp, ts, ""},
		{"properties as Java stores them", "#Mon Jun 03 10:00:00 UTC 2024\r\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61rcWkgMzE\r\ntraceparent=" + tp + "\r\n", tp, ts, ""},
		{"properties without tracestate", "traceparent: " + tp, tp, "", ""},
		{"properties unicode escape", "traceparent=" + tp + "\ntracestate=a\\u003db", tp, "a=b", ""},
		{"empty", "", "", "", "not a W3C traceparent"},
		{"garbage", "hello", "", "", "not a W3C traceparent"},
		{"upper-case hex", strings.ToUpper(tp), "", "", "not a W3C traceparent"},
		{"zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "", "", "not a W3C traceparent"},
		{"zero parent id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "", "", "not a W3C traceparent"},
		{"version ff", "ff" + tp[2:], "", "", "not a W3C traceparent"},
		{"version 00 too long", tp + "-00", "", "", "not a W3C traceparent"},
		{"short trace id", "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", "", "", "not a W3C traceparent"},
		{"properties without traceparent", "tracestate=" + ts, "", "", "no traceparent"},
		{"properties bad traceparent", "traceparent=00-xyz", "", "", "not a W3C traceparent"},
		{"properties bad tracestate", "traceparent=" + tp + "\ntracestate=a\\u0001b", "", "", "tracestate"},
		{"properties bad escape", "traceparent=" + tp + "\ntracestate=a\\u00", "", "", "escape"},
		{"properties line without value", "traceparent=" + tp + "\nnothing", "", "", "no key=value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent, state, err := ParseTraceContext([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseTraceContext(%q) = %q, %q, %v; want error containing %q", tt.in, parent, state, err, tt.wantErr)
				}
				return
			}
			if err != nil || string(parent) != tt.parent || string(state) != tt.state || (tt.state == "") != (state == nil) {
				t.Fatalf("ParseTraceContext(%q) = %q, %q, %v; want %q, %q", tt.in, parent, state, err, tt.parent, tt.state)
			}
		})
	}
}

func TestCheckContentType(t *testing.T) {
	for _, ok := range []string{"", "auto", "none", "application/json", "application/vnd.apache.avro+binary", "application/x-protobuf; messageType=foo.Bar"} {
		if err := CheckContentType(ok); err != nil {
			t.Errorf("CheckContentType(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"json", "application/", "/json", "text plain/x", "application/json\r\nx: y", "Auto"} {
		if err := CheckContentType(bad); err == nil {
			t.Errorf("CheckContentType(%q) = nil, want an error", bad)
		}
	}
}

// typedColumn is one column of a Relation message with its type OID.
type typedColumn struct {
	name string
	oid  uint32
}

// typedRelationMsg announces the outbox table with the given column types.
func typedRelationMsg(id uint32, cols ...typedColumn) []byte {
	e := enc{'R'}.u32(id).str("public").str("outbox_events").u8('d').u16(uint16(len(cols)))
	for _, c := range cols {
		e = e.u8(0).str(c.name).u32(c.oid).u32(0xffffffff)
	}
	return e
}

const (
	oidText = 25
	oidUUID = 2950
)

// formatColumns is an outbox table with typed payload and key columns, a
// header column and the tracing column.
func formatColumns(payload, key uint32) []typedColumn {
	return []typedColumn{{"id", oidUUID}, {"aggregate_type", oidText}, {"aggregate_id", key}, {"event_type", oidText},
		{"payload", payload}, {"correlation_id", oidText}, {DefaultTracingColumn, oidText}}
}

func TestFormats(t *testing.T) {
	withTracing := func(ct string, headers map[string]string) Config {
		c := defaultConfig()
		c.ContentType, c.TracingColumn, c.HeaderColumns = ct, DefaultTracingColumn, headers
		return c
	}
	type hdrs = []outbox.Header
	h := func(kv ...string) hdrs {
		var out hdrs
		for i := 0; i < len(kv); i += 2 {
			out = append(out, outbox.Header{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return out
	}
	tests := []struct {
		name             string
		cfg              Config
		payloadT, keyT   uint32
		key, payload     col
		corr, trace      col
		wantKey, wantPay []byte
		wantHeaders      hdrs
		badTrace         bool
		wantErr          string
	}{
		{name: "bytea payload hex", cfg: withTracing("auto", nil), payloadT: TypeBytea, keyT: oidText,
			key: txt("k"), payload: txt(`\x00010203ff`), corr: null, trace: null,
			wantKey: b("k"), wantPay: []byte{0, 1, 2, 3, 0xff}},
		{name: "bytea payload escape", cfg: withTracing("auto", nil), payloadT: TypeBytea, keyT: oidText,
			key: txt("k"), payload: txt(`a\000\\`), corr: null, trace: null,
			wantKey: b("k"), wantPay: []byte{'a', 0, '\\'}},
		{name: "bytea payload empty", cfg: withTracing("auto", nil), payloadT: TypeBytea, keyT: oidText,
			key: txt("k"), payload: txt(`\x`), corr: null, trace: null,
			wantKey: b("k"), wantPay: []byte{}},
		{name: "bytea payload NULL", cfg: withTracing("auto", nil), payloadT: TypeBytea, keyT: oidText,
			key: txt("k"), payload: null, corr: null, trace: null,
			wantKey: b("k"), wantPay: nil},
		{name: "bytea key", cfg: withTracing("auto", nil), payloadT: TypeBytea, keyT: TypeBytea,
			key: txt(`\xcafe`), payload: txt(`\x01`), corr: null, trace: null,
			wantKey: []byte{0xca, 0xfe}, wantPay: []byte{1}},
		{name: "bytea key also a header column", cfg: withTracing("none", map[string]string{"aggregate_id": "agg"}),
			payloadT: oidText, keyT: TypeBytea, key: txt(`\xcafe`), payload: txt("p"), corr: null, trace: null,
			wantKey: []byte{0xca, 0xfe}, wantPay: b("p"), wantHeaders: h("agg", `\xcafe`)},
		{name: "bytea payload bad hex", cfg: withTracing("auto", nil), payloadT: TypeBytea, keyT: oidText,
			key: txt("k"), payload: txt(`\xzz`), corr: null, trace: null, wantErr: "payload column: decode bytea hex"},
		{name: "text payload stays text", cfg: withTracing("auto", nil), payloadT: oidText, keyT: oidText,
			key: txt("k"), payload: txt(`\x00`), corr: null, trace: null, wantKey: b("k"), wantPay: b(`\x00`)},
		{name: "jsonb auto", cfg: withTracing("auto", nil), payloadT: TypeJSONB, keyT: oidText,
			key: txt("k"), payload: txt(`{}`), corr: null, trace: null, wantKey: b("k"), wantPay: b(`{}`),
			wantHeaders: h("content-type", "application/json")},
		{name: "json auto", cfg: withTracing("auto", nil), payloadT: TypeJSON, keyT: oidText,
			key: txt("k"), payload: txt(`{}`), corr: null, trace: null, wantKey: b("k"), wantPay: b(`{}`),
			wantHeaders: h("content-type", "application/json")},
		{name: "jsonb none", cfg: withTracing("none", nil), payloadT: TypeJSONB, keyT: oidText,
			key: txt("k"), payload: txt(`{}`), corr: null, trace: null, wantKey: b("k"), wantPay: b(`{}`)},
		{name: "bytea explicit", cfg: withTracing("application/x-protobuf", nil), payloadT: TypeBytea, keyT: oidText,
			key: txt("k"), payload: txt(`\x08`), corr: null, trace: null, wantKey: b("k"), wantPay: []byte{8},
			wantHeaders: h("content-type", "application/x-protobuf")},
		{name: "traceparent after header columns", cfg: withTracing("auto", map[string]string{"correlation_id": "correlation_id"}),
			payloadT: TypeJSONB, keyT: oidText, key: txt("k"), payload: txt(`{}`), corr: txt("c-1"), trace: txt(tp),
			wantKey: b("k"), wantPay: b(`{}`),
			wantHeaders: h("correlation_id", "c-1", "content-type", "application/json", "traceparent", tp)},
		{name: "debezium properties", cfg: withTracing("none", nil), payloadT: oidText, keyT: oidText,
			key: txt("k"), payload: txt("p"), corr: null, trace: txt("traceparent=" + tp + "\ntracestate=" + ts),
			wantKey: b("k"), wantPay: b("p"), wantHeaders: h("traceparent", tp, "tracestate", ts)},
		{name: "malformed trace still publishes", cfg: withTracing("none", nil), payloadT: oidText, keyT: oidText,
			key: txt("k"), payload: txt("p"), corr: null, trace: txt("not-a-trace"),
			wantKey: b("k"), wantPay: b("p"), badTrace: true},
		{name: "tracing column ignored when not configured", cfg: defaultConfig(), payloadT: oidText, keyT: oidText,
			key: txt("k"), payload: txt("p"), corr: null, trace: txt(tp), wantKey: b("k"), wantPay: b("p")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := New(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, in := range [][]byte{typedRelationMsg(outboxID, formatColumns(tt.payloadT, tt.keyT)...), beginStep.in} {
				if _, err := d.Decode(in); err != nil {
					t.Fatal(err)
				}
			}
			m, err := d.Decode(insertMsg(outboxID, txt("e1"), txt("order"), tt.key, txt("OrderPlaced"), tt.payload, tt.corr, tt.trace))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Decode: %s, %v; want error containing %q", fmtMsg(m), err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := &outbox.Event{ID: b("e1"), AggregateType: b("order"), AggregateID: tt.wantKey, EventType: b("OrderPlaced"),
				Payload: tt.wantPay, Headers: tt.wantHeaders, XID: xid1, CommitLSN: lsn1, CommitTime: t1}
			switch tt.payloadT { // what the payload is, by its column's type
			case TypeBytea:
				want.PayloadType = outbox.PayloadBinary
			case TypeJSON, TypeJSONB:
				want.PayloadType = outbox.PayloadJSON
			}
			got := m
			got.BadTrace = nil
			if !equalMsg(got, eventMsg(want)) {
				t.Fatalf("Decode\n got %s\nwant %s", fmtMsg(m), fmtMsg(eventMsg(want)))
			}
			if (m.BadTrace != nil) != tt.badTrace {
				t.Fatalf("BadTrace = %v, want set: %v", m.BadTrace, tt.badTrace)
			}
		})
	}
}

func TestNewRefusesReservedHeaders(t *testing.T) {
	for _, key := range []string{"content-type", "traceparent", "tracestate"} {
		cfg := withHeaders(map[string]string{"correlation_id": key})
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "set by the relay itself") {
			t.Errorf("New with header column mapped to %q: %v, want a reserved-header error", key, err)
		}
	}
	cfg := defaultConfig()
	cfg.ContentType = "json"
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "ContentType") {
		t.Errorf("New with content type %q: %v, want an error naming ContentType", cfg.ContentType, err)
	}
}

// TestBytePayloadAllocations: decoding a bytea payload in place costs no
// allocation beyond those of a text payload.
func TestBytePayloadAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	cfg := defaultConfig()
	cfg.TracingColumn, cfg.ContentType = DefaultTracingColumn, "application/x-protobuf"
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range [][]byte{typedRelationMsg(outboxID, formatColumns(TypeBytea, oidText)...), beginStep.in} {
		if _, err := d.Decode(in); err != nil {
			t.Fatal(err)
		}
	}
	in := insertMsg(outboxID, txt("e1"), txt("order"), txt("k"), txt("OrderPlaced"), txt(`\x0a0b0c`), null, txt(tp))
	got := testing.AllocsPerRun(100, func() {
		if _, err := d.Decode(in); err != nil {
			t.Fatal(err)
		}
	})
	if got != 2 {
		t.Fatalf("Decode of a bytea insert with trace headers: %v allocations, want 2", got)
	}
}

// TestParseTimestamp reads --column-timestamp values in the text forms
// Postgres sends them with DateStyle ISO.
func TestParseTimestamp(t *testing.T) {
	want := time.Date(2021, 3, 4, 3, 6, 7, 891e6, time.UTC)
	for _, tc := range []struct {
		typ     uint32
		text    string
		want    time.Time
		wantErr bool
	}{
		{TypeTimestampTZ, "2021-03-04 03:06:07.891+00", want, false},
		{TypeTimestampTZ, "2021-03-04 08:36:07.891+05:30", want, false},
		{TypeTimestampTZ, "2021-03-04 03:06:07.891-00:00:00", want, false},
		{TypeTimestampTZ, "2021-03-04 03:06:07+00", want.Truncate(time.Second), false},
		{TypeTimestampTZ, "infinity", time.Time{}, false},
		{TypeTimestampTZ, "Thu Mar 04 03:06:07.891 2021 UTC", time.Time{}, true},
		{TypeTimestamp, "2021-03-04 03:06:07.891", want, false},
		{TypeTimestamp, "-infinity", time.Time{}, false},
		{TypeTimestamp, "04/03/2021", time.Time{}, true},
		{TypeInt8, "1614827167891", want, false},
		{TypeInt4, "-1000", time.UnixMilli(-1000).UTC(), false},
		{TypeInt8, "12x", time.Time{}, true},
	} {
		got, err := ParseTimestamp(tc.typ, []byte(tc.text))
		if (err != nil) != tc.wantErr || !got.Equal(tc.want) {
			t.Errorf("ParseTimestamp(%d, %q) = %s, %v; want %s, error %v", tc.typ, tc.text, got, err, tc.want, tc.wantErr)
		}
	}
	if err := CheckTimestampType(25); err == nil {
		t.Error("CheckTimestampType(text) = nil, want an error")
	}
}

// TestTimestampColumnErrors: a --column-timestamp column the table lacks, or
// of a type the relay cannot read as a time, is a configuration error naming
// the setting.
func TestTimestampColumnErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		columns []string
		want    string
	}{
		{"missing", outboxColumns, `has no timestamp column "occurred_at"`},
		{"text type", append(slices.Clone(outboxColumns), "occurred_at"), `timestamp column "occurred_at" has type OID 25; want timestamptz, timestamp or bigint`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := defaultConfig()
			cfg.TimestampColumn = "occurred_at"
			d, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = d.Decode(relationMsg(outboxID, "public", "outbox_events", tc.columns...))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "(setting "+fieldTimestamp+")") {
				t.Fatalf("error %v, want one containing %q and naming the setting", err, tc.want)
			}
		})
	}
}

// TestPartitionColumn: --column-partition reads an integer column into
// Event.TargetPartition (NULL: none), and a column the table lacks or of
// another type is a configuration error naming the setting.
func TestPartitionColumn(t *testing.T) {
	for _, tc := range []struct {
		name    string
		columns []string
		want    string
	}{
		{"missing", outboxColumns, `has no partition column "kafka_partition"`},
		{"text type", append(slices.Clone(outboxColumns), "kafka_partition"), `partition column "kafka_partition" has type OID 25; want smallint, integer or bigint`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := defaultConfig()
			cfg.PartitionColumn = "kafka_partition"
			d, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = d.Decode(relationMsg(outboxID, "public", "outbox_events", tc.columns...))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "(setting "+fieldPartition+")") {
				t.Fatalf("error %v, want one containing %q and naming the setting", err, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		text    string
		want    int64
		wantErr bool
	}{{"3", 3, false}, {"-1", -1, false}, {"9223372036854775807", 1<<63 - 1, false}, {"1.5", 0, true}} {
		got, err := ParsePartition([]byte(tc.text))
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("ParsePartition(%q) = %d, %v; want %d, error %v", tc.text, got, err, tc.want, tc.wantErr)
		}
	}
}

func BenchmarkParseTimestamp(b *testing.B) {
	text := []byte("2021-03-04 08:36:07.891234+05:30")
	for b.Loop() {
		if _, err := ParseTimestamp(TypeTimestampTZ, text); err != nil {
			b.Fatal(err)
		}
	}
}

// TestCreatedAtAndJSON: the created-at column is read into Event.CreatedAt
// when it has a time type (and ignored otherwise, or when absent), and a JSON
// encoding rewrites the key and value with the Relation's types and the
// NOT NULL columns SetNotNull names.
func TestCreatedAtAndJSON(t *testing.T) {
	commit := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	created := time.Date(2024, 1, 2, 3, 4, 4, 500e6, time.UTC)
	cols := []typedColumn{{"id", oidUUID}, {"aggregate_type", oidText}, {"aggregate_id", oidText}, {"event_type", oidText},
		{"payload", TypeJSONB}, {"created_at", TypeTimestampTZ}}
	row := []col{txt("0b0e3a8e-8f7c-4a55-9d5c-5b5cf0d7a001"), txt("order"), txt("o-1"), txt("Placed"), txt(`{"a": 1}`), txt("2024-01-02 04:04:04.5+01")}
	tests := []struct {
		name        string
		cfg         func(*Config)
		cols        []typedColumn
		notNull     map[string]bool
		wantCreated time.Time
		wantKey     string
		wantValue   string
	}{
		{name: "created at read", cfg: func(c *Config) { c.CreatedAtColumn = "created_at" }, cols: cols,
			wantCreated: created, wantKey: "o-1", wantValue: `{"a": 1}`},
		{name: "created at not configured", cfg: func(*Config) {}, cols: cols, wantKey: "o-1", wantValue: `{"a": 1}`},
		{name: "created at of another type ignored", cfg: func(c *Config) { c.CreatedAtColumn = "created_at" },
			cols: append(slices.Clone(cols[:5]), typedColumn{"created_at", oidText}), wantKey: "o-1", wantValue: `{"a": 1}`},
		{name: "json with schema, not null key", cfg: func(c *Config) {
			c.JSON = connectjson.Options{Key: connectjson.JSONWithSchema, Value: connectjson.JSON, ExpandPayload: true}
		}, cols: cols, notNull: map[string]bool{"aggregate_id": true},
			wantKey: `{"schema":{"type":"string","optional":false},"payload":"o-1"}`, wantValue: `{"a":1}`},
		{name: "json with schema, nullable key", cfg: func(c *Config) {
			c.JSON = connectjson.Options{Key: connectjson.JSONWithSchema, Value: connectjson.JSONWithSchema}
		}, cols: cols,
			wantKey:   `{"schema":{"type":"string","optional":true},"payload":"o-1"}`,
			wantValue: `{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"{\"a\": 1}"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := defaultConfig()
			tc.cfg(&cfg)
			d, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			d.SetNotNull(tc.notNull)
			for _, m := range [][]byte{typedRelationMsg(outboxID, tc.cols...), beginMsg(0x100, commit, 7)} {
				if _, err := d.Decode(m); err != nil {
					t.Fatal(err)
				}
			}
			msg, err := d.Decode(insertMsg(outboxID, row[:len(tc.cols)]...))
			if err != nil {
				t.Fatal(err)
			}
			ev := msg.Event
			if !ev.CreatedAt.Equal(tc.wantCreated) {
				t.Errorf("CreatedAt = %s, want %s", ev.CreatedAt, tc.wantCreated)
			}
			if string(ev.AggregateID) != tc.wantKey || string(ev.Payload) != tc.wantValue {
				t.Errorf("key %s value %s, want %s and %s", ev.AggregateID, ev.Payload, tc.wantKey, tc.wantValue)
			}
		})
	}
}
