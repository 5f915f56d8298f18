package decoder

import (
	"strings"
	"testing"
	"time"
)

// TestBoundary: Boundary reads a transaction's framing as a Decoder does,
// reports every other message as something the transaction holds, and
// refuses what Decode refuses, in Decode's words.
func TestBoundary(t *testing.T) {
	at := time.Date(2026, 12, 4, 10, 0, 0, 123456000, time.UTC)
	tests := []struct {
		name    string
		in      []byte
		want    Message
		wantErr string
	}{
		{"begin", beginMsg(0x1000, at, 7), Message{Kind: KindBegin, XID: 7, CommitLSN: 0x1000, CommitTime: at}, ""},
		{"commit", commitMsg(0x1000, 0x1040, at), Message{Kind: KindCommit, CommitLSN: 0x1000, EndLSN: 0x1040, CommitTime: at}, ""},
		{"relation", relationMsg(1, "public", "outbox_events", "id"), Message{Kind: KindSkip}, ""},
		{"insert", insertMsg(1, txt("x")), Message{Kind: KindSkip}, ""},
		{"logical decoding message", logicalMsg(true, 0x1000, "p", "{}"), Message{Kind: KindSkip}, ""},
		{"empty", nil, Message{}, "empty message"},
		{"truncated begin", beginMsg(0x1000, at, 7)[:10], Message{}, "decode pgoutput begin message: body is 9 bytes, want 20"},
		{"streaming", []byte{'S', 0, 0, 0, 1, 1}, Message{}, "unexpected streaming message 'S'"},
		{"unknown type", []byte{'Z'}, Message{}, "unknown message type 'Z'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Boundary(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Boundary error %v, want one with %q", err, tt.wantErr)
				}
				d, _ := New(Config{Schema: "public", Table: "outbox_events", Columns: DefaultColumns()})
				if _, derr := d.Decode(tt.in); derr == nil || derr.Error() != err.Error() {
					t.Errorf("Decode error %v, Boundary's %v: want the same", derr, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Boundary: %v", err)
			}
			if got.Kind != tt.want.Kind || got.XID != tt.want.XID || got.CommitLSN != tt.want.CommitLSN ||
				got.EndLSN != tt.want.EndLSN || !got.CommitTime.Equal(tt.want.CommitTime) {
				t.Errorf("Boundary = %+v, want %+v", got, tt.want)
			}
		})
	}
}
