package cli

import (
	"context"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/status"
)

// StatusCmd is "cdc-relay status": the relay's state read from the database
// itself, so it works while the relay is down, and usable as a probe
// (internal/status reads, judges and writes it).
type StatusCmd struct {
	PGFlags `embed:"" group:"postgres"`

	checkpointTableFlag `embed:"" group:"postgres"`
	dlqStoreFlags       `embed:"" group:"postgres" set:"dlq_table_note="`
	MaxLagBytes         int64 `key:"status.max_lag_bytes" group:"output" default:"1073741824" help:"Exit 3 (a problem) when the slot's lag (server WAL end - confirmed) exceeds this many bytes (0 disables)."`
	JSON                bool  `group:"output" name:"json" help:"Print JSON."`
}

// Exit codes of status.
const (
	statusOK      = 0
	statusProblem = 3 // not 2: that is a usage error (ExitUsage), for every command
)

// Validate checks the Postgres flags (reading --pg-url-file) and --table.
func (c *StatusCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	return checkTables(c.Table)
}

// Run prints the status, and returns an ExitError with statusProblem when it
// found a problem.
func (c *StatusCmd) Run(ctx context.Context, env Env) error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	pool, err := connect(ctx, c.PGURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := status.Config{Slot: c.Slot, Publication: c.Publication, CheckpointTable: c.CheckpointTable,
		DeadLetterTable: c.DLQTable, MaxLagBytes: c.MaxLagBytes, Names: runNames}
	for _, t := range c.Table { // checked by Validate
		schema, table, _ := splitTable(t)
		cfg.Tables = append(cfg.Tables, decoder.TableName{Schema: schema, Table: table})
	}
	r, err := status.Read(ctx, pool, cfg)
	if err != nil {
		return err
	}
	if c.JSON {
		err = status.WriteJSON(env.Stdout, r)
	} else {
		err = status.WriteText(env.Stdout, r, "--json shows all")
	}
	if err != nil {
		return err
	}
	if err := r.Err(); err != nil {
		return &ExitError{Code: statusProblem, Err: err}
	}
	return nil
}
