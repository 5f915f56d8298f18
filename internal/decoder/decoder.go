// Package decoder turns pgoutput messages (logical replication protocol version 1)
// into outbox events.
//
// The replication loop hands the WALData of every XLogData message to
// [Decoder.Decode], which returns one [Message] at a time: transaction boundaries
// (Begin, Commit), Relation announcements, and one Event for each INSERT into the
// outbox table. Everything else in the stream is reported as [KindSkip].
//
// With protocol version 1 and no streaming, Postgres sends only whole committed
// transactions, already stripped of rolled-back subtransactions, so every event
// the decoder returns is committed.
package decoder

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-relay/cdc-relay/internal/connectjson"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// Config fields named in configuration errors (setting.FieldError), so that they
// tell the operator what to set (Config.Names renders them).
const (
	fieldSchema        = "Schema"
	fieldTable         = "Table"
	fieldHeaderColumns = "HeaderColumns"
	fieldContentType   = "ContentType"
	fieldTracing       = "TracingColumn"
	fieldTimestamp     = "TimestampColumn"
	fieldPartition     = "PartitionColumn"
	fieldEnvelope      = "EnvelopeColumns"
	fieldJSON          = "JSON"
	fieldVersion       = "SchemaVersionColumn"
)

// columnFields names the Config field of each required column, in field order
// (see fieldID).
var columnFields = [numFields]string{
	"Columns.ID",
	"Columns.AggregateType",
	"Columns.AggregateID",
	"Columns.EventType",
	"Columns.Payload",
}

// Indexes of the required outbox columns in outboxRel.fields and columnFields.
const (
	fieldID = iota
	fieldAggregateType
	fieldAggregateID
	fieldEventType
	fieldPayload
	numFields
)

// ErrMissingColumn reports that the outbox table, as announced by a Relation message,
// lacks a configured column. It is a configuration error: the relay must stop and the
// operator must fix the named setting (or the table). Retrying does not help.
// It comes wrapped in a *setting.FieldError naming the setting.
var ErrMissingColumn = errors.New("outbox column missing")

// notReplicated says which columns a Relation message lacks although the table
// may seem to have them.
const notReplicated = "dropped, renamed and generated columns are not replicated"

// missingColumn is ErrMissingColumn for the outbox table schema.table, whose
// Relation message lacks column, named by the setting field: the one message
// for every configured column, saying what the column is for and what to fix.
func (d *Decoder) missingColumn(field, schema, table, column string) error {
	what, fix := fmt.Sprintf("column %q", column), "set the right column name" // a required column: Columns
	switch field {
	case fieldHeaderColumns:
		what, fix = what+" named in the header columns", "fix them or the table"
	case fieldEnvelope:
		what, fix = what+" named in the envelope columns", "fix them or the table"
	case fieldTimestamp:
		what, fix = "timestamp "+what, "fix it or the table"
	case fieldPartition:
		what, fix = "partition "+what, "fix it or the table"
	case fieldVersion:
		what, fix = "schema version "+what, "fix it or the table"
	}
	return d.names.Errorf(field, "%w: table %q.%q has no %s (%s): %s", ErrMissingColumn, schema, table, what, notReplicated, fix)
}

// Columns names the outbox table's columns.
type Columns struct {
	ID            string // event id, the downstream idempotency key (outbox.columns.id)
	AggregateType string // outbox.columns.aggregate_type
	AggregateID   string // Kafka message key (outbox.columns.aggregate_id)
	// EventType is optional: "" reads no event type (an empty event_type
	// header), as a Debezium outbox table without one (outbox.columns.event_type).
	EventType string
	Payload   string // Kafka message value (outbox.columns.payload)
}

// DefaultColumns returns the column names of the outbox table in migrations/:
// id, aggregate_type, aggregate_id, event_type, payload.
func DefaultColumns() Columns {
	return Columns{
		ID:            "id",
		AggregateType: "aggregate_type",
		AggregateID:   "aggregate_id",
		EventType:     "event_type",
		Payload:       "payload",
	}
}

// names returns the column names in field order.
func (c Columns) names() [numFields]string {
	return [numFields]string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload}
}

// Config tells the decoder which table is the outbox and how to read it.
// Names are compared exactly with what Postgres announces: unquoted identifiers
// are lower case there.
type Config struct {
	Schema, Table string // the outbox table, e.g. "public", "outbox_events"
	// Also configures further outbox tables, each read with its own
	// Config (its Schema, Table, columns and formats; no MessagePrefix, no
	// Also of its own): several outboxes (one per module or tenant) behind
	// one relay and one slot. Each event says which table it came from
	// (outbox.Event.Schema and Table).
	Also    []Config
	Columns Columns
	// HeaderColumns maps extra outbox columns to Kafka header keys, e.g.
	// "correlation_id" -> "correlation_id". NULL values produce no header.
	// The headers the relay sets itself cannot be targets (see New).
	HeaderColumns map[string]string
	// ContentType says when events carry a content-type header:
	// ContentTypeAuto (application/json for a json or jsonb payload column,
	// none otherwise; the CLI's default), "" or ContentTypeNone (never), or a
	// MIME type for every event.
	ContentType string
	// TracingColumn names the column holding a trace context (see
	// ParseTraceContext), sent as traceparent and tracestate headers; e.g.
	// DefaultTracingColumn. A table without it is no error: events then carry
	// no trace headers. "" means none.
	TracingColumn string
	// TimestampColumn names the column whose value becomes the Kafka record
	// timestamp (Event.Timestamp; see ParseTimestamp): timestamptz,
	// timestamp or bigint Unix milliseconds. NULL leaves it to the sink.
	// "" means none; a table without it is a configuration error.
	TimestampColumn string
	// PartitionColumn names an integer column holding the Kafka partition
	// of each event (Event.TargetPartition); NULL leaves it to the key.
	// "" means none; a table without it is a configuration error.
	PartitionColumn string
	// EnvelopeColumns wraps the value in a JSON envelope with these columns'
	// text (see Envelope); nil means the value is the payload itself.
	EnvelopeColumns []EnvelopeColumn
	// JSON says how keys and values are written: raw (the zero value), or
	// as Debezium's Outbox Event Router writes them through Kafka
	// Connect's JsonConverter (package connectjson), the envelope columns
	// then typed and the payload expanded if asked. Nullability, which the
	// schemas show, comes from SetNotNull.
	JSON connectjson.Options
	// SchemaVersionColumn names an integer column whose value is the
	// version of the envelope's schema (JSON with schemas and envelope
	// columns only; Debezium's table.field.event.schema.version). "" means none.
	SchemaVersionColumn string
	// RouteByEventType names the envelope schema after the event type
	// rather than the aggregate type (Debezium's route.by.field).
	RouteByEventType bool
	// CreatedAtColumn names the row's insert-time column (timestamptz or
	// timestamp), read into Event.CreatedAt for the outbox wait time. A
	// table without it, or with another type, is no error: events then
	// carry none. "" means none.
	CreatedAtColumn string
	// MessagePrefix turns the message outbox on: transactional logical
	// decoding messages with this prefix are events (message.go). Table
	// may then be empty: no outbox table. "" means off.
	MessagePrefix string
	// Names names the settings of this configuration in errors (see
	// package setting): the caller's, Within the field that holds it.
	Names setting.Namer
	// PoisonRecycled, a check for tests, makes Recycle overwrite the bytes
	// of each event it takes back before it keeps them: a stage that reads
	// an event, or bytes it kept of one, after its done reads garbage, not
	// an empty event or another row's values by chance.
	PoisonRecycled bool
}

