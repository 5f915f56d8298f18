package outboxtable_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/outboxtable"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestReplayBinaryPayload: a replay of an outbox table with a bytea payload and
// key and a tracing column publishes the raw bytes and the headers the stream
// would (decoder.Format), whatever the session's bytea_output.
func TestReplayBinaryPayload(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tests := []struct {
		output      string
		contentType string
		wantCT      string // "" none
	}{
		{"hex", "auto", ""},
		{"escape", "application/x-protobuf", "application/x-protobuf"},
	}
	for _, tt := range tests {
		t.Run(tt.output, func(t *testing.T) {
			ctx := t.Context()
			pool := newPool(t, "cdc_relay_outboxtable_bytea_"+tt.output)
			kafka := testenv.NewKafka(t, sandbox.KafkaOptions{})
			s := newStore(t, pool)
			p := newPublisher(t, kafka)
			if _, err := pool.Exec(ctx, `ALTER DATABASE cdc_relay_outboxtable_bytea_`+tt.output+` SET bytea_output = `+tt.output); err != nil {
				t.Fatal(err)
			}
			pool.Reset() // new connections get the setting
			_, err := pool.Exec(ctx, `CREATE TABLE public.outbox_bin (
    id                 uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregate_type     text        NOT NULL,
    aggregate_id       bytea       NOT NULL,
    event_type         text        NOT NULL,
    payload            bytea,
    created_at         timestamptz NOT NULL DEFAULT now(),
    tracingspancontext text
)`)
			if err != nil {
				t.Fatal(err)
			}
			var output string
			if err := pool.QueryRow(ctx, "SHOW bytea_output").Scan(&output); err != nil || output != tt.output {
				t.Fatalf("bytea_output = %q, %v; want %q", output, err, tt.output)
			}
			key := []byte{0xca, 0xfe, 0x00}
			payload := []byte{0, 0, 0, 0x10, 0x92, 0, 0x0a, 0x03, 'a', '\\', 0xff}
			if _, err := pool.Exec(ctx, `INSERT INTO public.outbox_bin (aggregate_type, aggregate_id, event_type, payload, tracingspancontext, created_at)
VALUES ('order', $1, 'Placed', $2, $3, now() - interval '2 minutes'), ('order', $1, 'Empty', '', 'bad', now() - interval '1 minute')`, key, payload, tp); err != nil {
				t.Fatal(err)
			}
			cols := outboxtable.Columns{Columns: decoder.DefaultColumns(), ContentType: tt.contentType, Tracing: decoder.DefaultTracingColumn}
			topic := "bin." + tt.output
			res, err := outboxtable.Replay(ctx, pool, s.History(), "public.outbox_bin", cols, p, outboxtable.ReplayOptions{
				Since: time.Now().Add(-time.Hour), Topic: topic, Actor: "t"})
			if err != nil {
				t.Fatal(err)
			}
			if res.Published != 2 {
				t.Fatalf("published %d, want 2 (%+v)", res.Published, res)
			}
			recs := testenv.MustReadAll(t, kafka, topic)
			if len(recs) != 2 {
				t.Fatalf("Kafka has %d records, want 2", len(recs))
			}
			byType := map[string]sandbox.Record{}
			for _, r := range recs {
				byType[r.Headers["event_type"]] = r
			}
			for evType, want := range map[string]struct {
				value []byte
				trace string
			}{"Placed": {payload, tp}, "Empty": {[]byte{}, ""}} {
				r := byType[evType]
				if !bytes.Equal(r.Key, key) || !bytes.Equal(r.Value, want.value) {
					t.Errorf("%s: key % x, value % x; want % x, % x", evType, r.Key, r.Value, key, want.value)
				}
				if got := r.Headers["traceparent"]; got != want.trace {
					t.Errorf("%s: traceparent %q, want %q", evType, got, want.trace)
				}
				if got := r.Headers["content-type"]; got != tt.wantCT {
					t.Errorf("%s: content-type %q, want %q", evType, got, tt.wantCT)
				}
				if fmt.Sprint(r.Headers["cdc_relay_replay"]) == "" {
					t.Errorf("%s: no replay header in %v", evType, r.Headers)
				}
			}
		})
	}
}
