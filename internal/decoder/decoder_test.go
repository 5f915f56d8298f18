package decoder

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-relay/cdc-relay/internal/connectjson"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

const (
	outboxID = 16385
	ordersID = 16390
	xid1     = 731
	lsn1     = pglogrepl.LSN(0x16B3748)
	end1     = lsn1 + 0x30
)

var t1 = time.Date(2024, 5, 1, 12, 0, 0, 123456000, time.UTC)

// outboxColumns is the default outbox table of migrations/ plus a nullable header column.
var outboxColumns = []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "created_at", "correlation_id"}

func defaultConfig() Config {
	return Config{Schema: "public", Table: "outbox_events", Columns: DefaultColumns()}
}

func withHeaders(h map[string]string) Config {
	c := defaultConfig()
	c.HeaderColumns = h
	return c
}

// b returns s as a non-nil byte slice (also when s is empty).
func b(s string) []byte { return append([]byte{}, s...) }

// row returns a valid outbox row for outboxColumns.
func row(id string) []col {
	return []col{txt(id), txt("order"), txt("42"), txt("OrderPlaced"), txt(`{"total":10}`), txt("2024-05-01 12:00:00+00"), null}
}

func event(id string) *outbox.Event {
	return &outbox.Event{
		ID: b(id), AggregateType: b("order"), AggregateID: b("42"), EventType: b("OrderPlaced"),
		Payload: b(`{"total":10}`), XID: xid1, CommitLSN: lsn1, CommitTime: t1,
	}
}

// second is ev as the second outbox event of its transaction (Index 1).
func second(ev *outbox.Event) *outbox.Event {
	ev.Index = 1
	return ev
}

func eventMsg(ev *outbox.Event) Message {
	return Message{Kind: KindEvent, XID: ev.XID, CommitLSN: ev.CommitLSN, CommitTime: ev.CommitTime, Event: ev}
}

var (
	beginStep    = step{in: beginMsg(lsn1, t1, xid1), want: Message{Kind: KindBegin, XID: xid1, CommitLSN: lsn1, CommitTime: t1}}
	commitStep   = step{in: commitMsg(lsn1, end1, t1), want: Message{Kind: KindCommit, XID: xid1, CommitLSN: lsn1, EndLSN: end1, CommitTime: t1}}
	relationStep = step{in: relationMsg(outboxID, "public", "outbox_events", outboxColumns...), want: Message{Kind: KindRelation}}
	skip         = Message{Kind: KindSkip}
	outboxUpdate = Message{Kind: KindUpdate, XID: xid1, CommitLSN: lsn1, CommitTime: t1}
)

// step is one Decode call: the input and either the message or error substrings expected.
type step struct {
	in      []byte
	want    Message
	wantErr []string
}

func relStep(id uint32, ns, name string, cols ...string) step {
	return step{in: relationMsg(id, ns, name, cols...), want: Message{Kind: KindRelation}}
}

func errStep(in []byte, wantErr ...string) step { return step{in: in, wantErr: wantErr} }

