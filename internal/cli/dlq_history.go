package cli

import (
	"context"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/report"
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
				return report.WriteJSON(env.Stdout, "JSON", ts)
			}
			return report.PrintTransitions(env.Stdout, ts)
		}
		if c.Replay != 0 {
			events, err := s.History().Events(ctx, c.Replay)
			if err != nil {
				return err
			}
			if c.JSON {
				return report.WriteJSON(env.Stdout, "JSON", events)
			}
			return report.PrintReplayEvents(env.Stdout, c.Replay, events)
		}
		replays, err := s.History().List(ctx, c.Limit)
		if err != nil {
			return err
		}
		if c.JSON {
			return report.WriteJSON(env.Stdout, "JSON", replays)
		}
		return report.PrintReplays(env.Stdout, replays)
	})
}
