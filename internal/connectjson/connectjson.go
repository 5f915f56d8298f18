// Package connectjson writes outbox rows as the records Debezium's Outbox
// Event Router writes through Kafka Connect's JsonConverter: the key and
// value bytes, with schemas.enable true ({"schema": …, "payload": …}) or
// false, an expanded JSON payload (table.expand.json.payload), and the
// envelope of extra columns (table.fields.additional.placement
// column:envelope:alias). Column values are typed as Debezium's Postgres
// connector types them with its default handling modes.
//
// It owns that byte-for-byte compatibility; the decoder and the outbox table
// reader apply it to what they read, so that the stream, a replay and a
// snapshot publish the same bytes.
package connectjson

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/cdc-relay/cdc-relay/internal/jsonstr"
)

// Encoding is how a record key or value is written.
type Encoding uint8

// The encodings.
const (
	// Raw is the column's bytes as they are (StringConverter,
	// ByteArrayConverter, BinaryDataConverter): the default.
	Raw Encoding = iota
	// JSON is JsonConverter with schemas.enable=false.
	JSON
	// JSONWithSchema is JsonConverter with schemas.enable=true: an object
	// {"schema": <the Connect schema>, "payload": <the value>}.
	JSONWithSchema
)

// Encoding names, as flags and the config file spell them.
const (
	NameRaw            = "raw"
	NameJSON           = "json"
	NameJSONWithSchema = "json-with-schema"
)

// ParseEncoding reads an encoding name.
func ParseEncoding(s string) (Encoding, error) {
	switch s {
	case NameRaw, "":
		return Raw, nil
	case NameJSON:
		return JSON, nil
	case NameJSONWithSchema:
		return JSONWithSchema, nil
	}
	return Raw, fmt.Errorf("%q is not raw, json or json-with-schema", s)
}

// String returns the encoding's name.
func (e Encoding) String() string {
	switch e {
	case JSON:
		return NameJSON
	case JSONWithSchema:
		return NameJSONWithSchema
	}
	return NameRaw
}

// Options are the settings of an Encoder.
type Options struct {
	// Key and Value say how the record key (the aggregate id column) and
	// value (the payload, or the envelope) are written.
	Key, Value Encoding
	// ExpandPayload parses a JSON object payload and writes it as the JSON
	// it holds, with an inferred schema (table.expand.json.payload); a
	// payload that is not a JSON object, or one the Event Router could not
	// type (mixed arrays, integers beyond 64 bits), stays a string. It needs
	// a JSON value encoding.
	ExpandPayload bool
	// NullFieldsAsBytes types null members of an expanded payload as
	// optional bytes instead of leaving them out
	// (table.json.payload.null.behavior=optional_bytes).
	NullFieldsAsBytes bool
	// EmptyArraysAsStrings types empty arrays of an expanded payload as
	// arrays of optional strings instead of leaving them out
	// (table.json.payload.empty.array.behavior=optional_string).
	EmptyArraysAsStrings bool
	// Tombstones: a NULL or blank payload gives a NULL value (the sink then
	// sends a tombstone), as route.tombstone.on.empty.payload=true.
	Tombstones bool
	// SchemaName is the start of the envelope struct's schema name, which
	// is <SchemaName>.<routed-by value>.Value, as the Event Router derives
	// it from the table's value schema <topic.prefix>.<schema>.<table>.Value.
	SchemaName string
}

// Check returns an error for options that cannot work together.
func (o Options) Check() error {
	if o.ExpandPayload && o.Value == Raw {
		return fmt.Errorf("expanding the JSON payload needs value encoding json or json-with-schema (the raw payload is the JSON already)")
	}
	if (o.NullFieldsAsBytes || o.EmptyArraysAsStrings) && !o.ExpandPayload {
		return fmt.Errorf("the null-field and empty-array typing apply to an expanded payload only: expand it or drop them")
	}
	return nil
}

// EnvelopeField is one column placed in the value's envelope under Alias.
type EnvelopeField struct {
	Alias  string
	Column Column
}

// Layout is the outbox table as an Encoder writes it.
type Layout struct {
	// Key is the aggregate id column, Payload the payload column.
	Key, Payload Column
	// PayloadField is the payload column's name as the Event Router knows it
	// (table.field.event.payload): the name of an expanded payload's struct.
	PayloadField string
	// Envelope lists the envelope's columns; none means the value is the
	// payload alone.
	Envelope []EnvelopeField
	// Version is the schema version column (table.field.event.schema.version),
	// the envelope schema's version; nil for none.
	Version *Column
}

// Encoder writes one outbox table's records. It is safe for concurrent use.
type Encoder struct {
	o         Options
	l         Layout
	keySchema []byte // written key schema, for JSONWithSchema
	paySchema *schema
	payJSON   []byte // written payload schema
	envFields []*schema
	in        inferer
}

