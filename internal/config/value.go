package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	yaml "go.yaml.in/yaml/v3"
)

var durationType = reflect.TypeOf(time.Duration(0))

// Convert is the one reading of a YAML value as a setting of type t (the
// field's type), whatever overlay holds it (the file, a table entry, --set):
// a time.Duration from a Go duration string, a bool from a YAML boolean
// (true/false), an int64, a float64, a string (one of enum, when enum is
// given), and for a list a []string or []int64 from a YAML sequence or a
// comma-separated string. The error says what was wanted and what was given.
func Convert(v *yaml.Node, t reflect.Type, enum []string) (any, error) {
	if t.Kind() == reflect.Slice {
		return convertList(v, t.Elem())
	}
	if v.Kind != yaml.ScalarNode {
		return nil, fmt.Errorf("want a single value, not a %s", kindName(v.Kind))
	}
	return convertScalar(v, t, enum)
}

// convertList reads a list of elem: a sequence of scalars, or a
// comma-separated string.
func convertList(v *yaml.Node, elem reflect.Type) (any, error) {
	var items []*yaml.Node
	switch v.Kind {
	case yaml.SequenceNode:
		for _, item := range v.Content {
			if item.Kind != yaml.ScalarNode || item.Tag == "!!null" {
				return nil, fmt.Errorf("line %d: want a list of values such as [kafka-1:9092, kafka-2:9092]", item.Line)
			}
		}
		items = v.Content
	case yaml.ScalarNode:
		if v.Value != "" {
			for _, s := range strings.Split(v.Value, ",") {
				items = append(items, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s, Line: v.Line})
			}
		}
	default:
		return nil, errors.New("want a list: a YAML sequence such as [a, b] or a comma-separated string")
	}
	if k := elem.Kind(); k >= reflect.Int && k <= reflect.Int64 {
		out := make([]int64, 0, len(items))
		for _, item := range items {
			n, err := strconv.ParseInt(strings.TrimSpace(item.Value), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: want a list of whole numbers such as [3, 4], got %q", item.Line, item.Value)
			}
			out = append(out, n)
		}
		return out, nil
	}
	out := make([]string, 0, len(items))
	for _, item := range items {
		out = append(out, item.Value)
	}
	return out, nil
}

// convertScalar reads one value of type t.
func convertScalar(v *yaml.Node, t reflect.Type, enum []string) (any, error) {
	switch {
	case t == durationType:
		d, err := time.ParseDuration(v.Value)
		if err != nil {
			return nil, fmt.Errorf("want a Go duration such as 250ms, 10s or 5m, got %q", v.Value)
		}
		return d, nil
	case t.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(v.Value)
		if v.Tag != "!!bool" || err != nil { // yaml.v3 also tags YAML 1.1's yes/no/on/off !!bool
			return nil, fmt.Errorf("want true or false, got %q", v.Value)
		}
		return b, nil
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		n, err := strconv.ParseInt(v.Value, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("want a whole number, got %q", v.Value)
		}
		return n, nil
	case t.Kind() == reflect.Float64 || t.Kind() == reflect.Float32:
		f, err := strconv.ParseFloat(v.Value, 64)
		if err != nil {
			return nil, fmt.Errorf("want a number, got %q", v.Value)
		}
		return f, nil
	case t.Kind() == reflect.String:
		if len(enum) > 0 && !slices.Contains(enum, v.Value) {
			return nil, fmt.Errorf("%q: want one of %s", v.Value, strings.Join(enum, ", "))
		}
		return v.Value, nil
	}
	return nil, fmt.Errorf("a setting of type %s cannot be read from YAML", t)
}

// Value converts a YAML value, through Convert, to what kong parses for a
// flag of type t: a Go duration string, a bool, a number, a string, or for a
// list its items (a comma-separated string as it is, which kong splits).
// Enum values are left to kong, whose message names the flag's values.
func Value(v *yaml.Node, t reflect.Type) (any, error) {
	x, err := Convert(v, t, nil)
	if err != nil {
		return nil, err
	}
	switch x := x.(type) {
	case []string:
		if v.Kind == yaml.ScalarNode {
			return v.Value, nil
		}
		items := make([]any, len(x))
		for i, s := range x {
			items[i] = s
		}
		return items, nil
	case []int64:
		items := make([]any, len(x))
		for i, n := range x {
			items[i] = n // kong reads a list item by its JSON form: a number, not a string
		}
		return items, nil
	case time.Duration:
		return v.Value, nil // kong's duration decoder takes a string, not a time.Duration
	}
	return x, nil
}

// setField stores x, as Convert returned it, in f, a field of type t.
func setField(f reflect.Value, x any) {
	if ns, ok := x.([]int64); ok {
		s := reflect.MakeSlice(f.Type(), len(ns), len(ns))
		for i, n := range ns {
			s.Index(i).SetInt(n)
		}
		f.Set(s)
		return
	}
	f.Set(reflect.ValueOf(x).Convert(f.Type()))
}
