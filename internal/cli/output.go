package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cdc-relay/cdc-relay/internal/replay"
)

// The renderers the commands share: the commands compute a value, and
// functions here and beside each command print it as text or JSON.

// writeJSON prints v as indented JSON; what names the output in the error.
func writeJSON(w io.Writer, what string, v any) error {
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

// replaySummary is what replay and dlq replay report.
type replaySummary struct {
	Kind   string // replay.KindOutbox or replay.KindDLQ
	Actor  string
	DryRun bool
	Result replay.Outcome
}

// reportReplay prints what a replay did, unless it did not start, and returns
// the error the command exits with (see replayError).
func reportReplay(w io.Writer, s replaySummary, err error) error {
	if s.Result.ReplayID == 0 {
		return err // it did not start
	}
	printReplay(w, s)
	return replayError(s.Result, err)
}

// replayError is the error a replay command exits with: err, the reason the
// replay stopped, or else one for the events that failed, so the exit status
// shows them.
func replayError(res replay.Outcome, err error) error {
	if err != nil {
		return fmt.Errorf("replay %d: %w", res.ReplayID, err)
	}
	if res.Failed > 0 {
		return fmt.Errorf("replay %d: %d of %d events failed (listed above)", res.ReplayID, res.Failed, res.Selected)
	}
	return nil
}

// printReplay prints a replay's counts and its first failures.
func printReplay(w io.Writer, s replaySummary) {
	res := s.Result
	what := "replay"
	if s.DryRun {
		what = "dry run"
	}
	fmt.Fprintf(w, "%s %d (%s, by %s): selected %d, published %d, skipped %d, failed %d",
		what, res.ReplayID, s.Kind, s.Actor, res.Selected, res.Published, res.Skipped, res.Failed)
	if s.DryRun {
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
}
