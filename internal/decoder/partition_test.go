package decoder

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
	d.SetMembership(func(_ context.Context, rel Relation) (Member, TableName, error) {
		calls++
		switch rel.ID {
		case part1ID, part2ID:
			return IsMember, TableName{"public", "outbox_events"}, nil
		case formerID, formerBad:
			return FormerMember, TableName{}, nil
		}
		return NotMember, TableName{}, nil
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
	d.SetMembership(func(context.Context, Relation) (Member, TableName, error) {
		return NotMember, TableName{}, errors.New("catalog down")
	})
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

// TestSeveralTables: with Config.Also, inserts into each outbox table are
// events naming their table, counted in one transaction's order; a
// partition's rows name the table its Membership says it belongs to, a
// former partition's the first table; other tables stay skipped. A table
// named twice, or without a schema, is refused.
func TestSeveralTables(t *testing.T) {
	cfg := defaultConfig()
	cfg.Schema, cfg.Table = "billing", "outbox_events"
	table := func(schema, name string) Config {
		c := defaultConfig()
		c.Schema, c.Table = schema, name
		return c
	}
	cfg.Also = []Config{table("shipping", "outbox_events"), table("public", "audit_outbox")}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.SetMembership(func(_ context.Context, rel Relation) (Member, TableName, error) {
		switch rel.ID {
		case 104:
			return IsMember, TableName{"shipping", "outbox_events"}, nil
		case 105:
			return FormerMember, TableName{}, nil
		}
		return NotMember, TableName{}, nil
	})
	for _, m := range [][]byte{
		relationMsg(101, "billing", "outbox_events", outboxColumns...),
		relationMsg(102, "shipping", "outbox_events", outboxColumns...),
		relationMsg(103, "public", "outbox_events", outboxColumns...), // not configured
		relationMsg(104, "shipping", "outbox_events_2026", outboxColumns...),
		relationMsg(105, "old", "detached_part", outboxColumns...),
		relationMsg(106, "public", "audit_outbox", outboxColumns...),
		beginMsg(lsn1, t1, xid1),
	} {
		if _, err := d.Decode(m); err != nil {
			t.Fatal(err)
		}
	}
	want := []struct {
		rel   uint32
		table string // "" skipped
	}{
		{101, "billing.outbox_events"}, {102, "shipping.outbox_events"}, {103, ""},
		{104, "shipping.outbox_events"}, {105, "billing.outbox_events"}, {106, "public.audit_outbox"},
	}
	index := uint32(0)
	for _, w := range want {
		m, err := d.Decode(insertMsg(w.rel, row(fmt.Sprint("e", w.rel))...))
		if err != nil {
			t.Fatalf("insert into relation %d: %v", w.rel, err)
		}
		if w.table == "" {
			if m.Kind != KindSkip {
				t.Errorf("insert into relation %d: %v, want it skipped", w.rel, m.Kind)
			}
			continue
		}
		if m.Kind != KindEvent {
			t.Fatalf("insert into relation %d: %v, want an event", w.rel, m.Kind)
		}
		if got := m.Event.Schema + "." + m.Event.Table; got != w.table || m.Event.Index != index {
			t.Errorf("insert into relation %d: table %s, index %d; want %s, %d", w.rel, got, m.Event.Index, w.table, index)
		}
		index++
	}

	noID := table("shipping", "outbox_events")
	noID.Columns.ID = ""
	prefixed := table("shipping", "outbox_events")
	prefixed.MessagePrefix = "outbox"
	for _, tc := range []struct {
		name string
		also []Config
		want string
	}{
		{"twice", []Config{table("shipping", "outbox_events"), table("shipping", "outbox_events")}, "named twice"},
		{"the first again", []Config{table("billing", "outbox_events")}, "named twice"},
		{"no schema", []Config{table("", "outbox_events")}, "empty schema"},
		{"a further table's own layout is checked", []Config{noID}, "column name is empty"},
		{"a further table has no message prefix", []Config{prefixed}, "names its own table only"},
	} {
		c := cfg
		c.Also = tc.also
		if _, err := New(c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// TestTablesOfTheirOwnLayout: each outbox table is read with its own
// Config: another column for the key, another header mapping.
func TestTablesOfTheirOwnLayout(t *testing.T) {
	cfg := defaultConfig()
	cfg.HeaderColumns = map[string]string{"correlation_id": "correlation_id"}
	parcels := defaultConfig()
	parcels.Schema, parcels.Table = "shipping", "parcels_outbox"
	parcels.Columns.AggregateID = "parcel_id"
	parcels.HeaderColumns = map[string]string{"carrier": "x-carrier"}
	cfg.Also = []Config{parcels}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	parcelColumns := []string{"id", "aggregate_type", "parcel_id", "event_type", "payload", "created_at", "carrier"}
	for _, m := range [][]byte{
		relationMsg(201, "public", "outbox_events", outboxColumns...),
		relationMsg(202, "shipping", "parcels_outbox", parcelColumns...),
		beginMsg(lsn1, t1, xid1),
	} {
		if _, err := d.Decode(m); err != nil {
			t.Fatal(err)
		}
	}
	r := row("e1")
	r[6] = txt("corr-1")
	m, err := d.Decode(insertMsg(201, r...))
	if err != nil || m.Kind != KindEvent {
		t.Fatalf("insert into the first table: %v, %v", m.Kind, err)
	}
	if got := fmt.Sprint(m.Event.Headers); got != "[{correlation_id [99 111 114 114 45 49]}]" || string(m.Event.AggregateID) != "42" {
		t.Errorf("first table's event: key %q, headers %s", m.Event.AggregateID, got)
	}
	p := row("p1")
	p[2], p[6] = txt("parcel-7"), txt("dhl")
	m, err = d.Decode(insertMsg(202, p...))
	if err != nil || m.Kind != KindEvent {
		t.Fatalf("insert into the parcels table: %v, %v", m.Kind, err)
	}
	ev := m.Event
	if string(ev.AggregateID) != "parcel-7" || len(ev.Headers) != 1 || ev.Headers[0].Key != "x-carrier" || string(ev.Headers[0].Value) != "dhl" ||
		ev.Table != "parcels_outbox" || ev.Index != 1 {
		t.Errorf("parcels event: key %q, headers %v, table %s, index %d; want parcel-7, x-carrier: dhl, parcels_outbox, 1", ev.AggregateID, ev.Headers, ev.Table, ev.Index)
	}
	// A table whose layout lacks a column is refused when announced, naming it.
	bad := relationMsg(203, "shipping", "parcels_outbox", outboxColumns...) // no parcel_id
	if _, err := d.Decode(bad); err == nil || !strings.Contains(err.Error(), `"parcel_id"`) {
		t.Errorf("relation without the table's key column: %v, want an error naming parcel_id", err)
	}
}
