package decoder

// The message outbox: transactional logical decoding messages
// (pg_logical_emit_message(true, prefix, content)) whose prefix is
// Config.MessagePrefix are outbox events, decoded from a JSON envelope in
// their content. Postgres sends them only with pgoutput's messages option
// (PostgreSQL 14+), inside the transaction that wrote them, in WAL order
// among its inserts; a rolled-back transaction's messages are never sent.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/cdc-relay/cdc-relay/internal/connectjson"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

// CodeBadMessage is the error code (outbox.EventError) of a logical decoding
// message with the outbox's prefix whose content is not a valid envelope: a
// permanent failure, dead-lettered with the raw content as its payload.
const CodeBadMessage = "bad_message"

// The members of a message's JSON envelope.
const (
	MessageKeyID            = "id"
	MessageKeyAggregateType = "aggregate_type"
	MessageKeyAggregateID   = "aggregate_id"
	MessageKeyEventType     = "event_type"
	MessageKeyPayload       = "payload"
	MessageKeyPayloadBase64 = "payload_base64"
	MessageKeyHeaders       = "headers"
)

// typeText is the OID of text, the type the JSON encodings give a message's
// string members.
const typeText = 25

// flagTransactional is the flags bit of a transactional logical decoding
// message (pgoutput's Message).
const flagTransactional = 1

// messageOutbox is how a Decoder reads the message outbox: the prefix, and
// what the configuration says of formats, fixed once in New.
type messageOutbox struct {
	prefix      string
	contentType string
	envelope    []EnvelopeColumn
	envAliases  []string
	// jsonEnc and byteaEnc write JSON-encoded keys and values (Config.JSON)
	// of events with a JSON and a binary (payload_base64) payload; nil when
	// both encodings are raw.
	jsonEnc, byteaEnc *connectjson.Encoder
	routeByType       bool
}

// newMessageOutbox returns the message outbox of cfg, nil without a prefix.
func newMessageOutbox(cfg Config) (*messageOutbox, error) {
	if cfg.MessagePrefix == "" {
		return nil, nil
	}
	mo := &messageOutbox{prefix: cfg.MessagePrefix, contentType: cfg.ContentType, envelope: cfg.EnvelopeColumns, routeByType: cfg.RouteByEventType}
	for _, c := range cfg.EnvelopeColumns {
		mo.envAliases = append(mo.envAliases, c.Alias)
	}
	if cfg.JSON.Key != connectjson.Raw || cfg.JSON.Value != connectjson.Raw {
		var err error
		if mo.jsonEnc, err = mo.encoder(cfg.JSON, TypeJSONB); err != nil {
			return nil, err
		}
		if mo.byteaEnc, err = mo.encoder(cfg.JSON, TypeBytea); err != nil {
			return nil, err
		}
	}
	return mo, nil
}

// encoder returns the JSON encoder of messages whose payload has type
// payType: their members are text, the aggregate id never NULL.
func (mo *messageOutbox) encoder(o connectjson.Options, payType uint32) (*connectjson.Encoder, error) {
	l := connectjson.Layout{
		Key:          connectjson.Column{Name: MessageKeyAggregateID, Type: typeText, Typmod: -1, NotNull: true},
		Payload:      connectjson.Column{Name: MessageKeyPayload, Type: payType, Typmod: -1},
		PayloadField: MessageKeyPayload,
	}
	for _, ec := range mo.envelope {
		l.Envelope = append(l.Envelope, connectjson.EnvelopeField{Alias: ec.Alias, Column: connectjson.Column{Name: ec.Column, Type: typeText, Typmod: -1}})
	}
	enc, err := connectjson.New(o, l)
	if err != nil {
		return nil, fmt.Errorf("message outbox: %w", err)
	}
	return enc, nil
}

// message decodes a logical decoding Message: Int8 flags, Int64 LSN, String
// prefix, Int32 length, the content. One with another prefix, or any while
// the message outbox is off, is KindSkip; a non-transactional one with the
// outbox's prefix is KindNonTransactional; a transactional one is KindEvent,
// with Failed set when its content is not a valid envelope.
func (d *Decoder) message(b []byte) (Message, error) {
	if err := skipLogicalMessage(b); err != nil {
		return Message{}, err
	}
	flags := b[0]
	r := reader{b: b, p: 9}
	prefix := r.cstring()
	r.skip(4)
	content := b[r.p:]
	mo := d.msgs
	if mo == nil || string(prefix) != mo.prefix {
		return Message{Kind: KindSkip}, nil
	}
	if flags&flagTransactional == 0 {
		return Message{Kind: KindNonTransactional}, nil
	}
	if !d.inTxn {
		return Message{}, errors.New("transactional message outside a transaction")
	}
	ev, failed := mo.event(content)
	ev.MessagePrefix = mo.prefix
	ev.XID = d.xid
	ev.CommitLSN = d.commitLSN
	ev.CommitTime = d.commitTime
	ev.Index = d.index
	d.index++
	return Message{Kind: KindEvent, XID: d.xid, CommitLSN: d.commitLSN, CommitTime: d.commitTime, Event: ev, Failed: failed}, nil
}

