package dedup

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// Reader reads what Kafka holds (the sink's producer implements it).
type Reader interface {
	// PartitionCount returns how many partitions the producer maps keys of
	// topic onto, waiting until they are known.
	PartitionCount(ctx context.Context, topic string) (int, error)
	// Ranges returns the offsets each of the first n partitions holds.
	Ranges(ctx context.Context, topic string, n int) ([]sink.Range, error)
	// Scan calls fn for each record of the partition in [from, to) with its
	// offset, id header and source position header (nil when absent).
	Scan(ctx context.Context, topic string, partition int, from, to int64, fn func(offset int64, id, source []byte) error) error
}

// fencer fences the producer sessions of earlier runs (the sink's producer
// does, sink.Kafka.Fence): once Fence(ctx, id, topic, n) returned, no
// session of an earlier run writing as the transactional id id can append to
// topic's n partitions any more, so a read of them sees all those runs ever
// appended. A Reader without it is read unfenced.
type fencer interface {
	// Claim moves the producer to the newest session of id, so that the
	// next run's Fence covers what this one writes.
	Claim(ctx context.Context, id string) error
	Fence(ctx context.Context, id, topic string, partitions int) error
}

// GateConfig configures a Gate.
type GateConfig struct {
	Reader Reader
	Ledger *Ledger
	// Origin is this relay's stream: only records stamped with it count.
	Origin *outbox.Origin
	// Persist saves a checkpoint now (with the Ledger's offsets). The Gate
	// calls it after registering a topic, before the relay first writes to
	// it, so a crash never leaves records of a topic without stored offsets.
	Persist func(ctx context.Context) error
	// Stored reports whether the checkpoint the relay started from had
	// offsets at all (false after delivery.mode at-least-once or an older relay).
	Stored      bool
	Concurrency int // partitions read at once (default 16)
	Logger      zerolog.Logger
	Metrics     *metrics.Metrics
}

// Summary is what arming found.
type Summary struct {
	// Replay is set when the stream replays events that may be in Kafka
	// (its start is before the cutoff).
	Replay     bool
	Partitions int           // partitions read
	Found      int           // replayed events found already in Kafka
	Took       time.Duration // time spent reading them
}

// Gate is the start-up reconciliation of invariant 8: for each event a
// (re)started stream replays, it reads where the relay's records of it can be
// (from the offsets stored with the checkpoint) and asks the Decider's rule
// whether Kafka already holds it. It is used from the stream's goroutine only.
type Gate struct {
	cfg GateConfig
	log zerolog.Logger

	armed     bool
	start     pglogrepl.LSN // the stream's start: replayed events commit at or after it
	cutoff    pglogrepl.LSN // events committed at or after it were never sent
	stored    checkpoint.Offsets
	topics    map[string]bool   // prepared since Arm
	lastTopic string            // of the previous Check, prepared
	found     map[string]*index // per topic read: the records of replayed events
	skipped   int               // replayed events skipped since Arm
	noted     map[string]bool   // fallbacks logged, by reason and topic
}

// NewGate returns a disarmed Gate.
func NewGate(cfg GateConfig) *Gate {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.Discard()
	}
	return &Gate{cfg: cfg, log: cfg.Logger.With().Str("component", "dedup").Logger(), noted: map[string]bool{}}
}

