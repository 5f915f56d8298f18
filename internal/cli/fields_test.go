package cli

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/config"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// TestNameFlags: a library's field error reads as the run flag and its
// environment variable, however it is wrapped, and still unwraps.
func TestNameFlags(t *testing.T) {
	missing := errors.New("outbox column missing")
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"plain", config.Errorf("Slot", "slot name %q is invalid", "Bad"),
			`slot name "Bad" is invalid (--slot / CDC_RELAY_SLOT)`},
		{"nested and wrapped", fmt.Errorf("start: %w", &replication.ConfigError{
			Err: config.Within("Decoder", config.Errorf("Columns.AggregateID", "%w: no column %q", missing, "agg"))}),
			`start: outbox column missing: no column "agg" (--column-aggregate-id / CDC_RELAY_COLUMN_AGGREGATE_ID)`},
		{"unknown field stays", config.Errorf("Nope", "bad"), "bad (setting Nope)"},
		{"no field error", errors.New("plain"), "plain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := nameFlags(tt.err, runFlags)
			if got.Error() != tt.want {
				t.Errorf("nameFlags = %q, want %q", got, tt.want)
			}
			if !errors.Is(got, tt.err) {
				t.Errorf("nameFlags(%v) does not unwrap to the original", tt.err)
			}
		})
	}
}