// event builds the event of a message's content, or, when the content is not
// a valid envelope, an event that carries the raw content as its payload
// (and what of the envelope could be read) and the bad_message failure.
func (mo *messageOutbox) event(content []byte) (*outbox.Event, error) {
	ev, err := mo.parse(content)
	if err == nil {
		return ev, nil
	}
	bad := &outbox.Event{Payload: bytes.Clone(content), PayloadType: outbox.PayloadText}
	if !utf8.Valid(content) {
		bad.PayloadType = outbox.PayloadBinary
	}
	if env, rerr := readEnvelope(bad.Payload); rerr == nil {
		// What can be read names the letter for the operator.
		bad.ID, _ = jsonString(env.id)
		bad.AggregateType, _ = jsonString(env.aggregateType)
		bad.AggregateID, _ = jsonString(env.aggregateID)
		bad.EventType, _ = jsonString(env.eventType)
	}
	return bad, &outbox.EventError{Code: CodeBadMessage, Err: fmt.Errorf("message content: %w", err)}
}

// envelope holds the raw JSON of an envelope's members, nil when absent.
type envelope struct {
	id, aggregateType, aggregateID, eventType []byte
	payload, payloadBase64, headers           []byte
}

// readEnvelope reads the members of content, a JSON object, in one pass:
// the values share content's memory. A member given twice counts as its
// last value, as encoding/json reads it.
func readEnvelope(content []byte) (envelope, error) {
	var env envelope
	if !json.Valid(content) {
		return env, fmt.Errorf("not a JSON object (%s)", clip(content))
	}
	err := objectMembers(content, func(key, val []byte) error {
		switch string(key) {
		case MessageKeyID:
			env.id = val
		case MessageKeyAggregateType:
			env.aggregateType = val
		case MessageKeyAggregateID:
			env.aggregateID = val
		case MessageKeyEventType:
			env.eventType = val
		case MessageKeyPayload:
			env.payload = val
		case MessageKeyPayloadBase64:
			env.payloadBase64 = val
		case MessageKeyHeaders:
			env.headers = val
		}
		return nil
	})
	if err != nil {
		return env, fmt.Errorf("not a JSON object (%s)", clip(content))
	}
	return env, nil
}

// parse reads a valid envelope into an event, or says what is wrong. The
// event's values share one copy of content.
func (mo *messageOutbox) parse(content []byte) (*outbox.Event, error) {
	buf := bytes.Clone(content)
	env, err := readEnvelope(buf)
	if err != nil {
		return nil, err
	}
	ev := &outbox.Event{}
	for _, f := range []struct {
		key   string
		raw   []byte
		dst   *[]byte
		empty bool // may be ""
	}{
		{MessageKeyID, env.id, &ev.ID, false},
		{MessageKeyAggregateType, env.aggregateType, &ev.AggregateType, true},
		{MessageKeyAggregateID, env.aggregateID, &ev.AggregateID, false},
		{MessageKeyEventType, env.eventType, &ev.EventType, true},
	} {
		if f.raw == nil {
			return nil, fmt.Errorf("missing %s", f.key)
		}
		var ok bool
		if *f.dst, ok = jsonString(f.raw); !ok {
			return nil, fmt.Errorf("%s is not a string", f.key)
		}
		if len(*f.dst) == 0 && !f.empty {
			return nil, fmt.Errorf("%s is empty", f.key)
		}
	}
	switch {
	case env.payload != nil && env.payloadBase64 != nil:
		return nil, fmt.Errorf("both %s and %s: give one", MessageKeyPayload, MessageKeyPayloadBase64)
	case env.payload != nil:
		ev.Payload, ev.PayloadType = env.payload, outbox.PayloadJSON
	case env.payloadBase64 != nil:
		s, ok := jsonString(env.payloadBase64)
		if !ok {
			return nil, fmt.Errorf("%s is not a string", MessageKeyPayloadBase64)
		}
		if ev.Payload, err = base64.StdEncoding.AppendDecode(nil, s); err != nil {
			return nil, fmt.Errorf("%s is not base64: %w", MessageKeyPayloadBase64, err)
		}
		ev.PayloadType = outbox.PayloadBinary
	default:
		return nil, fmt.Errorf("missing %s (or %s)", MessageKeyPayload, MessageKeyPayloadBase64)
	}
	if h := env.headers; h != nil && string(h) != "null" {
		if h[0] != '{' {
			return nil, fmt.Errorf("%s is not an object of string values", MessageKeyHeaders)
		}
		err := objectMembers(h, func(key, val []byte) error {
			v, ok := jsonString(val)
			switch {
			case !ok:
				return fmt.Errorf("%s is not an object of string values", MessageKeyHeaders)
			case len(key) == 0:
				return fmt.Errorf("%s has an empty key", MessageKeyHeaders)
			case reservedMessageHeader(string(key)):
				return fmt.Errorf("header %q is set by the relay itself: use another name", key)
			}
			for i := range ev.Headers {
				if string(ev.Headers[i].Key) == string(key) {
					ev.Headers[i].Value = v // the last of a repeated key
					return nil
				}
			}
			ev.Headers = append(ev.Headers, outbox.Header{Key: string(key), Value: v})
			return nil
		})
		if err != nil {
			return nil, err
		}
		slices.SortFunc(ev.Headers, func(a, b outbox.Header) int { return strings.Compare(a.Key, b.Key) })
	}
	payType := uint32(TypeJSONB)
	if ev.PayloadType == outbox.PayloadBinary {
		payType = TypeBytea
	}
	if ct := NewFormat(mo.contentType, payType, typeText, false).contentType; ct != nil {
		ev.Headers = append(ev.Headers, outbox.Header{Key: outbox.HeaderContentType, Value: ct})
	}
	if err := mo.encode(ev, payType, env); err != nil {
		return nil, err
	}
	return ev, nil
}

