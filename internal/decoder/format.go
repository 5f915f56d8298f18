package decoder

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/pgtext"
)

// Type OIDs of the built-in column types whose values the relay treats
// specially (pg_type.oid; fixed for built-in types). A domain over one of them
// has its own OID and is passed on as text.
const (
	TypeBytea       = 17
	TypeInt8        = 20
	TypeInt2        = 21
	TypeInt4        = 23
	TypeJSON        = 114
	TypeTimestamp   = 1114
	TypeTimestampTZ = 1184
	TypeJSONB       = 3802
)

// CheckTimestampType returns an error unless typ, the type OID of the
// outbox.columns.timestamp column, is one ParseTimestamp reads: timestamptz,
// timestamp, or an integer type holding Unix milliseconds.
func CheckTimestampType(typ uint32) error {
	switch typ {
	case TypeTimestampTZ, TypeTimestamp, TypeInt8, TypeInt4, TypeInt2:
		return nil
	}
	return fmt.Errorf("has type OID %d; want timestamptz, timestamp or bigint (Unix milliseconds)", typ)
}

// CheckPartitionType returns an error unless typ, the type OID of the
// outbox.columns.partition column, is an integer type.
func CheckPartitionType(typ uint32) error {
	switch typ {
	case TypeInt8, TypeInt4, TypeInt2:
		return nil
	}
	return fmt.Errorf("has type OID %d; want smallint, integer or bigint", typ)
}

// ParsePartition reads the text of a outbox.columns.partition value. Whether the
// topic has that partition is the sink's to check.
func ParsePartition(text []byte) (int64, error) {
	n, err := strconv.ParseInt(string(text), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("partition column: %q is not an integer", clip(text))
	}
	return n, nil
}

// ParseTimestamp reads the text of a outbox.columns.timestamp value of type typ
// (see CheckTimestampType): a timestamptz in its text form with DateStyle
// ISO (any offset), a timestamp as UTC, or an integer as Unix milliseconds.
// The zero time, for "infinity" and "-infinity", means the value gives no
// timestamp.
func ParseTimestamp(typ uint32, text []byte) (time.Time, error) {
	s := string(text)
	switch typ {
	case TypeInt8, TypeInt4, TypeInt2:
		ms, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("timestamp column: %q is not a number of milliseconds", clip(text))
		}
		return time.UnixMilli(ms).UTC(), nil
	}
	if s == "infinity" || s == "-infinity" {
		return time.Time{}, nil
	}
	read := pgtext.TimestampTZ
	if typ == TypeTimestamp {
		read = pgtext.Timestamp
	}
	if t, err := read(text); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("timestamp column: cannot read %q (the relay reads DateStyle ISO, Postgres's default)", clip(text))
}

// Content-type settings (outbox.content_type) besides an explicit MIME type.
const (
	// ContentTypeAuto sends "content-type: application/json" for a json or
	// jsonb payload column and no header for any other type.
	ContentTypeAuto = "auto"
	// ContentTypeNone never sends a content-type header.
	ContentTypeNone = "none"
)

// mimeJSON is the content type ContentTypeAuto gives json and jsonb payloads.
const mimeJSON = "application/json"

// DefaultTracingColumn is the outbox column holding a trace context, as
// Debezium's outbox event router names it.
const DefaultTracingColumn = "tracingspancontext"

// CheckContentType returns an error when setting is neither "", auto, none nor
// a MIME type (type/subtype, optionally with parameters).
func CheckContentType(setting string) error {
	switch setting {
	case "", ContentTypeAuto, ContentTypeNone:
		return nil
	}
	media, _, _ := strings.Cut(setting, ";")
	typ, sub, ok := strings.Cut(strings.TrimSpace(media), "/")
	if !ok || !httpguts.ValidHeaderFieldName(typ) || !httpguts.ValidHeaderFieldName(sub) || strings.ContainsAny(setting, "\r\n") {
		return fmt.Errorf("%q is not auto, none or a MIME type such as application/vnd.apache.avro+binary", setting)
	}
	return nil
}

// Format is how the relay turns an outbox row's column text into the message
// it publishes, given the types of the payload and key columns: a bytea
// payload or key goes out as its raw bytes, the content-type header follows
// the setting and the payload type, and the tracing column's trace context
// becomes traceparent/tracestate headers. The decoder builds one from each
// Relation message; outboxtable builds one from the catalog, so that a replay
// publishes what the stream published, byte for byte.
type Format struct {
	payloadBytea, keyBytea bool
	payloadJSON            bool   // a json or jsonb payload column
	contentType            []byte // nil: no header
	tracing                bool   // the table has the tracing column
	// shared: the payload or key column's value is also another field's, so
	// it must be decoded into a copy, not in place.
	shared bool
}

