package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/verify"
)

// TestEffectivelyOnceReplayFromOlderCheckpoint makes the relay replay a
// stretch it already delivered — the checkpoint file is put back to an older
// copy after a kill -9 and the slot was never confirmed past it (a long
// --status-interval): the slot behind the stored checkpoint, as after a crash
// right before a save — and, while it is down, changes what the topic holds
// the ways docs/guarantee.md names. Nothing may be lost; duplicates only
// where the guarantee says so.
func TestEffectivelyOnceReplayFromOlderCheckpoint(t *testing.T) {
	tests := []struct {
		name string
		// firstArgs are extra flags of the run before the kill.
		firstArgs []string
		// whileDown changes Kafka while the relay is down; replayed is how
		// many events it republished on purpose (cdc-relay replay).
		whileDown func(ctx context.Context, t *testing.T, f *fixture, w *verify.Writer) (replayed int)
		// fallback is the reason the relay must log and count; "" none.
		fallback string
		// dupsAllowed: duplicates of the replayed stretch are allowed.
		dupsAllowed bool
		// lostBefore: events before the older checkpoint are gone with the topic.
		lostBefore bool
		// foreign records of another producer in the topic; rekeyed: keys
		// moved to other partitions (their order across the move is Kafka's).
		foreign int
		rekeyed bool
	}{
		{name: "replayed stretch already in Kafka"},
		{
			name: "another producer wrote to the topic meanwhile", foreign: 50,
			whileDown: func(ctx context.Context, t *testing.T, f *fixture, _ *verify.Writer) int {
				produceForeign(ctx, t, f, 50)
				return 0
			},
		},
		{
			name: "an operator replayed some of the events meanwhile",
			whileDown: func(ctx context.Context, t *testing.T, f *fixture, w *verify.Writer) int {
				evs := w.Committed()[700:705] // in the stretch the relay replays
				var ids []string
				for _, ev := range evs {
					ids = append(ids, ev.ID)
				}
				out, err := exec.CommandContext(ctx, relayBin, "replay", "--pg-url", f.url, "--kafka-brokers", strings.Join(f.brokers, ","),
					"--topic", f.topic, "--since", "1h", "--id", strings.Join(ids, ",")).CombinedOutput()
				if err != nil {
					t.Fatalf("cdc-relay replay: %v\n%s", err, out)
				}
				return len(ids)
			},
		},
		{
			name: "the run before used --delivery at-least-once", firstArgs: []string{"--delivery", "at-least-once"},
			fallback: "no_stored_offsets", dupsAllowed: true,
		},
		{
			name: "partitions added while down", fallback: "partitions_changed", dupsAllowed: true, rekeyed: true,
			whileDown: func(ctx context.Context, t *testing.T, f *fixture, _ *verify.Writer) int {
				if err := f.kafka.AddPartitions(ctx, f.topic, 2); err != nil {
					t.Fatal(err)
				}
				return 0
			},
		},
		{
			name: "topic deleted and re-created while down", fallback: "partition_reset", lostBefore: true,
			whileDown: func(ctx context.Context, t *testing.T, f *fixture, _ *verify.Writer) int {
				if err := f.kafka.RecreateTopic(ctx, f.topic, 4); err != nil {
					t.Fatal(err)
				}
				return 0
			},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			f := newFixture(t, sharedPG, fmt.Sprintf("replay_older_%d", i), true)
			file := filepath.Join(t.TempDir(), "checkpoint.json")
			args := f.relayArgs("--checkpoint-store", "file", "--checkpoint-file", file, "--status-interval", "1h")
			r := newRelay(t, append(slices.Clone(args), tc.firstArgs...))
			r.Start()
			r.WaitReady(30 * time.Second)
			store := checkpoint.NewFileStore(file)

			w := verify.NewWriter(f.url, "agg-", 50, uint64(i+1))
			if err := <-w.GoRun(ctx, nil, 600, 3000); err != nil {
				t.Fatal(err)
			}
			f.waitDelivered(ctx, t, w.Committed, 30*time.Second)
			older := waitCheckpointCovers(t, store, f.slot, tc.firstArgs == nil, int64(w.Count()))
			if err := <-w.GoRun(ctx, nil, 600, 3000); err != nil {
				t.Fatal(err)
			}
			res, _ := f.waitDelivered(ctx, t, w.Committed, 30*time.Second)
			requireComplete(t, res)
			firstHalf := w.Count() - 600
			r.Kill()
			if err := store.Save(ctx, older); err != nil { // back to before the second 600
				t.Fatal(err)
			}
			replayed := 0
			if tc.whileDown != nil {
				replayed = tc.whileDown(ctx, t, f, w)
			}
			r.P.SetArgs(args)
			r.Start()
			r.WaitReady(30 * time.Second)
			if err := <-w.GoRun(ctx, nil, 200, 3000); err != nil {
				t.Fatal(err)
			}
			committed := w.Committed
			if tc.lostBefore {
				committed = func() []verify.Event { return w.Committed()[firstHalf:] }
			}
			res, _ = f.waitDelivered(ctx, t, committed, 30*time.Second)
			logs := r.Logs()
			t.Logf("%s: %s; %s", tc.name, res, reconciledLine(logs))
			switch {
			case len(res.Missing) > 0 || len(res.Mismatches) > 0:
				t.Fatalf("events lost or changed: %s", res)
			case res.Unknown != tc.foreign:
				t.Fatalf("%d records of unknown ids, want the %d of the other producer", res.Unknown, tc.foreign)
			case len(res.OrderViolations) > 0 && !tc.rekeyed:
				t.Fatalf("per-key order broken: %s", res)
			}
			if !tc.dupsAllowed && res.Duplicates != replayed {
				t.Fatalf("%d duplicates, want the %d an operator replayed; log tail:\n%s", res.Duplicates, replayed, relayproc.Tail(logs, 30))
			}
			if tc.fallback == "" && !strings.Contains(reconciledLine(logs), "already_in_kafka\":6") &&
				!strings.Contains(reconciledLine(logs), "already_in_kafka\":5") {
				t.Errorf("the restart found too few of the 600 replayed events in Kafka: %s", reconciledLine(logs))
			}
			if tc.fallback != "" && !strings.Contains(logs, `"reason":"`+tc.fallback+`"`) {
				t.Errorf("no %s fallback logged; log tail:\n%s", tc.fallback, relayproc.Tail(logs, 30))
			}
			r.Stop(10 * time.Second)
		})
	}
}

