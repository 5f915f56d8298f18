package replication

import (
	"bytes"
	"context"
	"io"
	"net"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// tcpPair returns a coalescing client connection over window and the
// server's end of it, on loopback.
func tcpPair(t *testing.T, window time.Duration) (*coalescingConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	dial := coalescingDialer((&net.Dialer{}).DialContext, window)
	c, err := dial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); srv.Close() })
	cc, ok := c.(*coalescingConn)
	if !ok {
		t.Fatalf("a TCP connection was dialed as %T, not coalescing", c)
	}
	return cc, srv
}

// TestCoalescingWaitsForAChunk: with a chunk wanted, a read that finds the
// socket empty is woken only once that many bytes arrived, so 1,000-byte
// writes a millisecond apart are taken in a few large reads (without
// coalescing, about one read per write), whole and in order.
func TestCoalescingWaitsForAChunk(t *testing.T) {
	c, srv := tcpPair(t, 10*time.Second) // no fallback during the writes
	c.chunk = maxLowat
	const writes, size = 40, 1000
	msg := make([]byte, size)
	var want bytes.Buffer
	for i := 0; i < writes; i++ {
		for j := range msg {
			msg[j] = byte(i)
		}
		want.Write(msg)
	}
	go func() {
		b := want.Bytes()
		for i := 0; i < writes; i++ {
			if _, err := srv.Write(b[i*size : (i+1)*size]); err != nil {
				return
			}
			time.Sleep(time.Millisecond) // spacing, so an eager reader would wake per write
		}
	}()
	got := make([]byte, want.Len())
	largest, reads := 0, 0
	chunkReads := -1 // socket reads before the tail, which waits only 10 ms
	for n := 0; n < len(got); {
		m, err := c.Read(got[n:])
		if err != nil {
			t.Fatalf("read after %d bytes: %v", n, err)
		}
		if c.socketReads > reads {
			reads = c.socketReads
			largest = max(largest, c.w)
		}
		if c.lowatError != nil {
			t.Fatal(c.lowatError)
		}
		if n+m >= len(got)-maxLowat && chunkReads < 0 {
			// The tail is less than a chunk: it may come in as many reads as
			// writes on a busy machine, so only the reads before it count.
			c.window = 10 * time.Millisecond
			chunkReads = reads
		}
		n += m
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatal("bytes arrived changed or out of order")
	}
	if largest < maxLowat {
		t.Errorf("largest socket read took %d bytes, want at least the %d-byte chunk (SO_RCVLOWAT not applied?)", largest, maxLowat)
	}
	// An eager reader wakes per write: about 24 reads before the tail.
	if chunkReads > writes/4 {
		t.Errorf("%d socket reads for the %d writes before the tail (%d in all): reads were not coalesced", chunkReads, writes, reads)
	}
}

// TestCoalescingLargeReads: a read into a buffer as large as the
// connection's own goes straight to the socket, without that buffer; bytes
// a small read left buffered still come first, whole and in order.
func TestCoalescingLargeReads(t *testing.T) {
	c, srv := tcpPair(t, 10*time.Millisecond)
	want := make([]byte, 3*coalesceBuffer+123)
	for i := range want {
		want[i] = byte(i * 7)
	}
	go func() { _, _ = srv.Write(want) }()
	big := make([]byte, 2*coalesceBuffer)
	got := readLarge(t, c, big, nil, len(want))
	if !bytes.Equal(got, want) {
		t.Fatal("bytes of large reads changed or out of order")
	}
	if c.buf != nil {
		t.Errorf("large reads went through the connection's %d-byte buffer", len(c.buf))
	}

	// A small read buffers what the socket has; a large read then returns
	// those bytes before reading the socket again.
	go func() { _, _ = srv.Write(want) }()
	small := make([]byte, 10)
	n, err := io.ReadFull(c, small)
	if err != nil {
		t.Fatalf("small read: %v", err)
	}
	got = readLarge(t, c, big, small[:n], len(want))
	if !bytes.Equal(got, want) {
		t.Fatal("bytes after a small read changed or out of order")
	}
}

// readLarge appends to got what reads into big return until it holds total
// bytes.
func readLarge(t *testing.T, c *coalescingConn, big, got []byte, total int) []byte {
	t.Helper()
	got = slices.Clone(got)
	for len(got) < total {
		n, err := c.Read(big)
		if err != nil {
			t.Fatalf("large read after %d bytes: %v", len(got), err)
		}
		got = append(got, big[:n]...)
	}
	return got
}

