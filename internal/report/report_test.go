package report

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// fixtures are values of every shape the reports print: times in another
// zone than UTC, control characters and long cells, every kind of key and
// payload, every status with its extra fields.
func fixtures() (letters []deadletter.Letter, summary []deadletter.CodeCount, ts []deadletter.Transition, entries []replay.Entry, events []replay.Event) {
	cest := time.FixedZone("CEST", 2*3600)
	at := time.Date(2024, 5, 1, 12, 0, 0, 0, cest)
	p := func(d time.Duration) *time.Time { t := at.Add(d); return &t }
	letters = []deadletter.Letter{
		{ID: 7, EventID: "ev-7", AggregateType: "order", AggregateID: "42", EventType: "OrderPlaced", Key: []byte("42"),
			Payload: []byte(`{"orderId":42,"lines":[1,2]}`), Headers: map[string]string{"id": "ev-7", "tenant": "acme", "a": "b"},
			PayloadType: outbox.PayloadJSON, Topic: "orders", ErrorCode: "message_too_large", ErrorMessage: "too large: 2 MB",
			RetryCount: 3, FirstFailedAt: at, LastFailedAt: at.Add(time.Hour), RelayName: "relay-1", CorrelationID: "corr-1",
			SchemaVersion: "v2", CommitLSN: 0x16B3748, SourceTable: "public.outbox", Status: deadletter.StatusProcessing,
			ReplayedAt: p(2 * time.Hour), ReplayCount: 2, Attempts: 4, NextAttemptAt: p(3 * time.Hour), LastAttemptAt: p(90 * time.Minute),
			LastAttemptError: "broker down", ClaimedBy: "replay 3 on host\twith tab", ClaimedUntil: p(4 * time.Hour)},
		{ID: 8, EventID: "ev-8\nwith a newline and a name longer than forty runes: é", AggregateType: "invoice", AggregateID: "x",
			EventType: "Paid", Key: []byte{0xff, 0x00, 0x01}, Payload: []byte{0x00, 0xfe, 0x41, 0x42}, PayloadType: outbox.PayloadBinary,
			ErrorCode: "invalid_topic", Status: deadletter.StatusRetryWait, NextAttemptAt: p(5 * time.Hour), Attempts: 1},
		{ID: 9, EventID: "ev-9", Payload: []byte("plain text, not JSON"), Status: deadletter.StatusPending, Headers: map[string]string{}},
		{ID: 10, EventID: "ev-10", Payload: []byte(`{"a":`), Status: deadletter.StatusDead, Key: []byte{}},
		{ID: 11, EventID: "ev-11", Payload: []byte(`[1, 2,  3]`), Status: deadletter.StatusProcessing, LastFailedAt: at},
	}
	summary = []deadletter.CodeCount{
		{ErrorCode: "message_too_large", Count: 3, Pending: 2, Dead: 1, Oldest: at, Newest: at.Add(time.Hour)},
		{ErrorCode: "invalid_topic\x07", Count: 10, Oldest: at},
	}
	ts = []deadletter.Transition{
		{ID: 1, DeadLetterID: 7, EventID: "ev-7", ReplayID: 3, Owner: "replay 3 on host", From: "pending", To: "processing", Attempt: 1, At: at},
		{ID: 2, DeadLetterID: 7, EventID: "ev-7", From: "processing", To: "retry_wait", Attempt: 2, Topic: "other", Detail: "broker\ndown", At: at.Add(time.Minute)},
	}
	entries = []replay.Entry{
		{ID: 3, Kind: replay.KindDLQ, Actor: "ops", StartedAt: at, FinishedAt: p(time.Minute), Filters: map[string]any{"error_code": "message_too_large", "ids": []int64{1, 2}},
			DryRun: true, RatePerSec: 12.5, Counts: replay.Counts{Selected: 3, Skipped: 1}},
		{ID: 4, Kind: replay.KindOutbox, Actor: "bob", StartedAt: at, Forced: true, TopicOverride: "elsewhere", Counts: replay.Counts{Selected: 9, Published: 7, Skipped: 1, Failed: 1}},
		{ID: 5, Kind: replay.KindDLQ, StartedAt: at, FinishedAt: p(time.Hour)},
	}
	events = []replay.Event{
		{EventID: "ev-7", DeadLetterID: 7, Result: "published", At: at},
		{EventID: "ev-x", Result: "failed", Error: "bad topic", At: at.Add(time.Second)},
	}
	return letters, summary, ts, entries, events
}

