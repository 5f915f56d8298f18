package main

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/testenv/cetest"
)

// TestCloudEventsFormat runs the built relay with --format cloudevents and
// checks what a consumer reads against the CloudEvents Kafka protocol
// binding, binary content mode: the required attributes as ce_ headers
// (specversion 1.0, a non-empty id, a URI-reference source, a non-empty
// type), time in RFC 3339, content-type for the data, and the value the data
// itself, unchanged; the CloudEvents Go SDK reads and validates the event.
func TestCloudEventsFormat(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	r := newRelay(t, f.relayArgs("--format", "cloudevents"))
	r.Start()
	r.WaitReady(30 * time.Second)

	conn := f.connect(ctx, t)
	var id string
	if err := conn.QueryRow(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', 'order-9', 'OrderPlaced', '{"total": 7}') RETURNING id::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	f.waitRecords(ctx, t, 1, 30*time.Second)
	recs := f.read(ctx, t)
	if len(recs) != 1 {
		t.Fatalf("%d records, want 1", len(recs))
	}
	h := recs[0].Headers
	wantSource := "/cdc-relay/" + dbName(t, f.url) + "/public.outbox_events"
	for k, v := range map[string]string{
		"ce_specversion": "1.0", "ce_id": id, "ce_source": wantSource, "ce_type": "OrderPlaced",
		"content-type": "application/json",
	} {
		if h[k] != v {
			t.Errorf("header %s = %q, want %q (headers %v)", k, h[k], v, h)
		}
	}
	if _, err := url.Parse(h["ce_source"]); err != nil {
		t.Errorf("ce_source %q is not a URI reference: %v", h["ce_source"], err)
	}
	if _, err := time.Parse(time.RFC3339, h["ce_time"]); err != nil {
		t.Errorf("ce_time %q is not RFC 3339: %v", h["ce_time"], err)
	}
	if !strings.Contains(string(recs[0].Value), `"total": 7`) || strings.Contains(string(recs[0].Value), "specversion") {
		t.Errorf("value %q: want the payload as the data, not a structured event", recs[0].Value)
	}
	if h["id"] != id {
		t.Errorf("the native id header is kept for idempotent consumers: %q", h["id"])
	}
	ce, enc, err := cetest.ToEvent(recs[0])
	if err != nil {
		t.Fatal(err)
	}
	if enc != binding.EncodingBinary || ce.ID() != id || ce.Source() != wantSource || ce.Type() != "OrderPlaced" ||
		ce.DataContentType() != "application/json" || string(ce.Data()) != string(recs[0].Value) || ce.Time().IsZero() {
		t.Errorf("SDK read a %s event: id %q source %q type %q datacontenttype %q time %s data %q",
			enc, ce.ID(), ce.Source(), ce.Type(), ce.DataContentType(), ce.Time(), ce.Data())
	}
	r.Stop(10 * time.Second)
}

// TestCloudEventsStructured runs the built relay with --cloudevents-mode
// structured over a jsonb and a bytea outbox and checks each record with the
// CloudEvents Go SDK as the Kafka binding's receiver does (structured: the
// content-type application/cloudevents+json), validated, attribute by
// attribute against its row: id, source, type, time (the commit time),
// datacontenttype, the trace context as the distributed tracing extension,
// and the payload as data (jsonb: the JSON itself) or data_base64 (bytea).
// The native headers stay (id, source_position for the effectively-once
// reconciliation), no ce_ header is written. cdc-relay replay and dlq replay
// (of a row dead-lettered for its partition) publish the same event.
func TestCloudEventsStructured(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct {
		name, alter, payload string
		dct                  string // datacontenttype
		data                 []byte // what the SDK's Event.Data gives
		base64               bool
	}{
		{name: "jsonb", payload: `'{"total": 7, "note": "a \"quote\""}'`, dct: "application/json",
			data: []byte(`{"note": "a \"quote\"", "total": 7}`)},
		{name: "bytea", alter: `ALTER TABLE outbox_events ALTER COLUMN payload TYPE bytea USING convert_to(payload::text, 'UTF8')`,
			// Valid UTF-8 (NUL, SOH, '*', LF): base64 because the column is
			// bytea, also in the dead letter's replay.
			payload: `'\x00012a0a'::bytea`, data: []byte{0, 1, 0x2a, 0x0a}, base64: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			f := newFixture(t, sharedPG, t.Name(), true)
			conn := f.connect(ctx, t)
			for _, sql := range []string{tc.alter, `ALTER TABLE outbox_events ADD COLUMN part integer, ADD COLUMN tracingspancontext text`} {
				if sql == "" {
					continue
				}
				if _, err := conn.Exec(ctx, sql); err != nil {
					t.Fatal(err)
				}
			}
			format := []string{"--format", "cloudevents", "--cloudevents-mode", "structured", "--column-partition", "part"}
			r := newRelay(t, f.relayArgs(format...))
			r.Start()
			r.WaitReady(30 * time.Second)

			var id, badID string
			if err := conn.QueryRow(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, tracingspancontext)
				VALUES ('order', 'order-9', 'OrderPlaced', `+tc.payload+`, '`+tp+`') RETURNING id::text`).Scan(&id); err != nil {
				t.Fatal(err)
			}
			// A partition the topic lacks: dead-lettered (invalid_partition).
			if err := conn.QueryRow(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, part)
				VALUES ('order', 'order-9', 'OrderPaid', `+tc.payload+`, -1) RETURNING id::text`).Scan(&badID); err != nil {
				t.Fatal(err)
			}
			f.waitRecords(ctx, t, 1, 30*time.Second)
			testenv.Eventually(t, 30*time.Second, func() error {
				var n int
				if err := conn.QueryRow(ctx, `SELECT count(*) FROM cdc_relay_dead_letters WHERE event_id = $1`, badID).Scan(&n); err != nil {
					return err
				}
				if n != 1 {
					return fmt.Errorf("no dead letter for event %s yet", badID)
				}
				return nil
			})
			r.Stop(10 * time.Second)

			source := "/cdc-relay/" + dbName(t, f.url) + "/public.outbox_events"
			check := func(rec sandbox.Record, wantID, wantType string, stream bool) *event.Event {
				t.Helper()
				ce, enc, err := cetest.ToEvent(rec)
				if err != nil {
					t.Fatal(err)
				}
				if enc != binding.EncodingStructured || rec.Headers["content-type"] != "application/cloudevents+json; charset=UTF-8" {
					t.Errorf("read in %s mode, content-type %q; want structured", enc, rec.Headers["content-type"])
				}
				if ce.SpecVersion() != "1.0" || ce.ID() != wantID || ce.Source() != source || ce.Type() != wantType {
					t.Errorf("specversion %q id %q source %q type %q; want 1.0 %q %q %q", ce.SpecVersion(), ce.ID(), ce.Source(), ce.Type(), wantID, source, wantType)
				}
				if ce.DataContentType() != tc.dct || ce.DataBase64 != tc.base64 || !bytes.Equal(ce.Data(), tc.data) {
					t.Errorf("datacontenttype %q base64 %v data %q; want %q %v %q (value %s)", ce.DataContentType(), ce.DataBase64, ce.Data(), tc.dct, tc.base64, tc.data, rec.Value)
				}
				if string(rec.Key) != "order-9" || rec.Headers["id"] != wantID {
					t.Errorf("key %q, id header %q; want order-9, %q", rec.Key, rec.Headers["id"], wantID)
				}
				if _, ok := rec.Headers["source_position"]; ok != stream {
					t.Errorf("source_position header present: %v, want %v", ok, stream)
				}
				for k := range rec.Headers {
					if strings.HasPrefix(k, "ce_") || k == "cdc_relay_payload_type" {
						t.Errorf("structured record has header %s", k)
					}
				}
				return ce
			}
			recs := f.read(ctx, t)
			if len(recs) != 1 {
				t.Fatalf("%d records, want 1", len(recs))
			}
			ce := check(recs[0], id, "OrderPlaced", true)
			if got, err := time.Parse(time.RFC3339Nano, recs[0].Headers["commit_time"]); err != nil || !ce.Time().Equal(got) {
				t.Errorf("time %s, want the commit time %s (%v)", ce.Time(), recs[0].Headers["commit_time"], err)
			}
			if ext := ce.Extensions(); ext["traceparent"] != tp || recs[0].Headers["traceparent"] != tp {
				t.Errorf("extensions %v, traceparent header %q; want the trace context in both", ext, recs[0].Headers["traceparent"])
			}

			brokers := strings.Join(f.brokers, ",")
			for _, args := range [][]string{
				append([]string{"replay", "--pg-url", f.url, "--kafka-brokers", brokers, "--topic", f.topic, "--since", "1h", "--id", id}, format...),
				{"dlq", "replay", "--pg-url", f.url, "--kafka-brokers", brokers, "--format", "cloudevents", "--cloudevents-mode", "structured", "--cloudevents-source", source},
			} {
				if out, err := exec.CommandContext(ctx, relayBin, args...).CombinedOutput(); err != nil {
					t.Fatalf("cdc-relay %s: %v\n%s", strings.Join(args[:2], " "), err, out)
				}
			}
			recs = f.read(ctx, t)
			if len(recs) != 3 {
				t.Fatalf("%d records after the replays, want 3", len(recs))
			}
			seen := map[string]bool{}
			for _, rec := range recs[1:] {
				if rec.Headers["cdc_relay_replay"] == "" {
					t.Errorf("replayed record without cdc_relay_replay: %v", rec.Headers)
				}
				switch rec.Headers["id"] {
				case id: // cdc-relay replay: the row again, with its trace context
					if ce := check(rec, id, "OrderPlaced", false); ce.Extensions()["traceparent"] != tp || ce.Time().IsZero() {
						t.Errorf("replayed event: extensions %v time %s", ce.Extensions(), ce.Time())
					}
				case badID: // dlq replay: the dead letter, by key
					check(rec, badID, "OrderPaid", false)
				}
				seen[rec.Headers["id"]] = true
			}
			if !seen[id] || !seen[badID] {
				t.Errorf("replayed ids %v, want %s and %s", seen, id, badID)
			}
		})
	}
}

// TestBinaryDoesNotLinkCloudEventsSDK: the CloudEvents Go SDK is a test
// dependency only.
func TestBinaryDoesNotLinkCloudEventsSDK(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "cloudevents") {
		t.Fatalf("cdc-relay links a CloudEvents package:\n%s", out)
	}
}

// dbName is the database named in a Postgres URL.
func dbName(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}