// encode writes the event's key and value as the formats say: the envelope
// of Config.EnvelopeColumns (whose columns name the envelope's string
// members, or else its headers) and the JSON encodings.
func (mo *messageOutbox) encode(ev *outbox.Event, payType uint32, env envelope) error {
	if len(mo.envelope) == 0 && mo.jsonEnc == nil {
		return nil
	}
	vals := make([][]byte, len(mo.envelope))
	for i, ec := range mo.envelope {
		switch ec.Column {
		case MessageKeyID:
			vals[i] = ev.ID
		case MessageKeyAggregateType:
			vals[i] = ev.AggregateType
		case MessageKeyAggregateID:
			vals[i] = ev.AggregateID
		case MessageKeyEventType:
			vals[i] = ev.EventType
		default:
			for _, h := range ev.Headers {
				if h.Key == ec.Column && h.Key != outbox.HeaderContentType {
					vals[i] = h.Value
				}
			}
		}
	}
	if mo.jsonEnc == nil {
		ev.Payload = Envelope(ev.Payload, payType, mo.envAliases, vals)
		ev.PayloadType = outbox.PayloadJSON
		return nil
	}
	enc := mo.jsonEnc
	if payType == TypeBytea {
		enc = mo.byteaEnc
	}
	routedBy := ev.AggregateType
	if mo.routeByType {
		routedBy = ev.EventType
	}
	var err error
	if ev.Payload, err = enc.Value(ev.Payload, vals, routedBy, nil); err != nil {
		return err
	}
	if ev.AggregateID, err = enc.Key(ev.AggregateID); err != nil {
		return fmt.Errorf("key: %w", err)
	}
	return nil
}

// jsonString returns the text of raw, a valid JSON value, when it is a
// string: without escapes it shares raw's memory.
func jsonString(raw []byte) ([]byte, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return nil, false
	}
	inner := raw[1 : len(raw)-1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return inner, true
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return nil, false
	}
	return []byte(s), true
}

// objectMembers calls fn with each member of b, a valid JSON object (json.Valid
// holds): its key (unescaped) and its raw value. It returns fn's first error,
// or one when b is not an object.
func objectMembers(b []byte, fn func(key, val []byte) error) error {
	p := skipSpace(b, 0)
	if p >= len(b) || b[p] != '{' {
		return errors.New("not a JSON object")
	}
	p = skipSpace(b, p+1)
	if p < len(b) && b[p] == '}' {
		return nil
	}
	for p < len(b) {
		end := skipValue(b, p) // the key, a string
		key, ok := jsonString(b[p:end])
		if !ok {
			return errors.New("not a JSON object")
		}
		p = skipSpace(b, end) + 1 // the colon
		p = skipSpace(b, p)
		end = skipValue(b, p)
		if err := fn(key, b[p:end]); err != nil {
			return err
		}
		p = skipSpace(b, end)
		if p >= len(b) || b[p] == '}' {
			return nil
		}
		p = skipSpace(b, p+1) // the comma
	}
	return nil
}

// skipSpace returns the index of the first byte at or after p that is not
// JSON white space.
func skipSpace(b []byte, p int) int {
	for p < len(b) && (b[p] == ' ' || b[p] == '\t' || b[p] == '\n' || b[p] == '\r') {
		p++
	}
	return p
}

// skipValue returns the index just after the valid JSON value at b[p:].
func skipValue(b []byte, p int) int {
	depth := 0
	for p < len(b) {
		switch c := b[p]; c {
		case '"':
			p++
			for p < len(b) && b[p] != '"' {
				if b[p] == '\\' {
					p++
				}
				p++
			}
			p++ // the closing quote
			if depth == 0 {
				return p
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return p + 1
			}
			if depth < 0 {
				return p
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return p
			}
		}
		p++
	}
	return p
}

// reservedMessageHeader reports whether key is a header the relay sets
// itself (the sink's id, event_type, aggregate_type, commit_lsn,
// commit_time and source_position; content-type; CloudEvents' ce_*; the
// relay's cdc_relay_*), which a message's headers cannot set. traceparent
// and tracestate can: a message outbox has no tracing column.
func reservedMessageHeader(key string) bool {
	return sinkHeader(key) || key == outbox.HeaderContentType || strings.HasPrefix(key, "ce_") || strings.HasPrefix(key, "cdc_relay_")
}
