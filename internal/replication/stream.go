// Package replication owns the Postgres side of the relay: start-up checks of the
// server, the publication and the slot, and the logical replication stream
// (pgoutput, proto_version 1) with its standby status updates.
//
// The stream reports exactly the position its Handler says is flushed — never the
// position it received — so the slot only moves past events the sink has delivered.
package replication

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// ErrSlotBusy means another process is streaming the slot (SQLSTATE 55006). The
// caller waits and retries: the other relay may be dying, or this one is a standby.
var ErrSlotBusy = errors.New("replication slot is in use by another process")

// ErrStopped is returned by Run when it stopped because stop was closed.
var ErrStopped = errors.New("replication stopped")

var namePattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidName checks a slot or publication name: lowercase letters, digits and
// underscores, at most 63 characters (what Postgres accepts for slots, and
// unquoted identifiers for publications).
func ValidName(name string) bool { return namePattern.MatchString(name) }

// Handler consumes the stream. All methods are called from Run's goroutine.
type Handler interface {
	// HandleData processes one pgoutput message.
	HandleData(ctx context.Context, walStart pglogrepl.LSN, data []byte) error
	// Keepalive reports the server's WAL end and clock from a keepalive message.
	Keepalive(serverWALEnd pglogrepl.LSN, serverTime time.Time)
	// Flushed is the position to report as flushed: everything before it has
	// been delivered and checkpointed.
	Flushed() pglogrepl.LSN
	// Backpressure returns nil when the handler takes more data now, or a channel
	// that becomes readable when it may again.
	Backpressure() <-chan struct{}
	// AtBoundary reports whether no transaction is partly received, so stopping
	// now redelivers nothing.
	AtBoundary() bool
}

// StreamConfig configures a replication stream.
type StreamConfig struct {
	URL            string // the user's normal connection URL; replication=database is added
	Slot           string
	Publication    string
	StatusInterval time.Duration // standby status update period; must be positive
	// ReadCoalesce is how long a read of a TCP stream may wait for more bytes
	// before waking the reader (SO_RCVLOWAT sized from the byte rate; see
	// coalesce.go); 0 wakes it for every message.
	ReadCoalesce time.Duration
	// ReadBuffer, when positive, is the TCP socket's receive buffer
	// (SO_RCVBUF) in bytes: a small one lets the walsender's sends fill the
	// window, so it sends in larger pieces (see readBufferDialer).
	ReadBuffer int
	// Messages asks pgoutput for logical decoding messages too (the message
	// outbox; PostgreSQL 14+).
	Messages bool
	Logger   zerolog.Logger // should carry the slot name
	Metrics  *metrics.Metrics
	// Names names the caller's settings (its PGURL) in errors.
	Names setting.Namer
}

// Stream is one replication connection streaming a slot.
type Stream struct {
	cfg        StreamConfig
	conn       *pgconn.PgConn
	log        zerolog.Logger
	received   atomic.Uint64 // a pglogrepl.LSN; read by Received from other goroutines
	serverEnd  pglogrepl.LSN
	lastStatus pglogrepl.LSN
	// standbyWait is the last warning of the walsender that it waits for
	// a standby of synchronized_standby_slots (logged when it changes).
	standbyWait string
}

// ConnectReplication opens a replication=database connection with url. A
// canceled context interrupts reads through a deadline, so the connection stays
// usable (pgx's default would send a cancel request to the walsender).
func ConnectReplication(ctx context.Context, url string, names setting.Namer) (*pgconn.PgConn, error) {
	return connectReplication(ctx, url, 0, 0, names)
}

// connectReplication is ConnectReplication with reads coalesced over
// coalesce (0: not).
func connectReplication(ctx context.Context, url string, coalesce time.Duration, readBuffer int, names setting.Namer) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse Postgres URL %s: %w", names.Name("PGURL"), redactErr(err))
	}
	cfg.RuntimeParams["replication"] = "database"
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "cdc-relay"
	}
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	if readBuffer > 0 {
		cfg.DialFunc = readBufferDialer(cfg.DialFunc, readBuffer)
	}
	if coalesce > 0 {
		cfg.DialFunc = coalescingDialer(cfg.DialFunc, coalesce)
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open replication connection: %w", ConnectError(url, err, names))
	}
	return conn, nil
}

