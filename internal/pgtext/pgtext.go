// Package pgtext reads the text forms in which Postgres outputs values, as
// pgoutput sends them, with DateStyle ISO (Postgres's default). It is where
// the relay knows those forms; the decoder and the Kafka Connect encoder both
// read timestamps through it.
package pgtext

import (
	"fmt"
	"time"
)

// zonedLayouts are timestamptz's forms: the offset as Postgres abbreviates it.
var zonedLayouts = []string{
	"2006-01-02 15:04:05.999999999Z07",
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999Z07:00:00",
}

// localLayout is timestamp's form: no offset.
const localLayout = "2006-01-02 15:04:05.999999999"

// TimestampTZ reads a timestamptz value (any offset) and returns it in UTC.
// "infinity" and "-infinity" are errors: callers that accept them check
// first.
func TimestampTZ(b []byte) (time.Time, error) {
	if t, ok := parseISO(b, false); ok {
		return t, nil
	}
	for _, layout := range zonedLayouts {
		if t, err := time.Parse(layout, string(b)); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a timestamptz in DateStyle ISO", b)
}

// Timestamp reads a timestamp (without time zone) value as UTC. "infinity"
// and "-infinity" are errors, as for TimestampTZ.
func Timestamp(b []byte) (time.Time, error) {
	if t, ok := parseISO(b, true); ok {
		return t, nil
	}
	t, err := time.Parse(localLayout, string(b))
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is not a timestamp in DateStyle ISO", b)
	}
	return t, nil
}

// parseISO reads the common forms of timestamp and timestamptz output
// without time.Parse's cost (the relay pays it for every event's created-at
// column): "YYYY-MM-DD HH:MM:SS[.ffffff]" and, unless noZone, an offset
// "+HH[:MM[:SS]]". It reports false for anything else (years beyond 9999,
// BC), which the callers then read the slow way.
func parseISO(b []byte, noZone bool) (time.Time, bool) {
	if len(b) < 19 || b[4] != '-' || b[7] != '-' || b[10] != ' ' || b[13] != ':' || b[16] != ':' {
		return time.Time{}, false
	}
	num := func(i, n int) (int, bool) {
		v := 0
		for _, c := range b[i : i+n] {
			if c < '0' || c > '9' {
				return 0, false
			}
			v = v*10 + int(c-'0')
		}
		return v, true
	}
	year, ok1 := num(0, 4)
	month, ok2 := num(5, 2)
	day, ok3 := num(8, 2)
	hour, ok4 := num(11, 2)
	minute, ok5 := num(14, 2)
	sec, ok6 := num(17, 2)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	p, nsec := 19, 0
	if p < len(b) && b[p] == '.' {
		p++
		digits := 0
		for p < len(b) && b[p] >= '0' && b[p] <= '9' && digits < 9 {
			nsec = nsec*10 + int(b[p]-'0')
			p++
			digits++
		}
		if digits == 0 {
			return time.Time{}, false
		}
		for ; digits < 9; digits++ {
			nsec *= 10
		}
	}
	offset := 0
	if !noZone {
		if p+3 > len(b) || (b[p] != '+' && b[p] != '-') {
			return time.Time{}, false
		}
		sign := 1
		if b[p] == '-' {
			sign = -1
		}
		h, ok := num(p+1, 2)
		if !ok {
			return time.Time{}, false
		}
		offset, p = h*3600, p+3
		for _, unit := range []int{60, 1} {
			if p == len(b) {
				break
			}
			if p+3 > len(b) || b[p] != ':' {
				return time.Time{}, false
			}
			v, ok := num(p+1, 2)
			if !ok {
				return time.Time{}, false
			}
			offset, p = offset+v*unit, p+3
		}
		offset *= sign
	}
	if p != len(b) {
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	if t.Day() != day { // 31 February and the like
		return time.Time{}, false
	}
	return t.Add(-time.Duration(offset) * time.Second), true
}
