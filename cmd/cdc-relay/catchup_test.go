package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestCatchUpKilled (issue 44): the built binary catches up a backlog of the
// table-less outbox (transactional logical decoding messages) in batches and
// is killed with SIGKILL twice in the middle of a batch; each restart catches
// up again from its checkpoint. Every committed message is in Kafka once, in
// per-key order, none of those that must never be published; then the relay
// streams.
func TestCatchUpKilled(t *testing.T) {
	if sharedPG.Major() < 14 {
		t.Skipf("PostgreSQL %d has no pgoutput messages option", sharedPG.Major())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	f := newFixture(t, sharedPG, "catchup_killed", true)
	f.applyOutboxEmit(ctx, t)
	testenv.RequireLocalKafka(t, f.kafka)
	args := f.relayArgs("--messages-prefix", "outbox", "--catch-up-threshold-mib", "1", "--catch-up-batch", "900")
	r := newRelay(t, args)
	r.Start() // creates the slot
	r.WaitReady(30 * time.Second)
	r.Stop(10 * time.Second)

	conn := f.connect(ctx, t)
	behind := func() int64 {
		b, err := slotBehind(ctx, conn, f.slot)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// Each run is over the 1 MiB threshold behind when it starts, so that
	// each catches up. A backlog of 4 MiB leaves room for how far the two
	// killed runs get, which on a busy machine (the version matrix's) was
	// a third of a 1.5 MiB backlog each.
	mustCatchUp := func(run string) {
		if b := behind(); b < 1<<20 {
			t.Fatalf("the slot is %d bytes of WAL behind before %s, under the 1 MiB threshold: the runs before it read more of the backlog than the test allows for", b, run)
		}
	}
	w := newMessageWriter()
	written := 0
	for ; behind() < 4<<20; written += 1000 {
		if err := w.write(ctx, conn, written, 1000); err != nil {
			t.Fatal(err)
		}
	}
	for kill := 1; kill <= 2; kill++ {
		mustCatchUp(fmt.Sprintf("the run killed %d", kill))
		// Kafka takes this run's first two produce requests and holds the
		// rest, so the run is killed in a batch it has sent part of, however
		// fast the machine; what it held is appended once the run is dead, as
		// requests on the wire at a kill may be.
		release, held := testenv.HoldProduce(t, f.kafka, 2)
		r.Start()
		var batch float64
		testenv.Eventually(t, 60*time.Second, func() error {
			requireRunning(t, r, "while catching up")
			m, err := r.P.Scrape(ctx) // refused until the run serves metrics
			if err != nil {
				return err
			}
			published := 0.0
			for k, v := range m {
				if strings.HasPrefix(k, "cdc_relay_events_published_total") {
					published += v
				}
			}
			// Killed in a batch this run has sent part of.
			if batch = m["cdc_relay_catch_up_batches_total"]; m["cdc_relay_catching_up"] != 1 || batch < 1 || published == 0 || held() == 0 {
				return fmt.Errorf("catching_up %v, batches %v, published %v, produce requests held %d", m["cdc_relay_catching_up"], batch, published, held())
			}
			return nil
		})
		r.Kill()
		release()
		t.Logf("SIGKILL %d in catch-up batch %v of this run, %d records in Kafka", kill, batch, len(f.read(ctx, t)))
	}
	mustCatchUp("the last run")
	r.Start()
	r.WaitLog("caught up: switching to streaming", 90*time.Second)
	r.WaitReady(30 * time.Second)
	if err := w.write(ctx, conn, written, 100); err != nil { // streamed
		t.Fatal(err)
	}
	w.mu.Lock()
	ids, never := append([]string(nil), w.committed...), w.never
	w.mu.Unlock()
	f.waitRecords(ctx, t, len(ids), 90*time.Second)
	recs := f.read(ctx, t)
	t.Logf("%d messages committed, %d never to be published, %d records in Kafka, %d runs", len(ids), len(never), len(recs), r.Runs())
	checkOrderedOnce(t, recs, ids, never)
	requireRunning(t, r, "after delivering everything")
	r.Stop(10 * time.Second)
	if t.Failed() {
		t.Logf("relay logs:\n%s", relayproc.Tail(r.Logs(), 60))
	}
}
