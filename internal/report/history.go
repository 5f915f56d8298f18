package report

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/replay"
)

// PrintReplayEvents prints the events of replay replayID as a table.
func PrintReplayEvents(w io.Writer, replayID int64, events []replay.Event) error {
	if len(events) == 0 {
		fmt.Fprintf(w, "replay %d recorded no events (or does not exist)\n", replayID)
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tEVENT ID\tDEAD LETTER\tRESULT\tERROR")
	for _, e := range events {
		dl := "-"
		if e.DeadLetterID != 0 {
			dl = fmt.Sprint(e.DeadLetterID)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", timeText(e.At), oneLine(e.EventID), dl, e.Result, e.Error)
	}
	return tw.Flush()
}

// PrintTransitions prints the letters' state transitions as a table.
func PrintTransitions(w io.Writer, ts []deadletter.Transition) error {
	if len(ts) == 0 {
		fmt.Fprintln(w, "no transitions recorded")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tDEAD LETTER\tEVENT ID\tFROM\tTO\tATTEMPT\tREPLAY\tBY\tTOPIC\tDETAIL")
	for _, t := range ts {
		replay := "-"
		if t.ReplayID != 0 {
			replay = fmt.Sprint(t.ReplayID)
		}
		topic := t.Topic
		if topic == "" {
			topic = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", timeText(t.At), t.DeadLetterID, oneLine(t.EventID),
			t.From, t.To, t.Attempt, replay, oneLine(t.Owner), oneLine(topic), oneLine(t.Detail))
	}
	return tw.Flush()
}

// PrintReplays prints the replay history as a table.
func PrintReplays(w io.Writer, replays []replay.Entry) error {
	if len(replays) == 0 {
		fmt.Fprintln(w, "no replays yet")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tACTOR\tSTARTED\tFINISHED\tMODE\tRATE\tSELECTED\tPUBLISHED\tSKIPPED\tFAILED\tTOPIC\tFILTERS")
	for _, r := range replays {
		finished := "(not finished)"
		if r.FinishedAt != nil {
			finished = timeText(*r.FinishedAt)
		}
		mode := "publish"
		switch {
		case r.DryRun:
			mode = "dry run"
		case r.Forced:
			mode = "forced"
		}
		rate := "unlimited"
		if r.RatePerSec > 0 {
			rate = fmt.Sprintf("%g/s", r.RatePerSec)
		}
		filters, _ := json.Marshal(r.Filters)
		topic := "(own)"
		if r.TopicOverride != "" {
			topic = r.TopicOverride
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", r.ID, r.Kind, oneLine(r.Actor),
			timeText(r.StartedAt), finished, mode, rate, r.Selected, r.Published, r.Skipped, r.Failed, oneLine(topic), filters)
	}
	return tw.Flush()
}
