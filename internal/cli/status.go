package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// StatusCmd is "cdc-relay status": the relay's state read from the database
// itself, so it works while the relay is down, and usable as a probe.
type StatusCmd struct {
	PGFlags `embed:"" group:"postgres"`

	checkpointTableFlag `embed:"" group:"postgres"`
	dlqStoreFlags       `embed:"" group:"postgres" set:"dlq_table_note="`
	MaxLagBytes         int64 `key:"status.max_lag_bytes" group:"output" default:"1073741824" help:"Exit 3 (a problem) when the slot's lag (server WAL end - confirmed) exceeds this many bytes (0 disables)."`
	JSON                bool  `group:"output" name:"json" help:"Print JSON."`
}

// Status is what status reports.
type Status struct {
	Slot string `json:"slot"`
	// Server is the role of the server of --pg-url, where the slot lives:
	// "primary", or "standby" (a relay decoding there writes its checkpoint
	// and dead letters to the primary, replicated back here).
	Server           string `json:"server"`
	SlotExists       bool   `json:"slot_exists"`
	Active           bool   `json:"active"`
	ActivePID        int    `json:"active_pid,omitempty"`
	WALStatus        string `json:"wal_status,omitempty"`
	ServerWALEnd     string `json:"server_wal_end"`
	ConfirmedLSN     string `json:"confirmed_lsn,omitempty"`
	LagBytes         int64  `json:"lag_bytes"`
	RetainedWALBytes int64  `json:"retained_wal_bytes"`
	// The slot's health, where the server's version reports it (absent
	// otherwise): safe_wal_size (13+, absent without a limit) under
	// max_slot_wal_keep_size (-1: no limit), conflicting (16+),
	// invalidation_reason and inactive_since (17+). InvalidatedReason is the
	// relay's reading of them (replication.SlotState.Invalidated).
	SafeWALSizeBytes   *int64     `json:"safe_wal_size_bytes,omitempty"`
	WALKeepSizeBytes   *int64     `json:"max_slot_wal_keep_size_bytes,omitempty"`
	Conflicting        *bool      `json:"conflicting,omitempty"`
	InvalidationReason string     `json:"invalidation_reason,omitempty"`
	InactiveSince      *time.Time `json:"inactive_since,omitempty"`
	InvalidatedReason  string     `json:"invalidated,omitempty"`
	// OldestUnrelayedAge is the age in seconds of the oldest committed
	// outbox row not yet acknowledged by Kafka, 0 when nothing waits, null
	// when status could not tell; OldestUnrelayedSource says how it knows:
	// "checkpoint" (what the running relay stored: it stores a new oldest
	// unrelayed time within 100 ms, also while stuck behind an outage) or
	// "slot" (the slot, decoded without consuming it, while no relay holds
	// it).
	OldestUnrelayedAge    *float64 `json:"oldest_unrelayed_age_seconds"`
	OldestUnrelayedSource string   `json:"oldest_unrelayed_source,omitempty"`
	// OldestUnrelayedError says why the age is null (no problem by itself:
	// the exit code does not change).
	OldestUnrelayedError string            `json:"oldest_unrelayed_error,omitempty"`
	Checkpoint           *StatusCheckpoint `json:"checkpoint,omitempty"`
	DeadLetters          *StatusDLQ        `json:"dead_letters,omitempty"`
	// Failover is what a failover of the server would do to the slot.
	Failover *StatusFailover `json:"failover,omitempty"`
	Problems []string        `json:"problems,omitempty"`
	// Warnings are risks that are not problems yet (the exit code does not
	// change): a slot a promotion would lose, events a promotion would lose.
	Warnings []string `json:"warnings,omitempty"`
}

