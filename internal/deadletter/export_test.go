package deadletter

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// SettleForTest ends lease's claim on letter id as a replay run does: to is
// the status it goes to, attempted whether it was sent.
func (s *Store) SettleForTest(ctx context.Context, lease Lease, id int64, to string, attempted bool) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		return s.settleIn(ctx, tx, lease, []settlement{{id: id, to: to, attempted: attempted, detail: "test"}})
	})
	if err != nil {
		return s.wrap(err, "settle dead letter %d", id)
	}
	return nil
}