// TestCoalescingTakesWhatIsThere: a chunk that does not come within twice the
// window does not hold a read up: it returns the few bytes there are, long
// before the caller's deadline.
func TestCoalescingTakesWhatIsThere(t *testing.T) {
	c, srv := tcpPair(t, 20*time.Millisecond)
	c.chunk = maxLowat
	if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 3; round++ { // and again after a fallback
		if _, err := srv.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 16)
		n, err := c.Read(got)
		if err != nil {
			t.Fatalf("round %d: read: %v", round, err)
		}
		if string(got[:n]) != "hello" {
			t.Fatalf("round %d: read %q, want hello", round, got[:n])
		}
		c.chunk = maxLowat // the rate estimate would turn it off; keep it on
	}
}

// TestCoalescingDeadlines: the caller's deadline still ends a read waiting
// for a chunk, whether it was set before the read or, from another
// goroutine, during it (how the stream wakes a read to stop); the
// connection reads again afterwards.
func TestCoalescingDeadlines(t *testing.T) {
	c, srv := tcpPair(t, 10*time.Second)
	c.chunk = maxLowat
	buf := make([]byte, 16)

	if err := c.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(buf); !isTimeout(err) {
		t.Fatalf("read past the deadline: %v, want a timeout", err)
	}

	if err := c.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(buf)
		done <- err
	}()
	// Wake it the way Stream.receive does; it was blocked with no deadline.
	// Repeat until it returns (the read may not have started yet).
	for woken := false; !woken; {
		if err := c.SetReadDeadline(time.Now()); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if !isTimeout(err) {
				t.Fatalf("woken read: %v, want a timeout", err)
			}
			woken = true
		case <-time.After(100 * time.Millisecond):
		}
	}

	if err := c.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Write([]byte("again")); err != nil {
		t.Fatal(err)
	}
	c.window = 10 * time.Millisecond // fall back soon: the chunk never comes
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "again" {
		t.Fatalf("read after the timeouts: %q, %v", buf[:n], err)
	}
}

// TestCoalescingChunkFromRate: the chunk is what arrives in one window at the
// measured byte rate, bounded, and off when that is too little to be worth a
// wait; small changes keep the chunk.
func TestCoalescingChunkFromRate(t *testing.T) {
	tests := []struct {
		name      string
		window    time.Duration
		before    int // chunk before
		bytesPerS float64
		want      int
	}{
		{"idle", time.Millisecond, 1, 0, 1},
		{"1k events/s", time.Millisecond, 1, 450e3, 1},
		{"below the minimum", time.Millisecond, 1, 7e6, 1},
		{"backlog", time.Millisecond, 1, 12e6, 12000},
		{"fast backlog: the maximum", time.Millisecond, 1, 80e6, maxLowat},
		{"longer window", 2 * time.Millisecond, 1, 6e6, 12000},
		{"small change kept", time.Millisecond, 12000, 13e6, 12000},
		{"large change taken", time.Millisecond, 9000, 13e6, 13000},
		{"rate falls: off", time.Millisecond, maxLowat, 1e6, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			c := &coalescingConn{window: tt.window, now: func() time.Time { return now }, lowat: 1, chunk: tt.before}
			c.account(0) // opens the rate window
			now = now.Add(rateWindow)
			c.account(int(tt.bytesPerS * rateWindow.Seconds()))
			if c.chunk != tt.want {
				t.Errorf("chunk %d, want %d", c.chunk, tt.want)
			}
		})
	}
}

// TestCoalescingOnlyTCP: a Unix socket (whose poll ignores SO_RCVLOWAT) is
// returned as dialed.
func TestCoalescingOnlyTCP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			_, _ = io.Copy(io.Discard, c)
		}
	}()
	c, err := coalescingDialer((&net.Dialer{}).DialContext, time.Millisecond)(context.Background(), "unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*coalescingConn); ok {
		t.Error("a Unix socket connection was wrapped")
	}
}

// TestReadBufferDialer: a TCP connection dialed through readBufferDialer has
// the receive buffer asked for (Linux reports twice the size set, its
// bookkeeping included); a non-TCP connection is returned as dialed.
func TestReadBufferDialer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close() // the client's socket option is what is checked
		}
	}()
	var d net.Dialer
	for _, size := range []int{32 << 10, 64 << 10} {
		c, err := readBufferDialer(d.DialContext, size)(context.Background(), "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var got int
		var serr error
		if err := raw.Control(func(fd uintptr) { got, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF) }); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		c.Close()
		if got != 2*size {
			t.Errorf("SO_RCVBUF = %d after asking for %d, want %d", got, size, 2*size)
		}
	}
}
