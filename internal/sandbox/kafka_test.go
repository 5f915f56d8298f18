package sandbox_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// produce writes records with kgo, creating missing topics, and fails t
// unless every one is acknowledged.
func produce(ctx context.Context, t *testing.T, brokers []string, records ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, records...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// uniqueTopic returns a topic name no earlier run used, so tests also pass
// against external brokers that keep their data.
func uniqueTopic(name string) string {
	return fmt.Sprintf("%s-%d", name, time.Now().UnixNano())
}

// partitionCount returns the partitions of topic, -1 if it does not exist.
func partitionCount(ctx context.Context, t *testing.T, brokers []string, topic string) int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); errors.Is(err, kerr.UnknownTopicOrPartition) {
		return -1
	} else if err != nil {
		t.Fatal(err)
	}
	return len(resp.Topics[0].Partitions)
}

// sameRecords compares what matters of two record lists.
func sameRecords(a, b []sandbox.Record) bool {
	return slices.EqualFunc(a, b, func(x, y sandbox.Record) bool {
		return x.Topic == y.Topic && x.Partition == y.Partition && x.Offset == y.Offset &&
			bytes.Equal(x.Key, y.Key) && bytes.Equal(x.Value, y.Value) &&
			fmt.Sprint(x.Headers) == fmt.Sprint(y.Headers) && x.Timestamp.Equal(y.Timestamp)
	})
}

func TestKafkaPersistsAcrossRestart(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	k := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 3, Topics: []string{"seeded"}})
	testenv.RequireLocalKafka(t, k)
	brokers := k.Brokers()

	var records []*kgo.Record
	for i := range 10 {
		records = append(records, &kgo.Record{
			Topic:   "events",
			Key:     fmt.Appendf(nil, "key-%d", i%4),
			Value:   fmt.Appendf(nil, "value-%d", i),
			Headers: []kgo.RecordHeader{{Key: "seq", Value: fmt.Appendf(nil, "%d", i)}},
		})
	}
	produce(ctx, t, brokers, records...)

	before, err := sandbox.ReadAll(ctx, brokers, "events", "seeded", "missing")
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != len(records) {
		t.Fatalf("sandbox.ReadAll got %d records, want %d", len(before), len(records))
	}
	values := make(map[string]string)
	for i, r := range before {
		values[string(r.Value)] = r.Headers["seq"]
		if i > 0 && r.Partition == before[i-1].Partition && r.Offset <= before[i-1].Offset {
			t.Errorf("records out of order at %d: %d/%d after %d/%d", i, r.Partition, r.Offset, before[i-1].Partition, before[i-1].Offset)
		}
	}
	for i := range records {
		if seq, ok := values[fmt.Sprintf("value-%d", i)]; !ok || seq != fmt.Sprint(i) {
			t.Errorf("value-%d: found %v, seq header %q", i, ok, seq)
		}
	}
	for topic, want := range map[string]int{"events": 3, "seeded": 3, "missing": -1} {
		if got := partitionCount(ctx, t, brokers, topic); got != want {
			t.Errorf("topic %s has %d partitions, want %d (-1: does not exist)", topic, got, want)
		}
	}

	k.Stop()
	k.Stop()
	if k.Cluster() != nil {
		t.Errorf("Cluster() is not nil after Stop")
	}
	conn, err := net.DialTimeout("tcp", brokers[0], time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("dial %s after Stop succeeded", brokers[0])
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial after Stop: %v, want connection refused", err)
	}

	if err := k.Start(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(k.Brokers(), brokers) || k.Cluster() == nil {
		t.Fatalf("after Start: brokers %v (want %v), cluster %v", k.Brokers(), brokers, k.Cluster())
	}
	after, err := sandbox.ReadAll(ctx, brokers, "events", "seeded", "missing")
	if err != nil {
		t.Fatal(err)
	}
	if !sameRecords(before, after) {
		t.Errorf("records changed across restart:\nbefore %v\nafter  %v", before, after)
	}

	// The log continues where it was.
	produce(ctx, t, brokers, &kgo.Record{Topic: "events", Partition: 0, Value: []byte("later")})
	all, err := sandbox.WaitForRecords(ctx, brokers, len(records)+1, "events")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(records)+1 {
		t.Errorf("sandbox.WaitForRecords got %d records, want %d", len(all), len(records)+1)
	}
}