// New returns the Encoder of options o for layout l, or an error naming a
// column whose type it cannot write.
func New(o Options, l Layout) (*Encoder, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	e := &Encoder{o: o, l: l, in: inferer{nullAsBytes: o.NullFieldsAsBytes, emptyAsStrings: o.EmptyArraysAsStrings}}
	if o.Key != Raw {
		ks, err := columnSchema(l.Key)
		if err != nil {
			return nil, fmt.Errorf("key: %w", err)
		}
		e.keySchema = writeSchema(nil, ks, "")
	}
	if o.Value == Raw {
		return e, nil
	}
	ps, err := columnSchema(l.Payload)
	if err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	e.paySchema, e.payJSON = ps, writeSchema(nil, ps, "")
	for _, f := range l.Envelope {
		fs, err := columnSchema(f.Column)
		if err != nil {
			return nil, fmt.Errorf("envelope: %w", err)
		}
		e.envFields = append(e.envFields, fs)
	}
	if l.Version != nil {
		switch l.Version.Type {
		case oidInt2, oidInt4, oidInt8:
		default:
			return nil, fmt.Errorf("schema version column %q has type OID %d; want an integer column", l.Version.Name, l.Version.Type)
		}
	}
	return e, nil
}

// EnvelopeType returns the type OID of the i-th envelope column.
func (e *Encoder) EnvelopeType(i int) uint32 { return e.l.Envelope[i].Column.Type }

// Key returns the record key for the key column's value k (nil for NULL).
func (e *Encoder) Key(k []byte) ([]byte, error) {
	switch e.o.Key {
	case JSON:
		return appendColumn(nil, e.l.Key, k)
	case JSONWithSchema:
		b := append([]byte(`{"schema":`), e.keySchema...)
		b = append(b, `,"payload":`...)
		b, err := appendColumn(b, e.l.Key, k)
		if err != nil {
			return nil, err
		}
		return append(b, '}'), nil
	}
	return k, nil
}

// blank reports whether the Event Router takes payload p of the payload
// column as empty: NULL, or text that is all spaces and control characters
// (Java's trim); a bytea value is never blank.
func (e *Encoder) blank(p []byte) bool {
	if p == nil {
		return true
	}
	if e.l.Payload.Type == oidBytea {
		return false
	}
	for _, c := range p {
		if c > ' ' {
			return false
		}
	}
	return true
}

// Value returns the record value for payload p (the payload column's value,
// nil for NULL), envelope column values env (in Layout.Envelope's order),
// the routed-by value (route.by.field's column) and the schema version
// column's value. A nil result is a NULL value (a tombstone, with
// Options.Tombstones). With the Raw encoding it returns p.
func (e *Encoder) Value(p []byte, env [][]byte, routedBy, version []byte) ([]byte, error) {
	if e.o.Value == Raw {
		return p, nil
	}
	if e.o.Tombstones && e.blank(p) {
		return nil, nil
	}
	ps, pv := e.paySchema, []byte(nil)
	psJSON := e.payJSON
	if e.o.ExpandPayload && p != nil && e.l.Payload.Type != oidBytea {
		if s, v, err := e.in.expand(p, e.l.PayloadField); err == nil {
			ps, pv, psJSON = s, v, nil
		}
	}
	if pv == nil {
		var err error
		if pv, err = appendColumn(nil, e.l.Payload, p); err != nil {
			return nil, fmt.Errorf("payload: %w", err)
		}
	}
	var b []byte
	withSchema := e.o.Value == JSONWithSchema
	if len(e.l.Envelope) == 0 {
		if !withSchema {
			return pv, nil
		}
		b = append(b, `{"schema":`...)
		if psJSON != nil {
			b = append(b, psJSON...)
		} else {
			b = writeSchema(b, ps, "")
		}
		b = append(b, `,"payload":`...)
		b = append(b, pv...)
		return append(b, '}'), nil
	}
	if withSchema {
		env := &schema{typ: "struct", name: e.o.SchemaName + "." + string(routedBy) + ".Value"}
		if e.o.SchemaName == "" {
			env.name = string(routedBy)
		}
		env.fields = append(env.fields, field{name: "payload", s: ps})
		for i, f := range e.l.Envelope {
			env.fields = append(env.fields, field{name: f.Alias, s: e.envFields[i]})
		}
		if e.l.Version != nil && version != nil {
			n, err := strconv.ParseInt(string(bytes.TrimSpace(version)), 10, 32)
			if err != nil {
				return nil, fmt.Errorf("schema version column %q: %q is not a 32-bit integer", e.l.Version.Name, clip(version))
			}
			env.version, env.hasVer = int(n), true
		}
		b = append(b, `{"schema":`...)
		b = writeSchema(b, env, "")
		b = append(b, `,"payload":`...)
	}
	b = append(b, `{"payload":`...)
	b = append(b, pv...)
	for i, f := range e.l.Envelope {
		b = append(b, ',')
		b = jsonstr.Append(b, f.Alias)
		b = append(b, ':')
		var err error
		if b, err = appendColumn(b, f.Column, env[i]); err != nil {
			return nil, fmt.Errorf("envelope: %w", err)
		}
	}
	b = append(b, '}')
	if withSchema {
		b = append(b, '}')
	}
	return b, nil
}
