package main

// The proof of effect-once: the built cdc-relay and two processes of the
// built rewards consumer, both SIGKILLed repeatedly while a writer commits
// reward events, over real Postgres 15 (an outbox database and a consumer
// database) and the in-process Kafka-protocol broker.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/relayproc/relaytest"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

var (
	relayBin, rewardsBin string
	pg                   *sandbox.Postgres
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "cdc-relay-rewards-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "rewards e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if relayBin, err = relayproc.Build(ctx, dir, relayproc.BuildOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "rewards e2e:", err)
		return 1
	}
	gobin, err := exec.LookPath("go") // go test puts its own toolchain first on PATH
	if err != nil {
		fmt.Fprintln(os.Stderr, "rewards e2e: find the go command:", err)
		return 1
	}
	rewardsBin = filepath.Join(dir, "rewards")
	build := exec.CommandContext(ctx, gobin, "build", "-o", rewardsBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "rewards e2e: go build rewards: %v\n", err)
		return 1
	}
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Minute)
	pg, err = sandbox.StartPostgres(pctx, sandbox.PGOptions{})
	pcancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "rewards e2e: start postgres:", err)
		return 1
	}
	defer pg.Close()
	return m.Run()
}

const (
	topic        = "outbox.player"
	consumerName = "reward-consumer"
	players      = 40
)

