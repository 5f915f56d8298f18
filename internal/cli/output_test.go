package cli

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/report"
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
		s       report.ReplaySummary
		err     error
		want    string // output
		wantErr string // "" for none
		is      error  // errors.Is target, when set
	}{
		{
			name: "did not start", s: report.ReplaySummary{Kind: "dlq", Actor: "ann"}, err: stopped,
			want: "", wantErr: "stopped", is: stopped,
		},
		{
			name: "published", s: report.ReplaySummary{Kind: "outbox", Actor: "bob", Result: replay.Outcome{ReplayID: 3,
				Counts: replay.Counts{Selected: 2, Published: 2}}},
			want: "replay 3 (outbox, by bob): selected 2, published 2, skipped 0, failed 0\n",
		},
		{
			name: "dry run", s: report.ReplaySummary{Kind: "dlq", Actor: "ann", DryRun: true, Result: replay.Outcome{ReplayID: 5,
				Counts: replay.Counts{Selected: 3, Skipped: 1}, DryRun: 2}},
			want: "dry run 5 (dlq, by ann): selected 3, published 0, skipped 1, failed 0, would publish 2\n",
		},
		{
			name: "failures, more than listed", s: report.ReplaySummary{Kind: "dlq", Actor: "ann", Result: replay.Outcome{ReplayID: 9,
				Counts: replay.Counts{Selected: 5, Published: 2, Failed: 3}, Failures: failures}},
			want: "replay 9 (dlq, by ann): selected 5, published 2, skipped 0, failed 3\nfailures:\n" +
				"  dead letter 4, event e-1: too large\n  event e-2: bad topic\n  ... and 1 more: cdc-relay dlq history --replay 9\n",
			wantErr: "replay 9: 3 of 5 events failed (listed above)",
		},
		{
			name: "stopped midway", s: report.ReplaySummary{Kind: "outbox", Actor: "bob", Result: replay.Outcome{ReplayID: 2,
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
