package deadletter

import "context"

// SettleForTest ends lease's claim on letter id as a replay run does: to is
// the status it goes to, attempted whether it was sent.
func (s *Store) SettleForTest(ctx context.Context, lease Lease, id int64, to string, attempted bool) error {
	return s.record(ctx, lease.ReplayID, batchRecord{lease: lease,
		settle: []settlement{{id: id, to: to, attempted: attempted, detail: "test"}}})
}