// StatusFailover is the slot's failover state (docs/postgres.md, Failover).
type StatusFailover struct {
	ServerVersion string `json:"server_version"` // e.g. "17.2"
	// Supported: the server has failover slots (PostgreSQL 17+); the fields
	// below are only read there.
	Supported bool `json:"supported"`
	// SlotFailover: the slot is a failover slot, copied to standbys with
	// sync_replication_slots on; SlotSynced: this copy was synchronized
	// from a primary (a promoted standby's slot).
	SlotFailover bool `json:"slot_failover"`
	SlotSynced   bool `json:"slot_synced"`
	// SynchronizedStandbySlots is the server's setting: the standbys that
	// receive WAL before the relay does ("" when unset).
	SynchronizedStandbySlots string `json:"synchronized_standby_slots"`
}

// StatusCheckpoint is the stored checkpoint.
type StatusCheckpoint struct {
	LSN        string    `json:"lsn"`
	UpdatedAt  time.Time `json:"updated_at"`
	AgeSeconds float64   `json:"age_seconds"`
	RelayName  string    `json:"relay_name,omitempty"`
	// KafkaOffsets are the per-partition Kafka offsets stored with it, in the
	// store's JSON form; null when none are stored, {} when stored but empty.
	KafkaOffsets checkpoint.Offsets `json:"kafka_offsets"`
}

// StatusDLQ counts dead letters.
type StatusDLQ struct {
	Pending int64            `json:"pending"` // not completed (pending, processing, retry_wait or dead)
	Dead    int64            `json:"dead"`    // of which dead: the automatic retries gave up on them
	ByCode  map[string]int64 `json:"by_code,omitempty"`
	// BySourceTable counts them by the outbox table their events came from
	// (several --table behind one relay); letters without one are left out.
	BySourceTable map[string]int64 `json:"by_source_table,omitempty"`
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
	st, err := c.collect(ctx, pool)
	if err != nil {
		return err
	}
	if err := writeStatus(env.Stdout, st, c.JSON); err != nil {
		return err
	}
	if len(st.Problems) > 0 {
		return &ExitError{Code: statusProblem, Err: fmt.Errorf("%s", strings.Join(st.Problems, "; "))}
	}
	return nil
}

// collect reads the slot, the stored checkpoint and the dead letters through
// the same code the relay uses; a missing checkpoint or dead-letter table just
// leaves its part out.
func (c *StatusCmd) collect(ctx context.Context, pool *pgxpool.Pool) (Status, error) {
	st := Status{Slot: c.Slot}
	source, err := replication.ReadSource(ctx, pool)
	if err != nil {
		return st, err
	}
	st.Server = source.Role()
	end, err := replication.CurrentWAL(ctx, pool)
	if err != nil {
		return st, err
	}
	st.ServerWALEnd = end.String()
	// The slot before the checkpoint (gaps.Probe).
	slot, err := replication.ReadSlot(ctx, pool, c.Slot)
	if err != nil {
		return st, err
	}
	if slot.Exists {
		st.SlotExists, st.Active, st.ActivePID, st.WALStatus = true, slot.Active, slot.ActivePID, slot.WALStatus
		st.ConfirmedLSN = slot.ConfirmedFlush.String()
		st.LagBytes, st.RetainedWALBytes = slot.LagBytes, slot.RetainedWALBytes
		st.SafeWALSizeBytes, st.WALKeepSizeBytes = slot.SafeWALSize, &slot.WALKeepSize
		st.Conflicting, st.InvalidationReason = slot.Conflicting, slot.InvalidationReason
		if !slot.InactiveSince.IsZero() {
			st.InactiveSince = &slot.InactiveSince
		}
		_, st.InvalidatedReason = slot.Invalidated()
	}
	cp, haveCP, err := checkpoint.NewTableStore(pool, c.CheckpointTable).Load(ctx, c.Slot)
	haveCP = haveCP && err == nil
	if haveCP {
		st.Checkpoint = &StatusCheckpoint{LSN: cp.LSN.String(), UpdatedAt: cp.UpdatedAt, AgeSeconds: time.Since(cp.UpdatedAt).Seconds(),
			RelayName: cp.RelayName, KafkaOffsets: cp.Offsets}
	}
	probe := gaps.Probe{Setup: c.setup(), Slot: slot, Stored: cp, HaveStored: haveCP, MaxLagBytes: c.MaxLagBytes}
	if probe.Database, err = replication.CurrentDatabase(ctx, pool); err != nil {
		return st, err
	}
	for _, t := range probe.Setup.PerTable() {
		cov, err := replication.ReadCoverage(ctx, pool, t)
		if err != nil {
			return st, err
		}
		probe.Coverage = append(probe.Coverage, cov)
	}
	if probe.Failover, err = c.failover(ctx, pool, &st); err != nil {
		return st, err
	}
	// The relay's own checks judge: status's problems are their verdicts,
	// with the settings named as the run command names them.
	r := gaps.JudgeStatus(probe)
	for _, p := range r.Problems {
		st.Problems = append(st.Problems, p)
	}
	for _, w := range r.Warnings {
		st.Warnings = append(st.Warnings, w)
	}
	c.oldestUnrelayed(ctx, pool, &st, slot.Exists && slot.Active, cp, haveCP)
	store := deadletter.NewStore(pool, c.DLQTable)
	if codes, err := store.Summary(ctx, deadletter.Filter{}); err == nil {
		d := &StatusDLQ{ByCode: map[string]int64{}}
		if by, err := store.BacklogBySource(ctx); err == nil {
			delete(by, "")
			if len(by) > 0 {
				d.BySourceTable = by
			}
		}
		for _, cc := range codes {
			if cc.Pending > 0 {
				d.ByCode[cc.ErrorCode] = cc.Pending
				d.Pending += cc.Pending
			}
			d.Dead += cc.Dead
		}
		st.DeadLetters = d
	}
	return st, nil
}

