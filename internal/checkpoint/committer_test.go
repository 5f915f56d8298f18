package checkpoint

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// failingSaver is a store whose writes fail while fail is set, then go to a
// real FileStore.
type failingSaver struct {
	*FileStore
	fail error
}

func (s *failingSaver) Save(ctx context.Context, c Checkpoint) error {
	if s.fail != nil {
		return s.fail
	}
	return s.FileStore.Save(ctx, c)
}

func newTestCommitter(t *testing.T, start pglogrepl.LSN) (*Committer, *failingSaver, *metrics.Metrics, *testenv.Buffer) {
	t.Helper()
	store := &failingSaver{FileStore: NewFileStore(filepath.Join(t.TempDir(), "ck.json"))}
	m := metrics.New(prometheus.NewRegistry())
	logs := &testenv.Buffer{}
	c := NewCommitter(CommitterConfig{
		Store: store, Start: start, Base: Checkpoint{Slot: "s", SystemID: "1", RelayName: "r"},
		Every: 10 * time.Millisecond, Idle: time.Hour, Logger: zerolog.New(logs), Metrics: m,
	})
	return c, store, m, logs
}

// TestCommitterConfirmsOnlyPersisted: Flushed moves only once Kafka
// acknowledged every event up to a position and the store holds it; a failed
// save leaves it where it was.
func TestCommitterConfirmsOnlyPersisted(t *testing.T) {
	ctx := context.Background()
	c, store, m, _ := newTestCommitter(t, 100)
	tr := c.Tracker()
	seq := tr.Begin()
	tr.Add(seq, 2)
	tr.Commit(seq, 200, time.Now())
	if lsn, err := c.Save(ctx); err != nil || lsn != 100 || c.Flushed() != 100 {
		t.Fatalf("Save with nothing acknowledged = %s, %v; Flushed %s; want 0/64 (the start)", lsn, err, c.Flushed())
	}
	tr.Ack(seq, 1)
	if lsn, _ := c.Save(ctx); lsn != 100 {
		t.Fatalf("Save with one of two events acknowledged = %s, want the start", lsn)
	}
	tr.Ack(seq, 1)
	store.fail = errors.New("disk full")
	if _, err := c.Save(ctx); err == nil || c.Flushed() != 100 {
		t.Fatalf("failed Save = %v, Flushed %s; want an error and the start", err, c.Flushed())
	}
	if v := testutil.ToFloat64(m.CheckpointErrors); v != 1 {
		t.Errorf("checkpoint_errors_total = %v, want 1", v)
	}
	store.fail = nil
	if lsn, err := c.Save(ctx); err != nil || lsn != 200 || c.Flushed() != 200 {
		t.Fatalf("Save = %s, %v; Flushed %s; want 0/C8", lsn, err, c.Flushed())
	}
	got, ok, err := store.Load(ctx, "s")
	if err != nil || !ok || got.LSN != 200 || got.RelayName != "r" {
		t.Fatalf("stored %+v, %v, %v; want LSN 0/C8 of relay r", got, ok, err)
	}
}

// TestCommitterReportsAnomalies: a misuse of the tracker shows in the metric
// and in one log line, however many follow.
func TestCommitterReportsAnomalies(t *testing.T) {
	c, _, m, logs := newTestCommitter(t, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	c.Tracker().Ack(999, 1) // never begun
	testenv.Eventually(t, 5*time.Second, func() error {
		if v := testutil.ToFloat64(m.TrackerAnomalies); v != 1 {
			return errors.New("tracker_anomalies_total not 1 yet")
		}
		return nil
	})
	c.Tracker().Ack(998, 1)
	c.Tracker().Ack(997, 1)
	testenv.Eventually(t, 5*time.Second, func() error {
		if v := testutil.ToFloat64(m.TrackerAnomalies); v != 3 {
			return errors.New("tracker_anomalies_total not 3 yet")
		}
		return nil
	})
	if n := strings.Count(logs.String(), "acknowledgement accounting saw a misuse"); n != 1 {
		t.Errorf("%d anomaly log lines, want 1:\n%s", n, logs.String())
	}
}

// TestCommitterFinish: the final save confirms the persisted position, and
// nothing is confirmed when the save fails.
func TestCommitterFinish(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, fail := range []bool{false, true} {
		c, store, _, _ := newTestCommitter(t, 100)
		tr := c.Tracker()
		seq := tr.Begin()
		tr.Add(seq, 1)
		tr.Commit(seq, 300, time.Now())
		tr.Ack(seq, 1)
		if fail {
			store.fail = errors.New("read-only")
		}
		var confirmed []pglogrepl.LSN
		lsn := c.Finish(ctx, true, func(_ context.Context, l pglogrepl.LSN) error {
			confirmed = append(confirmed, l)
			return nil
		})
		switch {
		case !fail && (lsn != 300 || len(confirmed) != 1 || confirmed[0] != 300):
			t.Errorf("Finish = %s, confirmed %v; want 0/12C once", lsn, confirmed)
		case fail && (lsn != 100 || len(confirmed) != 0):
			t.Errorf("Finish with a failing store = %s, confirmed %v; want the start, nothing confirmed", lsn, confirmed)
		}
	}
}
