package connectjson

import (
	"math"
	"strconv"
	"strings"

	"github.com/cdc-relay/cdc-relay/internal/jsonstr"
)

// schema is a Kafka Connect schema, as much of one as the outbox needs.
type schema struct {
	typ      string // Connect type name: string, int32, struct, …
	optional bool
	name     string // logical name, e.g. io.debezium.data.Json; "" for none
	version  int    // 0: none
	hasVer   bool
	fields   []field // struct
	items    *schema // array
}

// field is one member of a struct schema.
type field struct {
	name string
	s    *schema
}

// field returns the struct's member named name, or nil.
func (s *schema) field(name string) *schema {
	for _, f := range s.fields {
		if f.name == name {
			return f.s
		}
	}
	return nil
}

// equal reports whether two schemas are the same Connect schema.
func (s *schema) equal(o *schema) bool {
	if s == nil || o == nil {
		return s == o
	}
	if s.typ != o.typ || s.optional != o.optional || s.name != o.name || s.hasVer != o.hasVer || s.version != o.version ||
		len(s.fields) != len(o.fields) || !s.items.equal(o.items) {
		return false
	}
	for i, f := range s.fields {
		if f.name != o.fields[i].name || !f.s.equal(o.fields[i].s) {
			return false
		}
	}
	return true
}

// writeSchema appends s as JsonConverter writes a schema: type, then the
// struct's fields or the array's items, optional, name, version; a struct
// member has its name last, under "field".
func writeSchema(b []byte, s *schema, fieldName string) []byte {
	b = append(b, `{"type":`...)
	b = jsonstr.Append(b, jsonTypeName(s.typ))
	switch s.typ {
	case "struct":
		b = append(b, `,"fields":[`...)
		for i, f := range s.fields {
			if i > 0 {
				b = append(b, ',')
			}
			b = writeSchema(b, f.s, f.name)
		}
		b = append(b, ']')
	case "array":
		b = append(b, `,"items":`...)
		b = writeSchema(b, s.items, "")
	}
	b = append(b, `,"optional":`...)
	b = strconv.AppendBool(b, s.optional)
	if s.name != "" {
		b = append(b, `,"name":`...)
		b = jsonstr.Append(b, s.name)
	}
	if s.hasVer {
		b = append(b, `,"version":`...)
		b = strconv.AppendInt(b, int64(s.version), 10)
	}
	if fieldName != "" {
		b = append(b, `,"field":`...)
		b = jsonstr.Append(b, fieldName)
	}
	return append(b, '}')
}

// jsonTypeName is JsonConverter's name of a Connect type: the floating
// point types are "float" and "double" there.
func jsonTypeName(typ string) string {
	switch typ {
	case "float32":
		return "float"
	case "float64":
		return "double"
	}
	return typ
}

// appendJavaDouble appends f as Java's Double.toString writes it (and so
// Jackson): the shortest digits that read back as f, in plain notation
// with at least one fractional digit when 10^-3 <= |f| < 10^7, else as
// d.dddE±n; NaN and the infinities as Jackson writes them by default, as
// strings.
func appendJavaDouble(b []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(b, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(b, `"-Infinity"`...)
	}
	abs := f
	if abs < 0 {
		abs = -abs
	}
	if abs == 0 || (abs >= 1e-3 && abs < 1e7) {
		s := strconv.FormatFloat(f, 'f', -1, bits)
		b = append(b, s...)
		if !strings.Contains(s, ".") {
			b = append(b, ".0"...)
		}
		return b
	}
	s := strconv.FormatFloat(f, 'e', -1, bits) // d.ddde±nn
	mant, exp := s, ""
	for i := 0; i < len(s); i++ {
		if s[i] == 'e' {
			mant, exp = s[:i], s[i+1:]
			break
		}
	}
	b = append(b, mant...)
	if !strings.Contains(mant, ".") {
		b = append(b, ".0"...)
	}
	b = append(b, 'E')
	if exp[0] == '-' {
		b = append(b, '-')
	}
	exp = exp[1:]
	for len(exp) > 1 && exp[0] == '0' {
		exp = exp[1:]
	}
	return append(b, exp...)
}
