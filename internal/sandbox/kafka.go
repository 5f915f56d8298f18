package sandbox

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// EnvKafkaBrokers names the environment variable that, when set, makes
// StartKafka and NewKafka use existing brokers instead of starting kfake. Its
// value is a comma-separated list of host:port seed brokers.
const EnvKafkaBrokers = "CDC_RELAY_TEST_KAFKA_BROKERS"

// defaultPartitions is KafkaOptions.Partitions when unset.
const defaultPartitions = 4

// kafkaRelistenTimeout bounds how long Start retries binding the old port.
const kafkaRelistenTimeout = 10 * time.Second

// KafkaOptions configures the broker started by StartKafka.
type KafkaOptions struct {
	// Partitions is the partition count of seeded topics and of topics
	// created automatically or by a CreateTopics request without a count.
	// 0 means 4.
	Partitions int

	// Topics are created at start-up with Partitions partitions.
	Topics []string

	// DataDir is where the broker persists its log and state. "" means a
	// fresh temporary directory that Close removes. A given directory is
	// kept, and a broker started on it again reloads its data.
	DataDir string

	// InMemory keeps the log in memory only: no DataDir, and Start after
	// Stop fails, as the data would be gone. For measurements, where the
	// fake's own file writes (one per partition batch) are not Kafka's cost.
	InMemory bool

	// Port is the TCP port on 127.0.0.1; 0 picks a free one.
	Port int

	// BrokerConfigs are kfake's broker-level configs, e.g.
	// {"message.max.bytes": "2097152"}.
	BrokerConfigs map[string]string

	// NoAutoCreate turns off automatic topic creation. With it on (the
	// default), a topic is created when a client's metadata request asks for
	// that: kgo with kgo.AllowAutoTopicCreation(), kafka-go with
	// Writer.AllowAutoTopicCreation.
	NoAutoCreate bool

	// TLS makes the broker accept TLS connections only. Its certificate,
	// for 127.0.0.1, ::1 and localhost, is signed by a CA generated for this
	// broker; TLSFiles names the PEM files. RequireClientCert (which implies
	// TLS) also makes clients present a certificate signed by that CA, such
	// as TLSFiles().ClientCert.
	TLS               bool
	RequireClientCert bool

	// Latency delays every answer of the broker by this much on its way to
	// the client, as a network between the client and a remote broker
	// would (one way); requests arrive at once. For measurements: the
	// broker still reads the next request while an answer is on its way.
	Latency time.Duration

	// SocketBuffer, when positive, is the size in bytes of the broker's
	// socket receive and send buffers (the system may round it). Small
	// buffers let a client's writes block soon after StopReading.
	SocketBuffer int

	// SASLUsers turns SASL authentication on: only these users can connect.
	// A user name may appear once per mechanism. They are superusers, so no
	// ACL stands in their way. The Kafka methods ReadAll, WaitForRecords,
	// Tail and CreateTopic, and ClientOpts, log in as the first.
	SASLUsers []SASLUser
}

// SASL mechanisms of SASLUser.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// SASLUser is a user a broker with SASL accepts.
type SASLUser struct {
	// Mechanism is SASLPlain, SASLScramSHA256 or SASLScramSHA512.
	Mechanism      string
	User, Password string
}

// secured reports whether the options ask for TLS or SASL, which only a
// broker started here can have.
func (o KafkaOptions) secured() bool {
	return o.TLS || o.RequireClientCert || len(o.SASLUsers) > 0
}

// Kafka is a single Kafka-protocol broker for tests: an in-process kfake
// cluster that can be stopped and started again on the same port with its
// data, or existing brokers named by CDC_RELAY_TEST_KAFKA_BROKERS (External
// reports which). Its methods are safe for concurrent use.
type Kafka struct {
	// Set once by StartKafka.
	opts        KafkaOptions // with defaults applied and DataDir set
	brokers     []string
	ownsDataDir bool // DataDir is our temp dir; Close removes it
	external    bool
	tlsFiles    TLSFiles    // with TLS: the CA and certificates, in a temp dir Close removes
	serverTLS   *tls.Config // with TLS: the listener's config
	clientTLS   *tls.Config // with TLS: trusts the CA, presents the client certificate

	gate *readGate // shut by StopReading

	mu      sync.Mutex // guards cluster and closed
	cluster *kfake.Cluster
	closed  bool
}

