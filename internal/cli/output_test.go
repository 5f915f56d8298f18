package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/replay"
)

// TestReportReplay checks what a replay command prints and the error it exits
// with, from the replay's result alone.
func TestReportReplay(t *testing.T) {
	stopped := errors.New("stopped")
	failures := []replay.Event{
		{EventID: "e-1", DeadLetterID: 4, Error: "too large"},
		{EventID: "e-2", Error: "bad topic"},
	}
	tests := []struct {
		name    string
		s       replaySummary
		err     error
		want    string // output
		wantErr string // "" for none
		is      error  // errors.Is target, when set
	}{
		{
			name: "did not start", s: replaySummary{Kind: "dlq", Actor: "ann"}, err: stopped,
			want: "", wantErr: "stopped", is: stopped,
		},
		{
			name: "published", s: replaySummary{Kind: "outbox", Actor: "bob", Result: replay.Outcome{ReplayID: 3,
				Counts: replay.Counts{Selected: 2, Published: 2}}},
			want: "replay 3 (outbox, by bob): selected 2, published 2, skipped 0, failed 0\n",
		},
		{
			name: "dry run", s: replaySummary{Kind: "dlq", Actor: "ann", DryRun: true, Result: replay.Outcome{ReplayID: 5,
				Counts: replay.Counts{Selected: 3, Skipped: 1}, DryRun: 2}},
			want: "dry run 5 (dlq, by ann): selected 3, published 0, skipped 1, failed 0, would publish 2\n",
		},
		{
			name: "failures, more than listed", s: replaySummary{Kind: "dlq", Actor: "ann", Result: replay.Outcome{ReplayID: 9,
				Counts: replay.Counts{Selected: 5, Published: 2, Failed: 3}, Failures: failures}},
			want: "replay 9 (dlq, by ann): selected 5, published 2, skipped 0, failed 3\nfailures:\n" +
				"  dead letter 4, event e-1: too large\n  event e-2: bad topic\n  ... and 1 more: cdc-relay dlq history --replay 9\n",
			wantErr: "replay 9: 3 of 5 events failed (listed above)",
		},
		{
			name: "stopped midway", s: replaySummary{Kind: "outbox", Actor: "bob", Result: replay.Outcome{ReplayID: 2,
				Counts: replay.Counts{Selected: 1, Published: 1}}},
			err:  context.Canceled,
			want: "replay 2 (outbox, by bob): selected 1, published 1, skipped 0, failed 0\n", wantErr: "replay 2: context canceled", is: context.Canceled,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := reportReplay(&out, tt.s, tt.err)
			if out.String() != tt.want {
				t.Errorf("printed %q, want %q", out.String(), tt.want)
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr):
				t.Errorf("error %v, want %q", err, tt.wantErr)
			case tt.is != nil && !errors.Is(err, tt.is):
				t.Errorf("error %v does not wrap %v", err, tt.is)
			}
		})
	}
}

// TestLetterList checks the two renderings of a dlq list result.
func TestLetterList(t *testing.T) {
	at := time.Date(2024, 5, 1, 12, 0, 0, 0, time.FixedZone("CEST", 2*3600))
	list := letterList{
		Letters: []deadletter.Letter{{ID: 1, EventID: "ev-0", ErrorCode: "message_too_large", Payload: []byte(`{"a":1}`), LastFailedAt: at, Status: deadletter.StatusPending}},
		Summary: []deadletter.CodeCount{{ErrorCode: "message_too_large", Count: 2, Pending: 2, Oldest: at, Newest: at}},
		Total:   2,
	}
	j := list.json()
	if j.Total != 2 || len(j.Letters) != 1 || j.Letters[0].EventID != "ev-0" || len(j.Summary) != 1 ||
		j.Summary[0].Count != 2 || j.Summary[0].Oldest.Location() != time.UTC {
		t.Errorf("json() = %+v", j)
	}
	tests := []struct {
		name string
		list letterList
		want []string
	}{
		{"none", letterList{}, []string{"no dead letters match"}},
		{"beyond the limit", list, []string{"ev-0", "2024-05-01 10:00:00Z", "1 of 2 matching letters shown (raise --limit, or 0 for all)", "message_too_large  2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			printList(&out, tt.list)
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("printList lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}