// NewFormat returns the Format of an outbox table whose payload and key
// (aggregate id) columns have the type OIDs payloadType and keyType.
// contentType is the outbox.content_type setting (see CheckContentType; "" means
// none, so that a zero configuration publishes what it always did); tracing says whether the table has the tracing column.
func NewFormat(contentType string, payloadType, keyType uint32, tracing bool) Format {
	f := Format{payloadBytea: payloadType == TypeBytea, keyBytea: keyType == TypeBytea, tracing: tracing,
		payloadJSON: payloadType == TypeJSON || payloadType == TypeJSONB}
	switch contentType {
	case ContentTypeAuto:
		if payloadType == TypeJSON || payloadType == TypeJSONB {
			f.contentType = []byte(mimeJSON)
		}
	case "", ContentTypeNone:
	default:
		f.contentType = []byte(contentType)
	}
	return f
}

// extraHeaders is the most headers Apply adds.
func (f Format) extraHeaders() int {
	n := 0
	if f.contentType != nil {
		n++
	}
	if f.tracing {
		n += 2
	}
	return n
}

// Apply rewrites ev as the relay publishes it: it decodes a bytea payload and
// key from their text form (in place, overwriting the text, unless the value
// is shared; see Format.shared), sets ev.PayloadType from the payload
// column's type, and appends the content-type and trace headers to ev.Headers.
// trace is the tracing column's text (nil for NULL or no column).
//
// A bytea value that is not in Postgres's hex or escape output format is an
// error (the event cannot be published as stored). A trace value that is not a
// trace context is not: Apply returns it as badTrace, adds no trace headers,
// and the event goes out without them.
func (f Format) Apply(ev *outbox.Event, trace []byte) (badTrace, err error) {
	decode := DecodeBytea
	if f.shared {
		decode = func(b []byte) ([]byte, error) { return DecodeBytea(bytes.Clone(b)) }
	}
	switch {
	case f.payloadBytea:
		ev.PayloadType = outbox.PayloadBinary
		if ev.Payload != nil {
			if ev.Payload, err = decode(ev.Payload); err != nil {
				return nil, fmt.Errorf("payload column: %w", err)
			}
		}
	case f.payloadJSON:
		ev.PayloadType = outbox.PayloadJSON
	default:
		ev.PayloadType = outbox.PayloadText
	}
	if f.keyBytea && ev.AggregateID != nil {
		if ev.AggregateID, err = decode(ev.AggregateID); err != nil {
			return nil, fmt.Errorf("aggregate id column: %w", err)
		}
	}
	if f.contentType != nil {
		ev.Headers = append(ev.Headers, outbox.Header{Key: outbox.HeaderContentType, Value: f.contentType})
	}
	if f.tracing && trace != nil {
		parent, state, err := ParseTraceContext(trace)
		if err != nil {
			return err, nil
		}
		ev.Headers = append(ev.Headers, outbox.Header{Key: outbox.HeaderTraceParent, Value: parent})
		if state != nil {
			ev.Headers = append(ev.Headers, outbox.Header{Key: outbox.HeaderTraceState, Value: state})
		}
	}
	return nil, nil
}

// DecodeBytea decodes the text form of a bytea value, as byteaout writes it,
// into its raw bytes: the hex format ("\x" and two hex digits a byte, the
// default since PostgreSQL 9.0) or the escape format of bytea_output=escape
// (printable bytes as themselves, "\\" for a backslash, "\ooo" octal for the
// rest). It decodes in place: the result shares text's memory, which it
// overwrites.
func DecodeBytea(text []byte) ([]byte, error) {
	if len(text) >= 2 && text[0] == '\\' && text[1] == 'x' {
		return decodeHex(text)
	}
	return decodeEscape(text)
}

func decodeHex(text []byte) ([]byte, error) {
	// byteain allows whitespace between digit pairs; byteaout never writes it.
	n := 0
	for i := 2; i < len(text); {
		if c := text[i]; c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			i++
			continue
		}
		if i+1 >= len(text) {
			return nil, errors.New("decode bytea hex: odd number of hex digits")
		}
		hi, ok1 := unhex(text[i])
		lo, ok2 := unhex(text[i+1])
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("decode bytea hex: invalid hex digit at byte %d", i)
		}
		text[n] = hi<<4 | lo
		n++
		i += 2
	}
	return text[:n:n], nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func decodeEscape(text []byte) ([]byte, error) {
	n := 0
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c != '\\':
			i++
		case i+1 < len(text) && text[i+1] == '\\':
			i += 2
		case i+3 < len(text) && isOctal(text[i+1], '3') && isOctal(text[i+2], '7') && isOctal(text[i+3], '7'):
			c = (text[i+1]-'0')<<6 | (text[i+2]-'0')<<3 | (text[i+3] - '0')
			i += 4
		default:
			return nil, fmt.Errorf("decode bytea escape format: invalid escape at byte %d (want \\\\ or \\ and three octal digits)", i)
		}
		text[n] = c
		n++
	}
	return text[:n:n], nil
}

func isOctal(c, max byte) bool { return '0' <= c && c <= max }

