package cli

import (
	"fmt"
	"io"

	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/report"
)

// writeJSON prints v as indented JSON, as every command's --json does;
// what names the output in the error.
func writeJSON(w io.Writer, what string, v any) error { return report.WriteJSON(w, what, v) }

// reportReplay prints what a replay did, unless it did not start, and returns
// the error the command exits with (see replayError).
func reportReplay(w io.Writer, s report.ReplaySummary, err error) error {
	if s.Result.ReplayID == 0 {
		return err // it did not start
	}
	report.PrintReplay(w, s, runNames)
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
