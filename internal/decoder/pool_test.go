package decoder

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

func TestValuePool(t *testing.T) {
	tests := []struct {
		name    string
		put     []int // capacities put, in order
		get     int
		wantCap int // 0: nothing fits
	}{
		{"empty pool", nil, 32 << 10, 0},
		{"exact fit", []int{32 << 10}, 32 << 10, 32 << 10},
		{"larger within a quarter", []int{40 << 10}, 32 << 10, 40 << 10},
		{"larger by more than a quarter", []int{41 << 10}, 32 << 10, 0},
		{"too small", []int{31 << 10}, 32 << 10, 0},
		{"the last recycled that fits", []int{33 << 10, 32 << 10, 64 << 10}, 32 << 10, 32 << 10},
		{"below minPooled is never pooled", []int{minPooled - 1}, minPooled - 1, 0},
		{"a need below minPooled takes nothing", []int{minPooled}, minPooled - 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p valuePool
			for _, c := range tt.put {
				p.put(make([]byte, 0, c))
			}
			got := p.get(tt.get)
			switch {
			case tt.wantCap == 0 && got != nil:
				t.Fatalf("get(%d) = buffer of cap %d, want none", tt.get, cap(got))
			case tt.wantCap != 0 && (got == nil || cap(got) != tt.wantCap || len(got) != tt.get):
				t.Fatalf("get(%d) = len %d cap %d (nil %v), want len %d cap %d", tt.get, len(got), cap(got), got == nil, tt.get, tt.wantCap)
			}
			if tt.wantCap != 0 && p.get(tt.get) != nil && len(tt.put) == 1 {
				t.Fatal("the same buffer was handed out twice")
			}
		})
	}
}

func TestValuePoolBounds(t *testing.T) {
	var p valuePool
	for range maxPooledBufs + 4 {
		p.put(make([]byte, 0, minPooled))
	}
	if len(p.free) != maxPooledBufs || p.bytes != maxPooledBufs*minPooled {
		t.Fatalf("pool holds %d buffers, %d bytes; want at most %d buffers", len(p.free), p.bytes, maxPooledBufs)
	}
	var q valuePool
	big := maxPooledBytes / 3
	for range 4 {
		q.put(make([]byte, 0, big))
	}
	if q.bytes > maxPooledBytes || len(q.free) != 3 {
		t.Fatalf("pool holds %d buffers, %d bytes; want 3, at most %d bytes", len(q.free), q.bytes, maxPooledBytes)
	}
	for range 3 {
		if q.get(big) == nil {
			t.Fatal("a pooled buffer was not handed out")
		}
	}
	if q.bytes != 0 || len(q.free) != 0 {
		t.Fatalf("empty pool counts %d bytes in %d buffers", q.bytes, len(q.free))
	}
}

// largeInsert is an outbox insert whose payload is n bytes of fill.
func largeInsert(id string, n int, fill byte) []byte {
	payload := `"` + strings.Repeat(string(fill), n-2) + `"`
	return insertMsg(outboxID, txt(id), txt("order"), txt("42"), txt("OrderPlaced"), txt(payload), txt("2024-05-01 12:00:00+00"), null)
}

func TestRecycle(t *testing.T) {
	d := primed(t, defaultConfig())
	m, err := d.Decode(largeInsert("e1", 64<<10, 'a'))
	if err != nil {
		t.Fatal(err)
	}
	first := m.Event
	buf := first.Values
	if len(buf) < 64<<10 {
		t.Fatalf("decoded event's value buffer holds %d bytes, want the payload's 64 KiB and more", len(buf))
	}
	d.Recycle(first)
	if first.Values != nil || first.ID != nil || first.Payload != nil || first.AggregateID != nil {
		t.Fatalf("recycled event still holds values: %q, payload %d bytes", first.ID, len(first.Payload))
	}
	d.Recycle(first) // twice is harmless

	m, err = d.Decode(largeInsert("e2", 64<<10, 'b'))
	if err != nil {
		t.Fatal(err)
	}
	second := m.Event
	if &second.Values[0] != &buf[0] {
		t.Fatal("the next event of the same size did not reuse the recycled buffer")
	}
	if string(second.ID) != "e2" || len(second.Payload) != 64<<10 || bytes.Count(second.Payload, []byte{'b'}) != 64<<10-2 {
		t.Fatalf("event in a reused buffer: id %q, payload %d bytes", second.ID, len(second.Payload))
	}

	// Small events are left to the garbage collector.
	m, err = d.Decode(insertMsg(outboxID, row("e3")...))
	if err != nil {
		t.Fatal(err)
	}
	d.Recycle(m.Event)
	if n := len(d.pool.free); n != 0 {
		t.Fatalf("a %d-byte value buffer was pooled", cap(m.Event.Values))
	}
}

