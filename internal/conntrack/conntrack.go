// Package conntrack tracks the connections a client dials, so that its owner
// can end them (and the requests in flight on them) without waiting for the
// client: the relay's producer on kafka-go and the benchmark's on kgo.
package conntrack

import (
	"context"
	"net"
	"sync"
	"time"
)

// Conns tracks the connections dialled through its Dial until they close.
// CloseAll ends them at once and refuses every later dial; CloseOpen ends
// them as a network failure would and goes on dialling. The zero value is
// ready to use.
type Conns struct {
	// Next dials for Dial; nil is a net.Dialer with a 5 s timeout.
	Next func(ctx context.Context, network, addr string) (net.Conn, error)

	mu   sync.Mutex
	open map[*trackedConn]struct{}
	done bool
}

// Dial opens a connection through Next and tracks it. After CloseAll it
// returns net.ErrClosed without dialling.
func (t *Conns) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	t.mu.Lock()
	done := t.done
	t.mu.Unlock()
	if done {
		return nil, net.ErrClosed
	}
	dial := t.Next
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
	if t.done { // CloseAll ran while this one was dialled
		c.Close()
		return nil, net.ErrClosed
	}
	if t.open == nil {
		t.open = make(map[*trackedConn]struct{})
	}
	tc := &trackedConn{Conn: c, t: t}
	t.open[tc] = struct{}{}
	return tc, nil
}

// CloseAll closes every open connection and refuses new ones. It does not
// wait for the client using them.
func (t *Conns) CloseAll() { t.closeOpen(true) }

// CloseOpen closes every open connection, like a network failure, and
// leaves Dial working.
func (t *Conns) CloseOpen() { t.closeOpen(false) }

func (t *Conns) closeOpen(done bool) {
	t.mu.Lock()
	t.done = t.done || done
	open := t.open
	t.open = nil
	t.mu.Unlock()
	for c := range open {
		c.Conn.Close()
	}
}

// trackedConn is a connection Conns tracks until it is closed.
type trackedConn struct {
	net.Conn
	t    *Conns
	once sync.Once
}

// Close stops tracking the connection and closes it.
func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.open, c)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}
