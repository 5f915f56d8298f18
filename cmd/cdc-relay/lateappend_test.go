package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/verify"
)

// TestKilledWithProduceInFlight: the relay is killed with a produce request
// in flight, and the broker gets to it only after the next run read the
// partitions back (chaos seed 60: a killed relay's last requests were
// appended after the restart had reconciled, and the restart sent their
// 1129 events again, 33 offsets after the first copies). The late request
// must be refused, so that every event is in Kafka once.
func TestKilledWithProduceInFlight(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newFixture(t, sharedPG, "killed_with_produce_in_flight", true)
	testenv.RequireLocalKafka(t, f.kafka)
	r := newRelay(t, f.relayArgs())
	r.Start()
	r.WaitReady(30 * time.Second)

	w := verify.NewWriter(f.url, "agg-", 8, 21)
	conn := f.connect(ctx, t)
	aggs := func(n int) []string {
		a := make([]string, n)
		for i := range a {
			a[i] = fmt.Sprintf("agg-%d", i%8)
		}
		return a
	}
	if err := w.CommitTxn(ctx, conn, aggs(16)); err != nil {
		t.Fatalf("commit: %v", err)
	}
	f.waitDelivered(ctx, t, w.Committed, 30*time.Second)

	// The broker holds the next produce request, unanswered, until the relay
	// was killed and its restart read the partitions back; then the test
	// hands that request to the broker again (its producer id and sequence
	// are what the broker goes by, not the connection), as a broker that
	// takes a killed client's last request off its connection late.
	var (
		mu      sync.Mutex
		late    *kmsg.ProduceRequest
		held    = make(chan struct{})
		release = make(chan struct{})
	)
	c := f.kafka.Cluster()
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		first := late == nil
		if first {
			late = req.(*kmsg.ProduceRequest)
		}
		mu.Unlock()
		if !first {
			return nil, nil, false
		}
		close(held)
		c.SleepControl(func() { <-release })
		return nil, errors.New("test: the killed run's request, handed to the broker again by the test"), true
	})
	var releaseOnce sync.Once
	releaseHeld := func() { releaseOnce.Do(func() { close(release) }) }
	defer releaseHeld()
	if err := w.CommitTxn(ctx, conn, aggs(24)); err != nil {
		t.Fatalf("commit: %v", err)
	}
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("no produce request reached the broker")
	}
	r.Kill()
	releaseHeld()
	r.Start()
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := strings.Count(r.Logs(), `"message":"reconciled `); n < 2 {
			return fmt.Errorf("%d reconciliations logged, want the restart's too", n)
		}
		return nil
	})
	cl, err := kgo.NewClient(append(f.kafka.ClientOpts(), kgo.SeedBrokers(f.brokers...), kgo.MaxVersions(kversion.V3_0_0()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	resp, err := cl.Broker(0).Request(ctx, late)
	if err != nil {
		t.Fatalf("hand the killed run's request to the broker again: %v", err)
	}
	var answers []string
	for _, rt := range resp.(*kmsg.ProduceResponse).Topics {
		for _, rp := range rt.Partitions {
			answers = append(answers, fmt.Sprintf("%d:%v", rp.Partition, kerr.ErrorForCode(rp.ErrorCode)))
		}
	}
	t.Logf("the killed run's request of %d records, handed to the broker after the restart read the partitions: %s", records(late), strings.Join(answers, " "))
	if err := w.CommitTxn(ctx, conn, aggs(16)); err != nil {
		t.Fatalf("commit: %v", err)
	}
	res, _ := f.waitDelivered(ctx, t, w.Committed, 30*time.Second)
	t.Logf("%s; %s", res, reconciledLine(r.Logs()))
	requireComplete(t, res)
	if res.Duplicates != 0 {
		t.Errorf("%d duplicates after a kill with a produce request in flight, want 0; log tail:\n%s",
			res.Duplicates, relayproc.Tail(r.Logs(), 30))
	}
	r.Stop(10 * time.Second)
}

// records counts the records of a produce request.
func records(req *kmsg.ProduceRequest) int {
	n := 0
	for _, tp := range req.Topics {
		for _, p := range tp.Partitions {
			var b kmsg.RecordBatch
			if err := b.ReadFrom(p.Records); err == nil {
				n += int(b.NumRecords)
			}
		}
	}
	return n
}
