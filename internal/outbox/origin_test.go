package outbox

import (
	"math"
	"testing"

	"github.com/jackc/pglogrepl"
)

// TestAppendLSN: the same text as pglogrepl.LSN.String (Postgres' own
// format), appended.
func TestAppendLSN(t *testing.T) {
	for _, lsn := range []pglogrepl.LSN{0, 1, 0xF, 0x10, 0x16B3F48, 0x1_0000_0000, 0x16_B374D848, 0xABCDEF01_23456789, math.MaxUint64} {
		got := string(AppendLSN([]byte("x"), lsn))
		if want := "x" + lsn.String(); got != want {
			t.Errorf("AppendLSN(%#x) = %q, want %q", uint64(lsn), got, want)
		}
	}
}

// TestPositionRoundTrip: what AppendPosition writes, ParsePosition reads back.
func TestPositionRoundTrip(t *testing.T) {
	o := NewOrigin("7312345678901234567", 1, "cdc_relay")
	for _, p := range []Position{{0, 0}, {0x16B3F48, 3}, {math.MaxUint64, math.MaxUint32}} {
		b := o.AppendPosition(nil, p.CommitLSN, p.Index)
		got, ok, err := o.ParsePosition(b)
		if err != nil || !ok || got != p {
			t.Errorf("ParsePosition(%q) = %+v, %v, %v; want %+v", b, got, ok, err, p)
		}
	}
	if got := string(o.AppendPosition(nil, 0x16B3F48, 3)); got != "7312345678901234567:1:cdc_relay:0/16B3F48:3" {
		t.Errorf("AppendPosition = %q", got)
	}
}