func TestKafkaNoAutoCreate(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	k := testenv.NewKafka(t, sandbox.KafkaOptions{NoAutoCreate: true})
	testenv.RequireLocalKafka(t, k)
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = true
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr("auto")
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); !errors.Is(err, kerr.UnknownTopicOrPartition) {
		t.Errorf("metadata with auto-create on a NoAutoCreate broker: %v, want UnknownTopicOrPartition", err)
	}

	for _, tc := range []struct {
		partitions, want int
	}{
		{partitions: 2, want: 2},
		{partitions: 0, want: sandbox.DefaultPartitions},
	} {
		topic := fmt.Sprintf("created-%d", tc.partitions)
		if err := sandbox.CreateTopic(ctx, k.Brokers(), topic, tc.partitions); err != nil {
			t.Fatal(err)
		}
		if got := partitionCount(ctx, t, k.Brokers(), topic); got != tc.want {
			t.Errorf("sandbox.CreateTopic(%d partitions): got %d, want %d", tc.partitions, got, tc.want)
		}
		if err := sandbox.CreateTopic(ctx, k.Brokers(), topic, tc.partitions); !errors.Is(err, kerr.TopicAlreadyExists) {
			t.Errorf("second CreateTopic: %v, want TopicAlreadyExists", err)
		}
	}
}

func TestReadAllReturnsAtOnce(t *testing.T) {
	t.Parallel()
	empty, missing := uniqueTopic("empty"), uniqueTopic("missing")
	k := testenv.NewKafka(t, sandbox.KafkaOptions{Topics: []string{empty}})
	// Something to not read: sandbox.ReadAll of no topics must not mean all topics.
	produce(testContext(t), t, k.Brokers(), &kgo.Record{Topic: uniqueTopic("full"), Value: []byte("v")})
	for _, tc := range []struct {
		name   string
		topics []string
	}{
		{"no topics", nil},
		{"empty topic", []string{empty}},
		{"missing topic", []string{missing}},
		{"both", []string{empty, missing}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			got, err := sandbox.ReadAll(ctx, k.Brokers(), tc.topics...)
			if err != nil || len(got) != 0 {
				t.Errorf("sandbox.ReadAll = %v, %v; want nothing", got, err)
			}
		})
	}
}

// TestReadAllTransactional checks that sandbox.ReadAll finishes when a partition ends
// with a transaction marker, which takes an offset but is no record.
func TestReadAllTransactional(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	topic := uniqueTopic("txn")
	k := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 1, Topics: []string{topic}})
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...), kgo.TransactionalID(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, commit := range []kgo.TransactionEndTry{kgo.TryCommit, kgo.TryAbort, kgo.TryCommit} {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, commit); err != nil {
			t.Fatal(err)
		}
	}
	got, err := sandbox.ReadAll(ctx, k.Brokers(), topic)
	if err != nil {
		t.Fatal(err)
	}
	// Three data records (one aborted, read uncommitted) and three markers.
	if len(got) != 3 {
		t.Errorf("sandbox.ReadAll got %d records, want 3: %v", len(got), got)
	}
}