// failover reads the slot's failover state into st (gaps.JudgeStatus
// judges it).
func (c *StatusCmd) failover(ctx context.Context, pool *pgxpool.Pool, st *Status) (replication.FailoverState, error) {
	s, err := replication.ReadFailover(ctx, pool, c.Slot)
	if err != nil {
		return s, err
	}
	st.Failover = &StatusFailover{
		ServerVersion: replication.VersionName(s.ServerVersion), Supported: s.Supported(),
		SlotFailover: s.SlotFailover, SlotSynced: s.SlotSynced, SynchronizedStandbySlots: s.StandbySlots,
	}
	return s, nil
}

// setup names the slot, the publication and the outbox tables (--table,
// checked by Validate) for the gap checks.
func (c *StatusCmd) setup() replication.SetupConfig {
	cfg := replication.SetupConfig{Slot: c.Slot, Publication: c.Publication, Names: runNames}
	for i, t := range c.Table {
		schema, table, _ := splitTable(t)
		if i == 0 {
			cfg.Schema, cfg.Table = schema, table
			continue
		}
		cfg.Also = append(cfg.Also, replication.TableSetup{Name: decoder.TableName{Schema: schema, Table: table}})
	}
	return cfg
}

// peekTimeout bounds decoding the slot for the oldest unrelayed row.
const peekTimeout = 5 * time.Second

// oldestUnrelayed fills in the age of the oldest unrelayed outbox row: from
// the checkpoint the running relay keeps writing while the slot is active,
// else by decoding the idle slot up to its first published transaction.
func (c *StatusCmd) oldestUnrelayed(ctx context.Context, pool *pgxpool.Pool, st *Status, active bool, cp checkpoint.Checkpoint, haveCP bool) {
	age := func(at time.Time) *float64 {
		v := 0.0
		if !at.IsZero() {
			v = max(time.Since(at).Seconds(), 0)
		}
		return &v
	}
	switch {
	case !st.SlotExists:
	case active && haveCP:
		st.OldestUnrelayedAge, st.OldestUnrelayedSource = age(cp.OldestUnrelayed), "checkpoint"
	case active:
		st.OldestUnrelayedError = "the slot is active but no checkpoint is stored (yet)"
	default:
		at, ok, err := replication.PeekOldestCommit(ctx, pool, c.Slot, c.Publication, peekTimeout)
		if err != nil {
			st.OldestUnrelayedError = err.Error()
			return
		}
		if !ok {
			at = time.Time{}
		}
		st.OldestUnrelayedAge, st.OldestUnrelayedSource = age(at), "slot"
	}
}

