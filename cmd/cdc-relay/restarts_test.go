package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/verify"
)

// restartCase is one row of TestRestarts: a writer commits while fault
// kills, stops or cuts off the relay; afterwards every committed event must
// be in Kafka, as committed, in per-key order.
type restartCase struct {
	name string
	// replaces is the test this row took over (for the reader; git log -S
	// finds the old one).
	replaces string
	timeout  time.Duration
	// localKafka: the row stops and restarts the broker.
	localKafka bool
	// The writer: keys, seed, events per second, and total (0: until the
	// fault function returns).
	keys  int
	seed  uint64
	rate  float64
	total int
	// fault runs against the ready relay while the writer commits.
	fault func(ctx context.Context, t *testing.T, f *fixture, r *relayProc, w *verify.Writer)
	// restarts is how many times fault must have started the relay again.
	restarts int
	// exactlyOnce: no duplicates either (a clean stop, or --delivery
	// effectively-once under SIGKILL).
	exactlyOnce bool
	// delivered checks the row's own assertions once everything arrived,
	// with the relay still running; stopped, after its final clean stop.
	delivered func(t *testing.T, r *relayProc)
	stopped   func(t *testing.T, r *relayProc)
}

// TestRestarts is the end-to-end proof of the delivery guarantee across
// process faults: SIGKILL at chosen points and at random ones, SIGTERM, a
// SIGKILL while the broker is down, and a broker outage without a restart.
// Each row replaces one test of its own (named in replaces); every row keeps
// that test's kill count, faults and assertions. The other kill tests test
// other things and stay apart: TestEffectivelyOnceReplayFromOlderCheckpoint
// (an older checkpoint put back), TestInitialSnapshot (kills mid-snapshot),
// TestTwoRelaysOneSlot (a standby taking over).
func TestRestarts(t *testing.T) {
	tests := []restartCase{
		{
			// SIGKILL three times at chosen points of the stream; duplicates are
			// allowed (the row asserts the at-least-once floor only).
			name: "sigkill three times mid-stream", replaces: "TestKillNineThreeTimes",
			timeout: 90 * time.Second, keys: 300, seed: 1, rate: 1200, total: 6000,
			fault: killThreeTimes, restarts: 3,
		},
		{
			name: "sigkill 50 times at random points, effectively-once", replaces: "TestKillNineLoopEffectivelyOnce",
			timeout: 4 * time.Minute, keys: 200, seed: 7, rate: 1500,
			fault: killLoop, restarts: killLoopKills, exactlyOnce: true,
			delivered: func(t *testing.T, r *relayProc) {
				if n := strings.Count(r.Logs(), "events already in Kafka"); n < killLoopKills/2 {
					t.Errorf("only %d start-up reconciliation lines in %d runs", n, r.Runs())
				}
			},
		},
		{
			name: "sigterm mid-stream and restart", replaces: "TestSigtermCleanStop",
			timeout: 60 * time.Second, keys: 100, seed: 2, rate: 1000,
			fault: sigtermAndRestart, restarts: 1, exactlyOnce: true,
			stopped: func(t *testing.T, r *relayProc) {
				// With --log-format json every line the relay writes is a JSON
				// object.
				for _, line := range strings.Split(r.Output(), "\n") {
					if line == "" {
						continue
					}
					if !strings.HasPrefix(line, "{") {
						t.Errorf("non-JSON stderr line with --log-format json: %q", line)
					}
				}
			},
		},
		{
			name: "sigkill during a broker outage", replaces: "TestKillNineDuringBrokerOutage",
			timeout: 60 * time.Second, localKafka: true, keys: 50, seed: 5, rate: 500,
			fault: killDuringBrokerOutage, restarts: 1,
		},
		{
			name: "broker down ten seconds, no restart", replaces: "TestBrokerDownTenSeconds",
			timeout: 90 * time.Second, localKafka: true, keys: 100, seed: 3, rate: 500,
			fault: brokerDownTenSeconds, restarts: 0,
			delivered: func(t *testing.T, r *relayProc) {
				testenv.Eventually(t, 10*time.Second, func() error {
					if code := r.Readyz(); code != http.StatusOK {
						return fmt.Errorf("relay not ready again after delivering everything (/readyz %d)", code)
					}
					return nil
				})
			},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			f := newFixture(t, sharedPG, fmt.Sprintf("restarts_%d", i), true)
			if tc.localKafka {
				testenv.RequireLocalKafka(t, f.kafka)
			}
			r := newRelay(t, f.relayArgs())
			r.Start()
			r.WaitReady(30 * time.Second)

			w := verify.NewWriter(f.url, "agg-", tc.keys, tc.seed)
			stopWriter := make(chan struct{})
			werr := w.GoRun(ctx, stopWriter, tc.total, tc.rate)
			tc.fault(ctx, t, f, r, w)
			if tc.total == 0 {
				close(stopWriter)
			}
			if err := <-werr; err != nil {
				t.Fatal(err)
			}
			if got := r.Runs() - 1; got != tc.restarts {
				t.Errorf("the relay was restarted %d times, want %d", got, tc.restarts)
			}
			r.WaitReady(30 * time.Second)
			res, _ := f.waitDelivered(ctx, t, w.Committed, 60*time.Second)
			t.Logf("%s (%d runs): %s", tc.name, r.Runs(), res)
			requireComplete(t, res)
			if tc.exactlyOnce && res.Duplicates != 0 {
				t.Fatalf("%d duplicates, want 0 (DESIGN invariant 7); log tail:\n%s", res.Duplicates, relayproc.Tail(r.Logs(), 40))
			}
			if tc.delivered != nil {
				tc.delivered(t, r)
			}
			requireRunning(t, r, "after delivering everything")
			r.Stop(10 * time.Second)
			if tc.stopped != nil {
				tc.stopped(t, r)
			}
		})
	}
}

