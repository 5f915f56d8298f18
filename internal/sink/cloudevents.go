package sink

// CloudEvents (Config.CloudEventsSource): the Kafka protocol binding's
// binary content mode writes the attributes as ce_ headers (batch.go); its
// structured content mode, here, makes the record value the whole event in
// the JSON event format (CloudEvents 1.0.2, json-format.md), written by hand:
// no reflection, one pass over each field.

import (
	"bytes"
	"encoding/base64"
	"unicode/utf8"

	"github.com/cdc-relay/cdc-relay/internal/jsonstr"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

// CloudEventsMode is the content mode of the CloudEvents Kafka protocol
// binding that records take when Config.CloudEventsSource is set.
type CloudEventsMode uint8

// Content modes.
const (
	// CloudEventsBinary writes the attributes as ce_ headers and the payload,
	// unchanged, as the value.
	CloudEventsBinary CloudEventsMode = iota
	// CloudEventsStructured writes the value as a JSON CloudEvent (header
	// content-type: ContentTypeCloudEventsJSON) with the payload as its data,
	// and no ce_ headers.
	CloudEventsStructured
)

// ContentTypeCloudEventsJSON is the content-type header of a record in the
// structured content mode: the JSON event format's media type, as the Kafka
// binding writes it.
const ContentTypeCloudEventsJSON = "application/cloudevents+json; charset=UTF-8"

var contentTypeCEJSON = []byte(ContentTypeCloudEventsJSON)

// ceData is how a structured event carries its payload.
type ceData uint8

const (
	ceNoData     ceData = iota // no data member: an empty or NULL payload
	ceDataJSON                 // "data": the payload itself, a JSON document
	ceDataString               // "data": the payload as a JSON string
	ceDataBase64               // "data_base64": the payload in base64
)

// structuredData decides, by the JSON event format's rules, how ev's payload
// goes into a structured event, ct being its content type (the
// datacontenttype; nil for none): binary bytes (a bytea column) in base64
// under data_base64; JSON-formatted content (ct */json or */*+json, or no ct
// and a JSON payload) as the data itself; anything else as a string, unless
// it is not valid UTF-8, which a JSON string cannot hold: then in base64 too.
// A text payload that ct calls JSON must be valid JSON (Produce checks).
func structuredData(ev *outbox.Event, ct []byte) ceData {
	switch {
	case len(ev.Payload) == 0:
		return ceNoData
	case ev.PayloadType == outbox.PayloadBinary:
		return ceDataBase64
	case ct == nil && ev.PayloadType == outbox.PayloadJSON, ct != nil && isJSONMediaType(ct):
		return ceDataJSON
	case !utf8.Valid(ev.Payload):
		return ceDataBase64
	}
	return ceDataString
}

// needsJSONCheck reports whether ev's payload, in a structured event, is
// written as JSON on the word of its content type ct alone: a text payload
// that the content type (outbox.content_type) calls JSON, which may not be JSON at all.
func needsJSONCheck(ev *outbox.Event, ct []byte) bool {
	return ev.PayloadType == outbox.PayloadText && len(ev.Payload) > 0 && ct != nil && isJSONMediaType(ct)
}

// isJSONMediaType reports whether ct declares JSON-formatted content: its
// media type, without parameters, is */json or */*+json (case-insensitive).
func isJSONMediaType(ct []byte) bool {
	if i := bytes.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = bytes.TrimSpace(ct)
	slash := bytes.IndexByte(ct, '/')
	if slash <= 0 {
		return false
	}
	sub := ct[slash+1:]
	n := len(sub)
	return n >= 4 && bytes.EqualFold(sub[n-4:], []byte("json")) && (n == 4 || sub[n-5] == '+')
}

// eventHeader returns the value of ev's header key, nil when it has none.
func eventHeader(ev *outbox.Event, key string) []byte {
	for _, h := range ev.Headers {
		if h.Key == key {
			return h.Value
		}
	}
	return nil
}

// appendStructured appends m's event as a JSON CloudEvent: specversion, id,
// source (e.ceSourceJSON), type, time (the commit time, RFC 3339; none when
// unknown), datacontenttype (the content-type header, when the event has
// one), the distributed tracing extension's traceparent and tracestate (the
// trace context headers, when present, with m.TraceParent replacing the
// event's), then data or data_base64 (structuredData).
func (e *encoder) appendStructured(dst []byte, m *Message) []byte {
	ev := m.Event
	var ct, parent, state []byte
	for _, h := range ev.Headers {
		switch h.Key {
		case outbox.HeaderContentType:
			ct = h.Value
		case outbox.HeaderTraceParent:
			parent = m.headerValue(h)
		case outbox.HeaderTraceState:
			state = h.Value
		}
	}
	dst = append(dst, `{"specversion":"1.0","id":`...)
	dst = jsonstr.Append(dst, ev.ID)
	dst = append(dst, `,"source":`...)
	dst = append(dst, e.ceSourceJSON...)
	dst = append(dst, `,"type":`...)
	dst = jsonstr.Append(dst, ev.EventType)
	if !ev.CommitTime.IsZero() {
		dst = append(dst, `,"time":"`...)
		dst = append(dst, e.timeBytes(ev.CommitTime)...) // digits, '-', ':', '.', 'T', 'Z': nothing to escape
		dst = append(dst, '"')
	}
	if ct != nil {
		dst = append(dst, `,"datacontenttype":`...)
		dst = jsonstr.Append(dst, ct)
	}
	if parent != nil {
		dst = append(dst, `,"traceparent":`...)
		dst = jsonstr.Append(dst, parent)
		if state != nil {
			dst = append(dst, `,"tracestate":`...)
			dst = jsonstr.Append(dst, state)
		}
	}
	switch structuredData(ev, ct) {
	case ceDataJSON:
		dst = append(dst, `,"data":`...)
		dst = append(dst, ev.Payload...)
	case ceDataString:
		dst = append(dst, `,"data":`...)
		dst = jsonstr.Append(dst, ev.Payload)
	case ceDataBase64:
		dst = append(dst, `,"data_base64":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, ev.Payload)
		dst = append(dst, '"')
	}
	return append(dst, '}')
}

// structuredOverhead estimates how many bytes a structured event adds to the
// event's own (outbox.Event.Size) without writing it, for batch sizing: the
// member names and the source, a third more for a payload in base64. Escapes
// are not counted; a batch that turns out too large is split (dispatch.go).
func structuredOverhead(ev *outbox.Event, sourceLen int) int {
	n := 160 + sourceLen
	if ev.PayloadType == outbox.PayloadBinary {
		n += len(ev.Payload)/3 + 4
	}
	return n
}
