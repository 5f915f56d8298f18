package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// StatusCmd is "cdc-relay status": the relay's state read from the database
// itself, so it works while the relay is down, and usable as a probe.
type StatusCmd struct {
	PGFlags `embed:""`

	CheckpointTable string `default:"public.cdc_relay_checkpoints" help:"Checkpoint table."`
	DLQTable        string `name:"dlq-table" default:"public.cdc_relay_dead_letters" help:"Dead-letter table."`
	MaxLagBytes     int64  `default:"1073741824" help:"Exit 2 when the slot's lag (server WAL end - confirmed) exceeds this many bytes (0 disables)."`
	JSON            bool   `name:"json" help:"Print JSON."`
}

// Status is what status reports.
type Status struct {
	Slot             string            `json:"slot"`
	SlotExists       bool              `json:"slot_exists"`
	Active           bool              `json:"active"`
	ActivePID        int               `json:"active_pid,omitempty"`
	WALStatus        string            `json:"wal_status,omitempty"`
	ServerWALEnd     string            `json:"server_wal_end"`
	ConfirmedLSN     string            `json:"confirmed_lsn,omitempty"`
	LagBytes         int64             `json:"lag_bytes"`
	RetainedWALBytes int64             `json:"retained_wal_bytes"`
	Checkpoint       *StatusCheckpoint `json:"checkpoint,omitempty"`
	DeadLetters      *StatusDLQ        `json:"dead_letters,omitempty"`
	Problems         []string          `json:"problems,omitempty"`
}

// StatusCheckpoint is the stored checkpoint.
type StatusCheckpoint struct {
	LSN        string    `json:"lsn"`
	UpdatedAt  time.Time `json:"updated_at"`
	AgeSeconds float64   `json:"age_seconds"`
	RelayName  string    `json:"relay_name,omitempty"`
}

// StatusDLQ counts dead letters.
type StatusDLQ struct {
	Pending int64            `json:"pending"`
	ByCode  map[string]int64 `json:"by_code,omitempty"`
}

// Exit codes of status.
const (
	statusOK      = 0
	statusProblem = 2
)

// Validate checks the Postgres flags (reading --pg-url-file).
func (c *StatusCmd) Validate() error { return requirePG(&c.PGFlags) }

func (c *StatusCmd) run(ctx context.Context, env Env) error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, c.PGURL)
	if err != nil {
		return fmt.Errorf("connect to Postgres %s (check --pg-url / CDC_RELAY_PG_URL): %w", replication.Redact(c.PGURL), err)
	}
	defer conn.Close(context.Background())
	st, err := c.collect(ctx, conn)
	if err != nil {
		return err
	}
	if c.JSON {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(st); err != nil {
			return fmt.Errorf("write status: %w", err)
		}
	} else {
		printStatus(env.Stdout, st)
	}
	if len(st.Problems) > 0 {
		return &ExitError{Code: statusProblem, Err: fmt.Errorf("%s", strings.Join(st.Problems, "; "))}
	}
	return nil
}

