package connectjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/cdc-relay/cdc-relay/internal/jsonstr"
)

// kind is a parsed JSON value's kind, with numbers told apart as Jackson's
// tree model does: an integer that fits 32 bits, one that fits 64, a larger
// one, or a number with a fraction or an exponent (a double).
type kind uint8

const (
	kNull kind = iota
	kBool
	kString
	kInt
	kLong
	kBigInt
	kDouble
	kArray
	kObject
)

// category is Jackson's JsonNodeType: the four number kinds are one.
func (k kind) category() kind {
	if k >= kInt && k <= kDouble {
		return kInt
	}
	return k
}

// node is one parsed JSON value; an object keeps its members in document
// order, a repeated key keeping its first place and its last value, as
// Jackson's ObjectNode does.
type node struct {
	kind  kind
	b     bool
	s     string // string; number text for kBigInt
	i     int64
	f     float64
	elems []*node
	keys  []string
	vals  []*node
}

// member returns the object's value for key, or nil.
func (n *node) member(key string) *node {
	for i, k := range n.keys {
		if k == key {
			return n.vals[i]
		}
	}
	return nil
}

// parse reads one JSON document.
func parse(text []byte) (*node, error) {
	d := json.NewDecoder(bytes.NewReader(text))
	d.UseNumber()
	n, err := parseValue(d)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON document")
	}
	return n, nil
}

func parseValue(d *json.Decoder) (*node, error) {
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch v := t.(type) {
	case nil:
		return &node{kind: kNull}, nil
	case bool:
		return &node{kind: kBool, b: v}, nil
	case string:
		return &node{kind: kString, s: v}, nil
	case json.Number:
		return number(string(v))
	case json.Delim:
		switch v {
		case '[':
			n := &node{kind: kArray}
			for d.More() {
				e, err := parseValue(d)
				if err != nil {
					return nil, err
				}
				n.elems = append(n.elems, e)
			}
			_, err := d.Token()
			return n, err
		case '{':
			n := &node{kind: kObject}
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return nil, err
				}
				key, _ := kt.(string)
				val, err := parseValue(d)
				if err != nil {
					return nil, err
				}
				if i := slices.Index(n.keys, key); i >= 0 {
					n.vals[i] = val
					continue
				}
				n.keys = append(n.keys, key)
				n.vals = append(n.vals, val)
			}
			_, err := d.Token()
			return n, err
		}
	}
	return nil, fmt.Errorf("unexpected JSON token %v", t)
}

// number classifies a JSON number as Jackson's parser does.
func number(text string) (*node, error) {
	if strings.ContainsAny(text, ".eE") {
		f, err := strconv.ParseFloat(text, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return nil, err
		}
		return &node{kind: kDouble, f: f}, nil // out of range: ±Inf, as Double.parseDouble
	}
	if i, err := strconv.ParseInt(text, 10, 32); err == nil {
		return &node{kind: kInt, i: i}, nil
	}
	if i, err := strconv.ParseInt(text, 10, 64); err == nil {
		return &node{kind: kLong, i: i}, nil
	}
	return &node{kind: kBigInt, s: text}, nil
}

// inferer derives a Connect schema from a JSON document, as the Event
// Router's table.expand.json.payload does (its JsonSchemaData).
type inferer struct {
	nullAsBytes    bool // table.json.payload.null.behavior=optional_bytes
	emptyAsStrings bool // table.json.payload.empty.array.behavior=optional_string
}

// schemaOf returns n's schema, nil for a value that adds no field (a null or
// an empty array, unless told otherwise), or an error for an array the
// Event Router cannot type.
func (in inferer) schemaOf(key string, n *node) (*schema, error) {
	switch n.kind {
	case kString:
		return &schema{typ: "string", optional: true}, nil
	case kBool:
		return &schema{typ: "boolean", optional: true}, nil
	case kInt:
		return &schema{typ: "int32", optional: true}, nil
	case kLong:
		return &schema{typ: "int64", optional: true}, nil
	case kBigInt, kDouble:
		return &schema{typ: "float64", optional: true}, nil
	case kArray:
		if len(n.elems) == 0 {
			if in.emptyAsStrings {
				return &schema{typ: "array", optional: true, items: &schema{typ: "string", optional: true}}, nil
			}
			return nil, nil
		}
		items, err := in.itemSchema(key, n)
		if err != nil {
			return nil, err
		}
		return &schema{typ: "array", optional: true, items: items}, nil
	case kObject:
		s := &schema{typ: "struct", optional: true, name: key}
		for i, name := range n.keys {
			fieldKey := name
			if key != "" {
				fieldKey = key + "." + name
			}
			fs, err := in.schemaOf(fieldKey, n.vals[i])
			if err != nil {
				return nil, err
			}
			if fs != nil && s.field(name) == nil {
				s.fields = append(s.fields, field{name: name, s: fs})
			}
		}
		return s, nil
	case kNull:
		if in.nullAsBytes {
			return &schema{typ: "bytes", optional: true}, nil
		}
	}
	return nil, nil
}

