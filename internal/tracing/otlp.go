package tracing

import (
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of the OTLP messages the exporter writes and reads, from
// opentelemetry-proto: collector/trace/v1/trace_service.proto,
// trace/v1/trace.proto, resource/v1/resource.proto and
// common/v1/common.proto; and google/rpc/status.proto, the body of an
// OTLP/HTTP error response.
const (
	// ExportTraceServiceRequest
	pbRequestResourceSpans protowire.Number = 1

	// ResourceSpans
	pbResourceSpansResource   protowire.Number = 1
	pbResourceSpansScopeSpans protowire.Number = 2
	pbResourceSpansSchemaURL  protowire.Number = 3

	// Resource
	pbResourceAttributes             protowire.Number = 1
	pbResourceDroppedAttributesCount protowire.Number = 2

	// ScopeSpans
	pbScopeSpansScope     protowire.Number = 1
	pbScopeSpansSpans     protowire.Number = 2
	pbScopeSpansSchemaURL protowire.Number = 3

	// InstrumentationScope
	pbScopeName                   protowire.Number = 1
	pbScopeVersion                protowire.Number = 2
	pbScopeAttributes             protowire.Number = 3
	pbScopeDroppedAttributesCount protowire.Number = 4

	// Span
	pbSpanTraceID                protowire.Number = 1
	pbSpanSpanID                 protowire.Number = 2
	pbSpanTraceState             protowire.Number = 3
	pbSpanParentSpanID           protowire.Number = 4
	pbSpanName                   protowire.Number = 5
	pbSpanKind                   protowire.Number = 6
	pbSpanStartTimeUnixNano      protowire.Number = 7 // fixed64
	pbSpanEndTimeUnixNano        protowire.Number = 8 // fixed64
	pbSpanAttributes             protowire.Number = 9
	pbSpanDroppedAttributesCount protowire.Number = 10
	pbSpanEvents                 protowire.Number = 11
	pbSpanDroppedEventsCount     protowire.Number = 12
	pbSpanLinks                  protowire.Number = 13
	pbSpanDroppedLinksCount      protowire.Number = 14
	pbSpanStatus                 protowire.Number = 15
	pbSpanFlags                  protowire.Number = 16 // fixed32

	// Span.Event
	pbEventTimeUnixNano           protowire.Number = 1 // fixed64
	pbEventName                   protowire.Number = 2
	pbEventAttributes             protowire.Number = 3
	pbEventDroppedAttributesCount protowire.Number = 4

	// Span.Link
	pbLinkTraceID                protowire.Number = 1
	pbLinkSpanID                 protowire.Number = 2
	pbLinkTraceState             protowire.Number = 3
	pbLinkAttributes             protowire.Number = 4
	pbLinkDroppedAttributesCount protowire.Number = 5
	pbLinkFlags                  protowire.Number = 6 // fixed32

	// Status
	pbStatusMessage protowire.Number = 2
	pbStatusCode    protowire.Number = 3

	// KeyValue
	pbKeyValueKey   protowire.Number = 1
	pbKeyValueValue protowire.Number = 2

	// AnyValue (a oneof: exactly one is written, even when zero)
	pbAnyString protowire.Number = 1
	pbAnyBool   protowire.Number = 2
	pbAnyInt    protowire.Number = 3
	pbAnyDouble protowire.Number = 4 // fixed64
	pbAnyArray  protowire.Number = 5
	pbAnyKVList protowire.Number = 6
	pbAnyBytes  protowire.Number = 7

	// ArrayValue and KeyValueList
	pbListValues protowire.Number = 1

	// ExportTraceServiceResponse and ExportTracePartialSuccess
	pbResponsePartialSuccess protowire.Number = 1
	pbPartialRejectedSpans   protowire.Number = 1
	pbPartialErrorMessage    protowire.Number = 2

	// google.rpc.Status
	pbRpcStatusMessage protowire.Number = 2
)

// Enum values of OTLP that differ from the SDK's.
const (
	otlpStatusOK    = 1 // codes.Ok is 2
	otlpStatusError = 2 // codes.Error is 1

	// SpanFlags: the low 8 bits are the W3C trace flags; these say whether
	// the parent (of a span) or the linked span (of a link) is remote.
	flagsHasIsRemote = 0x100
	flagsIsRemote    = 0x200
)

// appendExportRequest appends spans to b as an OTLP ExportTraceServiceRequest:
// grouped by resource, then by instrumentation scope, each group in the
// order of its first span, spans in their order.
func appendExportRequest(b []byte, spans []sdktrace.ReadOnlySpan) []byte {
	for _, rg := range groupSpans(spans) {
		var rs int
		b, rs = openMessage(b, pbRequestResourceSpans)
		if rg.res != nil {
			var m int
			b, m = openMessage(b, pbResourceSpansResource)
			b = appendAttributes(b, pbResourceAttributes, rg.res.Attributes())
			b = closeMessage(b, m)
		}
		for _, sg := range rg.scopes {
			var ss int
			b, ss = openMessage(b, pbResourceSpansScopeSpans)
			b = appendScope(b, sg.scope)
			for _, s := range sg.spans {
				b = appendSpan(b, s)
			}
			b = appendString(b, pbScopeSpansSchemaURL, sg.scope.SchemaURL)
			b = closeMessage(b, ss)
		}
		if rg.res != nil {
			b = appendString(b, pbResourceSpansSchemaURL, rg.res.SchemaURL())
		}
		b = closeMessage(b, rs)
	}
	return b
}

// resourceGroup is the spans of one resource, by scope.
type resourceGroup struct {
	res    *resource.Resource
	scopes []scopeGroup
}

// scopeGroup is the spans of one instrumentation scope.
type scopeGroup struct {
	scope instrumentation.Scope
	spans []sdktrace.ReadOnlySpan
}

// groupSpans groups spans by resource and scope. There are few of either
// (the relay has one of each), so each span's group is found by a scan.
func groupSpans(spans []sdktrace.ReadOnlySpan) []resourceGroup {
	var groups []resourceGroup
	for _, s := range spans {
		res, scope := s.Resource(), s.InstrumentationScope()
		r := -1
		for i := range groups {
			if sameResource(groups[i].res, res) {
				r = i
				break
			}
		}
		if r < 0 {
			groups = append(groups, resourceGroup{res: res})
			r = len(groups) - 1
		}
		g := &groups[r]
		i := -1
		for j := range g.scopes {
			if sameScope(g.scopes[j].scope, scope) {
				i = j
				break
			}
		}
		if i < 0 {
			g.scopes = append(g.scopes, scopeGroup{scope: scope})
			i = len(g.scopes) - 1
		}
		g.scopes[i].spans = append(g.scopes[i].spans, s)
	}
	return groups
}

func sameResource(a, b *resource.Resource) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil {
		return false
	}
	return a.SchemaURL() == b.SchemaURL() && a.Equivalent() == b.Equivalent()
}