// requireRunning fails t when the relay exited by itself.
func requireRunning(t *testing.T, r *relayProc, when string) {
	t.Helper()
	if r.Exited() {
		code, _ := r.Wait(0)
		t.Fatalf("relay exited by itself (code %d) %s:\n%s", code, when, relayproc.Tail(r.Logs(), 30))
	}
}

// killThreeTimes SIGKILLs the relay in full flow, right after a restart and
// late in the stream, each time before the writer finished its 6000 events.
func killThreeTimes(ctx context.Context, t *testing.T, f *fixture, r *relayProc, w *verify.Writer) {
	const total = 6000
	killAt := func(what string) {
		t.Helper()
		requireRunning(t, r, "before kill "+what)
		committed := w.Count()
		r.Kill()
		t.Logf("SIGKILL %s: %d of %d events committed so far", what, committed, total)
		if committed >= total {
			t.Errorf("kill %s came after the writer finished; the test no longer kills mid-stream", what)
		}
		r.Start()
	}
	// 1: in full flow, once a good part of the stream has been delivered.
	f.waitRecords(ctx, t, 800, 30*time.Second)
	killAt("#1 (after 800 records in Kafka)")
	// 2: soon after the restart, while it redelivers and catches up.
	r.WaitReady(30 * time.Second)
	time.Sleep(300 * time.Millisecond)
	killAt("#2 (300ms after the restarted relay became ready)")
	// 3: later in the stream, once 3800 records are in Kafka, or before the
	// writer ends if the relay lags behind.
	testenv.Eventually(t, 30*time.Second, func() error {
		if w.Count() >= 5000 {
			return nil
		}
		if n := len(f.read(ctx, t)); n < 3800 {
			return fmt.Errorf("only %d records in Kafka since the second restart", n)
		}
		return nil
	})
	killAt("#3 (after 3800 records in Kafka or 5000 committed)")
}

// killLoopKills is how many times killLoop SIGKILLs the relay.
const killLoopKills = 50

// killLoop SIGKILLs the relay at random points: during start-up and
// reconciliation, right after it became ready, and in full flow. Some kills
// must come before it was ready.
func killLoop(_ context.Context, t *testing.T, _ *fixture, r *relayProc, _ *verify.Writer) {
	rng := rand.New(rand.NewPCG(11, 42))
	startup := 0
	for i := 0; i < killLoopKills; i++ {
		switch i % 3 {
		case 0:
			// During start-up: checks, slot, reconciliation with Kafka.
			time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
		case 1:
			// Soon after it streams again, while it catches up.
			r.WaitReady(30 * time.Second)
			time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		default:
			r.WaitReady(30 * time.Second)
			time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond)
		}
		requireRunning(t, r, fmt.Sprintf("before kill %d", i+1))
		if r.Readyz() != http.StatusOK {
			startup++
		}
		r.Kill()
		r.Start()
	}
	t.Logf("%d x SIGKILL, %d before the relay was ready", killLoopKills, startup)
	if startup == 0 {
		t.Errorf("no kill came before the relay was ready; the test no longer kills during start-up")
	}
}

