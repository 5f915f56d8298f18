package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// event is one committed outbox row as the test knows it: Seq numbers the
// events of one aggregate in commit order.
type event struct {
	ID            string
	Agg           string
	Seq           int
	AggregateType string
	EventType     string
}

// checkResult compares the committed events with the records in Kafka.
type checkResult struct {
	Committed  int
	Records    int
	Missing    []string // ids of committed events not in Kafka
	Duplicates int      // records beyond the first of each event id
	Unknown    int      // records whose id was not committed (or has no id)
	// Mismatches are records whose key, value or headers do not match the
	// committed event; OrderViolations are per-key order problems: a key on
	// two partitions, or first occurrences not in commit order.
	Mismatches      []string
	OrderViolations []string
}

// String summarises the result, with samples of each problem.
func (r checkResult) String() string {
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

// requireComplete fails t unless every committed event arrived, exactly as
// committed, in per-key order. Duplicates are allowed (at-least-once).
func (r checkResult) requireComplete(t *testing.T) {
	t.Helper()
	if len(r.Missing) > 0 || r.Unknown > 0 || len(r.Mismatches) > 0 || len(r.OrderViolations) > 0 {
		t.Fatalf("delivery check failed: %s", r)
	}
}

// checkDelivery checks records (as testenv.ReadAll returns them) against the
// committed events. Delivery is at-least-once: an event may appear several
// times, but for each key the first occurrences, in offset order, must follow
// commit order, and a key must stay on one partition.
func checkDelivery(committed []event, records []testenv.Record) checkResult {
	res := checkResult{Committed: len(committed), Records: len(records)}
	byID := make(map[string]*event, len(committed))
	for i := range committed {
		byID[committed[i].ID] = &committed[i]
	}
	byOffset := func(a, b testenv.Record) int {
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
	mismatch := func(r testenv.Record, format string, args ...any) {
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
		if lsn, err := pglogrepl.ParseLSN(r.Headers["commit_lsn"]); err != nil || lsn == 0 {
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
// tests, as jsonb prints it ({"agg": "a1", "pad": "...", "seq": 7}) or
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

// outboxWriter commits outbox events in transactions, numbering each
// aggregate's events in commit order. One goroutine writes; any may read.
type outboxWriter struct {
	url    string
	prefix string
	aggs   int
	rng    *rand.Rand

	mu     sync.Mutex
	events []event
	next   map[string]int
}

const insertSQL = `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ($1,$2,$3,$4) RETURNING id::text`

func newWriter(url, prefix string, aggs int, seed uint64) *outboxWriter {
	return &outboxWriter{url: url, prefix: prefix, aggs: aggs, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), next: make(map[string]int)}
}

// committed returns a copy of the events committed so far.
func (w *outboxWriter) committed() []event {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.events)
}

func (w *outboxWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.events)
}

// commitTxn commits one transaction with one event for each of aggs.
func (w *outboxWriter) commitTxn(ctx context.Context, conn *pgx.Conn, aggs []string) error {
	w.mu.Lock()
	next := make(map[string]int, len(aggs))
	evs := make([]event, len(aggs))
	for i, agg := range aggs {
		if _, ok := next[agg]; !ok {
			next[agg] = w.next[agg]
		}
		next[agg]++
		evs[i] = event{Agg: agg, Seq: next[agg], AggregateType: "e2e", EventType: "Numbered"}
	}
	w.mu.Unlock()

	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.Background())
	b := &pgx.Batch{}
	for _, ev := range evs {
		b.Queue(insertSQL, ev.AggregateType, ev.Agg, ev.EventType, fmt.Sprintf(`{"agg":%q,"seq":%d}`, ev.Agg, ev.Seq))
	}
	br := tx.SendBatch(ctx, b)
	for i := range evs {
		if err := br.QueryRow().Scan(&evs[i].ID); err != nil {
			br.Close()
			return fmt.Errorf("insert outbox row: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("insert outbox rows: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	w.mu.Lock()
	for agg, n := range next {
		w.next[agg] = n
	}
	w.events = append(w.events, evs...)
	w.mu.Unlock()
	return nil
}

// run commits transactions of 1-20 events on random aggregates at about rate
// events per second, until total events are committed (0: no limit), stop is
// closed, or ctx is done.
func (w *outboxWriter) run(ctx context.Context, stop <-chan struct{}, total int, rate float64) error {
	conn, err := pgx.Connect(ctx, w.url)
	if err != nil {
		return fmt.Errorf("writer: connect: %w", err)
	}
	defer conn.Close(context.Background())
	start := time.Now()
	written := 0
	for total == 0 || written < total {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		n := 1 + w.rng.IntN(20)
		if total > 0 {
			n = min(n, total-written)
		}
		aggs := make([]string, n)
		for i := range aggs {
			aggs[i] = fmt.Sprintf("%s%d", w.prefix, w.rng.IntN(w.aggs))
		}
		if err := w.commitTxn(ctx, conn, aggs); err != nil {
			return fmt.Errorf("writer: %w", err)
		}
		written += n
		if d := time.Until(start.Add(time.Duration(float64(written) / rate * float64(time.Second)))); d > 0 {
			select {
			case <-time.After(d):
			case <-stop:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// goRun starts w.run in a goroutine and returns its result channel.
func (w *outboxWriter) goRun(ctx context.Context, stop <-chan struct{}, total int, rate float64) <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- w.run(ctx, stop, total, rate) }()
	return errc
}

// TestCheckDelivery checks the checker itself on hand-made records.
func TestCheckDelivery(t *testing.T) {
	committed := []event{
		{ID: "1", Agg: "a", Seq: 1}, {ID: "2", Agg: "b", Seq: 1}, {ID: "3", Agg: "a", Seq: 2}, {ID: "4", Agg: "a", Seq: 3},
	}
	rec := func(p int32, off int64, id string) testenv.Record {
		var ev event
		for _, e := range committed {
			if e.ID == id {
				ev = e
			}
		}
		return testenv.Record{
			Topic: "t", Partition: p, Offset: off, Key: []byte(ev.Agg),
			Value: []byte(fmt.Sprintf(`{"agg": %q, "seq": %d}`, ev.Agg, ev.Seq)),
			Headers: map[string]string{
				"id": id, "commit_lsn": "0/16B3748", "commit_time": "2024-01-02T03:04:05.123456Z",
				"event_type": "x", "aggregate_type": "y",
			},
		}
	}
	tests := []struct {
		name                 string
		recs                 []testenv.Record
		missing, dups, order int
	}{
		{name: "exact", recs: []testenv.Record{rec(0, 0, "1"), rec(0, 1, "3"), rec(0, 2, "4"), rec(1, 0, "2")}},
		{name: "redelivered", recs: []testenv.Record{rec(0, 0, "1"), rec(0, 1, "3"), rec(0, 2, "1"), rec(0, 3, "3"), rec(0, 4, "4"), rec(1, 0, "2"), rec(1, 1, "2")}, dups: 3},
		{name: "missing", recs: []testenv.Record{rec(0, 0, "1"), rec(0, 2, "4"), rec(1, 0, "2")}, missing: 1},
		{name: "reordered", recs: []testenv.Record{rec(0, 0, "1"), rec(0, 1, "4"), rec(0, 2, "3"), rec(1, 0, "2")}, order: 1},
		{name: "two partitions", recs: []testenv.Record{rec(0, 0, "1"), rec(0, 1, "3"), rec(2, 0, "4"), rec(1, 0, "2")}, order: 1},
		{name: "offset order decides", recs: []testenv.Record{rec(0, 2, "1"), rec(0, 1, "3"), rec(0, 3, "4"), rec(1, 0, "2")}, order: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := checkDelivery(committed, tc.recs)
			if len(res.Missing) != tc.missing || res.Duplicates != tc.dups || len(res.OrderViolations) != tc.order || len(res.Mismatches) != 0 {
				t.Errorf("got %s; want missing=%d duplicates=%d order_violations=%d", res, tc.missing, tc.dups, tc.order)
			}
		})
	}
	bad := rec(0, 0, "1")
	bad.Value = []byte(`{"agg":"a","seq":7}`)
	if res := checkDelivery(committed[:1], []testenv.Record{bad}); len(res.Mismatches) != 1 {
		t.Errorf("wrong seq in value: got %s, want one mismatch", res)
	}
	if res := checkDelivery(committed, nil); !strings.Contains(res.String(), "missing=4") {
		t.Errorf("nothing delivered: got %s", res)
	}
	for _, tc := range []struct {
		v   string
		agg string
		seq int
		ok  bool
	}{
		{`{"agg": "big-7", "pad": "xxxx", "seq": 12345}`, "big-7", 12345, true},
		{`{"agg":"a1","seq":7}`, "a1", 7, true},
		{`{"agg": "a1"}`, "", 0, false},
		{`{"seq": 3}`, "", 0, false},
		{`{"agg": "a1", "seq": "3"}`, "", 0, false},
		{`"agg": "a1", "seq": 3`, "", 0, false},
	} {
		agg, seq, ok := aggSeq([]byte(tc.v))
		if agg != tc.agg || seq != tc.seq || ok != tc.ok {
			t.Errorf("aggSeq(%s) = %q, %d, %v; want %q, %d, %v", tc.v, agg, seq, ok, tc.agg, tc.seq, tc.ok)
		}
	}
}
