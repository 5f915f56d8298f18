package main

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestCloudEventsFormat runs the built relay with --format cloudevents and
// checks what a consumer reads against the CloudEvents Kafka protocol
// binding, binary content mode: the required attributes as ce_ headers
// (specversion 1.0, a non-empty id, a URI-reference source, a non-empty
// type), time in RFC 3339, content-type for the data, and the value the data
// itself, unchanged.
func TestCloudEventsFormat(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	r := newRelay(t, f.relayArgs("--format", "cloudevents"))
	r.start()
	r.waitReady(30 * time.Second)

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
	r.stop(10 * time.Second)
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
