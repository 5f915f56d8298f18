package sandbox

// Latency: a broker reached over a slow network, for measurements.

import (
	"net"
	"sync"
	"time"
)

// delayListener accepts connections whose writes (the broker's answers)
// reach the client d after they were written, as over a network with that
// one-way delay: a write returns at once, so the broker goes on reading the
// next request meanwhile, and what was written arrives in order.
type delayListener struct {
	net.Listener
	d time.Duration
}

// Accept wraps the next connection.
func (l delayListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	dc := &delayConn{Conn: c, d: l.d, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go dc.deliver()
	return dc, nil
}

// delayConn is a connection whose writes are delivered d late.
type delayConn struct {
	net.Conn
	d    time.Duration
	mu   sync.Mutex
	q    []delayed
	err  error // the first failed delivery; later writes return it
	wake chan struct{}
	once sync.Once
	done chan struct{}
}

type delayed struct {
	at time.Time
	b  []byte
}

// Write queues b for delivery d from now.
func (c *delayConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	c.q = append(c.q, delayed{at: time.Now().Add(c.d), b: append([]byte(nil), b...)})
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return len(b), nil
}

// deliver writes queued data to the connection once it is due, in order.
func (c *delayConn) deliver() {
	for {
		c.mu.Lock()
		var next *delayed
		if len(c.q) > 0 {
			next = &c.q[0]
		}
		c.mu.Unlock()
		if next == nil {
			select {
			case <-c.wake:
				continue
			case <-c.done:
				return
			}
		}
		if wait := time.Until(next.at); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-c.done:
				t.Stop()
				return
			}
		}
		_, err := c.Conn.Write(next.b)
		c.mu.Lock()
		c.q = c.q[1:]
		if err != nil && c.err == nil {
			c.err = err
		}
		c.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// Close stops the delivery and closes the connection; what was not
// delivered yet is lost, as on a network.
func (c *delayConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return c.Conn.Close()
}
