package cli

import (
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/sink"
)

func TestCloudEventsSource(t *testing.T) {
	tests := []struct {
		name          string
		format, src   string
		url, table    string
		want, wantErr string
	}{
		{name: "native", format: "native", url: "postgres://u@h/app", table: "public.outbox_events"},
		{name: "native with a source", format: "native", src: "/x", url: "postgres://u@h/app", table: "outbox_events", wantErr: "--cloudevents-source"},
		{name: "default names database and table", format: "cloudevents", url: "postgres://u@h:5432/app", table: "outbox_events", want: "/cdc-relay/app/public.outbox_events"},
		{name: "schema kept", format: "cloudevents", url: "postgres://u@h/shop", table: "sales.outbox", want: "/cdc-relay/shop/sales.outbox"},
		{name: "explicit", format: "cloudevents", src: "urn:orders", url: "postgres://u@h/app", table: "outbox_events", want: "urn:orders"},
		{name: "explicit with a space", format: "cloudevents", src: "my source", url: "postgres://u@h/app", wantErr: "URI reference"},
		{name: "no table (dlq replay)", format: "cloudevents", url: "postgres://u@h/app", wantErr: "required"},
		{name: "no database in the URL", format: "cloudevents", url: "host=h", table: "outbox_events", wantErr: "database"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := formatFlags{Format: tc.format, CloudEventsSource: tc.src}
			got, err := f.ceSource(tc.url, tc.table)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ceSource = %q, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ceSource = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestCloudEventsMode: --cloudevents-mode structured needs --format
// cloudevents and refuses tombstones; each mode reaches the sink.
func TestCloudEventsMode(t *testing.T) {
	tests := []struct {
		name, format, mode string
		tombstones         bool
		want               sink.CloudEventsMode
		wantErr            string
	}{
		{name: "native, default mode", format: "native", mode: "binary"},
		{name: "binary", format: "cloudevents", mode: "binary", want: sink.CloudEventsBinary},
		{name: "binary with tombstones", format: "cloudevents", mode: "binary", tombstones: true, want: sink.CloudEventsBinary},
		{name: "structured", format: "cloudevents", mode: "structured", want: sink.CloudEventsStructured},
		{name: "structured without cloudevents", format: "native", mode: "structured", wantErr: "--cloudevents-mode (CDC_RELAY_CLOUDEVENTS_MODE) structured applies only with --format cloudevents"},
		{name: "structured with tombstones", format: "cloudevents", mode: "structured", tombstones: true, wantErr: "--tombstone-on-empty-payload"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := formatFlags{Format: tc.format, CloudEventsMode: tc.mode, TombstoneOnEmptyPayload: tc.tombstones}
			rf, err := f.recordFormat("postgres://u@h/app", "public.outbox_events")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("recordFormat = %+v, %v; want an error with %q", rf, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var c sink.Config
			rf.apply(&c)
			if c.CloudEventsMode != tc.want || (c.CloudEventsSource != "") != (tc.format == "cloudevents") || c.TombstoneOnEmptyPayload != tc.tombstones {
				t.Fatalf("sink config: mode %d source %q tombstones %v", c.CloudEventsMode, c.CloudEventsSource, c.TombstoneOnEmptyPayload)
			}
		})
	}
}
