package relay_test

// Tests of a table that joins the publication of an existing slot (issue 42
// points 3, 4): the join never holds up the application, survives a failure
// or a crash, and publishes what --join says.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/outboxtable"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// joinTable is the outbox table that joins.
const joinTable = "public.outbox_b"

// beforeJoin creates joinTable, runs the relay over outbox_events alone until
// it has published one row and stored its checkpoint, and stops it: the slot
// exists, and joinTable is outside the publication.
func (e *env) beforeJoin() {
	e.t.Helper()
	e.exec(`CREATE TABLE ` + joinTable + ` (LIKE public.outbox_events INCLUDING ALL)`)
	e.beforeJoinCreated()
}

// insertB commits n rows into joinTable in one transaction and returns
// their ids.
func (e *env) insertB(n int) []string {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `INSERT INTO `+joinTable+` (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'k' || (g % 4), 'Created', jsonb_build_object('n', g) FROM generate_series(1, $1) g RETURNING id::text`, n)
	if err != nil {
		e.t.Fatal(err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// joining makes the relay read joinTable beside outbox_events, publishing a
// join through wrap(the command line's Joiner), then more.
func (e *env) joining(wrap func(relay.Joiner) relay.Joiner, more func(*relay.Config)) {
	e.cfgHook = func(c *relay.Config) {
		c.Decoder.Also = []decoder.Config{{Schema: "public", Table: "outbox_b", Columns: decoder.DefaultColumns()}}
		rp := outboxtable.Republisher{DeadLetterStore: deadletter.NewStore(e.relayPool, deadletter.DefaultTable),
			Sink: sink.Config{Brokers: c.Sink.Brokers}, Wait: 3 * time.Second, Component: "join", Actor: "test", Log: c.Logger, Names: c.Names}
		for _, d := range append([]decoder.Config{c.Decoder}, c.Decoder.Also...) {
			rp.Tables = append(rp.Tables, outboxtable.TableReplay{Table: decoder.TableName{Schema: d.Schema, Table: d.Table},
				Columns: outboxtable.ColumnsOf(d), Topic: c.Topic})
		}
		c.Join = rp
		if wrap != nil {
			c.Join = wrap(rp)
		}
		if more != nil {
			more(c)
		}
	}
}

// inPublication reports whether joinTable is in the relay's publication.
func (e *env) inPublication() bool {
	e.t.Helper()
	var ok bool
	if err := e.pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_publication_tables
		WHERE pubname = 'cdc_relay_outbox' AND schemaname = 'public' AND tablename = 'outbox_b')`).Scan(&ok); err != nil {
		e.t.Fatal(err)
	}
	return ok
}

// checkOnce checks that every id of want is among recs exactly once, and
// returns how many records of want's ids came more than once.
func checkOnce(t *testing.T, recs []sandbox.Record, want []string) (dups int) {
	t.Helper()
	seen := map[string]int{}
	for _, r := range recs {
		seen[r.Headers["id"]]++
	}
	missing := 0
	for _, id := range want {
		switch n := seen[id]; {
		case n == 0:
			missing++
		case n > 1:
			dups += n - 1
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d rows never reached Kafka", missing, len(want))
	}
	return dups
}

// TestJoinDoesNotHoldUpInserts: while a table of 20k rows joins and Kafka
// is down, the application's inserts into it complete at once (within 1 s,
// each); the relay stops, and its next start, with Kafka back, publishes
// every row once, those inserted during the failed join included.
func TestJoinDoesNotHoldUpInserts(t *testing.T) {
	e := newEnv(t)
	e.beforeJoin()
	want := e.insertB(20000)
	e.joining(nil, nil)
	e.kafka.Stop()

	e.startNoWait()
	var mu sync.Mutex
	var slowest time.Duration
	var inserted []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			began := time.Now()
			var id string
			err := e.pool.QueryRow(context.Background(), `INSERT INTO `+joinTable+` (aggregate_type, aggregate_id, event_type, payload)
				VALUES ('order', 'k0', 'Created', '{}') RETURNING id::text`).Scan(&id)
			took := time.Since(began)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			slowest, inserted = max(slowest, took), append(inserted, id)
			mu.Unlock()
		}
	}()
	err := e.waitStopped(60 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("the relay stopped with Kafka down: %v", err)
	if err == nil {
		t.Fatal("the relay ran with Kafka down")
	}
	t.Logf("%d inserts during the join, the slowest took %s", len(inserted), slowest)
	if slowest > time.Second {
		t.Errorf("an insert into the joining table took %s while the join ran with Kafka down, want < 1s", slowest)
	}
	if !e.inPublication() {
		t.Fatal("the table did not join the publication")
	}

	if err := e.kafka.Start(); err != nil {
		t.Fatal(err)
	}
	e.start()
	want = append(want, inserted...)
	recs := e.waitRecords(1 + len(want))
	if dups := checkOnce(t, recs, want); dups > 0 {
		t.Errorf("%d rows published twice", dups)
	}
}

// TestJoinFailureAfterCommit: a start that fails right after the join
// committed (the stream's producer does not open) is followed by one that
// starts, without table_joined, and publishes every row of the table once.
func TestJoinFailureAfterCommit(t *testing.T) {
	e := newEnv(t)
	e.beforeJoin()
	want := e.insertB(50)
	e.joining(nil, func(c *relay.Config) {
		c.OpenProducer = func(context.Context, sink.Config) (relay.Producer, error) {
			return nil, errors.New("the producer does not open")
		}
	})
	e.startNoWait()
	if err := e.waitStopped(60 * time.Second); err == nil || !strings.Contains(err.Error(), "the producer does not open") {
		t.Fatalf("Run = %v, want the producer's failure", err)
	}
	if !e.inPublication() {
		t.Fatal("the table did not join the publication")
	}
	e.joining(nil, nil)
	e.start()
	want = append(want, e.insertB(5)...)
	recs := e.waitRecords(1 + len(want))
	if dups := checkOnce(t, recs, want); dups > 0 {
		t.Errorf("%d rows published twice", dups)
	}
}

// stopAfter is a Joiner that cancels the relay once n rows of the join
// were produced to Kafka: a crash midway.
type stopAfter struct {
	relay.Joiner
	e *env
	n int64
}

func (s stopAfter) Publish(ctx context.Context, db outboxtable.Querier, p outboxtable.Pass) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var produced atomic.Int64
	c := s.e.kafka.Cluster()
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, t := range req.(*kmsg.ProduceRequest).Topics {
			for _, part := range t.Partitions {
				var b kmsg.RecordBatch
				if b.ReadFrom(part.Records) == nil && produced.Add(int64(b.NumRecords)) >= s.n {
					cancel()
				}
			}
		}
		return nil, nil, false
	})
	return s.Joiner.Publish(ctx, db, p)
}

// TestJoinResumesAfterACrash: a join cut short after some batches Kafka
// acknowledged resumes on the next start after the stored position: no row
// is lost, and none before the position is published again (at most the
// batch in flight at the crash, outboxtable.RepublishBatch rows, arrives
// twice).
func TestJoinResumesAfterACrash(t *testing.T) {
	e := newEnv(t)
	e.beforeJoin()
	want := e.insertB(3000)
	// Cut in the third batch: two are acknowledged and stored.
	e.joining(func(j relay.Joiner) relay.Joiner {
		return stopAfter{Joiner: j, e: e, n: 2*outboxtable.RepublishBatch + outboxtable.RepublishBatch/2}
	}, nil)
	e.startNoWait()
	err := e.waitStopped(60 * time.Second)
	t.Logf("the join was cut short: %v", err)
	if err == nil {
		t.Fatal("the relay started although its join was cut short")
	}
	before := len(e.readAll()) - 1
	var pending string
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(pending_joins::text, '') FROM cdc_relay_checkpoints WHERE slot_name = $1`, e.slot).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rows in Kafka at the crash; the stored join in progress: %.300s", before, pending)

	e.joining(nil, nil)
	e.start()
	recs := e.waitRecords(1 + len(want))
	dups := checkOnce(t, recs, want)
	t.Logf("%d rows published twice", dups)
	if dups > outboxtable.RepublishBatch {
		t.Errorf("%d rows published twice after a crash with %d in Kafka, want at most the batch in flight (%d)", dups, before, outboxtable.RepublishBatch)
	}
	if !strings.Contains(e.logs.String(), "resuming after the rows") {
		t.Error("the start after the crash did not say it resumes the join")
	}
	var left string
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(pending_joins::text, '') FROM cdc_relay_checkpoints WHERE slot_name = $1`, e.slot).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != "" {
		t.Errorf("the join is still in progress after it completed: %s", left)
	}
}

// TestJoinModes: --join none publishes no row committed before the join and
// says how many there are; after-checkpoint publishes the rows committed
// since the stored checkpoint, and refuses to join without
// track_commit_timestamp.
func TestJoinModes(t *testing.T) {
	t.Run("none", func(t *testing.T) {
		e := newEnv(t)
		e.beforeJoin()
		e.insertB(10)
		e.joining(nil, func(c *relay.Config) { c.JoinMode = relay.JoinNone })
		e.start()
		want := e.insertB(2)
		// The join publishes before the relay is ready: what it published
		// is in Kafka now, before the rows streamed after.
		e.waitRecords(1 + len(want))
		recs := e.readAll()
		if len(recs) != 1+len(want) {
			t.Errorf("%d records, want %d: the join published rows committed before it", len(recs), 1+len(want))
		}
		checkOnce(t, recs, want)
		for _, s := range []string{`"unpublished":10`, "without publishing the 10 rows", "(command replay table=public.outbox_b"} {
			if !strings.Contains(e.logs.String(), s) {
				t.Errorf("the log lacks %q", s)
			}
		}
	})
	t.Run("after-checkpoint", func(t *testing.T) {
		p := testenv.NewPostgres(t, sandbox.PGOptions{Settings: map[string]string{"track_commit_timestamp": "on"}})
		e := newEnvOn(t, p)
		e.exec(`CREATE TABLE ` + joinTable + ` (LIKE public.outbox_events INCLUDING ALL)`)
		old := e.insertB(5)
		e.beforeJoinCreated()
		want := e.insertB(7)
		e.joining(nil, func(c *relay.Config) { c.JoinMode = relay.JoinAfterCheckpoint })
		e.start()
		e.waitRecords(1 + len(want))
		recs := e.readAll()
		checkOnce(t, recs, want)
		for _, r := range recs {
			for _, id := range old {
				if r.Headers["id"] == id {
					t.Errorf("row %s, committed before the checkpoint, was published", id)
				}
			}
		}
		if !strings.Contains(e.logs.String(), `"events":7`) {
			t.Error("the start-up log does not say the join publishes 7 rows")
		}
	})
	t.Run("after-checkpoint without commit timestamps", func(t *testing.T) {
		e := newEnv(t)
		e.beforeJoin()
		e.insertB(3)
		e.joining(nil, func(c *relay.Config) { c.JoinMode = relay.JoinAfterCheckpoint })
		e.startNoWait()
		err := e.waitStopped(60 * time.Second)
		wantConfigError(t, err, "track_commit_timestamp = on", "(setting JoinMode)")
		if e.inPublication() {
			t.Error("the table joined the publication although the join was refused")
		}
	})
}

// beforeJoinCreated is beforeJoin with joinTable already created.
func (e *env) beforeJoinCreated() {
	e.t.Helper()
	e.start()
	e.exec(`INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'a', 'Created', '{}')`)
	e.waitRecords(1)
	if err := e.stop(); err != nil {
		e.t.Fatal(err)
	}
}
