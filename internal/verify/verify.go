// Package verify checks at-least-once delivery end to end: a Writer commits
// numbered outbox events to Postgres (each aggregate's events carry a
// sequence number in commit order), and Check compares what was committed
// with the records read back from Kafka: events missing (lost), records
// beyond the first of each event (duplicates), and per-key order violations.
//
// It is used by the end-to-end tests of the built binary and by the fault
// injection scenarios of chaos/internal/chaos, so it takes contexts and returns
// errors instead of failing a test.
package verify

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// Event is one committed outbox row as the writer knows it: Seq numbers the
// events of one aggregate in commit order (gaps allowed).
type Event struct {
	ID            string
	Agg           string
	Seq           int
	AggregateType string // "" skips the header check
	EventType     string // "" skips the header check
}

// Result compares the committed events with the records in Kafka.
type Result struct {
	Committed  int
	Records    int
	Missing    []string // ids of committed events not in Kafka: lost
	Duplicates int      // records beyond the first of each event id
	Unknown    int      // records whose id was not committed (or has no id)
	// Mismatches are records whose key, value or headers do not match the
	// committed event.
	Mismatches []string
	// OrderViolations are per-key order problems: a key on two partitions,
	// or first occurrences not in commit order.
	OrderViolations []string
}

// String summarises the result, with samples of each problem.
func (r Result) String() string {
	return fmt.Sprintf("committed=%d records=%d missing=%d%s duplicates=%d unknown=%d mismatches=%d%s order_violations=%d%s",
		r.Committed, r.Records, len(r.Missing), sample(r.Missing), r.Duplicates, r.Unknown,
		len(r.Mismatches), sample(r.Mismatches), len(r.OrderViolations), sample(r.OrderViolations))
}

func sample(s []string) string {
	if len(s) == 0 {
		return ""
	}
	if len(s) > 5 {
		s = s[:5]
	}
	return " " + fmt.Sprint(s)
}

// Err returns nil when every committed event arrived, exactly as committed,
// in per-key order, and nothing else arrived; duplicates are allowed
// (at-least-once). Otherwise it returns an error with the summary.
func (r Result) Err() error {
	if len(r.Missing) > 0 || r.Unknown > 0 || len(r.Mismatches) > 0 || len(r.OrderViolations) > 0 {
		return fmt.Errorf("delivery check failed: %s", r)
	}
	return nil
}

// Check checks records (as sandbox.ReadAll returns them) against the
// committed events. Delivery is at-least-once: an event may appear several
// times, but for each key the first occurrences, in offset order, must follow
// commit order, and a key must stay on one partition.
func Check(committed []Event, records []sandbox.Record) Result {
	res := Result{Committed: len(committed), Records: len(records)}
	byID := make(map[string]*Event, len(committed))
	for i := range committed {
		byID[committed[i].ID] = &committed[i]
	}
	byOffset := func(a, b sandbox.Record) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	}
	recs := records
	if !slices.IsSortedFunc(recs, byOffset) { // ReadAll's order already
		recs = slices.Clone(records)
		slices.SortStableFunc(recs, byOffset)
	}
	type where struct {
		topic     string
		partition int32
	}
	seen := make(map[string]bool, len(committed))
	home := make(map[string]where)
	lastSeq := make(map[string]int)
	mismatch := func(r sandbox.Record, format string, args ...any) {
		res.Mismatches = append(res.Mismatches, fmt.Sprintf("%s/%d@%d: ", r.Topic, r.Partition, r.Offset)+fmt.Sprintf(format, args...))
	}
	for _, r := range recs {
		key := string(r.Key)
		w := where{r.Topic, r.Partition}
		if h, ok := home[key]; !ok {
			home[key] = w
		} else if h != w {
			res.OrderViolations = append(res.OrderViolations, fmt.Sprintf("key %q on %s/%d and %s/%d@%d", key, h.topic, h.partition, r.Topic, r.Partition, r.Offset))
			home[key] = w // report each move once
		}
		id := r.Headers["id"]
		ev := byID[id]
		if ev == nil {
			res.Unknown++
			continue
		}
		if seen[id] {
			res.Duplicates++
			continue
		}
		seen[id] = true
		if key != ev.Agg {
			mismatch(r, "event %s has key %q, want %q", id, key, ev.Agg)
		}
		if agg, seq, ok := aggSeq(r.Value); !ok || agg != ev.Agg || seq != ev.Seq {
			mismatch(r, "event %s has value %.80q, want agg %q seq %d", id, r.Value, ev.Agg, ev.Seq)
		}
		if ev.EventType != "" && r.Headers["event_type"] != ev.EventType {
			mismatch(r, "event %s has event_type %q, want %q", id, r.Headers["event_type"], ev.EventType)
		}
		if ev.AggregateType != "" && r.Headers["aggregate_type"] != ev.AggregateType {
			mismatch(r, "event %s has aggregate_type %q, want %q", id, r.Headers["aggregate_type"], ev.AggregateType)
		}
		// Rows read from the table (the relay's initial snapshot) have no
		// commit position: commit_lsn is 0/0.
		_, fromTable := r.Headers["cdc_relay_snapshot"]
		if lsn, err := pglogrepl.ParseLSN(r.Headers["commit_lsn"]); err != nil || (lsn == 0 && !fromTable) {
			mismatch(r, "event %s has commit_lsn %q", id, r.Headers["commit_lsn"])
		}
		if _, err := time.Parse(time.RFC3339Nano, r.Headers["commit_time"]); err != nil {
			mismatch(r, "event %s has commit_time %q", id, r.Headers["commit_time"])
		}
		if last, ok := lastSeq[key]; ok && ev.Seq <= last {
			res.OrderViolations = append(res.OrderViolations, fmt.Sprintf("key %q: seq %d (event %s at %s/%d@%d) first arrives after seq %d",
				key, ev.Seq, id, r.Topic, r.Partition, r.Offset, last))
		}
		lastSeq[key] = max(lastSeq[key], ev.Seq)
	}
	for _, ev := range committed {
		if !seen[ev.ID] {
			res.Missing = append(res.Missing, ev.ID)
		}
	}
	return res
}

