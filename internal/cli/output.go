package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
)

// The output helpers the commands share.

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write JSON: %w", err)
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

// printReplay prints what a replay did, and turns failed events into an error
// so the exit status shows them.
func printReplay(w io.Writer, kind, actor string, res deadletter.ReplayResult, dryRun bool, err error) error {
	if res.ReplayID == 0 {
		return err // it did not start
	}
	what := "replay"
	if dryRun {
		what = "dry run"
	}
	fmt.Fprintf(w, "%s %d (%s, by %s): selected %d, published %d, skipped %d, failed %d",
		what, res.ReplayID, kind, actor, res.Selected, res.Published, res.Skipped, res.Failed)
	if dryRun {
		fmt.Fprintf(w, ", would publish %d", res.DryRun)
	}
	fmt.Fprintln(w)
	if len(res.Failures) > 0 {
		fmt.Fprintln(w, "failures:")
		for _, f := range res.Failures {
			if f.DeadLetterID != 0 {
				fmt.Fprintf(w, "  dead letter %d, event %s: %s\n", f.DeadLetterID, f.EventID, f.Error)
			} else {
				fmt.Fprintf(w, "  event %s: %s\n", f.EventID, f.Error)
			}
		}
		if res.Failed > len(res.Failures) {
			fmt.Fprintf(w, "  ... and %d more: cdc-relay dlq history --replay %d\n", res.Failed-len(res.Failures), res.ReplayID)
		}
	}
	if err != nil {
		return fmt.Errorf("replay %d: %w", res.ReplayID, err)
	}
	if res.Failed > 0 {
		return fmt.Errorf("replay %d: %d of %d events failed (listed above)", res.ReplayID, res.Failed, res.Selected)
	}
	return nil
}
