package relay_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestGateFailureReconnects: the effectively-once gate fails on an event
// (here it cannot read the topic's offsets, which it does on the first event
// of a topic; a Postgres restart while it stores them does the same). The
// event never reached the producer, so the stream ends and reconnects
// without waiting for its acknowledgement, and delivers it on the new
// stream. The relay waited forever for it before (it counted the event in
// flight, and a reconnect waits until Kafka acknowledged every event in
// flight), neither ready nor confirming anything again.
//
// The topic comes from a template, so no start reads it before its first
// event: a fixed topic is read when the stream starts behind the server's
// WAL, and a shared cluster's other databases can put it behind at any
// start. "replaying" starts it behind on purpose.
func TestGateFailureReconnects(t *testing.T) {
	for _, behind := range []bool{false, true} {
		name := map[bool]string{false: "fresh", true: "replaying"}[behind]
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.cfgHook = func(c *relay.Config) { c.Topic = "outbox.{aggregate_type}" }
			if behind {
				e.start()
				if err := e.stop(); err != nil {
					t.Fatalf("first run: %v", err)
				}
				e.exec("CREATE TABLE elsewhere (x int); INSERT INTO elsewhere VALUES (1)")
			}
			e.start()
			testenv.RequireLocalKafka(t, e.kafka)
			var refuse atomic.Int32
			refuse.Store(1)
			c := e.kafka.Cluster()
			c.ControlKey(int16(kmsg.ListOffsets), func(kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				if refuse.Add(-1) >= 0 {
					return nil, errors.New("test: ListOffsets refused"), true
				}
				return nil, nil, false
			})
			e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('gate', 'k', 'E', '{}')")
			testenv.Eventually(t, 30*time.Second, func() error {
				if n := testutil.ToFloat64(e.m.Reconnects); n < 1 {
					return errors.New("the relay did not reconnect after the gate failed")
				}
				return nil
			})
			e.waitRecords(1, "outbox.gate")
			if refuse.Load() >= 0 {
				t.Fatalf("the gate never asked for the offsets")
			}
			e.waitSlotConfirmed(e.currentLSN())
		})
	}
}
