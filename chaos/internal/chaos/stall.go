package chaos

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// stallReadBuffer is the receive buffer of the broker's side of every
// connection: small, so that once the broker stops reading, a client's
// writes fill the socket buffers after some tens of KiB and block.
const stallReadBuffer = 16 << 10

// stallKafka is a one-broker kfake cluster for schedules: it persists to a
// data directory, so it can be stopped and started again on the same port
// with its records, and it can stop reading the connections open at some
// moment (stopReading) while it serves new ones, as a broker whose network
// thread hung on a connection does.
type stallKafka struct {
	topic   string
	port    int
	dataDir string

	mu      sync.Mutex
	cluster *kfake.Cluster
	ln      *stallListener
}

// startStallKafka starts the broker with topic created.
func startStallKafka(topic string) (*stallKafka, error) {
	port, err := sandbox.FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "cdc-relay-chaos-kafka-")
	if err != nil {
		return nil, fmt.Errorf("create kafka data dir: %w", err)
	}
	k := &stallKafka{topic: topic, port: port, dataDir: dir}
	if err := k.start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return k, nil
}

// brokers returns the seed broker, the same across restarts.
func (k *stallKafka) brokers() []string { return []string{fmt.Sprintf("127.0.0.1:%d", k.port)} }

// start starts the stopped broker on its port and data, retrying the bind
// while the old listener's port is still taken.
func (k *stallKafka) start() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cluster != nil {
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var ln *stallListener
		c, err := kfake.NewCluster(kfake.Ports(k.port), kfake.DataDir(k.dataDir),
			kfake.DefaultNumPartitions(partitions), kfake.SeedTopics(partitions, k.topic), kfake.AllowAutoTopicCreation(),
			kfake.ListenFn(func(network, address string) (net.Listener, error) {
				l, err := net.Listen(network, address)
				if err != nil {
					return nil, err
				}
				ln = &stallListener{Listener: l, conns: make(map[*stallConn]bool)}
				return ln, nil
			}))
		if err == nil {
			k.cluster, k.ln = c, ln
			return nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return fmt.Errorf("start kafka on port %d: %w", k.port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop closes the broker: its data is kept, its port closed, every
// connection dropped (stuck ones included).
func (k *stallKafka) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cluster != nil {
		k.cluster.Close()
		k.ln.closeAll()
		k.cluster, k.ln = nil, nil
	}
}

// stopReading makes the broker stop reading every connection open now, for
// good (until the client closes it or the broker restarts); it returns how
// many. Connections opened later are served.
func (k *stallKafka) stopReading() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ln == nil {
		return 0
	}
	return k.ln.stallAll()
}

// close stops the broker and removes its data.
func (k *stallKafka) close() {
	k.stop()
	_ = os.RemoveAll(k.dataDir)
}

// stallListener is the broker's listener; it keeps the connections it
// accepted so they can be stalled.
type stallListener struct {
	net.Listener
	mu    sync.Mutex
	conns map[*stallConn]bool
}

func (l *stallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(stallReadBuffer)
	}
	sc := &stallConn{Conn: c, stuck: make(chan struct{}), closed: make(chan struct{}), l: l}
	l.mu.Lock()
	l.conns[sc] = true
	l.mu.Unlock()
	return sc, nil
}

func (l *stallListener) stallAll() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for c := range l.conns {
		c.stuckOnce.Do(func() {
			close(c.stuck)
			// Wake a read blocked now, before it takes what comes next.
			_ = c.Conn.SetReadDeadline(time.Now())
			n++
		})
	}
	return n
}

func (l *stallListener) closeAll() {
	l.mu.Lock()
	conns := make([]*stallConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// stallConn is one broker-side connection. Once stuck, Read blocks until
// the connection is closed: the broker reads nothing more from it, so the
// client's requests pile up in the socket buffers until its writes block.
type stallConn struct {
	net.Conn
	l          *stallListener
	stuck      chan struct{}
	stuckOnce  sync.Once
	closed     chan struct{}
	closedOnce sync.Once
}

func (c *stallConn) Read(b []byte) (int, error) {
	select {
	case <-c.stuck:
		<-c.closed
		return 0, net.ErrClosed
	default:
	}
	n, err := c.Conn.Read(b)
	select {
	case <-c.stuck:
		// Woken by stallAll, or a read already under way when it stalled
		// the connection (the broker may have reset the deadline stallAll
		// set): what it got was read after the stall, so the broker never
		// sees it.
		<-c.closed
		return 0, net.ErrClosed
	default:
	}
	return n, err
}

func (c *stallConn) Close() error {
	c.closedOnce.Do(func() {
		close(c.closed)
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
