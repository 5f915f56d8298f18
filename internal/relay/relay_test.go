package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/setting"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// pg is the package's shared cluster; every test uses its own database and slot.
var pg *sandbox.Postgres

func TestMain(m *testing.M) {
	ctx := context.Background()
	var err error
	pg, err = sandbox.StartPostgres(ctx, sandbox.PGOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start postgres:", err)
		os.Exit(1)
	}
	code := m.Run()
	pg.Close()
	os.Exit(code)
}

// env is one test's database, broker and relay.
type env struct {
	t       *testing.T
	db      string
	url     string
	pool    *pgxpool.Pool
	kafka   *sandbox.Kafka
	topic   string
	reg     *prometheus.Registry
	m       *metrics.Metrics
	logs    *sandbox.Buffer
	cancel  context.CancelFunc
	done    chan error
	relay   *relay.Relay
	slot    string
	cfgHook func(*relay.Config)

	// relayURL is the relay's PGURL (url unless setRelayURL changed it) and
	// relayPool its pool (relay.OpenPool, Config.Pool), opened once per
	// test, so that the stores a test builds for the relay exist before the
	// relay does.
	relayURL  string
	relayPool *pgxpool.Pool
}

// setRelayURL makes the relay connect with url (the test's database with
// other connection parameters): it opens the relay's pool for it. Call it
// before building stores over e.relayPool.
func (e *env) setRelayURL(url string) {
	e.t.Helper()
	pool, err := relay.OpenPool(context.Background(), url, setting.Namer{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = e.stop() // the relay stops before its pool closes, as Run's caller closes it
		pool.Close()
	})
	e.relayURL, e.relayPool = url, pool
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvOn(t, pg)
}

