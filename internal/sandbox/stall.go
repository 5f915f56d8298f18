package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"
)

// readGate lets a broker stop reading from its connections: a read waits
// while the gate is shut (Kafka.StopReading), and a connection stalled
// (Kafka.StallConnections) reads nothing more until it is closed.
type readGate struct {
	mu    sync.Mutex
	open  chan struct{} // closed while reads go through
	conns map[*gateConn]struct{}
}

func newReadGate() *readGate {
	g := &readGate{open: make(chan struct{}), conns: map[*gateConn]struct{}{}}
	close(g.open)
	return g
}

// stallAll stalls every connection open now and returns how many it stalled.
func (g *readGate) stallAll() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for c := range g.conns {
		c.stuckOnce.Do(func() {
			close(c.stuck)
			// Wakes a read blocked now, before it takes what comes next.
			_ = c.Conn.SetReadDeadline(time.Now())
			n++
		})
	}
	return n
}

func (g *readGate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default: // already shut
	}
}

func (g *readGate) reopen() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open: // already open
	default:
		close(g.open)
	}
}

// wait returns once reads may go on, or net.ErrClosed once closed is closed.
func (g *readGate) wait(closed <-chan struct{}) error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
		return nil
	case <-closed:
		return net.ErrClosed
	}
}

// gateListener accepts connections whose reads pass through g.
type gateListener struct {
	net.Listener
	g *readGate
}

// Accept wraps the next connection.
func (l gateListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	gc := &gateConn{Conn: c, g: l.g, closed: make(chan struct{}), stuck: make(chan struct{})}
	l.g.mu.Lock()
	l.g.conns[gc] = struct{}{}
	l.g.mu.Unlock()
	return gc, nil
}

// gateConn is a connection that reads nothing while its gate is shut, nor
// ever again once stalled.
type gateConn struct {
	net.Conn
	g         *readGate
	once      sync.Once
	closed    chan struct{}
	stuckOnce sync.Once
	stuck     chan struct{} // closed when stalled
}

// Read waits while the gate is shut, then reads. A read already waiting for
// data when the gate shuts still returns what arrives. A stalled
// connection's read waits until it is closed.
func (c *gateConn) Read(b []byte) (int, error) {
	if err := c.g.wait(c.closed); err != nil {
		return 0, err
	}
	if c.stalled() {
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(b)
	if c.stalled() {
		// Woken by the stall, or read after it: the broker never sees it.
		return 0, net.ErrClosed
	}
	return n, err
}

// stalled reports whether c is stalled, then waiting until it is closed.
func (c *gateConn) stalled() bool {
	select {
	case <-c.stuck:
		<-c.closed
		return true
	default:
		return false
	}
}

// Close ends a read waiting at the gate or stalled, and the connection.
func (c *gateConn) Close() error {
	c.once.Do(func() {
		close(c.closed)
		c.g.mu.Lock()
		delete(c.g.conns, c)
		c.g.mu.Unlock()
	})
	return c.Conn.Close()
}

// listen listens on address with the broker's socket buffer sizes
// (KafkaOptions.SocketBuffer), which its connections inherit.
func (k *Kafka) listen(network, address string) (net.Listener, error) {
	lc := net.ListenConfig{}
	if n := k.opts.SocketBuffer; n > 0 {
		lc.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = errors.Join(
					syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, n),
					syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, n))
			})
			if err == nil {
				err = serr
			}
			if err != nil {
				return fmt.Errorf("set socket buffers to %d bytes: %w", n, err)
			}
			return nil
		}
	}
	return lc.Listen(context.Background(), network, address)
}

// StopReading makes the local broker stop reading from every connection,
// open or new, as a wedged broker or a network black hole: what clients
// write stays in the socket buffers, and once those are full (see
// KafkaOptions.SocketBuffer) their writes block. Answers to requests it
// read before still go out. ResumeReading undoes it; Stop and Start keep it.
// External brokers cannot be stopped: ErrExternal.
func (k *Kafka) StopReading() error {
	if k.external {
		return fmt.Errorf("stop kafka reading: %w", ErrExternal)
	}
	k.gate.shut()
	return nil
}

// ResumeReading lets the broker read from its connections again: what
// waited in the socket buffers is read in the order it was written.
func (k *Kafka) ResumeReading() {
	if !k.external {
		k.gate.reopen()
	}
}

// StallConnections makes the local broker stop reading every connection
// open now, for good (until the client closes it or the broker stops),
// while it serves connections opened later, as a broker whose network
// thread hung on those connections does: requests written to them are never
// answered, and once the socket buffers are full the client's writes block.
// It returns how many connections it stalled. External brokers cannot be
// stalled: ErrExternal.
func (k *Kafka) StallConnections() (int, error) {
	if k.external {
		return 0, fmt.Errorf("stall kafka connections: %w", ErrExternal)
	}
	return k.gate.stallAll(), nil
}
