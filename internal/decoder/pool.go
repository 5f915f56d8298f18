package decoder

import (
	"slices"
	"sync"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
)

// Bounds of the value buffers kept for reuse (valuePool).
const (
	// minPooled is the smallest buffer kept: below it a fresh allocation
	// costs about what a copy does, and the garbage collector handles small
	// objects cheaply. At 1 MiB payloads, copying the values into a fresh
	// buffer took 140 ms of CPU against 80 ms into a reused one.
	minPooled = 16 << 10
	// maxPooledBytes and maxPooledBufs bound what the pool holds, memory
	// that delivery.max_in_flight_mib does not count. One produce response may
	// acknowledge tens of events at once: with at most 16 buffers, 30% of
	// 64 KiB events still got a fresh one.
	maxPooledBytes = 8 << 20
	maxPooledBufs  = 64
	// A buffer is reused for a need of n bytes only when its capacity is
	// at most n + n/slackDivisor, so that an event does not pin a buffer
	// much larger than what the in-flight bound counts for it.
	slackDivisor = 4
)

// valuePool holds the value buffers of events the caller is done with
// (Decoder.Recycle) for the events decoded next. It is safe for concurrent
// use: events are decoded on the stream's goroutine and recycled where
// Kafka's acknowledgements arrive.
type valuePool struct {
	mu    sync.Mutex
	free  [][]byte
	bytes int
}

// get returns a buffer of length n from the pool, or nil when none fits (or
// n is below minPooled). Its contents are whatever an earlier event left.
func (p *valuePool) get(n int) []byte {
	if n < minPooled {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// The most recently recycled first: the likeliest to be in a cache.
	for i := len(p.free) - 1; i >= 0; i-- {
		b := p.free[i]
		if c := cap(b); c >= n && c <= n+n/slackDivisor {
			p.free = slices.Delete(p.free, i, i+1) // which clears the vacated slot
			p.bytes -= c
			return b[:n]
		}
	}
	return nil
}

// put keeps b for a later get, unless it is small or the pool is full: then
// the garbage collector takes it.
func (p *valuePool) put(b []byte) {
	c := cap(b)
	if c < minPooled {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) >= maxPooledBufs || p.bytes+c > maxPooledBytes {
		return
	}
	p.free = append(p.free, b[:0])
	p.bytes += c
}

// Poison is the byte Config.PoisonRecycled writes over a recycled event's
// values.
const Poison = 0xEE

// Recycle takes back ev, an event a Decoder returned, and its value buffer
// (outbox.Event.Values), for the events decoded next. Call it once per
// event, once the event is done, acknowledged by Kafka or stored as a dead
// letter, when nothing will read it again: the next event decoded may be ev
// itself, with another row's values. Recycle clears ev, so that a late
// reader finds it empty rather than another event's bytes until then.
// Events without a value buffer (built elsewhere) are left alone. Safe for
// use concurrently with Decode.
func (d *Decoder) Recycle(ev *outbox.Event) {
	if ev.Values == nil {
		return
	}
	if d.poison {
		// On a goroutine of its own: under -race, a stage that reads ev
		// after its done races with this write, whichever runs first.
		go d.recycle(ev, true)
		return
	}
	d.recycle(ev, false)
}

// recycle is Recycle's work, with ev's bytes poisoned first when poison.
func (d *Decoder) recycle(ev *outbox.Event, poison bool) {
	buf := ev.Values
	if poison {
		full := buf[:cap(buf)]
		for i := range full {
			full[i] = Poison
		}
	}
	hdr := ev.Headers[:cap(ev.Headers)]
	clear(hdr) // their values are in buf
	*ev = outbox.Event{Headers: hdr[:0]}
	d.pool.put(buf)
	d.events.Put(ev)
}

// reuseEvent returns a recycled event, cleared, and its header slice with
// room for nh headers (nil when nh is 0); reused is false when there was
// none (ev is nil) or it has no room for nh headers (hdr is nil).
func (d *Decoder) reuseEvent(nh int) (ev *outbox.Event, hdr []outbox.Header, reused bool) {
	ev, _ = d.events.Get().(*outbox.Event)
	if ev == nil {
		return nil, nil, false
	}
	if nh == 0 {
		ev.Headers = nil
		return ev, nil, true
	}
	if cap(ev.Headers) >= nh {
		return ev, ev.Headers[:0:nh], true
	}
	ev.Headers = nil
	return ev, make([]outbox.Header, 0, nh), true
}
