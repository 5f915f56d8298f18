package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
)

// DLQPurgeCmd is "cdc-relay dlq purge".
type DLQPurgeCmd struct {
	PGFlags       `embed:"" group:"postgres"`
	dlqStoreFlags `embed:"" group:"postgres"`

	OlderThan string `group:"selection" required:"" help:"Required. Delete letters whose last failure (and last replay) is longer ago than this: 30m, 24h, 7d, 1d12h." placeholder:"AGE"`
	Status    string `group:"selection" help:"Only letters with this status: pending, retry_wait, completed (or replayed, its former name) or dead (default: any). Letters a replay holds (processing, lease not expired) are never deleted." placeholder:"STATUS"`

	olderThan time.Time `kong:"-"`
}

// Validate checks the flags.
func (c *DLQPurgeCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	if err := c.dlqStoreFlags.validate(); err != nil {
		return err
	}
	age, err := parseAge(c.OlderThan)
	if err != nil {
		return flagError("older-than", err.Error())
	}
	c.olderThan = time.Now().Add(-age)
	return checkStatusFlag(c.Status)
}

// Run deletes the letters and says how many.
func (c *DLQPurgeCmd) Run(ctx context.Context, env Env) error {
	return withStore(ctx, c.PGURL, c.DLQTable, func(s *deadletter.Store) error {
		n, err := s.Purge(ctx, c.olderThan, c.Status)
		status := c.Status
		if status == "" {
			status = "any status"
		}
		fmt.Fprintf(env.Stdout, "deleted %d dead letters (%s) last active before %s\n", n, status, c.olderThan.UTC().Format(time.RFC3339))
		return err
	})
}
