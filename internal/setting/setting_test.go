package setting

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// testNames renders a setting as its path in capitals and a command as its
// words joined by slashes, so a test sees which path and arguments reached it.
type testNames struct{}

func (testNames) Setting(field string) string { return "<" + strings.ToUpper(field) + ">" }
func (testNames) Command(name string, args ...string) string {
	return "run:" + strings.Join(append([]string{name}, args...), "/")
}

// TestNamer: Name, Within, Errorf and Command render through the Names given,
// with the full path of a nested configuration, and as "(setting Field)"
// without one; a FieldError keeps the full path and its wrapping.
func TestNamer(t *testing.T) {
	missing := errors.New("missing")
	tests := []struct {
		name      string
		namer     Namer
		wantName  string // Name("Columns.ID")
		wantError string // Errorf("Columns.ID", "%w: x", missing)
		wantPath  string // the FieldError's Field
		wantCmd   string // Command("replay", "since", "2h", "dry-run", "")
	}{
		{"zero", Namer{}, "(setting Columns.ID)", "missing: x (setting Columns.ID)", "Columns.ID", "(command replay since=2h dry-run)"},
		{"nil names", NewNamer(nil), "(setting Columns.ID)", "missing: x (setting Columns.ID)", "Columns.ID", "(command replay since=2h dry-run)"},
		{"zero within", Namer{}.Within("Decoder"), "(setting Decoder.Columns.ID)", "missing: x (setting Decoder.Columns.ID)", "Decoder.Columns.ID", "(command replay since=2h dry-run)"},
		{"names", NewNamer(testNames{}), "<COLUMNS.ID>", "missing: x <COLUMNS.ID>", "Columns.ID", "run:replay/since/2h/dry-run/"},
		{"names within within", NewNamer(testNames{}).Within("Relay").Within("Decoder"), "<RELAY.DECODER.COLUMNS.ID>", "missing: x <RELAY.DECODER.COLUMNS.ID>", "Relay.Decoder.Columns.ID", "run:replay/since/2h/dry-run/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.namer.Name("Columns.ID"); got != tt.wantName {
				t.Errorf("Name = %q, want %q", got, tt.wantName)
			}
			err := fmt.Errorf("a: %w", tt.namer.Errorf("Columns.ID", "%w: x", missing))
			if got, want := err.Error(), "a: "+tt.wantError; got != want {
				t.Errorf("Errorf = %q, want %q", got, want)
			}
			if !errors.Is(err, missing) {
				t.Error("Errorf lost the wrapped error")
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tt.wantPath {
				t.Errorf("FieldError = %+v, want Field %q", fe, tt.wantPath)
			}
			if f := Fields(err); len(f) != 1 || f[0] != fe {
				t.Errorf("Fields = %v", f)
			}
			if got := tt.namer.Command("replay", "since", "2h", "dry-run", ""); got != tt.wantCmd {
				t.Errorf("Command = %q, want %q", got, tt.wantCmd)
			}
		})
	}
}