// newEnvOn is newEnv on cluster pg rather than the package's.
func newEnvOn(t *testing.T, pg *sandbox.Postgres) *env {
	t.Helper()
	ctx := context.Background()
	db := strings.ToLower(strings.NewReplacer("/", "_", "-", "_").Replace(t.Name()))
	if len(db) > 40 { // slot and database names are limited to 63 bytes
		db = fmt.Sprintf("%s_%08x", db[:30], crc32.ChecksumIEEE([]byte(db)))
	}
	url, err := pg.CreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"001_outbox.sql", "002_checkpoints.sql"} {
		sql, err := os.ReadFile(filepath.Join("..", "..", "migrations", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := pg.Exec(ctx, db, string(sql)); err != nil {
			t.Fatalf("apply %s: %v", f, err)
		}
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := &env{
		t: t, db: db, url: url, pool: pool,
		kafka: testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4}),
		topic: "outbox.events",
		slot:  "slot_" + db,
		logs:  &sandbox.Buffer{},
	}
	t.Cleanup(func() {
		e.stop()
		if t.Failed() {
			t.Logf("relay logs:\n%s", e.logs.String())
		}
		// Drop the slot so the shared cluster does not retain WAL for it.
		_ = pg.Exec(context.Background(), db, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", e.slot)
	})
	e.setRelayURL(url)
	return e
}

func (e *env) config() relay.Config {
	e.reg = prometheus.NewRegistry()
	e.m = metrics.New(e.reg)
	cfg := relay.Config{
		PGURL:       e.relayURL,
		Slot:        e.slot,
		Publication: "cdc_relay_outbox",
		Decoder: decoder.Config{
			Schema: "public", Table: "outbox_events", Columns: decoder.DefaultColumns(),
			// Every relay test runs with recycled events poisoned: a stage
			// that reads an event after its done reads garbage (issue 43).
			PoisonRecycled: true,
		},
		Topic:             e.topic,
		CreateSlot:        true,
		CreatePublication: true,
		Sink: sink.Config{
			Brokers: e.kafka.Brokers(),
		},
		Pool:            e.relayPool,
		Checkpoints:     checkpoint.NewTableStore(e.relayPool, "public.cdc_relay_checkpoints"),
		RelayName:       "test",
		StatusInterval:  100 * time.Millisecond,
		IdleCheckpoint:  200 * time.Millisecond,
		ShutdownTimeout: 10 * time.Second,
		KafkaStartWait:  10 * time.Second,
		Retry:           backoff.Policy{Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond},
		Logger:          zerolog.New(e.logs).With().Timestamp().Logger(),
		Metrics:         e.m,
	}
	if e.cfgHook != nil {
		e.cfgHook(&cfg)
	}
	return cfg
}

// start runs the relay in the background and waits until it is ready.
func (e *env) start() {
	e.t.Helper()
	e.startNoWait()
	e.waitReady()
}

func (e *env) startNoWait() {
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	e.done = make(chan error, 1)
	e.relay = relay.New(e.config())
	r := e.relay
	go func() { e.done <- r.Run(ctx) }()
}

func (e *env) waitReady() {
	e.t.Helper()
	testenv.Eventually(e.t, 30*time.Second, func() error {
		select {
		case err := <-e.done:
			e.t.Fatalf("relay stopped before it was ready: %v\n%s", err, e.logs.String())
		default:
		}
		if !e.relay.Ready() {
			return fmt.Errorf("relay not ready\n%s", e.logs.String())
		}
		return nil
	})
}

// stop stops the relay cleanly and returns Run's error.
func (e *env) stop() error {
	if e.cancel == nil {
		return nil
	}
	e.cancel()
	e.cancel = nil
	select {
	case err := <-e.done:
		return err
	case <-time.After(20 * time.Second):
		e.t.Errorf("relay did not stop within 20s")
		return nil
	}
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	for attempt := 1; ; attempt++ {
		_, err := e.pool.Exec(context.Background(), sql, args...)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "40P01" && attempt < 5 {
			// The DDL of a partition test can deadlock with the relay's
			// catalog reads; Postgres rolled the statements back: again,
			// as any client does.
			continue
		}
		if err != nil {
			e.t.Fatalf("exec %q: %v", sql, err)
		}
		return
	}
}

// tx runs statements in one transaction.
func (e *env) tx(fn func(tx pgx.Tx) error) {
	e.t.Helper()
	if err := pgx.BeginFunc(context.Background(), e.pool, fn); err != nil {
		e.t.Fatalf("transaction: %v", err)
	}
}

const insertSQL = `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4) RETURNING id::text`

func insert(tx pgx.Tx, aggType, aggID, evType, payload string) (string, error) {
	var id string
	err := tx.QueryRow(context.Background(), insertSQL, aggType, aggID, evType, payload).Scan(&id)
	return id, err
}

func (e *env) waitRecords(n int, topics ...string) []sandbox.Record {
	e.t.Helper()
	if len(topics) == 0 {
		topics = []string{e.topic}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	recs, err := sandbox.WaitForRecords(ctx, e.kafka.Brokers(), n, topics...)
	if err != nil {
		e.t.Fatalf("wait for %d records: got %d: %v\n%s", n, len(recs), err, e.logs.String())
	}
	return recs
}

// readAll returns what is in the topics now.
func (e *env) readAll(topics ...string) []sandbox.Record {
	e.t.Helper()
	if len(topics) == 0 {
		topics = []string{e.topic}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := sandbox.ReadAll(ctx, e.kafka.Brokers(), topics...)
	if err != nil {
		e.t.Fatal(err)
	}
	return recs
}

func (e *env) slotConfirmed() pglogrepl.LSN {
	e.t.Helper()
	var s string
	if err := e.pool.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", e.slot).Scan(&s); err != nil {
		e.t.Fatalf("read slot: %v", err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		e.t.Fatal(err)
	}
	return lsn
}

// waitSlotConfirmed waits until the slot's confirmed_flush_lsn is at or past
// target. The relay confirms only what Kafka acknowledged, with everything
// before it, so this is also how a test knows the relay is done with all it
// read below target.
func (e *env) waitSlotConfirmed(target pglogrepl.LSN) {
	e.t.Helper()
	testenv.Eventually(e.t, 30*time.Second, func() error {
		if got := e.slotConfirmed(); got < target {
			return fmt.Errorf("slot confirmed %s, want >= %s", got, target)
		}
		return nil
	})
}

// commitLSN returns the commit LSN of the record whose id header is id.
func commitLSN(t *testing.T, recs []sandbox.Record, id string) pglogrepl.LSN {
	t.Helper()
	for _, r := range recs {
		if r.Headers["id"] == id {
			lsn, err := pglogrepl.ParseLSN(r.Headers["commit_lsn"])
			if err != nil {
				t.Fatalf("record %s: commit_lsn header %q: %v", id, r.Headers["commit_lsn"], err)
			}
			return lsn
		}
	}
	t.Fatalf("no record with id %s", id)
	return 0
}

func (e *env) currentLSN() pglogrepl.LSN {
	e.t.Helper()
	var s string
	if err := e.pool.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		e.t.Fatal(err)
	}
	lsn, _ := pglogrepl.ParseLSN(s)
	return lsn
}

// TestOnlyCommittedOutboxInsertsArePublished covers DESIGN invariant 2 and the
// message format: key, value, headers.
func TestOnlyCommittedOutboxInsertsArePublished(t *testing.T) {
	e := newEnv(t)
	e.exec("CREATE TABLE orders (id serial PRIMARY KEY, note text)")
	e.start()

	var want []string // ids expected in Kafka, in commit order
	// 1. A committed transaction: business row + two events.
	e.tx(func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), "INSERT INTO orders (note) VALUES ('a')"); err != nil {
			return err
		}
		for _, p := range []string{`{"n": 1}`, `{"n": 2, "name": "Zoë ✓"}`} {
			id, err := insert(tx, "order", "o-1", "OrderPlaced", p)
			if err != nil {
				return err
			}
			want = append(want, id)
		}
		return nil
	})
	// 2. A rolled-back transaction.
	tx, err := e.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := insert(tx, "order", "o-rollback", "Nope", `{"rolled": "back"}`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	// 3. A committed transaction with a rolled-back savepoint in the middle, and a
	//    row deleted in the same transaction (the WAL still has its insert).
	e.tx(func(tx pgx.Tx) error {
		id, err := insert(tx, "order", "o-2", "Kept", `{"n": 3}`)
		if err != nil {
			return err
		}
		want = append(want, id)
		if _, err := tx.Exec(context.Background(), "SAVEPOINT s1"); err != nil {
			return err
		}
		if _, err := insert(tx, "order", "o-2", "InSavepoint", `{"savepoint": "rolled back"}`); err != nil {
			return err
		}
		if _, err := tx.Exec(context.Background(), "ROLLBACK TO SAVEPOINT s1"); err != nil {
			return err
		}
		id, err = insert(tx, "order", "o-2", "DeletedRightAway", `{"n": 4}`)
		if err != nil {
			return err
		}
		want = append(want, id)
		_, err = tx.Exec(context.Background(), "DELETE FROM outbox_events WHERE id = $1", id)
		return err
	})
	// 4. Other tables only, and UPDATE/DELETE/TRUNCATE of the outbox.
	e.exec("INSERT INTO orders (note) VALUES ('b')")
	e.exec("UPDATE outbox_events SET event_type = 'Changed'")
	e.exec("DELETE FROM outbox_events WHERE event_type = 'Changed' AND aggregate_id = 'o-1'")
	e.exec("TRUNCATE outbox_events")
	// 5. A final marker event, so we know everything before it was processed.
	e.tx(func(tx pgx.Tx) error {
		id, err := insert(tx, "customer", "c-9", "Marker", `{"last": true}`)
		want = append(want, id)
		return err
	})

	// Once the slot is confirmed past the marker's transaction, Kafka has
	// acknowledged everything the relay published before it: a wrongly
	// published extra would be in the topic now.
	e.waitSlotConfirmed(commitLSN(t, e.waitRecords(len(want)), want[len(want)-1]) + 1)
	recs := e.readAll()
	if len(recs) != len(want) {
		for _, r := range recs {
			t.Logf("got %s key=%s type=%s value=%s", r.Headers["id"], r.Key, r.Headers["event_type"], r.Value)
		}
		t.Fatalf("got %d records, want exactly %d", len(recs), len(want))
	}
	byID := map[string]sandbox.Record{}
	for _, r := range recs {
		byID[r.Headers["id"]] = r
	}
	wantVals := []struct{ key, typ, aggType, value string }{
		{"o-1", "OrderPlaced", "order", `{"n": 1}`},
		{"o-1", "OrderPlaced", "order", `{"n": 2, "name": "Zoë ✓"}`},
		{"o-2", "Kept", "order", `{"n": 3}`},
		{"o-2", "DeletedRightAway", "order", `{"n": 4}`},
		{"c-9", "Marker", "customer", `{"last": true}`},
	}
	for i, id := range want {
		r, ok := byID[id]
		if !ok {
			t.Fatalf("event %d (%s) missing", i, id)
		}
		w := wantVals[i]
		if string(r.Key) != w.key || string(r.Value) != w.value || r.Headers["event_type"] != w.typ || r.Headers["aggregate_type"] != w.aggType {
			t.Errorf("event %d: key=%s value=%s type=%s aggType=%s, want %+v", i, r.Key, r.Value, r.Headers["event_type"], r.Headers["aggregate_type"], w)
		}
		if _, err := pglogrepl.ParseLSN(r.Headers["commit_lsn"]); err != nil {
			t.Errorf("event %d: commit_lsn header %q: %v", i, r.Headers["commit_lsn"], err)
		}
		ct, err := time.Parse(time.RFC3339Nano, r.Headers["commit_time"])
		if err != nil || time.Since(ct) > time.Minute || time.Since(ct) < 0 {
			t.Errorf("event %d: commit_time header %q (%v)", i, r.Headers["commit_time"], err)
		}
	}
	// Both events of the first transaction share its commit LSN; the later
	// transaction's is greater.
	l1, _ := pglogrepl.ParseLSN(byID[want[0]].Headers["commit_lsn"])
	l2, _ := pglogrepl.ParseLSN(byID[want[1]].Headers["commit_lsn"])
	l3, _ := pglogrepl.ParseLSN(byID[want[2]].Headers["commit_lsn"])
	if l1 != l2 || l3 <= l1 {
		t.Errorf("commit_lsn headers: %s, %s, %s; want equal within a transaction and increasing across", l1, l2, l3)
	}
	if got := testutil.ToFloat64(e.m.EventsPublished.WithLabelValues(e.topic)); got != float64(len(want)) {
		t.Errorf("events_published_total = %v, want %d", got, len(want))
	}
	if err := e.stop(); err != nil {
		t.Fatalf("clean stop: %v", err)
	}
}