// Kind says what a decoded Message carries.
type Kind uint8

// The kinds of Message.
const (
	// KindSkip is a message the relay ignores: a change other than an INSERT
	// or UPDATE of the outbox table (DELETE, TRUNCATE, changes of other
	// tables), a Type or Origin, or a logical decoding Message that is not
	// the message outbox's (Config.MessagePrefix).
	KindSkip Kind = iota
	// KindBegin starts a transaction: XID, CommitLSN and CommitTime are set.
	KindBegin
	// KindEvent is one INSERT into the outbox table: Event is set.
	KindEvent
	// KindCommit ends the transaction: XID, CommitLSN, EndLSN and CommitTime are set.
	// EndLSN is the position to confirm once all the transaction's events are delivered.
	KindCommit
	// KindRelation is a Relation message: the decoder updated its table metadata.
	KindRelation
	// KindUpdate is an UPDATE of an outbox row, which an insert-only outbox
	// never sees: XID, CommitLSN and CommitTime are set, and the caller
	// applies its policy (delivery.on_outbox_update). Nothing is published for it.
	KindUpdate
	// KindNonTransactional is a non-transactional logical decoding message
	// with the message outbox's prefix (Config.MessagePrefix): it escapes
	// rollbacks, so it is never published; the caller counts it.
	KindNonTransactional
)