// StartKafka starts a one-broker kfake cluster on 127.0.0.1 that persists to
// opts.DataDir (a temporary directory by default; nowhere with InMemory). Call Close to stop it and
// remove the temporary directory.
//
// If CDC_RELAY_TEST_KAFKA_BROKERS is set, StartKafka uses those brokers
// instead, creating opts.Topics on them when missing; but not for options
// with TLS or SASLUsers, whose certificates and users exist only on a broker
// started here.
func StartKafka(opts KafkaOptions) (*Kafka, error) {
	if opts.Partitions <= 0 {
		opts.Partitions = defaultPartitions
	}
	if raw := os.Getenv(EnvKafkaBrokers); raw != "" && !opts.secured() {
		return attachKafka(raw, opts)
	}
	if err := checkSASLUsers(opts.SASLUsers); err != nil {
		return nil, err
	}
	k := &Kafka{opts: opts, gate: newReadGate()}
	if opts.TLS || opts.RequireClientCert {
		if err := k.setupTLS(); err != nil {
			k.Close()
			return nil, err
		}
	}
	if opts.InMemory && opts.DataDir != "" {
		return nil, errors.New("start kafka: InMemory and a DataDir exclude each other")
	}
	if k.opts.DataDir == "" && !opts.InMemory {
		dir, err := os.MkdirTemp("", "cdc-relay-kafka-")
		if err != nil {
			return nil, fmt.Errorf("create kafka temp dir: %w", err)
		}
		k.opts.DataDir = dir
		k.ownsDataDir = true
	}
	c, err := kfake.NewCluster(k.clusterOpts(opts.Port)...)
	if err != nil {
		k.Close()
		return nil, fmt.Errorf("start kafka: %w", err)
	}
	k.cluster = c
	k.brokers = c.ListenAddrs()
	_, port, err := net.SplitHostPort(k.brokers[0])
	if err != nil {
		k.Close()
		return nil, fmt.Errorf("parse kafka listen address: %w", err)
	}
	if k.opts.Port, err = strconv.Atoi(port); err != nil {
		k.Close()
		return nil, fmt.Errorf("parse kafka listen port: %w", err)
	}
	return k, nil
}