// TestPerAggregateOrder commits 10,000 events over 500 aggregates from four
// concurrent writers (each owning its aggregates, so per-aggregate commit order
// is known) and checks Kafka has each aggregate's events in that order.
func TestPerAggregateOrder(t *testing.T) {
	e := newEnv(t)
	e.cfgHook = func(c *relay.Config) {
		c.Sink.BatchMaxEvents = 50 // many batches per partition
	}
	e.start()
	const writers, aggsPerWriter, perAgg = 4, 125, 20 // 10,000 events
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			ctx := context.Background()
			seq := make([]int, aggsPerWriter)
			for n := 0; n < aggsPerWriter*perAgg; {
				size := 1 + (n*7+w)%25 // transactions of 1..25 events
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					batch := &pgx.Batch{}
					for i := 0; i < size && n+i < aggsPerWriter*perAgg; i++ {
						a := (n + i) % aggsPerWriter
						seq[a]++
						agg := fmt.Sprintf("w%d-a%d", w, a)
						batch.Queue("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', $1, 'E', $2)",
							agg, fmt.Sprintf(`{"seq": %d}`, seq[a]))
					}
					return tx.SendBatch(ctx, batch).Close()
				})
				if err != nil {
					errs <- err
					return
				}
				n += size
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	recs := e.waitRecords(writers * aggsPerWriter * perAgg)
	if len(recs) != writers*aggsPerWriter*perAgg {
		t.Fatalf("got %d records, want %d", len(recs), writers*aggsPerWriter*perAgg)
	}
	last := map[string]int{}
	part := map[string]int32{}
	for _, r := range recs { // ReadAll orders each partition by offset
		var p struct{ Seq int }
		if err := json.Unmarshal(r.Value, &p); err != nil {
			t.Fatal(err)
		}
		k := string(r.Key)
		if pp, ok := part[k]; ok && pp != r.Partition {
			t.Fatalf("key %s on partitions %d and %d", k, pp, r.Partition)
		}
		part[k] = r.Partition
		if p.Seq != last[k]+1 {
			t.Fatalf("key %s: seq %d after %d (offset %d)", k, p.Seq, last[k], r.Offset)
		}
		last[k] = p.Seq
	}
	if len(last) != writers*aggsPerWriter {
		t.Fatalf("%d aggregates seen, want %d", len(last), writers*aggsPerWriter)
	}
	if got := testutil.ToFloat64(e.m.ProduceBatches); got < 20 {
		t.Errorf("only %v produce batches; the test wants many batches per partition", got)
	}
}

