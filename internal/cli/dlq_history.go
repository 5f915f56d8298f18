package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/replay"
)

// DLQHistoryCmd is "cdc-relay dlq history".
type DLQHistoryCmd struct {
	PGFlags       `embed:"" group:"postgres"`
	dlqStoreFlags `embed:"" group:"postgres"`

	Replay      int64    `group:"selection" help:"Show the result of every event of this replay instead (with --transitions: its transitions)." placeholder:"ID"`
	Transitions bool     `group:"selection" help:"Show the letters' state transitions (claimed, completed, failed to retry_wait, dead, released, topic overrides), oldest first: the newest --limit, of --replay, --id and --event-id when given."`
	ID          []int64  `group:"selection" name:"id" help:"Show the transitions of these dead letter ids (implies --transitions)." placeholder:"ID"`
	EventID     []string `group:"selection" name:"event-id" help:"Show the transitions of the letters of these event ids (implies --transitions)." placeholder:"ID"`
	Limit       int      `group:"selection" default:"20" help:"Show the newest replays (or transitions), at most this many (0: all)."`
	JSON        bool     `group:"output" name:"json" help:"Print JSON."`
}

// Validate checks the flags.
func (c *DLQHistoryCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	if c.Limit < 0 {
		return flagError("limit", "must be 0 (all) or more")
	}
	if len(c.ID) > 0 || len(c.EventID) > 0 {
		c.Transitions = true
	}
	return c.dlqStoreFlags.validate()
}

// Run prints the newest replays, the events of one (--replay), or
// transitions (--transitions).
func (c *DLQHistoryCmd) Run(ctx context.Context, env Env) error {
	return withStore(ctx, c.PGURL, c.DLQTable, func(s *deadletter.Store) error {
		if c.Transitions {
			f := deadletter.TransitionFilter{DeadLetterIDs: c.ID, EventIDs: c.EventID, ReplayID: c.Replay, Limit: c.Limit}
			if len(c.ID) > 0 || len(c.EventID) > 0 || c.Replay != 0 {
				f.Limit = 0 // every transition of what was asked for
			}
			ts, err := s.ListTransitions(ctx, f)
			if err != nil {
				return err
			}
			if c.JSON {
				return writeJSON(env.Stdout, "JSON", ts)
			}
			return printTransitions(env.Stdout, ts)
		}
		if c.Replay != 0 {
			events, err := s.History().Events(ctx, c.Replay)
			if err != nil {
				return err
			}
			if c.JSON {
				return writeJSON(env.Stdout, "JSON", events)
			}
			return printReplayEvents(env.Stdout, c.Replay, events)
		}
		replays, err := s.History().List(ctx, c.Limit)
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
func printReplayEvents(w io.Writer, replayID int64, events []replay.Event) error {
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

// printTransitions prints transitions as a table.
func printTransitions(w io.Writer, ts []deadletter.Transition) error {
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

// printReplays prints replays as a table.
func printReplays(w io.Writer, replays []replay.Entry) error {
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
