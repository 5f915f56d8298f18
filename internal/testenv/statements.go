package testenv

import (
	"fmt"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// CountStatements counts the op statements (INSERT, UPDATE, DELETE or
// TRUNCATE) run on table ("schema.table" or "table") from now on, with a
// statement-level trigger created through pool, and returns a function reading
// the count: tests check with it that work is done in batches. Call it at most
// once per table and op in a database.
func CountStatements(t testing.TB, pool *pgxpool.Pool, table, op string) func() int {
	t.Helper()
	ctx := t.Context()
	name := fmt.Sprintf("cdc_relay_count_%s_%08x", strings.ToLower(op), crc32.ChecksumIEEE([]byte(table)))
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s (n int NOT NULL);
INSERT INTO %[1]s VALUES (0);
CREATE FUNCTION %[1]s_count() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN UPDATE %[1]s SET n = n + 1; RETURN NULL; END $$;
CREATE TRIGGER %[1]s AFTER %[2]s ON %[3]s FOR EACH STATEMENT EXECUTE FUNCTION %[1]s_count();`,
		name, op, pgx.Identifier(strings.Split(table, ".")).Sanitize()))
	if err != nil {
		t.Fatalf("count %s statements on %s: %v", op, table, err)
	}
	return func() int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT n FROM "+name).Scan(&n); err != nil {
			t.Fatalf("read the count of %s statements on %s: %v", op, table, err)
		}
		return n
	}
}
