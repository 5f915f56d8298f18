package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-relay/cdc-relay/internal/status"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestOutboxSLOMetrics scripts the numbers an on-call engineer asks for and
// checks each: the outbox wait histogram counts every event by type; while
// Kafka refuses every produce request the oldest unrelayed event ages, in
// the metric and in cdc-relay status --json (from the running relay's
// checkpoint, within two seconds of the truth from the outage's start); once Kafka accepts again both fall to 0; and with the relay
// stopped, status still tells the age of a row committed since, from the
// idle slot.
func TestOutboxSLOMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	conn := f.connect(ctx, t)
	insert := func(eventType string) {
		t.Helper()
		if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', 'o-1', $1, '{}')`, eventType); err != nil {
			t.Fatal(err)
		}
	}
	readStatus := func() status.Report {
		t.Helper()
		code, out, errOut := runCommand(ctx, t, 30*time.Second, "status", "--pg-url", f.url, "--slot", f.slot, "--json")
		var st status.Report
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --json (exit %d): %v\n%s\n%s", code, err, out, errOut)
		}
		return st
	}

	r := newRelay(t, f.relayArgs("--retry-base", "50ms", "--retry-cap", "200ms", "--monitor-interval", "200ms"))
	r.Start()
	r.WaitReady(30 * time.Second)
	insert("Placed")
	insert("Placed")
	insert("Paid")
	f.waitRecords(ctx, t, 3, 30*time.Second)
	testenv.Eventually(t, 10*time.Second, func() error {
		placed := r.Metric(`cdc_relay_outbox_wait_seconds_count{event_type="Placed"}`)
		paid := r.Metric(`cdc_relay_outbox_wait_seconds_count{event_type="Paid"}`)
		if placed != 2 || paid != 1 {
			return fmt.Errorf("outbox_wait_seconds_count Placed=%v Paid=%v, want 2 and 1", placed, paid)
		}
		if v := r.Metric("cdc_relay_oldest_unrelayed_event_age_seconds"); v != 0 {
			return fmt.Errorf("oldest_unrelayed_event_age_seconds = %v with everything acknowledged, want 0", v)
		}
		return nil
	})

	// Kafka refuses every produce request (a transient error the relay retries).
	var refuse atomic.Bool
	refuse.Store(true)
	c := f.kafka.Cluster()
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !refuse.Load() {
			return nil, nil, false
		}
		return testenv.ProduceError(req.(*kmsg.ProduceRequest), kerr.NotEnoughReplicas.Code), nil, true
	})
	insert("Shipped")
	committed := time.Now()
	// status tells the age within a second or two of the truth from the
	// outage's start (issue 31, test 4): every status read once the event has
	// waited 1.5 s, until it has waited 4 s, is checked against the time since
	// the commit before and after the command ran.
	const slack = 2.0
	checked := 0
	testenv.Eventually(t, 30*time.Second, func() error {
		lo := time.Since(committed).Seconds()
		st := readStatus()
		hi := time.Since(committed).Seconds()
		if lo >= 1.5 {
			checked++
			if !st.Active || st.OldestUnrelayedSource != "checkpoint" || st.OldestUnrelayedAge == nil ||
				*st.OldestUnrelayedAge < lo-slack || *st.OldestUnrelayedAge > hi+0.5 {
				t.Fatalf("status %.1f-%.1f s after the commit, with Kafka refusing: active %v, oldest unrelayed %s from %q (%s), want %.1f-%.1f s from the checkpoint",
					lo, hi, st.Active, fmtAge(st.OldestUnrelayedAge), st.OldestUnrelayedSource, st.OldestUnrelayedError, lo, hi)
			}
		}
		if lo < 4 {
			return fmt.Errorf("the event has waited %.1f s, checking status until 4 s", lo)
		}
		return nil
	})
	t.Logf("status checked %d times while the event waited 1.5-4 s", checked)
	const waited = 3.0 // seconds the event must have waited before the checks
	testenv.Eventually(t, 30*time.Second, func() error {
		if v := r.Metric("cdc_relay_oldest_unrelayed_event_age_seconds"); v < waited {
			return fmt.Errorf("oldest_unrelayed_event_age_seconds = %v while Kafka refuses, want at least %v", v, waited)
		}
		st := readStatus()
		if !st.Active || st.OldestUnrelayedSource != "checkpoint" || st.OldestUnrelayedAge == nil || *st.OldestUnrelayedAge < waited-1.5 {
			return fmt.Errorf("status: active %v, oldest unrelayed %v from %q (%s), want about %v s from the checkpoint",
				st.Active, st.OldestUnrelayedAge, st.OldestUnrelayedSource, st.OldestUnrelayedError, waited)
		}
		return nil
	})

	refuse.Store(false)
	f.waitRecords(ctx, t, 4, 30*time.Second)
	testenv.Eventually(t, 30*time.Second, func() error {
		if v := r.Metric("cdc_relay_oldest_unrelayed_event_age_seconds"); v != 0 {
			return fmt.Errorf("oldest_unrelayed_event_age_seconds = %v after Kafka accepted, want 0", v)
		}
		if st := readStatus(); st.OldestUnrelayedAge == nil || *st.OldestUnrelayedAge != 0 {
			return fmt.Errorf("status oldest unrelayed %v (%s), want 0", st.OldestUnrelayedAge, st.OldestUnrelayedError)
		}
		if v := r.Metric(`cdc_relay_outbox_wait_seconds_count{event_type="Shipped"}`); v != 1 {
			return fmt.Errorf("outbox_wait_seconds_count{Shipped} = %v, want 1", v)
		}
		return nil
	})
	if sum := r.Metric(`cdc_relay_outbox_wait_seconds_sum{event_type="Shipped"}`); sum < waited {
		t.Errorf("outbox_wait_seconds_sum{Shipped} = %v, want the %v s it waited or more", sum, waited)
	}

	// A replay run by an operator, in its own process, shows in the relay's
	// replay_history_events; a replay's events never count as outbox waits.
	if code, out, errOut := runCommand(ctx, t, 60*time.Second, "replay", "--pg-url", f.url, "--kafka-brokers", f.brokers[0],
		"--topic", f.topic, "--since", "1h"); code != 0 {
		t.Fatalf("cdc-relay replay: exit %d\n%s\n%s", code, out, errOut)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if v := r.Metric(`cdc_relay_replay_history_events{kind="outbox",result="published"}`); v != 4 {
			return fmt.Errorf("replay_history_events{outbox,published} = %v, want the 4 replayed rows", v)
		}
		return nil
	})
	if v := r.Metric(`cdc_relay_outbox_wait_seconds_count{event_type="Placed"}`); v != 2 {
		t.Errorf("outbox_wait_seconds_count{Placed} = %v after the replay, want still 2", v)
	}

	// The relay is down: status decodes the idle slot.
	r.Stop(10 * time.Second)
	if st := readStatus(); st.OldestUnrelayedAge == nil || *st.OldestUnrelayedAge != 0 || st.OldestUnrelayedSource != "slot" {
		t.Errorf("status with the relay stopped and nothing new: oldest unrelayed %v from %q (%s), want 0 from the slot",
			st.OldestUnrelayedAge, st.OldestUnrelayedSource, st.OldestUnrelayedError)
	}
	insert("Cancelled")
	testenv.Eventually(t, 30*time.Second, func() error {
		st := readStatus()
		if st.OldestUnrelayedAge == nil || *st.OldestUnrelayedAge < 1 || st.OldestUnrelayedSource != "slot" {
			return fmt.Errorf("status with the relay stopped: oldest unrelayed %v from %q (%s), want over 1 s from the slot",
				st.OldestUnrelayedAge, st.OldestUnrelayedSource, st.OldestUnrelayedError)
		}
		return nil
	})
}

// fmtAge prints status's oldest unrelayed age, which is null when unknown.
func fmtAge(age *float64) string {
	if age == nil {
		return "null"
	}
	return fmt.Sprintf("%.2f s", *age)
}
