package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// The application's trace contexts in the outbox rows of TestOTelExporter.
const (
	otelAppTrace1 = "4bf92f3577b34da6a3ce929d0e0e4736"
	otelAppSpan1  = "00f067aa0ba902b7"
	otelAppTrace2 = "0af7651916cd43dd8448eb211c80319c"
	otelAppSpan2  = "b7ad6b7169203331"
	otelAppTrace3 = "a3ce929d0e0e47364bf92f3577b34da6"
	otelAppSpan3  = "a902b700f067aa0b"
)

// TestOTelExporter runs the built relay with --otel-exporter otlp against an
// in-process OTLP/HTTP receiver (the real exporter, decoded with the OTLP
// collector types) and checks a trace from the application to the consumer:
// one PRODUCER span per event with a trace context, in the application's
// trace and a child of its span; the Kafka record (read with franz-go)
// carries the relay's span as its traceparent, so a consumer's span is the
// relay's child; the span's topic, partition, offset and message id are the
// record's; a row without trace context gets no span; a dead-lettered event
// gets an error span. Then the same relay without the flag: headers exactly
// as the row has them, and no span.
func TestOTelExporter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	conn := f.connect(ctx, t)
	if _, err := conn.Exec(ctx, `ALTER TABLE outbox_events ADD COLUMN tracingspancontext text`); err != nil {
		t.Fatal(err)
	}
	rcv := testenv.NewOTLPReceiver(t)
	// Credentials in the endpoint must not reach the log (the exporter uses
	// only the host and path).
	endpoint, err := url.Parse(rcv.HTTPURL())
	if err != nil {
		t.Fatal(err)
	}
	endpoint.User = url.UserPassword("relay", "hunter2")

	r := newRelay(t, f.relayArgs("--otel-exporter", "otlp"))
	r.P.SetEnv(append(withoutOTelEnv(r.P.Env()),
		"OTEL_EXPORTER_OTLP_ENDPOINT="+endpoint.String(),
		"OTEL_BSP_SCHEDULE_DELAY=100", // export within 100 ms instead of 5 s
	))
	r.Start()
	r.WaitReady(30 * time.Second)
	wantLog := "exporting a span per event with a trace context over OTLP"
	var logged map[string]any
	for _, m := range r.LogRecords() {
		if msg, _ := m["message"].(string); strings.Contains(msg, wantLog) {
			logged = m
		}
	}
	if want := rcv.HTTPURL() + "/v1/traces"; logged == nil || logged["endpoint"] != want || logged["protocol"] != "http/protobuf" {
		t.Errorf("start-up log %v, want %q with endpoint %s and protocol http/protobuf", logged, wantLog, want)
	}
	if strings.Contains(r.Logs(), "hunter2") {
		t.Error("the log shows the endpoint's password")
	}

	// A W3C traceparent; Debezium's properties text with a tracestate; no
	// trace context; and a traced event that fails for good (empty key) and
	// goes to the dead-letter table.
	ids := map[string]string{}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range []struct{ name, key, trace string }{
		{"w3c", "order-1", "00-" + otelAppTrace1 + "-" + otelAppSpan1 + "-01"},
		{"debezium", "order-2", "#Mon Jun 03 10:00:00 UTC 2024\ntracestate=rojo\\=00f067aa0ba902b7\ntraceparent=00-" + otelAppTrace2 + "-" + otelAppSpan2 + "-01\n"},
		{"untraced", "order-3", ""},
		{"dead", "", "00-" + otelAppTrace3 + "-" + otelAppSpan3 + "-01"},
	} {
		var trace any
		if row.trace != "" {
			trace = row.trace
		}
		var id string
		if err := tx.QueryRow(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, tracingspancontext)
			VALUES ('order', $1, 'OrderPlaced', '{"n": 1}', $2) RETURNING id::text`, row.key, trace).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[row.name] = id
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	f.waitRecords(ctx, t, 3, 30*time.Second)
	var spans map[string]testenv.ReceivedSpan // by messaging.message.id
	testenv.Eventually(t, 30*time.Second, func() error {
		spans = map[string]testenv.ReceivedSpan{}
		for _, sp := range rcv.Spans() {
			id, _ := sp.Attrs["messaging.message.id"].(string)
			if _, dup := spans[id]; dup {
				t.Fatalf("two spans for event %s", id)
			}
			spans[id] = sp
		}
		if len(spans) < 3 {
			return fmt.Errorf("%d spans received, want 3 (w3c, debezium, dead)", len(spans))
		}
		return nil
	})
	if len(spans) != 3 {
		t.Errorf("%d spans, want 3", len(spans))
	}
	if _, ok := spans[ids["untraced"]]; ok {
		t.Error("a span for the row without trace context")
	}

	recs := f.read(ctx, t)
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3 (the dead letter is not in Kafka)", len(recs))
	}
	for _, rec := range recs {
		id := rec.Headers["id"]
		if id == ids["untraced"] {
			if tp, ok := rec.Headers["traceparent"]; ok {
				t.Errorf("row without trace context: record has traceparent %q", tp)
			}
			continue
		}
		appTrace, appSpan := otelAppTrace1, otelAppSpan1
		if id == ids["debezium"] {
			appTrace, appSpan = otelAppTrace2, otelAppSpan2
			if rec.Headers["tracestate"] != "rojo=00f067aa0ba902b7" {
				t.Errorf("debezium row: tracestate %q", rec.Headers["tracestate"])
			}
		}
		sp, ok := spans[id]
		if !ok {
			t.Errorf("no span for event %s (record %s/%d@%d)", id, rec.Topic, rec.Partition, rec.Offset)
			continue
		}
		if sp.TraceID() != appTrace || sp.ParentSpanID() != appSpan {
			t.Errorf("event %s: span in trace %s with parent %s, want the app's %s, %s", id, sp.TraceID(), sp.ParentSpanID(), appTrace, appSpan)
		}
		// A consumer continuing the record's context becomes the relay span's child.
		if want := "00-" + appTrace + "-" + sp.SpanID() + "-01"; rec.Headers["traceparent"] != want {
			t.Errorf("event %s: record traceparent %q, want the relay's span %q", id, rec.Headers["traceparent"], want)
		}
		if sp.Span.GetKind() != tracepb.Span_SPAN_KIND_PRODUCER || sp.Span.GetName() != f.topic+" publish" {
			t.Errorf("event %s: span %v %q, want PRODUCER %q", id, sp.Span.GetKind(), sp.Span.GetName(), f.topic+" publish")
		}
		if sp.Span.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("event %s: error status %q", id, sp.Span.GetStatus().GetMessage())
		}
		for k, v := range map[string]any{
			"messaging.system": "kafka", "messaging.destination.name": rec.Topic,
			"messaging.kafka.destination.partition": int64(rec.Partition), "messaging.kafka.message.offset": rec.Offset,
			"messaging.message.id": id, "messaging.kafka.message.key": string(rec.Key),
			"cdc_relay.commit_lsn": rec.Headers["commit_lsn"], "cdc_relay.source_position": rec.Headers["source_position"],
		} {
			if sp.Attrs[k] != v {
				t.Errorf("event %s: attribute %s = %#v, want %#v from the record", id, k, sp.Attrs[k], v)
			}
		}
		if sp.Resource["service.name"] != "cdc-relay" || sp.Resource["service.version"] != buildVersion {
			t.Errorf("event %s: resource %v, want service.name cdc-relay, service.version %s", id, sp.Resource, buildVersion)
		}
	}
	if sp, ok := spans[ids["dead"]]; !ok {
		t.Error("no span for the dead-lettered event")
	} else if sp.Span.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR || sp.Attrs["error.type"] != "empty_key" ||
		sp.Attrs["cdc_relay.dead_letter"] != true || sp.TraceID() != otelAppTrace3 || sp.ParentSpanID() != otelAppSpan3 {
		t.Errorf("dead-lettered event: status %v, attributes %v, trace %s parent %s; want an error, empty_key, in the app's trace",
			sp.Span.GetStatus(), sp.Attrs, sp.TraceID(), sp.ParentSpanID())
	}
	r.Stop(15 * time.Second)

	// Without the flag, the headers are the row's, byte for byte, and no
	// span is exported.
	before := len(rcv.Spans())
	plain := newRelay(t, f.relayArgs())
	plain.P.SetEnv(append(withoutOTelEnv(plain.P.Env()), "OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.HTTPURL(), "OTEL_BSP_SCHEDULE_DELAY=100"))
	plain.Start()
	plain.WaitReady(30 * time.Second)
	const tp = "00-" + otelAppTrace1 + "-" + otelAppSpan1 + "-01"
	var id string
	if err := conn.QueryRow(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, tracingspancontext)
		VALUES ('order', 'order-4', 'OrderPlaced', '{"n": 2}', $1) RETURNING id::text`, tp).Scan(&id); err != nil {
		t.Fatal(err)
	}
	f.waitRecords(ctx, t, 4, 30*time.Second)
	plain.Stop(15 * time.Second)
	for _, rec := range f.read(ctx, t) {
		if rec.Headers["id"] == id && rec.Headers["traceparent"] != tp {
			t.Errorf("--otel-exporter none: traceparent %q, want the row's %q", rec.Headers["traceparent"], tp)
		}
	}
	if after := len(rcv.Spans()); after != before {
		t.Errorf("--otel-exporter none exported %d spans", after-before)
	}
	if plain.HasLog(wantLog) {
		t.Error("--otel-exporter none logs that it exports spans")
	}
}

// withoutOTelEnv drops OTEL_* variables from env, so a developer's
// settings cannot change where the relay under test exports.
func withoutOTelEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "OTEL_") {
			out = append(out, kv)
		}
	}
	return out
}