func TestWaitForRecords(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	k := testenv.NewKafka(t, sandbox.KafkaOptions{})
	brokers := k.Brokers()

	t.Run("topic created later", func(t *testing.T) {
		// The broker tells when sandbox.WaitForRecords asked for the topic (and heard
		// it does not exist), so the topic is created only after that.
		testenv.RequireLocalKafka(t, k)
		late := uniqueTopic("late")
		asked := k.Cluster().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Metadata}, Topic: late, Observe: true, Count: -1})
		defer asked.Remove()
		done := make(chan []sandbox.Record, 1)
		go func() {
			got, err := sandbox.WaitForRecords(ctx, brokers, 2, late)
			if err != nil {
				t.Errorf("WaitForRecords: %v", err)
			}
			done <- got
		}()
		if err := asked.Wait(ctx, 1); err != nil {
			t.Fatalf("sandbox.WaitForRecords did not look the topic up: %v", err)
		}
		produce(ctx, t, brokers, &kgo.Record{Topic: late, Partition: 0, Value: []byte("a")},
			&kgo.Record{Topic: late, Partition: 0, Value: []byte("b")})
		got := <-done
		if len(got) != 2 || string(got[0].Value) != "a" || string(got[1].Value) != "b" {
			t.Errorf("sandbox.WaitForRecords = %v, want a, b", got)
		}
	})

	t.Run("timeout returns what it got", func(t *testing.T) {
		short := uniqueTopic("short")
		produce(ctx, t, brokers, &kgo.Record{Topic: short, Value: []byte("only")})
		shortCtx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		got, err := sandbox.WaitForRecords(shortCtx, brokers, 5, short)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want DeadlineExceeded", err)
		}
		if len(got) != 1 {
			t.Errorf("got %d records, want 1", len(got))
		}
	})
}