// TestReports compares every report with its golden file in testdata,
// written by the renderers as they were in internal/cli: what an operator's
// scripts read must not change unnoticed.
func TestReports(t *testing.T) {
	letters, summary, ts, entries, events := fixtures()
	const more = "raise the limit"
	tests := []struct {
		golden string
		render func(w *bytes.Buffer) error
	}{
		{"list-cut", func(w *bytes.Buffer) error {
			PrintList(w, List{letters, summary, 13}, "raise --limit, or 0 for all")
			return nil
		}},
		{"list-all", func(w *bytes.Buffer) error { PrintList(w, List{letters[:2], summary[:1], 2}, more); return nil }},
		{"list-none", func(w *bytes.Buffer) error { PrintList(w, List{nil, summary, 0}, more); return nil }},
		{"list-json", func(w *bytes.Buffer) error { return ListJSON(w, List{letters, summary, 13}) }},
		{"list-json-empty", func(w *bytes.Buffer) error { return ListJSON(w, List{}) }},
		{"show-text", func(w *bytes.Buffer) error { PrintLetters(w, letters); return nil }},
		{"show-one", func(w *bytes.Buffer) error { PrintLetters(w, letters[:1]); return nil }},
		{"show-json1", func(w *bytes.Buffer) error { return LettersJSON(w, letters[:1]) }},
		{"show-jsonN", func(w *bytes.Buffer) error { return LettersJSON(w, letters) }},
		{"show-json0", func(w *bytes.Buffer) error { return LettersJSON(w, nil) }},
		{"trans", func(w *bytes.Buffer) error { return PrintTransitions(w, ts) }},
		{"trans-none", func(w *bytes.Buffer) error { return PrintTransitions(w, nil) }},
		{"replays", func(w *bytes.Buffer) error { return PrintReplays(w, entries) }},
		{"replays-none", func(w *bytes.Buffer) error { return PrintReplays(w, nil) }},
		{"events", func(w *bytes.Buffer) error { return PrintReplayEvents(w, 3, events) }},
		{"events-none", func(w *bytes.Buffer) error { return PrintReplayEvents(w, 3, nil) }},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join("testdata", tt.golden+".golden"))
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := tt.render(&out); err != nil {
				t.Fatal(err)
			}
			if out.String() != string(want) {
				t.Errorf("printed:\n%s\nwant (testdata/%s.golden):\n%s", out.String(), tt.golden, want)
			}
		})
	}
}

// TestListMore checks that the hint for the letters not shown is the
// caller's words, and only when some are not shown.
func TestListMore(t *testing.T) {
	letters, summary, _, _, _ := fixtures()
	tests := []struct {
		name string
		list List
		more string
		want string // the line after the letters
	}{
		{"cut", List{letters[:1], summary, 2}, "use --limit", "1 of 2 matching letters shown (use --limit); by error code:"},
		{"cut, no hint", List{letters[:1], summary, 2}, "", "1 of 2 matching letters shown; by error code:"},
		{"all shown", List{letters[:1], summary, 1}, "use --limit", "1 of 1 matching letters shown; by error code:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			PrintList(&out, tt.list, tt.more)
			lines := strings.Split(out.String(), "\n")
			if len(lines) < 4 || lines[3] != tt.want {
				t.Errorf("printed:\n%s\nwant line 4 %q", out.String(), tt.want)
			}
		})
	}
}

// cmdNames renders a command as the command line does.
type cmdNames struct{}

func (cmdNames) Setting(field string) string { return field }
func (cmdNames) Command(name string, args ...string) string {
	s := "cdc-relay " + name
	for i := 0; i+1 < len(args); i += 2 {
		s += " --" + args[i] + " " + args[i+1]
	}
	return s
}

