package chaos

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// ledgerEvent is one event a schedule's writer tried to commit.
type ledgerEvent struct {
	ID  string
	Key string // the aggregate id, the Kafka key
	Seq int    // the key's events are numbered in commit order (gaps allowed)
	// Where names the table, partition or "message" the event went to.
	Where  string
	bucket int // the partition's bucket of a row of outbox_p, else 0
	// Step is the schedule step during which it was written (0: before
	// the first).
	Step int
}

// ledger is the Jepsen-style record of a schedule: every event the writers
// tried, and whether its transaction committed. An event committed must be
// in Kafka once (more only when the run may have duplicates), in per-key
// commit order; one whose transaction rolled back (or whose savepoint did)
// must never be. Writers add to it; the checker reads a snapshot.
type ledger struct {
	mu        sync.Mutex
	committed map[string]ledgerEvent
	aborted   map[string]ledgerEvent
}

func newLedger() *ledger {
	return &ledger{committed: make(map[string]ledgerEvent), aborted: make(map[string]ledgerEvent)}
}

// commit records evs as committed and rolledBack (savepoints rolled back in
// the same transaction) as never committed.
func (l *ledger) commit(evs, rolledBack []ledgerEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range evs {
		l.committed[e.ID] = e
	}
	for _, e := range rolledBack {
		l.aborted[e.ID] = e
	}
}

// abort records evs as never committed.
func (l *ledger) abort(evs []ledgerEvent) { l.commit(nil, evs) }

// snapshot copies the ledger for a check.
func (l *ledger) snapshot() (committed, aborted map[string]ledgerEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.committed), maps.Clone(l.aborted)
}

// Verdict compares a ledger with the records in Kafka.
type Verdict struct {
	Committed, Aborted, Records int
	// Lost: committed, never in Kafka. Duplicated: records beyond the first
	// of an event. Phantoms: records of events that never committed (rolled
	// back, or unknown to the ledger). Mismatched: records whose key or
	// value is not the committed event's.
	Lost, Duplicated, Phantoms, Mismatched int
	// OrderViolations: a key's events first arriving out of commit order,
	// or a key on two partitions.
	OrderViolations int
	// LostBy counts the lost events by where and step ("outbox_p_3 step 4").
	LostBy map[string]int
	// DeadLettered: committed, never in Kafka, in the relay's dead letter
	// table with a code docs/guarantee.md names for the event's situation
	// (deadLetterAllowed); DeadLetteredBy counts them by code. BadDeadLetters:
	// dead letters of no committed event, or with a code the situation does
	// not allow (a failure).
	DeadLettered, BadDeadLetters int
	DeadLetteredBy               map[string]int
	// Replays is how many cdc-relay replay runs the schedule ran beside the
	// stream, Replayed their records in Kafka (not counted above: a replay
	// is no duplicate of the stream). ReplayMissing: rows of a replay's
	// window it never published; ReplayRepeated: rows twice within one
	// replay; ReplayUnselected: records of no row of its window;
	// ReplayOrder: a key's rows out of commit order within one replay;
	// ReplayCounts: replays whose printed counts are not what reached Kafka
	// (checkReplays).
	Replays, Replayed                                                          int
	ReplayMissing, ReplayRepeated, ReplayUnselected, ReplayOrder, ReplayCounts int
	// Samples are the first problems of each kind.
	Samples []string
	sampled map[string]int
}

// sample adds a problem of kind to the samples, the first maxSamples of
// each kind.
func (v *Verdict) sample(kind string, format string, args ...any) {
	if v.sampled == nil {
		v.sampled = map[string]int{}
	}
	if v.sampled[kind]++; v.sampled[kind] <= maxSamples {
		v.Samples = append(v.Samples, kind+": "+fmt.Sprintf(format, args...))
	}
}

// ok reports whether nothing was lost, reordered, invented or altered, and
// duplicates only when allowed.
func (v Verdict) ok(duplicatesAllowed bool) bool {
	return v.Lost == 0 && v.BadDeadLetters == 0 && v.Phantoms == 0 && v.Mismatched == 0 && v.OrderViolations == 0 &&
		(v.Duplicated == 0 || duplicatesAllowed) &&
		v.ReplayMissing == 0 && v.ReplayRepeated == 0 && v.ReplayUnselected == 0 && v.ReplayOrder == 0 && v.ReplayCounts == 0
}

// String is the Verdict on one line.
func (v Verdict) String() string {
	s := fmt.Sprintf("committed=%d aborted=%d records=%d lost=%d duplicated=%d phantoms=%d mismatched=%d order_violations=%d",
		v.Committed, v.Aborted, v.Records, v.Lost, v.Duplicated, v.Phantoms, v.Mismatched, v.OrderViolations)
	if len(v.LostBy) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(v.LostBy)) {
			parts = append(parts, fmt.Sprintf("%s: %d", k, v.LostBy[k]))
		}
		s += " lost_by=[" + strings.Join(parts, ", ") + "]"
	}
	if v.DeadLettered > 0 || v.BadDeadLetters > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(v.DeadLetteredBy)) {
			parts = append(parts, fmt.Sprintf("%s: %d", k, v.DeadLetteredBy[k]))
		}
		s += fmt.Sprintf(" dead_lettered=%d [%s] bad_dead_letters=%d", v.DeadLettered, strings.Join(parts, ", "), v.BadDeadLetters)
	}
	if v.Replays > 0 {
		s += fmt.Sprintf(" replays=%d replayed=%d replay_missing=%d replay_repeated=%d replay_unselected=%d replay_order=%d replay_counts=%d",
			v.Replays, v.Replayed, v.ReplayMissing, v.ReplayRepeated, v.ReplayUnselected, v.ReplayOrder, v.ReplayCounts)
	}
	return s
}