func TestTail(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	k := testenv.NewKafka(t, sandbox.KafkaOptions{})
	brokers := k.Brokers()
	prefix := uniqueTopic("tail")
	topicA, topicB := prefix+"-a", prefix+"-b"
	produce(ctx, t, brokers, &kgo.Record{Topic: topicA, Value: []byte("1")},
		&kgo.Record{Topic: uniqueTopic("other"), Value: []byte("x")})

	tailCtx, stop := context.WithCancel(ctx)
	defer stop()
	var mu sync.Mutex
	seen := make(map[string]string)
	errc := make(chan error, 1)
	go func() {
		errc <- sandbox.Tail(tailCtx, brokers, "^"+regexp.QuoteMeta(prefix)+"-", func(r sandbox.Record) {
			mu.Lock()
			defer mu.Unlock()
			seen[string(r.Value)] = r.Topic
			if len(seen) == 2 {
				stop()
			}
		})
	}()
	// A topic that appears while tailing is picked up.
	produce(ctx, t, brokers, &kgo.Record{Topic: topicB, Value: []byte("2")})
	if err := <-errc; err != nil {
		t.Fatalf("Tail: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("sandbox.Tail did not see both records in time: %v", seen)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen["1"] != topicA || seen["2"] != topicB || len(seen) != 2 {
		t.Errorf("sandbox.Tail saw %v, want 1 from %s and 2 from %s", seen, topicA, topicB)
	}

	if err := sandbox.Tail(ctx, brokers, "(", func(sandbox.Record) {}); err == nil {
		t.Errorf("sandbox.Tail accepted an invalid regex")
	}
}

func TestKafkaKeepsGivenDataDir(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	dir := t.TempDir()
	k := testenv.NewKafka(t, sandbox.KafkaOptions{DataDir: dir})
	testenv.RequireLocalKafka(t, k)
	produce(ctx, t, k.Brokers(), &kgo.Record{Topic: "kept", Value: []byte("v")})
	k.Close()
	k.Close()

	// A new broker on the same directory, on a new port, has the data.
	k2 := testenv.NewKafka(t, sandbox.KafkaOptions{DataDir: dir})
	got, err := sandbox.ReadAll(ctx, k2.Brokers(), "kept")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || string(got[0].Value) != "v" {
		t.Errorf("sandbox.ReadAll after reopening the data dir = %v, want one record v", got)
	}
	if err := k.Start(); err == nil {
		t.Errorf("Start after Close succeeded")
	}
}

func TestKafkaInMemory(t *testing.T) {
	t.Parallel()
	if _, err := sandbox.StartKafka(sandbox.KafkaOptions{InMemory: true, DataDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "InMemory and a DataDir") {
		t.Errorf("sandbox.StartKafka with InMemory and a DataDir: %v, want an error naming both", err)
	}
	ctx := testContext(t)
	k := testenv.NewKafka(t, sandbox.KafkaOptions{InMemory: true})
	testenv.RequireLocalKafka(t, k)
	if d := k.DataDir(); d != "" {
		t.Errorf("DataDir() = %q, want none", d)
	}
	produce(ctx, t, k.Brokers(), &kgo.Record{Topic: "mem", Value: []byte("v")})
	got, err := sandbox.ReadAll(ctx, k.Brokers(), "mem")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || string(got[0].Value) != "v" {
		t.Errorf("sandbox.ReadAll = %v, want one record v", got)
	}
	k.Stop()
	if err := k.Start(); err == nil || !strings.Contains(err.Error(), "in-memory") {
		t.Errorf("Start after Stop: %v, want an error: the data is gone", err)
	}
}

func TestFreePort(t *testing.T) {
	port, err := sandbox.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("listen on sandbox.FreePort %d: %v", port, err)
	}
	ln.Close()
}

// TestKafkaSecurity starts brokers with TLS and SASL and checks that the
// helpers reach them through ClientOpts and the sandbox.Kafka methods, across a
// restart, while a client without the right settings is turned away.
func TestKafkaSecurity(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opts sandbox.KafkaOptions
		// wrong are client settings the broker must refuse.
		wrong map[string][]kgo.Opt
	}{
		{
			name: "TLS",
			opts: sandbox.KafkaOptions{TLS: true},
			wrong: map[string][]kgo.Opt{
				"plain TCP":    nil,
				"untrusted CA": {kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12})},
				"another CA":   {kgo.DialTLSConfig(otherCA(t))},
			},
		},
		{
			name: "mutual TLS",
			opts: sandbox.KafkaOptions{RequireClientCert: true},
			wrong: map[string][]kgo.Opt{
				"no client certificate": {kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true})},
			},
		},
		{
			name: "PLAIN",
			opts: sandbox.KafkaOptions{SASLUsers: []sandbox.SASLUser{{sandbox.SASLPlain, "alice", "pw-plain"}}},
			wrong: map[string][]kgo.Opt{
				"no SASL":        nil,
				"wrong password": {kgo.SASL(plain.Auth{User: "alice", Pass: "nope"}.AsMechanism())},
			},
		},
		{
			name: "SCRAM-SHA-256",
			opts: sandbox.KafkaOptions{SASLUsers: []sandbox.SASLUser{{sandbox.SASLScramSHA256, "bob", "pw-256"}}},
			wrong: map[string][]kgo.Opt{
				"wrong password":  {kgo.SASL(scram.Auth{User: "bob", Pass: "nope"}.AsSha256Mechanism())},
				"wrong mechanism": {kgo.SASL(scram.Auth{User: "bob", Pass: "pw-256"}.AsSha512Mechanism())},
			},
		},
		{
			name: "TLS and SCRAM-SHA-512",
			opts: sandbox.KafkaOptions{TLS: true, SASLUsers: []sandbox.SASLUser{{sandbox.SASLScramSHA512, "carol", "pw-512"}, {sandbox.SASLPlain, "dave", "pw"}}},
			wrong: map[string][]kgo.Opt{
				"SASL without TLS": {kgo.SASL(scram.Auth{User: "carol", Pass: "pw-512"}.AsSha512Mechanism())},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			k := testenv.NewKafka(t, tt.opts)
			if k.External() { // even with CDC_RELAY_TEST_KAFKA_BROKERS set
				t.Fatal("a broker with TLS or SASL must be local")
			}
			f := k.TLSFiles()
			if tls := tt.opts.TLS || tt.opts.RequireClientCert; tls != (f.CA != "") || tls != (k.ClientTLS() != nil) {
				t.Fatalf("sandbox.TLSFiles() = %+v, ClientTLS() = %v with TLS %v", f, k.ClientTLS() != nil, tls)
			}
			topic := uniqueTopic("secure")
			for round := range 2 { // before and after a restart
				cl, err := kgo.NewClient(append(k.ClientOpts(), kgo.AllowAutoTopicCreation())...)
				if err != nil {
					t.Fatal(err)
				}
				err = cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: fmt.Appendf(nil, "v%d", round)}).FirstErr()
				cl.Close()
				if err != nil {
					t.Fatalf("round %d: produce with ClientOpts: %v", round, err)
				}
				got, err := k.ReadAll(ctx, topic)
				if err != nil || len(got) != round+1 {
					t.Fatalf("round %d: sandbox.ReadAll = %d records, %v; want %d", round, len(got), err, round+1)
				}
				if got, err := k.WaitForRecords(ctx, round+1, topic); err != nil || len(got) != round+1 {
					t.Fatalf("round %d: sandbox.WaitForRecords = %d records, %v", round, len(got), err)
				}
				for what, opts := range tt.wrong {
					if err := ping(ctx, k.Brokers(), opts...); err == nil {
						t.Errorf("round %d: a client with %s reached the broker", round, what)
					}
				}
				k.Stop()
				if err := k.Start(); err != nil {
					t.Fatal(err)
				}
			}
			tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			tailed := 0
			err := k.Tail(tctx, regexp.QuoteMeta(topic), func(sandbox.Record) {
				if tailed++; tailed == 2 {
					cancel()
				}
			})
			cancel()
			if err != nil || tailed != 2 {
				t.Errorf("sandbox.Tail saw %d records (%v), want 2", tailed, err)
			}
			if err := k.CreateTopic(ctx, uniqueTopic("created"), 2); err != nil {
				t.Errorf("CreateTopic: %v", err)
			}
			k.Close()
			if f.Dir != "" {
				if _, err := os.Stat(f.Dir); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("TLS dir %s left after Close: %v", f.Dir, err)
				}
			}
		})
	}
}

