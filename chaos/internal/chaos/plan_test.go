package chaos

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

func TestNewPlanReproducible(t *testing.T) {
	cfg := PlanConfig{Steps: 12, PGMajor: 15}
	for seed := uint64(1); seed <= 50; seed++ {
		a, b := NewPlan(seed, cfg), NewPlan(seed, cfg)
		if a.String() != b.String() {
			t.Fatalf("seed %d drew two plans:\n%s\n%s", seed, a, b)
		}
		if len(a.Steps) != 12 {
			t.Fatalf("seed %d: %d steps, want 12", seed, len(a.Steps))
		}
		if !strings.HasPrefix(a.String(), fmt.Sprintf("seed=%d schedule=[", seed)) {
			t.Fatalf("plan %q does not start with its seed", a)
		}
	}
	if NewPlan(1, cfg).String() == NewPlan(2, cfg).String() {
		t.Errorf("seeds 1 and 2 drew the same plan")
	}
}

// TestNewPlanPreconditions replays many plans' steps against the state they
// need: a table joins only when out, leaves only when in; a partition is
// detached only when attached (and another stays), dropped only when
// detached and not dropped yet; no messages below 14, no standby below 16,
// standby lag only on a standby.
func TestNewPlanPreconditions(t *testing.T) {
	seen := map[string]bool{}
	for i := uint64(0); i < 600; i++ {
		seed, major := i/2+1, []int{13, 16}[i%2]
		p := NewPlan(seed, PlanConfig{Steps: 15, PGMajor: major})
		if major < 14 && p.Messages || major < 16 && p.Source != "primary" {
			t.Fatalf("seed %d: messages or a standby on PostgreSQL %d: %s", seed, major, p)
		}
		if p.Snapshot && p.Source != "primary" {
			t.Fatalf("seed %d: an initial snapshot on a standby: %s", seed, p)
		}
		seen[WorldSnapshot] = seen[WorldSnapshot] || p.Snapshot
		in, attached, detached := p.BMember, slices.Clone(p.Buckets), []int{}
		for i, s := range p.Steps {
			seen[s.Op] = true
			bad := ""
			switch s.Op {
			case "table-join", "table-join-large":
				bad, in = map[bool]string{true: "joins while in"}[in], true
			case "table-leave":
				bad, in = map[bool]string{false: "leaves while out"}[in], false
			case "partition-attach":
				if slices.Contains(attached, s.Bucket) || slices.Contains(detached, s.Bucket) {
					bad = "attaches a bucket twice"
				}
				attached = append(attached, s.Bucket)
			case "partition-detach":
				if !slices.Contains(attached, s.Bucket) || len(attached) < 2 {
					bad = "detaches a partition not attached, or the last one"
				}
				attached = slices.DeleteFunc(attached, func(b int) bool { return b == s.Bucket })
				if !s.Drop {
					detached = append(detached, s.Bucket)
				}
			case "standby-lag":
				if p.Source != "standby" {
					bad = "lags a standby the relay does not read"
				}
			case "partition-drop":
				if !slices.Contains(detached, s.Bucket) {
					bad = "drops a partition not detached"
				}
				detached = slices.DeleteFunc(detached, func(b int) bool { return b == s.Bucket })
			}
			if bad != "" {
				t.Fatalf("seed %d step %d %s %s: %s", seed, i+1, s, bad, p)
			}
		}
	}
	for _, o := range planOps {
		if !seen[o.name] {
			t.Errorf("600 plans never drew %s", o.name)
		}
	}
	if !seen[WorldSnapshot] {
		t.Errorf("600 plans never drew an initial snapshot")
	}
}

