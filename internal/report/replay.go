package report

import (
	"fmt"
	"io"

	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// ReplaySummary is what a replay (of the outbox or of dead letters) reports
// once it ran.
type ReplaySummary struct {
	Kind   string // replay.KindOutbox or replay.KindDLQ
	Actor  string
	DryRun bool
	Result replay.Outcome
}

// PrintReplay prints a replay's counts and its first failures. names renders
// the command that lists the failures not printed here ("dlq history" with
// the argument "replay").
func PrintReplay(w io.Writer, s ReplaySummary, names setting.Namer) {
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
			fmt.Fprintf(w, "  ... and %d more: %s\n", res.Failed-len(res.Failures), names.Command("dlq history", "replay", fmt.Sprint(res.ReplayID)))
		}
	}
}