// itemSchema types a non-empty array: its non-null elements must be of one
// kind (numbers of one Connect type); objects' schemas are merged.
func (in inferer) itemSchema(key string, arr *node) (*schema, error) {
	var sample *node
	var sampleSchema *schema
	for _, e := range arr.elems {
		if e.kind == kNull {
			continue
		}
		if sample == nil {
			sample = e
		}
		if e.kind.category() != sample.kind.category() {
			return nil, errors.New("not a homogenous array")
		}
		if sample.kind.category() == kInt {
			if sampleSchema == nil {
				sampleSchema, _ = in.schemaOf("", sample)
			}
			if es, _ := in.schemaOf("", e); es.typ != sampleSchema.typ {
				return nil, errors.New("not a homogenous array: different number types")
			}
		}
	}
	if sample == nil {
		sample = &node{kind: kNull}
	}
	if sample.kind != kObject {
		s, err := in.schemaOf("", sample)
		if err == nil && s == nil {
			err = errors.New("array has unrecognized member schema")
		}
		return s, err
	}
	var distinct []*schema
	for _, e := range arr.elems {
		if e.kind != kObject {
			continue
		}
		s, err := in.schemaOf(key, e)
		if err != nil {
			return nil, err
		}
		if !containsSchema(distinct, s) {
			distinct = append(distinct, s)
		}
	}
	merged := distinct[0]
	for _, s := range distinct[1:] {
		merged = mergeStructs(merged, s)
	}
	return merged, nil
}

func containsSchema(list []*schema, s *schema) bool {
	for _, x := range list {
		if x.equal(s) {
			return true
		}
	}
	return false
}

// mergeStructs unites two element schemas: left's fields, then right's new
// ones; a field typed bytes (a null) takes the other's type.
func mergeStructs(left, right *schema) *schema {
	out := &schema{typ: left.typ, optional: left.optional, name: left.name, version: left.version, hasVer: left.hasVer}
	out.fields = append(out.fields, left.fields...)
	for _, f := range right.fields {
		i := -1
		for j, o := range out.fields {
			if o.name == f.name {
				i = j
				break
			}
		}
		switch {
		case i < 0:
			out.fields = append(out.fields, f)
		case !out.fields[i].s.equal(f.s) && out.fields[i].s.typ == "bytes" && f.s.typ != "bytes":
			out.fields[i] = f
		}
	}
	return out
}

// errMismatch is a value its inferred schema cannot hold, which makes the
// Event Router keep the payload unexpanded.
var errMismatch = errors.New("value does not fit the inferred schema")

// appendValue appends n as the Connect value of schema s, written as
// JsonConverter writes it: a struct has every field of its schema, in the
// schema's order, null when the document lacks it.
func appendValue(b []byte, n *node, s *schema) ([]byte, error) {
	if n == nil || n.kind == kNull {
		return append(b, "null"...), nil
	}
	switch n.kind {
	case kString:
		if s.typ != "string" {
			return nil, errMismatch
		}
		return jsonstr.Append(b, n.s), nil
	case kBool:
		if s.typ != "boolean" {
			return nil, errMismatch
		}
		return strconv.AppendBool(b, n.b), nil
	case kInt:
		if s.typ != "int32" {
			return nil, errMismatch
		}
		return strconv.AppendInt(b, n.i, 10), nil
	case kLong:
		if s.typ != "int64" {
			return nil, errMismatch
		}
		return strconv.AppendInt(b, n.i, 10), nil
	case kDouble:
		if s.typ != "float64" {
			return nil, errMismatch
		}
		return appendJavaDouble(b, n.f, 64), nil
	case kBigInt:
		return nil, errMismatch // a BigDecimal, which no Connect type takes
	case kArray:
		if s.typ != "array" {
			return nil, errMismatch
		}
		b = append(b, '[')
		for i, e := range n.elems {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendValue(b, e, s.items); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case kObject:
		if s.typ != "struct" {
			return nil, errMismatch
		}
		b = append(b, '{')
		for i, f := range s.fields {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonstr.Append(b, f.name)
			b = append(b, ':')
			var err error
			if b, err = appendValue(b, n.member(f.name), f.s); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	}
	return nil, errMismatch
}

// expand parses a JSON object payload into its inferred schema and its
// value as JsonConverter writes it. Like the Event Router, it expands only
// a document starting with '{' (an array would have to be a struct), and it
// fails, leaving the payload as it is, when the document is not JSON, mixes
// element types in an array, or holds a number no Connect type takes.
func (in inferer) expand(text []byte, payloadField string) (*schema, []byte, error) {
	if len(text) == 0 || text[0] != '{' {
		return nil, nil, errors.New("not a JSON object")
	}
	n, err := parse(text)
	if err != nil {
		return nil, nil, err
	}
	s, err := in.schemaOf(payloadField, n)
	if err != nil {
		return nil, nil, err
	}
	v, err := appendValue(nil, n, s)
	if err != nil {
		return nil, nil, err
	}
	return s, v, nil
}
