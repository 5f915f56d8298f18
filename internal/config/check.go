package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Check checks the bounds that the settings of the struct v points to
// declare with a check tag, in the order of their keys, and returns the
// first violation as fail(flag, problem):
//
//	check:"positive"   a duration above 0 ("must be a positive duration such as <example>")
//	check:"zero=off"   0 (meaning off) or a positive duration / a number (<example>)
//	check:"min=1024"   a whole number of at least 1024
//
// The example tag gives the example the message shows.
func Check(v any, fail func(flag, problem string) error) error {
	rv := reflect.ValueOf(v)
	decls := Declarations(rv.Type())
	for _, key := range slices.Sorted(maps.Keys(decls)) {
		d := decls[key]
		rule := d.Check
		if rule == "" {
			continue
		}
		f := rv.Elem().FieldByIndex(d.Index)
		var n int64
		isDuration := d.Type == reflect.TypeOf(time.Duration(0))
		switch f.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			n = f.Int()
		default:
			return fmt.Errorf("setting %s: a check tag on a %s", key, d.Type)
		}
		example := d.Example
		if isDuration {
			example = "a positive duration such as " + example
		}
		name, arg, _ := strings.Cut(rule, "=")
		switch name {
		case "positive":
			if n <= 0 {
				return fail(d.Flag, "must be "+example)
			}
		case "zero":
			if n < 0 {
				return fail(d.Flag, fmt.Sprintf("must be 0 (%s) or %s", arg, example))
			}
		case "min":
			lo, err := strconv.ParseInt(arg, 10, 64)
			if err != nil {
				return fmt.Errorf("setting %s: check tag %q", key, rule)
			}
			if n < lo {
				return fail(d.Flag, fmt.Sprintf("must be at least %d", lo))
			}
		default:
			return fmt.Errorf("setting %s: unknown check %q", key, rule)
		}
	}
	return nil
}

// ShortDuration formats d as time.Duration does, without zero trailing units
// ("10m", not "10m0s"), as a person writes a setting's value.
func ShortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