func (c *StatusCmd) collect(ctx context.Context, conn *pgx.Conn) (Status, error) {
	st := Status{Slot: c.Slot}
	var end string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
		return st, fmt.Errorf("read WAL position: %w", err)
	}
	st.ServerWALEnd = end
	var active *bool
	var pid *int32
	var walStatus, confirmed *string
	var lag, retained *int64
	err := conn.QueryRow(ctx, `SELECT active, active_pid, wal_status, confirmed_flush_lsn::text,
			(pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, (pg_current_wal_lsn() - restart_lsn)::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, c.Slot).Scan(&active, &pid, &walStatus, &confirmed, &lag, &retained)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		st.Problems = append(st.Problems, fmt.Sprintf("replication slot %q does not exist", c.Slot))
	case err != nil:
		return st, fmt.Errorf("read replication slot %q: %w", c.Slot, err)
	default:
		st.SlotExists = true
		if active != nil {
			st.Active = *active
		}
		if pid != nil {
			st.ActivePID = int(*pid)
		}
		if walStatus != nil {
			st.WALStatus = *walStatus
		}
		if confirmed != nil {
			st.ConfirmedLSN = *confirmed
		}
		if lag != nil {
			st.LagBytes = *lag
		}
		if retained != nil {
			st.RetainedWALBytes = *retained
		}
		if st.WALStatus == "lost" {
			st.Problems = append(st.Problems, fmt.Sprintf("replication slot %q is lost (wal_status = lost): WAL it needed was removed", c.Slot))
		}
		if c.MaxLagBytes > 0 && st.LagBytes > c.MaxLagBytes {
			st.Problems = append(st.Problems, fmt.Sprintf("slot lag %d bytes exceeds --max-lag-bytes %d", st.LagBytes, c.MaxLagBytes))
		}
	}
	// The stored checkpoint, when the table exists.
	var cp checkpoint.Checkpoint
	var lsn string
	q := fmt.Sprintf("SELECT lsn::text, updated_at, relay_name FROM %s WHERE slot_name = $1", quoteTable(c.CheckpointTable))
	if err := conn.QueryRow(ctx, q, c.Slot).Scan(&lsn, &cp.UpdatedAt, &cp.RelayName); err == nil {
		st.Checkpoint = &StatusCheckpoint{LSN: lsn, UpdatedAt: cp.UpdatedAt, AgeSeconds: time.Since(cp.UpdatedAt).Seconds(), RelayName: cp.RelayName}
	}
	// Dead letters, when the table exists.
	q = fmt.Sprintf("SELECT error_code, count(*) FROM %s WHERE status = $1 GROUP BY error_code", quoteTable(c.DLQTable))
	if rows, err := conn.Query(ctx, q, deadletter.StatusPending); err == nil {
		d := &StatusDLQ{ByCode: map[string]int64{}}
		for rows.Next() {
			var code string
			var n int64
			if rows.Scan(&code, &n) == nil {
				d.ByCode[code] = n
				d.Pending += n
			}
		}
		rows.Close()
		if rows.Err() == nil {
			st.DeadLetters = d
		}
	}
	return st, nil
}

// quoteTable quotes a possibly schema-qualified table name.
func quoteTable(t string) string {
	return pgx.Identifier(strings.Split(t, ".")).Sanitize()
}

func printStatus(w io.Writer, st Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "slot\t%s\n", st.Slot)
	if st.SlotExists {
		who := "no (relay not connected)"
		if st.Active {
			who = fmt.Sprintf("yes (pid %d)", st.ActivePID)
		}
		fmt.Fprintf(tw, "active\t%s\n", who)
		fmt.Fprintf(tw, "wal_status\t%s\n", st.WALStatus)
		fmt.Fprintf(tw, "confirmed lsn\t%s\n", st.ConfirmedLSN)
		fmt.Fprintf(tw, "server wal end\t%s\n", st.ServerWALEnd)
		fmt.Fprintf(tw, "lag\t%s\n", bytesHuman(st.LagBytes))
		fmt.Fprintf(tw, "retained wal\t%s\n", bytesHuman(st.RetainedWALBytes))
	} else {
		fmt.Fprintf(tw, "exists\tno\n")
	}
	if st.Checkpoint != nil {
		fmt.Fprintf(tw, "stored checkpoint\t%s (%s ago, by %s)\n", st.Checkpoint.LSN,
			time.Duration(st.Checkpoint.AgeSeconds*float64(time.Second)).Round(time.Second), st.Checkpoint.RelayName)
	} else {
		fmt.Fprintf(tw, "stored checkpoint\tnone\n")
	}
	if st.DeadLetters != nil {
		parts := []string{}
		for code, n := range st.DeadLetters.ByCode {
			parts = append(parts, fmt.Sprintf("%s=%d", code, n))
		}
		fmt.Fprintf(tw, "dead letters pending\t%d %s\n", st.DeadLetters.Pending, strings.Join(parts, " "))
	}
	for _, p := range st.Problems {
		fmt.Fprintf(tw, "PROBLEM\t%s\n", p)
	}
	tw.Flush()
}

func bytesHuman(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// ExitError asks main to exit with Code after printing Err.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }
