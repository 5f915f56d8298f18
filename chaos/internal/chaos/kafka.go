package chaos

import (
	"fmt"
	"net"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// kafkaKind says which Kafka a scenario runs against.
type kafkaKind int

const (
	// kafkaLocal is sandbox's one-broker kfake, which can be stopped and
	// started again on the same port with its data (or external brokers
	// named by CDC_RELAY_TEST_KAFKA_BROKERS, for scenarios without Kafka
	// faults).
	kafkaLocal kafkaKind = iota
	// kafkaProxied is one kfake broker behind a toxiproxy proxy that it
	// advertises as its own address, so every connection of every client
	// goes through the proxy.
	kafkaProxied
	// kafkaThreeBrokers is a three-broker kfake cluster, for partition
	// leadership moves.
	kafkaThreeBrokers
)

// partitions is the partition count of every scenario's topic.
const partitions = 4

// kafkaEnv is the Kafka side of one scenario.
type kafkaEnv struct {
	brokers []string
	local   *sandbox.Kafka // kafkaLocal
	cluster *kfake.Cluster // kafkaProxied, kafkaThreeBrokers
	proxy   *netProxy      // kafkaProxied
}

// startKafka starts the Kafka of kind with topic created.
func startKafka(kind kafkaKind, topic string, proxies *toxiproxy.ApiServer) (*kafkaEnv, error) {
	switch kind {
	case kafkaProxied:
		return startProxiedKafka(topic, proxies)
	case kafkaThreeBrokers:
		c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.DefaultNumPartitions(partitions),
			kfake.SeedTopics(partitions, topic), kfake.AllowAutoTopicCreation())
		if err != nil {
			return nil, fmt.Errorf("start three kfake brokers: %w", err)
		}
		return &kafkaEnv{brokers: c.ListenAddrs(), cluster: c}, nil
	default:
		k, err := sandbox.StartKafka(sandbox.KafkaOptions{Partitions: partitions, Topics: []string{topic}})
		if err != nil {
			return nil, err
		}
		return &kafkaEnv{brokers: k.Brokers(), local: k}, nil
	}
}

// startProxiedKafka starts one kfake broker on a free port and a proxy in
// front of it on another; the broker advertises the proxy's address.
func startProxiedKafka(topic string, proxies *toxiproxy.ApiServer) (*kafkaEnv, error) {
	port, err := sandbox.FreePort()
	if err != nil {
		return nil, err
	}
	advertised := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}
	var upstream string
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(partitions),
		kfake.SeedTopics(partitions, topic), kfake.AllowAutoTopicCreation(),
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			ln, err := net.Listen(network, address)
			if err != nil {
				return nil, err
			}
			upstream = ln.Addr().String()
			return advertisedListener{Listener: ln, advertised: advertised}, nil
		}))
	if err != nil {
		return nil, fmt.Errorf("start kfake behind a proxy: %w", err)
	}
	px, err := startProxy(proxies, "kafka-"+topic, advertised.String(), upstream)
	if err != nil {
		c.Close()
		return nil, err
	}
	return &kafkaEnv{brokers: []string{px.addr()}, cluster: c, proxy: px}, nil
}

// kfake returns the running kfake cluster for fault injection, or nil for
// external brokers or a stopped local one.
func (k *kafkaEnv) kfake() *kfake.Cluster {
	if k.local != nil {
		if k.local.External() {
			return nil
		}
		return k.local.Cluster()
	}
	return k.cluster
}

// close stops the brokers and the proxy.
func (k *kafkaEnv) close() {
	if k.proxy != nil {
		k.proxy.close()
	}
	if k.cluster != nil {
		k.cluster.Close()
	}
	if k.local != nil {
		k.local.Close()
	}
}
