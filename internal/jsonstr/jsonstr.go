// Package jsonstr writes JSON strings, for the JSON texts the relay writes
// byte by byte rather than with encoding/json (Kafka Connect JSON, which must
// match Debezium's bytes, and CloudEvents' structured mode): one escaper for
// both.
package jsonstr

import "unicode/utf8"

// Append appends s to dst as a JSON string (RFC 8259) escaped as Jackson,
// and so Debezium, escapes it: the quote, the backslash and the control
// characters below U+0020 (\b \t \n \f \r short, the others \u00XX in
// upper-case hex); everything else as it is, with no HTML escapes. A byte
// that is not UTF-8 becomes U+FFFD, as a Java string decoded from it holds:
// a JSON text is UTF-8.
func Append[S ~string | ~[]byte](dst []byte, s S) []byte {
	const hex = "0123456789ABCDEF"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			if size := runeSize(s[i:]); size > 0 {
				i += size
				continue
			}
			dst = append(dst, s[start:i]...)
			dst = utf8.AppendRune(dst, utf8.RuneError)
			i++
			start = i
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\r':
			dst = append(dst, '\\', 'r')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// runeSize is the length of the UTF-8 encoded rune s starts with, 0 when s
// does not start with one.
func runeSize[S ~string | ~[]byte](s S) int {
	var buf [utf8.UTFMax]byte
	n := copy(buf[:], s[:min(len(s), utf8.UTFMax)])
	if r, size := utf8.DecodeRune(buf[:n]); !(r == utf8.RuneError && size == 1) {
		return size
	}
	return 0
}
