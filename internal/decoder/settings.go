package decoder

import (
	"strings"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// deadLetterPayloadType is deadletter.PayloadTypeKey, under which a dead
// letter keeps its payload's type among its headers: no header column may
// set it. The decoder imports neither the sink nor the dead letters for the
// names of their headers (nor their dependencies): a test checks them.
const deadLetterPayloadType = "cdc_relay_payload_type"

// sinkHeader reports whether key is a header the sink sets on every message
// (sink.HeaderID, HeaderEventType, HeaderAggregateType, HeaderCommitLSN,
// HeaderCommitTime, HeaderSource).
func sinkHeader(key string) bool {
	switch key {
	case "id", "event_type", "aggregate_type", "commit_lsn", "commit_time", "source_position":
		return true
	}
	return false
}

// ParseHeaderColumns reads the header columns setting, entries "column" or
// "column=header" (spaces around either trimmed), into Config.HeaderColumns:
// nil for none. It refuses a column listed twice and a header the relay sets
// itself. An error is a *setting.FieldError of HeaderColumns, named by names,
// the Namer of the Config that holds them.
func ParseHeaderColumns(list []string, names setting.Namer) (map[string]string, error) {
	if len(list) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(list))
	for _, entry := range list {
		col, hdr, ok := strings.Cut(strings.TrimSpace(entry), "=")
		col, hdr = strings.TrimSpace(col), strings.TrimSpace(hdr)
		if !ok {
			hdr = col
		}
		switch {
		case col == "" || hdr == "":
			return nil, names.Errorf(fieldHeaderColumns, "%q: use column or column=header in the header columns", entry)
		case m[col] != "":
			return nil, names.Errorf(fieldHeaderColumns, "column %q is listed twice (as %q and %q): list each column once in the header columns", col, m[col], hdr)
		case sinkHeader(hdr) || reservedHeader(hdr):
			return nil, names.Errorf(fieldHeaderColumns, "%q: header %q is set by the relay itself (%s by the content type %s, %s and %s from the tracing column %s): map the column to another header name in the header columns",
				entry, hdr, outbox.HeaderContentType, names.Name(fieldContentType), outbox.HeaderTraceParent, outbox.HeaderTraceState, names.Name(fieldTracing))
		case hdr == deadLetterPayloadType:
			return nil, names.Errorf(fieldHeaderColumns, "%q: %q is the name under which dead letters keep the payload's type: map the column to another header name in the header columns", entry, hdr)
		}
		m[col] = hdr
	}
	return m, nil
}

// ParseEnvelopeColumns reads the envelope columns setting, entries "column"
// or "column=alias" (spaces around either trimmed), into
// Config.EnvelopeColumns, in their order: nil for none. It refuses what New
// refuses (an empty column or alias, an alias twice, the alias "payload").
// An error is a *setting.FieldError of EnvelopeColumns, named by names, the
// Namer of the Config that holds them.
func ParseEnvelopeColumns(list []string, names setting.Namer) ([]EnvelopeColumn, error) {
	var cols []EnvelopeColumn
	for _, entry := range list {
		col, alias, ok := strings.Cut(strings.TrimSpace(entry), "=")
		col, alias = strings.TrimSpace(col), strings.TrimSpace(alias)
		if !ok {
			alias = col
		}
		cols = append(cols, EnvelopeColumn{Column: col, Alias: alias})
	}
	if err := checkEnvelope(cols); err != nil {
		return nil, names.Errorf(fieldEnvelope, "%w in the envelope columns", err)
	}
	return cols, nil
}