// TestEffectOnceUnderKills is the effect-once proof. A writer commits
// RewardGranted events to the outbox at a steady pace; the relay runs with
// --delivery at-least-once and is SIGKILLed twice (so events sent but not
// checkpointed are sent again), an operator replay republishes some events,
// and two rewards processes in one group are SIGKILLed and restarted again
// and again (so the group rebalances each time, and records whose offsets
// were not committed are delivered again). Then: every player's points
// equal the sum of the committed events' points, exactly; one claim per
// committed event; no dead letters; and every copy of a record beyond the
// first was seen and skipped.
func TestEffectOnceUnderKills(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	began := time.Now()
	outboxURL, err := pg.CreateDatabase(ctx, "rewards_outbox")
	if err != nil {
		t.Fatal(err)
	}
	pointsURL, err := pg.CreateDatabase(ctx, "rewards_points")
	if err != nil {
		t.Fatal(err)
	}
	applyOutboxMigrations(ctx, t, outboxURL)
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{
		Partitions: 4, Topics: []string{topic},
		// Sessions shorter than Kafka's 6 s minimum, so that the partitions of
		// a killed consumer move within a second or two.
		BrokerConfigs: map[string]string{"group.min.session.timeout.ms": "500"},
	})
	brokers := strings.Join(kafka.Brokers(), ",")

	relay := relaytest.New(t, relayproc.Options{Name: "cdc-relay", Path: relayBin, AddMetricsAddr: true,
		Args: []string{"run", "--pg-url", outboxURL, "--kafka-brokers", brokers, "--topic", topic,
			"--delivery", "at-least-once", "--slot", "rewards", "--status-interval", "200ms", "--retry-cap", "1s",
			"--log-format", "json"}})
	relay.Start()
	relay.WaitReady(30 * time.Second)

	counts := &logCounts{}
	var consumers [2]*relaytest.Proc
	for i := range consumers {
		consumers[i] = relaytest.New(t, relayproc.Options{Name: fmt.Sprintf("rewards-%d", i+1), Path: rewardsBin, Output: counts,
			Args: []string{"-brokers", brokers, "-topic", topic, "-group", "rewards", "-name", consumerName,
				"-pg-url", pointsURL, "-log-level", "trace", "-session-timeout", "1s",
				"-heartbeat-interval", "200ms", "-rebalance-timeout", "2s"}})
		consumers[i].Start()
	}

	// The writer: 1-3 events per transaction every 8 ms, about 250 events/s.
	stop := make(chan struct{})
	werr := make(chan error, 1)
	var written atomic.Int64
	go func() { werr <- writeRewards(ctx, outboxURL, stop, &written) }()

	const writeFor = 20 * time.Second
	rng := rand.New(rand.NewPCG(13, 7))
	consumerKills, relayKills, replayed := 0, 0, 0
	for i := 0; time.Since(began) < writeFor+5*time.Second && consumerKills < 14; i++ {
		// Pacing of the faults, not a wait for a condition.
		time.Sleep(time.Duration(1000+rng.IntN(1000)) * time.Millisecond)
		c := consumers[i%2]
		if c.Exited() {
			t.Fatalf("%s exited by itself:\n%s", c.P.Name(), relayproc.Tail(c.Logs(), 30))
		}
		c.Restart()
		consumerKills++
		switch i {
		case 3, 9:
			if relay.Exited() {
				t.Fatalf("the relay exited by itself:\n%s", relayproc.Tail(relay.Logs(), 30))
			}
			relay.Kill()
			relayKills++
			relay.Start()
			relay.WaitReady(30 * time.Second)
		case 6:
			replayed = replayEvents(ctx, t, outboxURL, brokers, 25)
		}
	}
	close(stop)
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	wroteFor := time.Since(began)

	outbox, points := connect(ctx, t, outboxURL), connect(ctx, t, pointsURL)
	var committed int64
	if err := outbox.QueryRow(ctx, `SELECT count(*) FROM outbox_events`).Scan(&committed); err != nil {
		t.Fatal(err)
	}
	if committed != written.Load() {
		t.Fatalf("the outbox holds %d events, the writer committed %d", committed, written.Load())
	}
	// Everything committed reaches the consumer database...
	testenv.Eventually(t, 60*time.Second, func() error {
		for _, p := range append([]*relaytest.Proc{relay}, consumers[:]...) {
			if p.Exited() {
				t.Fatalf("%s exited by itself:\n%s", p.P.Name(), relayproc.Tail(p.Logs(), 30))
			}
		}
		var n int64
		if err := points.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE consumer_name = $1`, consumerName).Scan(&n); err != nil {
			return err
		}
		if n != committed {
			return fmt.Errorf("%d of %d committed events processed", n, committed)
		}
		return nil
	})
	caughtUp := time.Since(began)
	// ...and every copy in Kafka is consumed: each copy beyond the first of
	// an id must have been skipped as a duplicate.
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	recs, err := kafka.ReadAll(rctx, topic)
	rcancel()
	if err != nil {
		t.Fatal(err)
	}
	copies := map[string]int{}
	for _, r := range recs {
		copies[r.Headers["id"]]++
	}
	kafkaDups := len(recs) - len(copies)
	// Not testenv.Eventually, which would stop the test: the points below
	// say more about a failure than this count does.
	for deadline := time.Now().Add(30 * time.Second); counts.duplicates.Load() < int64(kafkaDups); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("%d duplicates skipped within 30s, fewer than the %d duplicate records in Kafka", counts.duplicates.Load(), kafkaDups)
			break
		}
	}

	// The effect: each player's points are the sum of its committed rewards.
	want := sums(ctx, t, outbox, `SELECT aggregate_id, sum((payload->>'points')::bigint) FROM outbox_events GROUP BY 1`)
	got := sums(ctx, t, points, `SELECT player_id, points FROM player_points`)
	if len(got) != len(want) {
		t.Errorf("%d players have points, want %d", len(got), len(want))
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("player %s has %d points, the committed rewards sum to %d", p, got[p], w)
		}
	}
	// One claim per committed event, of exactly those events.
	var strays int64
	if err := points.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE consumer_name = $1 AND message_id <> ALL($2)`,
		consumerName, outboxIDs(ctx, t, outbox)).Scan(&strays); err != nil {
		t.Fatal(err)
	}
	if strays != 0 {
		t.Errorf("%d claims of ids that are not committed events", strays)
	}
	var dead int64
	if err := points.QueryRow(ctx, `SELECT count(*) FROM consumer_dead_letters`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 0 {
		t.Errorf("%d dead letters, want none", dead)
	}
	if kafkaDups < replayed {
		t.Errorf("%d duplicate records in Kafka, fewer than the %d replayed", kafkaDups, replayed)
	}

	for _, c := range consumers {
		c.Stop(20 * time.Second)
	}
	relay.Stop(20 * time.Second)
	t.Logf("effect-once: %d events committed over %d players (%.1fs of writing), %d records in Kafka (%d duplicates: "+
		"%d replayed by an operator, the rest resent by the at-least-once relay after %d SIGKILLs); "+
		"%d consumer SIGKILLs, group generations up to %d (%d joins), %d duplicates skipped (%d of them redeliveries "+
		"to the consumers themselves); all points exact, %d claims, 0 dead letters; caught up %.1fs after the start, "+
		"test %.1fs", committed, len(want), wroteFor.Seconds(), len(recs), kafkaDups, replayed, relayKills,
		consumerKills, counts.maxGeneration.Load(), counts.joins.Load(), counts.duplicates.Load(),
		counts.duplicates.Load()-int64(kafkaDups), committed, caughtUp.Seconds(), time.Since(began).Seconds())
	// Each kill and restart makes the group rebalance (two may share one).
	if counts.maxGeneration.Load() < int64(consumerKills/2) {
		t.Errorf("the group reached generation %d after %d consumer kills: the kills did not make it rebalance",
			counts.maxGeneration.Load(), consumerKills)
	}
}

// applyOutboxMigrations runs the relay's 001 and 002 on the outbox database.
func applyOutboxMigrations(ctx context.Context, t *testing.T, url string) {
	t.Helper()
	conn := connect(ctx, t, url)
	for _, f := range []string{"001_outbox.sql", "002_checkpoints.sql"} {
		sql, err := os.ReadFile(filepath.Join("..", "..", "migrations", f))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, string(sql)); err != nil {
			t.Fatalf("apply %s: %v", f, err)
		}
	}
}

