package verify

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// TestCheck checks the checker itself on hand-made records.
func TestCheck(t *testing.T) {
	committed := []Event{
		{ID: "1", Agg: "a", Seq: 1}, {ID: "2", Agg: "b", Seq: 1}, {ID: "3", Agg: "a", Seq: 2}, {ID: "4", Agg: "a", Seq: 3},
	}
	rec := func(p int32, off int64, id string) sandbox.Record {
		var ev Event
		for _, e := range committed {
			if e.ID == id {
				ev = e
			}
		}
		return sandbox.Record{
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
		recs                 []sandbox.Record
		missing, dups, order int
	}{
		{name: "exact", recs: []sandbox.Record{rec(0, 0, "1"), rec(0, 1, "3"), rec(0, 2, "4"), rec(1, 0, "2")}},
		{name: "redelivered", recs: []sandbox.Record{rec(0, 0, "1"), rec(0, 1, "3"), rec(0, 2, "1"), rec(0, 3, "3"), rec(0, 4, "4"), rec(1, 0, "2"), rec(1, 1, "2")}, dups: 3},
		{name: "missing", recs: []sandbox.Record{rec(0, 0, "1"), rec(0, 2, "4"), rec(1, 0, "2")}, missing: 1},
		{name: "reordered", recs: []sandbox.Record{rec(0, 0, "1"), rec(0, 1, "4"), rec(0, 2, "3"), rec(1, 0, "2")}, order: 1},
		{name: "two partitions", recs: []sandbox.Record{rec(0, 0, "1"), rec(0, 1, "3"), rec(2, 0, "4"), rec(1, 0, "2")}, order: 1},
		{name: "offset order decides", recs: []sandbox.Record{rec(0, 2, "1"), rec(0, 1, "3"), rec(0, 3, "4"), rec(1, 0, "2")}, order: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := Check(committed, tc.recs)
			if len(res.Missing) != tc.missing || res.Duplicates != tc.dups || len(res.OrderViolations) != tc.order || len(res.Mismatches) != 0 {
				t.Errorf("got %s; want missing=%d duplicates=%d order_violations=%d", res, tc.missing, tc.dups, tc.order)
			}
			if wantErr := tc.missing+tc.order > 0; (res.Err() != nil) != wantErr {
				t.Errorf("Err() = %v, want an error: %v", res.Err(), wantErr)
			}
		})
	}
	bad := rec(0, 0, "1")
	bad.Value = []byte(`{"agg":"a","seq":7}`)
	if res := Check(committed[:1], []sandbox.Record{bad}); len(res.Mismatches) != 1 || res.Err() == nil {
		t.Errorf("wrong seq in value: got %s, want one mismatch", res)
	}
	if res := Check(committed, nil); !strings.Contains(res.String(), "missing=4") {
		t.Errorf("nothing delivered: got %s", res)
	}
	stranger := rec(0, 5, "1")
	stranger.Headers = map[string]string{"id": "99"}
	if res := Check(committed[:1], []sandbox.Record{rec(0, 0, "1"), stranger}); res.Unknown != 1 || res.Err() == nil {
		t.Errorf("record of an uncommitted event: got %s, want unknown=1 and an error", res)
	}
}

func TestAggSeq(t *testing.T) {
	for _, tc := range []struct {
		v   string
		agg string
		seq int
		ok  bool
	}{
		{`{"agg": "big-7", "pad": "xxxx", "seq": 12345}`, "big-7", 12345, true},
		{`{"agg":"a1","seq":7}`, "a1", 7, true},
		{`{"agg":"a1","seq":7,"pad":"xx"}`, "a1", 7, true},
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

func TestNewUUID(t *testing.T) {
	a, b := newUUID(), newUUID()
	if len(a) != 36 || a[14] != '4' || a == b {
		t.Errorf("newUUID() = %q, %q; want two different version 4 UUIDs", a, b)
	}
}
