package replication_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// pausingHandler counts the transactions it receives and holds the stream
// (Backpressure) after the first row until resume is closed, with stop
// closed meanwhile: a relay told to stop while Kafka holds it mid-transaction.
type pausingHandler struct {
	stop, resume  chan struct{}
	open          bool // a transaction is partly received
	rows, commits int
}

func (h *pausingHandler) HandleData(_ context.Context, _ pglogrepl.LSN, data []byte) error {
	switch data[0] {
	case 'B':
		h.open = true
	case 'I':
		h.rows++
		if h.rows == 1 {
			close(h.stop)
		}
	case 'C':
		h.open = false
		h.commits++
	}
	return nil
}

func (h *pausingHandler) Keepalive(pglogrepl.LSN, time.Time) {}
func (h *pausingHandler) Flushed() pglogrepl.LSN             { return 0 }
func (h *pausingHandler) AtBoundary() bool                   { return !h.open }
func (h *pausingHandler) Backpressure() <-chan struct{} {
	select {
	case <-h.resume:
		return nil
	default:
	}
	if h.rows > 0 {
		return h.resume
	}
	return nil
}

// TestStopEndsAtTheTransactionBoundary: stopped while the handler holds the
// stream in the middle of a transaction, Run reads on only to the end of
// that transaction once the handler takes data again, and returns
// ErrStopped. It used to read on until its status deadline (a whole status
// interval of backlog), which a stream handing over to the catch-up read
// past, and a clean stop with it.
func TestStopEndsAtTheTransactionBoundary(t *testing.T) {
	p := testenv.NewPostgres(t, sandbox.PGOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox_events (id int PRIMARY KEY, payload text);
		CREATE PUBLICATION stop_pub FOR TABLE outbox_events`); err != nil {
		t.Fatal(err)
	}
	var start string
	if err := conn.QueryRow(ctx, "SELECT lsn::text FROM pg_create_logical_replication_slot('stop_slot', 'pgoutput')").Scan(&start); err != nil {
		t.Fatal(err)
	}
	const txns = 2000
	for i := range txns {
		if _, err := conn.Exec(ctx, "INSERT INTO outbox_events VALUES ($1, repeat('x', 200))", i); err != nil {
			t.Fatal(err)
		}
	}
	from, err := pglogrepl.ParseLSN(start)
	if err != nil {
		t.Fatal(err)
	}
	s, err := replication.Open(ctx, replication.StreamConfig{
		URL: p.URL("postgres"), Slot: "stop_slot", Publication: "stop_pub",
		StatusInterval: time.Minute, Logger: zerolog.Nop(), Metrics: metrics.Discard(),
	}, from)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	h := &pausingHandler{stop: make(chan struct{}), resume: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, h.stop, h) }()
	<-h.stop
	time.AfterFunc(200*time.Millisecond, func() { close(h.resume) }) // the walsender sends meanwhile
	select {
	case err := <-done:
		if !errors.Is(err, replication.ErrStopped) {
			t.Fatalf("Run returned %v, want ErrStopped", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of the stop")
	}
	if h.commits != 1 || h.rows != 1 {
		t.Errorf("Run read %d transactions (%d rows) after it was stopped in the first, want that one alone", h.commits, h.rows)
	}
}
