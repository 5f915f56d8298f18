package decoder

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

// fixture is one pgoutput message captured from PostgreSQL 15 (see testdata/README.md).
type fixture struct {
	name string
	data []byte
}

// readFixtures returns testdata/*.bin in stream order.
func readFixtures(tb testing.TB) []fixture {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "*.bin"))
	if err != nil {
		tb.Fatal(err)
	}
	if len(files) == 0 {
		tb.Fatal("no testdata/*.bin: regenerate them, see testdata/README.md")
	}
	var fx []fixture
	for _, f := range files { // Glob sorts by name: pg15-NNN-...
		data, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		fx = append(fx, fixture{name: filepath.Base(f), data: data})
	}
	return fx
}

// TestRealFixtures decodes the stream captured from PostgreSQL 15 by the workload in
// captureSQL and checks the relay's view of it: which events come out, in which
// transactions, and that everything else is skipped.
func TestRealFixtures(t *testing.T) {
	fx := readFixtures(t)

	// The message types PostgreSQL 15 sent, one transaction per group.
	wantTypes := strings.Join([]string{
		"BYRIRIC", // order + event (Type and Relation of orders, Relation of outbox)
		"BIC",     // NULL correlation_id, unicode
		// the rolled-back transaction sends nothing
		"BIIC",  // savepoint: events 4 and 6, not 5
		"BUC",   // UPDATE of the outbox
		"BUMDC", // UPDATE orders (old tuple), logical message, DELETE of the outbox
		"M",     // non-transactional logical message
		"BIDC",  // insert and delete of event 7
		"BYRTC", // TRUNCATE orders (its metadata sent again)
		"BOIC",  // replication origin
		"BRIC",  // after ALTER TABLE: new Relation of the outbox
		"BIC",   // large (TOASTed) payload
	}, "")
	var gotTypes []byte
	for _, f := range fx {
		gotTypes = append(gotTypes, f.data[0])
	}
	if string(gotTypes) != wantTypes {
		t.Fatalf("fixture message types %s, want %s: was the capture workload changed?", gotTypes, wantTypes)
	}

	large := `{"blob": "c4ca4238a0b923820dcc509a6f75849b` // md5('1'), then md5('2')..md5('200')
	ev := func(id, aggType, aggID, eventType, payload string, headers ...outbox.Header) *outbox.Event {
		return &outbox.Event{
			ID: b("00000000-0000-0000-0000-0000000000" + id), AggregateType: b(aggType), AggregateID: b(aggID),
			EventType: b(eventType), Payload: b(payload), Headers: headers,
		}
	}
	corr := func(v string) outbox.Header { return outbox.Header{Key: "correlation_id", Value: b(v)} }
	wantEvents := []*outbox.Event{
		ev("01", "order", "1", "OrderPlaced", `{"total": "129.90", "order_id": 1}`, corr("corr-1")),
		ev("02", "customer", "ключ-7", "CustomerRenamed", `{"name": "Zoë Ångström — 日本語 🚀"}`),
		ev("04", "order", "4", "BeforeSavepoint", `{}`),
		ev("06", "order", "6", "AfterSavepoint", `{}`),
		ev("07", "order", "7", "DeletedRightAway", `{}`),
		ev("08", "order", "8", "FromOrigin", `{}`),
		ev("09", "order", "9", "AfterAlter", `{"n": 9}`, corr("corr-9")),
		ev("10", "order", "10", "Large", large),
	}

	d, err := New(withHeaders(map[string]string{"correlation_id": "correlation_id"}))
	if err != nil {
		t.Fatal(err)
	}
	var (
		events    []*outbox.Event
		begin     Message
		inTxn     bool
		index     uint32 // of the transaction's next event
		lastEnd   uint64
		skipped   = map[byte]int{}
		relations int
		updates   int
	)
	for _, f := range fx {
		m, err := d.Decode(f.data)
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		switch m.Kind {
		case KindBegin:
			if inTxn {
				t.Fatalf("%s: begin inside a transaction", f.name)
			}
			begin, inTxn, index = m, true, 0
		case KindEvent:
			e := m.Event
			if !inTxn || e.XID != begin.XID || e.CommitLSN != begin.CommitLSN || !e.CommitTime.Equal(begin.CommitTime) {
				t.Fatalf("%s: event xid=%d lsn=%s time=%s, begin %s", f.name, e.XID, e.CommitLSN, e.CommitTime, fmtMsg(begin))
			}
			if e.Index != index {
				t.Fatalf("%s: event %s has index %d, want %d: its place among the inserts and messages of its transaction", f.name, e.ID, e.Index, index)
			}
			index++
			events = append(events, e)
		case KindCommit:
			if !inTxn || m.XID != begin.XID || m.CommitLSN != begin.CommitLSN || !m.CommitTime.Equal(begin.CommitTime) {
				t.Fatalf("%s: commit %s does not match begin %s", f.name, fmtMsg(m), fmtMsg(begin))
			}
			if m.EndLSN <= m.CommitLSN || uint64(m.CommitLSN) <= lastEnd {
				t.Fatalf("%s: commit %s after end LSN %X: LSNs out of order", f.name, fmtMsg(m), lastEnd)
			}
			lastEnd, inTxn = uint64(m.EndLSN), false
		case KindRelation:
			relations++
		case KindSkip:
			skipped[f.data[0]]++
			if f.data[0] == 'I' {
				index++ // a skipped insert keeps its place (Event.Index)
			}
		case KindUpdate:
			updates++
		}
	}
	if inTxn {
		t.Fatal("stream ends inside a transaction")
	}
	if relations != 4 {
		t.Errorf("%d relation messages, want 4", relations)
	}
	// The orders insert, the skip paths, and nothing else.
	if updates != 1 {
		t.Errorf("%d outbox updates reported, want 1", updates)
	}
	for typ, n := range map[byte]int{'I': 1, 'U': 1, 'D': 2, 'T': 1, 'Y': 2, 'O': 1, 'M': 2} {
		if skipped[typ] != n {
			t.Errorf("%d %c messages skipped, want %d", skipped[typ], typ, n)
		}
	}
	if len(events) != len(wantEvents) {
		for _, e := range events {
			t.Logf("got event %s", e.ID)
		}
		t.Fatalf("%d events, want %d", len(events), len(wantEvents))
	}
	for i, want := range wantEvents {
		want.PayloadType = outbox.PayloadJSON // the fixtures' payload column is jsonb
		got := *events[i]
		got.XID, got.CommitLSN, got.CommitTime, got.Index = 0, 0, want.CommitTime, 0 // checked above
		if strings.HasPrefix(string(want.Payload), large) {
			if len(got.Payload) != len(`{"blob": ""}`)+200*32 || !bytes.HasPrefix(got.Payload, want.Payload) {
				t.Errorf("event %d: payload of %d bytes %.60q..., want 6412 bytes %q...", i, len(got.Payload), got.Payload, want.Payload)
			}
			got.Payload = want.Payload
		}
		if !equalMsg(eventMsg(&got), eventMsg(want)) {
			t.Errorf("event %d\n got %s\nwant %s", i, fmtMsg(eventMsg(&got)), fmtMsg(eventMsg(want)))
		}
	}
}

