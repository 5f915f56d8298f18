package decoder

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
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
// partition's rows name the table its Membership says it belongs to; a
// former partition's, which fit every table, fail as unattributed (one
// already seen as a partition keeps its table); other tables stay skipped. A table
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
		case 108:
			return IsMember, TableName{"public", "audit_outbox"}, nil
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
		relationMsg(108, "public", "audit_2026", outboxColumns...),
		relationMsg(108, "old", "audit_2026", outboxColumns...), // detached since
		beginMsg(lsn1, t1, xid1),
	} {
		if _, err := d.Decode(m); err != nil {
			t.Fatal(err)
		}
	}
	want := []struct {
		rel   uint32
		table string // "" skipped, "." unattributed
	}{
		{101, "billing.outbox_events"}, {102, "shipping.outbox_events"}, {103, ""},
		{104, "shipping.outbox_events"}, {105, "."}, {106, "public.audit_outbox"}, {108, "public.audit_outbox"},
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
			index++ // a skipped insert keeps its place (Event.Index)
			continue
		}
		if m.Kind != KindEvent {
			t.Fatalf("insert into relation %d: %v, want an event", w.rel, m.Kind)
		}
		if (m.Failed != nil) != (w.table == ".") {
			t.Errorf("insert into relation %d: failed %v, want it to fail only when unattributed", w.rel, m.Failed)
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

// TestFormerPartitionAttribution: the rows of a former partition (detached
// or dropped before the relay reads them) go to the outbox table it
// belonged to, read with that table's layout: the one the decoder saw it in
// (through Membership or RememberMembers, across Resets), else the only one
// whose columns it has. When its columns fit several tables and the decoder
// never saw it, each row is an event failing with CodeUnattributed (a dead
// letter naming why), never a skip; a relation with no table's columns is
// another table, skipped.
func TestFormerPartitionAttribution(t *testing.T) {
	const formerID = 301
	noType := defaultConfig()
	noType.Columns.EventType = ""
	parcels := defaultConfig()
	parcels.Schema, parcels.Table = "shipping", "parcels_outbox"
	parcels.Columns.AggregateID = "parcel_id"
	parcels.HeaderColumns = map[string]string{"carrier": "x-carrier"}
	withParcels := defaultConfig()
	withParcels.Also = []Config{parcels}
	audit := defaultConfig()
	audit.Schema, audit.Table = "public", "audit_outbox"
	withAudit := defaultConfig()
	withAudit.Also = []Config{audit}
	carrierAudit := audit
	carrierAudit.HeaderColumns = map[string]string{"carrier": "x-carrier"}
	withCarrierAudit := defaultConfig()
	withCarrierAudit.Also = []Config{carrierAudit}

	first := TableName{"public", "outbox_events"}
	parcelTable := TableName{"shipping", "parcels_outbox"}
	auditTable := TableName{"public", "audit_outbox"}
	parcelColumns := []string{"id", "aggregate_type", "parcel_id", "event_type", "payload", "created_at", "carrier"}
	parcelRow := []col{txt("f1"), txt("parcel"), txt("parcel-7"), txt("Shipped"), txt(`{"total":10}`), txt("2024-05-01 12:00:00+00"), txt("dhl")}
	noTypeColumns := []string{"id", "aggregate_type", "aggregate_id", "payload", "created_at"}
	noTypeRow := []col{txt("f1"), txt("order"), txt("42"), txt(`{"total":10}`), txt("2024-05-01 12:00:00+00")}
	outboxRow := row("f1")

	for _, tc := range []struct {
		name     string
		cfg      Config
		seen     TableName // announced as a partition of it first (IsMember), then Reset
		remember TableName // given to RememberMembers
		columns  []string
		row      []col
		want     TableName // zero: no table
		key      string
		headers  string
		failed   string // code of Message.Failed; "" none
		skipped  bool
	}{
		{name: "no event type column configured", cfg: noType, columns: noTypeColumns, row: noTypeRow, want: first, key: "42", headers: "[]"},
		{name: "the only table with its columns, of its own layout", cfg: withParcels, columns: parcelColumns, row: parcelRow,
			want: parcelTable, key: "parcel-7", headers: "[x-carrier=dhl]"},
		{name: "seen as a partition before a reconnect", cfg: withAudit, seen: auditTable, columns: outboxColumns, row: outboxRow, want: auditTable, key: "42", headers: "[]"},
		{name: "remembered from the catalog", cfg: withAudit, remember: auditTable, columns: outboxColumns, row: outboxRow, want: auditTable, key: "42", headers: "[]"},
		{name: "remembered, of its own layout", cfg: withParcels, remember: parcelTable, columns: parcelColumns, row: parcelRow,
			want: parcelTable, key: "parcel-7", headers: "[x-carrier=dhl]"},
		{name: "another table's header column missing: the only table it fits", cfg: withCarrierAudit, columns: outboxColumns, row: outboxRow,
			want: first, key: "42", headers: "[]"},
		{name: "fits several tables, never seen", cfg: withAudit, columns: outboxColumns, row: outboxRow, key: "42", headers: "[]", failed: CodeUnattributed},
		{name: "no table's columns", cfg: withParcels, columns: []string{"x", "y"}, row: []col{txt("1"), txt("2")}, skipped: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			member := IsMember
			d.SetMembership(func(_ context.Context, rel Relation) (Member, TableName, error) {
				if rel.ID != formerID {
					return NotMember, TableName{}, nil
				}
				if member == IsMember {
					return IsMember, tc.seen, nil
				}
				return FormerMember, TableName{}, nil
			})
			if tc.seen != (TableName{}) {
				if _, err := d.Decode(relationMsg(formerID, tc.seen.Schema, "part_2024", tc.columns...)); err != nil {
					t.Fatal(err)
				}
				d.Reset()
			}
			if tc.remember != (TableName{}) {
				d.RememberMembers(map[uint32]TableName{formerID: tc.remember, 999: {"other", "table"}})
			}
			member = FormerMember
			m, err := d.Decode(relationMsg(formerID, "old", "part_2024", tc.columns...))
			if err != nil {
				t.Fatal(err)
			}
			if m.Former == nil || m.Former.Table != tc.want || m.Former.Rel.ID != formerID {
				t.Fatalf("Relation of the former partition: Former %+v, want table %v", m.Former, tc.want)
			}
			if _, err := d.Decode(beginMsg(lsn1, t1, xid1)); err != nil {
				t.Fatal(err)
			}
			m, err = d.Decode(insertMsg(formerID, tc.row...))
			if err != nil {
				t.Fatal(err)
			}
			if tc.skipped {
				if m.Kind != KindSkip {
					t.Fatalf("insert: %v, want it skipped", m.Kind)
				}
				return
			}
			if m.Kind != KindEvent {
				t.Fatalf("insert: %v, want an event (never a skip)", m.Kind)
			}
			ev := m.Event
			var hdrs []string
			for _, h := range ev.Headers {
				hdrs = append(hdrs, h.Key+"="+string(h.Value))
			}
			if got := (TableName{ev.Schema, ev.Table}); got != tc.want || string(ev.ID) != "f1" || string(ev.AggregateID) != tc.key || fmt.Sprint(hdrs) != tc.headers {
				t.Errorf("event: table %v, id %q, key %q, headers %v; want %v, f1, %q, %s", got, ev.ID, ev.AggregateID, hdrs, tc.want, tc.key, tc.headers)
			}
			var code string
			var ee *outbox.EventError
			if errors.As(m.Failed, &ee) {
				code = ee.Code
			} else if m.Failed != nil {
				t.Fatalf("Failed = %v, not an *outbox.EventError", m.Failed)
			}
			if code != tc.failed {
				t.Fatalf("Failed = %v, want code %q", m.Failed, tc.failed)
			}
			if tc.failed != "" && (!strings.Contains(m.Failed.Error(), "old.part_2024") || !strings.Contains(m.Failed.Error(), "fit several")) {
				t.Errorf("Failed = %v, want it to name the relation and why", m.Failed)
			}
		})
	}
}

