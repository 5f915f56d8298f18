package sink

import (
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/testenv/cetest"
)

// TestCloudEventsBinaryMode: with CloudEventsSource every record carries the
// CloudEvents Kafka binding's binary-mode attributes (the CloudEvents Go SDK
// reads and validates it), the value stays the payload, and without it no
// ce_ header is written.
func TestCloudEventsBinaryMode(t *testing.T) {
	t.Parallel()
	const topic = "outbox.ce"
	kf := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 2, Topics: []string{topic, topic + ".native"}})
	for _, tc := range []struct {
		topic, source string
	}{{topic, "/cdc-relay/app/public.outbox_events"}, {topic + ".native", ""}} {
		evs := stream(5, 40)
		evs[3].CommitTime = time.Time{} // unknown commit time: no ce_time
		acks := newAckLog(len(evs))
		k := openSink(t, Config{Brokers: kf.Brokers(), Topics: []string{tc.topic}, Retry: fastRetry,
			CloudEventsSource: tc.source, Logger: zerolog.Nop()})
		sendAll(t, k, tc.topic, evs, acks.ack)
		acks.wait(t, 30*time.Second)
		recs := readAll(t, kf, tc.topic)
		if len(recs) != len(evs) {
			t.Fatalf("%d records, want %d", len(recs), len(evs))
		}
		byID := map[string]*outbox.Event{}
		for _, ev := range evs {
			byID[string(ev.ID)] = ev
		}
		for _, r := range recs {
			ev := byID[r.Headers[HeaderID]]
			if ev == nil || string(r.Value) != string(ev.Payload) {
				t.Fatalf("record %d: value %q does not match its event", r.Offset, r.Value)
			}
			if tc.source == "" {
				for _, h := range []string{HeaderCESpecVersion, HeaderCEID, HeaderCESource, HeaderCEType, HeaderCETime} {
					if _, ok := r.Headers[h]; ok {
						t.Fatalf("native record has header %s", h)
					}
				}
				continue
			}
			want := map[string]string{
				HeaderCESpecVersion: "1.0", HeaderCEID: string(ev.ID), HeaderCESource: tc.source, HeaderCEType: string(ev.EventType),
			}
			for h, v := range want {
				if r.Headers[h] != v {
					t.Fatalf("record of %s: %s = %q, want %q", ev.ID, h, r.Headers[h], v)
				}
			}
			// The CloudEvents Go SDK reads it as a binary-mode event.
			ce, enc, err := cetest.ToEvent(r)
			if err != nil {
				t.Fatal(err)
			}
			if enc != binding.EncodingBinary || ce.ID() != string(ev.ID) || ce.Source() != tc.source ||
				ce.Type() != string(ev.EventType) || string(ce.Data()) != string(ev.Payload) {
				t.Fatalf("SDK read %s event id %q source %q type %q data %q", enc, ce.ID(), ce.Source(), ce.Type(), ce.Data())
			}
			ts, ok := r.Headers[HeaderCETime]
			if ev.CommitTime.IsZero() {
				if ok {
					t.Fatalf("record of %s: ce_time %q for an unknown commit time", ev.ID, ts)
				}
				continue
			}
			got, err := time.Parse(time.RFC3339Nano, ts)
			if err != nil || !got.Equal(ev.CommitTime) {
				t.Fatalf("record of %s: ce_time %q (%v), want %s", ev.ID, ts, err, ev.CommitTime.Format(time.RFC3339Nano))
			}
		}
	}
}
