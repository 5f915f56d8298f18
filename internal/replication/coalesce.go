package replication

// Read coalescing. Postgres' walsender sends every pgoutput message (BEGIN,
// each row, COMMIT) with its own send(), and a reader that wakes for each one
// pays a wake-up and a read per message, and makes the walsender pay the
// wake-up too. For one event per transaction that is most of both processes'
// CPU. With SO_RCVLOWAT the kernel wakes the reader only once a chunk of bytes
// has arrived; the chunk is sized from the recent byte rate so that waiting for
// it takes about the coalescing window, and a read that has waited twice the
// window takes what is there, so the window bounds the latency it adds.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

const (
	// maxLowat is the largest chunk a read waits for: larger chunks measured
	// no faster (bench, 1 event per transaction) and only add latency.
	maxLowat = 16 << 10
	// minLowat: a smaller chunk is not worth a wait (smaller ones measured
	// no saving for the walsender); coalescing is off below it.
	minLowat = 8 << 10
	// rateWindow is how often the byte rate, and so the chunk, is re-estimated.
	rateWindow = 20 * time.Millisecond
	// coalesceBuffer is the read buffer: pgconn reads 8 KiB at a time, so one
	// wake-up would otherwise take several reads.
	coalesceBuffer = 64 << 10
)

// coalescingDialer wraps dial so that TCP connections coalesce reads over
// window. Other connections (Unix sockets, whose poll ignores SO_RCVLOWAT) are
// returned as dialed.
func coalescingDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error), window time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			return c, nil
		}
		raw, err := tc.SyscallConn()
		if err != nil {
			return c, nil // no socket to tune: read as dialed
		}
		return &coalescingConn{Conn: c, raw: raw, window: window, now: time.Now, lowat: 1, chunk: 1}, nil
	}
}

// coalescingConn is a TCP connection whose reads wait for a chunk of bytes
// (SO_RCVLOWAT) sized from the recent byte rate. Read is called by one
// goroutine at a time; the deadline setters may be called concurrently with
// it (the stream wakes a read that way).
type coalescingConn struct {
	net.Conn
	raw    syscall.RawConn
	window time.Duration
	now    func() time.Time

	mu    sync.Mutex
	outer time.Time // the read deadline the caller set

	// Read's own state.
	lowat       int       // the SO_RCVLOWAT in force; 1 is the kernel's default
	chunk       int       // the SO_RCVLOWAT wanted; 1: no coalescing
	shortened   bool      // the socket's read deadline is Read's, not outer
	buf         []byte    // bytes read from the socket and not yet returned
	r, w        int       // buf[r:w] is unread
	rateStart   time.Time // the current rate window
	rateBytes   int       // bytes read in it
	lowatError  error     // setsockopt failed once: coalescing stays off
	socketReads int       // reads of the socket (tests)
}

// SetReadDeadline records t as the caller's deadline and applies it.
func (c *coalescingConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.outer = t
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline records t as the caller's read deadline and applies it to
// reads and writes.
func (c *coalescingConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.outer = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *coalescingConn) outerDeadline() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.outer
}

// Read returns buffered bytes, or reads the socket: waiting for the chunk
// when coalescing, and for any byte once it waited twice the window.
func (c *coalescingConn) Read(b []byte) (int, error) {
	if c.r < c.w {
		n := copy(b, c.buf[c.r:c.w])
		c.r += n
		return n, nil
	}
	// A read as large as our buffer (pgconn reading a large message) fills
	// the caller's: going through ours would only copy every byte once more.
	direct := len(b) >= coalesceBuffer
	dst := b
	if !direct {
		if c.buf == nil {
			c.buf = make([]byte, coalesceBuffer)
		}
		dst = c.buf
	}
	n, err := c.readSocket(dst)
	c.socketReads++
	c.account(n)
	if n == 0 {
		return 0, err
	}
	if direct {
		return n, nil // an error with data comes back on the next read
	}
	c.r, c.w = 0, n
	m := copy(b, c.buf[:n])
	c.r = m
	return m, nil // an error with data comes back on the next read
}

// readSocket fills dst from the socket once.
func (c *coalescingConn) readSocket(dst []byte) (int, error) {
	outer := c.outerDeadline()
	if c.lowat != c.chunk {
		c.setLowat(c.chunk)
	}
	if c.lowat <= 1 {
		if c.shortened {
			c.shortened = false
			if err := c.Conn.SetReadDeadline(outer); err != nil {
				return 0, err
			}
		}
		return c.Conn.Read(dst)
	}
	d := c.now().Add(2 * c.window)
	if !outer.IsZero() && outer.Before(d) {
		d = outer
	}
	c.shortened = true
	if err := c.Conn.SetReadDeadline(d); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(dst)
	if n > 0 || !isTimeout(err) {
		return n, err
	}
	// The caller's deadline passed (or was set while reading: it is re-read),
	// or the chunk did not come within twice the window: take what is there
	// (the next read waits for a chunk again).
	outer = c.outerDeadline()
	if !outer.IsZero() && !c.now().Before(outer) {
		return 0, err
	}
	c.setLowat(1)
	c.shortened = false
	if err := c.Conn.SetReadDeadline(outer); err != nil {
		return 0, err
	}
	return c.Conn.Read(dst)
}

// account adds n bytes to the rate window and, at its end, sizes the chunk
// to what arrives in one coalescing window at that rate.
func (c *coalescingConn) account(n int) {
	now := c.now()
	if c.rateStart.IsZero() {
		c.rateStart = now
	}
	c.rateBytes += n
	elapsed := now.Sub(c.rateStart)
	if elapsed < rateWindow {
		return
	}
	want := int(float64(c.rateBytes) * float64(c.window) / float64(elapsed))
	switch {
	case want < minLowat:
		want = 1
	case want > maxLowat:
		want = maxLowat
	}
	c.rateStart, c.rateBytes = now, 0
	// Small changes are not worth a system call.
	if want == 1 || c.chunk == 1 || want*4 < c.chunk*3 || want*3 > c.chunk*4 {
		c.chunk = want
	}
}

// setLowat sets SO_RCVLOWAT. A failure turns coalescing off for good: reads
// then wake for any byte, as without it.
func (c *coalescingConn) setLowat(v int) {
	if c.lowatError != nil {
		c.chunk = 1
		return
	}
	var serr error
	err := c.raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, v)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		c.lowatError = os.NewSyscallError("setsockopt SO_RCVLOWAT", err)
		c.lowat, c.chunk = 1, 1
		return
	}
	c.lowat = v
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// readBufferDialer wraps dial so that TCP connections get a receive buffer
// (SO_RCVBUF) of size bytes, which also turns off the kernel's tuning of it.
// The walsender sends each pgoutput message with its own send() whatever the
// reader does (3 per one-event transaction, counted with perf under every
// reader), so a small buffer does not make its sends larger; what it changes
// is measured, not explained. Measured (bench, 200,000
// events): with 32 KiB, one-event transactions cost the walsender 5.60-6.20
// us per event against 6.95-8.15 with the kernel's tuning, and the relay
// drained 142-162k against 110-134k events/s; but 10-event transactions
// drained at 177-179k against 202k. A window this small also bounds the rate
// to it per round trip: 32 KiB per 1 ms is 32 MB/s. So it is an option, off
// by default.
func readBufferDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error), size int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if tc, ok := c.(*net.TCPConn); ok {
			if err := tc.SetReadBuffer(size); err != nil {
				c.Close()
				return nil, fmt.Errorf("set the receive buffer (SO_RCVBUF) to %d bytes: %w", size, err)
			}
		}
		return c, nil
	}
}
