package jsonstr

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestAppend: the bytes Jackson writes for each string (Debezium's Kafka
// Connect JSON), as a string and as []byte.
func TestAppend(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"", `""`},
		{"plain", `"plain"`},
		{`say "hi" \ bye`, `"say \"hi\" \\ bye"`},
		{"\b\t\n\f\r", `"\b\t\n\f\r"`},
		{"\x00\x01\x1f\x7f", `"\u0000\u0001\u001F` + "\x7f" + `"`},
		{"</script>&", `"</script>&"`},
		{"ü€🦀 \u2028", "\"ü€🦀 \u2028\""},
		{"a\xffb", "\"a\uFFFDb\""},
		{"\xc3", "\"\uFFFD\""},
		{"\xed\xa0\x80", "\"\uFFFD\uFFFD\uFFFD\""}, // a surrogate: not UTF-8
	} {
		if got := string(Append([]byte("x"), tt.in)); got != "x"+tt.want {
			t.Errorf("Append(%q) = %s, want %s", tt.in, got[1:], tt.want)
		}
		if got := string(Append(nil, []byte(tt.in))); got != tt.want {
			t.Errorf("Append([]byte(%q)) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// FuzzAppend: every string, valid UTF-8 or not, becomes a JSON string that
// decodes to it (invalid bytes as U+FFFD) and keeps what dst held.
func FuzzAppend(f *testing.F) {
	for _, s := range []string{"", "plain", `"\`, "\x00\x1f\x7f", "\b\f", "ü€🦀", "\xff", "a\xc3", "\xed\xa0\x80", strings.Repeat("x", 300)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, s []byte) {
		out := Append([]byte("prefix"), s)
		if !bytes.HasPrefix(out, []byte("prefix")) {
			t.Fatalf("Append(%q) lost what dst held", s)
		}
		var got string
		if err := json.Unmarshal(out[len("prefix"):], &got); err != nil {
			t.Fatalf("Append(%q) = %s: %v", s, out, err)
		}
		var want strings.Builder
		for len(s) > 0 {
			r, n := utf8.DecodeRune(s)
			want.WriteRune(r)
			s = s[n:]
		}
		if got != want.String() {
			t.Fatalf("Append decodes to %q, want %q", got, want.String())
		}
	})
}
