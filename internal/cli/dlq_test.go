package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// infra is a database and a broker for CLI tests.
type infra struct {
	pg    *sandbox.Postgres
	url   string
	pool  *pgxpool.Pool
	kafka *sandbox.Kafka
}

func newInfra(t *testing.T, db string) *infra {
	t.Helper()
	pg := testenv.NewPostgres(t, sandbox.PGOptions{})
	url, err := pg.CreateDatabase(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &infra{pg: pg, url: url, pool: pool, kafka: testenv.NewKafka(t, sandbox.KafkaOptions{})}
}

// brokers is the --kafka-brokers value.
func (in *infra) brokers() string { return strings.Join(in.kafka.Brokers(), ",") }

func (in *infra) read(t *testing.T, topic string) []sandbox.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	recs, err := sandbox.ReadAll(ctx, in.kafka.Brokers(), topic)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// mustRun runs the command line and fails on error.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	err, out, errOut := run(t, t.Context(), args...)
	if err != nil {
		t.Fatalf("cdc-relay %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

func TestDLQCommands(t *testing.T) {
	clearEnv(t)
	in := newInfra(t, "cdc_relay_cli_dlq")
	ctx := t.Context()
	t.Setenv("CDC_RELAY_PG_URL", in.url) // as an operator would: the relay's environment
	const table = "public.cli_dead_letters"
	s := deadletter.NewStore(in.pool, table)
	if err := s.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	topic := "cli.dlq.orders"
	failed := time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)
	for i, code := range []string{"message_too_large", "message_too_large", "invalid_topic"} {
		id := fmt.Sprintf("ev-%d", i)
		err := s.Add(ctx, deadletter.Letter{
			EventID: id, AggregateType: "order", AggregateID: fmt.Sprint(40 + i), EventType: "OrderPlaced",
			Key: []byte(fmt.Sprint(40 + i)), Payload: []byte(fmt.Sprintf(`{"orderId":%d,"lines":[1,2]}`, 40+i)),
			Headers: map[string]string{sink.HeaderID: id, "tenant": "acme"}, Topic: topic,
			ErrorCode: code, ErrorMessage: code + ": rejected by the broker",
			FirstFailedAt: failed.Add(time.Duration(i) * time.Hour), LastFailedAt: failed.Add(time.Duration(i) * time.Hour),
			RelayName: "relay-1", CommitLSN: 0x16B3748,
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	ids := map[string]int64{}
	letters, _ := s.List(ctx, deadletter.Filter{})
	for _, l := range letters {
		ids[l.EventID] = l.ID
	}

	t.Run("list table", func(t *testing.T) {
		out := mustRun(t, "dlq", "list", "--dlq-table", table)
		t.Logf("dlq list:\n%s", out)
		for _, w := range []string{"ID", "EVENT ID", "CODE", "LAST FAILURE", "ev-0", "ev-2", "order/42", "OrderPlaced", topic,
			"2024-05-01 12:00:00Z", "3 of 3 matching letters shown", "message_too_large  2", "invalid_topic      1"} {
			if !strings.Contains(out, w) {
				t.Errorf("dlq list lacks %q", w)
			}
		}
		out = mustRun(t, "dlq", "list", "--dlq-table", table, "--limit", "1")
		if !strings.Contains(out, "1 of 3 matching letters shown (raise --limit") {
			t.Errorf("dlq list --limit 1:\n%s", out)
		}
	})

	t.Run("list result", func(t *testing.T) {
		list, err := listLetters(ctx, s, deadletter.Filter{ErrorCode: "message_too_large"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Letters) != 1 || list.Letters[0].EventID != "ev-0" || list.Total != 2 || len(list.Summary) != 1 || list.Summary[0].Pending != 2 {
			t.Errorf("listLetters(message_too_large, limit 1) = %+v", list)
		}
	})

	t.Run("list json", func(t *testing.T) {
		out := mustRun(t, "dlq", "list", "--dlq-table", table, "--json", "--error-code", "message_too_large")
		var got struct {
			Letters []map[string]any `json:"letters"`
			Summary []map[string]any `json:"summary"`
			Total   int              `json:"total"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("dlq list --json is not JSON: %v\n%s", err, out)
		}
		if len(got.Letters) != 2 || got.Total != 2 || len(got.Summary) != 1 || got.Summary[0]["error_code"] != "message_too_large" {
			t.Fatalf("dlq list --json = %s", out)
		}
		l := got.Letters[0]
		if l["event_id"] != "ev-0" || l["key"] != "40" || l["status"] != "pending" || l["commit_lsn"] != "0/16B3748" ||
			l["payload"].(map[string]any)["orderId"] != 40.0 || l["headers"].(map[string]any)["tenant"] != "acme" {
			t.Errorf("first letter = %v", l)
		}
	})

	t.Run("list filters", func(t *testing.T) {
		tests := []struct {
			args []string
			want []string
		}{
			{[]string{"--error-code", "invalid_topic"}, []string{"ev-2"}},
			{[]string{"--aggregate-id", "41"}, []string{"ev-1"}},
			{[]string{"--since", "2024-05-01T11:00:00Z"}, []string{"ev-1", "ev-2"}},
			{[]string{"--until", "2024-05-01T11:00:00Z"}, []string{"ev-0"}},
			{[]string{"--since", "2024-05-01", "--until", "2024-05-02", "--event-type", "OrderPlaced"}, []string{"ev-0", "ev-1", "ev-2"}},
			{[]string{"--since", "1h"}, nil}, // all failed in 2024
			{[]string{"--status", "replayed"}, nil},
			{[]string{"--status", "completed"}, nil},
			{[]string{"--status", "pending"}, []string{"ev-0", "ev-1", "ev-2"}},
			{[]string{"--event-id", "ev-2", "--event-id", "ev-0,nope"}, []string{"ev-0", "ev-2"}},
			{[]string{"--topic", topic}, []string{"ev-0", "ev-1", "ev-2"}},
			{[]string{"--topic", "other.topic"}, nil},
			{[]string{"--topic", topic, "--event-id", "ev-1"}, []string{"ev-1"}},
		}
		for _, tt := range tests {
			out := mustRun(t, append([]string{"dlq", "list", "--dlq-table", table, "--json"}, tt.args...)...)
			var got struct {
				Letters []struct {
					EventID string `json:"event_id"`
				}
			}
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatal(err)
			}
			var events []string
			for _, l := range got.Letters {
				events = append(events, l.EventID)
			}
			if !slices.Equal(events, tt.want) {
				t.Errorf("dlq list %v selected %v, want %v", tt.args, events, tt.want)
			}
		}
	})

	t.Run("show", func(t *testing.T) {
		out := mustRun(t, "dlq", "show", fmt.Sprint(ids["ev-1"]), "--dlq-table", table)
		t.Logf("dlq show:\n%s", out)
		for _, w := range []string{"event id:", "ev-1", "error message:", "message_too_large: rejected by the broker",
			"topic:", topic, "commit lsn:", "0/16B3748", "tenant: acme", "payload (JSON", "\"orderId\": 41,\n  \"lines\": [\n"} {
			if !strings.Contains(out, w) {
				t.Errorf("dlq show lacks %q", w)
			}
		}
		out = mustRun(t, "dlq", "show", fmt.Sprint(ids["ev-1"]), "--dlq-table", table, "--json")
		var l map[string]any
		if err := json.Unmarshal([]byte(out), &l); err != nil || l["event_id"] != "ev-1" || l["retry_count"] != 0.0 {
			t.Errorf("dlq show --json = %v (%v):\n%s", l, err, out)
		}
		err, _, _ := run(t, ctx, "dlq", "show", "999999", "--dlq-table", table)
		if err == nil || !strings.Contains(err.Error(), "999999") || !strings.Contains(err.Error(), "not found") {
			t.Errorf("dlq show of a missing id: %v", err)
		}

		// By event id, as the relay logs it; several make a JSON array.
		out = mustRun(t, "dlq", "show", "--event-id", "ev-2", "--dlq-table", table)
		if !strings.Contains(out, "event id:") || !strings.Contains(out, "ev-2") || strings.Contains(out, "ev-1") {
			t.Errorf("dlq show --event-id ev-2:\n%s", out)
		}
		out = mustRun(t, "dlq", "show", fmt.Sprint(ids["ev-0"]), "--event-id", "ev-2", "--dlq-table", table, "--json")
		var several []map[string]any
		if err := json.Unmarshal([]byte(out), &several); err != nil || len(several) != 2 || several[0]["event_id"] != "ev-0" || several[1]["event_id"] != "ev-2" {
			t.Errorf("dlq show ID --event-id --json = %v (%v):\n%s", several, err, out)
		}
		err, _, _ = run(t, ctx, "dlq", "show", "--event-id", "no-such-event", "--dlq-table", table)
		if err == nil || !strings.Contains(err.Error(), "no-such-event") || !strings.Contains(err.Error(), "not found") {
			t.Errorf("dlq show of a missing event id: %v", err)
		}
	})

	t.Run("replay", func(t *testing.T) {
		base := []string{"dlq", "replay", "--dlq-table", table, "--kafka-brokers", in.brokers(), "--actor", "ops", "--rate", "0"}
		out := mustRun(t, append(base, "--dry-run", "--error-code", "message_too_large")...)
		if !strings.Contains(out, "dry run") || !strings.Contains(out, "selected 2") || !strings.Contains(out, "would publish 2") {
			t.Errorf("dry run printed:\n%s", out)
		}
		if n := len(in.read(t, topic)); n != 0 {
			t.Errorf("dry run published %d records", n)
		}
		out = mustRun(t, append(base, "--dry-run", "--event-id", "ev-1,ev-2", "--event-id", "ev-0")...)
		if !strings.Contains(out, "selected 3") {
			t.Errorf("dry run by event ids printed:\n%s", out)
		}
		out = mustRun(t, append(base, "--id", fmt.Sprint(ids["ev-0"]), "--id", fmt.Sprint(ids["ev-2"]))...)
		if !strings.Contains(out, "selected 2, published 2, skipped 0, failed 0") || !strings.Contains(out, "by ops") {
			t.Errorf("replay printed:\n%s", out)
		}
		recs := in.read(t, topic)
		var got []string
		for _, r := range recs {
			got = append(got, r.Headers["id"])
			if r.Headers[replay.HeaderReplay] == "" {
				t.Errorf("record without replay header: %v", r.Headers)
			}
		}
		if slices.Sort(got); !slices.Equal(got, []string{"ev-0", "ev-2"}) {
			t.Errorf("Kafka has %v", got)
		}
		out = mustRun(t, base...)
		if !strings.Contains(out, "selected 3, published 1, skipped 2, failed 0") {
			t.Errorf("second replay printed:\n%s", out)
		}
	})

	t.Run("history", func(t *testing.T) {
		out := mustRun(t, "dlq", "history", "--dlq-table", table)
		for _, w := range []string{"KIND", "dlq", "ops", "dry run", "publish", `"error_code":"message_too_large"`} {
			if !strings.Contains(out, w) {
				t.Errorf("dlq history lacks %q:\n%s", w, out)
			}
		}
		replays, err := s.History().List(ctx, 1)
		if err != nil || len(replays) != 1 {
			t.Fatal(replays, err)
		}
		out = mustRun(t, "dlq", "history", "--dlq-table", table, "--replay", fmt.Sprint(replays[0].ID))
		if strings.Count(out, "skipped") != 2 || strings.Count(out, "published") != 1 {
			t.Errorf("dlq history --replay:\n%s", out)
		}

		// The state transitions of a letter: claimed, then completed.
		out = mustRun(t, "dlq", "history", "--dlq-table", table, "--event-id", "ev-1")
		t.Logf("dlq history --event-id ev-1:\n%s", out)
		for _, w := range []string{"FROM", "TO", "BY", "ev-1", "pending", "processing", "completed", "replay " + fmt.Sprint(replays[0].ID) + " on "} {
			if !strings.Contains(out, w) {
				t.Errorf("dlq history --event-id lacks %q", w)
			}
		}
		out = mustRun(t, "dlq", "history", "--dlq-table", table, "--transitions", "--json")
		var ts []map[string]any
		if err := json.Unmarshal([]byte(out), &ts); err != nil || len(ts) != 6 { // 3 letters, each claimed and completed
			t.Errorf("dlq history --transitions --json: %d transitions (%v), want 6:\n%s", len(ts), err, out)
		}
	})

	t.Run("purge", func(t *testing.T) {
		out := mustRun(t, "dlq", "purge", "--dlq-table", table, "--older-than", "7d", "--status", "pending")
		if !strings.Contains(out, "deleted 0 dead letters (pending)") {
			t.Errorf("purge of pending printed: %s", out)
		}
		// The replayed letters were replayed just now: not older than 7 days yet.
		if _, err := in.pool.Exec(ctx, "UPDATE "+table+" SET replayed_at = replayed_at - interval '8 days'"); err != nil {
			t.Fatal(err)
		}
		out = mustRun(t, "dlq", "purge", "--dlq-table", table, "--older-than", "7d")
		if !strings.Contains(out, "deleted 3 dead letters") {
			t.Errorf("purge printed: %s", out)
		}
	})

	t.Run("missing table", func(t *testing.T) {
		err, _, _ := run(t, ctx, "dlq", "list", "--dlq-table", "public.nope")
		if err == nil || !strings.Contains(err.Error(), "migrations/005_dead_letters.sql") {
			t.Errorf("dlq list on a missing table: %v", err)
		}
	})
}

func TestDLQFlagErrors(t *testing.T) {
	clearEnv(t)
	pg := "postgres://u@" + closedAddr(t) + "/db"
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"dlq", "list"}, []string{"--pg-url", "CDC_RELAY_PG_URL", "is required"}},
		{[]string{"dlq", "list", "--pg-url", pg, "--since", "yesterday"}, []string{"--since", "CDC_RELAY_SINCE", `"yesterday"`, "RFC 3339"}},
		{[]string{"dlq", "list", "--pg-url", pg, "--until", "-2h"}, []string{"--until", "CDC_RELAY_UNTIL"}},
		{[]string{"dlq", "list", "--pg-url", pg, "--since", "1h", "--until", "2h"}, []string{"--until", "not after --since"}},
		{[]string{"dlq", "list", "--pg-url", pg, "--status", "done"}, []string{"--status", "CDC_RELAY_STATUS", `"done"`, "pending"}},
		{[]string{"dlq", "list", "--pg-url", pg, "--limit", "-1"}, []string{"--limit", "CDC_RELAY_LIMIT"}},
		{[]string{"dlq", "list", "--pg-url", pg, "--dlq-table", "a.b.c"}, []string{"--dlq-table", "CDC_RELAY_DLQ_TABLE"}},
		{[]string{"dlq", "show", "--pg-url", pg}, []string{"<id>"}},
		{[]string{"dlq", "show", "x", "--pg-url", pg}, []string{"<id>"}},
		{[]string{"dlq", "replay", "--pg-url", pg}, []string{"--kafka-brokers", "CDC_RELAY_KAFKA_BROKERS", "is required", "--dry-run"}},
		{[]string{"dlq", "replay", "--pg-url", pg, "--kafka-brokers", "kafka"}, []string{"--kafka-brokers", `"kafka"`}},
		{[]string{"dlq", "replay", "--pg-url", pg, "--dry-run", "--rate", "-1"}, []string{"--rate", "CDC_RELAY_RATE"}},
		{[]string{"dlq", "replay", "--pg-url", pg, "--dry-run", "--batch-size", "0"}, []string{"--batch-size", "CDC_RELAY_BATCH_SIZE"}},
		{[]string{"dlq", "replay", "--pg-url", pg, "--dry-run", "--id", "0"}, []string{"--id", "CDC_RELAY_ID"}},
		{[]string{"dlq", "replay", "--pg-url", pg, "--dry-run", "--topic", "no spaces"}, []string{"--topic", `"no spaces"`, "not a topic Kafka accepts"}},
		{[]string{"dlq", "replay", "--pg-url", pg, "--dry-run", "--lease", "10ms"}, []string{"--lease", "CDC_RELAY_LEASE", "at least 1s"}},
		{[]string{"dlq", "list", "--pg-url", pg, "--status", "replay_wait"}, []string{"--status", `"replay_wait"`, "retry_wait", "dead"}},
		{[]string{"dlq", "purge", "--pg-url", pg}, []string{"--older-than"}},
		{[]string{"dlq", "purge", "--pg-url", pg, "--older-than", "7"}, []string{"--older-than", "CDC_RELAY_OLDER_THAN", `"7"`, "7d"}},
		{[]string{"dlq", "purge", "--pg-url", pg, "--older-than", "7d", "--status", "x"}, []string{"--status", `"x"`}},
		{[]string{"dlq", "list", "--pg-url", "postgres://u:secret@" + closedAddr(t) + "/db"}, []string{"connect to Postgres", "CDC_RELAY_PG_URL"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			err, _, _ := run(t, ctx, tt.args...)
			if err == nil {
				t.Fatalf("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error leaks the password: %v", err)
			}
		})
	}
}

func TestDLQEnv(t *testing.T) {
	clearEnv(t)
	t.Setenv("CDC_RELAY_PG_URL", "postgres://u@h/db")
	t.Setenv("CDC_RELAY_DLQ_TABLE", "ops.letters")
	t.Setenv("CDC_RELAY_RATE", "5")
	t.Setenv("CDC_RELAY_KAFKA_BROKERS", "k1:9092, k2:9092")
	t.Setenv("CDC_RELAY_TOPIC", "outbox.{aggregate_type}") // run's template, in the relay's environment
	c, err := parseArgs(t, "dlq", "replay", "--since", "2h")
	if err != nil {
		t.Fatal(err)
	}
	r := c.DLQ.Replay
	if r.PGURL != "postgres://u@h/db" || r.DLQTable != "ops.letters" || r.Rate != 5 || !slices.Equal(r.KafkaBrokers, []string{"k1:9092", "k2:9092"}) {
		t.Errorf("parsed %+v", r)
	}
	if d := time.Since(r.filter.Since); d < 2*time.Hour || d > 2*time.Hour+time.Minute {
		t.Errorf("--since 2h is %v ago", d)
	}
	if r.BatchSize != 100 || r.KafkaStartTimeout != 30*time.Second || r.actor() == "" || r.Lease != 2*time.Minute {
		t.Errorf("defaults: batch %d, timeout %v, actor %q, lease %v", r.BatchSize, r.KafkaStartTimeout, r.actor(), r.Lease)
	}
	if r.Topic != "" {
		t.Errorf("dlq replay took CDC_RELAY_TOPIC %q as its topic override", r.Topic)
	}
	c, err = parseArgs(t, "dlq", "list")
	if err != nil || c.DLQ.List.Topic != "" {
		t.Errorf("dlq list took CDC_RELAY_TOPIC as its --topic filter: %q, %v", c.DLQ.List.Topic, err)
	}
}
