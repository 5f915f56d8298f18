package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
)

// readGate lets a broker stop reading from its connections (Kafka.StopReading):
// a read waits while the gate is shut.
type readGate struct {
	mu   sync.Mutex
	open chan struct{} // closed while reads go through
}

func newReadGate() *readGate {
	g := &readGate{open: make(chan struct{})}
	close(g.open)
	return g
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
	return &gateConn{Conn: c, g: l.g, closed: make(chan struct{})}, nil
}

// gateConn is a connection that reads nothing while its gate is shut.
type gateConn struct {
	net.Conn
	g      *readGate
	once   sync.Once
	closed chan struct{}
}

// Read waits while the gate is shut, then reads. A read already waiting for
// data when the gate shuts still returns what arrives.
func (c *gateConn) Read(b []byte) (int, error) {
	if err := c.g.wait(c.closed); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

// Close ends a read waiting at the gate, and the connection.
func (c *gateConn) Close() error {
	c.once.Do(func() { close(c.closed) })
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
