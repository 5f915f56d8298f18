package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/outboxtable"
)

// PruneCmd is "cdc-relay prune": delete old outbox rows.
type PruneCmd struct {
	PGFlags `embed:"" group:"postgres"`

	OlderThan     string `group:"selection" required:"" help:"Required. Delete rows created longer ago than this: 30m, 24h, 7d, 1d12h." placeholder:"AGE"`
	BatchSize     int    `group:"selection" default:"1000" help:"Rows deleted per transaction."`
	createdAtFlag `embed:"" group:"postgres"`

	olderThan time.Time `kong:"-"`
}

// Validate checks the flags.
func (c *PruneCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	if err := checkTables(c.Table); err != nil {
		return err
	}
	age, err := parseAge(c.OlderThan)
	if err != nil {
		return flagError("older-than", err.Error())
	}
	c.olderThan = time.Now().Add(-age)
	if c.BatchSize < 1 {
		return flagError("batch-size", "must be at least 1")
	}
	return nil
}

// Run deletes the rows and says how many.
func (c *PruneCmd) Run(ctx context.Context, env Env) error {
	pool, err := connect(ctx, c.PGURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	for _, table := range c.Table {
		n, err := outboxtable.Prune(ctx, pool, table, c.ColumnCreatedAt, c.olderThan, c.BatchSize)
		fmt.Fprintf(env.Stdout, "deleted %d rows of %s created before %s\n", n, table, c.olderThan.UTC().Format(time.RFC3339))
		if err != nil {
			return err
		}
	}
	return nil
}