func TestCheckLedger(t *testing.T) {
	ev := func(id, key string, seq int) ledgerEvent {
		return ledgerEvent{ID: id, Key: key, Seq: seq, Where: "outbox_p_3", bucket: 3, Step: 2}
	}
	rec := func(part int32, off int64, e ledgerEvent) sandbox.Record {
		return sandbox.Record{Partition: part, Offset: off, Key: []byte(e.Key),
			Value:   []byte(fmt.Sprintf(`{"agg": %q, "seq": %d}`, e.Key, e.Seq)),
			Headers: map[string]string{"id": e.ID}, Timestamp: time.Now()}
	}
	a1, a2, b1 := ev("a1", "k1", 1), ev("a2", "k1", 2), ev("b1", "k2", 1)
	committed := map[string]ledgerEvent{"a1": a1, "a2": a2, "b1": b1}
	aborted := map[string]ledgerEvent{"x": ev("x", "k1", 3)}
	// The schedule detaches outbox_p_3 at step 3: a row of step 2 may be
	// dead-lettered as unattributed_partition, nothing else.
	allowed := (&schedRun{plan: Plan{Steps: []Step{{Op: "broker-restart"}, {Op: "pg-restart"}, {Op: "partition-detach", Bucket: 3}}}}).deadLetterAllowed
	for _, tc := range []struct {
		name string
		recs []sandbox.Record
		dead []deadLetter
		want Verdict // counts only
	}{
		{"all once in order", []sandbox.Record{rec(0, 0, a1), rec(0, 1, a2), rec(1, 0, b1)}, nil, Verdict{}},
		{"lost", []sandbox.Record{rec(0, 0, a1), rec(1, 0, b1)}, nil, Verdict{Lost: 1}},
		{"duplicate", []sandbox.Record{rec(0, 0, a1), rec(0, 1, a2), rec(0, 2, a1), rec(1, 0, b1)}, nil, Verdict{Duplicated: 1}},
		{"reordered", []sandbox.Record{rec(0, 0, a2), rec(0, 1, a1), rec(1, 0, b1)}, nil, Verdict{OrderViolations: 1}},
		{"key on two partitions", []sandbox.Record{rec(0, 0, a1), rec(2, 0, a2), rec(1, 0, b1)}, nil, Verdict{OrderViolations: 1}},
		{"rolled back in Kafka", []sandbox.Record{rec(0, 0, a1), rec(0, 1, a2), rec(1, 0, b1), rec(0, 2, aborted["x"])}, nil, Verdict{Phantoms: 1}},
		{"never written", []sandbox.Record{rec(0, 0, a1), rec(0, 1, a2), rec(1, 0, b1), rec(3, 0, ev("zz", "k9", 1))}, nil, Verdict{Phantoms: 1}},
		{"altered value", []sandbox.Record{rec(0, 0, a1), rec(0, 1, ev("a2", "k1", 7)), rec(1, 0, b1)}, nil, Verdict{Mismatched: 1}},
		{"dead-lettered as unattributed", []sandbox.Record{rec(0, 0, a1), rec(1, 0, b1)}, []deadLetter{{"a2", "unattributed_partition"}}, Verdict{DeadLettered: 1}},
		{"dead-lettered and in Kafka", []sandbox.Record{rec(0, 0, a1), rec(0, 1, a2), rec(1, 0, b1)}, []deadLetter{{"a2", "unattributed_partition"}}, Verdict{}},
		{"dead-lettered with another code", []sandbox.Record{rec(0, 0, a1), rec(1, 0, b1)}, []deadLetter{{"a2", "oversized"}}, Verdict{BadDeadLetters: 1}},
		{"dead letter never committed", []sandbox.Record{rec(0, 0, a1), rec(0, 1, a2), rec(1, 0, b1)}, []deadLetter{{"x", "unattributed_partition"}}, Verdict{BadDeadLetters: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := checkLedger(committed, aborted, tc.recs, tc.dead, allowed)
			got := [7]int{v.Lost, v.Duplicated, v.OrderViolations, v.Phantoms, v.Mismatched, v.DeadLettered, v.BadDeadLetters}
			want := [7]int{tc.want.Lost, tc.want.Duplicated, tc.want.OrderViolations, tc.want.Phantoms, tc.want.Mismatched, tc.want.DeadLettered, tc.want.BadDeadLetters}
			if got != want {
				t.Fatalf("lost, duplicated, order, phantoms, mismatched, dead-lettered, bad dead letters = %v, want %v: %s %v", got, want, v, v.Samples)
			}
			clean := want == [7]int{} || want == [7]int{5: 1}
			if v.ok(false) != clean {
				t.Errorf("ok(false) = %v with %s", v.ok(false), v)
			}
			if tc.name == "lost" && v.LostBy["outbox_p_3 step 2"] != 1 {
				t.Errorf("lost_by %v does not name where and when", v.LostBy)
			}
		})
	}
	for _, tc := range []struct {
		ev   ledgerEvent
		code string
		ok   bool
	}{
		{ledgerEvent{bucket: 3, Step: 2}, "unattributed_partition", true},
		{ledgerEvent{bucket: 3, Step: 3}, "unattributed_partition", true},
		{ledgerEvent{bucket: 3, Step: 4}, "unattributed_partition", false},
		{ledgerEvent{bucket: 2, Step: 1}, "unattributed_partition", false},
		{ledgerEvent{Step: 1}, "unattributed_partition", false},
		{ledgerEvent{bucket: 3, Step: 2}, "kafka_rejected", false},
	} {
		if why := allowed(tc.ev, tc.code); (why == "") != tc.ok {
			t.Errorf("dead letter %s of bucket %d, step %d: allowed %v (%s), want %v", tc.code, tc.ev.bucket, tc.ev.Step, why == "", why, tc.ok)
		}
	}
	if v := checkLedger(committed, aborted, []sandbox.Record{rec(0, 0, a1), rec(0, 1, a2), rec(0, 2, a2), rec(1, 0, b1)}, nil, allowed); !v.ok(true) || v.ok(false) {
		t.Errorf("duplicates: ok(true)=%v ok(false)=%v, want true, false", v.ok(true), v.ok(false))
	}
}