// ping asks the brokers for metadata with a kgo client built from opts, and
// gives up after two seconds.
func ping(ctx context.Context, brokers []string, opts ...kgo.Opt) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return cl.Ping(ctx)
}

// otherCA returns a client TLS config trusting a CA that signed none of the
// broker's certificates.
func otherCA(t *testing.T) *tls.Config {
	t.Helper()
	f, err := sandbox.WriteTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestKafkaBadSASLUser(t *testing.T) {
	for _, u := range []sandbox.SASLUser{{"GSSAPI", "u", "p"}, {sandbox.SASLPlain, "", "p"}} {
		if k, err := sandbox.StartKafka(sandbox.KafkaOptions{SASLUsers: []sandbox.SASLUser{u}}); err == nil {
			k.Close()
			t.Errorf("sandbox.StartKafka with SASL user %+v: no error", u)
		}
	}
}

func TestWriteTLSFiles(t *testing.T) {
	f, err := sandbox.WriteTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pool, err := f.CAPool()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cert, key string
		usage     x509.ExtKeyUsage
		host      string
	}{
		{f.ServerCert, f.ServerKey, x509.ExtKeyUsageServerAuth, "127.0.0.1"},
		{f.ServerCert, f.ServerKey, x509.ExtKeyUsageServerAuth, "localhost"},
		{f.ClientCert, f.ClientKey, x509.ExtKeyUsageClientAuth, ""},
	} {
		pair, err := tls.LoadX509KeyPair(c.cert, c.key)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: c.host, KeyUsages: []x509.ExtKeyUsage{c.usage}}); err != nil {
			t.Errorf("%s for %q: %v", c.cert, c.host, err)
		}
		if st, err := os.Stat(c.key); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", c.key, st.Mode().Perm(), err)
		}
	}
}

