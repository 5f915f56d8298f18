package consumer

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/letterstate"
)

// ClaimForTest claims the dead letters ids of cfg.Name for owner with a
// lease of d, as a reprocessor does before its attempts, and returns the ids
// it got. A test that never settles them plays a reprocessor that died.
func ClaimForTest(ctx context.Context, cfg Config, owner string, d time.Duration, ids ...int64) ([]int64, error) {
	p, err := newReprocessor(cfg, func(context.Context, pgx.Tx, Message) error { return nil }, owner, owner)
	if err != nil {
		return nil, err
	}
	p.lease.Owner, p.lease.Duration = owner, d
	cs, err := p.claim(ctx, `id = ANY($4) AND `+letterstate.Claimable, "id", 0, ids)
	var got []int64
	for _, c := range cs {
		got = append(got, c.id)
	}
	return got, err
}
