package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseAge(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{"7d", 7 * 24 * time.Hour, false},
		{"1d12h", 36 * time.Hour, false},
		{"1.5d", 36 * time.Hour, false},
		{"24h", 24 * time.Hour, false},
		{"30m", 30 * time.Minute, false},
		{"90s", 90 * time.Second, false},
		{" 2h ago", 2 * time.Hour, false},
		{"0d", 0, true},
		{"0s", 0, true},
		{"-1h", 0, true},
		{"-1d", 0, true},
		{"7", 0, true},
		{"d", 0, true},
		{"nand", 0, true},
		{"1e2d", 0, true},
		{"7dd", 0, true},
		{"1d-2h", 0, true},
		{"+2h", 0, true},
		{"", 0, true},
		{"week", 0, true},
	}
	for _, tt := range tests {
		got, err := parseAge(tt.in)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("parseAge(%q) = %v, %v; want %v (error: %v)", tt.in, got, err, tt.want, tt.err)
		}
		if err != nil && !strings.Contains(err.Error(), fmt.Sprintf("%q", tt.in)) {
			t.Errorf("parseAge(%q) error %q does not quote the value", tt.in, err)
		}
	}
}

func TestParseTime(t *testing.T) {
	now := time.Date(2024, 5, 10, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Time
		err  bool
	}{
		{"", time.Time{}, false},
		{"2024-05-01T10:00:00Z", time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC), false},
		{"2024-05-01T10:00:00.5+02:00", time.Date(2024, 5, 1, 8, 0, 0, 5e8, time.UTC), false},
		{"2024-05-01", time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC), false},
		{"2h", now.Add(-2 * time.Hour), false},
		{"7d", now.Add(-7 * 24 * time.Hour), false},
		{"yesterday", time.Time{}, true},
		{"2024-13-01", time.Time{}, true},
	}
	for _, tt := range tests {
		got, err := parseTime(tt.in, now)
		if (err != nil) != tt.err || !got.Equal(tt.want) {
			t.Errorf("parseTime(%q) = %v, %v; want %v (error: %v)", tt.in, got, err, tt.want, tt.err)
		}
	}
}

