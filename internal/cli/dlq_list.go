package cli

import (
	"context"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/report"
)

// DLQListCmd is "cdc-relay dlq list".
type DLQListCmd struct {
	PGFlags           `embed:"" group:"postgres"`
	dlqStoreFlags     `embed:"" group:"postgres"`
	letterFilterFlags `embed:"" group:"selection"`

	// Topic is no run --topic: neither CDC_RELAY_TOPIC nor the config file's
	// topic key (the relay's template) sets it.
	Topic string `group:"selection" env:"-" nofile:"" help:"Only letters meant for this topic (the TOPIC column; set by neither CDC_RELAY_TOPIC nor the config file's topic, which are run's)." placeholder:"NAME"`
	Limit int    `group:"selection" default:"100" help:"Show at most this many letters, lowest ids first (0: all)."`
	JSON  bool   `group:"output" name:"json" help:"Print JSON instead of a table."`
}

// Validate checks the flags.
func (c *DLQListCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	if err := c.dlqStoreFlags.validate(); err != nil {
		return err
	}
	if c.Limit < 0 {
		return flagError("limit", "must be 0 (all) or more")
	}
	if err := c.letterFilterFlags.parse(time.Now()); err != nil {
		return err
	}
	c.filter.Topic = c.Topic
	return nil
}

// Run prints the letters and the summary per error code.
func (c *DLQListCmd) Run(ctx context.Context, env Env) error {
	return withStore(ctx, c.PGURL, c.DLQTable, func(s *deadletter.Store) error {
		list, err := listLetters(ctx, s, c.filter, c.Limit)
		if err != nil {
			return err
		}
		if c.JSON {
			return report.ListJSON(env.Stdout, list)
		}
		report.PrintList(env.Stdout, list, "raise --limit, or 0 for all")
		return nil
	})
}

// listLetters reads the first limit letters f selects (0: all) and the
// summary of all of them.
func listLetters(ctx context.Context, s *deadletter.Store, f deadletter.Filter, limit int) (report.List, error) {
	page := f
	page.Limit = limit
	letters, err := s.List(ctx, page)
	if err != nil {
		return report.List{}, err
	}
	summary, err := s.Summary(ctx, f)
	if err != nil {
		return report.List{}, err
	}
	list := report.List{Letters: letters, Summary: summary}
	for _, cc := range summary {
		list.Total += cc.Count
	}
	return list, nil
}