// writeStatus prints st as a table, or as JSON.
func writeStatus(w io.Writer, st Status, asJSON bool) error {
	if asJSON {
		return writeJSON(w, "status", st)
	}
	printStatus(w, st)
	return nil
}

// printStatus prints st as a table.
func printStatus(w io.Writer, st Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "slot\t%s\n", st.Slot)
	if st.Server == "standby" {
		fmt.Fprintf(tw, "server\tstandby (the slot and the decoding are here; the relay writes its checkpoint and dead letters to the primary)\n")
	} else {
		fmt.Fprintf(tw, "server\t%s\n", st.Server)
	}
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
		printSlotHealth(tw, st)
	} else {
		fmt.Fprintf(tw, "exists\tno\n")
	}
	switch {
	case st.OldestUnrelayedAge != nil:
		from := "the " + st.OldestUnrelayedSource
		if st.OldestUnrelayedSource == "checkpoint" && st.Checkpoint != nil {
			from = fmt.Sprintf("the checkpoint the running relay wrote %s ago", time.Duration(st.Checkpoint.AgeSeconds*float64(time.Second)).Round(100*time.Millisecond))
		}
		fmt.Fprintf(tw, "oldest unrelayed\t%s (from %s)\n", time.Duration(*st.OldestUnrelayedAge*float64(time.Second)).Round(time.Millisecond), from)
	case st.OldestUnrelayedError != "":
		fmt.Fprintf(tw, "oldest unrelayed\tunknown: %s\n", st.OldestUnrelayedError)
	}
	if st.Checkpoint != nil {
		fmt.Fprintf(tw, "stored checkpoint\t%s (%s ago, by %s)\n", st.Checkpoint.LSN,
			time.Duration(st.Checkpoint.AgeSeconds*float64(time.Second)).Round(time.Second), st.Checkpoint.RelayName)
	} else {
		fmt.Fprintf(tw, "stored checkpoint\tnone\n")
	}
	var offsets checkpoint.Offsets
	if st.Checkpoint != nil {
		offsets = st.Checkpoint.KafkaOffsets
	}
	for _, l := range offsetLines(offsets) {
		fmt.Fprintf(tw, "kafka offsets\t%s\n", l)
	}
	if st.DeadLetters != nil {
		parts := []string{}
		for code, n := range st.DeadLetters.ByCode {
			parts = append(parts, fmt.Sprintf("%s=%d", code, n))
		}
		slices.Sort(parts)
		dead := ""
		if st.DeadLetters.Dead > 0 {
			dead = fmt.Sprintf(" (%d dead)", st.DeadLetters.Dead)
		}
		fmt.Fprintf(tw, "dead letters not completed\t%d%s %s\n", st.DeadLetters.Pending, dead, strings.Join(parts, " "))
		if by := st.DeadLetters.BySourceTable; len(by) > 0 {
			tables := []string{}
			for t, n := range by {
				tables = append(tables, fmt.Sprintf("%s=%d", t, n))
			}
			slices.Sort(tables)
			fmt.Fprintf(tw, "dead letters by table\t%s\n", strings.Join(tables, " "))
		}
	}
	if f := st.Failover; f != nil {
		fmt.Fprintf(tw, "failover\t%s\n", failoverLine(*f, st.SlotExists))
	}
	for _, p := range st.Problems {
		fmt.Fprintf(tw, "PROBLEM\t%s\n", p)
	}
	for _, w := range st.Warnings {
		fmt.Fprintf(tw, "WARNING\t%s\n", w)
	}
	tw.Flush()
}

