package chaos

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// TestStallKafkaStopsReading checks the broker-stops-reading fault itself:
// once stopReading took a connection, a client's writes on it block (a write
// with a deadline times out within a few MiB) while a new connection is
// served; after a restart the broker serves again.
func TestStallKafkaStopsReading(t *testing.T) {
	k, err := startStallKafka("stall.test")
	if err != nil {
		t.Fatal(err)
	}
	defer k.close()
	addr := k.brokers()[0]
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	for k.stopReading() == 0 { // until the broker accepted it
		if time.Now().After(deadline) {
			t.Fatal("the broker never accepted the connection")
		}
		time.Sleep(10 * time.Millisecond)
	}
	chunk := make([]byte, 64<<10)
	written, blocked := 0, false
	for written < 64<<20 {
		if err := conn.SetWriteDeadline(time.Now().Add(500 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		n, err := conn.Write(chunk)
		written += n
		if errors.Is(err, os.ErrDeadlineExceeded) {
			blocked = true
			break
		}
		if err != nil {
			t.Fatalf("write after %d bytes: %v", written, err)
		}
	}
	if !blocked {
		t.Fatalf("%d bytes written to a connection the broker stopped reading, want the writes to block", written)
	}
	t.Logf("writes blocked after %d KiB", written>>10)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := probeKafka(ctx, addr); err != nil {
		t.Fatalf("a new connection is not served: %v", err)
	}
	k.stop()
	if err := k.start(); err != nil {
		t.Fatal(err)
	}
	if _, err := probeKafka(ctx, addr); err != nil {
		t.Fatalf("not served after a restart: %v", err)
	}
}
