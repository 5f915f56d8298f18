package runner

// Start-up reconciliation after a kill -9 in the middle of a fast drain.

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cdc-relay/cdc-relay/bench/internal/results"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// reconcileMessage matches the message of the log line the relay writes at
// every start with effectively-once delivery: "reconciled N partitions in X
// ms, K events already in Kafka" (not "reconciled a topic on its first
// replayed event").
var reconcileMessage = regexp.MustCompile(`^reconciled \d+ partitions in \d+ ms, \d+ events already in Kafka`)

// reconcileSlot is the slot of the kill -9 run into a topic of n partitions,
// created with the others before the backlog was committed.
func reconcileSlot(n int) string { return "relay_rec" + strconv.Itoa(n) }

// reconcileTopic is the topic of that run. The relay is given it as a fixed
// --topic: it reconciles a fixed topic before streaming and counts it in its
// start-up line, while topics of a template ("{aggregate_type}") are
// reconciled on their first replayed event, after that line.
func reconcileTopic(n int) string {
	return relayTopicPrefix + "rec" + strconv.Itoa(n) + "." + drainAggType
}

// reconcileRun is the start-up cell of n partitions, on the headline
// cell's backlog: the relay (effectively-once) drains it into a topic of n
// partitions, is killed with SIGKILL half-way and restarted at once; the
// cell records the time to the first acknowledged event of both starts and
// what the restart's reconciliation logged and took.
func (b *bench) reconcileRun(ctx context.Context, n int) (results.Reconcile, error) {
	events := b.cell.Events
	rec := results.Reconcile{TopicPartitions: n, Events: events}
	topic := reconcileTopic(n)
	if err := sandbox.CreateTopic(ctx, b.brokers, topic, n); err != nil {
		return rec, err
	}
	opts := relayOptions{slot: reconcileSlot(n), topic: topic, delivery: results.EffectivelyOnce, logLevel: "info"}
	if err := waitQuiet(ctx, b.relayURL); err != nil {
		return rec, err
	}
	if err := b.waitForQuietMachine(ctx); err != nil {
		return rec, err
	}
	killAt := max(1, events/2)
	b.say("%s: relay into %s (%d partitions): drain, kill -9 after %d events acknowledged, restart", startupCellName(n), topic, n, killAt)
	first, err := b.startRelay(opts)
	if err != nil {
		return rec, err
	}
	defer func() { _, _ = first.Kill() }() // a no-op once killed; cleanup on early return
	at, err := first.waitPublished(ctx, 1, b.drainTimeout())
	if err != nil {
		return rec, err
	}
	rec.FirstAckSeconds = at.Sub(first.Started()).Seconds()
	if _, err := first.waitPublished(ctx, killAt, b.drainTimeout()); err != nil {
		return rec, err
	}
	m, err := first.metrics(ctx)
	if err != nil {
		return rec, err
	}
	rec.KilledAfter = int(m.sum("cdc_relay_events_published_total"))
	if _, err := first.Kill(); err != nil {
		return rec, err
	}
	if rec.KilledAfter >= events {
		b.say("  note: the drain had finished before the kill (-events too small for the kill to land mid-drain)")
	}

	logs := newLogWatch(reconcileMessage)
	opts.stderr = logs
	again, err := b.startRelay(opts)
	if err != nil {
		return rec, err
	}
	defer func() { _, _ = again.Stop(stopGrace) }() // a no-op once stopped; cleanup on early return
	if err := again.waitReady(ctx, time.Minute); err != nil {
		return rec, err
	}
	rec.ReadySeconds = time.Since(again.Started()).Seconds()
	if rec.KilledAfter < events {
		at, err := again.waitPublished(ctx, 1, b.drainTimeout())
		if err != nil {
			return rec, err
		}
		rec.RestartFirstAckSeconds = at.Sub(again.Started()).Seconds()
	}
	line, err := logs.wait(ctx, 10*time.Second)
	if err != nil {
		return rec, err
	}
	var f struct {
		Partitions     *int   `json:"partitions"`
		DurationMs     *int64 `json:"duration_ms"`
		AlreadyInKafka *int   `json:"already_in_kafka"`
	}
	if err := json.Unmarshal([]byte(line), &f); err != nil || f.Partitions == nil || f.DurationMs == nil || f.AlreadyInKafka == nil {
		return rec, fmt.Errorf("parse the relay's reconciliation log line %q: fields partitions, duration_ms, already_in_kafka expected (%v)", line, err)
	}
	rec.Partitions, rec.DurationMs, rec.AlreadyInKafka = *f.Partitions, *f.DurationMs, *f.AlreadyInKafka
	b.say("  first event acknowledged %.2fs after the start; killed after %d acknowledged; restart: reconciled %d partitions in %d ms, %d events already in Kafka; ready after %.2fs, first new event acknowledged after %.2fs",
		rec.FirstAckSeconds, rec.KilledAfter, rec.Partitions, rec.DurationMs, rec.AlreadyInKafka, rec.ReadySeconds, rec.RestartFirstAckSeconds)

	// Let the restarted relay finish, then check nothing was lost or sent twice.
	wctx, cancel := context.WithTimeout(ctx, b.drainTimeout())
	_, err = sandbox.WaitForRecords(wctx, b.brokers, events, topic)
	cancel()
	if err != nil {
		return rec, fmt.Errorf("wait for the restarted relay to finish: %w", err)
	}
	if _, err := again.Stop(stopGrace); err != nil {
		return rec, fmt.Errorf("stop relay after the drain: %w", err)
	}
	if rec.Verify, err = verifyDrain(ctx, b.brokers, fmt.Sprintf("relay kill -9, %d partitions", n), []string{topic}, events); err != nil {
		return rec, err
	}
	return rec, nil
}

// logWatch is an io.Writer for a relay's stderr (JSON log lines) that keeps
// the first line whose message matches.
type logWatch struct {
	message *regexp.Regexp
	mu      sync.Mutex
	partial string
	found   chan string // receives that line once
	sent    bool
}

func newLogWatch(message *regexp.Regexp) *logWatch {
	return &logWatch{message: message, found: make(chan string, 1)}
}

// Write scans complete lines for the message.
func (w *logWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	lines := strings.Split(w.partial+string(p), "\n")
	w.partial = lines[len(lines)-1]
	for _, line := range lines[:len(lines)-1] {
		if w.sent || !strings.Contains(line, `"message"`) {
			continue
		}
		var msg struct {
			Message string `json:"message"`
		}
		if json.Unmarshal([]byte(line), &msg) == nil && w.message.MatchString(msg.Message) {
			w.found <- line
			w.sent = true
		}
	}
	return len(p), nil
}

// wait returns the line, or an error when it was not logged within timeout.
func (w *logWatch) wait(ctx context.Context, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case line := <-w.found:
		return line, nil
	case <-ctx.Done():
		return "", ctx.Err()
	case <-t.C:
		return "", fmt.Errorf("the relay logged no line matching %q within %s of being ready", w.message, timeout)
	}
}
