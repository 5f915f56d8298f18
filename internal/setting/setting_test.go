package setting

import (
	"errors"
	"fmt"
	"testing"
)

// TestWithinKeepsWrapping: Within sets the full path and keeps the chain; the
// text keeps the token it was made with.
func TestWithinKeepsWrapping(t *testing.T) {
	missing := errors.New("missing")
	err := fmt.Errorf("a: %w", fmt.Errorf("b: %w", Errorf("HeaderColumns", "%w: x", missing)))
	got := Within("Decoder", err)
	if want := "a: b: missing: x (setting HeaderColumns)"; got.Error() != want {
		t.Fatalf("Within = %q, want %q", got, want)
	}
	if !errors.Is(got, missing) {
		t.Fatal("Within lost the wrapped error")
	}
	if f := Fields(got); len(f) != 1 || f[0].Field != "Decoder.HeaderColumns" || f[0].Token() != "(setting HeaderColumns)" {
		t.Fatalf("Fields = %v", f)
	}
	// Unwrapped, the text follows the field.
	direct := Within("Decoder", Errorf("Table", "empty"))
	if want := "empty (setting Table)"; direct.Error() != want {
		t.Fatalf("Within = %q, want %q", direct, want)
	}
}