// Open connects, identifies the system and starts streaming cfg.Slot from start
// (0 lets the server use the slot's confirmed position).
func Open(ctx context.Context, cfg StreamConfig, start pglogrepl.LSN) (*Stream, error) {
	if cfg.StatusInterval <= 0 {
		return nil, fmt.Errorf("open replication stream: status interval %v must be positive", cfg.StatusInterval)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.Discard()
	}
	conn, err := connectReplication(ctx, cfg.URL, cfg.ReadCoalesce, cfg.ReadBuffer, cfg.Names)
	if err != nil {
		return nil, err
	}
	s := &Stream{cfg: cfg, conn: conn, log: cfg.Logger.With().Str("component", "replication").Logger()}
	args := []string{
		"proto_version '1'",
		fmt.Sprintf("publication_names '%s'", cfg.Publication),
	}
	if cfg.Messages {
		args = append(args, "messages 'true'")
	}
	err = pglogrepl.StartReplication(ctx, conn, cfg.Slot, start, pglogrepl.StartReplicationOptions{PluginArgs: args})
	if err != nil {
		conn.Close(context.Background())
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" {
			return nil, fmt.Errorf("start replication of slot %q: %w: %s", cfg.Slot, ErrSlotBusy, pgErr.Message)
		}
		return nil, fmt.Errorf("start replication of slot %q from %s: %w", cfg.Slot, start, err)
	}
	s.received.Store(uint64(start))
	s.log.Info().Str("lsn", start.String()).Msg("streaming started")
	return s, nil
}

// Run reads the stream into h until ctx is done, stop is closed (then it goes on
// reading until h.AtBoundary and returns ErrStopped), or the connection fails.
// It sends a standby status update every StatusInterval and whenever the server
// asks, and stops reading — while still sending status updates, so the server
// does not time the connection out — while h applies backpressure.
func (s *Stream) Run(ctx context.Context, stop <-chan struct{}, h Handler) error {
	m := s.cfg.Metrics
	nextStatus := time.Now()
	stopping := false
	for {
		if !stopping {
			select {
			case <-stop:
				stopping = true
			default:
			}
		}
		if stopping && h.AtBoundary() {
			return ErrStopped
		}
		if !time.Now().Before(nextStatus) {
			if err := s.SendStatus(ctx, h.Flushed()); err != nil {
				return err
			}
			nextStatus = time.Now().Add(s.cfg.StatusInterval)
		}
		if wait := h.Backpressure(); wait != nil {
			m.SetState(metrics.StateBackpressured)
			t := time.NewTimer(time.Until(nextStatus))
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-stopIf(!stopping, stop):
			case <-wait:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		m.SetState(metrics.StateStreaming)
		if err := s.receive(ctx, stopIf(!stopping, stop), stop, nextStatus, h); err != nil {
			return err
		}
	}
}

// stopIf returns stop when cond holds, else nil (a channel that never fires).
func stopIf(cond bool, stop <-chan struct{}) <-chan struct{} {
	if cond {
		return stop
	}
	return nil
}

// receive reads messages until the deadline, until h needs a break, until
// wake is closed, or until stop is closed and a message leaves h at a
// transaction boundary; any of them returns nil with the connection still
// usable. wake interrupts a read that waits (Run passes nil once it is
// stopping: a read must then go on until the transaction is complete),
// stop is checked after each message (always: once stopping, the read
// returns at the first boundary, not at the deadline).
//
// The deadline is set on the socket once per call and ReceiveMessage gets a
// context that is never done: with a cancelable context pgconn would arm a
// watcher goroutine for every message, which costs more than decoding it.
func (s *Stream) receive(ctx context.Context, wake, stop <-chan struct{}, deadline time.Time, h Handler) error {
	nc := s.conn.Conn()
	if err := nc.SetReadDeadline(deadline); err != nil {
		return fmt.Errorf("set read deadline: %w", err)
	}
	defer nc.SetReadDeadline(time.Time{})
	done := make(chan struct{})
	defer close(done)
	go func() {
		// Wake the read when the relay stops or its context ends.
		select {
		case <-ctx.Done():
		case <-wake:
		case <-done:
			return
		}
		nc.SetReadDeadline(time.Now())
	}()
	for {
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				return nil
			}
			return fmt.Errorf("receive replication message: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("parse keepalive: %w", err)
				}
				s.serverEnd = ka.ServerWALEnd
				s.cfg.Metrics.ServerWALEnd.Set(float64(ka.ServerWALEnd))
				h.Keepalive(ka.ServerWALEnd, ka.ServerTime)
				if ka.ReplyRequested {
					if err := s.SendStatus(ctx, h.Flushed()); err != nil {
						return err
					}
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("parse XLogData: %w", err)
				}
				if err := h.HandleData(ctx, xld.WALStart, xld.WALData); err != nil {
					return err
				}
				if uint64(xld.WALStart) > s.received.Load() {
					s.received.Store(uint64(xld.WALStart))
				}
				if xld.ServerWALEnd > s.serverEnd {
					s.serverEnd = xld.ServerWALEnd
				}
				if h.Backpressure() != nil {
					return nil
				}
			default:
				return fmt.Errorf("unexpected replication message type %q", msg.Data[0])
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return errors.New("replication stream: server ended the stream (CopyDone)")
		case *pgproto3.NoticeResponse:
			// A walsender's WARNING says decoding is not what the relay asked
			// for: PostgreSQL 18 warns "skipped loading publication" and
			// decodes on without it, where 17 and older fail with an error.
			// The stream ends with it and the caller decides (gaps.StreamError);
			// lesser notices are only logged.
			notice := pgconn.ErrorResponseToPgError((*pgproto3.ErrorResponse)(msg))
			if severity := cmp.Or(notice.SeverityUnlocalized, notice.Severity); severity != "WARNING" {
				s.log.Info().Str("severity", severity).Str("notice", notice.Message).Msg("server notice on the replication stream")
				break
			}
			if standbyWait(notice) {
				s.logStandbyWait(notice)
				break
			}
			return fmt.Errorf("replication stream: server warning: %w", notice)
		default:
			return fmt.Errorf("replication stream: unexpected message %T", msg)
		}
		select {
		case <-stop:
			if h.AtBoundary() {
				return nil
			}
		default:
		}
	}
}