func TestReplayAndPruneCommands(t *testing.T) {
	clearEnv(t)
	in := newInfra(t, "cdc_relay_cli_replay")
	ctx := t.Context()
	const outbox = "public.app_outbox"
	if _, err := in.pool.Exec(ctx, `CREATE TABLE `+outbox+` (
    event_id  uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    kind      text        NOT NULL,
    entity    text        NOT NULL,
    name      text        NOT NULL,
    body      jsonb       NOT NULL,
    inserted  timestamptz NOT NULL,
    trace     text
);
INSERT INTO `+outbox+` (kind, entity, name, body, inserted, trace)
SELECT 'order', 'o-' || (i % 3), 'Placed', jsonb_build_object('i', i), now() - i * interval '1 hour', 't-' || i
FROM generate_series(1, 12) i`); err != nil {
		t.Fatal(err)
	}
	pgArgs := []string{"--pg-url", in.url, "--table", outbox, "--column-id", "event_id", "--column-aggregate-type", "kind",
		"--column-aggregate-id", "entity", "--column-event-type", "name", "--column-payload", "body", "--column-created-at", "inserted"}

	// Rows created 2.5h to 5.5h ago: i = 3, 4, 5 (hours ago), of entity o-0 only: i = 3.
	args := append([]string{"replay", "--kafka-brokers", in.brokers(), "--topic", "cli.replay.{aggregate_type}",
		"--since", "5h30m", "--until", "2h30m", "--header-columns", "trace=x-trace", "--rate", "0", "--actor", "ops"}, pgArgs...)
	out := mustRun(t, args...)
	if !strings.Contains(out, "replay 1 (outbox, by ops): selected 3, published 3, skipped 0, failed 0") {
		t.Errorf("replay printed:\n%s", out)
	}
	recs := in.read(t, "cli.replay.order")
	var traces []string
	for _, r := range recs {
		traces = append(traces, r.Headers["x-trace"])
		if r.Headers["cdc_relay_replay"] != "1" || r.Headers["id"] == "" || r.Headers["event_type"] != "Placed" {
			t.Errorf("record headers %v", r.Headers)
		}
	}
	if slices.Sort(traces); !slices.Equal(traces, []string{"t-3", "t-4", "t-5"}) {
		t.Errorf("replayed rows %v, want t-3, t-4, t-5", traces)
	}
	err, out, errOut := run(t, ctx, append(args, "--aggregate-id", "o-0", "--dry-run")...)
	if err != nil || !strings.Contains(out, "dry run 2 (outbox, by ops): selected 1") {
		t.Errorf("dry run: %v, printed:\n%s", err, out)
	}
	// The test cluster tracks no commit timestamps: the replay says which
	// order it reads in and what that can misorder (issue 42).
	if want := "replay: reading " + outbox + " in start order: "; !strings.Contains(errOut, want) || !strings.Contains(errOut, "track_commit_timestamp = on") {
		t.Errorf("replay's stderr %q, want a line with %q naming track_commit_timestamp", errOut, want)
	}

	// Prune: rows older than 6h (i = 7..12) go.
	out = mustRun(t, append([]string{"prune", "--older-than", "6h30m", "--batch-size", "4", "--column-created-at", "inserted"}, pgArgs[:4]...)...)
	if !strings.Contains(out, "deleted 6 rows of "+outbox) {
		t.Errorf("prune printed: %s", out)
	}
	var left int
	if err := in.pool.QueryRow(ctx, "SELECT count(*) FROM "+outbox).Scan(&left); err != nil || left != 6 {
		t.Errorf("%d rows left (err %v), want 6", left, err)
	}
	// prune needs --column-created-at here, the default column does not exist.
	err, _, _ = run(t, ctx, "prune", "--older-than", "1d", "--pg-url", in.url, "--table", outbox)
	if err == nil || !strings.Contains(err.Error(), outbox) {
		t.Errorf("prune without the created-at column: %v", err)
	}
}

func TestReplayFlagErrors(t *testing.T) {
	clearEnv(t)
	pg := "postgres://u@" + closedAddr(t) + "/db"
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"replay", "--pg-url", pg, "--dry-run"}, []string{"--since", "CDC_RELAY_SINCE", "is required"}},
		{[]string{"replay", "--pg-url", pg, "--since", "2h"}, []string{"--kafka-brokers", "CDC_RELAY_KAFKA_BROKERS"}},
		{[]string{"replay", "--pg-url", pg, "--since", "2h", "--dry-run", "--until", "3h"}, []string{"--until", "CDC_RELAY_UNTIL"}},
		{[]string{"replay", "--pg-url", pg, "--since", "2h", "--dry-run", "--topic", "x.{nope}"}, []string{"--topic", "CDC_RELAY_TOPIC", "{nope}"}},
		{[]string{"replay", "--pg-url", pg, "--since", "2h", "--dry-run", "--messages-prefix", "outbox"}, []string{"--messages-prefix", "CDC_RELAY_MESSAGES_PREFIX", "a message outbox has none"}},
		{[]string{"replay", "--pg-url", pg, "--since", "2h", "--dry-run", "--header-columns", "trace=id"}, []string{"--header-columns", "CDC_RELAY_HEADER_COLUMNS"}},
		{[]string{"replay", "--pg-url", pg, "--since", "2h", "--dry-run", "--table", "a.b.c"}, []string{"--table", "CDC_RELAY_TABLE"}},
		{[]string{"replay", "--since", "2h", "--dry-run"}, []string{"--pg-url", "CDC_RELAY_PG_URL"}},
		{[]string{"prune", "--pg-url", pg, "--older-than", "soon"}, []string{"--older-than", "CDC_RELAY_OLDER_THAN", `"soon"`}},
		{[]string{"prune", "--pg-url", pg, "--older-than", "7d", "--batch-size", "0"}, []string{"--batch-size", "CDC_RELAY_BATCH_SIZE"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			err, _, _ := run(t, ctx, tt.args...)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
