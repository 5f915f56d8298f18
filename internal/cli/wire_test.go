package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/route"
)

// TestWireBuildsValuesFirst: wire sets every value the relay takes with
// every policy on, and each can be used as soon as wire returns, before the
// relay runs: the stores exist over a pool that has not connected yet, so
// with nothing listening each call fails with Postgres's error instead of
// dereferencing a store only the relay's start would have assigned.
func TestWireBuildsValuesFirst(t *testing.T) {
	clearEnv(t)
	c, err := parseArgs(t, "run", "--pg-url", "postgres://u@"+closedAddr(t)+"/app?connect_timeout=5",
		"--kafka-brokers", "k1:9092", "--on-error", "dlq", "--dlq-retention", "1h", "--dlq-auto-retry",
		"--on-slot-loss", "backfill", "--snapshot", "initial")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := c.Run.config(zerolog.Nop(), metrics.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool, err := relay.OpenPool(ctx, cfg.PGURL, cfg.Names)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := c.Run.wire(&cfg, pool, nil, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("the wired configuration does not validate: %v", err)
	}
	if _, ok := cfg.Checkpoints.(*checkpoint.TableStore); !ok {
		t.Errorf("Checkpoints = %T, want *checkpoint.TableStore", cfg.Checkpoints)
	}
	if _, ok := cfg.DeadLetterStore.(*deadletter.Store); !ok {
		t.Errorf("DeadLetterStore = %T, want *deadletter.Store", cfg.DeadLetterStore)
	}
	if cfg.DeadLetter == nil || cfg.ReplayTotals == nil || cfg.DeadLetterRetention == nil ||
		cfg.DeadLetterAutoRetry == nil || cfg.Backfill == nil || cfg.Snapshot == nil {
		t.Fatalf("unset: DeadLetter %t, ReplayTotals %t, DeadLetterRetention %t, DeadLetterAutoRetry %t, Backfill %t, Snapshot %t",
			cfg.DeadLetter == nil, cfg.ReplayTotals == nil, cfg.DeadLetterRetention == nil,
			cfg.DeadLetterAutoRetry == nil, cfg.Backfill == nil, cfg.Snapshot == nil)
	}
	if err := cfg.Checkpoints.Ensure(ctx); err == nil {
		t.Error("Checkpoints.Ensure with no Postgres listening: nil error")
	}
	if _, err := cfg.DeadLetterStore.StatusCounts(ctx); err == nil {
		t.Error("DeadLetterStore.StatusCounts with no Postgres listening: nil error")
	}
	if _, err := cfg.ReplayTotals(ctx); err == nil {
		t.Error("ReplayTotals with no Postgres listening: nil error")
	}
	if _, err := cfg.DeadLetterRetention(ctx); err == nil {
		t.Error("DeadLetterRetention with no Postgres listening: nil error")
	}
}

// TestWiredDeadLetterNamesFlags: a dead letter keeps its error as the operator
// reads it in dlq list and dlq show, naming the key and flag to fix, which
// the library that failed the event (the router) named through the Namer
// the command line wired into the configuration.
func TestWiredDeadLetterNamesFlags(t *testing.T) {
	clearEnv(t)
	in := newInfra(t, "cdc_relay_cli_wire_dlq")
	c, err := parseArgs(t, "run", "--pg-url", in.url, "--kafka-brokers", in.brokers(), "--on-error", "dlq",
		"--topic-regex", "order-(.*)", "--topic", "orders.$1")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := c.Run.config(zerolog.Nop(), metrics.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run.wire(&cfg, in.pool, nil, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := cfg.DeadLetterStore.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	// An aggregate type the regex does not match is the topic, and this
	// one is no legal topic name.
	ev := &outbox.Event{ID: []byte("ev-flag"), AggregateID: []byte("a-1"), AggregateType: []byte("no topic!"), EventType: []byte("T"), Payload: []byte("{}")}
	router, err := route.NewWithRegex(cfg.Topic, cfg.TopicRegex)
	if err != nil {
		t.Fatal(err)
	}
	_, cause := router.Topic(ev)
	if cause == nil {
		t.Fatal("the router accepted an illegal topic")
	}
	if err := cfg.DeadLetter(ctx, ev, cfg.Topic, cause); err != nil {
		t.Fatal(err)
	}
	letters, err := cfg.DeadLetterStore.(*deadletter.Store).List(ctx, deadletter.Filter{EventIDs: []string{"ev-flag"}})
	if err != nil || len(letters) != 1 {
		t.Fatalf("list the letter: %d letters, %v", len(letters), err)
	}
	msg := letters[0].ErrorMessage
	if want := "outbox.topic_regex (--topic-regex / CDC_RELAY_TOPIC_REGEX)"; !strings.Contains(msg, want) || strings.Contains(msg, "(setting ") {
		t.Errorf("stored error %q: want the setting named as %q, not the library's field", msg, want)
	}
}
