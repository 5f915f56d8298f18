// Package latency measures commit-to-consumer latency: a Kafka consumer (kgo,
// through sandbox.Tail) records, for every record, the time it arrived minus
// the commit_time header (the Postgres commit timestamp of the event's
// transaction, RFC 3339). That spans commit → relay → Kafka ack → fetch, so it
// is an upper bound of commit → ack.
package latency

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// Sample is one event's latency and when its transaction committed.
type Sample struct {
	Commit  time.Time
	Latency time.Duration
}

// Consumer tails one topic and keeps one latency sample per record.
type Consumer struct {
	mu       sync.Mutex
	samples  []Sample
	received int
	noHeader int
	since    time.Time // samples of events committed before are not kept
	arrived  chan struct{}

	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Start starts consuming topic from its beginning. Call Close to stop.
func Start(ctx context.Context, brokers []string, topic string) *Consumer {
	cctx, cancel := context.WithCancel(ctx)
	c := &Consumer{cancel: cancel, done: make(chan struct{}), arrived: make(chan struct{}, 1)}
	go func() {
		defer close(c.done)
		c.err = sandbox.Tail(cctx, brokers, "^"+regexp.QuoteMeta(topic)+"$", c.record)
	}()
	return c
}

func (c *Consumer) record(r sandbox.Record) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.received++
	ct, err := time.Parse(time.RFC3339Nano, r.Headers["commit_time"])
	if err != nil {
		c.noHeader++
	} else if !ct.Before(c.since) {
		c.samples = append(c.samples, Sample{Commit: ct, Latency: now.Sub(ct)})
	}
	select {
	case c.arrived <- struct{}{}:
	default:
	}
}

// KeepFrom drops samples of events committed before t (warm-up).
func (c *Consumer) KeepFrom(t time.Time) {
	c.mu.Lock()
	c.since = t
	c.mu.Unlock()
}

// Received returns how many records arrived.
func (c *Consumer) Received() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.received
}

// WaitFor waits until n records arrived, ctx is done or timeout passed, and
// returns how many arrived.
func (c *Consumer) WaitFor(ctx context.Context, n int, timeout time.Duration) int {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		if got := c.Received(); got >= n {
			return got
		}
		select {
		case <-ctx.Done():
			return c.Received()
		case <-t.C:
			return c.Received()
		case <-c.arrived:
		case <-c.done:
			return c.Received()
		}
	}
}

// Close stops the consumer and returns the summary of its samples, or the
// error that stopped consuming early.
func (c *Consumer) Close() (Summary, error) {
	c.cancel()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Summarize(c.samples)
	s.Received = c.received
	if c.err != nil {
		return s, fmt.Errorf("consume: %w", c.err)
	}
	if c.noHeader > 0 {
		return s, fmt.Errorf("consume: %d records without a commit_time header", c.noHeader)
	}
	return s, nil
}

// Summary condenses latency samples, in milliseconds.
type Summary struct {
	Samples  int     `json:"samples"`
	Received int     `json:"received"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	Max      float64 `json:"max_ms"`
	// TailWindows counts the TailWindow-long spans of commit time that hold
	// the tail, the samples at or above p99 and above p50: a few mean the
	// tail is a few stalls, many that it is spread over the run, 0 that
	// there is none.
	TailWindows int `json:"tail_windows"`
	// CommitPause is the longest time between two consecutive commits among
	// the samples: under a steady load, how long Postgres (or the machine)
	// stopped committing.
	CommitPause float64 `json:"commit_pause_ms"`
}

// TailWindow is the span of commit time Summary.TailWindows counts in.
const TailWindow = 100 * time.Millisecond

// Summarize returns nearest-rank percentiles of samples and where their tail
// lies.
func Summarize(samples []Sample) Summary {
	s := Summary{Samples: len(samples)}
	if len(samples) == 0 {
		return s
	}
	lat := make([]time.Duration, len(samples))
	for i, x := range samples {
		lat[i] = x.Latency
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(lat)))) - 1
		return lat[min(max(i, 0), len(lat)-1)]
	}
	p50, p99 := rank(0.50), rank(0.99)
	s.P50, s.P99, s.Max = ms(p50), ms(p99), ms(lat[len(lat)-1])

	windows := map[int64]bool{}
	commits := make([]int64, 0, len(samples))
	for _, x := range samples {
		at := x.Commit.UnixNano()
		if x.Latency >= p99 && x.Latency > p50 {
			windows[at/int64(TailWindow)] = true
		}
		commits = append(commits, at)
	}
	s.TailWindows = len(windows)
	slices.Sort(commits)
	var pause int64
	for i := 1; i < len(commits); i++ {
		pause = max(pause, commits[i]-commits[i-1])
	}
	s.CommitPause = ms(time.Duration(pause))
	return s
}
