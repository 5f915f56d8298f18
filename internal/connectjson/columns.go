package connectjson

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/jsonstr"
	"github.com/cdc-relay/cdc-relay/internal/pgtext"
)

// Type OIDs of the PostgreSQL types a column may have here.
const (
	oidBool        = 16
	oidBytea       = 17
	oidChar        = 18
	oidName        = 19
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidText        = 25
	oidOID         = 26
	oidJSON        = 114
	oidXML         = 142
	oidFloat4      = 700
	oidFloat8      = 701
	oidBpchar      = 1042
	oidVarchar     = 1043
	oidDate        = 1082
	oidTimestamp   = 1114
	oidTimestampTZ = 1184
	oidUUID        = 2950
	oidJSONB       = 3802
)

// Column is one outbox column as the encoder needs to know it.
type Column struct {
	// Name is the column's name, for errors.
	Name string
	// Type is its type OID (pg_attribute.atttypid, as pgoutput sends it).
	Type uint32
	// Typmod is its type modifier (atttypmod), -1 for none; for timestamps
	// it is the fractional-second precision.
	Typmod int32
	// NotNull is pg_attribute.attnotnull: Debezium's schema then says
	// "optional": false.
	NotNull bool
}

// logical names Debezium's Postgres connector gives column types (with its
// default decimal, time and binary handling modes).
const (
	nameJSON       = "io.debezium.data.Json"
	nameUUID       = "io.debezium.data.Uuid"
	nameXML        = "io.debezium.data.Xml"
	nameDate       = "io.debezium.time.Date"
	nameTimestamp  = "io.debezium.time.Timestamp"
	nameMicroTS    = "io.debezium.time.MicroTimestamp"
	nameZonedTS    = "io.debezium.time.ZonedTimestamp"
	unsupportedFix = "write it raw (the key or value encoding raw), or give the column one of the types listed in docs/kafka.md#formats"
)

// precision is a timestamp column's fractional-second digits (6 by default).
func (c Column) precision() int {
	if c.Typmod < 0 {
		return 6
	}
	return int(c.Typmod)
}

// columnSchema returns the Connect schema Debezium's Postgres connector
// gives column c.
func columnSchema(c Column) (*schema, error) {
	s := &schema{optional: !c.NotNull}
	switch c.Type {
	case oidText, oidVarchar, oidBpchar, oidChar, oidName:
		s.typ = "string"
	case oidJSON, oidJSONB:
		s.typ, s.name, s.version, s.hasVer = "string", nameJSON, 1, true
	case oidUUID:
		s.typ, s.name, s.version, s.hasVer = "string", nameUUID, 1, true
	case oidXML:
		s.typ, s.name, s.version, s.hasVer = "string", nameXML, 1, true
	case oidBytea:
		s.typ = "bytes"
	case oidBool:
		s.typ = "boolean"
	case oidInt2:
		s.typ = "int16"
	case oidInt4:
		s.typ = "int32"
	case oidInt8, oidOID:
		s.typ = "int64"
	case oidFloat4:
		s.typ = "float32"
	case oidFloat8:
		s.typ = "float64"
	case oidDate:
		s.typ, s.name, s.version, s.hasVer = "int32", nameDate, 1, true
	case oidTimestamp:
		s.typ, s.name, s.version, s.hasVer = "int64", nameMicroTS, 1, true
		if c.precision() <= 3 {
			s.name = nameTimestamp
		}
	case oidTimestampTZ:
		s.typ, s.name, s.version, s.hasVer = "string", nameZonedTS, 1, true
	default:
		return nil, fmt.Errorf("column %q has type OID %d, which cdc-relay does not write as Debezium's JsonConverter does: %s", c.Name, c.Type, unsupportedFix)
	}
	return s, nil
}

// appendColumn appends the JsonConverter form of column c's value: v is the
// column's text as pgoutput sends it (raw bytes for bytea), nil for NULL.
func appendColumn(b []byte, c Column, v []byte) ([]byte, error) {
	if v == nil {
		return append(b, "null"...), nil
	}
	bad := func(err error) ([]byte, error) {
		return nil, fmt.Errorf("column %q: value %q: %w", c.Name, clip(v), err)
	}
	switch c.Type {
	case oidBytea:
		b = append(b, '"')
		b = base64.StdEncoding.AppendEncode(b, v)
		return append(b, '"'), nil
	case oidBool:
		switch string(v) {
		case "t":
			return append(b, "true"...), nil
		case "f":
			return append(b, "false"...), nil
		}
		return bad(fmt.Errorf("not a boolean"))
	case oidInt2, oidInt4, oidInt8, oidOID:
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return bad(err)
		}
		return strconv.AppendInt(b, n, 10), nil
	case oidFloat4, oidFloat8:
		bits := 64
		if c.Type == oidFloat4 {
			bits = 32
		}
		f, err := strconv.ParseFloat(string(v), bits)
		if err != nil {
			return bad(err)
		}
		return appendJavaDouble(b, f, bits), nil
	case oidDate:
		t, err := time.Parse("2006-01-02", string(v))
		if err != nil {
			return bad(err)
		}
		return strconv.AppendInt(b, t.Unix()/86400, 10), nil
	case oidTimestamp:
		t, err := pgtext.Timestamp(v)
		if err != nil {
			return bad(err)
		}
		if c.precision() <= 3 {
			return strconv.AppendInt(b, t.UnixMilli(), 10), nil
		}
		return strconv.AppendInt(b, t.UnixMicro(), 10), nil
	case oidTimestampTZ:
		switch string(v) {
		case "infinity", "-infinity":
			return jsonstr.Append(b, v), nil
		}
		t, err := pgtext.TimestampTZ(v)
		if err != nil {
			return bad(err)
		}
		return jsonstr.Append(b, zonedTimestamp(t, c.precision())), nil
	}
	return jsonstr.Append(b, v), nil
}

// zonedTimestamp formats t as Debezium's ZonedTimestamp does for a column of
// the given precision: in UTC, with exactly that many fractional digits
// (none and no point for 0 digits, as ISO_OFFSET_DATE_TIME then writes a
// zero fraction), and Z.
func zonedTimestamp(t time.Time, precision int) string {
	t = t.UTC()
	s := t.Format("2006-01-02T15:04:05")
	if precision <= 0 || precision > 9 {
		if ns := t.Nanosecond(); ns != 0 {
			s += strings.TrimRight(fmt.Sprintf(".%09d", ns), "0")
		}
		return s + "Z"
	}
	return s + fmt.Sprintf(".%09d", t.Nanosecond())[:precision+1] + "Z"
}

// clip shortens a value quoted in an error.
func clip(v []byte) string {
	if len(v) > 64 {
		return string(v[:64]) + "…"
	}
	return string(v)
}
