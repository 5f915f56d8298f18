package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"syscall"
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

// TestStopWhileBrokerHangs stops the relay with SIGTERM while the broker
// answers nothing: it hung the connections the relay had open, with produce
// requests of 64 KiB events stuck on them, and reads no new one either. The
// relay must say at once what its stop waits for, and exit 0 within
// --shutdown-timeout. Chaos seed 4244 found a relay that had logged nothing
// 10 s after SIGTERM (its --shutdown-timeout) and was killed.
func TestStopWhileBrokerHangs(t *testing.T) {
	const (
		requestTimeout  = 3 * time.Second
		shutdownTimeout = 4 * time.Second
	)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newFixture(t, sharedPG, "stop_while_broker_hangs", false)
	f.kafka = testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4, SocketBuffer: 16 << 10})
	testenv.RequireLocalKafka(t, f.kafka)
	f.brokers = f.kafka.Brokers()
	r := newRelay(t, f.relayArgs("--request-timeout", requestTimeout.String(), "--shutdown-timeout", shutdownTimeout.String()))
	r.Start()
	r.WaitReady(30 * time.Second)
	w := verify.NewWriter(f.url, "agg-", 16, 15)
	conn := f.connect(ctx, t)
	aggs := make([]string, 16)
	for i := range aggs {
		aggs[i] = fmt.Sprintf("agg-%d", i)
	}
	if err := w.CommitTxn(ctx, conn, aggs); err != nil {
		t.Fatalf("commit: %v", err)
	}
	f.waitRecords(ctx, t, 16, 30*time.Second)

	n, err := f.kafka.StallConnections()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.kafka.StopReading(); err != nil {
		t.Fatal(err)
	}
	defer f.kafka.ResumeReading()
	w.Pad = 64 << 10
	for range 8 {
		if err := w.CommitTxn(ctx, conn, aggs); err != nil {
			t.Fatalf("commit: %v", err)
		}
	}
	// Until a request failed on a stuck connection: the relay retries.
	testenv.Eventually(t, 4*requestTimeout, func() error {
		requireRunning(t, r, "while the broker hangs")
		if !strings.Contains(r.Logs(), "Kafka produce failing") {
			return errors.New(`no "Kafka produce failing" line yet`)
		}
		return nil
	})
	t.Logf("%d connections stuck, no new one read; the relay retries", n)
	lines := len(r.LogRecords())
	said := func() []string {
		var msgs []string
		for _, rec := range r.LogRecords()[lines:] {
			msg, _ := rec["message"].(string)
			msgs = append(msgs, msg)
		}
		return msgs
	}
	stopped := time.Now()
	r.Signal(syscall.SIGTERM)
	// Within a second, the first line says what the stop waits for.
	var first []string
	for deadline := time.Now().Add(time.Second); len(first) == 0 && time.Now().Before(deadline); {
		if first = said(); len(first) == 0 {
			if _, done := r.Wait(50 * time.Millisecond); done {
				break
			}
		}
	}
	if len(first) == 0 || !strings.HasPrefix(first[0], "stopping: ") {
		t.Errorf("the lines within 1s of SIGTERM are %q; want a first one saying what the stop waits for", first)
	}
	code, exited := r.Wait(shutdownTimeout + 5*time.Second)
	took := time.Since(stopped)
	t.Logf("after SIGTERM (%v): exited %v, code %d; logged %q", took.Round(time.Millisecond), exited, code, said())
	if !exited {
		r.Kill()
		t.Fatalf("no exit within %v of SIGTERM (--shutdown-timeout %v)", shutdownTimeout+5*time.Second, shutdownTimeout)
	}
	if code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	if took > shutdownTimeout {
		t.Errorf("exited %v after SIGTERM, want within --shutdown-timeout %v", took.Round(time.Millisecond), shutdownTimeout)
	}
}
