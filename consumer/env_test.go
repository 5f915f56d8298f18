package consumer_test

// The integration tests run consumer.Run against a real PostgreSQL 15 cluster
// and the in-process Kafka-protocol broker (kfake), both started once for the
// package; each test gets its own database, topic and group. Records are
// produced with franz-go's kgo, a different client than the consumer's
// kafka-go.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-relay/cdc-relay/consumer"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

var (
	pg    *sandbox.Postgres
	kafka *sandbox.Kafka
	seq   atomic.Int64
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	if pg, err = sandbox.StartPostgres(ctx, sandbox.PGOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "start postgres:", err)
		return 1
	}
	defer pg.Close()
	// Short group sessions, so a rebalance takes a fraction of a second.
	kafka, err = sandbox.StartKafka(sandbox.KafkaOptions{BrokerConfigs: map[string]string{"group.min.session.timeout.ms": "500"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start kafka:", err)
		return 1
	}
	defer kafka.Close()
	return m.Run()
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// env is one test's database, topic and consumer settings.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	url    string
	db     string
	topic  string
	cfg    consumer.Config
	client *kgo.Client
	logs   *sandbox.Buffer
}

// newEnv creates a database with the consumer's tables and an effects
// table, and a topic with the given partitions.
func newEnv(t *testing.T, partitions int) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := fmt.Sprintf("c%d_%s", seq.Add(1), nonIdent.ReplaceAllString(strings.ToLower(t.Name()), "_"))
	if len(name) > 50 {
		name = name[:50]
	}
	url, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := consumer.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (message_id text NOT NULL, n int NOT NULL DEFAULT 1)`); err != nil {
		t.Fatal(err)
	}
	topic := "consumer." + name
	if err := kafka.CreateTopic(ctx, topic, partitions); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(kafka.ClientOpts(), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	logs := &sandbox.Buffer{}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("CONSUMER_TEST_LOGS") != "" {
			t.Logf("consumer log:\n%s", logs.String())
		}
	})
	return &env{
		t: t, pool: pool, url: url, db: name, topic: topic, client: cl, logs: logs,
		cfg: consumer.Config{
			Brokers: kafka.Brokers(), GroupID: "group-" + name, Topics: []string{topic}, Name: "consumer-" + name, Pool: pool,
			Retry:          consumer.RetryPolicy{Base: time.Millisecond, Cap: 5 * time.Millisecond, MaxAttempts: 5, MaxTotal: 10 * time.Second},
			Logger:         zerolog.New(logs).Level(logLevel()).With().Timestamp().Logger(),
			SessionTimeout: 2 * time.Second, HeartbeatInterval: 200 * time.Millisecond,
			RebalanceTimeout: 2 * time.Second, JoinGroupBackoff: 100 * time.Millisecond,
		},
	}
}

// rec is a record to produce; its headers are "id" (when id != "") and extra.
type rec struct {
	id        string
	partition int32
	key       string
	value     string
	headers   map[string]string
}

// produce writes recs, in order, to the env's topic.
func (e *env) produce(recs ...rec) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range recs {
		kr := &kgo.Record{Topic: e.topic, Partition: r.partition, Key: []byte(r.key), Value: []byte(r.value)}
		if r.id != "" {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: "id", Value: []byte(r.id)})
		}
		for k, v := range r.headers {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		if err := e.client.ProduceSync(ctx, kr).FirstErr(); err != nil {
			e.t.Fatalf("produce: %v", err)
		}
	}
}

// running is a consumer.Run in progress.
type running struct {
	t      *testing.T
	cancel context.CancelFunc
	done   chan error
	reg    *prometheus.Registry
}

// start runs consumer.Run with cfg and h until stop (or the end of the test).
func (e *env) start(cfg consumer.Config, h consumer.Handler) *running {
	e.t.Helper()
	r := &running{t: e.t, done: make(chan error, 1), reg: prometheus.NewRegistry()}
	cfg.Registerer = r.reg
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- consumer.Run(ctx, cfg, h) }()
	e.t.Cleanup(func() { r.stop() })
	return r
}

// stop cancels Run's context and returns what Run returned; it fails the
// test if Run does not return within 20 s.
func (r *running) stop() error {
	r.t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(20 * time.Second):
		r.t.Fatalf("consumer.Run did not return within 20s of its context's end")
		return nil
	}
}

// metric returns the value of the cdc_relay_consumer_<name> series with
// the given labels (besides consumer), 0 if it does not exist; for a
// histogram its sample count.
func (r *running) metric(name string, labels ...string) float64 {
	r.t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "cdc_relay_consumer_"+name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return 0
}

func hasLabels(m *dto.Metric, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == kv[i] && lp.GetValue() == kv[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// waitMetric waits until the metric reaches want.
func (r *running) waitMetric(want float64, name string, labels ...string) {
	r.t.Helper()
	testenv.Eventually(r.t, 30*time.Second, func() error {
		select {
		case err := <-r.done:
			r.t.Fatalf("consumer.Run returned early: %v", err)
		default:
		}
		if got := r.metric(name, labels...); got < want {
			return fmt.Errorf("%s%v = %v, want %v", name, labels, got, want)
		}
		return nil
	})
}

// effects returns how many times each message id took effect.
func (e *env) effects() map[string]int {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT message_id, sum(n) FROM effects GROUP BY message_id`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			e.t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// scalar runs a one-value query.
func (e *env) scalar(sql string, args ...any) int64 {
	e.t.Helper()
	var n int64
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// errInjected is the handlers' made-up failure.
var errInjected = errors.New("injected failure")

// logLevel is the consumers' log level in tests: debug, or trace (kafka-go's
// chatter too) with CONSUMER_TEST_LOGS=trace.
func logLevel() zerolog.Level {
	if os.Getenv("CONSUMER_TEST_LOGS") == "trace" {
		return zerolog.TraceLevel
	}
	return zerolog.DebugLevel
}
