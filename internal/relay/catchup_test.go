package relay_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// backlog commits txns transactions of perTxn events each while no relay
// runs, over keys k0..k(keys-1), each event's payload counting up per key
// ({"seq": n}), plus a rolled-back transaction and an UPDATE of an outbox
// row among them, which publish nothing. It returns how many events
// committed.
func (e *env) backlog(first, txns, perTxn, keys int, seq map[string]int) int {
	e.t.Helper()
	n := 0
	for i := first; i < first+txns; i++ {
		var sql strings.Builder
		sql.WriteString("BEGIN;")
		for j := 0; j < perTxn; j++ {
			key := fmt.Sprintf("k%d", (i*perTxn+j)%keys)
			seq[key]++
			n++
			fmt.Fprintf(&sql, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', '%s', 'E', '{"seq": %d, "fill": "%s"}');`,
				key, seq[key], strings.Repeat("x", 200))
		}
		sql.WriteString("COMMIT;")
		e.exec(sql.String())
		if i%97 == 0 {
			e.exec(`BEGIN; INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'k0', 'RolledBack', '{}'); ROLLBACK;`)
			e.exec(`UPDATE outbox_events SET event_type = 'Updated' WHERE ctid = (SELECT min(ctid) FROM outbox_events)`)
		}
	}
	return n
}

// checkExactlyOnceInOrder fails unless recs hold want events, each id once,
// none rolled back, and each key's seq counting up 1, 2, 3… in partition
// order.
func checkExactlyOnceInOrder(t *testing.T, recs []sandbox.Record, want int) {
	t.Helper()
	ids := map[string]int{}
	last := map[string]int{}
	for _, r := range recs {
		ids[r.Headers["id"]]++
		if r.Headers["event_type"] != "E" {
			t.Fatalf("record of event type %q published", r.Headers["event_type"])
		}
		var p struct{ Seq int }
		if err := json.Unmarshal(r.Value, &p); err != nil {
			t.Fatal(err)
		}
		k := string(r.Key)
		if p.Seq != last[k]+1 {
			t.Fatalf("key %s: seq %d after %d (partition %d offset %d): lost, duplicated or out of order", k, p.Seq, last[k], r.Partition, r.Offset)
		}
		last[k] = p.Seq
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("event %s in Kafka %d times", id, n)
		}
	}
	if len(recs) != want || len(ids) != want {
		t.Fatalf("%d records, %d distinct events, want %d", len(recs), len(ids), want)
	}
}

func switches(m *metrics.Metrics, to string) float64 {
	return testutil.ToFloat64(m.CatchUpSwitches.WithLabelValues(to))
}