// sigtermAndRestart stops the relay with SIGTERM once 1000 records are in
// Kafka (exit 0, a "stopped" line), keeps it down for half a second while
// the writer goes on, and restarts it for 1500 more events. A clean stop
// finishes the current transaction, waits for Kafka and confirms before it
// exits: no duplicates after the restart.
func sigtermAndRestart(ctx context.Context, t *testing.T, f *fixture, r *relayProc, w *verify.Writer) {
	f.waitRecords(ctx, t, 1000, 30*time.Second)
	before := w.Count()
	start := time.Now()
	r.Signal(syscall.SIGTERM)
	code, ok := r.Wait(10 * time.Second)
	if !ok {
		t.Fatalf("relay did not exit within 10s of SIGTERM")
	}
	if code != 0 {
		t.Fatalf("relay exited with code %d after SIGTERM, want 0", code)
	}
	t.Logf("SIGTERM with %d events committed; exit 0 after %v", before, time.Since(start).Round(time.Millisecond))
	stopped := false
	for _, m := range r.LogRecords() {
		stopped = stopped || m["message"] == "stopped"
	}
	if !stopped {
		t.Errorf("no \"stopped\" log line after SIGTERM")
	}
	// The outage: half a second of writes while the relay is down.
	time.Sleep(500 * time.Millisecond)
	r.Start()
	r.WaitReady(30 * time.Second)
	atReady := w.Count()
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := w.Count() - atReady; n < 1500 {
			return fmt.Errorf("writer committed %d events since the restart (%d since the SIGTERM), want 1500", n, w.Count()-before)
		}
		return nil
	})
}

// killDuringBrokerOutage SIGKILLs the relay while the broker is down and the
// relay holds events Kafka never acknowledged, after it sent several status
// updates: a relay that confirmed the slot or saved its checkpoint on
// receipt instead of on acknowledgement loses them here (a plain SIGKILL
// rarely catches that: a local broker acknowledges within milliseconds).
func killDuringBrokerOutage(ctx context.Context, t *testing.T, f *fixture, r *relayProc, w *verify.Writer) {
	f.waitRecords(ctx, t, 300, 30*time.Second)
	f.kafka.Stop()
	atStop := w.Count()
	testenv.Eventually(t, 30*time.Second, func() error {
		requireRunning(t, r, "during the broker outage")
		if n := r.Metric("cdc_relay_in_flight_events"); n == 0 {
			return errors.New("the relay holds no unacknowledged events")
		}
		return nil
	})
	testenv.WaitStatusUpdates(t, f.pg, f.db, f.slot, 5, 30*time.Second)
	requireRunning(t, r, "during the broker outage")
	r.Kill()
	t.Logf("SIGKILL with the broker down; %d events committed since it stopped", w.Count()-atStop)
	if err := f.kafka.Start(); err != nil {
		t.Fatalf("restart broker: %v", err)
	}
	r.Start()
	r.WaitReady(30 * time.Second)
	time.Sleep(time.Second) // writes after the restart
}

// brokerDownTenSeconds stops the broker for 10s while the writer keeps
// committing: the relay must keep running and report not ready, and (the
// common part) deliver everything once the broker is back.
func brokerDownTenSeconds(ctx context.Context, t *testing.T, f *fixture, r *relayProc, w *verify.Writer) {
	f.waitRecords(ctx, t, 500, 30*time.Second)
	f.kafka.Stop()
	down := time.Now()
	atStop := w.Count()
	saw503 := false
	for time.Since(down) < 10*time.Second {
		requireRunning(t, r, fmt.Sprintf("%v into the broker outage", time.Since(down).Round(time.Millisecond)))
		if r.Readyz() == http.StatusServiceUnavailable {
			saw503 = true
		}
		time.Sleep(100 * time.Millisecond)
	}
	duringOutage := w.Count() - atStop
	if err := f.kafka.Start(); err != nil {
		t.Fatalf("restart broker: %v", err)
	}
	t.Logf("broker down for %v; %d events committed meanwhile", time.Since(down).Round(time.Millisecond), duringOutage)
	if !saw503 {
		t.Errorf("/readyz never answered 503 during the 10s broker outage")
	}
	if duringOutage == 0 {
		t.Errorf("writer committed nothing during the outage")
	}
	time.Sleep(2 * time.Second) // writes after the outage
}