// String returns the kind's name, e.g. "event".
func (k Kind) String() string {
	switch k {
	case KindSkip:
		return "skip"
	case KindBegin:
		return "begin"
	case KindEvent:
		return "event"
	case KindCommit:
		return "commit"
	case KindRelation:
		return "relation"
	case KindUpdate:
		return "update"
	case KindNonTransactional:
		return "non-transactional message"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Message is the decoded form of one pgoutput message.
type Message struct {
	Kind Kind
	// XID is the transaction id (Begin, Event, Commit).
	XID uint32
	// CommitLSN is, for Begin and Event, the final (commit) LSN that Begin announced;
	// for Commit, the commit LSN. The two are equal.
	CommitLSN pglogrepl.LSN
	// EndLSN is set for Commit only: TransactionEndLSN, the position to confirm.
	EndLSN pglogrepl.LSN
	// CommitTime is the commit time of the transaction (Begin, Event, Commit), in UTC.
	CommitTime time.Time
	// Event is set for KindEvent only, with XID, CommitLSN and CommitTime of the
	// current transaction and its Index among the transaction's outbox events
	// (0 for the first after Begin). It does not share memory with the decoded
	// buffer. Nothing after the decoder writes to it: what later stages learn
	// of it travels beside it (sink.Message).
	Event *outbox.Event
	// BadTrace is set for KindEvent when the tracing column held a value that
	// is not a trace context (see ParseTraceContext): the event carries no
	// trace headers and is published all the same. The caller counts and logs it.
	BadTrace error
	// Failed is set for a KindEvent of the message outbox whose content is
	// not a valid envelope: an *outbox.EventError with code CodeBadMessage,
	// a permanent failure of the event, which carries the raw content as
	// its payload; or for a row of a former partition the relay cannot
	// attribute to one outbox table, an *outbox.EventError with code
	// CodeUnattributed (Former.Failed). The caller applies the failure policy.
	Failed error
	// Former is set for a KindRelation of a former partition (FormerMember,
	// or a relation published on its own now that the decoder saw as a
	// partition or that is a Lookalike): which table its rows are
	// attributed to and why, for the caller to log.
	Former *Former
}

// reservedHeader reports whether key is a header the relay derives from the
// row itself, which a header column cannot set.
func reservedHeader(key string) bool {
	switch key {
	case outbox.HeaderContentType, outbox.HeaderTraceParent, outbox.HeaderTraceState:
		return true
	}
	return false
}

// headerCol is one configured header column.
type headerCol struct {
	column string // outbox column name
	key    string // Kafka header key
}

// outboxRel is the column mapping of the outbox table, computed from its Relation
// message so that decoding an Insert needs no lookups.
type outboxRel struct {
	ok     bool
	id     uint32
	byName bool      // an outbox table itself, not a partition
	table  TableName // the outbox table its rows belong to
	lay    *layout   // how that table is read

	ncols       int
	fields      [numFields]int // column index of each required column
	headers     []int          // column index of each Decoder.headers entry
	keep        []int          // distinct column indexes copied into an event, ascending
	tracing     int            // column index of the tracing column, -1 when absent
	tsCol       int            // column index of the timestamp column, -1 when none
	tsType      uint32         // its type OID
	partCol     int            // column index of the partition column, -1 when none
	envCols     []int          // column index of each Decoder.envelope entry
	envTypes    []uint32       // type OID of each envelope column
	verCol      int            // column index of the schema version column, -1 when none
	createdCol  int            // column index of the created-at column, -1 when none
	createdType uint32         // its type OID
	payType     uint32         // type OID of the payload column
	format      Format
	json        *connectjson.Encoder // nil: raw keys and values
	// failed is set for a former partition whose table the relay cannot
	// tell (Former.Failed): each of its inserts is an event that fails with it.
	failed error
	// until, when set, bounds failed: an insert committed at or after it is
	// another table's, skipped (Former.Until).
	until pglogrepl.LSN
}

// span locates one column value of the tuple being decoded.
type span struct {
	off, n int  // value bytes in the message
	dst    int  // offset in the event's buffer
	null   bool // SQL NULL
}

// layout is how the rows of one outbox table are read: its part of Config.
type layout struct {
	columns         [numFields]string // required column names, in field order
	headers         []headerCol       // sorted by column name, so header order is stable
	contentType     string
	tracingColumn   string
	timestampColumn string
	partitionColumn string
	envelope        []EnvelopeColumn
	envAliases      []string
	json            connectjson.Options
	versionColumn   string
	routeByType     bool
	notNull         map[string]bool
	createdColumn   string
}

// newLayout checks cfg's part that says how its table is read.
func newLayout(cfg Config, names setting.Namer) (*layout, error) {
	for i, name := range cfg.Columns.names() {
		if name == "" && i != fieldEventType {
			return nil, names.Errorf(columnFields[i], "new decoder: column name is empty: set it")
		}
	}
	if err := checkEnvelope(cfg.EnvelopeColumns); err != nil {
		return nil, names.Errorf(fieldEnvelope, "new decoder: envelope columns: %w", err)
	}
	if err := cfg.JSON.Check(); err != nil {
		return nil, names.Errorf(fieldJSON, "new decoder: %w", err)
	}
	if cfg.SchemaVersionColumn != "" && (cfg.JSON.Value != connectjson.JSONWithSchema || len(cfg.EnvelopeColumns) == 0) {
		return nil, names.Errorf(fieldVersion, "new decoder: a schema version column needs values written as JSON with schemas and envelope columns (only the envelope's schema has a version)")
	}
	if err := CheckContentType(cfg.ContentType); err != nil {
		return nil, names.Errorf(fieldContentType, "new decoder: content type %w", err)
	}
	l := &layout{columns: cfg.Columns.names(),
		contentType: cfg.ContentType, tracingColumn: cfg.TracingColumn, timestampColumn: cfg.TimestampColumn, partitionColumn: cfg.PartitionColumn,
		envelope: cfg.EnvelopeColumns, json: cfg.JSON, versionColumn: cfg.SchemaVersionColumn, routeByType: cfg.RouteByEventType,
		createdColumn: cfg.CreatedAtColumn}
	for _, c := range cfg.EnvelopeColumns {
		l.envAliases = append(l.envAliases, c.Alias)
	}
	for column, key := range cfg.HeaderColumns {
		if column == "" {
			return nil, names.Errorf(fieldHeaderColumns, "new decoder: empty column name for header %q: fix it", key)
		}
		if key == "" {
			return nil, names.Errorf(fieldHeaderColumns, "new decoder: empty header key for column %q: fix it", column)
		}
		if reservedHeader(key) {
			return nil, names.Errorf(fieldHeaderColumns, "new decoder: header %q of column %q is set by the relay itself: map the column to another header name", key, column)
		}
		l.headers = append(l.headers, headerCol{column: column, key: key})
	}
	slices.SortFunc(l.headers, func(a, b headerCol) int { return strings.Compare(a.column, b.column) })
	return l, nil
}

// Decoder decodes one pgoutput stream. It keeps relation metadata and the current
// transaction between calls, so messages must be passed in stream order. A Decoder
// is not safe for concurrent use.
type Decoder struct {
	schema, table string
	tables        []TableName // every outbox table: schema.table first, then Config.Also
	// layout is how the first table is read; layouts holds every table's
	// (the first's included), by table.
	layout
	layouts map[TableName]*layout

	known map[uint32]struct{} // every relation id announced since the last Reset
	// outs holds the layout of every relation that holds outbox rows: the
	// table itself, or each of its partitions when they are published under
	// their own names. out is the one the last insert used.
	outs   map[uint32]*outboxRel
	out    *outboxRel
	member Membership // nil: only the outbox table by name holds outbox rows
	// members remembers the outbox table of every partition seen (by
	// Membership or RememberMembers) for the decoder's life, Resets
	// included: a partition detached or dropped before the relay reads its
	// rows is attributed to the table it belonged to.
	members map[uint32]TableName
	walEnd  WALEnd // nil: a remembered partition published on its own is another table
	spans   []span // scratch, one per column of the widest outbox relation

	inTxn      bool
	xid        uint32
	commitLSN  pglogrepl.LSN
	commitTime time.Time
	index      uint32 // of the transaction's next outbox event (Event.Index)

	pool valuePool // value buffers of recycled events (Recycle)
	// events are recycled events (Recycle) for insert to fill again: at
	// 100 events per transaction their allocation was a third of the
	// relay's bytes allocated, and the collector's work follows those.
	events sync.Pool

	msgs *messageOutbox // nil: the message outbox is off

	names  setting.Namer // Config.Names
	poison bool          // Config.PoisonRecycled
}

// New returns a Decoder for cfg, or a *setting.FieldError naming the setting
// to fix if a name is empty.
func New(cfg Config) (*Decoder, error) {
	names := cfg.Names
	if cfg.Schema == "" && cfg.Table != "" {
		return nil, names.Errorf(fieldSchema, "new decoder: outbox schema is empty: set it")
	}
	if cfg.Table == "" && cfg.MessagePrefix == "" {
		return nil, names.Errorf(fieldTable, "new decoder: outbox table is empty: set it")
	}
	first, err := newLayout(cfg, names)
	if err != nil {
		return nil, err
	}
	d := &Decoder{schema: cfg.Schema, table: cfg.Table, layout: *first, layouts: map[TableName]*layout{}, names: names,
		known: make(map[uint32]struct{}), outs: make(map[uint32]*outboxRel), members: make(map[uint32]TableName), poison: cfg.PoisonRecycled}
	if cfg.Table != "" {
		t := TableName{cfg.Schema, cfg.Table}
		d.tables = append(d.tables, t)
		d.layouts[t] = &d.layout
	}
	for _, c := range cfg.Also {
		t := TableName{c.Schema, c.Table}
		if t.Schema == "" || t.Table == "" {
			return nil, names.Errorf(fieldTable, "new decoder: outbox table %q has an empty schema or name: set both", t.String())
		}
		if slices.Contains(d.tables, t) {
			return nil, names.Errorf(fieldTable, "new decoder: outbox table %s is named twice: name each once", t)
		}
		if c.MessagePrefix != "" || len(c.Also) > 0 {
			return nil, names.Errorf(fieldTable, "new decoder: outbox table %s: a further table's configuration names its own table only (no message prefix, no further tables)", t)
		}
		l, err := newLayout(c, names)
		if err != nil {
			return nil, fmt.Errorf("outbox table %s: %w", t, err)
		}
		d.tables = append(d.tables, t)
		d.layouts[t] = l
	}
	if d.msgs, err = newMessageOutbox(cfg); err != nil {
		return nil, names.Errorf(fieldJSON, "new decoder: %w", err)
	}
	return d, nil
}

// Reset forgets all relation metadata and the current transaction. Call it after
// reconnecting: Postgres announces every relation again on a new connection.
func (d *Decoder) Reset() {
	clear(d.known)
	clear(d.outs)
	d.out = nil
	d.endTxn()
}

func (d *Decoder) endTxn() {
	d.inTxn = false
	d.xid = 0
	d.commitLSN = 0
	d.commitTime = time.Time{}
	d.index = 0
}

// Decode decodes one pgoutput message (the WALData of an XLogData message).
//
// The returned Message does not reference walData, so the caller may reuse the
// buffer. Malformed or truncated input, messages of protocol versions above 1
// (streaming), an INSERT outside a transaction or into an unknown relation, and an
// outbox table lacking a configured column (see ErrMissingColumn) are errors; after
// an error the stream cannot be trusted and the caller should reconnect and Reset.
func (d *Decoder) Decode(walData []byte) (Message, error) {
	return d.DecodeContext(context.Background(), walData)
}

// DecodeContext is Decode with a context for the Membership lookup a
// Relation message of a relation other than the outbox table may need.
func (d *Decoder) DecodeContext(ctx context.Context, walData []byte) (Message, error) {
	if len(walData) == 0 {
		return Message{}, errors.New("decode pgoutput message: empty message")
	}
	typ, body := walData[0], walData[1:]
	var (
		m   Message
		err error
	)
	switch typ {
	case 'I':
		m, err = d.insert(body)
	case 'B':
		m, err = d.begin(body)
	case 'C':
		m, err = d.commit(body)
	case 'R':
		m, err = d.relation(ctx, body)
	case 'U':
		if err = skipUpdate(body); err == nil {
			m = d.update(body)
		}
	case 'D':
		err = skipDelete(body)
	case 'T':
		err = skipTruncate(body)
	case 'Y':
		err = skipType(body)
	case 'O':
		err = skipOrigin(body)
	case 'M':
		m, err = d.message(body)
	default:
		return Message{}, unsupported(typ)
	}
	if err != nil {
		return Message{}, fmt.Errorf("decode pgoutput %s message: %w", messageName(typ), err)
	}
	return m, nil
}

func messageName(typ byte) string {
	switch typ {
	case 'I':
		return "insert"
	case 'B':
		return "begin"
	case 'C':
		return "commit"
	case 'R':
		return "relation"
	case 'U':
		return "update"
	case 'D':
		return "delete"
	case 'T':
		return "truncate"
	case 'Y':
		return "type"
	case 'O':
		return "origin"
	case 'M':
		return "logical decoding"
	}
	return fmt.Sprintf("%q", typ)
}

// begin decodes Begin (beginFields) and starts the transaction.
func (d *Decoder) begin(b []byte) (Message, error) {
	m, err := beginFields(b)
	if err != nil {
		return Message{}, err
	}
	if d.inTxn {
		return Message{}, fmt.Errorf("transaction %d has no commit: the stream restarted without Reset", d.xid)
	}
	d.inTxn = true
	d.commitLSN, d.commitTime, d.xid = m.CommitLSN, m.CommitTime, m.XID
	d.index = 0
	return m, nil
}

// commit decodes Commit (commitFields) and ends the transaction.
func (d *Decoder) commit(b []byte) (Message, error) {
	m, err := commitFields(b)
	if err != nil {
		return Message{}, err
	}
	if !d.inTxn {
		return Message{}, errors.New("commit outside a transaction")
	}
	m.XID = d.xid
	d.endTxn()
	return m, nil
}

// update reports an Update message, already checked by skipUpdate, as
// KindUpdate when it changed the outbox table, KindSkip otherwise.
func (d *Decoder) update(b []byte) Message {
	out, ok := d.outs[be32(b)]
	if !d.inTxn || !ok || (out.until != 0 && d.commitLSN >= out.until) {
		return Message{Kind: KindSkip}
	}
	return Message{Kind: KindUpdate, XID: d.xid, CommitLSN: d.commitLSN, CommitTime: d.commitTime}
}

// relation decodes Relation: Int32 id, String namespace, String name, Int8 replica
// identity, Int16 column count, then per column Int8 flags, String name, Int32 type
// oid, Int32 type modifier.
func (d *Decoder) relation(ctx context.Context, b []byte) (Message, error) {
	r := reader{b: b}
	id := r.uint32()
	namespace := r.cstring()
	name := r.cstring()
	r.skip(1) // replica identity
	ncols := int(r.uint16())
	if r.err != nil {
		return Message{}, r.err
	}
	// Any failure below leaves the relation unknown, so its inserts fail loudly
	// rather than being skipped.
	delete(d.known, id)
	delete(d.outs, id)
	if d.out != nil && d.out.id == id {
		d.out = nil
	}
	var owner TableName
	isOutbox := false
	for _, t := range d.tables {
		if string(namespace) == t.Schema && string(name) == t.Table {
			owner, isOutbox = t, true
			break
		}
	}
	byName := isOutbox
	var (
		former *Former
		L      *layout
	)
	if !isOutbox && d.member != nil {
		rel := Relation{ID: id, Namespace: string(namespace), Name: string(name)}
		m, parent, err := d.member(ctx, rel)
		if err != nil {
			return Message{}, fmt.Errorf("relation %q.%q: %w", namespace, name, err)
		}
		switch m {
		case IsMember:
			isOutbox, owner = true, parent
			if slices.Contains(d.tables, parent) {
				d.members[id] = parent
			} else if len(d.tables) > 0 {
				owner = d.tables[0] // Membership names only the decoder's tables
			}
		case FormerMember:
			if former, L, err = d.former(rel, parent, b); err != nil {
				return Message{}, err
			}
			isOutbox, owner = L != nil, former.Table
		case NotMember, Lookalike:
			if former, L, err = d.listed(ctx, rel, b, m == Lookalike, parent); err != nil {
				return Message{}, err
			}
			// owner stays unset: a row that may be no outbox row has no
			// table (no per-table failure policy, no source table).
			isOutbox = L != nil
		}
	}
	if L == nil {
		if L = d.layouts[owner]; L == nil {
			L = &d.layout
		}
	}
	relSchema, relTable := string(namespace), string(name)

	rel := outboxRel{ok: true, id: id, byName: byName, table: owner, lay: L, ncols: ncols, tracing: -1, tsCol: -1, partCol: -1, verCol: -1, createdCol: -1}
	if former != nil {
		rel.failed, rel.until = former.Failed, former.Until
	}
	var types [numFields]uint32
	var typmods [numFields]int32
	var verType uint32
	var verTypmod int32
	var envTypmods []int32
	var partType uint32
	if isOutbox {
		for i := range rel.fields {
			rel.fields[i] = -1
		}
		rel.envCols = make([]int, len(L.envelope))
		rel.envTypes = make([]uint32, len(L.envelope))
		envTypmods = make([]int32, len(L.envelope))
		for i := range rel.envCols {
			rel.envCols[i] = -1
		}
		rel.headers = make([]int, len(L.headers))
		for i := range rel.headers {
			rel.headers[i] = -1
		}
	}
	for col := range ncols {
		r.skip(1) // flags
		colName := r.cstring()
		typ := r.uint32()
		typmod := int32(r.uint32())
		if r.err != nil {
			return Message{}, fmt.Errorf("column %d of %d: %w", col, ncols, r.err)
		}
		if !isOutbox {
			continue
		}
		for f, want := range L.columns {
			if string(colName) == want {
				rel.fields[f] = col
				types[f], typmods[f] = typ, typmod
			}
		}
		if L.tracingColumn != "" && string(colName) == L.tracingColumn {
			rel.tracing = col
		}
		if L.timestampColumn != "" && string(colName) == L.timestampColumn {
			rel.tsCol, rel.tsType = col, typ
		}
		for i, ec := range L.envelope {
			if string(colName) == ec.Column {
				rel.envCols[i], rel.envTypes[i], envTypmods[i] = col, typ, typmod
			}
		}
		if L.createdColumn != "" && string(colName) == L.createdColumn && (typ == TypeTimestampTZ || typ == TypeTimestamp) {
			rel.createdCol, rel.createdType = col, typ
		}
		if L.versionColumn != "" && string(colName) == L.versionColumn {
			rel.verCol, verType, verTypmod = col, typ, typmod
		}
		if L.partitionColumn != "" && string(colName) == L.partitionColumn {
			rel.partCol, partType = col, typ
		}
		for h, hc := range L.headers {
			if string(colName) == hc.column {
				rel.headers[h] = col
			}
		}
	}
	if err := r.end(); err != nil {
		return Message{}, err
	}
	if isOutbox {
		for f, col := range rel.fields {
			if col < 0 && L.columns[f] == "" { // the optional event type column, not configured
				continue
			}
			if col < 0 {
				return Message{}, d.missingColumn(columnFields[f], relSchema, relTable, L.columns[f])
			}
			rel.keep = append(rel.keep, col)
		}
		for h, col := range rel.headers {
			if col < 0 {
				return Message{}, d.missingColumn(fieldHeaderColumns, relSchema, relTable, L.headers[h].column)
			}
			rel.keep = append(rel.keep, col)
		}
		if rel.tracing >= 0 {
			rel.keep = append(rel.keep, rel.tracing)
		}
		if L.timestampColumn != "" {
			if rel.tsCol < 0 {
				return Message{}, d.missingColumn(fieldTimestamp, relSchema, relTable, L.timestampColumn)
			}
			if err := CheckTimestampType(rel.tsType); err != nil {
				return Message{}, d.names.Errorf(fieldTimestamp, "table %q.%q: timestamp column %q %w", relSchema, relTable, L.timestampColumn, err)
			}
			rel.keep = append(rel.keep, rel.tsCol)
		}
		if L.partitionColumn != "" {
			if rel.partCol < 0 {
				return Message{}, d.missingColumn(fieldPartition, relSchema, relTable, L.partitionColumn)
			}
			if err := CheckPartitionType(partType); err != nil {
				return Message{}, d.names.Errorf(fieldPartition, "table %q.%q: partition column %q %w", relSchema, relTable, L.partitionColumn, err)
			}
			rel.keep = append(rel.keep, rel.partCol)
		}
		for i, col := range rel.envCols {
			if col < 0 {
				return Message{}, d.missingColumn(fieldEnvelope, relSchema, relTable, L.envelope[i].Column)
			}
			rel.keep = append(rel.keep, col)
		}
		if rel.createdCol >= 0 {
			rel.keep = append(rel.keep, rel.createdCol)
		}
		if L.versionColumn != "" {
			if rel.verCol < 0 {
				return Message{}, d.missingColumn(fieldVersion, relSchema, relTable, L.versionColumn)
			}
			rel.keep = append(rel.keep, rel.verCol)
		}
		if L.json.Key != connectjson.Raw || L.json.Value != connectjson.Raw {
			col := func(name string, typ uint32, typmod int32) connectjson.Column {
				return connectjson.Column{Name: name, Type: typ, Typmod: typmod, NotNull: L.notNull[name]}
			}
			l := connectjson.Layout{
				Key:          col(L.columns[fieldAggregateID], types[fieldAggregateID], typmods[fieldAggregateID]),
				Payload:      col(L.columns[fieldPayload], types[fieldPayload], typmods[fieldPayload]),
				PayloadField: L.columns[fieldPayload],
			}
			for i, ec := range L.envelope {
				l.Envelope = append(l.Envelope, connectjson.EnvelopeField{Alias: ec.Alias, Column: col(ec.Column, rel.envTypes[i], envTypmods[i])})
			}
			if rel.verCol >= 0 {
				v := col(L.versionColumn, verType, verTypmod)
				l.Version = &v
			}
			enc, err := connectjson.New(L.json, l)
			if err != nil {
				return Message{}, d.names.Errorf(fieldJSON, "table %q.%q: %w", relSchema, relTable, err)
			}
			rel.json = enc
		}
		rel.payType = types[fieldPayload]
		rel.format = NewFormat(L.contentType, types[fieldPayload], types[fieldAggregateID], rel.tracing >= 0)
		// keep lists each column once; a column that is both the payload or key
		// and another field shows up as fewer keep entries than fields.
		rel.format.shared = len(slices.Compact(slices.Sorted(slices.Values(rel.keep)))) < len(rel.keep)
		slices.Sort(rel.keep)
		rel.keep = slices.Compact(rel.keep)
		if byName {
			// An outbox table under a new id (dropped and recreated): the
			// old id is another table now.
			for old, o := range d.outs {
				if o.byName && o.table == owner {
					delete(d.outs, old)
				}
			}
			if d.out != nil && d.out.byName && d.out.table == owner {
				d.out = nil
			}
		}
		d.outs[id] = &rel
		if cap(d.spans) < ncols {
			d.spans = make([]span, ncols)
		}
	}
	d.known[id] = struct{}{}
	return Message{Kind: KindRelation, Former: former}, nil
}

// CodeUnattributed is the error code (outbox.EventError) of a row of a
// former partition the relay cannot attribute to one outbox table.
const CodeUnattributed = "unattributed_partition"

// Former says how the rows of a former partition are read: a FormerMember,
// or a relation Membership now calls another table published on its own
// (OnItsOwn): seen as a partition before, or a Lookalike (Until set), or
// one with the columns reading an outbox table needs (skipped).
type Former struct {
	Rel Relation
	// Table is the outbox table its rows are attributed to; zero when none.
	Table TableName
	// By is how the table was found: "catalog" (Membership named it),
	// "remembered" (seen as its partition before), "columns" (the only
	// table whose columns it has), or "" when none was (with Until: a
	// Lookalike, its rows attributed to the table it has the columns of
	// only to fail).
	By string
	// Failed is set when its columns fit several tables and the relay never
	// saw which it belonged to, or with Until: each of its inserts (before
	// Until) is an event that fails with it (code CodeUnattributed), which
	// the failure policy dead-letters.
	Failed error
	// Fits lists the outbox tables whose columns it has.
	Fits []TableName
	// OnItsOwn: Membership calls it another table published on its own
	// (NotMember or Lookalike). Without Until, it has the columns reading a
	// table of Fits needs but neither was seen as a partition nor has
	// exactly a table's columns: its inserts are skipped as another
	// table's, which the caller says.
	OnItsOwn bool
	// Until is set for a relation Membership now calls another table
	// published on its own that the decoder saw as a partition of Table
	// (detached since), or that has exactly Table's columns (Lookalike): its
	// inserts committed before Until, the server's WAL position when the
	// catalog was read, may have been written while it was a partition and
	// fail with Failed; those committed later are another table's, skipped.
	Until pglogrepl.LSN
}

// WALEnd returns the server's WAL position now (replication.CurrentWAL).
type WALEnd func(ctx context.Context) (pglogrepl.LSN, error)

// SetWALEnd sets how the decoder reads the server's WAL position, which it
// needs for a partition it saw that was since detached and is published
// on its own (Former.Until); nil: such a relation is another table.
func (d *Decoder) SetWALEnd(f WALEnd) { d.walEnd = f }

// listed judges a relation Membership calls another table published on its
// own (NotMember, or Lookalike of table like). It may be a partition
// detached since, so the stream may hold rows it got before the detach
// (outbox rows) and after (not): when the decoder saw it as a partition of
// an outbox table, or when the catalog says it has exactly the columns of
// one (Lookalike: the relay may have seen it as a partition in an earlier
// run only, its memory being per run) and it still has that table's
// columns. Which row is which the catalog no longer says: the rows
// committed before the WAL position read now fail as unattributed, later
// ones are skipped. It returns nil and a nil layout for another table.
//
// Why not a durable memory of partitions (kept beside the checkpoint): it
// would narrow the dead letters to the rows written before the detach, but
// only for partitions the relay saw attached, so a partition attached and
// detached while the relay was stopped would still need this floor; and it
// would add a table (with its migration and grants) and a file format to
// the checkpoint stores. Lookalike is the floor that cannot lose a row
// silently: its cost, the rows of a genuinely separate table with an
// outbox table's exact columns in the publication, is dead letters that
// name why, and the warning says to drop the table from the publication.
func (d *Decoder) listed(ctx context.Context, rel Relation, b []byte, lookalike bool, like TableName) (*Former, *layout, error) {
	if d.walEnd == nil {
		return nil, nil, nil
	}
	t, seen := d.members[rel.ID]
	f := &Former{Rel: rel, OnItsOwn: true, Fits: []TableName{t}}
	if !seen {
		f.Fits = nil
		for _, u := range d.tables {
			ok, err := d.fits(d.layouts[u], b)
			if err != nil {
				return nil, nil, err
			}
			if ok {
				f.Fits = append(f.Fits, u)
			}
		}
		if !lookalike || !slices.Contains(d.tables, like) {
			if len(f.Fits) == 0 {
				return nil, nil, nil
			}
			// Columns that differ from every outbox table's now prove
			// nothing about the past (either table may have changed since
			// a detach), but the relay must take it for another table; it
			// says so, with the tables it could have belonged to.
			return f, nil, nil
		}
		t = like
	}
	// The columns the Relation message announces are the relation's when
	// the change was written; without the table's columns then, it was not
	// its partition then.
	L := &layout{columns: d.layouts[t].columns}
	if ok, err := d.fits(L, b); err != nil || !ok {
		return nil, nil, err
	}
	f.Table = t
	if seen {
		f.By = "remembered"
	}
	until, err := d.walEnd(ctx)
	if err != nil {
		if seen {
			return nil, nil, fmt.Errorf("relation %s.%s, a partition of %s detached since: %w", rel.Namespace, rel.Name, t, err)
		}
		return nil, nil, fmt.Errorf("relation %s.%s, with the columns of %s: %w", rel.Namespace, rel.Name, t, err)
	}
	f.Until = until
	if seen {
		f.Failed = &outbox.EventError{Code: CodeUnattributed, Err: fmt.Errorf(
			"relation %s.%s (oid %d) was a partition of %s and is detached now, published on its own: the relay cannot tell whether this row, committed before %s, was written before the detach (an outbox row) or after (not one): "+
				"replay the dead letter if it is an outbox row, purge it if not", rel.Namespace, rel.Name, rel.ID, t, until)}
		return f, L, nil
	}
	f.Failed = &outbox.EventError{Code: CodeUnattributed, Err: fmt.Errorf(
		"relation %s.%s (oid %d) is published on its own and has exactly the columns of %s without being its partition now, and the relay never saw it as one: "+
			"it may be a partition detached while the relay was stopped or behind, so the relay cannot tell whether this row, committed before %s, was written while it was a partition (an outbox row) or not: "+
			"replay the dead letter if it is an outbox row, purge it if not; if %s.%s is not an outbox partition, remove it from the publication (ALTER PUBLICATION ... DROP TABLE %s.%s)",
		rel.Namespace, rel.Name, rel.ID, t, until, rel.Namespace, rel.Name, rel.Namespace, rel.Name)}
	return f, L, nil
}

// former finds the outbox table whose rows relation rel, a FormerMember,
// holds: the one Membership named, else the one the decoder saw it in,
// else the only table whose required columns its Relation message body b
// has. It returns the layout to read its rows with, nil when it has no
// table's columns: then it is another table (removed from the publication
// since), whose rows are skipped.
func (d *Decoder) former(rel Relation, parent TableName, b []byte) (*Former, *layout, error) {
	f := &Former{Rel: rel}
	for _, t := range d.tables {
		ok, err := d.fits(d.layouts[t], b)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			f.Fits = append(f.Fits, t)
		}
	}
	switch t, seen := d.members[rel.ID]; {
	case slices.Contains(d.tables, parent):
		f.Table, f.By = parent, "catalog"
	case seen:
		f.Table, f.By = t, "remembered"
	case len(f.Fits) == 1:
		f.Table, f.By = f.Fits[0], "columns"
	case len(f.Fits) > 1:
		names := make([]string, len(f.Fits))
		for i, t := range f.Fits {
			names[i] = t.String()
		}
		f.Failed = &outbox.EventError{Code: CodeUnattributed, Err: fmt.Errorf(
			"relation %s.%s (oid %d) is no longer a partition of an outbox table, the relay never saw which one it belonged to, and its columns fit several (%s): "+
				"replay the dead letter to the right table's topic", rel.Namespace, rel.Name, rel.ID, strings.Join(names, ", "))}
		// Read with the required columns only (all of them there), for
		// the dead letter: no other column of a layout may be missing.
		return f, &layout{columns: d.layouts[f.Fits[0]].columns}, nil
	default:
		return f, nil, nil
	}
	return f, d.layouts[f.Table], nil
}

// RememberMembers records, for each relation id, the outbox table it is a
// partition of (as the catalog says now), so that its rows are attributed
// to that table even when it is detached or dropped before the relay reads
// them. Ids of tables the decoder does not read are ignored.
func (d *Decoder) RememberMembers(members map[uint32]TableName) {
	for id, t := range members {
		if slices.Contains(d.tables, t) {
			d.members[id] = t
		}
	}
}

// fits reports whether the Relation message body b has every column that
// reading a row with L requires (the event type column only when L names
// one; header, envelope, timestamp, partition and version columns when set).
func (d *Decoder) fits(L *layout, b []byte) (bool, error) {
	r := reader{b: b}
	r.uint32()
	r.cstring()
	r.cstring()
	r.skip(1)
	ncols := int(r.uint16())
	has := make(map[string]bool, ncols)
	for range ncols {
		r.skip(1)
		has[string(r.cstring())] = true
		r.skip(8)
	}
	if r.err != nil {
		return false, r.err
	}
	for _, name := range L.required() {
		if !has[name] {
			return false, nil
		}
	}
	return true, nil
}

// required lists the columns a relation needs to be read with L.
func (L *layout) required() []string {
	var names []string
	for _, c := range L.columns {
		if c != "" { // the optional event type column, not configured
			names = append(names, c)
		}
	}
	for _, h := range L.headers {
		names = append(names, h.column)
	}
	for _, e := range L.envelope {
		names = append(names, e.Column)
	}
	for _, c := range []string{L.timestampColumn, L.partitionColumn, L.versionColumn} {
		if c != "" {
			names = append(names, c)
		}
	}
	return names
}

// TableName names a table as Postgres announces it: unquoted identifiers
// are lower case there.
type TableName struct{ Schema, Table string }

// String is schema.table, unquoted.
func (t TableName) String() string { return t.Schema + "." + t.Table }

// Relation is a relation a Relation message announces.
type Relation struct {
	ID              uint32 // the relation's OID
	Namespace, Name string
}

// Member says whether a relation holds rows of the outbox table.
type Member uint8

// The answers of a Membership.
const (
	// NotMember: another table; its changes are skipped. A relation the
	// decoder saw as a partition is one detached since and published on
	// its own (see Former.Until), as a Lookalike is.
	NotMember Member = iota
	// IsMember: a partition of the outbox table, published under its own
	// name; its inserts are outbox events.
	IsMember
	// FormerMember: a relation that is no longer (or no longer known as) a
	// partition of the outbox table but was one when its changes in the
	// stream were written (detached or dropped since, and not published on
	// its own). Its inserts are outbox events of the table it belonged to
	// (see Former); without any table's columns it is another table, skipped.
	FormerMember
	// Lookalike: another table published on its own, as NotMember, that has
	// exactly the columns of an outbox table (the TableName answered)
	// without being its partition now: possibly a partition detached while
	// the relay was stopped, or before a restart let it read the partition's
	// rows, which the relay then never saw as one. Its inserts committed
	// before the WAL position read when the stream announces it fail as
	// unattributed, later ones are skipped (Former.Until).
	Lookalike
)

// Membership answers, for a relation a Relation message announces under a
// name other than an outbox table's, whether it holds outbox rows, and for
// a partition (IsMember) which outbox table it belongs to; a FormerMember's
// table may be unknown (zero): the decoder then finds it (Former). It is
// called once per Relation message (on connect and after the
// relation changed), never per insert, so it may read the catalog.
type Membership func(ctx context.Context, rel Relation) (Member, TableName, error)

// SetMembership sets how relations other than the outbox table by name are
// judged (nil: never outbox rows). It applies from the next Relation
// message. A partitioned outbox table published through its root
// (publish_via_partition_root) needs none: Postgres announces its changes as
// the root's.
func (d *Decoder) SetMembership(m Membership) { d.member = m }

// inlineHeaders is how many headers an event can carry without a third allocation.
const inlineHeaders = 4

// eventWithHeaders lets an event and its headers share one allocation.
type eventWithHeaders struct {
	ev  outbox.Event
	hdr [inlineHeaders]outbox.Header
}

// insert decodes Insert: Int32 relation id, Byte1 'N', TupleData. This is the hot
// path: apart from the Event (and its headers) it makes one allocation, the buffer
// that all kept column values share.
func (d *Decoder) insert(b []byte) (Message, error) {
	if len(b) < 7 {
		return Message{}, lengthError(7, len(b))
	}
	if !d.inTxn {
		return Message{}, errors.New("insert outside a transaction")
	}
	id := be32(b)
	out := d.out
	if out == nil || id != out.id {
		if out = d.outs[id]; out == nil {
			if _, ok := d.known[id]; !ok {
				return Message{}, fmt.Errorf("insert into unknown relation %d: no relation message since the start or the last Reset", id)
			}
			d.index++ // see Event.Index: a skipped insert keeps its place
			return Message{Kind: KindSkip}, nil
		}
		d.out = out
	}
	if out.until != 0 && d.commitLSN >= out.until {
		d.index++                           // see Event.Index: a skipped insert keeps its place
		return Message{Kind: KindSkip}, nil // written after the detach: another table's row
	}
	if b[4] != 'N' {
		return Message{}, fmt.Errorf("tuple type %q, want 'N'", b[4])
	}
	if n := int(be16(b[5:])); n != out.ncols {
		return Message{}, fmt.Errorf("tuple has %d columns, relation %d announced %d", n, id, out.ncols)
	}

	// First pass: validate the tuple and locate every value.
	spans := d.spans[:out.ncols]
	p := 7
	for i := range spans {
		if p >= len(b) {
			return Message{}, fmt.Errorf("tuple truncated at column %d of %d", i, len(spans))
		}
		kind := b[p]
		p++
		switch kind {
		case 'n':
			spans[i] = span{null: true}
		case 't', 'b':
			if len(b)-p < 4 {
				return Message{}, fmt.Errorf("tuple truncated in length of column %d", i)
			}
			n := be32(b[p:])
			p += 4
			if uint64(n) > uint64(len(b)-p) {
				return Message{}, fmt.Errorf("tuple truncated in column %d: length %d, %d bytes left", i, n, len(b)-p)
			}
			spans[i] = span{off: p, n: int(n)}
			p += int(n)
		case 'u':
			return Message{}, fmt.Errorf("column %d is an unchanged TOAST value, impossible in an insert", i)
		default:
			return Message{}, fmt.Errorf("column %d has unknown value kind %q", i, kind)
		}
	}
	if p != len(b) {
		return Message{}, fmt.Errorf("%d trailing bytes after tuple", len(b)-p)
	}

	// Second pass: copy the kept values into one buffer.
	buf := keptValues(&d.pool, b, spans, out.keep)

	nh := len(out.lay.headers) + out.format.extraHeaders()
	ev, hdr, reused := d.reuseEvent(nh)
	switch {
	case reused:
	case nh == 0:
		ev = new(outbox.Event)
	case nh <= inlineHeaders:
		eh := new(eventWithHeaders)
		ev, hdr = &eh.ev, eh.hdr[:0:nh]
	default:
		ev = new(outbox.Event)
		hdr = make([]outbox.Header, 0, nh)
	}
	f := &out.fields
	ev.Values = buf
	ev.Schema, ev.Table = out.table.Schema, out.table.Table
	ev.ID = value(buf, spans[f[fieldID]])
	ev.AggregateType = value(buf, spans[f[fieldAggregateType]])
	ev.AggregateID = value(buf, spans[f[fieldAggregateID]])
	if c := f[fieldEventType]; c >= 0 {
		ev.EventType = value(buf, spans[c])
	}
	ev.Payload = value(buf, spans[f[fieldPayload]])
	for h, col := range out.headers {
		if s := spans[col]; !s.null {
			hdr = append(hdr, outbox.Header{Key: out.lay.headers[h].key, Value: value(buf, s)})
		}
	}
	ev.Headers = hdr
	if out.failed != nil {
		// A row the relay cannot attribute to a table: what could be read
		// names its dead letter; nothing else of its table's layout applies.
		if !utf8.Valid(ev.Payload) {
			ev.PayloadType = outbox.PayloadBinary
		}
		if len(ev.Headers) == 0 {
			ev.Headers = nil
		}
		ev.XID, ev.CommitLSN, ev.CommitTime, ev.Index = d.xid, d.commitLSN, d.commitTime, d.index
		d.index++
		return Message{Kind: KindEvent, XID: d.xid, CommitLSN: d.commitLSN, CommitTime: d.commitTime, Event: ev, Failed: out.failed}, nil
	}
	var trace []byte
	if out.tracing >= 0 {
		trace = value(buf, spans[out.tracing])
	}
	badTrace, err := out.format.Apply(ev, trace)
	if err != nil {
		return Message{}, err
	}
	if out.tsCol >= 0 {
		if s := spans[out.tsCol]; !s.null {
			if ev.Timestamp, err = ParseTimestamp(out.tsType, value(buf, s)); err != nil {
				return Message{}, err
			}
		}
	}
	switch {
	case out.json != nil:
		vals := make([][]byte, len(out.envCols))
		for i, col := range out.envCols {
			vals[i] = value(buf, spans[col])
			if out.envTypes[i] == TypeBytea && vals[i] != nil {
				if vals[i], err = DecodeBytea(bytes.Clone(vals[i])); err != nil {
					return Message{}, fmt.Errorf("envelope column %q: %w", out.lay.envelope[i].Column, err)
				}
			}
		}
		var version []byte
		if out.verCol >= 0 {
			version = value(buf, spans[out.verCol])
		}
		routedBy := ev.AggregateType
		if out.lay.routeByType {
			routedBy = ev.EventType
		}
		if ev.Payload, err = out.json.Value(ev.Payload, vals, routedBy, version); err != nil {
			return Message{}, err
		}
		if ev.AggregateID, err = out.json.Key(ev.AggregateID); err != nil {
			return Message{}, fmt.Errorf("key: %w", err)
		}
	case len(out.envCols) > 0:
		vals := make([][]byte, len(out.envCols))
		for i, col := range out.envCols {
			vals[i] = value(buf, spans[col])
		}
		ev.Payload = Envelope(ev.Payload, out.payType, out.lay.envAliases, vals)
		ev.PayloadType = outbox.PayloadJSON
	}
	if out.createdCol >= 0 {
		if s := spans[out.createdCol]; !s.null {
			// A value the relay cannot read only loses the wait-time measure.
			ev.CreatedAt, _ = ParseTimestamp(out.createdType, value(buf, s))
		}
	}
	if out.partCol >= 0 {
		if s := spans[out.partCol]; !s.null {
			if ev.TargetPartition, err = ParsePartition(value(buf, s)); err != nil {
				return Message{}, err
			}
			ev.HasTargetPartition = true
		}
	}
	if len(ev.Headers) == 0 {
		ev.Headers = nil
	}
	ev.XID = d.xid
	ev.CommitLSN = d.commitLSN
	ev.CommitTime = d.commitTime
	ev.Index = d.index
	d.index++
	return Message{Kind: KindEvent, XID: d.xid, CommitLSN: d.commitLSN, CommitTime: d.commitTime, Event: ev, BadTrace: badTrace}, nil
}

// SetNotNull tells the decoder which outbox columns are NOT NULL
// (pg_attribute.attnotnull, which pgoutput does not send), for the
// "optional" of the JSON schemas (Config.JSON). It applies from the next
// Relation message; a column it does not name is nullable, as a column
// added later is by default.
func (d *Decoder) SetNotNull(columns map[string]bool) {
	d.SetTableNotNull(TableName{d.schema, d.table}, columns)
}

// SetTableNotNull is SetNotNull for the outbox table t (one of Config.Also's
// or the first); it does nothing for a table the decoder does not read.
func (d *Decoder) SetTableNotNull(t TableName, columns map[string]bool) {
	if l := d.layouts[t]; l != nil {
		l.notNull = columns
	}
}

// maxKeptGap is how many bytes that are not kept values (column headers, and
// columns not kept) keptValues copies along with them to copy them in one go.
const maxKeptGap = 256

// keptValues copies the values of the kept columns of message b into one
// buffer, a recycled one from pool when one fits, and sets their spans' dst.
// When the values lie close together in b, as in an outbox row, it copies the
// stretch that holds them all, gaps included: a fresh clone is not zeroed
// before the copy, which at 1 MiB payloads cost 6% of the relay's CPU.
// Otherwise (a large column not kept lies between them) it copies them one by
// one, so the event does not keep that column alive. The buffer is never nil,
// as empty values need.
func keptValues(pool *valuePool, b []byte, spans []span, keep []int) []byte {
	lo, hi, total := len(b), 0, 0
	for _, col := range keep {
		if s := spans[col]; s.n > 0 {
			total += s.n
			lo, hi = min(lo, s.off), max(hi, s.off+s.n)
		}
	}
	if total > 0 && hi-lo-total <= maxKeptGap {
		buf := pool.get(hi - lo)
		if buf != nil {
			copy(buf, b[lo:hi])
		} else {
			buf = append([]byte(nil), b[lo:hi]...)
		}
		for _, col := range keep {
			if s := &spans[col]; s.n > 0 {
				s.dst = s.off - lo
			} else {
				s.dst = 0 // empty or NULL: any place in buf will do
			}
		}
		return buf
	}
	buf := pool.get(total)
	if buf == nil {
		// make with length 0 does not allocate but still returns a non-nil slice.
		buf = make([]byte, total)
	}
	o := 0
	for _, col := range keep {
		s := &spans[col]
		s.dst = o
		o += copy(buf[o:], b[s.off:s.off+s.n])
	}
	return buf
}

// value returns the column's bytes in buf, nil for NULL. The capacity is clipped so
// that an append by a consumer cannot overwrite the next value.
func value(buf []byte, s span) []byte {
	if s.null {
		return nil
	}
	return buf[s.dst : s.dst+s.n : s.dst+s.n]
}
