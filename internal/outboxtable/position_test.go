package outboxtable

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// TestPositionText: a position reads back as it was written, and one
// stored before the insertion-order column was in the key (no "ord") reads
// as 0, the value of a table without one.
func TestPositionText(t *testing.T) {
	at := pgtype.Timestamptz{Time: time.Date(2026, 12, 7, 4, 0, 0, 123456000, time.UTC), Valid: true}
	tid := pgtype.TID{BlockNumber: 7, OffsetNumber: 3, Valid: true}
	for _, tc := range []struct {
		name string
		p    Position
	}{
		{"commit order, with the column", Position{Order: CommitOrder, Known: true, At: at, Cmin: 2, Ord: 9001, Rel: 16384, TID: tid}},
		{"start order, without", Position{Order: StartOrder, At: at, Cmin: 0, Rel: 16384, TID: tid}},
		{"the end of a join", mustParse(t, CommittedThrough(at.Time))},
		{"unknown commit time", Position{Order: CommitOrder, At: pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, TID: tid}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := mustParse(t, tc.p.Encode())
			if got.Order != tc.p.Order || got.Known != tc.p.Known || got.Cmin != tc.p.Cmin || got.Ord != tc.p.Ord ||
				got.Rel != tc.p.Rel || got.TID != tc.p.TID || got.At.InfinityModifier != tc.p.At.InfinityModifier || !got.At.Time.Equal(tc.p.At.Time) {
				t.Errorf("%s read back as %+v, want %+v", tc.p.Encode(), got, tc.p)
			}
		})
	}
	if p := mustParse(t, CommittedThrough(at.Time)); p.Ord != math.MaxInt64 {
		t.Errorf("CommittedThrough's ord = %d: it must end after every row of the last transaction", p.Ord)
	}
	old := `{"order":"commit","known":true,"at":"2026-12-07T04:00:00Z","cmin":1,"rel":16384,"block":0,"offset":5}`
	if p := mustParse(t, old); p.Ord != 0 || p.Cmin != 1 {
		t.Errorf("a position stored without ord read as %+v", p)
	}
	if _, err := ParsePosition(`{"order":"sideways"}`); err == nil || !strings.Contains(err.Error(), `unknown order "sideways"`) {
		t.Errorf("an unknown order: err = %v", err)
	}
}

func mustParse(t *testing.T, s string) Position {
	t.Helper()
	p, err := ParsePosition(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestOrderingCaveat: the line that starts a read names the column that
// orders a statement's rows, or says what its absence costs and how to add
// one.
func TestOrderingCaveat(t *testing.T) {
	for _, tc := range []struct {
		o    Ordering
		want []string
	}{
		{Ordering{Order: CommitOrder, Column: "insert_order"}, []string{"commit order", "one statement's rows by insert_order"}},
		{Ordering{Order: StartOrder, Column: "seq"}, []string{"track_commit_timestamp is off", "one statement's rows by seq"}},
		{Ordering{Order: CommitOrder}, []string{"commit order", "in the order they sit in the table", "add an insertion-order column"}},
	} {
		got := tc.o.Caveat()
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%+v: Caveat() = %q, want it to say %q", tc.o, got, w)
			}
		}
	}
}