func sameScope(a, b instrumentation.Scope) bool {
	return a.Name == b.Name && a.Version == b.Version && a.SchemaURL == b.SchemaURL &&
		a.Attributes.Equivalent() == b.Attributes.Equivalent()
}

// appendScope appends the InstrumentationScope field of a ScopeSpans.
func appendScope(b []byte, scope instrumentation.Scope) []byte {
	b, m := openMessage(b, pbScopeSpansScope)
	b = appendString(b, pbScopeName, scope.Name)
	b = appendString(b, pbScopeVersion, scope.Version)
	b = appendAttributes(b, pbScopeAttributes, scope.Attributes.ToSlice())
	return closeMessage(b, m)
}

// appendSpan appends s as a Span field of a ScopeSpans.
func appendSpan(b []byte, s sdktrace.ReadOnlySpan) []byte {
	b, m := openMessage(b, pbScopeSpansSpans)
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	b = appendBytes(b, pbSpanTraceID, tid[:])
	b = appendBytes(b, pbSpanSpanID, sid[:])
	b = appendString(b, pbSpanTraceState, sc.TraceState().String())
	parent := s.Parent()
	if parent.HasSpanID() {
		psid := parent.SpanID()
		b = appendBytes(b, pbSpanParentSpanID, psid[:])
	}
	b = appendString(b, pbSpanName, s.Name())
	b = appendVarint(b, pbSpanKind, otlpSpanKind(s.SpanKind()))
	b = appendFixed64(b, pbSpanStartTimeUnixNano, unixNano(s.StartTime()))
	b = appendFixed64(b, pbSpanEndTimeUnixNano, unixNano(s.EndTime()))
	b = appendAttributes(b, pbSpanAttributes, s.Attributes())
	b = appendVarint(b, pbSpanDroppedAttributesCount, count(s.DroppedAttributes()))
	for _, ev := range s.Events() {
		var e int
		b, e = openMessage(b, pbSpanEvents)
		b = appendFixed64(b, pbEventTimeUnixNano, unixNano(ev.Time))
		b = appendString(b, pbEventName, ev.Name)
		b = appendAttributes(b, pbEventAttributes, ev.Attributes)
		b = appendVarint(b, pbEventDroppedAttributesCount, count(ev.DroppedAttributeCount))
		b = closeMessage(b, e)
	}
	b = appendVarint(b, pbSpanDroppedEventsCount, count(s.DroppedEvents()))
	for _, l := range s.Links() {
		var lm int
		b, lm = openMessage(b, pbSpanLinks)
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		b = appendBytes(b, pbLinkTraceID, ltid[:])
		b = appendBytes(b, pbLinkSpanID, lsid[:])
		b = appendString(b, pbLinkTraceState, l.SpanContext.TraceState().String())
		b = appendAttributes(b, pbLinkAttributes, l.Attributes)
		b = appendVarint(b, pbLinkDroppedAttributesCount, count(l.DroppedAttributeCount))
		b = appendFixed32(b, pbLinkFlags, spanFlags(l.SpanContext.TraceFlags(), l.SpanContext))
		b = closeMessage(b, lm)
	}
	b = appendVarint(b, pbSpanDroppedLinksCount, count(s.DroppedLinks()))
	if st := s.Status(); st.Code != codes.Unset || st.Description != "" {
		var sm int
		b, sm = openMessage(b, pbSpanStatus)
		b = appendString(b, pbStatusMessage, st.Description)
		switch st.Code {
		case codes.Ok:
			b = appendVarint(b, pbStatusCode, otlpStatusOK)
		case codes.Error:
			b = appendVarint(b, pbStatusCode, otlpStatusError)
		}
		b = closeMessage(b, sm)
	}
	// The span's own trace flags, and whether its parent is remote (a span
	// without a parent has a local one, for this purpose).
	b = appendFixed32(b, pbSpanFlags, spanFlags(sc.TraceFlags(), parent))
	return closeMessage(b, m)
}