// TestRecycleConcurrent decodes on one goroutine and recycles on another, as
// the relay does (the stream's goroutine, and where Kafka's answers arrive):
// no event may see another's bytes. Run with -race.
func TestRecycleConcurrent(t *testing.T) {
	d := primed(t, defaultConfig())
	const n = 400
	done := make(chan *decodedEvent, 16)
	var wg sync.WaitGroup
	wg.Add(1)
	errs := make(chan error, n)
	go func() {
		defer wg.Done()
		for de := range done {
			ev := de.m.Event
			if string(ev.ID) != de.id || len(ev.Payload) != de.size || bytes.Count(ev.Payload, []byte{de.fill}) != de.size-2 {
				errs <- fmt.Errorf("event %s changed before it was recycled: id %q, payload %d bytes", de.id, ev.ID, len(ev.Payload))
			}
			d.Recycle(ev)
		}
	}()
	buffers := make(map[*byte]bool)
	for i := range n {
		size := (16 + i%3*8) << 10 // three sizes, so buffers are reused across events of each
		fill := byte('a' + i%26)
		id := fmt.Sprintf("e%d", i)
		m, err := d.Decode(largeInsert(id, size, fill))
		if err != nil {
			t.Fatal(err)
		}
		buffers[&m.Event.Values[0]] = true
		done <- &decodedEvent{m: m, id: id, size: size, fill: fill}
	}
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The recycling goroutine keeps up with decoding, so buffers come back.
	if len(buffers) > n/2 {
		t.Errorf("%d events used %d distinct buffers: recycled ones were not reused", n, len(buffers))
	}
}

type decodedEvent struct {
	m    Message
	id   string
	size int
	fill byte
}

// TestRecycleReusesEvent: a recycled event is decoded into again, and then
// holds the new row's fields and headers and nothing of the old one's.
func TestRecycleReusesEvent(t *testing.T) {
	d := primed(t, withHeaders(map[string]string{"event_type": "type"}))
	seen := map[*outbox.Event]bool{}
	reused := 0
	for i := range 50 {
		id := fmt.Sprintf("e%d", i)
		m, err := d.Decode(insertMsg(outboxID, row(id)...))
		if err != nil {
			t.Fatal(err)
		}
		ev := m.Event
		if seen[ev] {
			reused++
		}
		seen[ev] = true
		want := event(id)
		want.Index = uint32(i)
		if string(ev.ID) != id || string(ev.Payload) != string(want.Payload) || ev.Index != want.Index ||
			len(ev.Headers) != 1 || ev.Headers[0].Key != "type" || string(ev.Headers[0].Value) != "OrderPlaced" {
			t.Fatalf("event %d: id %q payload %q index %d headers %v", i, ev.ID, ev.Payload, ev.Index, ev.Headers)
		}
		d.Recycle(ev)
		if ev.ID != nil || len(ev.Headers) != 0 || ev.Index != 0 {
			t.Fatalf("recycled event %d still holds id %q, %d headers, index %d", i, ev.ID, len(ev.Headers), ev.Index)
		}
	}
	if reused == 0 {
		t.Error("no recycled event was decoded into again")
	}
}

// TestReuseEventHeaders: a recycled event serves a table with any number of
// header columns (tables differ): its header slice when it has room, a new
// one when it has not, none when the table has no headers.
func TestReuseEventHeaders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		had, nh int
		wantCap int
	}{
		{"no headers wanted", 2, 0, 0},
		{"room for them", 2, 2, 2},
		{"room for fewer", 3, 1, 1},
		{"no room: a new slice", 1, 3, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d Decoder
			var hdr []outbox.Header
			reused := false
			// sync.Pool may drop what it is given (under -race, a quarter at random).
			for range 100 {
				d.Recycle(&outbox.Event{Values: []byte("x"), Headers: make([]outbox.Header, tc.had)})
				if _, hdr, reused = d.reuseEvent(tc.nh); reused {
					break
				}
			}
			if !reused {
				t.Fatal("no recycled event was reused in 100 tries")
			}
			if len(hdr) != 0 || cap(hdr) != tc.wantCap || (tc.nh == 0) != (hdr == nil) {
				t.Errorf("reuseEvent(%d) after %d headers: len %d cap %d nil %v; want empty, cap %d", tc.nh, tc.had, len(hdr), cap(hdr), hdr == nil, tc.wantCap)
			}
		})
	}
}
