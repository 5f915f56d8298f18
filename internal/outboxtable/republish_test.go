package outboxtable_test

import (
	"bytes"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/outboxtable"
	"github.com/cdc-relay/cdc-relay/internal/replay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestRepublish: a Republisher replays the rows of every table it has (or of
// those named), created since a time, each table to its own topic with the
// mark header, records one replay per table, and counts what Kafka
// acknowledged; a row that cannot be published stays behind, counted and
// logged with the command that shows it.
func TestRepublish(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t, "cdc_relay_outboxtable_republish")
	kafka := testenv.NewKafka(t, sandbox.KafkaOptions{})
	store := newStore(t, pool)
	a := outboxTable(t, pool)
	b := "public.outbox_b"
	if _, err := pool.Exec(ctx, `CREATE TABLE `+b+` (LIKE `+a+` INCLUDING ALL)`); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	idsA := insertRows(t, pool, a, now,
		row{"order", "A", "Placed", 2 * time.Hour},
		row{"order", "A", "Paid", 30 * time.Minute},
		row{"order", "B", "Placed", 10 * time.Minute})
	idsB := insertRows(t, pool, b, now,
		row{"user", "U", "Registered", 3 * time.Hour},
		row{"user", "U", "bad/type", 20 * time.Minute})
	tableA, tableB := decoder.TableName{Schema: "public", Table: "outbox"}, decoder.TableName{Schema: "public", Table: "outbox_b"}
	cols := outboxtable.Columns{Columns: decoder.DefaultColumns()}

	tests := []struct {
		name   string
		tables []decoder.TableName
		since  time.Duration // ago; 0: all rows
		topicB string        // table b's topic template after the prefix
		wantA  []string      // ids in table a's topic
		wantB  []string
		failed int // rows of b that fail
	}{
		{"every table", nil, 0, "b", idsA, idsB, 0},
		{"since", nil, time.Hour, "b", idsA[1:], idsB[1:], 0},
		{"tables named", []decoder.TableName{tableB}, 0, "b", nil, idsB, 0},
		{"a row that fails stays", nil, time.Hour, "{event_type}", idsA[1:], nil, 1}, // b: the bad/type row
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := "rp" + string(rune('a'+i)) + "."
			var logged syncBuffer
			m := metrics.New(prometheus.NewRegistry())
			before, _ := store.History().List(ctx, 0)
			rp := outboxtable.Republisher{
				Tables: []outboxtable.TableReplay{
					{Table: tableA, Columns: cols, Topic: prefix + "a"},
					{Table: tableB, Columns: cols, Topic: prefix + tt.topicB},
				},
				DeadLetterStore: store, Sink: sink.Config{Brokers: kafka.Brokers()}, Wait: 30 * time.Second,
				Component: "backfill", Actor: "test", Log: zerolog.New(&logged), Metrics: m,
			}
			n, err := rp.Republish(ctx, pool, tt.tables, sinceTime(now, tt.since), outbox.Header{Key: replay.HeaderBackfill, Value: []byte("test")})
			if err != nil {
				t.Fatal(err)
			}
			if want := len(tt.wantA) + len(tt.wantB); n != want {
				t.Errorf("Republish = %d, want %d published", n, want)
			}
			for topic, want := range map[string][]string{prefix + "a": tt.wantA, prefix + "b": tt.wantB} {
				if len(want) == 0 {
					continue // the topic may not exist
				}
				recs := testenv.MustReadAll(t, kafka, topic)
				if got := sandbox.IDs(recs); !slices.Equal(got, sorted(want)) {
					t.Errorf("%s holds %v, want %v", topic, got, sorted(want))
				}
				for _, r := range recs {
					if r.Headers[replay.HeaderBackfill] != "test" || r.Headers[replay.HeaderReplay] == "" {
						t.Errorf("%s: record %s has headers %v, want %s: test and %s", topic, r.Headers["id"], r.Headers, replay.HeaderBackfill, replay.HeaderReplay)
					}
				}
			}
			after, err := store.History().List(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			wantRuns := 2
			if tt.tables != nil {
				wantRuns = len(tt.tables)
			}
			if got := len(after) - len(before); got != wantRuns {
				t.Errorf("%d replays recorded, want %d (one per table)", got, wantRuns)
			}
			published := testutil.ToFloat64(m.Replays.WithLabelValues(replay.KindOutbox, replay.ResultPublished))
			failed := testutil.ToFloat64(m.Replays.WithLabelValues(replay.KindOutbox, replay.ResultFailed))
			if int(published) != n || int(failed) != tt.failed {
				t.Errorf("metrics: %v published, %v failed; want %d, %d", published, failed, n, tt.failed)
			}
			line := "backfill: some rows could not be published (they stay in the outbox table); see (command dlq history)"
			if got := strings.Contains(logged.String(), line); got != (tt.failed > 0) {
				t.Errorf("log %q; want the line %q: %v", logged.String(), line, tt.failed > 0)
			}
		})
	}

	t.Run("history cannot be opened", func(t *testing.T) {
		rp := outboxtable.Republisher{DeadLetterStore: deadletter.NewStore(pool, "no_such_schema.dead_letters"),
			Sink: sink.Config{Brokers: kafka.Brokers()}, Wait: 30 * time.Second, Component: "backfill"}
		_, err := rp.Republish(ctx, pool, nil, time.Time{}, outbox.Header{Key: replay.HeaderBackfill, Value: []byte("test")})
		if err == nil || !strings.Contains(err.Error(), "no_such_schema.dead_letters (setting DeadLetterStore)") {
			t.Errorf("Republish = %v, want an error naming the table and its setting", err)
		}
	})
}

func sinceTime(now time.Time, ago time.Duration) time.Time {
	if ago == 0 {
		return time.Time{}
	}
	return now.Add(-ago)
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

// syncBuffer is a bytes.Buffer safe for the logger's goroutines (the sink's).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
