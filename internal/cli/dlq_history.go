package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
)

// DLQHistoryCmd is "cdc-relay dlq history".
type DLQHistoryCmd struct {
	PGFlags       `embed:""`
	dlqStoreFlags `embed:""`

	Replay int64 `help:"Show the result of every event of this replay instead." placeholder:"ID"`
	Limit  int   `default:"20" help:"Show the newest replays, at most this many (0: all)."`
	JSON   bool  `name:"json" help:"Print JSON."`
}

// Validate checks the flags.
func (c *DLQHistoryCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	if c.Limit < 0 {
		return flagError("limit", "must be 0 (all) or more")
	}
	return c.dlqStoreFlags.validate()
}

// Run prints the newest replays, or the events of one (--replay).
func (c *DLQHistoryCmd) Run(ctx context.Context, env Env) error {
	return withStore(ctx, c.PGURL, c.DLQTable, func(s *deadletter.Store) error {
		if c.Replay != 0 {
			events, err := s.ListReplayEvents(ctx, c.Replay)
			if err != nil {
				return err
			}
			if c.JSON {
				return writeJSON(env.Stdout, "JSON", events)
			}
			return printReplayEvents(env.Stdout, c.Replay, events)
		}
		replays, err := s.ListReplays(ctx, c.Limit)
		if err != nil {
			return err
		}
		if c.JSON {
			return writeJSON(env.Stdout, "JSON", replays)
		}
		return printReplays(env.Stdout, replays)
	})
}

// printReplayEvents prints the events of replay replayID as a table.
func printReplayEvents(w io.Writer, replayID int64, events []deadletter.ReplayEvent) error {
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

// printReplays prints replays as a table.
func printReplays(w io.Writer, replays []deadletter.Replay) error {
	if len(replays) == 0 {
		fmt.Fprintln(w, "no replays yet")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tACTOR\tSTARTED\tFINISHED\tMODE\tRATE\tSELECTED\tPUBLISHED\tSKIPPED\tFAILED\tFILTERS")
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
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", r.ID, r.Kind, oneLine(r.Actor),
			timeText(r.StartedAt), finished, mode, rate, r.Selected, r.Published, r.Skipped, r.Failed, filters)
	}
	return tw.Flush()
}
