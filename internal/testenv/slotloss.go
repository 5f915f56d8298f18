package testenv

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// LoseSlot makes Postgres invalidate the inactive slot for removed WAL: it
// caps the WAL kept for slots at 1MB (ALTER SYSTEM: on a server the test may
// reconfigure) and writes, switches and checkpoints WAL past it
// until pg_replication_slots says wal_status = 'lost'.
func LoseSlot(t testing.TB, p *pgxpool.Pool, slot string) {
	t.Helper()
	ctx := t.Context()
	for _, sql := range []string{"ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "SELECT pg_reload_conf()", "CREATE TABLE IF NOT EXISTS lose_wal (v text)"} {
		if _, err := p.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for i := 0; i < 20; i++ {
		var status string
		for _, sql := range []string{"INSERT INTO lose_wal SELECT repeat('x', 1000) FROM generate_series(1, 2000)", "SELECT pg_switch_wal()", "CHECKPOINT"} {
			if _, err := p.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		if err := p.QueryRow(ctx, "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if status == "lost" {
			return
		}
	}
	t.Fatalf("slot %s was not lost after 20 WAL switches and checkpoints", slot)
}