func TestDecode(t *testing.T) {
	renamed := Columns{ID: "event_id", AggregateType: "agg_type", AggregateID: "agg_id", EventType: "type", Payload: "body"}

	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{
			name: "event with all columns",
			cfg:  defaultConfig(),
			steps: []step{
				beginStep, relationStep,
				{in: insertMsg(outboxID, row("e1")...), want: eventMsg(event("e1"))},
				commitStep,
			},
		},
		{
			name: "two events in one transaction keep their order",
			cfg:  defaultConfig(),
			steps: []step{
				beginStep, relationStep,
				{in: insertMsg(outboxID, row("e1")...), want: eventMsg(event("e1"))},
				{in: insertMsg(outboxID, row("e2")...), want: eventMsg(second(event("e2")))},
				commitStep,
			},
		},
		{
			name: "configured column names in another order",
			cfg:  Config{Schema: "app", Table: "events", Columns: renamed},
			steps: []step{
				beginStep,
				relStep(outboxID, "app", "events", "seq", "body", "type", "agg_id", "agg_type", "event_id"),
				{
					in:   insertMsg(outboxID, txt("1"), txt("{}"), txt("T"), txt("a1"), txt("acct"), txt("e9")),
					want: eventMsg(&outbox.Event{ID: b("e9"), AggregateType: b("acct"), AggregateID: b("a1"), EventType: b("T"), Payload: b("{}"), XID: xid1, CommitLSN: lsn1, CommitTime: t1}),
				},
				commitStep,
			},
		},
		{
			name: "NULL is nil, empty text is empty and non-nil",
			cfg:  defaultConfig(),
			steps: []step{
				beginStep, relationStep,
				{
					in:   insertMsg(outboxID, txt("e1"), null, txt(""), txt("T"), null, null, null),
					want: eventMsg(&outbox.Event{ID: b("e1"), AggregateType: nil, AggregateID: b(""), EventType: b("T"), Payload: nil, XID: xid1, CommitLSN: lsn1, CommitTime: t1}),
				},
				{
					in:   insertMsg(outboxID, txt(""), txt(""), txt(""), txt(""), txt(""), null, null),
					want: eventMsg(&outbox.Event{ID: b(""), AggregateType: b(""), AggregateID: b(""), EventType: b(""), Payload: b(""), XID: xid1, CommitLSN: lsn1, CommitTime: t1, Index: 1}),
				},
			},
		},
		{
			name: "binary column kind is kept as is",
			cfg:  defaultConfig(),
			steps: []step{
				beginStep, relationStep,
				{
					in:   insertMsg(outboxID, bin("\x00\x01"), txt("order"), txt("42"), txt("OrderPlaced"), bin("\x01{}"), null, null),
					want: eventMsg(&outbox.Event{ID: b("\x00\x01"), AggregateType: b("order"), AggregateID: b("42"), EventType: b("OrderPlaced"), Payload: b("\x01{}"), XID: xid1, CommitLSN: lsn1, CommitTime: t1}),
				},
			},
		},
		{
			name: "unicode payload",
			cfg:  defaultConfig(),
			steps: []step{
				beginStep, relationStep,
				{
					in: insertMsg(outboxID, txt("e1"), txt("order"), txt("ключ"), txt("OrderPlaced"), txt(`{"msg":"héllo 日本 🚀"}`), null, null),
					want: eventMsg(&outbox.Event{ID: b("e1"), AggregateType: b("order"), AggregateID: b("ключ"), EventType: b("OrderPlaced"),
						Payload: b(`{"msg":"héllo 日本 🚀"}`), XID: xid1, CommitLSN: lsn1, CommitTime: t1}),
				},
			},
		},
		{
			name: "header columns: sorted by column, NULL skipped, may repeat a required column",
			cfg:  withHeaders(map[string]string{"correlation_id": "correlation-id", "tenant": "x-tenant", "event_type": "type", "created_at": "created"}),
			steps: []step{
				beginStep,
				relStep(outboxID, "public", "outbox_events", append(outboxColumns, "tenant")...),
				{
					in: insertMsg(outboxID, append(row("e1")[:6], txt("c-1"), null)...),
					want: eventMsg(func() *outbox.Event {
						ev := event("e1")
						ev.Headers = []outbox.Header{
							{Key: "correlation-id", Value: b("c-1")},
							{Key: "created", Value: b("2024-05-01 12:00:00+00")},
							{Key: "type", Value: b("OrderPlaced")},
						}
						return ev
					}()),
				},
				{
					in: insertMsg(outboxID, append(row("e2")[:5], null, null, null)...),
					want: eventMsg(func() *outbox.Event {
						ev := second(event("e2"))
						ev.Headers = []outbox.Header{{Key: "type", Value: b("OrderPlaced")}}
						return ev
					}()),
				},
			},
		},
		{
			name: "more header columns than fit inline",
			cfg:  withHeaders(map[string]string{"h1": "k1", "h2": "k2", "h3": "k3", "h4": "k4", "h5": "k5", "h6": "k6"}),
			steps: []step{
				beginStep,
				relStep(outboxID, "public", "outbox_events", "h6", "h5", "h4", "h3", "h2", "h1", "id", "aggregate_type", "aggregate_id", "event_type", "payload"),
				{
					in: insertMsg(outboxID, txt("6"), txt("5"), txt("4"), null, txt("2"), txt("1"), row("e1")[0], row("e1")[1], row("e1")[2], row("e1")[3], row("e1")[4]),
					want: eventMsg(func() *outbox.Event {
						ev := event("e1")
						ev.Headers = []outbox.Header{{Key: "k1", Value: b("1")}, {Key: "k2", Value: b("2")}, {Key: "k4", Value: b("4")}, {Key: "k5", Value: b("5")}, {Key: "k6", Value: b("6")}}
						return ev
					}()),
				},
			},
		},
		{
			// The skipped insert keeps its place: the event's Index (its
			// source position) does not depend on how the row before it is judged.
			name: "insert into another table is skipped and keeps its place",
			cfg:  defaultConfig(),
			steps: []step{
				beginStep, relationStep,
				relStep(ordersID, "public", "orders", "id", "total"),
				{in: insertMsg(ordersID, txt("1"), txt("10")), want: skip},
				{in: insertMsg(outboxID, row("e1")...), want: eventMsg(second(event("e1")))},
				commitStep,
			},
		},
		{
			name: "same table name in another schema is not the outbox",
			cfg:  defaultConfig(),
			steps: []step{
				beginStep,
				relStep(ordersID, "audit", "outbox_events", "x"),
				{in: insertMsg(ordersID, txt("1")), want: skip},
			},
		},
		{
			name: "relation change mid-stream remaps columns",
			cfg:  withHeaders(map[string]string{"correlation_id": "correlation_id"}),
			steps: []step{
				beginStep,
				relStep(outboxID, "public", "outbox_events", "id", "legacy", "aggregate_type", "aggregate_id", "event_type", "payload", "correlation_id"),
				{in: insertMsg(outboxID, txt("e1"), txt("old"), txt("order"), txt("42"), txt("OrderPlaced"), txt(`{"total":10}`), txt("c1")),
					want: eventMsg(func() *outbox.Event {
						ev := event("e1")
						ev.Headers = []outbox.Header{{Key: "correlation_id", Value: b("c1")}}
						return ev
					}())},
				commitStep,
				// ALTER TABLE DROP COLUMN legacy, ADD COLUMN tenant.
				beginStep,
				relStep(outboxID, "public", "outbox_events", "id", "aggregate_type", "aggregate_id", "event_type", "payload", "correlation_id", "tenant"),
				{in: insertMsg(outboxID, txt("e2"), txt("order"), txt("42"), txt("OrderPlaced"), txt(`{"total":10}`), txt("c2"), txt("acme")),
					want: eventMsg(func() *outbox.Event {
						ev := event("e2")
						ev.Headers = []outbox.Header{{Key: "correlation_id", Value: b("c2")}}
						return ev
					}())},
				errStep(insertMsg(outboxID, txt("e3"), txt("old"), txt("order"), txt("42"), txt("OrderPlaced"), txt(`{}`), txt("c1"), null, null),
					"tuple has 9 columns", "announced 7"),
			},
		},
		{
			name: "outbox renamed away is no longer decoded",
			cfg:  defaultConfig(),
			steps: []step{
				beginStep, relationStep,
				relStep(outboxID, "public", "outbox_events_old", outboxColumns...),
				{in: insertMsg(outboxID, row("e1")...), want: skip},
			},
		},
		{
			name: "outbox recreated under a new relation id",
			cfg:  defaultConfig(),
			steps: []step{
				beginStep, relationStep,
				relStep(outboxID+100, "public", "outbox_events", outboxColumns...),
				{in: insertMsg(outboxID+100, row("e1")...), want: eventMsg(event("e1"))},
				{in: insertMsg(outboxID, row("e0")...), want: skip},
			},
		},
		{
			name: "changes other than outbox inserts are skipped, outbox updates reported",
			cfg:  defaultConfig(),
			steps: []step{
				{in: logicalMsg(false, lsn1-8, "cdc", "non-transactional"), want: skip},
				beginStep,
				{in: originMsg(lsn1-100, "upstream"), want: skip},
				{in: typeMsg(16400, "public", "order_status"), want: skip},
				relationStep,
				{in: updateMsg(outboxID, 0, nil, row("e1")), want: outboxUpdate},
				{in: updateMsg(outboxID, 'K', []col{txt("e1"), null, null, null, null, null, null}, row("e1")), want: outboxUpdate},
				{in: updateMsg(outboxID, 'O', row("e1"), []col{txt("e1"), toast, toast, toast, toast, null, null}), want: outboxUpdate},
				{in: deleteMsg(outboxID, 'K', txt("e1"), null, null, null, null, null, null), want: skip},
				{in: deleteMsg(outboxID, 'O', row("e1")...), want: skip},
				{in: truncateMsg(1, outboxID, ordersID), want: skip},
				{in: truncateMsg(0), want: skip},
				{in: logicalMsg(true, lsn1-4, "cdc", ""), want: skip},
				commitStep,
			},
		},
		{
			name: "missing column error names column, table and setting",
			cfg:  Config{Schema: "app", Table: "events", Columns: renamed},
			steps: []step{
				errStep(relationMsg(outboxID, "app", "events", "event_id", "agg_type", "agg_id", "type", "payload"),
					`table "app"."events" has no column "body"`, "(setting Columns.Payload)"),
				// The broken relation stays unknown: its inserts fail instead of being skipped.
				beginStep,
				errStep(insertMsg(outboxID, txt("e1"), txt("a"), txt("b"), txt("c"), txt("d")), "unknown relation 16385"),
			},
		},
		{
			name: "missing header column names the header columns setting",
			cfg:  withHeaders(map[string]string{"tenant": "x-tenant"}),
			steps: []step{
				errStep(relationMsg(outboxID, "public", "outbox_events", outboxColumns...),
					`table "public"."outbox_events" has no column "tenant" named in the header columns`, "(setting HeaderColumns)"),
			},
		},
		{
			name: "insert outside a transaction",
			cfg:  defaultConfig(),
			steps: []step{
				relationStep,
				errStep(insertMsg(outboxID, row("e1")...), "insert outside a transaction"),
				beginStep, commitStep,
				errStep(insertMsg(outboxID, row("e1")...), "insert outside a transaction"),
			},
		},
		{
			name: "insert into an unknown relation",
			cfg:  defaultConfig(),
			steps: []step{
				beginStep,
				errStep(insertMsg(ordersID, txt("1")), "insert into unknown relation 16390"),
			},
		},
		{
			name: "transaction framing errors",
			cfg:  defaultConfig(),
			steps: []step{
				errStep(commitMsg(lsn1, end1, t1), "commit outside a transaction"),
				beginStep,
				errStep(beginMsg(lsn1+0x100, t1, xid1+1), "transaction 731 has no commit"),
			},
		},
		{
			name: "unchanged TOAST value in an insert",
			cfg:  defaultConfig(),
			steps: []step{
				beginStep, relationStep,
				errStep(insertMsg(outboxID, txt("e1"), txt("order"), txt("42"), txt("T"), toast, null, null), "column 4 is an unchanged TOAST value"),
			},
		},
		{
			name: "bad tuple encoding in an insert",
			cfg:  defaultConfig(),
			steps: []step{
				beginStep, relationStep,
				errStep(append(insertMsg(outboxID, row("e1")...), 0), "1 trailing bytes after tuple"),
				errStep(insertMsg(outboxID, txt("e1"), txt("order"), txt("42"), txt("T"), col{kind: 'x'}, null, null), "column 4 has unknown value kind 'x'"),
				errStep(enc{'I'}.u32(outboxID).u8('K').tuple(row("e1")), "tuple type 'K', want 'N'"),
				errStep(enc{'I'}.u32(outboxID).u8('N').u16(7).u8('t').u32(0xffffffff).raw([]byte("e1")), "tuple truncated in column 0: length 4294967295, 2 bytes left"),
			},
		},
		{
			name: "unknown and streaming message types",
			cfg:  defaultConfig(),
			steps: []step{
				errStep(nil, "empty message"),
				errStep([]byte("X123"), "unknown message type 'X'"),
				errStep(enc{'S'}.u32(xid1).u8(1), "unexpected streaming message 'S'", "proto_version 1"),
				errStep(enc{'E'}, "unexpected streaming message 'E'"),
				errStep(enc{'c'}.u32(xid1), "unexpected streaming message 'c'"),
				errStep(enc{'A'}.u32(xid1).u32(xid1), "unexpected streaming message 'A'"),
				errStep(enc{'P'}, "unknown message type 'P'"),
			},
		},
		{
			name: "malformed skipped messages are errors",
			cfg:  defaultConfig(),
			steps: []step{
				errStep(enc{'U'}.u32(outboxID).u8('X').tuple(row("e1")), "decode pgoutput update message: tuple type 'X', want 'N'"),
				errStep(enc{'D'}.u32(outboxID).u8('N').tuple(row("e1")), "decode pgoutput delete message: tuple type 'N', want 'K' or 'O'"),
				errStep(enc{'T'}.u32(2).u8(0).u32(1), "decode pgoutput truncate message: 2 relations need 8 bytes of ids, have 4"),
				errStep(enc{'M'}.u8(1).u64(1).str("p").u32(5).raw([]byte("abc")), "decode pgoutput logical decoding message: content length 5, 3 bytes left"),
				errStep(enc{'Y'}.u32(1).str("public"), "decode pgoutput type message: message truncated: unterminated string"),
				errStep(append(originMsg(1, "x"), 'y'), "decode pgoutput origin message: 1 trailing bytes"),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := New(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				got, err := d.Decode(s.in)
				if s.wantErr != nil {
					if err == nil {
						t.Fatalf("step %d: Decode(%x) = %s, want error containing %q", i, s.in, fmtMsg(got), s.wantErr)
					}
					for _, w := range s.wantErr {
						if !strings.Contains(err.Error(), w) {
							t.Errorf("step %d: error %q does not contain %q", i, err, w)
						}
					}
					continue
				}
				if err != nil {
					t.Fatalf("step %d: Decode(%x): %v", i, s.in, err)
				}
				if !equalMsg(got, s.want) {
					t.Fatalf("step %d: Decode(%x)\n got %s\nwant %s", i, s.in, fmtMsg(got), fmtMsg(s.want))
				}
			}
		})
	}
}