// ParseTraceContext reads a tracing column value: a W3C traceparent
// ("00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>") or Debezium's Java
// properties text ("traceparent=00-…" and optionally "tracestate=…" lines,
// "#" comments). It returns the traceparent and the tracestate (nil when
// absent), or an error saying what is wrong. The results share v's memory
// unless the properties text has escapes.
func ParseTraceContext(v []byte) (traceparent, tracestate []byte, err error) {
	s := bytes.TrimSpace(v)
	if !bytes.ContainsAny(s, "=:\n") || isTraceParent(s) {
		if !isTraceParent(s) {
			return nil, nil, fmt.Errorf("trace context %q is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)", clip(s))
		}
		return s, nil, nil
	}
	for len(s) > 0 {
		var line []byte
		line, s, _ = bytes.Cut(s, []byte("\n"))
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' || line[0] == '!' {
			continue
		}
		key, val, err := propertyLine(line)
		if err != nil {
			return nil, nil, err
		}
		switch string(key) {
		case outbox.HeaderTraceParent:
			traceparent = val
		case outbox.HeaderTraceState:
			tracestate = val
		}
	}
	if traceparent == nil {
		return nil, nil, errors.New("trace context properties have no traceparent")
	}
	if !isTraceParent(traceparent) {
		return nil, nil, fmt.Errorf("trace context traceparent %q is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)", clip(traceparent))
	}
	if !isTraceState(tracestate) {
		return nil, nil, fmt.Errorf("trace context tracestate %q has characters a tracestate cannot have", clip(tracestate))
	}
	return traceparent, tracestate, nil
}

// clip shortens a bad value for an error message.
func clip(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "…"
	}
	return string(b)
}

// propertyLine splits one line of java.util.Properties text at the first
// unescaped '=', ':' or space, and unescapes key and value.
func propertyLine(line []byte) (key, val []byte, err error) {
	sep := -1
	for i := 0; i < len(line); i++ {
		if line[i] == '\\' {
			i++
			continue
		}
		if c := line[i]; c == '=' || c == ':' || c == ' ' || c == '\t' {
			sep = i
			break
		}
	}
	if sep < 0 {
		return nil, nil, fmt.Errorf("trace context properties line %q has no key=value", clip(line))
	}
	key, val = line[:sep], bytes.TrimLeft(line[sep+1:], " \t")
	if len(val) > 0 && (val[0] == '=' || val[0] == ':') && (line[sep] == ' ' || line[sep] == '\t') {
		val = bytes.TrimLeft(val[1:], " \t") // "key = value"
	}
	if key, err = unescapeProperty(key); err != nil {
		return nil, nil, err
	}
	if val, err = unescapeProperty(val); err != nil {
		return nil, nil, err
	}
	return key, val, nil
}

// unescapeProperty undoes Properties.store's escapes: \t \n \r \f, \uXXXX
// and a backslash before any other character. Without escapes it returns b.
func unescapeProperty(b []byte) ([]byte, error) {
	if bytes.IndexByte(b, '\\') < 0 {
		return b, nil
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			out = append(out, b[i])
			continue
		}
		i++
		if i == len(b) {
			return nil, errors.New("trace context properties: line ends in a backslash")
		}
		switch c := b[i]; c {
		case 't':
			out = append(out, '\t')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 'f':
			out = append(out, '\f')
		case 'u':
			if len(b)-i < 5 {
				return nil, errors.New("trace context properties: truncated \\u escape")
			}
			r, err := strconv.ParseUint(string(b[i+1:i+5]), 16, 16)
			if err != nil {
				return nil, fmt.Errorf("trace context properties: bad \\u escape %q", b[i-1:i+5])
			}
			out = append(out, string(rune(r))...)
			i += 4
		default:
			out = append(out, c)
		}
	}
	return out, nil
}

// isTraceParent checks a W3C traceparent: version, trace id, parent id and
// flags in lower-case hex, ids not all zero, version ff invalid; versions
// above 00 may carry more fields after the flags.
func isTraceParent(b []byte) bool {
	if len(b) < 55 || b[2] != '-' || b[35] != '-' || b[52] != '-' {
		return false
	}
	version, traceID, parentID, flags := b[0:2], b[3:35], b[36:52], b[53:55]
	if !isLowerHex(version) || string(version) == "ff" || !isLowerHex(traceID) || !isLowerHex(parentID) || !isLowerHex(flags) {
		return false
	}
	if allZero(traceID) || allZero(parentID) {
		return false
	}
	if len(b) > 55 {
		return string(version) != "00" && b[55] == '-'
	}
	return true
}

func isLowerHex(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != '0' {
			return false
		}
	}
	return true
}

// isTraceState accepts what a tracestate header can hold: at most 512
// printable ASCII characters (the list syntax is the tracer's business).
func isTraceState(b []byte) bool {
	if len(b) > 512 {
		return false
	}
	for _, c := range b {
		if c < ' ' || c > '~' {
			return false
		}
	}
	return true
}
