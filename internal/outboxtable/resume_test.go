package outboxtable_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/outboxtable"
)

// countingPublisher acknowledges every event and remembers their ids.
type countingPublisher struct {
	mu  sync.Mutex
	ids map[string]int
}

func (p *countingPublisher) Publish(_ context.Context, _ string, evs []*outbox.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ev := range evs {
		p.ids[string(ev.ID)]++
	}
	return nil
}

// TestReplayResumes: a replay stopped after some batches resumes after the
// position Progress was last given: every row once, none twice.
func TestReplayResumes(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t, "cdc_relay_outboxtable_resume")
	store := newStore(t, pool)
	table := outboxTable(t, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'k' || (g % 4), 'Created', '{}' FROM generate_series(1, 3000) g`); err != nil {
		t.Fatal(err)
	}
	var snapshot string
	if err := pool.QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&snapshot); err != nil {
		t.Fatal(err)
	}
	cols := outboxtable.Columns{Columns: decoder.DefaultColumns()}
	p := &countingPublisher{ids: map[string]int{}}
	var pos string
	calls := 0
	stop := errors.New("stop")
	o := outboxtable.ReplayOptions{Topic: "t", Snapshot: snapshot, Progress: func(_ context.Context, at string) error {
		pos, calls = at, calls+1
		if calls == 15 {
			return stop
		}
		return nil
	}}
	if _, err := outboxtable.Replay(ctx, pool, store.History(), table, cols, p, o); !errors.Is(err, stop) {
		t.Fatalf("Replay = %v, want the stop", err)
	}
	o.After, o.Progress = pos, nil
	n, err := outboxtable.Count(ctx, pool, table, cols, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outboxtable.Replay(ctx, pool, store.History(), table, cols, p, o); err != nil {
		t.Fatal(err)
	}
	twice := 0
	for _, c := range p.ids {
		if c > 1 {
			twice++
		}
	}
	if len(p.ids) != 3000 || twice != 0 || n != 1500 {
		t.Errorf("%d rows published, %d twice, %d counted after position %s; want 3000, 0, 1500", len(p.ids), twice, n, pos)
	}
}

// TestReplayPagesInOrder: the rows of one statement (one created_at, one
// cmin) over more pages than one are each replayed once: the pages follow
// the rows' place in the table (ctid), as the cursor between pages does.
func TestReplayPagesInOrder(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t, "cdc_relay_outboxtable_pages")
	store := newStore(t, pool)
	table := outboxTable(t, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'k' || (g % 4), 'Created', '{}' FROM generate_series(1, 3000) g`); err != nil {
		t.Fatal(err)
	}
	p := &countingPublisher{ids: map[string]int{}}
	if _, err := outboxtable.Replay(ctx, pool, store.History(), table, outboxtable.Columns{Columns: decoder.DefaultColumns()}, p, outboxtable.ReplayOptions{Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	twice := 0
	for _, c := range p.ids {
		if c > 1 {
			twice++
		}
	}
	if len(p.ids) != 3000 || twice != 0 {
		t.Errorf("%d of 3000 rows replayed, %d of them twice; want each once", len(p.ids), twice)
	}
}