// printSlotHealth prints the health columns the server reports.
func printSlotHealth(w io.Writer, st Status) {
	switch {
	case st.WALKeepSizeBytes != nil && *st.WALKeepSizeBytes < 0:
		fmt.Fprintf(w, "safe wal size\tno limit (max_slot_wal_keep_size = -1)\n")
	case st.SafeWALSizeBytes != nil && st.WALKeepSizeBytes != nil:
		safe := bytesHuman(*st.SafeWALSizeBytes)
		if *st.SafeWALSizeBytes < 0 {
			safe = "-" + bytesHuman(-*st.SafeWALSizeBytes) + " (past the limit)"
		}
		fmt.Fprintf(w, "safe wal size\t%s of max_slot_wal_keep_size %s\n", safe, bytesHuman(*st.WALKeepSizeBytes))
	}
	if st.Conflicting != nil {
		fmt.Fprintf(w, "conflicting\t%t\n", *st.Conflicting)
	}
	if st.InvalidatedReason != "" {
		fmt.Fprintf(w, "invalidated\t%s\n", st.InvalidatedReason)
	}
	if st.InactiveSince != nil {
		fmt.Fprintf(w, "inactive since\t%s (%s ago)\n", st.InactiveSince.UTC().Format(time.RFC3339), time.Since(*st.InactiveSince).Round(time.Second))
	}
}

// failoverLine says in one line whether the slot survives a failover.
func failoverLine(f StatusFailover, slotExists bool) string {
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	if !f.Supported {
		return fmt.Sprintf("no failover slots on PostgreSQL %s (17+): a promotion loses the slot", f.ServerVersion)
	}
	standbys := f.SynchronizedStandbySlots
	if standbys == "" {
		standbys = "unset"
	}
	slot := "no slot"
	if slotExists {
		slot = "failover slot " + yes(f.SlotFailover) + ", synced " + yes(f.SlotSynced)
	}
	return fmt.Sprintf("%s, synchronized_standby_slots %s (PostgreSQL %s)", slot, standbys, f.ServerVersion)
}

// maxOffsetsShown bounds the partitions a text line lists per topic, so that a
// topic of hundreds of partitions stays one readable line; --json shows all.
const maxOffsetsShown = 16

// offsetLines renders stored Kafka offsets as one line per topic, by name:
// "orders (8 partitions): 0=123 1=456 …", partitions in numeric order.
func offsetLines(o checkpoint.Offsets) []string {
	if o == nil {
		return []string{"none stored (at-least-once delivery, or no checkpoint with offsets yet)"}
	}
	if len(o) == 0 {
		return []string{"stored, no records written yet"}
	}
	var lines []string
	for _, topic := range slices.Sorted(maps.Keys(o)) {
		t := o[topic]
		head := fmt.Sprintf("%s (%d partitions", topic, t.Partitions)
		if t.Partitions == 1 {
			head = strings.TrimSuffix(head, "s")
		}
		if len(t.Next) < t.Partitions {
			head += fmt.Sprintf(", %d written", len(t.Next))
		}
		parts := slices.Sorted(maps.Keys(t.Next))
		var b strings.Builder
		b.WriteString(head + "):")
		if len(parts) == 0 {
			b.WriteString(" no records written")
		}
		for i, p := range parts {
			if i == maxOffsetsShown {
				fmt.Fprintf(&b, " … %d more (--json shows all)", len(parts)-i)
				break
			}
			fmt.Fprintf(&b, " %d=%d", p, t.Next[p])
		}
		lines = append(lines, b.String())
	}
	return lines
}

// bytesHuman formats n bytes in binary units: 512 B, 1.5 KiB, 3.0 GiB.
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