// aggSeq extracts the "agg" and "seq" members of a payload written by the
// Writer, as jsonb prints it ({"agg": "a1", "pad": "...", "seq": 7}) or
// compact. It is a scan, not a JSON parse: values of 100k records of 1.5 KB
// each are checked, and encoding/json under -race takes tens of seconds.
func aggSeq(v []byte) (agg string, seq int, ok bool) {
	member := func(name string) []byte {
		i := bytes.Index(v, []byte(`"`+name+`":`))
		if i < 0 || !bytes.HasPrefix(v, []byte("{")) || !bytes.HasSuffix(v, []byte("}")) {
			return nil
		}
		return bytes.TrimLeft(v[i+len(name)+3:], " ")
	}
	a := member("agg")
	s := member("seq")
	if len(a) < 2 || a[0] != '"' || len(s) == 0 {
		return "", 0, false
	}
	end := bytes.IndexByte(a[1:], '"')
	if end < 0 {
		return "", 0, false
	}
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	seq, err := strconv.Atoi(string(s[:n]))
	if err != nil {
		return "", 0, false
	}
	return string(a[1 : 1+end]), seq, true
}

// readTimeout is the least time one read of a topic in Await gets.
const readTimeout = 30 * time.Second

// Await reads topic until every event committed returns is in it, or timeout
// passes, and returns the last check with the records it checked. It polls
// every interval (250ms when 0). The error is only for a read that failed:
// events still missing at the deadline are in the Result.
func Await(ctx context.Context, brokers []string, topic string, committed func() []Event, timeout, interval time.Duration) (Result, []sandbox.Record, error) {
	if interval <= 0 {
		interval = 250 * time.Millisecond
	}
	deadline := time.Now().Add(timeout)
	for {
		// One read may take the whole time left: a large topic read under
		// load took over readTimeout (150 MB, 100k records, under -race).
		rctx, cancel := context.WithTimeout(ctx, max(readTimeout, time.Until(deadline)))
		recs, err := sandbox.ReadAll(rctx, brokers, topic)
		cancel()
		if err != nil {
			return Result{}, nil, fmt.Errorf("read topic %s: %w", topic, err)
		}
		res := Check(committed(), recs)
		if len(res.Missing) == 0 || !time.Now().Before(deadline) {
			return res, recs, nil
		}
		select {
		case <-ctx.Done():
			return res, recs, nil
		case <-time.After(interval):
		}
	}
}
