package main

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/testenv/verify"
)

// TestKillNineLoopEffectivelyOnce SIGKILLs the relay 50 times at random
// points while a writer commits steadily: during start-up and
// reconciliation, right after it became ready, and in full flow. With the
// default --delivery effectively-once, every committed event must be in
// Kafka exactly once, in per-key order.
func TestKillNineLoopEffectivelyOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	r := newRelay(t, f.relayArgs())
	r.start()
	r.waitReady(30 * time.Second)

	w := verify.NewWriter(f.url, "agg-", 200, 7)
	stop := make(chan struct{})
	werr := w.GoRun(ctx, stop, 0, 1500)
	rng := rand.New(rand.NewPCG(11, 42))
	const kills = 50
	startup := 0
	for i := 0; i < kills; i++ {
		switch i % 3 {
		case 0:
			// During start-up: checks, slot, reconciliation with Kafka.
			time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
		case 1:
			// Soon after it streams again, while it catches up.
			r.waitReady(30 * time.Second)
			time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		default:
			r.waitReady(30 * time.Second)
			time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond)
		}
		if r.exited() {
			code, _ := r.wait(0)
			t.Fatalf("relay exited by itself (code %d) before kill %d:\n%s", code, i+1, tail(r.logs.String(), 30))
		}
		if r.readyz() != 200 {
			startup++
		}
		r.kill()
		r.start()
	}
	close(stop)
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	r.waitReady(30 * time.Second)
	res, _ := f.waitDelivered(ctx, t, w.Committed, 60*time.Second)
	t.Logf("after %d x SIGKILL (%d before the relay was ready): %s", kills, startup, res)
	requireComplete(t, res)
	if res.Duplicates != 0 {
		t.Fatalf("%d duplicates after %d kills with --delivery effectively-once; log tail:\n%s",
			res.Duplicates, kills, tail(r.logs.String(), 40))
	}
	if startup == 0 {
		t.Errorf("no kill came before the relay was ready; the test no longer kills during start-up")
	}
	if n := strings.Count(r.logs.String(), "events already in Kafka"); n < kills/2 {
		t.Errorf("only %d start-up reconciliation lines in %d runs", n, kills+1)
	}
	r.stop(10 * time.Second)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