// standbyWait reports whether a walsender's warning says it waits for a
// standby of synchronized_standby_slots (17+: one that is not connected,
// missing, invalidated or not physical) before it sends the failover slot's
// WAL. Decoding is then what the relay asked for, only held back: the stream
// goes on, and reconnecting would change nothing. The setting's name is
// never translated, the message around it may be.
func standbyWait(notice *pgconn.PgError) bool {
	return strings.Contains(notice.Message, "synchronized_standby_slots")
}

// logStandbyWait logs a warning of standbyWait when it differs from the
// last one: the walsender repeats it each time it waits.
func (s *Stream) logStandbyWait(notice *pgconn.PgError) {
	if notice.Message == s.standbyWait {
		return
	}
	s.standbyWait = notice.Message
	s.log.Warn().Str("notice", notice.Message).Str("detail", notice.Detail).Str("hint", notice.Hint).
		Msg("the walsender waits for a standby of synchronized_standby_slots before it sends the relay more WAL: nothing new is published until that standby streams again")
}

// Received is the WAL position of the last change the stream received.
// Safe for concurrent use.
func (s *Stream) Received() pglogrepl.LSN { return pglogrepl.LSN(s.received.Load()) }

// SendStatus reports flushed as the write, flush and apply position. Postgres
// moves the slot's confirmed_flush_lsn to it (never backwards).
func (s *Stream) SendStatus(ctx context.Context, flushed pglogrepl.LSN) error {
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: flushed,
		WALFlushPosition: flushed,
		WALApplyPosition: flushed,
		ClientTime:       time.Now(),
	})
	if err != nil {
		return fmt.Errorf("confirm lsn %s: %w", flushed, err)
	}
	if flushed != s.lastStatus {
		s.lastStatus = flushed
		s.log.Debug().Str("lsn", flushed.String()).Msg("confirmed")
	}
	m := s.cfg.Metrics
	m.ConfirmedLSN.Set(float64(flushed))
	m.ReceivedLSN.Set(float64(s.received.Load()))
	if s.serverEnd >= flushed {
		m.LagBytes.Set(float64(s.serverEnd - flushed))
	}
	return nil
}

// Close ends the connection.
func (s *Stream) Close(ctx context.Context) error {
	return s.conn.Close(ctx)
}
