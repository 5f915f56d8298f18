package replay_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

var pool *pgxpool.Pool

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	ctx := context.Background()
	pg, err := sandbox.StartPostgres(ctx, sandbox.PGOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start postgres:", err)
		return 1
	}
	defer pg.Close()
	dbURL, err := pg.CreateDatabase(ctx, "cdc_relay_replay_test")
	if err != nil {
		fmt.Fprintln(os.Stderr, "create database:", err)
		return 1
	}
	if pool, err = pgxpool.New(ctx, dbURL); err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		return 1
	}
	defer pool.Close()
	return m.Run()
}

// newHistory returns the history of fresh dead-letter tables, which hold it.
func newHistory(t *testing.T) *replay.History {
	t.Helper()
	s := deadletter.NewStore(pool, "public."+t.Name())
	if err := s.Ensure(t.Context()); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	return s.History()
}

// TestReplayTotals: the history's events by kind and result, dry runs left
// out, every kind and result present.
func TestReplayTotals(t *testing.T) {
	ctx := context.Background()
	h := newHistory(t)
	for _, r := range []struct {
		kind   string
		dry    bool
		counts replay.Counts
	}{
		{replay.KindOutbox, false, replay.Counts{Selected: 5, Published: 4, Failed: 1}},
		{replay.KindOutbox, false, replay.Counts{Selected: 2, Published: 2}},
		{replay.KindDLQ, false, replay.Counts{Selected: 3, Published: 1, Skipped: 2}},
		{replay.KindDLQ, true, replay.Counts{Selected: 9, Published: 9}},
	} {
		id, err := h.Start(ctx, replay.Entry{Kind: r.kind, Actor: "t", DryRun: r.dry})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Finish(ctx, id, r.counts); err != nil {
			t.Fatal(err)
		}
	}
	got, err := h.Totals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []replay.Total{
		{Kind: replay.KindDLQ, Result: replay.ResultPublished, Events: 1}, {Kind: replay.KindDLQ, Result: replay.ResultSkipped, Events: 2}, {Kind: replay.KindDLQ, Result: replay.ResultFailed, Events: 0},
		{Kind: replay.KindOutbox, Result: replay.ResultPublished, Events: 6}, {Kind: replay.KindOutbox, Result: replay.ResultSkipped, Events: 0}, {Kind: replay.KindOutbox, Result: replay.ResultFailed, Events: 1},
	}
	if !slices.Equal(got, want) {
		t.Errorf("ReplayTotals = %v, want %v", got, want)
	}
}

// TestRecordEventsText: results are recorded with COPY's text format, so
// every character an event id or an error can hold comes back as written.
func TestRecordEventsText(t *testing.T) {
	ctx := t.Context()
	h := newHistory(t)
	id, err := h.Start(ctx, replay.Entry{Kind: replay.KindOutbox, Actor: "t"})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 7, 1, 2, 3, 456789000, time.UTC)
	want := []replay.Event{
		{EventID: "plain", Result: replay.ResultPublished, At: at},
		{EventID: `back\slash`, DeadLetterID: 17, Result: replay.ResultFailed, Error: "tab\there, newline\nthere, cr\r, \\N and \\. too", At: at},
		{EventID: "ünïcode ✓", Result: replay.ResultSkipped, Error: `\`, At: at},
		{EventID: "", Result: replay.ResultDryRun, At: at},
	}
	if err := h.RecordEvents(ctx, id, want); err != nil {
		t.Fatal(err)
	}
	got, err := h.Events(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d events recorded, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.EventID != w.EventID || g.DeadLetterID != w.DeadLetterID || g.Result != w.Result || g.Error != w.Error || !g.At.Equal(w.At) {
			t.Errorf("event %d recorded as %+v, want %+v", i, g, w)
		}
	}
}