// spanFlags is the flags field of a span or link: the trace flags, and
// whether other (the parent, or the linked span) is remote.
func spanFlags(flags trace.TraceFlags, other trace.SpanContext) uint32 {
	f := uint32(flags) | flagsHasIsRemote
	if other.IsRemote() {
		f |= flagsIsRemote
	}
	return f
}

// otlpSpanKind is k's SpanKind value in OTLP, which numbers the kinds as the
// trace API does; an unknown kind is sent as unspecified.
func otlpSpanKind(k trace.SpanKind) uint64 {
	switch k {
	case trace.SpanKindInternal, trace.SpanKindServer, trace.SpanKindClient, trace.SpanKindProducer, trace.SpanKindConsumer:
		return uint64(k)
	}
	return 0
}

// unixNano is t in nanoseconds since the Unix epoch; 0 for the zero time
// (and for a time before 1970, which fixed64 cannot hold).
func unixNano(t time.Time) uint64 {
	if t.IsZero() || t.Before(time.Unix(0, 0)) {
		return 0
	}
	return uint64(t.UnixNano())
}

// count is a dropped count as an uint32 field's value.
func count(n int) uint64 {
	return uint64(min(max(n, 0), math.MaxUint32))
}

// appendAttributes appends each of kvs as a KeyValue field num.
func appendAttributes(b []byte, num protowire.Number, kvs []attribute.KeyValue) []byte {
	for _, kv := range kvs {
		b = appendKeyValue(b, num, string(kv.Key), kv.Value)
	}
	return b
}

