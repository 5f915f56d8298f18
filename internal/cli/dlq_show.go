package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/report"
)

// DLQShowCmd is "cdc-relay dlq show [ID] [--event-id E]…".
type DLQShowCmd struct {
	PGFlags       `embed:"" group:"postgres"`
	dlqStoreFlags `embed:"" group:"postgres"`

	ID      int64    `arg:"" optional:"" help:"Dead letter id (the ID column of dlq list)."`
	EventID []string `group:"selection" name:"event-id" help:"Show the letter of this event id instead (or too), as the relay logs it (event_id); repeat the flag or separate with commas." placeholder:"ID"`
	JSON    bool     `group:"output" name:"json" help:"Print JSON: one letter as an object, several as an array."`
}

// Validate checks the flags.
func (c *DLQShowCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	var events []string
	for _, e := range c.EventID {
		if e = strings.TrimSpace(e); e != "" {
			events = append(events, e)
		}
	}
	c.EventID = events
	if c.ID < 0 || c.ID == 0 && len(events) == 0 {
		return fmt.Errorf("<id> is %d: give the id of a dead letter, a positive number (the ID column of cdc-relay dlq list), or --event-id", c.ID)
	}
	return c.dlqStoreFlags.validate()
}

// Run prints the letters.
func (c *DLQShowCmd) Run(ctx context.Context, env Env) error {
	return withStore(ctx, c.PGURL, c.DLQTable, func(s *deadletter.Store) error {
		var letters []deadletter.Letter
		if c.ID != 0 {
			l, err := s.Get(ctx, c.ID)
			if err != nil {
				return err
			}
			letters = append(letters, l)
		}
		if len(c.EventID) > 0 {
			found, err := s.List(ctx, deadletter.Filter{EventIDs: c.EventID})
			if err != nil {
				return err
			}
			have := map[string]bool{}
			for _, l := range found {
				have[l.EventID] = true
				if l.ID != c.ID {
					letters = append(letters, l)
				}
			}
			for _, e := range c.EventID {
				if !have[e] {
					return fmt.Errorf("show the dead letter of event %s from %s: %w", e, s.Table(), deadletter.ErrNotFound)
				}
			}
		}
		if c.JSON {
			return report.LettersJSON(env.Stdout, letters)
		}
		report.PrintLetters(env.Stdout, letters)
		return nil
	})
}