// equalMsg compares messages, nil and empty slices being different.
func equalMsg(a, b Message) bool {
	if !a.CommitTime.Equal(b.CommitTime) {
		return false
	}
	a.CommitTime, b.CommitTime = time.Time{}, time.Time{}
	ae, be := a.Event, b.Event
	a.Event, b.Event = nil, nil
	if a != b || (ae == nil) != (be == nil) {
		return false
	}
	if ae == nil {
		return true
	}
	if !ae.CommitTime.Equal(be.CommitTime) {
		return false
	}
	x, y := *ae, *be
	x.CommitTime, y.CommitTime = time.Time{}, time.Time{}
	x.Values, y.Values = nil, nil // the buffer the values share, not a value
	if y.Table == "" && y.MessagePrefix == "" {
		// The case names no source table: it is about something else
		// (TestSeveralTables checks them).
		x.Schema, x.Table = "", ""
	}
	return reflect.DeepEqual(x, y)
}

func fmtMsg(m Message) string {
	s := fmt.Sprintf("{%s xid=%d commit=%s end=%s time=%s", m.Kind, m.XID, m.CommitLSN, m.EndLSN, m.CommitTime.Format(time.RFC3339Nano))
	if ev := m.Event; ev != nil && ev.Table != "" {
		s += fmt.Sprintf(" table=%s.%s", ev.Schema, ev.Table)
	}
	if ev := m.Event; ev != nil {
		s += fmt.Sprintf(" event{id=%s type=%s aggid=%s event=%s payload=%s headers=[",
			fmtBytes(ev.ID), fmtBytes(ev.AggregateType), fmtBytes(ev.AggregateID), fmtBytes(ev.EventType), fmtBytes(ev.Payload))
		for _, h := range ev.Headers {
			s += fmt.Sprintf("%s:%s ", h.Key, fmtBytes(h.Value))
		}
		s += fmt.Sprintf("] payload_type=%s xid=%d commit=%s index=%d time=%s}", ev.PayloadType, ev.XID, ev.CommitLSN, ev.Index, ev.CommitTime.Format(time.RFC3339Nano))
	}
	return s + "}"
}