// TestDetachedPartitionPublishedOnItsOwn: a relation Membership calls
// another table published on its own (detached, and listed in the
// publication by name) may have rows of both kinds in the stream when the
// decoder saw it as a partition, or when Membership says it has exactly an
// outbox table's columns (Lookalike: a partition detached while the relay
// was stopped, which this run never saw as one): those committed before
// the WAL position read when it was announced fail as unattributed (never
// skipped), later ones are skipped as another table's. Unseen and no
// lookalike, a lookalike of a table the decoder does not read or whose
// Relation message lacks its columns, or without a WAL reader, it is
// another table.
func TestDetachedPartitionPublishedOnItsOwn(t *testing.T) {
	const partID = 401
	until := lsn1 + 0x1000
	outboxEvents := TableName{"public", "outbox_events"}
	for _, tc := range []struct {
		name        string
		remember    bool
		member      Member
		like        TableName
		columns     []string // of the Relation message; outboxColumns when nil
		walEnd      bool
		wantBefore  Kind
		wantFailure bool // Former.Until set, inserts before it fail
		wantWhy     string
		wantSkipped bool // Former says the inserts are skipped
	}{
		{name: "seen, with a WAL reader", remember: true, walEnd: true, wantBefore: KindEvent, wantFailure: true, wantWhy: "before the detach"},
		{name: "seen, and a lookalike", remember: true, member: Lookalike, like: outboxEvents, walEnd: true, wantBefore: KindEvent, wantFailure: true, wantWhy: "before the detach"},
		{name: "never seen", walEnd: true, wantBefore: KindSkip, wantSkipped: true},
		{name: "never seen, without the columns", columns: []string{"id", "aggregate_type", "aggregate_id", "event_type", "body"}, walEnd: true, wantBefore: KindSkip},
		{name: "never seen, a lookalike", member: Lookalike, like: outboxEvents, walEnd: true, wantBefore: KindEvent, wantFailure: true,
			wantWhy: "ALTER PUBLICATION ... DROP TABLE public.outbox_2024"},
		{name: "a lookalike of a table not read", member: Lookalike, like: TableName{"public", "other_outbox"}, walEnd: true, wantBefore: KindSkip, wantSkipped: true},
		{name: "a lookalike without the columns when written", member: Lookalike, like: outboxEvents, columns: []string{"id", "aggregate_type", "aggregate_id", "event_type", "body"},
			walEnd: true, wantBefore: KindSkip},
		{name: "no WAL reader", remember: true, wantBefore: KindSkip},
		{name: "a lookalike, no WAL reader", member: Lookalike, like: outboxEvents, wantBefore: KindSkip},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(defaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			d.SetMembership(func(context.Context, Relation) (Member, TableName, error) { return tc.member, tc.like, nil })
			if tc.remember {
				d.RememberMembers(map[uint32]TableName{partID: outboxEvents})
			}
			if tc.walEnd {
				d.SetWALEnd(func(context.Context) (pglogrepl.LSN, error) { return until, nil })
			}
			columns := tc.columns
			if columns == nil {
				columns = outboxColumns
			}
			m, err := d.Decode(relationMsg(partID, "public", "outbox_2024", columns...))
			if err != nil {
				t.Fatal(err)
			}
			switch f := m.Former; {
			case tc.wantFailure:
				if f == nil || f.Until != until || f.Table != outboxEvents || !f.OnItsOwn {
					t.Fatalf("Former = %+v, want one of %s on its own with Until %s", f, outboxEvents, until)
				}
			case tc.wantSkipped:
				if f == nil || f.Until != 0 || f.Failed != nil || !f.OnItsOwn || len(f.Fits) != 1 || f.Fits[0] != outboxEvents {
					t.Fatalf("Former = %+v, want one on its own that fits %s, skipped", f, outboxEvents)
				}
			case f != nil:
				t.Fatalf("Former = %+v, want none", f)
			}
			for _, step := range []struct {
				commit pglogrepl.LSN
				want   Kind
			}{{lsn1, tc.wantBefore}, {until - 1, tc.wantBefore}, {until, KindSkip}, {until + 0x500, KindSkip}} {
				if _, err := d.Decode(beginMsg(step.commit, t1, xid1)); err != nil {
					t.Fatal(err)
				}
				m, err := d.Decode(insertMsg(partID, row("r")...))
				if err != nil {
					t.Fatal(err)
				}
				if m.Kind != step.want {
					t.Fatalf("insert committed at %s: %v, want %v", step.commit, m.Kind, step.want)
				}
				if m.Kind == KindEvent {
					var ee *outbox.EventError
					if !errors.As(m.Failed, &ee) || ee.Code != CodeUnattributed || !strings.Contains(ee.Error(), tc.wantWhy) || m.Event.Table != "" {
						t.Fatalf("insert committed at %s: Failed = %v, want %s saying why", step.commit, m.Failed, CodeUnattributed)
					}
				}
				if u, err := d.Decode(updateMsg(partID, 0, nil, row("r"))); err != nil || (u.Kind == KindUpdate) != (step.want == KindEvent) {
					t.Fatalf("update committed at %s: %v, %v; want an outbox update only where inserts are events", step.commit, u.Kind, err)
				}
				if _, err := d.Decode(commitMsg(step.commit, step.commit+0x30, t1)); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