// TestRealFixturesRelationChange replays the transaction after ALTER TABLE ... DROP
// COLUMN legacy, ADD COLUMN tenant: configuring the new column as a header fails on
// the old table and works on the new one.
func TestRealFixturesRelationChange(t *testing.T) {
	fx := readFixtures(t)
	cfg := withHeaders(map[string]string{"tenant": "x-tenant", "correlation_id": "correlation_id"})

	rels := relationFixtures(t, fx, "outbox_events")
	if len(rels) != 2 {
		t.Fatalf("%d relation messages of the outbox, want 2", len(rels))
	}
	before, after := rels[0], rels[1]

	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Decode(fx[before].data)
	want := `decode pgoutput relation message: outbox column missing: table "public"."outbox_events" has no column "tenant" named in the header columns (dropped, renamed and generated columns are not replicated): fix them or the table (setting HeaderColumns)`
	if err == nil || err.Error() != want {
		t.Fatalf("%s: error %v, want %s", fx[before].name, err, want)
	}

	var got Message
	for _, f := range fx[after-1 : after+2] { // begin, relation, insert of event 9
		if got, err = d.Decode(f.data); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
	}
	if got.Kind != KindEvent {
		t.Fatalf("%s: %s, want an event", fx[after+1].name, fmtMsg(got))
	}
	wantHeaders := []outbox.Header{{Key: "correlation_id", Value: b("corr-9")}, {Key: "x-tenant", Value: b("acme")}}
	if e := got.Event; string(e.ID) != "00000000-0000-0000-0000-000000000009" || string(e.EventType) != "AfterAlter" ||
		len(e.Headers) != 2 || !equalHeaders(e.Headers, wantHeaders) {
		t.Fatalf("event after ALTER TABLE: %s", fmtMsg(got))
	}
}