// TestKafkaLatency: with Latency, the broker's answers reach the client that
// much later, in order, while requests written back to back on one
// connection are each answered.
func TestKafkaLatency(t *testing.T) {
	t.Parallel()
	const latency = 150 * time.Millisecond
	k := testenv.NewKafka(t, sandbox.KafkaOptions{Latency: latency})
	testenv.RequireLocalKafka(t, k)
	c, err := net.DialTimeout("tcp", k.Brokers()[0], 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	var frames []byte
	for corr := int32(1); corr <= 3; corr++ {
		req := kmsg.NewPtrApiVersionsRequest()
		req.Version = 0
		body := req.AppendTo(nil)
		head := []byte{0, 0, 0, 0, 0, byte(kmsg.ApiVersions), 0, 0, 0, 0, 0, byte(corr), 0xff, 0xff} // size, key, version 0, correlation id, null client id
		frame := append(head, body...)
		binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
		frames = append(frames, frame...)
	}
	sent := time.Now()
	if _, err := c.Write(frames); err != nil {
		t.Fatal(err)
	}
	for want := int32(1); want <= 3; want++ {
		var head [8]byte
		if _, err := io.ReadFull(c, head[:]); err != nil {
			t.Fatalf("read answer %d: %v", want, err)
		}
		if want == 1 {
			if took := time.Since(sent); took < latency {
				t.Errorf("the first answer came %v after the request; the broker's latency is %v", took, latency)
			}
		}
		if corr := int32(binary.BigEndian.Uint32(head[4:])); corr != want {
			t.Fatalf("answer with correlation id %d, want %d: answers out of order", corr, want)
		}
		if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(head[:]))-4); err != nil {
			t.Fatalf("read answer %d: %v", want, err)
		}
	}
}

// TestKafkaStopReading stops a broker with 4 KiB socket buffers reading: a
// client's write of 1 MiB blocks (its deadline passes with most of it
// unwritten), and once the broker reads again the rest goes through.
func TestKafkaStopReading(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t, sandbox.KafkaOptions{SocketBuffer: 4096})
	testenv.RequireLocalKafka(t, k)
	if err := k.StopReading(); err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", k.Brokers()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A frame the broker reads as one request of 1 MiB (and then refuses).
	frame := make([]byte, 4+1<<20)
	binary.BigEndian.PutUint32(frame, 1<<20)
	if err := conn.SetWriteDeadline(time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	n, err := conn.Write(frame)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n > len(frame)/2 {
		t.Fatalf("write to a broker that stopped reading: %d of %d bytes, %v; want a timeout with most of it unwritten", n, len(frame), err)
	}
	k.ResumeReading()
	if err := conn.SetWriteDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if m, err := conn.Write(frame[n:]); err != nil {
		t.Fatalf("write the rest once the broker reads again: %d of %d bytes: %v", m, len(frame)-n, err)
	}
}

// TestKafkaStallConnections: a connection open when the broker stalls its
// connections gets no answer any more, while one opened later does.
func TestKafkaStallConnections(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t, sandbox.KafkaOptions{})
	testenv.RequireLocalKafka(t, k)
	apiVersions := func(c net.Conn, corr int32, timeout time.Duration) error {
		req := kmsg.NewPtrApiVersionsRequest()
		req.Version = 0
		head := []byte{0, 0, 0, 0, 0, byte(kmsg.ApiVersions), 0, 0, 0, 0, 0, byte(corr), 0xff, 0xff} // size, key, version 0, correlation id, null client id
		frame := append(head, req.AppendTo(nil)...)
		binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
		if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
			return err
		}
		if _, err := c.Write(frame); err != nil {
			return err
		}
		var size [4]byte
		if _, err := io.ReadFull(c, size[:]); err != nil {
			return err
		}
		_, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(size[:])))
		return err
	}
	dial := func() net.Conn {
		c, err := net.DialTimeout("tcp", k.Brokers()[0], 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	old := dial()
	if err := apiVersions(old, 1, 10*time.Second); err != nil {
		t.Fatalf("before the stall: %v", err)
	}
	n, err := k.StallConnections()
	if err != nil || n != 1 {
		t.Fatalf("StallConnections() = %d, %v; want the one connection open", n, err)
	}
	if err := apiVersions(old, 2, 500*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a stalled connection's request: %v, want no answer (a timeout)", err)
	}
	if err := apiVersions(dial(), 1, 10*time.Second); err != nil {
		t.Errorf("a connection opened after the stall: %v, want an answer", err)
	}
}