// TestLargeEventsKeepTheirBytes streams events large enough that the decoder
// reuses the value buffers of acknowledged ones (decoder.Recycle), with a
// read-ahead bound of a few events, so that buffers come back while others
// are in flight: every record must hold exactly its own row's bytes.
func TestLargeEventsKeepTheirBytes(t *testing.T) {
	e := newEnv(t)
	e.cfgHook = func(c *relay.Config) {
		c.MaxInFlightBytes = 1 << 20
		c.Sink.BatchMaxEvents = 4
	}
	e.start()
	const n = 300
	payload := func(i int) string {
		size := (16 + i%4*12) << 10 // four sizes, each reusing its own buffers
		return fmt.Sprintf(`{"n": %d, "fill": "%s"}`, i, strings.Repeat(string(rune('a'+i%26)), size))
	}
	ctx := context.Background()
	for i := 0; i < n; i += 3 { // a few events per transaction, some alone
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			for j := i; j < min(i+1+i%3, n); j++ {
				if _, err := tx.Exec(ctx, "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', $1, 'E', $2)",
					fmt.Sprintf("agg-%d", j%7), payload(j)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	want := 0
	for i := 0; i < n; i += 3 {
		want += min(i+1+i%3, n) - i
	}
	recs := e.waitRecords(want)
	if len(recs) != want {
		t.Fatalf("got %d records, want %d", len(recs), want)
	}
	seen := make(map[int]bool)
	for _, r := range recs {
		var p struct{ N int }
		if err := json.Unmarshal(r.Value, &p); err != nil {
			t.Fatalf("record at %d/%d: %v", r.Partition, r.Offset, err)
		}
		var got, exp any
		if err := json.Unmarshal([]byte(payload(p.N)), &exp); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(r.Value, &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, exp) {
			t.Fatalf("record of event %d (%d bytes) does not hold its row's payload", p.N, len(r.Value))
		}
		if k := fmt.Sprintf("agg-%d", p.N%7); string(r.Key) != k {
			t.Fatalf("record of event %d has key %q, want %q", p.N, r.Key, k)
		}
		if seen[p.N] {
			t.Fatalf("event %d published twice", p.N)
		}
		seen[p.N] = true
	}
}

// TestRelationChangeMidStream adds a column to the outbox while streaming.
func TestRelationChangeMidStream(t *testing.T) {
	e := newEnv(t)
	e.cfgHook = func(c *relay.Config) {
		c.Decoder.HeaderColumns = map[string]string{"tenant": "tenant"}
	}
	e.exec("ALTER TABLE outbox_events ADD COLUMN tenant text")
	e.start()
	e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, tenant) VALUES ('t', 'k', 'Before', '{}', 'acme')")
	e.waitRecords(1)
	e.exec("ALTER TABLE outbox_events ADD COLUMN trace_id text, ALTER COLUMN tenant SET DEFAULT 'dflt'")
	e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, trace_id) VALUES ('t', 'k', 'After', '{\"x\": 1}', 'tr-1')")
	e.exec("ALTER TABLE outbox_events DROP COLUMN trace_id")
	e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, tenant) VALUES ('t', 'k', 'AfterDrop', '{}', NULL)")
	recs := e.waitRecords(3)
	want := []struct{ typ, tenant string }{{"Before", "acme"}, {"After", "dflt"}, {"AfterDrop", ""}}
	for i, w := range want {
		if recs[i].Headers["event_type"] != w.typ || recs[i].Headers["tenant"] != w.tenant {
			t.Errorf("record %d: type=%q tenant=%q, want %+v", i, recs[i].Headers["event_type"], recs[i].Headers["tenant"], w)
		}
	}
	if !e.relay.Ready() {
		t.Error("relay not ready after the relation changes")
	}
}