// relationFixtures returns the indexes of the Relation messages of table.
func relationFixtures(tb testing.TB, fx []fixture, table string) []int {
	tb.Helper()
	var idx []int
	for i, f := range fx {
		if f.data[0] == 'R' && bytes.Contains(f.data, []byte("\x00"+table+"\x00")) {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		tb.Fatalf("no relation message of %s in testdata", table)
	}
	return idx
}

func equalHeaders(a, b []outbox.Header) bool {
	for i := range a {
		if a[i].Key != b[i].Key || !bytes.Equal(a[i].Value, b[i].Value) {
			return false
		}
	}
	return len(a) == len(b)
}

// FuzzDecode checks that no input makes Decode panic. Each input is a Relation message
// and another message; the second is decoded after the first and a Begin, so an
// insert is parsed against whatever column mapping the first produced, and again on a
// fresh decoder.
func FuzzDecode(f *testing.F) {
	fx := readFixtures(f)
	outboxRels, ordersRel := relationFixtures(f, fx, "outbox_events"), relationFixtures(f, fx, "orders")[0]
	for _, x := range fx {
		f.Add(fx[outboxRels[0]].data, x.data)
	}
	f.Add(fx[ordersRel].data, fx[ordersRel+1].data)
	odd := readFixturesIn(f, oddDir)
	for _, i := range relationFixtures(f, odd, "outbox_events") {
		for _, x := range odd[i+1 : min(i+3, len(odd))] {
			f.Add(odd[i].data, x.data)
		}
	}
	for _, i := range outboxRels {
		f.Add(fx[i].data, fx[i+1].data)
	}
	f.Add(relationStep.in, insertMsg(outboxID, row("e1")...))
	f.Add(relationStep.in, insertMsg(outboxID, txt(""), null, bin("x"), toast, txt("p"), null, null))
	f.Add(relationStep.in, updateMsg(outboxID, 'O', row("e1"), row("e2")))
	f.Add(relationStep.in, truncateMsg(1, 1, 2, 3))
	f.Add(relationStep.in, logicalMsg(true, 1, "p", "c"))
	f.Add(relationStep.in, commitStep.in)

	f.Fuzz(func(t *testing.T, rel, msg []byte) {
		d, err := New(withHeaders(map[string]string{"correlation_id": "correlation_id", "created_at": "t"}))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = d.Decode(rel)
		_, _ = d.Decode(beginStep.in)
		in := bytes.Clone(msg)
		m, err := d.Decode(in)
		if err == nil && m.Kind == KindEvent {
			before := fmtMsg(m)
			for i := range in {
				in[i] ^= 0xff
			}
			if after := fmtMsg(m); after != before {
				t.Fatalf("event changed with its input:\n%s\n%s", before, after)
			}
			_ = m.Event.Size()
		}
		if err == nil && m.Kind != KindEvent && m.Event != nil {
			t.Fatalf("%s carries an event", m.Kind)
		}
		fresh, err := New(defaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = fresh.Decode(msg)
	})
}
