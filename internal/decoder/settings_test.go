package decoder

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/setting"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// relayNames is the Namer the relay hands the decoder: its Config is the
// relay's Decoder, so a FieldError's path starts with "Decoder.".
var relayNames = setting.Namer{}.Within("Decoder")

// checkFieldError fails t unless err is a *setting.FieldError of field whose
// text holds each of want and ends with the setting's name.
func checkFieldError(t *testing.T, err error, field string, want ...string) {
	t.Helper()
	var fe *setting.FieldError
	if !errors.As(err, &fe) || fe.Field != "Decoder."+field {
		t.Fatalf("error = %v, want a *setting.FieldError of Decoder.%s", err, field)
	}
	text := err.Error()
	for _, w := range append(want, relayNames.Name(field)) {
		if !strings.Contains(text, w) {
			t.Errorf("error %q does not say %q", text, w)
		}
	}
	if !strings.HasSuffix(text, relayNames.Name(field)) {
		t.Errorf("error %q does not end with the setting's name %q", text, relayNames.Name(field))
	}
}

func TestParseHeaderColumns(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want map[string]string
		err  []string // substrings of the error, nil for none
	}{
		{name: "none", in: nil, want: nil},
		{name: "column and column=header", in: []string{"correlation_id", "tenant=x-tenant"}, want: map[string]string{"correlation_id": "correlation_id", "tenant": "x-tenant"}},
		{name: "entry trimmed", in: []string{" tenant=x-tenant "}, want: map[string]string{"tenant": "x-tenant"}},
		{name: "trimmed around =", in: []string{"tenant = x-tenant"}, want: map[string]string{"tenant": "x-tenant"}},
		{name: "column id under another header", in: []string{"id=event-id"}, want: map[string]string{"id": "event-id"}},
		{name: "no column", in: []string{"=x"}, err: []string{`"=x": use column or column=header`}},
		{name: "no header", in: []string{"x="}, err: []string{`"x=": use column or column=header`}},
		{name: "empty entry", in: []string{""}, err: []string{"use column or column=header"}},
		{name: "column twice", in: []string{"a=x", "a=y"}, err: []string{`column "a" is listed twice (as "x" and "y")`}},
		{name: "the sink's id", in: []string{"id"}, err: []string{`header "id" is set by the relay itself`}},
		{name: "traceparent", in: []string{"trace=traceparent"}, err: []string{`header "traceparent" is set by the relay itself`, relayNames.Name("TracingColumn")}},
		{name: "content-type", in: []string{"mime=content-type"}, err: []string{`header "content-type" is set by the relay itself`, relayNames.Name("ContentType")}},
		{name: "dead letters' payload type", in: []string{"x=cdc_relay_payload_type"}, err: []string{`"cdc_relay_payload_type" is the name under which dead letters keep the payload's type`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseHeaderColumns(tt.in, relayNames)
			if tt.err != nil {
				checkFieldError(t, err, "HeaderColumns", tt.err...)
				return
			}
			if err != nil {
				t.Fatalf("ParseHeaderColumns(%q): %v", tt.in, err)
			}
			if !maps.Equal(got, tt.want) || (got == nil) != (tt.want == nil) {
				t.Errorf("ParseHeaderColumns(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

// TestHeaderColumnsRefuseTheRelaysHeaders: every header the sink, the
// decoder or the dead letters set, by the name its own package gives it, is
// refused as a header column's target, and so is every one a message
// outbox's headers cannot set but traceparent and tracestate (a message has
// no tracing column).
func TestHeaderColumnsRefuseTheRelaysHeaders(t *testing.T) {
	sinkHeaders := []string{sink.HeaderID, sink.HeaderEventType, sink.HeaderAggregateType, sink.HeaderCommitLSN, sink.HeaderCommitTime, sink.HeaderSource}
	decoderHeaders := []string{outbox.HeaderContentType, outbox.HeaderTraceParent, outbox.HeaderTraceState}
	for _, h := range slices.Concat(sinkHeaders, decoderHeaders, []string{deadletter.PayloadTypeKey}) {
		if _, err := ParseHeaderColumns([]string{"c=" + h}, relayNames); err == nil {
			t.Errorf("ParseHeaderColumns(c=%s) = nil error, want the header refused", h)
		}
	}
	for _, h := range append(sinkHeaders, outbox.HeaderContentType) {
		if !reservedMessageHeader(h) {
			t.Errorf("reservedMessageHeader(%q) = false, want true", h)
		}
	}
}

func TestParseEnvelopeColumns(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want []EnvelopeColumn
		err  []string // substrings of the error, nil for none
	}{
		{name: "none", in: nil, want: nil},
		{name: "column and column=alias, in order", in: []string{"tenant", " version = schema_version "},
			want: []EnvelopeColumn{{Column: "tenant", Alias: "tenant"}, {Column: "version", Alias: "schema_version"}}},
		{name: "no column", in: []string{"=x"}, err: []string{"use column or column=alias in the envelope columns"}},
		{name: "no alias", in: []string{"x="}, err: []string{"use column or column=alias"}},
		{name: "alias twice", in: []string{"a=x", "b=x"}, err: []string{`alias "x" is used twice`}},
		{name: "the payload's member", in: []string{"payload"}, err: []string{`alias "payload" of column "payload" is the payload's own member`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEnvelopeColumns(tt.in, relayNames)
			if tt.err != nil {
				checkFieldError(t, err, "EnvelopeColumns", tt.err...)
				return
			}
			if err != nil {
				t.Fatalf("ParseEnvelopeColumns(%q): %v", tt.in, err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("ParseEnvelopeColumns(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}