// waitCheckpointCovers waits until the stored checkpoint covers the records
// the relay wrote to its (fresh) topics, and returns it. With Kafka offsets
// (withOffsets) that is exact: they add up to records. Without, it waits
// until the checkpoint has not moved for a second, ten of the committer's
// save intervals. Settling for "it stopped moving" with offsets once let a
// busy machine hand back a checkpoint 139 events short.
func waitCheckpointCovers(t *testing.T, store *checkpoint.FileStore, slot string, withOffsets bool, records int64) checkpoint.Checkpoint {
	t.Helper()
	var last checkpoint.Checkpoint
	var since time.Time
	testenv.Eventually(t, 30*time.Second, func() error {
		cp, ok, err := store.Load(context.Background(), slot)
		if err != nil || !ok {
			return fmt.Errorf("load checkpoint: %v (found %v)", err, ok)
		}
		if withOffsets {
			if cp.Offsets == nil {
				return fmt.Errorf("checkpoint at %s has no Kafka offsets", cp.LSN)
			}
			var n int64
			for _, topic := range cp.Offsets {
				for _, next := range topic.Next {
					n += next
				}
			}
			if n != records {
				return fmt.Errorf("checkpoint at %s covers %d of %d records", cp.LSN, n, records)
			}
			last = cp
			return nil
		}
		if cp.Offsets != nil || cp.LSN != last.LSN || since.IsZero() {
			last, since = cp, time.Now()
			return fmt.Errorf("checkpoint still moving (%s)", cp.LSN)
		}
		if d := time.Since(since); d < time.Second {
			return fmt.Errorf("checkpoint at %s for %v", cp.LSN, d)
		}
		return nil
	})
	return last
}

// reconciledLine returns the last start-up reconciliation log line.
func reconciledLine(logs string) string {
	line := ""
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "events already in Kafka") {
			line = l
		}
	}
	return line
}

// produceForeign writes n records of another producer (ids unknown to the
// relay, no source position) to f's topic.
func produceForeign(ctx context.Context, t *testing.T, f *fixture, n int) {
	t.Helper()
	cl, err := kgo.NewClient(append(f.kafka.ClientOpts(), kgo.SeedBrokers(f.brokers...))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := 0; i < n; i++ {
		rec := &kgo.Record{Topic: f.topic, Key: []byte(fmt.Sprintf("foreign-%d", i)), Value: []byte("{}"),
			Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(fmt.Sprintf("foreign-%d", i))}}}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}