func TestScheduleResultReport(t *testing.T) {
	plan := NewPlan(42, PlanConfig{PGMajor: 15})
	for _, tc := range []struct {
		name   string
		res    ScheduleResult
		failed bool
	}{
		{"clean", ScheduleResult{Verdict: Verdict{Committed: 10, Records: 10}}, false},
		{"lost", ScheduleResult{Verdict: Verdict{Committed: 10, Records: 9, Lost: 1, LostBy: map[string]int{"outbox_b step 2": 1}}}, true},
		{"duplicates", ScheduleResult{Verdict: Verdict{Committed: 10, Records: 11, Duplicated: 1}}, true},
		{"duplicates with a reason", ScheduleResult{Verdict: Verdict{Committed: 10, Records: 11, Duplicated: 1}, DuplicatesReason: "--delivery at-least-once"}, false},
		{"phantom", ScheduleResult{Verdict: Verdict{Committed: 10, Records: 11, Phantoms: 1}}, true},
		{"error", ScheduleResult{Verdict: Verdict{Committed: 10, Records: 10}, Err: errors.New("step 3: relay exited")}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.res.Plan = plan
			if tc.res.Failed() != tc.failed {
				t.Fatalf("Failed() = %v, want %v", tc.res.Failed(), tc.failed)
			}
			lines := strings.Split(tc.res.Report(), "\n")
			last := lines[len(lines)-1]
			want := map[bool]string{true: "FAIL ", false: "ok "}[tc.failed] + plan.String()
			if last != want {
				t.Errorf("last line %q, want %q", last, want)
			}
		})
	}
}

