package decoder

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
)

// EnvelopeKeyPayload is the envelope's member holding the payload.
const EnvelopeKeyPayload = "payload"

// EnvelopeColumn is one outbox column placed in the value's envelope
// (outbox.envelope_columns, Debezium's table.fields.additional.placement
// column:envelope:alias): its text under Alias.
type EnvelopeColumn struct {
	Column string
	Alias  string
}

// checkEnvelope returns an error when cols has an empty name or alias, an
// alias twice, or the alias "payload".
func checkEnvelope(cols []EnvelopeColumn) error {
	seen := map[string]bool{}
	for _, c := range cols {
		if c.Column == "" || c.Alias == "" {
			return fmt.Errorf("empty column or alias in %q=%q: use column or column=alias", c.Column, c.Alias)
		}
		if c.Alias == EnvelopeKeyPayload {
			return fmt.Errorf("alias %q of column %q is the payload's own member: choose another alias", c.Alias, c.Column)
		}
		if seen[c.Alias] {
			return fmt.Errorf("alias %q is used twice", c.Alias)
		}
		seen[c.Alias] = true
	}
	return nil
}

// Envelope returns the value of an event with envelope columns: a JSON
// object {"payload": P, "<alias>": "<column text>", …}, members in the
// order of aliases, as Debezium's JsonConverter with schemas.enable=false
// writes its envelope. P is the payload itself for a json or jsonb payload
// column (payloadType), a base64 string for bytea (payload holds its raw
// bytes), a JSON string of the text otherwise; NULL is null, as is a NULL
// column. The event's payload type is then outbox.PayloadJSON.
func Envelope(payload []byte, payloadType uint32, aliases []string, values [][]byte) []byte {
	var b bytes.Buffer
	b.WriteString(`{"payload":`)
	switch {
	case payload == nil:
		b.WriteString("null")
	case payloadType == TypeJSON || payloadType == TypeJSONB:
		b.Write(payload)
	case payloadType == TypeBytea:
		writeJSONString(&b, base64.StdEncoding.EncodeToString(payload))
	default:
		writeJSONString(&b, string(payload))
	}
	for i, alias := range aliases {
		b.WriteByte(',')
		writeJSONString(&b, alias)
		b.WriteByte(':')
		if values[i] == nil {
			b.WriteString("null")
		} else {
			writeJSONString(&b, string(values[i]))
		}
	}
	b.WriteByte('}')
	return b.Bytes()
}

// writeJSONString writes s as a JSON string, without HTML escapes.
func writeJSONString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)       // a string always encodes
	b.Truncate(b.Len() - 1) // Encode's newline
}
