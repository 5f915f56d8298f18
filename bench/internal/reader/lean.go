package reader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// RunLean is the second limit reader (issue 30): the leanest reader written
// on pglogrepl alone, as a user would write one to see what Postgres can
// stream. One replication connection; START_REPLICATION with pgoutput proto
// 1 and the relay's publication; ReceiveMessage in a loop; every XLogData
// parsed with pglogrepl.Parse; a standby status every second (and when the
// server asks), confirming the end of the last transaction read; inserts
// counted and dropped. It uses cfg.Relay's PGURL, Slot and Publication only,
// and stops as Run does.
func RunLean(ctx context.Context, cfg Config, reached func()) (Result, error) {
	rc := cfg.Relay
	pcfg, err := pgconn.ParseConfig(rc.PGURL)
	if err != nil {
		return Result{}, fmt.Errorf("lean reader: parse URL: %w", err)
	}
	pcfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return Result{}, fmt.Errorf("lean reader: connect: %w", err)
	}
	defer conn.Close(context.Background())
	var res Result
	var flushed pglogrepl.LSN
	err = pglogrepl.StartReplication(ctx, conn, rc.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + rc.Publication + "'"},
	})
	if err != nil {
		return res, fmt.Errorf("lean reader: start replication: %w", err)
	}
	status := func() error {
		return pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: flushed, WALFlushPosition: flushed, WALApplyPosition: flushed})
	}
	next := time.Now().Add(time.Second)
	counting := true
	for {
		if time.Now().After(next) {
			if err := status(); err != nil {
				return res, fmt.Errorf("lean reader: send status: %w", err)
			}
			next = time.Now().Add(time.Second)
		}
		rctx, cancel := context.WithDeadline(ctx, next)
		msg, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				continue
			}
			if ctx.Err() != nil && res.Events >= cfg.Count {
				res.Confirmed = flushed
				return res, nil // stopped after the count (Hold), a clean end
			}
			return res, fmt.Errorf("lean reader: receive: %w", err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok {
			if e, isErr := msg.(*pgproto3.ErrorResponse); isErr {
				return res, fmt.Errorf("lean reader: server: %s", e.Message)
			}
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				return res, fmt.Errorf("lean reader: keepalive: %w", err)
			}
			if k.ReplyRequested {
				next = time.Time{}
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				return res, fmt.Errorf("lean reader: xlogdata: %w", err)
			}
			m, err := pglogrepl.Parse(x.WALData)
			if err != nil {
				return res, fmt.Errorf("lean reader: parse at %s: %w", x.WALStart, err)
			}
			switch m := m.(type) {
			case *pglogrepl.InsertMessage:
				res.Events++
				res.Bytes += int64(len(x.WALData))
			case *pglogrepl.CommitMessage:
				res.Transactions++
				flushed = m.TransactionEndLSN
				if counting && res.Events >= cfg.Count {
					counting = false
					res.Confirmed = flushed
					if reached != nil {
						reached()
					}
					if err := status(); err != nil {
						return res, fmt.Errorf("lean reader: send status: %w", err)
					}
					if !cfg.Hold {
						return res, nil
					}
				}
			}
		default:
			return res, errors.New("lean reader: unexpected CopyData message")
		}
	}
}