// TestIdleOutboxAdvancesSlot: other tables are written, the outbox is not; the
// slot's confirmed_flush_lsn must still move forward (DESIGN invariant 4).
func TestIdleOutboxAdvancesSlot(t *testing.T) {
	e := newEnv(t)
	e.exec("CREATE TABLE busy (id serial PRIMARY KEY, v text)")
	e.start()
	before := e.slotConfirmed()
	for i := 0; i < 50; i++ {
		e.exec("INSERT INTO busy (v) SELECT repeat('x', 1000) FROM generate_series(1, 20)")
	}
	target := e.currentLSN()
	t.Logf("confirmed_flush_lsn %s before the writes, waiting for %s", before, target)
	e.waitSlotConfirmed(target)
	// The checkpoint store moves with it, and never behind the slot.
	var stored string
	if err := e.pool.QueryRow(context.Background(), "SELECT lsn::text FROM cdc_relay_checkpoints WHERE slot_name = $1", e.slot).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	sl, _ := pglogrepl.ParseLSN(stored)
	if sl < target {
		t.Errorf("stored checkpoint %s behind %s", sl, target)
	}
	if recs := e.readAll(); len(recs) != 0 {
		t.Errorf("idle outbox published %d records", len(recs))
	}
}

// TestCleanStopThenRestartRedeliversNothing stops the relay (as SIGTERM does) and
// restarts it: the store and the slot are at the last event, nothing repeats.
func TestCleanStopThenRestartRedeliversNothing(t *testing.T) {
	e := newEnv(t)
	e.start()
	for i := 0; i < 20; i++ {
		e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) SELECT 't', 'k' || g, 'E', jsonb_build_object('i', g) FROM generate_series(1, 10) g")
	}
	e.waitRecords(200)
	if err := e.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	slot := e.slotConfirmed()
	var stored string
	if err := e.pool.QueryRow(context.Background(), "SELECT lsn::text FROM cdc_relay_checkpoints WHERE slot_name = $1", e.slot).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	sl, _ := pglogrepl.ParseLSN(stored)
	if slot > sl {
		t.Fatalf("slot %s ahead of stored checkpoint %s: the store must be written first", slot, sl)
	}
	e.start()
	var after string
	e.tx(func(tx pgx.Tx) (err error) {
		after, err = insert(tx, "t", "after", "E", "{}")
		return err
	})
	// Redelivered events come before the new one in the stream: once the slot
	// is confirmed past it, Kafka has acknowledged every one of them.
	e.waitSlotConfirmed(commitLSN(t, e.waitRecords(201), after) + 1)
	if recs := e.readAll(); len(recs) != 201 {
		t.Fatalf("after restart: %d records, want exactly 201 (no redelivery)", len(recs))
	}
}

