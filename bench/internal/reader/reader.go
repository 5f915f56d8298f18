// Package reader is the benchmark's speed limit: a bare pgoutput reader that
// streams a logical replication slot, decodes every message with the relay's
// own decoder and counts outbox events, doing nothing else. Whatever the relay
// does on top (Kafka, checkpoints, backpressure) shows up as the gap between its
// rate and this one.
package reader

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
)

// Config configures a read.
type Config struct {
	URL         string // a normal connection URL; replication=database is added
	Slot        string // an existing pgoutput slot
	Publication string
	Count       int // stop after this many outbox events
	// StatusInterval is how often the read position is confirmed; default 1s.
	StatusInterval time.Duration
	// Latency, when set, keeps for every event the time from its commit to
	// its decoding, except for events committed within WarmUp of the first.
	Latency bool
	WarmUp  time.Duration
}

// Result is what a read saw.
type Result struct {
	Events       int
	Transactions int
	PayloadBytes int64
	// Confirmed is the last position confirmed to the slot: the end of the
	// last complete transaction read, never beyond.
	Confirmed pglogrepl.LSN
	// Latencies are commit → decoded times (Config.Latency only).
	Latencies []time.Duration
}

// Run streams cfg.Slot from its confirmed position until cfg.Count events were
// decoded, then calls reached (if not nil), reads the rest of the current
// transaction, confirms its end and disconnects. When ctx ends first it returns what
// it read so far with ctx's error.
func Run(ctx context.Context, cfg Config, reached func()) (Result, error) {
	var res Result
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = time.Second
	}
	dec, err := decoder.New(decoder.Config{Schema: "public", Table: "outbox_events", Columns: decoder.DefaultColumns()})
	if err != nil {
		return res, fmt.Errorf("build decoder: %w", err)
	}
	pcfg, err := pgconn.ParseConfig(cfg.URL)
	if err != nil {
		return res, fmt.Errorf("parse reader URL: %w", err)
	}
	pcfg.RuntimeParams["replication"] = "database"
	pcfg.RuntimeParams["application_name"] = "bench-reader"
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return res, fmt.Errorf("open replication connection: %w", err)
	}
	defer conn.Close(context.Background())
	err = pglogrepl.StartReplication(ctx, conn, cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", fmt.Sprintf("publication_names '%s'", cfg.Publication)},
	})
	if err != nil {
		return res, fmt.Errorf("start replication of slot %q: %w", cfg.Slot, err)
	}

	confirm := func() error {
		err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: res.Confirmed,
			WALFlushPosition: res.Confirmed,
			WALApplyPosition: res.Confirmed,
			ClientTime:       time.Now(),
		})
		if err != nil {
			return fmt.Errorf("confirm %s: %w", res.Confirmed, err)
		}
		return nil
	}
	var lastCommit pglogrepl.LSN
	var first time.Time // commit time of the first event
	// inTxn: a transaction is partly read; announced: reached was called.
	var inTxn, announced bool
	// handle processes one message.
	handle := func(msg pgproto3.BackendMessage) error {
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				return nil
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("parse keepalive: %w", err)
				}
				if ka.ReplyRequested {
					res.Confirmed = lastCommit
					return confirm()
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("parse XLogData: %w", err)
				}
				m, err := dec.Decode(xld.WALData)
				if err != nil {
					return fmt.Errorf("decode at %s: %w", xld.WALStart, err)
				}
				switch m.Kind {
				case decoder.KindBegin:
					inTxn = true
				case decoder.KindEvent:
					res.Events++
					res.PayloadBytes += int64(len(m.Event.Payload))
					if cfg.Latency {
						if first.IsZero() {
							first = m.CommitTime
						}
						if m.CommitTime.Sub(first) >= cfg.WarmUp {
							res.Latencies = append(res.Latencies, time.Since(m.CommitTime))
						}
					}
				case decoder.KindCommit:
					res.Transactions++
					lastCommit = m.EndLSN
					inTxn = false
				}
				if res.Events >= cfg.Count && !announced {
					announced = true
					if reached != nil {
						reached()
					}
				}
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %s (SQLSTATE %s)", msg.Message, msg.Code)
		case *pgproto3.CopyDone:
			return fmt.Errorf("replication stream ended by the server after %d events", res.Events)
		}
		return nil
	}
	// One deadline per status interval, not per message: like the relay's
	// stream, so neither pays for a timer per message. After the count, the
	// rest of the transaction is read too, so the confirmed position covers
	// every event counted and a later read of the slot starts after them.
	more := func() bool { return res.Events < cfg.Count || inTxn }
	for more() {
		res.Confirmed = lastCommit
		if err := confirm(); err != nil {
			return res, err
		}
		rctx, cancel := context.WithTimeout(ctx, cfg.StatusInterval)
		for more() {
			msg, err := conn.ReceiveMessage(rctx)
			if err != nil {
				cancel()
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
				if rctx.Err() != nil || pgconn.Timeout(err) {
					break
				}
				return res, fmt.Errorf("receive replication message: %w", err)
			}
			if err := handle(msg); err != nil {
				cancel()
				return res, err
			}
		}
		cancel()
	}
	res.Confirmed = lastCommit
	if err := confirm(); err != nil {
		return res, err
	}
	return res, nil
}