func appendKeyValue(b []byte, num protowire.Number, key string, v attribute.Value) []byte {
	b, m := openMessage(b, num)
	b = appendString(b, pbKeyValueKey, key)
	b = appendAnyValue(b, pbKeyValueValue, v)
	return closeMessage(b, m)
}

// appendAnyValue appends v as an AnyValue field num: scalars as such,
// slices as an ArrayValue, maps as a KeyValueList; an empty value as an
// AnyValue with no value.
func appendAnyValue(b []byte, num protowire.Number, v attribute.Value) []byte {
	switch v.Type() {
	case attribute.STRING:
		return appendAnyString(b, num, v.AsString())
	case attribute.BOOL:
		return appendAnyBool(b, num, v.AsBool())
	case attribute.INT64:
		return appendAnyInt(b, num, v.AsInt64())
	case attribute.FLOAT64:
		return appendAnyDouble(b, num, v.AsFloat64())
	}
	b, m := openMessage(b, num)
	switch v.Type() {
	case attribute.EMPTY:
	case attribute.BYTESLICE:
		b = protowire.AppendTag(b, pbAnyBytes, protowire.BytesType)
		b = protowire.AppendBytes(b, v.AsByteSlice())
	case attribute.BOOLSLICE:
		var a int
		b, a = openMessage(b, pbAnyArray)
		for _, x := range v.AsBoolSlice() {
			b = appendAnyBool(b, pbListValues, x)
		}
		b = closeMessage(b, a)
	case attribute.INT64SLICE:
		var a int
		b, a = openMessage(b, pbAnyArray)
		for _, x := range v.AsInt64Slice() {
			b = appendAnyInt(b, pbListValues, x)
		}
		b = closeMessage(b, a)
	case attribute.FLOAT64SLICE:
		var a int
		b, a = openMessage(b, pbAnyArray)
		for _, x := range v.AsFloat64Slice() {
			b = appendAnyDouble(b, pbListValues, x)
		}
		b = closeMessage(b, a)
	case attribute.STRINGSLICE:
		var a int
		b, a = openMessage(b, pbAnyArray)
		for _, x := range v.AsStringSlice() {
			b = appendAnyString(b, pbListValues, x)
		}
		b = closeMessage(b, a)
	case attribute.SLICE:
		var a int
		b, a = openMessage(b, pbAnyArray)
		for _, x := range v.AsSlice() {
			b = appendAnyValue(b, pbListValues, x)
		}
		b = closeMessage(b, a)
	case attribute.MAP:
		var a int
		b, a = openMessage(b, pbAnyKVList)
		for _, kv := range v.AsMap() {
			b = appendKeyValue(b, pbListValues, string(kv.Key), kv.Value)
		}
		b = closeMessage(b, a)
	default: // a type of a later SDK: its text
		b = protowire.AppendTag(b, pbAnyString, protowire.BytesType)
		b = protowire.AppendString(b, validUTF8(v.String()))
	}
	return closeMessage(b, m)
}

// The AnyValue of each scalar. The oneof's field is written even when zero:
// without it the value would be empty, not false, 0 or "".