// Arm prepares the Gate for a stream starting at start, when events that
// commit before cutoff may have been sent by an earlier run or connection
// (cutoff is the server's WAL position once this stream holds the slot:
// nothing committed after it was ever read). topics are reconciled at once;
// any other topic when its first replayed event comes.
func (g *Gate) Arm(ctx context.Context, start, cutoff pglogrepl.LSN, topics []string) (Summary, error) {
	if f, ok := g.cfg.Reader.(fencer); ok {
		// Before anything is produced: the next run must be able to fence
		// what this one writes.
		if err := f.Claim(ctx, g.fenceID()); err != nil {
			return Summary{}, fmt.Errorf("reconcile with Kafka: %w", err)
		}
	}
	g.armed = start < cutoff
	g.start, g.cutoff = start, cutoff
	g.stored = g.cfg.Ledger.At(start)
	g.topics = map[string]bool{}
	g.lastTopic = ""
	g.found = map[string]*index{}
	g.skipped = 0
	if !g.armed {
		return Summary{}, nil
	}
	t0 := time.Now()
	var sum Summary
	for _, t := range topics {
		n, err := g.reconcile(ctx, t, true)
		if err != nil {
			return Summary{}, err
		}
		sum.Partitions += n
	}
	sum.Replay = true
	sum.Found = g.held()
	sum.Took = time.Since(t0)
	g.cfg.Metrics.ReconcileDuration.Observe(sum.Took.Seconds())
	return sum, nil
}

// Check reports whether m's event is verifiably in Kafka already, and then
// where Kafka stored it. The first event of a topic in this run prepares the
// topic: while replaying, its partitions are read; either way its offsets are
// stored before the relay writes to it. A message without an Origin (not read
// from the stream) is never in Kafka already.
func (g *Gate) Check(ctx context.Context, m sink.Message) (sink.Stored, bool, error) {
	ev, topic := m.Event, m.Topic
	if m.Origin == nil {
		return sink.Stored{}, false, nil
	}
	if g.armed && ev.CommitLSN >= g.cutoff {
		g.disarm()
	}
	if topic != g.lastTopic {
		if !g.topics[topic] {
			t0 := time.Now()
			before := g.held()
			n, err := g.reconcile(ctx, topic, g.armed)
			if err != nil {
				return sink.Stored{}, false, err
			}
			if n > 0 {
				took, found := time.Since(t0), g.held()-before
				g.cfg.Metrics.ReconcileDuration.Observe(took.Seconds())
				g.log.Info().Str("topic", topic).Int("partitions", n).Int64("duration_ms", took.Milliseconds()).
					Int("already_in_kafka", found).
					Msgf("reconciled topic %s on its first replayed event: %d partitions in %d ms, %d events already in Kafka",
						topic, n, took.Milliseconds(), found)
			}
		}
		g.lastTopic = topic
	}
	if !g.armed {
		return sink.Stored{}, false, nil
	}
	x := g.found[topic]
	if x == nil {
		return sink.Stored{}, false, nil
	}
	r, ok := x.take(ev, m.Origin)
	if !ok {
		return sink.Stored{}, false, nil
	}
	g.cfg.Metrics.DuplicatesSuppressed.Inc()
	g.skipped++
	return sink.Stored{Partition: r.partition, Offset: r.offset}, true, nil
}

// disarm ends the replay: every later event is new.
func (g *Gate) disarm() {
	g.armed = false
	if g.skipped > 0 || len(g.topics) > 0 {
		g.log.Info().Int("skipped", g.skipped).Int("topics", len(g.topics)).Str("cutoff", g.cutoff.String()).
			Msgf("replay done: %d replayed events were already in Kafka and not sent again", g.skipped)
	}
	if n := g.held(); n > 0 {
		// Records of ours no replayed event matched: older copies, or events
		// the stream no longer replays (a changed publication or filter).
		g.log.Debug().Int("unmatched", n).Msg("replay passed the cutoff")
	}
	g.found = nil
}