func fmtBytes(v []byte) string {
	if v == nil {
		return "NULL"
	}
	return fmt.Sprintf("%q", v)
}

func TestNewValidatesConfig(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"valid", func(*Config) {}, ""},
		{"schema", func(c *Config) { c.Schema = "" }, "outbox schema is empty: set it (setting Schema)"},
		{"table", func(c *Config) { c.Table = "" }, "outbox table is empty: set it (setting Table)"},
		{"id", func(c *Config) { c.Columns.ID = "" }, "(setting Columns.ID)"},
		{"aggregate type", func(c *Config) { c.Columns.AggregateType = "" }, "(setting Columns.AggregateType)"},
		{"aggregate id", func(c *Config) { c.Columns.AggregateID = "" }, "(setting Columns.AggregateID)"},
		{"no event type column", func(c *Config) { c.Columns.EventType = "" }, ""}, // optional (Debezium tables)
		{"payload", func(c *Config) { c.Columns.Payload = "" }, "(setting Columns.Payload)"},
		{"header column", func(c *Config) { c.HeaderColumns = map[string]string{"": "k"} }, `empty column name for header "k": fix it (setting HeaderColumns)`},
		{"header key", func(c *Config) { c.HeaderColumns = map[string]string{"c": ""} }, `empty header key for column "c": fix it (setting HeaderColumns)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaultConfig()
			tt.mutate(&cfg)
			_, err := New(cfg)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("New: error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestNewCopiesHeaderColumns(t *testing.T) {
	h := map[string]string{"correlation_id": "correlation_id"}
	d, err := New(withHeaders(h))
	if err != nil {
		t.Fatal(err)
	}
	h["tenant"] = "tenant" // must not affect the decoder
	if _, err := d.Decode(relationStep.in); err != nil {
		t.Fatal(err)
	}
}

// TestMissingColumnErrors covers every configured column a Relation message
// may lack: each is ErrMissingColumn naming the table, the column, why it may
// be absent and what to fix, and carries the setting that names it.
func TestMissingColumnErrors(t *testing.T) {
	const prefix = `decode pgoutput relation message: outbox column missing: table "public"."outbox_events" has no `
	const why = ` (dropped, renamed and generated columns are not replicated): `
	type missingCase struct {
		name  string
		cfg   func(*Config)
		drop  string // the column left out of the Relation message, "" for none
		field string // the setting the error names
		want  string // the error's text
	}
	tests := []missingCase{
		{name: "header column", cfg: func(c *Config) { c.HeaderColumns = map[string]string{"tenant": "x-tenant"} },
			field: fieldHeaderColumns, want: prefix + `column "tenant" named in the header columns` + why + `fix them or the table (setting HeaderColumns)`},
		{name: "timestamp column", cfg: func(c *Config) { c.TimestampColumn = "occurred_at" },
			field: fieldTimestamp, want: prefix + `timestamp column "occurred_at"` + why + `fix it or the table (setting TimestampColumn)`},
		{name: "partition column", cfg: func(c *Config) { c.PartitionColumn = "kafka_partition" },
			field: fieldPartition, want: prefix + `partition column "kafka_partition"` + why + `fix it or the table (setting PartitionColumn)`},
		{name: "envelope column", cfg: func(c *Config) { c.EnvelopeColumns = []EnvelopeColumn{{Column: "tenant", Alias: "tenant"}} },
			field: fieldEnvelope, want: prefix + `column "tenant" named in the envelope columns` + why + `fix them or the table (setting EnvelopeColumns)`},
		{name: "schema version column", cfg: func(c *Config) {
			c.EnvelopeColumns = []EnvelopeColumn{{Column: "correlation_id", Alias: "correlation_id"}}
			c.JSON = connectjson.Options{Value: connectjson.JSONWithSchema}
			c.SchemaVersionColumn = "schema_version"
		}, field: fieldVersion, want: prefix + `schema version column "schema_version"` + why + `fix it or the table (setting SchemaVersionColumn)`},
	}
	for f, field := range columnFields {
		name := DefaultColumns().names()[f]
		tests = append(tests, missingCase{name: "outbox column " + name, drop: name, field: field,
			want: prefix + fmt.Sprintf("column %q", name) + why + "set the right column name (setting " + field + ")"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaultConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			var cols []string
			for _, c := range outboxColumns {
				if c != tt.drop {
					cols = append(cols, c)
				}
			}
			d, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = d.Decode(relationMsg(outboxID, "public", "outbox_events", cols...))
			if !errors.Is(err, ErrMissingColumn) {
				t.Fatalf("error %v, want ErrMissingColumn", err)
			}
			var fe *setting.FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field {
				t.Errorf("error %v names no setting %s", err, tt.field)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n %s\nwant\n %s", err, tt.want)
			}
		})
	}
}

// TestTruncatedAndPaddedInput cuts every valid message at every length and appends
// a byte to it: each must be an error, in the decoder state the message expects.
func TestTruncatedAndPaddedInput(t *testing.T) {
	inTxn := []step{relationStep, beginStep}
	msgs := []struct {
		name  string
		setup []step
		msg   []byte
	}{
		{"begin", []step{relationStep}, beginStep.in},
		{"commit", inTxn, commitStep.in},
		{"relation", inTxn, relationStep.in},
		{"relation of another table", inTxn, relationMsg(ordersID, "public", "orders", "id")},
		{"insert", inTxn, insertMsg(outboxID, row("e1")...)},
		{"insert of empty values", inTxn, insertMsg(outboxID, txt(""), txt(""), txt(""), txt(""), txt(""), txt(""), txt(""))},
		{"update", inTxn, updateMsg(outboxID, 'O', row("e1"), row("e1"))},
		{"update of new tuple", inTxn, updateMsg(outboxID, 0, nil, row("e1"))},
		{"delete", inTxn, deleteMsg(outboxID, 'K', txt("e1"), null)},
		{"truncate", inTxn, truncateMsg(0, outboxID)},
		{"type", inTxn, typeMsg(1, "public", "t")},
		{"origin", inTxn, originMsg(1, "o")},
		{"logical message", inTxn, logicalMsg(true, 1, "p", "c")},
	}
	for _, m := range msgs {
		t.Run(m.name, func(t *testing.T) {
			decoder := func() *Decoder {
				d, err := New(defaultConfig())
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range m.setup {
					if _, err := d.Decode(s.in); err != nil {
						t.Fatal(err)
					}
				}
				return d
			}
			if _, err := decoder().Decode(m.msg); err != nil {
				t.Fatalf("full message: %v", err)
			}
			for n := range len(m.msg) {
				if got, err := decoder().Decode(m.msg[:n]); err == nil {
					t.Errorf("Decode(%x) (cut at %d of %d) = %s, want error", m.msg[:n], n, len(m.msg), fmtMsg(got))
				}
			}
			padded := append(bytes.Clone(m.msg), 0)
			if got, err := decoder().Decode(padded); err == nil {
				t.Errorf("Decode(%x) (one byte too long) = %s, want error", padded, fmtMsg(got))
			}
		})
	}
}

func TestEventDoesNotAliasInput(t *testing.T) {
	d := primed(t, withHeaders(map[string]string{"correlation_id": "c"}))
	in := insertMsg(outboxID, append(row("e1")[:6], txt("c-1"))...)
	m, err := d.Decode(in)
	if err != nil {
		t.Fatal(err)
	}
	for i := range in {
		in[i] = 0xff
	}
	want := event("e1")
	want.Headers = []outbox.Header{{Key: "c", Value: b("c-1")}}
	if !equalMsg(m, eventMsg(want)) {
		t.Fatalf("event changed with its input: %s", fmtMsg(m))
	}
	// Fields share one buffer but an append must not run into the next value.
	_ = append(m.Event.ID, "XXXXXXXXXXXXXXXXXXXX"...)
	if !equalMsg(m, eventMsg(want)) {
		t.Fatalf("append to ID changed other fields: %s", fmtMsg(m))
	}
}

func TestReset(t *testing.T) {
	d := primed(t, defaultConfig())
	d.Reset()
	// The transaction and relation are forgotten.
	if _, err := d.Decode(beginStep.in); err != nil {
		t.Fatalf("begin after Reset: %v", err)
	}
	if _, err := d.Decode(insertMsg(outboxID, row("e1")...)); err == nil || !strings.Contains(err.Error(), "unknown relation") {
		t.Fatalf("insert after Reset: error %v, want unknown relation", err)
	}
	if _, err := d.Decode(relationStep.in); err != nil {
		t.Fatal(err)
	}
	m, err := d.Decode(insertMsg(outboxID, row("e1")...))
	if err != nil || !equalMsg(m, eventMsg(event("e1"))) {
		t.Fatalf("insert after Reset and Relation: %s, %v", fmtMsg(m), err)
	}
}

func TestInsertAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	tests := []struct {
		name string
		cfg  Config
		want float64
	}{
		{"no headers", defaultConfig(), 2},
		{"inline headers", withHeaders(map[string]string{"correlation_id": "c", "created_at": "t"}), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := primed(t, tt.cfg)
			in := insertMsg(outboxID, append(row("e1")[:6], txt("c-1"))...)
			got := testing.AllocsPerRun(100, func() {
				if _, err := d.Decode(in); err != nil {
					t.Fatal(err)
				}
			})
			if got != tt.want {
				t.Fatalf("Decode of an insert: %v allocations, want %v", got, tt.want)
			}
		})
	}
}

func TestPgTime(t *testing.T) {
	tests := []struct {
		us   int64
		want time.Time
	}{
		{0, time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{1, time.Date(2000, 1, 1, 0, 0, 0, 1000, time.UTC)},
		{-1, time.Date(1999, 12, 31, 23, 59, 59, 999999000, time.UTC)},
		{767_880_000_123_456, time.Date(2024, 5, 1, 12, 0, 0, 123456000, time.UTC)},
	}
	for _, tt := range tests {
		if got := pgTime(tt.us); !got.Equal(tt.want) || got.Location() != time.UTC {
			t.Errorf("pgTime(%d) = %v, want %v", tt.us, got, tt.want)
		}
	}
}

// primed returns a decoder that has seen the outbox relation and a Begin.
func primed(tb testing.TB, cfg Config) *Decoder {
	tb.Helper()
	d, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	for _, s := range []step{relationStep, beginStep} {
		if _, err := d.Decode(s.in); err != nil {
			tb.Fatal(err)
		}
	}
	return d
}

// BenchmarkDecodeInsert decodes one outbox insert of a typical size (~300 bytes).
func BenchmarkDecodeInsert(b *testing.B) {
	order := `{"order_id":"order-1234567","customer_id":"c-987","total":{"amount":"129.90","currency":"EUR"},"items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}]}`
	for _, size := range []int{len(order), 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("payload=%d", size), func(b *testing.B) {
			payload := order
			if size > len(order) {
				payload = `{"pad":"` + strings.Repeat("x", size-10) + `"}`
			}
			d := primed(b, defaultConfig())
			in := insertMsg(outboxID,
				txt("0190a3c2-7b1e-7cc4-9d1f-3c5e8a2b4f61"), txt("order"), txt("order-1234567"), txt("OrderPlaced"),
				txt(payload), txt("2024-05-01 12:00:00.123456+00"), txt("7f0c1e2d-5b8a-4f3e-9c6d-2a1b0e9f8d7c"))
			b.ReportAllocs()
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				m, err := d.Decode(in)
				if err != nil || m.Kind != KindEvent {
					b.Fatal(m.Kind, err)
				}
			}
		})
	}
}