func appendAnyString(b []byte, num protowire.Number, s string) []byte {
	b, m := openMessage(b, num)
	b = protowire.AppendTag(b, pbAnyString, protowire.BytesType)
	b = protowire.AppendString(b, validUTF8(s))
	return closeMessage(b, m)
}

func appendAnyBool(b []byte, num protowire.Number, x bool) []byte {
	b, m := openMessage(b, num)
	b = protowire.AppendTag(b, pbAnyBool, protowire.VarintType)
	b = protowire.AppendVarint(b, protowire.EncodeBool(x))
	return closeMessage(b, m)
}

func appendAnyInt(b []byte, num protowire.Number, x int64) []byte {
	b, m := openMessage(b, num)
	b = protowire.AppendTag(b, pbAnyInt, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(x))
	return closeMessage(b, m)
}

func appendAnyDouble(b []byte, num protowire.Number, x float64) []byte {
	b, m := openMessage(b, num)
	b = protowire.AppendTag(b, pbAnyDouble, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, math.Float64bits(x))
	return closeMessage(b, m)
}

// Fields of proto3 scalars, left out when they hold the zero value, as a
// protobuf encoder does.

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, validUTF8(s))
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendFixed64(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, v)
}

func appendFixed32(b []byte, num protowire.Number, v uint32) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.Fixed32Type)
	return protowire.AppendFixed32(b, v)
}

// openMessage appends the tag of the embedded message field num and one
// byte for its length, which closeMessage, given the returned offset, sets
// once the message's fields are appended. Messages are encoded in place,
// without a size pass: most are shorter than 128 bytes, and a longer one
// moves right by the extra bytes its length takes.
func openMessage(b []byte, num protowire.Number) ([]byte, int) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	at := len(b)
	return append(b, 0), at
}

// closeMessage sets the length of the message opened at offset at.
func closeMessage(b []byte, at int) []byte {
	n := len(b) - at - 1
	if size := protowire.SizeVarint(uint64(n)); size > 1 {
		b = append(b, make([]byte, size-1)...)
		copy(b[at+size:], b[at+1:at+1+n])
	}
	protowire.AppendVarint(b[at:at], uint64(n)) // overwrites the reserved bytes
	return b
}

// validUTF8 replaces invalid UTF-8 in s, which a protobuf string must not
// hold: a receiver would refuse the whole request for it.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// partialSuccess reads an ExportTraceServiceResponse: how many spans the
// receiver rejected, and its message (which may also be a warning about
// spans it accepted).
func partialSuccess(b []byte) (rejected int64, message string, err error) {
	err = fields(b, func(num protowire.Number, typ protowire.Type, _ uint64, data []byte) error {
		if num != pbResponsePartialSuccess || typ != protowire.BytesType {
			return nil
		}
		return fields(data, func(num protowire.Number, typ protowire.Type, v uint64, data []byte) error {
			switch {
			case num == pbPartialRejectedSpans && typ == protowire.VarintType:
				rejected = int64(v)
			case num == pbPartialErrorMessage && typ == protowire.BytesType:
				message = string(data)
			}
			return nil
		})
	})
	return rejected, message, err
}

// rpcStatusText reads the message of a google.rpc.Status, the body of an
// OTLP/HTTP error response.
func rpcStatusText(b []byte) (message string, err error) {
	err = fields(b, func(num protowire.Number, typ protowire.Type, _ uint64, data []byte) error {
		if num == pbRpcStatusMessage && typ == protowire.BytesType {
			message = string(data)
		}
		return nil
	})
	return message, err
}

// fields calls fn with each field of the protobuf message b, in order: its
// number and wire type, and its value: v for a varint or fixed one, data
// for a length-delimited one (nothing for a group).
func fields(b []byte, fn func(num protowire.Number, typ protowire.Type, v uint64, data []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v uint64
		var data []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var x uint32
			x, n = protowire.ConsumeFixed32(b)
			v = uint64(x)
		case protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			data, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, typ, v, data); err != nil {
			return err
		}
	}
	return nil
}
