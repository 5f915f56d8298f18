package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestTwoRelaysOneSlot: a second relay on the same slot waits as a standby (not
// ready, retrying); when the first is killed with SIGKILL it takes over within
// seconds and nothing committed is lost.
func TestTwoRelaysOneSlot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	conn := f.connect(ctx, t)
	insert := func(from, to int) {
		t.Helper()
		if _, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'order', 'agg' || (g % 7), 'E', jsonb_build_object('agg', 'agg' || (g % 7), 'seq', g) FROM generate_series($1::int, $2::int) g`, from, to); err != nil {
			t.Fatal(err)
		}
	}

	primary := newRelay(t, f.relayArgs())
	primary.Start()
	primary.WaitReady(30 * time.Second)
	standby := newRelay(t, f.relayArgs())
	standby.Start()
	testenv.Eventually(t, 20*time.Second, func() error {
		if standby.HasLog("held by another process") {
			return nil
		}
		if standby.Exited() {
			t.Fatal("standby exited instead of waiting for the slot")
		}
		return errors.New("standby never reported the slot as held")
	})
	if code := standby.Readyz(); code != http.StatusServiceUnavailable {
		t.Errorf("standby /readyz = %d, want 503 while the slot is held", code)
	}
	insert(1, 50)
	f.waitRecords(ctx, t, 50, 30*time.Second)

	primary.Kill()
	killed := time.Now()
	insert(51, 100)
	standby.WaitReady(20 * time.Second)
	takeover := time.Since(killed)
	t.Logf("standby took over %v after the primary's SIGKILL", takeover.Round(time.Millisecond))
	if takeover > 10*time.Second {
		t.Errorf("takeover took %v, want a few seconds", takeover)
	}
	// The standby starts from the slot's confirmed position, so events the
	// primary sent but had not confirmed come again first: count distinct
	// events, not records.
	seen := map[string]bool{}
	testenv.Eventually(t, 30*time.Second, func() error {
		for _, r := range f.read(ctx, t) {
			seen[string(r.Value)] = true
		}
		if len(seen) < 100 {
			return fmt.Errorf("%d distinct events in Kafka, want all 100", len(seen))
		}
		return nil
	})
	if len(seen) != 100 {
		t.Errorf("%d distinct events in Kafka, want exactly the 100 committed", len(seen))
	}
	if standby.Exited() {
		t.Error("standby exited")
	}
}