// TestPrintReplay checks a replay's summary, and that the command listing
// the failures not printed is named as the caller's Names say.
func TestPrintReplay(t *testing.T) {
	failures := []replay.Event{
		{EventID: "e-1", DeadLetterID: 4, Error: "too large"},
		{EventID: "e-2", Error: "bad topic"},
	}
	tests := []struct {
		name  string
		s     ReplaySummary
		names setting.Namer
		want  string
	}{
		{
			name: "published", s: ReplaySummary{Kind: "outbox", Actor: "bob", Result: replay.Outcome{ReplayID: 3,
				Counts: replay.Counts{Selected: 2, Published: 2}}},
			want: "replay 3 (outbox, by bob): selected 2, published 2, skipped 0, failed 0\n",
		},
		{
			name: "dry run", s: ReplaySummary{Kind: "dlq", Actor: "ann", DryRun: true, Result: replay.Outcome{ReplayID: 5,
				Counts: replay.Counts{Selected: 3, Skipped: 1}, DryRun: 2}},
			want: "dry run 5 (dlq, by ann): selected 3, published 0, skipped 1, failed 0, would publish 2\n",
		},
		{
			name: "every failure listed", s: ReplaySummary{Kind: "dlq", Actor: "ann", Result: replay.Outcome{ReplayID: 8,
				Counts: replay.Counts{Selected: 2, Failed: 2}, Failures: failures}},
			names: setting.NewNamer(cmdNames{}),
			want: "replay 8 (dlq, by ann): selected 2, published 0, skipped 0, failed 2\nfailures:\n" +
				"  dead letter 4, event e-1: too large\n  event e-2: bad topic\n",
		},
		{
			name: "more failures, command line", s: ReplaySummary{Kind: "dlq", Actor: "ann", Result: replay.Outcome{ReplayID: 9,
				Counts: replay.Counts{Selected: 5, Published: 2, Failed: 3}, Failures: failures}},
			names: setting.NewNamer(cmdNames{}),
			want: "replay 9 (dlq, by ann): selected 5, published 2, skipped 0, failed 3\nfailures:\n" +
				"  dead letter 4, event e-1: too large\n  event e-2: bad topic\n  ... and 1 more: cdc-relay dlq history --replay 9\n",
		},
		{
			name: "more failures, zero Namer", s: ReplaySummary{Kind: "dlq", Actor: "ann", Result: replay.Outcome{ReplayID: 9,
				Counts: replay.Counts{Selected: 5, Published: 2, Failed: 3}, Failures: failures}},
			want: "replay 9 (dlq, by ann): selected 5, published 2, skipped 0, failed 3\nfailures:\n" +
				"  dead letter 4, event e-1: too large\n  event e-2: bad topic\n  ... and 1 more: (command dlq history replay=9)\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			PrintReplay(&out, tt.s, tt.names)
			if out.String() != tt.want {
				t.Errorf("printed %q, want %q", out.String(), tt.want)
			}
		})
	}
}

// TestCells checks how table cells and times are written.
func TestCells(t *testing.T) {
	tests := []struct{ name, got, want string }{
		{"control characters", oneLine("a\tb\nc\x07"), "a b c "},
		{"40 runes kept", oneLine(strings.Repeat("é", 40)), strings.Repeat("é", 40)},
		{"41 runes cut", oneLine(strings.Repeat("é", 41)), strings.Repeat("é", 39) + "…"},
		{"zero time", timeText(time.Time{}), "-"},
		{"time in UTC", timeText(time.Date(2024, 5, 1, 12, 0, 0, 5e8, time.FixedZone("CEST", 2*3600))), "2024-05-01 10:00:00Z"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, tt.got, tt.want)
		}
	}
}

// TestWriteJSONError checks that a failed write names the output.
func TestWriteJSONError(t *testing.T) {
	err := WriteJSON(failWriter{}, "status", map[string]int{"a": 1})
	if err == nil || !strings.HasPrefix(err.Error(), "write status: ") || !errors.Is(err, errFull) {
		t.Errorf("WriteJSON to a failing writer: %v", err)
	}
}

var errFull = errors.New("disk full")

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errFull }