func TestCheckReplays(t *testing.T) {
	ev := func(id, key string, seq int) ledgerEvent {
		return ledgerEvent{ID: id, Key: key, Seq: seq, Where: tableMain, Step: 1}
	}
	a1, a2, b1, c1 := ev("a1", "k1", 1), ev("a2", "k1", 2), ev("b1", "k2", 1), ev("c1", "k3", 1)
	committed := map[string]ledgerEvent{"a1": a1, "a2": a2, "b1": b1, "c1": c1}
	rec := func(off int64, e ledgerEvent, replayID string) sandbox.Record {
		return sandbox.Record{Partition: 0, Offset: off, Key: []byte(e.Key),
			Value:   []byte(fmt.Sprintf(`{"agg": %q, "seq": %d}`, e.Key, e.Seq)),
			Headers: map[string]string{"id": e.ID, headerReplay: replayID}}
	}
	window := []string{"a1", "a2", "b1"}
	for _, tc := range []struct {
		name      string
		published int
		recs      []sandbox.Record
		want      [5]int // missing, repeated, unselected, order, counts
	}{
		{"exactly its window", 3, []sandbox.Record{rec(0, a1, "7"), rec(1, b1, "7"), rec(2, a2, "7")}, [5]int{}},
		{"a row missing", 2, []sandbox.Record{rec(0, a1, "7"), rec(2, a2, "7")}, [5]int{0: 1}},
		{"a row twice", 3, []sandbox.Record{rec(0, a1, "7"), rec(1, b1, "7"), rec(2, a2, "7"), rec(3, b1, "7")}, [5]int{1: 1, 4: 1}},
		{"a row of no window", 3, []sandbox.Record{rec(0, a1, "7"), rec(1, b1, "7"), rec(2, a2, "7"), rec(3, c1, "7")}, [5]int{2: 1, 4: 1}},
		{"out of commit order", 3, []sandbox.Record{rec(0, a2, "7"), rec(1, b1, "7"), rec(2, a1, "7")}, [5]int{3: 1}},
		{"printed more than reached Kafka", 4, []sandbox.Record{rec(0, a1, "7"), rec(1, b1, "7"), rec(2, a2, "7")}, [5]int{4: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			replays := []replayRun{{Step: 1, ID: "7", Selected: 3, Published: tc.published, Window: window}}
			// The stream's records and a join's (cdc_relay_snapshot) stay
			// with the stream.
			stream := []sandbox.Record{rec(10, a1, ""), rec(11, a2, "99"), rec(12, b1, "7")}
			delete(stream[0].Headers, headerReplay)
			stream[2].Headers[headerSnapshot] = "join"
			streamOut, replayed := splitReplayed(append(slices.Clone(stream), tc.recs...), replays)
			if len(streamOut) != len(stream) || len(replayed["7"]) != len(tc.recs) {
				t.Fatalf("split: %d stream records, %d of replay 7; want %d, %d", len(streamOut), len(replayed["7"]), len(stream), len(tc.recs))
			}
			var v Verdict
			checkReplays(&v, committed, replays, replayed)
			got := [5]int{v.ReplayMissing, v.ReplayRepeated, v.ReplayUnselected, v.ReplayOrder, v.ReplayCounts}
			if got != tc.want || v.Replays != 1 {
				t.Fatalf("missing, repeated, unselected, order, counts = %v, want %v: %s %v", got, tc.want, v, v.Samples)
			}
			if v.ok(false) != (tc.want == [5]int{}) {
				t.Errorf("ok(false) = %v with %s", v.ok(false), v)
			}
		})
	}
}

func TestWaitStats(t *testing.T) {
	var waits []writerWait
	for i := range 200 {
		waits = append(waits, writerWait{took: time.Duration(i+1) * time.Millisecond, step: i / 50})
	}
	w := waitStats(waits)
	if w.N != 200 || w.Max != 200*time.Millisecond || w.MaxStep != 3 || w.P99 != 198*time.Millisecond {
		t.Errorf("waitStats = %+v, want 200 waits, max 200ms in step 3, p99 198ms", w)
	}
	res := ScheduleResult{Plan: NewPlan(42, PlanConfig{PGMajor: 15}), Verdict: Verdict{Committed: 10, Records: 10}, Waits: w}
	if res.Failed() {
		t.Errorf("a seed whose writers waited at most 200ms failed")
	}
	res.Waits.Max = maxWriterWait + time.Millisecond
	if res.Failed() || !strings.Contains(res.Report(), "on no lock of the relay's") {
		t.Errorf("a seed whose writer waited %v on no lock of the relay's: Failed() = %v, report:\n%s", res.Waits.Max, res.Failed(), res.Report())
	}
	res.Waits.BlockedByRelay, res.Waits.BlockedBy = maxWriterWait, "LOCK TABLE public.outbox_b IN SHARE MODE"
	if !res.Failed() || !strings.Contains(res.Report(), "a writer waited 1s or more on a lock the relay held (LOCK TABLE") {
		t.Errorf("a seed whose writer waited %v on the relay's lock: Failed() = %v, report:\n%s", res.Waits.BlockedByRelay, res.Failed(), res.Report())
	}
}

func TestLargeRowID(t *testing.T) {
	// md5('7-3-0')::uuid in Postgres; the schedule's ledger matches Kafka by it.
	if got, want := largeRowID("7-3-", 0), "41970780-0789-a593-4442-a79dd24ea6be"; got != want {
		t.Errorf("largeRowID = %s, want %s", got, want)
	}
}
