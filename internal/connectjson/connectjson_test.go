package connectjson

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
)

var (
	colID      = Column{Name: "id", Type: oidUUID, Typmod: -1, NotNull: true}
	colKey     = Column{Name: "aggregateid", Type: oidVarchar, Typmod: 259, NotNull: true}
	colPayload = Column{Name: "payload", Type: oidJSONB, Typmod: -1}
	colType    = Column{Name: "type", Type: oidVarchar, Typmod: 259, NotNull: true}
)

// The Event Router documentation's example row (outbox-event-router.adoc,
// "Example outbox message").
const docPayload = `{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}, {"id": 2, "item": "Debezium for Dummies", "status": "ENTERED", "quantity": 1, "totalPrice": 29.99}], "orderDate": "2019-01-31T12:13:01", "customerId": 123}`

func compact(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("compact %s: %v", s, err)
	}
	return b.String()
}

func TestValue(t *testing.T) {
	layout := Layout{Key: colKey, Payload: colPayload, PayloadField: "payload"}
	env := layout
	env.Envelope = []EnvelopeField{{Alias: "type", Column: colType}}
	tests := []struct {
		name   string
		o      Options
		l      Layout
		p      string
		null   bool
		envVal []string
		want   string
		tomb   bool
	}{
		// "Expanding escaped JSON String as JSON": the payload as a JSON string…
		{name: "doc escaped string", o: Options{Value: JSON}, l: layout, p: docPayload,
			want: `"{\"id\": 1, \"lineItems\": [{\"id\": 1, \"item\": \"Debezium in Action\", \"status\": \"ENTERED\", \"quantity\": 2, \"totalPrice\": 39.98}, {\"id\": 2, \"item\": \"Debezium for Dummies\", \"status\": \"ENTERED\", \"quantity\": 1, \"totalPrice\": 29.99}], \"orderDate\": \"2019-01-31T12:13:01\", \"customerId\": 123}"`},
		// …and expanded, the document itself.
		{name: "doc expanded", o: Options{Value: JSON, ExpandPayload: true}, l: layout, p: docPayload,
			want: compact(t, docPayload)},
		{name: "string with schema", o: Options{Value: JSONWithSchema}, l: layout, p: `{"a": 1}`,
			want: `{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"{\"a\": 1}"}`},
		{name: "expanded with schema", o: Options{Value: JSONWithSchema, ExpandPayload: true}, l: layout,
			p:    `{"fullName": "John Doe", "enabled": true, "rating": 4.9, "age": 42, "pets": ["dog", "cat"], "petObjects": [{"type": "dog"}, {"type": "cat"}]}`,
			want: `{"schema":{"type":"struct","fields":[{"type":"string","optional":true,"field":"fullName"},{"type":"boolean","optional":true,"field":"enabled"},{"type":"double","optional":true,"field":"rating"},{"type":"int32","optional":true,"field":"age"},{"type":"array","items":{"type":"string","optional":true},"optional":true,"field":"pets"},{"type":"array","items":{"type":"struct","fields":[{"type":"string","optional":true,"field":"type"}],"optional":true,"name":"payload.petObjects"},"optional":true,"field":"petObjects"}],"optional":true,"name":"payload"},"payload":{"fullName":"John Doe","enabled":true,"rating":4.9,"age":42,"pets":["dog","cat"],"petObjects":[{"type":"dog"},{"type":"cat"}]}}`},
		// EventRouterTest.canExpandJsonWithNestedArraysWhereFirstArrayIsEmpty
		{name: "merged element schemas", o: Options{Value: JSON, ExpandPayload: true}, l: layout,
			p:    `{"fullName": "John Doe", "petObjects": [{"type": "dog", "colors": []}, {"type": "cat", "colors": [{"name": "white"}]}]}`,
			want: `{"fullName":"John Doe","petObjects":[{"type":"dog","colors":[]},{"type":"cat","colors":[{"name":"white"}]}]}`},
		// EventRouterTest.shouldExpandJSONPayloadWithEmptyArrayAndRemoveThatArray
		{name: "empty array dropped", o: Options{Value: JSON, ExpandPayload: true}, l: layout,
			p: `{"fullName": "John Doe", "petObjects": [{"type": "dog", "colors": []}]}`, want: `{"fullName":"John Doe","petObjects":[{"type":"dog"}]}`},
		{name: "empty array as strings", o: Options{Value: JSON, ExpandPayload: true, EmptyArraysAsStrings: true}, l: layout,
			p: `{"a": []}`, want: `{"a":[]}`},
		// EventRouterTest.canExpandJsonArrayWithFirstElementNull
		{name: "array null first", o: Options{Value: JSON, ExpandPayload: true}, l: layout,
			p: `{"fullName": "John Doe", "numbers": [null, 2, 3]}`, want: `{"fullName":"John Doe","numbers":[null,2,3]}`},
		{name: "null member dropped", o: Options{Value: JSON, ExpandPayload: true}, l: layout,
			p: `{"a": null, "b": 1}`, want: `{"b":1}`},
		{name: "null member as bytes", o: Options{Value: JSONWithSchema, ExpandPayload: true, NullFieldsAsBytes: true}, l: layout,
			p: `{"a": null}`, want: `{"schema":{"type":"struct","fields":[{"type":"bytes","optional":true,"field":"a"}],"optional":true,"name":"payload"},"payload":{"a":null}}`},
		{name: "mixed array stays a string", o: Options{Value: JSON, ExpandPayload: true}, l: layout,
			p: `{"a": [1, "x"]}`, want: `"{\"a\": [1, \"x\"]}"`},
		{name: "int and long array stays a string", o: Options{Value: JSON, ExpandPayload: true}, l: layout,
			p: `{"a": [1, 10000000000]}`, want: `"{\"a\": [1, 10000000000]}"`},
		{name: "big integer stays a string", o: Options{Value: JSON, ExpandPayload: true}, l: layout,
			p: `{"a": 123456789012345678901234567890}`, want: `"{\"a\": 123456789012345678901234567890}"`},
		{name: "top-level array stays a string", o: Options{Value: JSON, ExpandPayload: true}, l: layout,
			p: `[1, 2]`, want: `"[1, 2]"`},
		{name: "long and doubles", o: Options{Value: JSON, ExpandPayload: true}, l: layout,
			p: `{"l": 10000000000, "d": 1e2, "e": 1.5e-7, "z": 100.0, "big": 12345678.9}`, want: `{"l":10000000000,"d":100.0,"e":1.5E-7,"z":100.0,"big":1.23456789E7}`},
		{name: "duplicate key keeps place, last value", o: Options{Value: JSON, ExpandPayload: true}, l: layout,
			p: `{"a": 1, "b": 2, "a": 3}`, want: `{"a":3,"b":2}`},
		{name: "escapes as Jackson", o: Options{Value: JSON}, l: layout,
			p: "{\"s\": \"\\u0001 é / \\u2028\"}", want: `"{\"s\": \"\\u0001 é / \\u2028\"}"`},
		{name: "null payload", o: Options{Value: JSON}, l: layout, null: true, want: `null`},
		{name: "null payload with schema", o: Options{Value: JSONWithSchema}, l: layout, null: true,
			want: `{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":null}`},
		{name: "null payload tombstone", o: Options{Value: JSONWithSchema, Tombstones: true}, l: layout, null: true, tomb: true},
		{name: "blank payload tombstone", o: Options{Value: JSON, Tombstones: true}, l: Layout{Key: colKey, Payload: Column{Name: "payload", Type: oidText}}, p: " \n", tomb: true},
		// "Emitting messages with additional fields": eventType:envelope:type.
		{name: "envelope", o: Options{Value: JSON}, l: env, p: `{"a": 1}`, envVal: []string{"OrderCreated"},
			want: `{"payload":"{\"a\": 1}","type":"OrderCreated"}`},
		{name: "envelope expanded", o: Options{Value: JSON, ExpandPayload: true}, l: env, p: `{"fullName": "John Doe"}`, envVal: []string{"UserCreated"},
			want: `{"payload":{"fullName":"John Doe"},"type":"UserCreated"}`},
		{name: "envelope with schema", o: Options{Value: JSONWithSchema, SchemaName: "dbserver1.public.outboxevent"}, l: env, p: `{"a": 1}`, envVal: []string{"OrderCreated"},
			want: `{"schema":{"type":"struct","fields":[{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"payload"},{"type":"string","optional":false,"field":"type"}],"optional":false,"name":"dbserver1.public.outboxevent.Order.Value"},"payload":{"payload":"{\"a\": 1}","type":"OrderCreated"}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(tc.o, tc.l)
			if err != nil {
				t.Fatal(err)
			}
			var p []byte
			if !tc.null {
				p = []byte(tc.p)
			}
			var env [][]byte
			for _, v := range tc.envVal {
				env = append(env, []byte(v))
			}
			got, err := e.Value(p, env, []byte("Order"), nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.tomb {
				if got != nil {
					t.Fatalf("got %s, want a NULL value", got)
				}
				return
			}
			if string(got) != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tc.want)
			}
			if !json.Valid(got) {
				t.Fatalf("not JSON: %s", got)
			}
		})
	}
}

func TestSchemaVersion(t *testing.T) {
	version := Column{Name: "schemaversion", Type: oidInt4, Typmod: -1}
	l := Layout{Key: colKey, Payload: colPayload, PayloadField: "payload", Version: &version,
		Envelope: []EnvelopeField{{Alias: "eventType", Column: colType}}}
	e, err := New(Options{Value: JSONWithSchema, SchemaName: "p.public.outbox"}, l)
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.Value([]byte(`{}`), [][]byte{[]byte("Created")}, []byte("User"), []byte("7"))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"schema":{"type":"struct","fields":[{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"payload"},{"type":"string","optional":false,"field":"eventType"}],"optional":false,"name":"p.public.outbox.User.Value","version":7},"payload":{"payload":"{}","eventType":"Created"}}`
	if string(got) != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if _, err := e.Value([]byte(`{}`), [][]byte{[]byte("Created")}, []byte("User"), []byte("x")); err == nil {
		t.Fatal("a non-integer schema version is no error")
	}
}

func TestKey(t *testing.T) {
	tests := []struct {
		name string
		enc  Encoding
		col  Column
		v    []byte
		want string
	}{
		{"raw", Raw, colKey, []byte("1"), "1"},
		{"json", JSON, colKey, []byte("1"), `"1"`},
		{"json with schema", JSONWithSchema, colKey, []byte("1"), `{"schema":{"type":"string","optional":false},"payload":"1"}`},
		{"uuid", JSONWithSchema, colID, []byte("406c07f3-26f0-4eea-a50c-109940064b8f"),
			`{"schema":{"type":"string","optional":false,"name":"io.debezium.data.Uuid","version":1},"payload":"406c07f3-26f0-4eea-a50c-109940064b8f"}`},
		{"int", JSON, Column{Name: "k", Type: oidInt8}, []byte("42"), `42`},
		{"bytea", JSONWithSchema, Column{Name: "k", Type: oidBytea}, []byte{0, 1, 2}, `{"schema":{"type":"bytes","optional":true},"payload":"AAEC"}`},
		{"null", JSON, colKey, nil, `null`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(Options{Key: tc.enc}, Layout{Key: tc.col, Payload: colPayload})
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.Key(tc.v)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestColumnValues(t *testing.T) {
	tests := []struct {
		col  Column
		text string
		want string
	}{
		{Column{Type: oidBool}, "t", "true"},
		{Column{Type: oidBool}, "f", "false"},
		{Column{Type: oidInt2}, "-7", "-7"},
		{Column{Type: oidFloat8}, "39.98", "39.98"},
		{Column{Type: oidFloat8}, "1e+20", "1.0E20"},
		{Column{Type: oidFloat8}, "0.0001", "1.0E-4"},
		{Column{Type: oidFloat8}, "NaN", `"NaN"`},
		{Column{Type: oidFloat4}, "1.1", "1.1"},
		{Column{Type: oidDate}, "2019-01-31", "17927"},
		{Column{Type: oidTimestamp, Typmod: -1}, "2019-01-31 12:13:01.123456", "1548936781123456"},
		{Column{Type: oidTimestamp, Typmod: 3}, "2019-01-31 12:13:01.123", "1548936781123"},
		{Column{Type: oidTimestampTZ, Typmod: -1}, "2019-01-31 13:13:01.1+01", `"2019-01-31T12:13:01.100000Z"`},
		{Column{Type: oidTimestampTZ, Typmod: 0}, "2019-01-31 12:13:01+00", `"2019-01-31T12:13:01Z"`},
		{Column{Type: oidTimestampTZ, Typmod: 3}, "2019-01-31 12:13:01.5+05:30", `"2019-01-31T06:43:01.500Z"`},
		{Column{Type: oidTimestampTZ, Typmod: -1}, "infinity", `"infinity"`},
		{Column{Type: oidText}, "a\"b", `"a\"b"`},
	}
	for _, tc := range tests {
		got, err := appendColumn(nil, tc.col, []byte(tc.text))
		if err != nil {
			t.Errorf("%d %q: %v", tc.col.Type, tc.text, err)
			continue
		}
		if string(got) != tc.want {
			t.Errorf("%d %q: got %s, want %s", tc.col.Type, tc.text, got, tc.want)
		}
	}
	if _, err := columnSchema(Column{Name: "amount", Type: 1700}); err == nil {
		t.Error("numeric has a schema; Debezium's precise decimals are not written")
	}
}

func TestJavaDouble(t *testing.T) {
	tests := []struct {
		f    float64
		want string
	}{
		{0, "0.0"}, {math.Copysign(0, -1), "-0.0"}, {1, "1.0"}, {4.9, "4.9"}, {1e7, "1.0E7"}, {9999999, "9999999.0"},
		{0.001, "0.001"}, {0.0009, "9.0E-4"}, {1.5e300, "1.5E300"}, {-2.5e-10, "-2.5E-10"}, {123.456, "123.456"},
		{math.Inf(1), `"Infinity"`},
	}
	for _, tc := range tests {
		if got := string(appendJavaDouble(nil, tc.f, 64)); got != tc.want {
			t.Errorf("%v: got %s, want %s", tc.f, got, tc.want)
		}
	}
}

func TestOptionsCheck(t *testing.T) {
	if err := (Options{ExpandPayload: true}).Check(); err == nil {
		t.Error("expanding a raw value is no error")
	}
	if err := (Options{Value: JSON, NullFieldsAsBytes: true}).Check(); err == nil {
		t.Error("null-field typing without expansion is no error")
	}
	if _, err := ParseEncoding("avro"); err == nil {
		t.Error("avro is an encoding")
	}
}