// attachKafka wraps the brokers of CDC_RELAY_TEST_KAFKA_BROKERS and creates
// the seed topics on them.
func attachKafka(raw string, opts KafkaOptions) (*Kafka, error) {
	k := &Kafka{opts: opts, external: true}
	for _, b := range strings.Split(raw, ",") {
		if b = strings.TrimSpace(b); b != "" {
			k.brokers = append(k.brokers, b)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, topic := range opts.Topics {
		err := CreateTopic(ctx, k.brokers, topic, opts.Partitions)
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return nil, fmt.Errorf("seed topics on %s: %w", EnvKafkaBrokers, err)
		}
	}
	return k, nil
}

// checkSASLUsers rejects mechanisms kfake does not know and users without a
// name.
func checkSASLUsers(users []SASLUser) error {
	for _, u := range users {
		switch u.Mechanism {
		case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		default:
			return fmt.Errorf("start kafka: SASL user %q: mechanism %q is not %s, %s or %s", u.User, u.Mechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512)
		}
		if u.User == "" {
			return fmt.Errorf("start kafka: SASL user of mechanism %s has no name", u.Mechanism)
		}
	}
	return nil
}

// setupTLS writes a CA and certificates to a new temp dir and builds the
// server and client configs from them.
func (k *Kafka) setupTLS() error {
	dir, err := os.MkdirTemp("", "cdc-relay-kafka-tls-")
	if err != nil {
		return fmt.Errorf("create kafka TLS temp dir: %w", err)
	}
	k.tlsFiles.Dir = dir // for Close, even if writing fails
	files, err := WriteTLSFiles(dir)
	if err != nil {
		return fmt.Errorf("write kafka TLS files: %w", err)
	}
	k.tlsFiles = files
	if k.serverTLS, err = k.tlsFiles.serverConfig(k.opts.RequireClientCert); err != nil {
		return fmt.Errorf("kafka TLS: %w", err)
	}
	if k.clientTLS, err = k.tlsFiles.ClientConfig(); err != nil {
		return fmt.Errorf("kafka TLS: %w", err)
	}
	return nil
}

// TLSFiles returns the CA and certificate files of a broker started with
// TLS, and the zero TLSFiles otherwise.
func (k *Kafka) TLSFiles() TLSFiles { return k.tlsFiles }

// ClientTLS returns a new TLS client config that trusts the CA of a broker
// started with TLS and presents its client certificate; nil without TLS.
func (k *Kafka) ClientTLS() *tls.Config {
	if k.clientTLS == nil {
		return nil
	}
	return k.clientTLS.Clone()
}

// ClientOpts returns the kgo options that reach k: its seed brokers and, when
// k was started with them, TLS (ClientTLS) and SASL as the first SASL user.
func (k *Kafka) ClientOpts() []kgo.Opt {
	return append([]kgo.Opt{kgo.SeedBrokers(k.brokers...)}, k.securityOpts()...)
}

// securityOpts returns the kgo TLS and SASL options of k, if any.
func (k *Kafka) securityOpts() []kgo.Opt {
	var opts []kgo.Opt
	if k.clientTLS != nil {
		opts = append(opts, kgo.DialTLSConfig(k.clientTLS.Clone()))
	}
	if len(k.opts.SASLUsers) > 0 {
		u := k.opts.SASLUsers[0]
		switch u.Mechanism {
		case SASLPlain:
			opts = append(opts, kgo.SASL(plain.Auth{User: u.User, Pass: u.Password}.AsMechanism()))
		case SASLScramSHA256:
			opts = append(opts, kgo.SASL(scram.Auth{User: u.User, Pass: u.Password}.AsSha256Mechanism()))
		case SASLScramSHA512:
			opts = append(opts, kgo.SASL(scram.Auth{User: u.User, Pass: u.Password}.AsSha512Mechanism()))
		}
	}
	return opts
}

// endpoint is how the read helpers reach k.
func (k *Kafka) endpoint() endpoint {
	return endpoint{brokers: k.brokers, opts: k.securityOpts()}
}

// clusterOpts returns the kfake options for a start on port (0: any).
func (k *Kafka) clusterOpts(port int) []kfake.Opt {
	opts := []kfake.Opt{
		kfake.DefaultNumPartitions(k.opts.Partitions),
		kfake.SeedTopics(int32(k.opts.Partitions), k.opts.Topics...),
	}
	if !k.opts.InMemory {
		opts = append(opts, kfake.DataDir(k.opts.DataDir))
	}
	if port != 0 {
		opts = append(opts, kfake.Ports(port))
	} else {
		opts = append(opts, kfake.NumBrokers(1)) // kfake's default is 3
	}
	if !k.opts.NoAutoCreate {
		opts = append(opts, kfake.AllowAutoTopicCreation())
	}
	opts = append(opts, kfake.ListenFn(func(network, address string) (net.Listener, error) {
		l, err := k.listen(network, address)
		if err != nil {
			return nil, err
		}
		l = gateListener{Listener: l, g: k.gate}
		if d := k.opts.Latency; d > 0 {
			l = delayListener{Listener: l, d: d}
		}
		return l, nil
	}))
	if len(k.opts.BrokerConfigs) > 0 {
		opts = append(opts, kfake.BrokerConfigs(k.opts.BrokerConfigs))
	}
	if k.serverTLS != nil {
		opts = append(opts, kfake.TLS(k.serverTLS))
	}
	if len(k.opts.SASLUsers) > 0 {
		opts = append(opts, kfake.EnableSASL())
		for _, u := range k.opts.SASLUsers {
			opts = append(opts, kfake.Superuser(u.Mechanism, u.User, u.Password))
		}
	}
	return opts
}

// External reports whether k wraps brokers named by
// CDC_RELAY_TEST_KAFKA_BROKERS.
func (k *Kafka) External() bool { return k.external }

// Brokers returns the seed brokers, ["127.0.0.1:PORT"] for a local broker.
// They stay the same across Stop and Start.
func (k *Kafka) Brokers() []string { return append([]string(nil), k.brokers...) }

// DataDir returns the directory the local broker persists to, or "" for
// external and in-memory brokers.
func (k *Kafka) DataDir() string {
	if k.external {
		return ""
	}
	return k.opts.DataDir
}

// Cluster returns the running kfake cluster, for fault injection with
// Control and friends; nil when external or stopped.
func (k *Kafka) Cluster() *kfake.Cluster {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cluster
}

// Stop shuts the broker down: it persists its data, closes its port (new
// connections are refused) and drops every client connection. Stopping a
// stopped or external broker does nothing.
func (k *Kafka) Stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopLocked()
}

func (k *Kafka) stopLocked() {
	if k.cluster != nil {
		k.cluster.Close()
		k.cluster = nil
	}
}

// Start starts a stopped broker again on the same port and data directory,
// so everything produced before Stop is still there. It retries binding the
// port for a few seconds while the old one is still in use. Starting a
// running broker does nothing; for external brokers Start returns
// ErrExternal.
func (k *Kafka) Start() error {
	if k.external {
		return fmt.Errorf("start kafka: %w", ErrExternal)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return errors.New("start kafka: closed")
	}
	if k.cluster != nil {
		return nil
	}
	if k.opts.InMemory {
		return errors.New("start kafka: an in-memory broker cannot start again with its data")
	}
	deadline := time.Now().Add(kafkaRelistenTimeout)
	for {
		c, err := kfake.NewCluster(k.clusterOpts(k.opts.Port)...)
		if err == nil {
			k.cluster = c
			return nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return fmt.Errorf("restart kafka on port %d: %w", k.opts.Port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close stops the broker and removes its data directory if StartKafka
// created it, and its TLS files. It is idempotent.
func (k *Kafka) Close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return
	}
	k.closed = true
	k.stopLocked()
	if k.ownsDataDir {
		// Best effort: a leftover temp dir is not worth failing a test.
		_ = os.RemoveAll(k.opts.DataDir)
	}
	if k.tlsFiles.Dir != "" {
		_ = os.RemoveAll(k.tlsFiles.Dir) // best effort, as above
	}
}
