package sink

// Connections: tracked so Close can end requests in flight.

import (
	"context"
	"net"
	"sync"
	"time"
)

// connTracker wraps the Transport's Dial and remembers open connections, so
// Close can end requests kafka-go would otherwise wait on until their timeout.
type connTracker struct {
	dial  func(context.Context, string, string) (net.Conn, error)
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
}

// Dial opens a connection and tracks it until it is closed.
func (t *connTracker) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	dial := t.dial
	if dial == nil {
		d := net.Dialer{Timeout: 5 * time.Second}
		dial = d.DialContext
	}
	c, err := dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		c.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: c, t: t}
	t.conns[tc] = struct{}{}
	return tc, nil
}

func (t *connTracker) closeAll() {
	t.mu.Lock()
	t.done = true
	conns := t.conns
	t.conns = map[net.Conn]struct{}{}
	t.mu.Unlock()
	for c := range conns {
		c.(*trackedConn).Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	t    *connTracker
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns, c)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}