// maxSamples bounds the samples of each kind.
const maxSamples = 5

// deadLetter is a row of the relay's dead letter table.
type deadLetter struct {
	EventID, Code string
}

// deadLetterAllowed says whether an event the relay dead-lettered with code
// instead of publishing it is what docs/guarantee.md promises for its
// situation ("" when allowed, else why not).
type deadLetterAllowed func(ev ledgerEvent, code string) string

// checkLedger checks the records of the schedule's topic (any order) and
// the relay's dead letters against the ledger: a committed event missing
// from Kafka is dead-lettered when a dead letter allowed for it holds it,
// else lost.
func checkLedger(committed, aborted map[string]ledgerEvent, records []sandbox.Record, dead []deadLetter, allowed deadLetterAllowed) Verdict {
	v := Verdict{Committed: len(committed), Aborted: len(aborted), Records: len(records), LostBy: map[string]int{}, DeadLetteredBy: map[string]int{}}
	recs := slices.Clone(records)
	slices.SortStableFunc(recs, func(a, b sandbox.Record) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	sample := v.sample
	seen := make(map[string]string, len(committed)) // id: where it first is
	home := map[string]int32{}
	lastSeq := map[string]int{}
	for _, r := range recs {
		key, id := string(r.Key), r.Headers["id"]
		at := fmt.Sprintf("%d@%d", r.Partition, r.Offset)
		if p, ok := home[key]; !ok {
			home[key] = r.Partition
		} else if p != r.Partition {
			v.OrderViolations++
			sample("order", "key %q on partitions %d and %s", key, p, at)
			home[key] = r.Partition
		}
		ev, ok := committed[id]
		if !ok {
			v.Phantoms++
			if a, was := aborted[id]; was {
				sample("phantom", "event %s (%s, key %q seq %d, step %d) rolled back, in Kafka at %s", id, a.Where, a.Key, a.Seq, a.Step, at)
			} else {
				sample("phantom", "record at %s with id %q, key %q was never written", at, id, key)
			}
			continue
		}
		if first, ok := seen[id]; ok {
			v.Duplicated++
			sample("duplicate", "event %s (%s, key %q seq %d, step %d) at %s again at %s (source_position %s)",
				id, ev.Where, ev.Key, ev.Seq, ev.Step, first, at, r.Headers["source_position"])
			continue
		}
		seen[id] = at + " (source_position " + r.Headers["source_position"] + ")"
		if agg, seq, ok := aggSeqOf(r.Value); key != ev.Key || !ok || agg != ev.Key || seq != ev.Seq {
			v.Mismatched++
			sample("mismatch", "event %s at %s has key %q value %.80q, want key %q seq %d", id, at, key, r.Value, ev.Key, ev.Seq)
		}
		if last, ok := lastSeq[key]; ok && ev.Seq <= last {
			v.OrderViolations++
			sample("order", "key %q: seq %d (event %s, %s, step %d) at %s first arrives after seq %d", key, ev.Seq, id, ev.Where, ev.Step, at, last)
		}
		lastSeq[key] = max(lastSeq[key], ev.Seq)
	}
	codes := map[string]string{}
	for _, d := range dead {
		codes[d.EventID] = d.Code
		if _, ok := committed[d.EventID]; !ok {
			v.BadDeadLetters++
			sample("dead letter", "event %q dead-lettered with code %s was never committed", d.EventID, d.Code)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(committed)) {
		if _, ok := seen[id]; ok {
			continue
		}
		ev := committed[id]
		if code, ok := codes[id]; ok {
			if why := allowed(ev, code); why != "" {
				v.BadDeadLetters++
				sample("dead letter", "event %s (%s, key %q seq %d, step %d) dead-lettered with code %s: %s", id, ev.Where, ev.Key, ev.Seq, ev.Step, code, why)
				continue
			}
			v.DeadLettered++
			v.DeadLetteredBy[code]++
			continue
		}
		v.Lost++
		v.LostBy[fmt.Sprintf("%s step %d", ev.Where, ev.Step)]++
		sample("lost", "event %s (%s, key %q seq %d, step %d)", id, ev.Where, ev.Key, ev.Seq, ev.Step)
	}
	return v
}

// aggSeqOf reads the "agg" and "seq" members of a payload the schedule's
// writers wrote.
func aggSeqOf(v []byte) (agg string, seq int, ok bool) {
	var p struct {
		Agg string `json:"agg"`
		Seq *int   `json:"seq"`
	}
	if json.Unmarshal(v, &p) != nil || p.Seq == nil {
		return "", 0, false
	}
	return p.Agg, *p.Seq, true
}