func TestKeptValues(t *testing.T) {
	big := strings.Repeat("z", maxKeptGap+1)
	tests := []struct {
		name    string
		msg     string // values at the offsets below, other bytes stand for headers
		spans   []span
		keep    []int
		want    []string // per kept column; "<nil>" for NULL
		wantLen int      // bytes copied: the stretch, or only the values
	}{
		{"close together: one clone, gaps included", "..id....payload..",
			[]span{{off: 2, n: 2}, {off: 8, n: 7}}, []int{0, 1}, []string{"id", "payload"}, 13},
		{"an unkept column wider than maxKeptGap: value by value", "..id.." + big + "..payload",
			[]span{{off: 2, n: 2}, {off: 6, n: len(big)}, {off: 8 + len(big), n: 7}}, []int{0, 2}, []string{"id", "payload"}, 9},
		{"empty and NULL outside the stretch", "x..id..pay",
			[]span{{off: 0, n: 0}, {off: 3, n: 2}, {off: 7, n: 3}, {null: true}}, []int{0, 1, 2, 3}, []string{"", "id", "pay", "<nil>"}, 7},
		{"nothing but empty values", "....",
			[]span{{off: 1, n: 0}, {null: true}}, []int{0, 1}, []string{"", "<nil>"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := []byte(tt.msg)
			spans := slices.Clone(tt.spans)
			buf := keptValues(&valuePool{}, msg, spans, tt.keep)
			if buf == nil || len(buf) != tt.wantLen {
				t.Fatalf("buffer of %d bytes (nil %v), want %d", len(buf), buf == nil, tt.wantLen)
			}
			for i := range msg {
				msg[i] = '#' // the values must not alias the message
			}
			for i, col := range tt.keep {
				v := value(buf, spans[col])
				got := string(v)
				if v == nil {
					got = "<nil>"
				}
				if got != tt.want[i] {
					t.Errorf("column %d = %q, want %q", col, got, tt.want[i])
				}
			}
		})
	}
}

// TestNoEventTypeColumn: with no event type column configured (a Debezium
// outbox table without one), a table lacking such a column decodes, and
// its events carry no event type.
func TestNoEventTypeColumn(t *testing.T) {
	cfg := defaultConfig()
	cfg.Columns.EventType = ""
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	for _, in := range [][]byte{beginMsg(0x200, at, 7), relationMsg(outboxID, "public", "outbox_events", "id", "aggregate_type", "aggregate_id", "payload")} {
		if _, err := d.Decode(in); err != nil {
			t.Fatalf("decode: %v", err)
		}
	}
	m, err := d.Decode(insertMsg(outboxID, txt("e1"), txt("order"), txt("o-1"), txt(`{"n":1}`)))
	if err != nil {
		t.Fatal(err)
	}
	if m.Event == nil || string(m.Event.ID) != "e1" || string(m.Event.AggregateID) != "o-1" || string(m.Event.Payload) != `{"n":1}` || m.Event.EventType != nil {
		t.Fatalf("event %+v, want e1/o-1 with no event type", m.Event)
	}
}
