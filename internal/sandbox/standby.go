package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyOptions configures StartStandby.
type StandbyOptions struct {
	// Slot is the physical replication slot on the primary that the standby
	// streams from (primary_slot_name); StartStandby creates it. Required.
	Slot string
	// Database is the dbname of the standby's primary_conninfo, which slot
	// synchronization (sync_replication_slots, PostgreSQL 17+) needs; ""
	// is "postgres".
	Database string
	// Settings are extra postgresql.conf parameters of the standby, e.g.
	// {"sync_replication_slots": "on", "hot_standby_feedback": "on"}.
	Settings map[string]string
}

// StartStandby makes a hot standby of the local cluster p: it creates the
// physical slot opts.Slot on p, stops p cleanly, copies its data directory
// (a cold copy: the server packages the tests may use have no
// pg_basebackup), starts p again on its port and starts the copy on a free
// port with standby.signal and a primary_conninfo to p. Clients of p must
// reconnect. Close the standby as any cluster; Promote makes it a primary.
func (p *Postgres) StartStandby(ctx context.Context, opts StandbyOptions) (*Postgres, error) {
	if p.external != nil {
		return nil, fmt.Errorf("start standby: %w", ErrExternal)
	}
	if !settingName.MatchString(opts.Slot) {
		return nil, fmt.Errorf("start standby: slot name %q is invalid", opts.Slot)
	}
	db := opts.Database
	if db == "" {
		db = "postgres"
	}
	if err := p.Exec(ctx, "postgres", "SELECT pg_create_physical_replication_slot($1, true)", opts.Slot); err != nil {
		return nil, fmt.Errorf("start standby: create physical slot %s: %w", opts.Slot, err)
	}
	root, err := os.MkdirTemp(os.TempDir(), "cdc-relay-pg-standby-")
	if err != nil {
		return nil, fmt.Errorf("start standby: create temp dir: %w", err)
	}
	s := &Postgres{
		user: p.user, bin: p.bin, version: p.version, major: p.major,
		rootDir: root, dataDir: filepath.Join(root, "data"), logFile: filepath.Join(root, "postgres.log"),
	}
	if err := s.user.chown(root); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	if err := p.copyDataTo(ctx, s.dataDir); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	conf := "\n# cdc-relay sandbox: standby of port " + strconv.Itoa(p.port) + "\n" +
		"hot_standby = on\n" +
		"unix_socket_directories = " + confQuote(s.dataDir) + "\n" +
		"primary_conninfo = " + confQuote(fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=%s application_name=standby", p.port, db)) + "\n" +
		"primary_slot_name = " + confQuote(opts.Slot) + "\n"
	for _, name := range slices.Sorted(maps.Keys(opts.Settings)) {
		if !settingName.MatchString(name) {
			return nil, errors.Join(fmt.Errorf("start standby: setting %q: not a parameter name", name), s.Close())
		}
		conf += name + " = " + confQuote(opts.Settings[name]) + "\n"
	}
	if err := appendFile(filepath.Join(s.dataDir, "postgresql.conf"), conf); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	signal := filepath.Join(s.dataDir, "standby.signal")
	if err := os.WriteFile(signal, nil, 0o600); err != nil {
		return nil, errors.Join(fmt.Errorf("start standby: %w", err), s.Close())
	}
	if err := s.user.chown(signal); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	if err := s.startOnFreePort(ctx); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// copyDataTo stops p cleanly, copies its data directory to dst (keeping
// owners and modes) and starts p again.
func (p *Postgres) copyDataTo(ctx context.Context, dst string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.stopLocked("fast"); err != nil {
		return fmt.Errorf("start standby: stop the primary: %w", err)
	}
	out, copyErr := exec.CommandContext(ctx, "cp", "-a", p.dataDir, dst).CombinedOutput()
	if err := p.startLocked(ctx); err != nil {
		return fmt.Errorf("start standby: start the primary again: %w", err)
	}
	if copyErr != nil {
		return fmt.Errorf("start standby: copy the data directory: %w: %s", copyErr, strings.TrimSpace(string(out)))
	}
	return nil
}

// Promote promotes a standby (pg_ctl promote) and waits until it accepts
// writes.
func (p *Postgres) Promote(ctx context.Context) error {
	if p.external != nil {
		return fmt.Errorf("promote: %w", ErrExternal)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out, err := p.run(ctx, "pg_ctl", "-D", p.dataDir, "-w", "-t", strconv.Itoa(int(pgCtlTimeout.Seconds())), "promote")
	if err != nil {
		return fmt.Errorf("promote: %w\n%s\nserver log (%s):\n%s", err, out, p.logFile, p.logTail())
	}
	return nil
}

// RefuseReplication makes p refuse physical replication connections from
// now on and ends those open, and waits until none is left: a standby of p
// then keeps the WAL it has flushed and gets no more. Ordinary connections go
// on, and so do logical replication connections (replication=database) and
// slot synchronization's (PostgreSQL 17+), which are ordinary ones too: in
// pg_hba.conf the "replication" keyword matches physical replication alone.
// The reject lines go first in pg_hba.conf; nothing takes them out again.
func (p *Postgres) RefuseReplication(ctx context.Context) error {
	if p.external != nil {
		return fmt.Errorf("refuse replication: %w", ErrExternal)
	}
	path := filepath.Join(p.dataDir, "pg_hba.conf")
	hba, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("refuse replication: %w", err)
	}
	lines := "# cdc-relay sandbox: RefuseReplication\nlocal replication all reject\nhost replication all all reject\n\n"
	// The file exists: WriteFile keeps its owner and mode.
	if err := os.WriteFile(path, append([]byte(lines), hba...), 0o600); err != nil {
		return fmt.Errorf("refuse replication: %w", err)
	}
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return fmt.Errorf("refuse replication: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("refuse replication: reload: %w", err)
	}
	// A physical walsender is the one without a database. One whose
	// standby reconnected before the postmaster read the new file is ended
	// on the next round.
	for {
		var left int
		err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE backend_type = 'walsender' AND datname IS NULL`).Scan(&left)
		if err != nil {
			return fmt.Errorf("refuse replication: end the physical walsenders: %w", err)
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("refuse replication: %d physical walsenders left: %w", left, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