func connect(ctx context.Context, t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// writeRewards commits reward events until stop, counting the committed
// ones in written. Nothing faults the outbox database, so any error fails.
func writeRewards(ctx context.Context, url string, stop <-chan struct{}, written *atomic.Int64) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	rng := rand.New(rand.NewPCG(42, 1))
	tick := time.NewTicker(8 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		n := 1 + rng.IntN(3)
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			for i := 0; i < n; i++ {
				player := fmt.Sprintf("player-%02d", rng.IntN(players))
				payload := fmt.Sprintf(`{"player_id": %q, "points": %d}`, player, 1+rng.IntN(100))
				if _, err := tx.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
VALUES ('player', $1, 'RewardGranted', $2)`, player, payload); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("commit rewards: %w", err)
		}
		written.Add(int64(n))
	}
}

// replayEvents republishes n committed events with the relay's replay
// command, as an operator might: the same ids again in the topic.
func replayEvents(ctx context.Context, t *testing.T, url, brokers string, n int) int {
	t.Helper()
	conn := connect(ctx, t, url)
	var ids []string
	if err := conn.QueryRow(ctx, `SELECT array_agg(id::text) FROM (SELECT id FROM outbox_events ORDER BY created_at LIMIT $1) s`, n).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, relayBin, "replay", "--pg-url", url, "--kafka-brokers", brokers, "--topic", topic,
		"--since", "1h", "--id", strings.Join(ids, ",")).CombinedOutput()
	if err != nil {
		t.Fatalf("cdc-relay replay: %v\n%s", err, out)
	}
	return len(ids)
}

func outboxIDs(ctx context.Context, t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	var ids []string
	if err := conn.QueryRow(ctx, `SELECT array_agg(id::text) FROM outbox_events`).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	return ids
}

// sums runs a (text, bigint) query into a map.
func sums(ctx context.Context, t *testing.T, conn *pgx.Conn, sql string) map[string]int64 {
	t.Helper()
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// logCounts counts, in the consumers' JSON log lines, the duplicates
// skipped and the group generations kafka-go joined.
type logCounts struct {
	mu            sync.Mutex
	partial       []byte
	duplicates    atomic.Int64
	joins         atomic.Int64
	maxGeneration atomic.Int64
}

var generationRE = regexp.MustCompile(`^Joined group \S+ as member .* in generation (\d+)$`)

// Write takes output of any of the consumers (whole lines or parts).
func (c *logCounts) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.partial = append(c.partial, b...)
	for {
		i := bytes.IndexByte(c.partial, '\n')
		if i < 0 {
			break
		}
		c.line(c.partial[:i])
		c.partial = c.partial[i+1:]
	}
	return len(b), nil
}

func (c *logCounts) line(l []byte) {
	if !bytes.Contains(l, []byte("skipped a duplicate")) && !bytes.Contains(l, []byte("in generation")) {
		return
	}
	var rec struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(l, &rec) != nil {
		return
	}
	if strings.HasPrefix(rec.Message, "skipped a duplicate") {
		c.duplicates.Add(1)
	}
	if m := generationRE.FindStringSubmatch(rec.Message); m != nil {
		c.joins.Add(1)
		g, _ := strconv.ParseInt(m[1], 10, 64)
		for {
			cur := c.maxGeneration.Load()
			if g <= cur || c.maxGeneration.CompareAndSwap(cur, g) {
				break
			}
		}
	}
}
