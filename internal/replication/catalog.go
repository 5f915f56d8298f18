package replication

// Catalog facts the relay reads or changes outside the replication protocol:
// one query per fact, shared by the start-up checks and the watches that
// re-check them while streaming.

import (
	"context"
	"fmt"
	"github.com/jackc/pglogrepl"
	"time"
)

// Coverage is what the catalog says about the outbox table and the
// publication.
type Coverage struct {
	TableOID     uint32 // 0 when the table does not exist
	PubExists    bool
	PubInsert    bool // the publication publishes inserts
	PubUpdate    bool // the publication publishes updates
	PubAllTables bool // FOR ALL TABLES
	// Covered: pg_publication_tables lists the table for the publication.
	Covered bool
	// RelOID is the table's pg_publication_rel row; 0 when it is covered by
	// FOR ALL TABLES or TABLES IN SCHEMA (or not at all).
	RelOID uint32
}

// ReadCoverage reads the Coverage of cfg's table by cfg's publication.
func ReadCoverage(ctx context.Context, db QueryRower, cfg SetupConfig) (Coverage, error) {
	var (
		c                Coverage
		tableOID, relOID *uint32
	)
	err := db.QueryRow(ctx, `SELECT to_regclass($1)::oid, p.oid IS NOT NULL, coalesce(p.pubinsert, false), coalesce(p.pubupdate, false), coalesce(p.puballtables, false),
		EXISTS (SELECT 1 FROM pg_publication_tables t WHERE t.pubname = $2 AND t.schemaname = $3 AND t.tablename = $4),
		(SELECT r.oid FROM pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = to_regclass($1))
		FROM (SELECT) AS one LEFT JOIN pg_publication p ON p.pubname = $2`,
		cfg.QualifiedTable(), cfg.Publication, cfg.Schema, cfg.Table).
		Scan(&tableOID, &c.PubExists, &c.PubInsert, &c.PubUpdate, &c.PubAllTables, &c.Covered, &relOID)
	if err != nil {
		return Coverage{}, fmt.Errorf("check publication %q covers %s: %w", cfg.Publication, cfg.QualifiedTable(), err)
	}
	if tableOID != nil {
		c.TableOID = *tableOID
	}
	if relOID != nil {
		c.RelOID = *relOID
	}
	return c, nil
}

// CurrentDatabase returns the name of the database db is connected to.
func CurrentDatabase(ctx context.Context, db QueryRower) (string, error) {
	var name string
	if err := db.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil {
		return "", fmt.Errorf("read current database: %w", err)
	}
	return name, nil
}

// ServerClock returns the server's clock now (clock_timestamp()).
func ServerClock(ctx context.Context, db QueryRower) (time.Time, error) {
	var t time.Time
	if err := db.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("read the server clock: %w", err)
	}
	return t, nil
}

// CurrentWAL returns the server's current WAL write position
// (pg_current_wal_lsn()): every transaction committing later has a higher
// commit LSN.
func CurrentWAL(ctx context.Context, db QueryRower) (pglogrepl.LSN, error) {
	var text string
	if err := db.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&text); err != nil {
		return 0, fmt.Errorf("read the current WAL position: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(text)
	if err != nil {
		return 0, fmt.Errorf("parse the current WAL position %q: %w", text, err)
	}
	return lsn, nil
}

// DropSlot drops the replication slot named slot.
func DropSlot(ctx context.Context, db QueryRower, slot string) error {
	var ignored any
	if err := db.QueryRow(ctx, "SELECT pg_drop_replication_slot($1)", slot).Scan(&ignored); err != nil {
		return fmt.Errorf("drop replication slot %q: %w", slot, err)
	}
	return nil
}

// EmitHeartbeat writes a logical decoding message (prefix cdc_relay_heartbeat,
// not transactional), so an idle database's slot has WAL to move past.
func EmitHeartbeat(ctx context.Context, db QueryRower) error {
	var lsn any
	if err := db.QueryRow(ctx, "SELECT pg_logical_emit_message(false, 'cdc_relay_heartbeat', now()::text)").Scan(&lsn); err != nil {
		return fmt.Errorf("write heartbeat: %w", err)
	}
	return nil
}
