package decoder

import (
	"encoding/json"
	"testing"
)

// TestEnvelope checks the envelope's exact bytes for each payload type, NULL
// payloads and columns, and text JSON must escape (but not HTML-escape).
func TestEnvelope(t *testing.T) {
	for _, tc := range []struct {
		name    string
		payload []byte
		typ     uint32
		aliases []string
		values  [][]byte
		want    string
	}{
		{"jsonb", []byte(`{"total": 7}`), TypeJSONB, []string{"tenant", "v"}, [][]byte{[]byte("acme"), nil},
			`{"payload":{"total": 7},"tenant":"acme","v":null}`},
		{"json", []byte(`[1]`), TypeJSON, []string{"t"}, [][]byte{[]byte(`a"b<c>&`)}, `{"payload":[1],"t":"a\"b<c>&"}`},
		{"text", []byte("line\nx"), 25, nil, nil, `{"payload":"line\nx"}`},
		{"bytea", []byte{0, 1, 0xff}, TypeBytea, []string{"k"}, [][]byte{[]byte("1")}, `{"payload":"AAH/","k":"1"}`},
		{"null payload", nil, TypeJSONB, []string{"k"}, [][]byte{[]byte("1")}, `{"payload":null,"k":"1"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Envelope(tc.payload, tc.typ, tc.aliases, tc.values)
			if string(got) != tc.want {
				t.Fatalf("Envelope = %s, want %s", got, tc.want)
			}
			if !json.Valid(got) {
				t.Fatalf("Envelope = %s: not JSON", got)
			}
		})
	}
	for _, bad := range [][]EnvelopeColumn{
		{{Column: "a", Alias: "payload"}},
		{{Column: "a", Alias: "x"}, {Column: "b", Alias: "x"}},
		{{Column: "", Alias: "x"}},
	} {
		if err := checkEnvelope(bad); err == nil {
			t.Errorf("checkEnvelope(%v) = nil, want an error", bad)
		}
	}
}
