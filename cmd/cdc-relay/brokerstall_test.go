package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/verify"
)

// TestBrokerStopsReading runs the built binary against a broker that stops
// reading (4 KiB socket buffers) just before an event of 6 MiB: the relay's
// produce request, with nothing else in flight, is larger than the socket
// buffers hold (the relay's send buffer grows to 4 MiB at most), so its
// write blocks. Within about the request timeout the relay must log "Kafka
// produce failing", count the error in cdc_relay_produce_errors_total and
// answer /readyz 503; once the broker reads again, every committed event is
// in Kafka once, in per-key order, and the relay is ready again. Before
// writes had a deadline the relay stayed silent and ready for ever.
func TestBrokerStopsReading(t *testing.T) {
	const timeout = 3 * time.Second // --request-timeout
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newFixture(t, sharedPG, "broker_stops_reading", false)
	f.kafka = testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4, SocketBuffer: 4096,
		BrokerConfigs: map[string]string{"message.max.bytes": "16777216"}})
	testenv.RequireLocalKafka(t, f.kafka)
	f.brokers = f.kafka.Brokers()
	r := newRelay(t, f.relayArgs("--request-timeout", timeout.String(), "--batch-max-bytes", "8388608"))
	r.Start()
	r.WaitReady(30 * time.Second)

	// A few events first, so the relay's connection to the broker is open.
	w := verify.NewWriter(f.url, "agg-", 16, 13)
	big := verify.NewWriter(f.url, "big-", 1, 14)
	big.Pad = 6 << 20
	committed := func() []verify.Event { return append(w.Committed(), big.Committed()...) }
	conn := f.connect(ctx, t)
	aggs := func(prefix string, n int) []string {
		a := make([]string, n)
		for i := range a {
			a[i] = fmt.Sprintf("%s%d", prefix, i%16)
		}
		return a
	}
	if err := w.CommitTxn(ctx, conn, aggs("agg-", 16)); err != nil {
		t.Fatalf("commit: %v", err)
	}
	f.waitRecords(ctx, t, 16, 30*time.Second)
	failing := strings.Count(r.Logs(), "Kafka produce failing")

	if err := f.kafka.StopReading(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if err := big.CommitTxn(ctx, conn, aggs("big-", 1)); err != nil {
		t.Fatalf("commit: %v", err)
	}
	testenv.Eventually(t, 6*timeout, func() error {
		requireRunning(t, r, "while the broker reads nothing")
		var missing []string
		if strings.Count(r.Logs(), "Kafka produce failing") == failing {
			missing = append(missing, `no new "Kafka produce failing" line`)
		}
		if n := r.Metric(`cdc_relay_produce_errors_total{class="transient"}`); n == 0 {
			missing = append(missing, "cdc_relay_produce_errors_total{class=\"transient\"} is 0")
		}
		if code := r.Readyz(); code != http.StatusServiceUnavailable {
			missing = append(missing, fmt.Sprintf("/readyz %d", code))
		}
		if len(missing) > 0 {
			return errors.New(strings.Join(missing, ", "))
		}
		return nil
	})
	t.Logf("produce failing, counted and not ready %v after the broker stopped reading (request timeout %v)",
		time.Since(stopped).Round(time.Millisecond), timeout)

	f.kafka.ResumeReading()
	if err := w.CommitTxn(ctx, conn, aggs("agg-", 64)); err != nil {
		t.Fatalf("commit: %v", err)
	}
	res, _ := f.waitDelivered(ctx, t, committed, 60*time.Second)
	t.Logf("after the broker read again: %s", res)
	requireComplete(t, res)
	if res.Duplicates != 0 {
		t.Errorf("%d duplicates, want 0 (idempotent producer); log tail:\n%s", res.Duplicates, relayproc.Tail(r.Logs(), 40))
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if code := r.Readyz(); code != http.StatusOK {
			return fmt.Errorf("/readyz %d after every event was delivered", code)
		}
		return nil
	})
	if !strings.Contains(r.Logs(), "Kafka produce recovered") {
		t.Errorf(`no "Kafka produce recovered" line after every event was delivered`)
	}
	requireRunning(t, r, "after delivering everything")
	r.Stop(10 * time.Second)
}
