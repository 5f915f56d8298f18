package relay_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

const (
	testTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	testTraceState  = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
	testSchemaID    = 4242
)

// confluentProtobuf returns msg in Confluent's schema-registry wire format for
// Protobuf: magic byte 0, the schema id (big-endian int32), the message-index
// list (a single 0: the schema's first message), then the encoded message.
func confluentProtobuf(t *testing.T, schemaID uint32, msg proto.Message) []byte {
	t.Helper()
	body, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	out := binary.BigEndian.AppendUint32([]byte{0}, schemaID)
	return append(append(out, 0), body...)
}

// decodeConfluentProtobuf is the consumer side of confluentProtobuf.
func decodeConfluentProtobuf(b []byte) (uint32, *structpb.Struct, error) {
	if len(b) < 6 || b[0] != 0 || b[5] != 0 {
		return 0, nil, fmt.Errorf("not Confluent Protobuf wire format: % x", b[:min(len(b), 6)])
	}
	s := new(structpb.Struct)
	if err := proto.Unmarshal(b[6:], s); err != nil {
		return 0, nil, fmt.Errorf("unmarshal payload: %w", err)
	}
	return binary.BigEndian.Uint32(b[1:5]), s, nil
}

// TestBinaryPayloadAndTraceHeaders streams an outbox table with a bytea payload
// (Protobuf in Confluent's wire format, with bytes text encoding would mangle:
// NUL, invalid UTF-8) and a tracingspancontext column, with the walsender's
// bytea_output set to hex and to escape: each message carries the payload's
// exact bytes, the configured content-type, and the trace headers of valid
// trace contexts; a malformed one is counted and its event still delivered.
func TestBinaryPayloadAndTraceHeaders(t *testing.T) {
	for _, output := range []string{"hex", "escape"} {
		t.Run(output, func(t *testing.T) {
			e := newEnv(t)
			e.exec(`ALTER TABLE outbox_events ALTER COLUMN payload TYPE bytea USING convert_to(payload::text, 'UTF8'),
				ADD COLUMN tracingspancontext text`)
			u, err := url.Parse(e.url)
			if err != nil {
				t.Fatal(err)
			}
			q := u.Query()
			q.Set("options", "-c bytea_output="+output)
			u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // libpq reads + literally
			e.setRelayURL(u.String())
			e.cfgHook = func(c *relay.Config) {
				c.Decoder.ContentType = "application/x-protobuf"
				c.Decoder.TracingColumn = decoder.DefaultTracingColumn
			}
			e.start()

			type row struct {
				aggID   string
				msg     *structpb.Struct
				tracing any // nil: NULL
				headers map[string]string
			}
			mustStruct := func(m map[string]any) *structpb.Struct {
				s, err := structpb.NewStruct(m)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			rows := []row{
				{"a-1", mustStruct(map[string]any{"order": "o-1", "total": 12.5, "note": "\x00 nul é"}), testTraceParent,
					map[string]string{"traceparent": testTraceParent}},
				{"a-2", mustStruct(map[string]any{"order": "o-2", "items": []any{"x", "y"}}),
					"#Mon Jun 03 10:00:00 UTC 2024\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61rcWkgMzE\ntraceparent=" + testTraceParent + "\n",
					map[string]string{"traceparent": testTraceParent, "tracestate": testTraceState}},
				{"a-3", mustStruct(map[string]any{"order": "o-3"}), "not a trace context", nil},
				{"a-4", mustStruct(map[string]any{}), nil, nil},
			}
			want := map[string][]byte{}
			e.tx(func(tx pgx.Tx) error {
				for _, r := range rows {
					payload := confluentProtobuf(t, testSchemaID, r.msg)
					want[r.aggID] = payload
					if _, err := tx.Exec(context.Background(), `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, tracingspancontext)
						VALUES ('order', $1, 'OrderPlaced', $2, $3)`, r.aggID, payload, r.tracing); err != nil {
						return err
					}
				}
				return nil
			})

			recs := e.waitRecords(len(rows))
			byKey := map[string]sandbox.Record{}
			for _, r := range recs {
				byKey[string(r.Key)] = r
			}
			for _, r := range rows {
				rec, ok := byKey[r.aggID]
				if !ok {
					t.Fatalf("no record for aggregate %s in %d records", r.aggID, len(recs))
				}
				if !bytes.Equal(rec.Value, want[r.aggID]) {
					t.Errorf("%s: value % x, want the inserted bytes % x", r.aggID, rec.Value, want[r.aggID])
				}
				id, msg, err := decodeConfluentProtobuf(rec.Value)
				if err != nil || id != testSchemaID || !proto.Equal(msg, r.msg) {
					t.Errorf("%s: consumer decoded schema %d, %v, %v; want schema %d, %v", r.aggID, id, msg, err, testSchemaID, r.msg)
				}
				if got := rec.Headers["content-type"]; got != "application/x-protobuf" {
					t.Errorf("%s: content-type %q, want application/x-protobuf", r.aggID, got)
				}
				for _, k := range []string{"traceparent", "tracestate"} {
					got, has := rec.Headers[k]
					wantV, wantHas := r.headers[k]
					if got != wantV || has != wantHas {
						t.Errorf("%s: header %s = %q (present %v), want %q (present %v)", r.aggID, k, got, has, wantV, wantHas)
					}
				}
			}
			testenv.Eventually(t, 10*time.Second, func() error {
				if n := testutil.ToFloat64(e.m.TraceContextInvalid); n != 1 {
					return fmt.Errorf("trace_context_invalid_total = %v, want 1", n)
				}
				return nil
			})
		})
	}
}

// TestContentTypeAuto: with --content-type auto, the default jsonb payload
// goes out as before, plus content-type application/json; an outbox table
// without the tracing column is fine.
func TestContentTypeAuto(t *testing.T) {
	e := newEnv(t)
	e.cfgHook = func(c *relay.Config) {
		c.Decoder.ContentType = decoder.ContentTypeAuto
		c.Decoder.TracingColumn = decoder.DefaultTracingColumn
	}
	e.start()
	e.tx(func(tx pgx.Tx) error {
		_, err := insert(tx, "order", "42", "OrderPlaced", `{"total": 10}`)
		return err
	})
	rec := e.waitRecords(1)[0]
	if string(rec.Value) != `{"total": 10}` || rec.Headers["content-type"] != "application/json" {
		t.Fatalf("record value %s, headers %v; want the jsonb text and content-type application/json", rec.Value, rec.Headers)
	}
	if _, ok := rec.Headers["traceparent"]; ok {
		t.Fatalf("headers %v: traceparent without a tracing column", rec.Headers)
	}
}
