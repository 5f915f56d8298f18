package decoder

import (
	"context"
	"errors"
	"testing"
)

// A partitioned outbox table published under its partitions' names: each
// partition announces its own relation, with its own column order, and
// Membership says which relations are the outbox's.
func TestPartitionsUnderOwnNames(t *testing.T) {
	const (
		part1ID   = 17001 // a partition created with the table's column order
		part2ID   = 17002 // a table attached later, columns in another order
		formerID  = 17003 // detached since, not published on its own, outbox columns
		formerBad = 17004 // not in the tree, not published on its own, other columns
	)
	calls := 0
	d, err := New(defaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	d.SetMembership(func(_ context.Context, rel Relation) (Member, error) {
		calls++
		switch rel.ID {
		case part1ID, part2ID:
			return IsMember, nil
		case formerID, formerBad:
			return FormerMember, nil
		}
		return NotMember, nil
	})
	reordered := []string{"created_at", "payload", "id", "event_type", "aggregate_id", "aggregate_type", "correlation_id"}
	reorderedRow := func(id string) []col {
		r := row(id)
		return []col{r[5], r[4], r[0], r[3], r[2], r[1], r[6]}
	}
	steps := []struct {
		msg  []byte
		want Kind
		id   string
	}{
		{relationMsg(part1ID, "public", "outbox_events_2024", outboxColumns...), KindRelation, ""},
		{relationMsg(part2ID, "archive", "outbox_attached", reordered...), KindRelation, ""},
		{relationMsg(formerID, "public", "outbox_events_2023", outboxColumns...), KindRelation, ""},
		{relationMsg(formerBad, "public", "audit", "x", "y"), KindRelation, ""},
		{relationMsg(ordersID, "public", "orders", "id"), KindRelation, ""},
		{beginMsg(lsn1, t1, xid1), KindBegin, ""},
		{insertMsg(part1ID, row("p1")...), KindEvent, "p1"},
		{insertMsg(part2ID, reorderedRow("p2")...), KindEvent, "p2"},
		{insertMsg(part1ID, row("p1b")...), KindEvent, "p1b"},
		{insertMsg(formerID, row("f")...), KindEvent, "f"},
		{insertMsg(formerBad, txt("1"), txt("2")), KindSkip, ""},
		{insertMsg(ordersID, txt("1")), KindSkip, ""},
		{updateMsg(part2ID, 0, nil, reorderedRow("p2")), KindUpdate, ""},
		{commitMsg(lsn1, end1, t1), KindCommit, ""},
	}
	index := uint32(0)
	for i, s := range steps {
		m, err := d.Decode(s.msg)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if m.Kind != s.want {
			t.Fatalf("step %d: kind %v, want %v", i, m.Kind, s.want)
		}
		if s.want != KindEvent {
			continue
		}
		ev := m.Event
		if string(ev.ID) != s.id || string(ev.AggregateID) != "42" || string(ev.EventType) != "OrderPlaced" || string(ev.Payload) != `{"total":10}` || ev.Index != index {
			t.Fatalf("step %d: event %+v, want id %q index %d with the row's columns", i, ev, s.id, index)
		}
		index++
	}
	if calls != 5 {
		t.Fatalf("Membership called %d times, want once per Relation message (5)", calls)
	}

	// A partition (not a former one) lacking a column is a configuration error.
	if _, err := d.Decode(relationMsg(part1ID, "public", "outbox_events_2024", "id")); !errors.Is(err, ErrMissingColumn) {
		t.Fatalf("partition without the outbox columns: %v, want ErrMissingColumn", err)
	}
	// A Membership error fails the Relation message: the stream reconnects.
	d.Reset()
	d.SetMembership(func(context.Context, Relation) (Member, error) { return NotMember, errors.New("catalog down") })
	if _, err := d.Decode(relationMsg(part1ID, "public", "outbox_events_2024", outboxColumns...)); err == nil {
		t.Fatal("Membership error: decoded without error")
	}
	if _, err := d.Decode(beginMsg(lsn1, t1, xid1)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Decode(insertMsg(part1ID, row("x")...)); err == nil {
		t.Fatal("insert into a relation whose Relation message failed: decoded without error")
	}
}