// reconcile prepares topic for this run. Its offsets are registered (and
// persisted) unless stored ones still fit its partition count; when scan is
// set and they fit, its partitions are read from them to their ends and the
// records of this origin's replayed events remembered. It returns the number
// of partitions read.
func (g *Gate) reconcile(ctx context.Context, topic string, scan bool) (int, error) {
	n, err := g.cfg.Reader.PartitionCount(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("reconcile topic %q: %w", topic, err)
	}
	stored, ok := g.stored[topic]
	if ok && stored.Partitions == n && !scan {
		g.topics[topic] = true
		return 0, nil
	}
	if f, can := g.cfg.Reader.(fencer); can && ok && stored.Partitions == n {
		// The partitions are read next: an earlier run's produce requests
		// still in flight (a killed run's last ones) must not land after.
		if err := f.Fence(ctx, g.fenceID(), topic, n); err != nil {
			return 0, fmt.Errorf("reconcile topic %q: %w", topic, err)
		}
	}
	ranges, err := g.cfg.Reader.Ranges(ctx, topic, n)
	if err != nil {
		return 0, fmt.Errorf("reconcile topic %q: %w", topic, err)
	}
	if !ok || stored.Partitions != n {
		if !ok && scan && !g.cfg.Stored {
			// Not registered in this run either: what an earlier run wrote is
			// not stamped with offsets to start from.
			g.fallback("no_stored_offsets", topic, fmt.Sprintf(
				"the checkpoint has no Kafka offsets (an at-least-once run or an older relay wrote it): events of topic %q after it are sent again", topic))
		}
		if ok && scan {
			g.fallback("partitions_changed", topic, fmt.Sprintf(
				"topic %q had %d partitions when written and has %d now: keys map elsewhere, so events after the checkpoint are sent again",
				topic, stored.Partitions, n))
		}
		// Nothing of ours can be there yet in this layout: record where the
		// partitions end, durably, before the relay first writes to them.
		ends := make([]int64, n)
		for p, r := range ranges {
			ends[p] = r.End
		}
		g.cfg.Ledger.Register(topic, ends)
		if err := g.cfg.Persist(ctx); err != nil {
			return 0, fmt.Errorf("reconcile topic %q: persist its offsets: %w", topic, err)
		}
		g.topics[topic] = true
		return 0, nil
	}
	x := newIndex(g.cfg.Origin, g.start, g.cutoff)
	eg, ectx := errgroup.WithContext(ctx)
	eg.SetLimit(g.cfg.Concurrency)
	for p := 0; p < n; p++ {
		from, ok := stored.Next[int32(p)]
		r := ranges[p]
		switch {
		case !ok:
			g.fallback("no_stored_offsets", topic, fmt.Sprintf("partition %s/%d has no stored offset: its events after the checkpoint are sent again", topic, p))
			continue
		case from > r.End:
			g.fallback("partition_reset", topic, fmt.Sprintf(
				"partition %s/%d ends at %d, before the stored offset %d: it was re-created or truncated, so its events after the checkpoint are sent again",
				topic, p, r.End, from))
			continue
		case from < r.Start:
			g.fallback("records_deleted", topic, fmt.Sprintf(
				"partition %s/%d starts at %d, after the stored offset %d: records were deleted; events whose records are gone are sent again",
				topic, p, r.Start, from))
			from = r.Start
		}
		if from >= r.End {
			continue
		}
		part := p
		eg.Go(func() error {
			return g.cfg.Reader.Scan(ectx, topic, part, from, r.End, func(off int64, id, src []byte) error {
				x.add(int32(part), off, id, src)
				return nil
			})
		})
	}
	if err := eg.Wait(); err != nil {
		return 0, fmt.Errorf("reconcile topic %q: %w", topic, err)
	}
	g.found[topic] = x
	g.topics[topic] = true
	return n, nil
}

// fenceID is the transactional id the runs of this stream fence each other
// with: one per database system, timeline and slot, as the source positions
// the records carry.
func (g *Gate) fenceID() string {
	o := g.cfg.Origin
	return fmt.Sprintf("cdc-relay:%s:%d:%s", o.SystemID, o.Timeline, o.Slot)
}

// held returns how many records of replayed events the Gate found and no
// event has matched yet.
func (g *Gate) held() int {
	n := 0
	for _, x := range g.found {
		n += x.len()
	}
	return n
}

// fallback counts a fallback to sending and logs it once per reason and topic.
func (g *Gate) fallback(reason, topic, msg string) {
	g.cfg.Metrics.DeliveryFallbacks.WithLabelValues(reason).Inc()
	key := reason + "\x00" + topic
	if g.noted[key] {
		return
	}
	g.noted[key] = true
	g.log.Warn().Str("reason", reason).Str("topic", topic).Msg(msg)
}