// TestCatchUpDrainsBacklog: a relay that restarts behind by more than
// CatchUpThreshold reads the backlog in batches (several here), delivers it
// exactly once in commit order, logs and counts the switch to streaming, and
// then streams what comes after, with no gap at the switch.
func TestCatchUpDrainsBacklog(t *testing.T) {
	e := newEnv(t)
	e.start() // creates the slot, streams
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	seq := map[string]int{}
	n := e.backlog(0, 1500, 1, 40, seq)
	n += e.backlog(1500, 100, 7, 40, seq)
	e.cfgHook = func(c *relay.Config) {
		c.CatchUpThreshold = 1
		c.CatchUpBatch = 900 // about 300 one-event transactions
	}
	e.start()
	recs := e.waitRecords(n)
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := switches(e.m, metrics.StreamTo); got != 1 {
			return fmt.Errorf("switches to the stream = %v, want 1", got)
		}
		return nil
	})
	if got := switches(e.m, metrics.CatchUpTo); got != 1 {
		t.Errorf("switches to catch-up = %v, want 1", got)
	}
	if got := testutil.ToFloat64(e.m.CatchUpBatches); got < 4 {
		t.Errorf("catch-up batches = %v, want at least 4 (a backlog of %d events in batches of about 300 transactions)", got, n)
	}
	if got := testutil.ToFloat64(e.m.CatchingUp); got != 0 {
		t.Errorf("catching_up = %v after the switch, want 0", got)
	}
	// The switch is counted before the stream it switches to has started.
	testenv.Eventually(t, 30*time.Second, func() error {
		logs := e.logs.String()
		for _, want := range []string{"catching up in batches", "caught up: switching to streaming", "streaming started"} {
			if !strings.Contains(logs, want) {
				return fmt.Errorf("the logs lack %q", want)
			}
		}
		if strings.Index(logs, "caught up: switching to streaming") > strings.LastIndex(logs, "streaming started") {
			return errors.New("no stream started after the catch-up ended")
		}
		return nil
	})
	logs := e.logs.String()
	if from, to := strings.Index(logs, "catching up in batches"), strings.Index(logs, "caught up: switching to streaming"); from < to &&
		strings.Contains(logs[from:to], "streaming started") {
		t.Errorf("a stream started while the catch-up ran")
	}
	checkExactlyOnceInOrder(t, recs, n)

	// Streaming after the switch: what commits now arrives, after the backlog.
	n += e.backlog(1600, 50, 2, 40, seq)
	recs = e.waitRecords(n)
	checkExactlyOnceInOrder(t, recs, n)
	e.waitSlotConfirmed(e.currentLSN())
	if got := testutil.ToFloat64(e.m.CatchUpBatches); got > 40 {
		t.Errorf("catch-up batches = %v: the relay kept catching up instead of streaming", got)
	}
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestCatchUpOffStreams: with the threshold at 0 (the relay's zero value) a
// backlog is streamed: the catch-up path is off.
func TestCatchUpOffStreams(t *testing.T) {
	e := newEnv(t)
	e.start()
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	seq := map[string]int{}
	n := e.backlog(0, 200, 1, 10, seq)
	e.start()
	checkExactlyOnceInOrder(t, e.waitRecords(n), n)
	if got := switches(e.m, metrics.CatchUpTo) + testutil.ToFloat64(e.m.CatchUpBatches); got != 0 {
		t.Errorf("catch-up ran with the threshold at 0 (switches + batches = %v)", got)
	}
}

// TestCatchUpBatchCutByPostgresRestart: Postgres restarts (fast shutdown)
// while a batch is half read, with part of a multi-event transaction sent
// to Kafka: the relay catches up again from its checkpoint, the gate skips
// what Kafka already holds, and every event is in Kafka exactly once, in
// order.
func TestCatchUpBatchCutByPostgresRestart(t *testing.T) {
	testenv.RequireLocal(t, pg)
	e := newEnv(t)
	e.start()
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	seq := map[string]int{}
	n := e.backlog(0, 400, 5, 20, seq)
	release, held := testenv.HoldProduce(t, e.kafka, 0)
	e.cfgHook = func(c *relay.Config) {
		c.CatchUpThreshold = 1
		c.CatchUpBatch = 100_000 // one batch
		c.MaxInFlightBytes = 64 << 10
	}
	e.startNoWait()
	// The batch is read until the in-flight bound, then waits for Kafka.
	testenv.Eventually(t, 30*time.Second, func() error {
		if testutil.ToFloat64(e.m.CatchingUp) != 1 || held() == 0 || testutil.ToFloat64(e.m.CatchUpBatches) != 1 {
			return fmt.Errorf("catching_up %v, %d produce requests held, batches %v", testutil.ToFloat64(e.m.CatchingUp), held(), testutil.ToFloat64(e.m.CatchUpBatches))
		}
		return nil
	})
	if err := pg.Restart("fast"); err != nil {
		t.Fatalf("restart postgres: %v", err)
	}
	e.pool.Reset()
	release()
	recs := e.waitRecords(n)
	testenv.Eventually(t, 60*time.Second, func() error {
		if got := switches(e.m, metrics.StreamTo); got != 1 {
			return fmt.Errorf("switches to the stream = %v, want 1", got)
		}
		return nil
	})
	if got := switches(e.m, metrics.CatchUpTo); got < 2 {
		t.Errorf("switches to catch-up = %v, want 2 or more: the cut batch is read again", got)
	}
	if !strings.Contains(e.logs.String(), "catch-up failed") {
		t.Errorf("the logs do not say the catch-up failed")
	}
	e.waitSlotConfirmed(e.currentLSN())
	checkExactlyOnceInOrder(t, recs, n)
	checkExactlyOnceInOrder(t, e.readAll(), n)
	t.Logf("%d events; catch-up batches %v; the gate skipped %v events Kafka already held; %d produce requests held at the restart",
		n, testutil.ToFloat64(e.m.CatchUpBatches), testutil.ToFloat64(e.m.DuplicatesSuppressed), held())
}

// TestCatchUpStopsCleanly: SIGTERM (the context) during a catch-up batch
// stops at a transaction boundary, confirms what Kafka acknowledged, and a
// restart (streaming) delivers the rest without a duplicate.
func TestCatchUpStopsCleanly(t *testing.T) {
	e := newEnv(t)
	e.start()
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	seq := map[string]int{}
	n := e.backlog(0, 300, 3, 10, seq)
	release, held := testenv.HoldProduce(t, e.kafka, 0)
	e.cfgHook = func(c *relay.Config) {
		c.CatchUpThreshold = 1
		c.CatchUpBatch = 100_000
		c.MaxInFlightBytes = 32 << 10
	}
	e.startNoWait()
	testenv.Eventually(t, 30*time.Second, func() error {
		if testutil.ToFloat64(e.m.CatchingUp) != 1 || held() == 0 {
			return errors.New("not yet catching up with produce requests held")
		}
		return nil
	})
	// The stop is asked for while Kafka holds the batch's requests; Kafka
	// then answers while the relay stops, whose drain waits for them.
	e.cancel()
	release()
	if err := e.stop(); err != nil {
		t.Fatalf("stop during catch-up: %v", err)
	}
	mid := len(e.readAll())
	if mid == 0 || mid >= n {
		t.Logf("stopped with %d of %d events in Kafka", mid, n)
	}
	e.cfgHook = nil
	e.start()
	e.waitRecords(n)
	e.waitSlotConfirmed(e.currentLSN())
	checkExactlyOnceInOrder(t, e.readAll(), n)
}

// TestCatchUpPublicationDropped: the publication was dropped, rows
// committed, and it was created again while the relay was down, so the
// slot's WAL cannot be decoded past the drop with it (up to 17 the peek fails; 18 warns and would decode on
// without the outbox's rows). The catch-up stops the relay with the
// publication_dropped gap, as the stream does, and confirms nothing past
// the drop.
func TestCatchUpPublicationDropped(t *testing.T) {
	e := newEnv(t)
	e.start()
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	seq := map[string]int{}
	e.backlog(0, 30, 1, 10, seq)
	before := e.slotConfirmed()
	dropped := e.currentLSN()
	e.exec("DROP PUBLICATION cdc_relay_outbox")
	e.backlog(30, 300, 1, 10, seq) // in no publication
	e.exec("CREATE PUBLICATION cdc_relay_outbox FOR TABLE public.outbox_events WITH (publish = 'insert')")
	e.backlog(330, 50, 1, 10, seq)
	e.cfgHook = func(c *relay.Config) {
		c.CatchUpThreshold = 1
		c.CatchUpBatch = 300
	}
	e.startNoWait()
	var err error
	select {
	case err = <-e.done:
		e.cancel = nil
	case <-time.After(60 * time.Second):
		t.Fatalf("the relay did not stop\n%s", e.logs.String())
	}
	if err == nil || !strings.Contains(err.Error(), "was dropped while the relay was streaming") {
		t.Fatalf("Run = %v, want the publication_dropped gap", err)
	}
	var line string
	for _, l := range strings.Split(e.logs.String(), "\n") {
		if strings.Contains(l, `"catch-up failed"`) {
			line = l
		}
	}
	if line == "" {
		t.Errorf("the catch-up did not stop at the drop")
	}
	t.Logf("Run: %v; the catch-up: %s", err, line)
	if got := e.slotConfirmed(); got > dropped {
		t.Errorf("slot confirmed %s, past the drop at %s (it was at %s)", got, dropped, before)
	}
}

// TestCatchUpWhenTheStreamFallsBehind: a stream that falls behind the WAL by
// more than CatchUpThreshold, and does not gain on it (the broker holds
// every produce request while a backlog is written), ends at a transaction
// boundary and hands over to the catch-up, which reads the rest in batches
// and streams again: every event once, in order, with no gap at either
// switch.
func TestCatchUpWhenTheStreamFallsBehind(t *testing.T) {
	e := newEnv(t)
	e.cfgHook = func(c *relay.Config) {
		c.CatchUpThreshold = 64 << 10
		c.CatchUpBatch = 900 // about 300 one-event transactions
		c.MaxInFlightBytes = 32 << 10
	}
	e.start()
	seq := map[string]int{}
	n := e.backlog(0, 20, 1, 40, seq)
	checkExactlyOnceInOrder(t, e.waitRecords(n), n)
	catchUps, streams := switches(e.m, metrics.CatchUpTo), switches(e.m, metrics.StreamTo)

	release, held := testenv.HoldProduce(t, e.kafka, 0)
	n += e.backlog(20, 500, 1, 40, seq)
	// Two checks lagPoll (5 s) apart see it behind.
	testenv.Eventually(t, 60*time.Second, func() error {
		if !strings.Contains(e.logs.String(), "the stream fell") {
			return fmt.Errorf("the relay does not say the stream fell behind; %d produce requests held", held())
		}
		return nil
	})
	// Commits while the stream waits for Kafka: once Kafka answers, the
	// stream ends at the first transaction boundary (not when its read
	// times out: before, it read on through what its socket held), and
	// the catch-up reads the rest.
	n += e.backlog(520, 1500, 1, 40, seq)
	if got := switches(e.m, metrics.CatchUpTo); got != catchUps {
		t.Errorf("switches to catch-up = %v before Kafka acknowledged what the stream sent, want %v", got, catchUps)
	}
	release()
	recs := e.waitRecords(n)
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := switches(e.m, metrics.StreamTo); got != streams+1 {
			return fmt.Errorf("switches to the stream = %v, want %v", got, streams+1)
		}
		return nil
	})
	if got := switches(e.m, metrics.CatchUpTo); got != catchUps+1 {
		t.Errorf("switches to catch-up = %v, want %v", got, catchUps+1)
	}
	if got := testutil.ToFloat64(e.m.CatchUpBatches); got < 2 {
		t.Errorf("catch-up batches = %v, want 2 or more (about 1,500 one-event transactions left, in batches of about 300)", got)
	}
	logs := e.logs.String()
	fell := strings.Index(logs, "the stream fell")
	for _, want := range []string{"catching up in batches", "caught up: switching to streaming"} {
		if i := strings.Index(logs, want); i < fell {
			t.Errorf("%q is not logged after the stream fell behind", want)
		}
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		logs := e.logs.String()
		if caught := strings.LastIndex(logs, "caught up: switching to streaming"); strings.LastIndex(logs, "streaming started") < caught {
			return errors.New("the stream did not start again after the catch-up")
		}
		return nil
	})
	checkExactlyOnceInOrder(t, recs, n)

	// Streaming again: what commits now arrives after the backlog.
	n += e.backlog(2020, 30, 2, 40, seq)
	checkExactlyOnceInOrder(t, e.waitRecords(n), n)
	e.waitSlotConfirmed(e.currentLSN())
	t.Logf("%d events; %d produce requests held while the stream fell behind; catch-up batches %v", n, held(), testutil.ToFloat64(e.m.CatchUpBatches))
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
}
