package conntrack

import (
	"context"
	"errors"
	"net"
	"testing"
)

// pipes is a Next that dials in-memory pipes and keeps their far ends, which
// read io.EOF once the near end closes.
type pipes struct{ far []net.Conn }

func (p *pipes) dial(context.Context, string, string) (net.Conn, error) {
	near, far := net.Pipe()
	p.far = append(p.far, far)
	return near, nil
}

// closed reports whether the near end of the i-th pipe is closed.
func (p *pipes) closed(i int) bool {
	_, err := p.far[i].Read(make([]byte, 1))
	return err != nil
}

func TestConns(t *testing.T) {
	tests := []struct {
		name       string
		end        func(*Conns)
		dialsAfter bool
	}{
		{name: "CloseOpen", end: (*Conns).CloseOpen, dialsAfter: true},
		{name: "CloseAll", end: (*Conns).CloseAll, dialsAfter: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &pipes{}
			c := &Conns{Next: p.dial}
			var got []net.Conn
			for range 3 {
				conn, err := c.Dial(context.Background(), "tcp", "x:1")
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, conn)
			}
			if err := got[0].Close(); err != nil { // closed by its user: no longer tracked
				t.Fatal(err)
			}
			if n := len(c.open); n != 2 {
				t.Fatalf("%d connections tracked after one of 3 closed, want 2", n)
			}
			tt.end(c)
			for i := range got {
				if !p.closed(i) {
					t.Errorf("connection %d still open after %s", i, tt.name)
				}
			}
			conn, err := c.Dial(context.Background(), "tcp", "x:1")
			switch {
			case tt.dialsAfter && err != nil:
				t.Fatalf("dial after %s: %v", tt.name, err)
			case !tt.dialsAfter && !errors.Is(err, net.ErrClosed):
				t.Fatalf("dial after %s: %v, want net.ErrClosed", tt.name, err)
			case !tt.dialsAfter && len(p.far) != 3:
				t.Fatalf("dial after %s dialled (%d dials, want 3)", tt.name, len(p.far))
			}
			if conn != nil {
				conn.Close()
			}
		})
	}
}