// TestStartupChecks covers configuration errors found before streaming.
func TestStartupChecks(t *testing.T) {
	tests := []struct {
		name  string
		setup func(e *env)
		hook  func(c *relay.Config)
		want  []string
	}{
		{
			name:  "missing table",
			setup: func(e *env) { e.exec("DROP TABLE outbox_events") },
			want:  []string{"does not exist", "(setting Decoder.Table)"},
		},
		{
			name: "missing column",
			hook: func(c *relay.Config) { c.Decoder.Columns.AggregateID = "agg" },
			want: []string{`no column "agg"`, "(setting Decoder.Columns.AggregateID)"},
		},
		{
			name: "publication missing and creation disabled",
			hook: func(c *relay.Config) { c.CreatePublication = false },
			want: []string{"does not exist", "CREATE PUBLICATION"},
		},
		{
			name: "publication without the table",
			setup: func(e *env) {
				e.exec("CREATE TABLE other (id int PRIMARY KEY)")
				e.exec("CREATE PUBLICATION cdc_relay_outbox FOR TABLE other")
			},
			want: []string{"does not cover", "ALTER PUBLICATION"},
		},
		{
			name: "slot missing and creation disabled",
			hook: func(c *relay.Config) { c.CreateSlot = false },
			want: []string{"does not exist", "pg_create_logical_replication_slot"},
		},
		{
			name: "invalid slot name",
			hook: func(c *relay.Config) { c.Slot = "Bad-Slot" },
			want: []string{`slot name "Bad-Slot" is invalid`, "(setting Slot)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			if tt.setup != nil {
				tt.setup(e)
			}
			e.cfgHook = tt.hook
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := relay.New(e.config()).Run(ctx)
			if err == nil {
				t.Fatal("relay started; want a configuration error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestSlotGapIsLoud: the store remembers a position but the slot was dropped and
// recreated; the relay refuses to start and says why (DESIGN invariant 6).
func TestSlotGapIsLoud(t *testing.T) {
	e := newEnv(t)
	e.start()
	e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'k', 'E', '{}')")
	e.waitRecords(1)
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	// The walsender releases the slot a moment after the relay disconnects.
	e.dropSlot()
	e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'k', 'LostInGap', '{}')")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := relay.New(e.config()).Run(ctx)
	var gap *gaps.GapError
	if !errorsAs(err, &gap) {
		t.Fatalf("Run = %v, want a *gaps.GapError", err)
	}
	if gap.Kind != gaps.SlotMissing || !strings.Contains(err.Error(), e.slot) {
		t.Errorf("gap error %v (kind %v), want SlotMissing naming the slot", err, gap.Kind)
	}
	if got := testutil.ToFloat64(e.m.SlotProblems.WithLabelValues(gaps.SlotMissing.String())); got != 1 {
		t.Errorf("slot_problems_total{kind=%s} = %v, want 1", gaps.SlotMissing, got)
	}
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// TestPostgresRestartMidStream restarts Postgres under the relay (fast and
// immediate shutdown): it reconnects with backoff and delivers every event.
func TestPostgresRestartMidStream(t *testing.T) {
	testenv.RequireLocal(t, pg)
	e := newEnv(t)
	e.start()
	insertN := func(from, n int) {
		e.exec("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) SELECT 't', 'k' || (g % 7), 'E', jsonb_build_object('seq', g) FROM generate_series($1::int, $2::int) g", from, from+n-1)
	}
	insertN(1, 100)
	e.waitRecords(100)
	for i, mode := range []string{"fast", "immediate"} {
		if err := pg.Restart(mode); err != nil {
			t.Fatalf("restart postgres (%s): %v", mode, err)
		}
		e.pool.Reset() // drop the pool's dead connections
		insertN(101+i*100, 100)
	}
	recs := e.waitRecords(300)
	seen := map[string]bool{}
	for _, r := range recs {
		seen[string(r.Value)] = true
	}
	if len(seen) != 300 {
		t.Fatalf("%d distinct events in Kafka, want 300", len(seen))
	}
	if got := testutil.ToFloat64(e.m.Reconnects); got < 1 {
		t.Errorf("replication_reconnects_total = %v, want >= 1", got)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if !e.relay.Ready() {
			return errors.New("relay not ready again after the restarts")
		}
		return nil
	})
}

// TestIdleDatabaseWhileAnotherWrites: another database on the server writes
// WAL, this one is idle; with the heartbeat on, the slot still moves past the
// other database's WAL, and the slot metrics are exported.
func TestIdleDatabaseWhileAnotherWrites(t *testing.T) {
	e := newEnv(t)
	e.cfgHook = func(c *relay.Config) {
		c.Heartbeat = 200 * time.Millisecond
		c.MonitorInterval = 100 * time.Millisecond
	}
	otherURL, err := pg.CreateDatabase(context.Background(), e.db+"_other")
	if err != nil {
		t.Fatal(err)
	}
	other, err := pgx.Connect(context.Background(), otherURL)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	if _, err := other.Exec(context.Background(), "CREATE TABLE busy (v text)"); err != nil {
		t.Fatal(err)
	}
	e.start()
	for i := 0; i < 30; i++ {
		if _, err := other.Exec(context.Background(), "INSERT INTO busy SELECT repeat('x', 1000) FROM generate_series(1, 50)"); err != nil {
			t.Fatal(err)
		}
	}
	var s string
	if err := other.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		t.Fatal(err)
	}
	target, _ := pglogrepl.ParseLSN(s)
	e.waitSlotConfirmed(target) // past the other database's WAL
	// The slot may catch up through keepalives before the first heartbeat
	// tick; the heartbeat must still run and succeed.
	waitMetric(t, func() float64 { return min(testutil.ToFloat64(e.m.Heartbeats.WithLabelValues("ok")), 1) }, 1)
	if got := testutil.ToFloat64(e.m.Heartbeats.WithLabelValues("error")); got != 0 {
		t.Errorf("heartbeats_total{result=error} = %v, want 0", got)
	}
	if got := testutil.ToFloat64(e.m.SlotWALStatus.WithLabelValues("reserved")); got != 1 {
		t.Errorf("slot_wal_status{status=reserved} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(e.m.SlotRetainedWAL); got <= 0 {
		t.Errorf("slot_retained_wal_bytes = %v, want > 0", got)
	}
}

// TestCheckpointPersistedPromptly: the checkpoint is persisted within
// PersistInterval of Kafka's acknowledgements, not at the (here 30 s) status
// interval, so a crash redelivers at most that much.
func TestCheckpointPersistedPromptly(t *testing.T) {
	e := newEnv(t)
	e.cfgHook = func(c *relay.Config) {
		c.StatusInterval = 30 * time.Second
		c.PersistInterval = 100 * time.Millisecond
		c.IdleCheckpoint = time.Hour // only delivered events may move it
	}
	e.start()
	e.tx(func(tx pgx.Tx) error {
		_, err := insert(tx, "order", "o-1", "Placed", `{}`)
		return err
	})
	recs := e.waitRecords(1)
	end := maxCommitLSN(t, recs)
	deadline := time.Now().Add(5 * time.Second) // far below the status interval
	testenv.Eventually(t, time.Until(deadline), func() error {
		var stored string
		if err := e.pool.QueryRow(context.Background(), "SELECT lsn::text FROM cdc_relay_checkpoints WHERE slot_name = $1", e.slot).Scan(&stored); err != nil {
			return fmt.Errorf("read the stored checkpoint: %w", err)
		}
		if lsn, _ := pglogrepl.ParseLSN(stored); lsn < end {
			return fmt.Errorf("checkpoint stored at %s, want >= %s (the event's commit)", stored, end)
		}
		return nil
	})
}
