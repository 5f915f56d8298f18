// Package report renders what the operator commands print about dead letters
// and replays, as text or JSON: the letter tables and details of dlq list and
// dlq show, the replay history and transitions of dlq history, and the
// summary a replay prints. The commands fetch the values; this package only
// writes them. It names no flag: a text that asks the operator to run or set
// something gets those words from its caller (a setting.Namer, or a hint).
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// WriteJSON prints v as indented JSON; what names the output in the error.
func WriteJSON(w io.Writer, what string, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write %s: %w", what, err)
	}
	return nil
}

// timeText formats t for tables: UTC, to the second.
func timeText(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// oneLine keeps a table cell on one line, and short.
func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if utf8.RuneCountInString(s) > 40 {
		s = string([]rune(s)[:39]) + "…"
	}
	return s
}

// utc is t in UTC, nil for nil.
func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
