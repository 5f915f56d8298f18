package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

const testDB = "cdc_relay_checkpoint_test"

// newTestDB starts (or attaches to, with CDC_RELAY_TEST_PG_URL) a Postgres 15 server,
// creates a fresh database and returns the server and the database's URL.
func newTestDB(t *testing.T) (*sandbox.Postgres, string) {
	t.Helper()
	p := testenv.NewPostgres(t, sandbox.PGOptions{})
	dbURL, err := p.CreateDatabase(t.Context(), testDB)
	if err != nil {
		t.Fatalf("create database: %v", err)
	}
	return p, dbURL
}

func newPool(t *testing.T, dbURL string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), dbURL)
	if err != nil {
		t.Fatalf("create pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func TestTableStore(t *testing.T) {
	p, dbURL := newTestDB(t)
	admin := newPool(t, dbURL)

	t.Run("contract", func(t *testing.T) {
		var n atomic.Int64
		testStoreContract(t, func(t *testing.T) store {
			s := NewTableStore(admin, fmt.Sprintf("public.ckpt_contract_%d", n.Add(1)))
			if err := s.Ensure(t.Context()); err != nil {
				t.Fatalf("Ensure: %v", err)
			}
			return s
		})
	})

	t.Run("ensure adds the columns a table made before them lacks", func(t *testing.T) {
		for _, tt := range oldTables {
			t.Run(tt.version, func(t *testing.T) {
				ctx := t.Context()
				table := "public.ckpt_old_" + tt.version
				if _, err := admin.Exec(ctx, tt.ddl(table)); err != nil {
					t.Fatal(err)
				}
				if _, err := admin.Exec(ctx, `INSERT INTO `+table+` (slot_name, system_id, lsn) VALUES ('old', '1', '0/10')`); err != nil {
					t.Fatal(err)
				}
				s := NewTableStore(admin, table)
				if _, _, err := s.Load(ctx, "old"); err == nil {
					t.Fatal("Load before Ensure on an old table succeeded; the test does not exercise the upgrade")
				}
				if err := s.Ensure(ctx); err != nil {
					t.Fatalf("Ensure: %v", err)
				}
				if got, want := columns(t, admin, table), referenceColumns(t, admin); !slices.Equal(got, want) {
					t.Errorf("columns after Ensure:\n%s\nwant those of TableDDL:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
				got, ok, err := s.Load(ctx, "old")
				if err != nil || !ok || got.LSN != 0x10 || !got.CommitTime.IsZero() || got.Offsets != nil {
					t.Fatalf("Load of the old row = %+v, %v, %v; want LSN 0/10 with no commit time and no offsets", got, ok, err)
				}
				want := Checkpoint{Slot: "old", SystemID: "1", LSN: 0x20, UpdatedAt: time.Now().Truncate(time.Microsecond),
					CommitTime: time.Now().Add(-time.Hour).Truncate(time.Microsecond),
					Offsets:    Offsets{"orders": {Partitions: 2, Next: map[int32]int64{0: 3, 1: 4}}}}
				mustSave(t, ctx, s, want)
				mustLoad(t, ctx, s, "old", want, true)
			})
		}
	})

	t.Run("migration file makes the table of TableDDL, also from an old one", func(t *testing.T) {
		ctx := t.Context()
		sql, err := os.ReadFile(filepath.Join("..", "..", MigrationFile))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range addedColumns {
			stmt := "ALTER TABLE public.cdc_relay_checkpoints ADD COLUMN IF NOT EXISTS " + c.name + " " + c.typ + ";"
			if !strings.Contains(string(sql), stmt) {
				t.Errorf("%s lacks %q, which upgrades older tables", MigrationFile, stmt)
			}
		}
		starts := append([]oldTable{{version: "none"}}, oldTables...)
		for i, start := range starts {
			db := fmt.Sprintf("%s_mig_%d", testDB, i)
			dbURL, err := p.CreateDatabase(ctx, db)
			if err != nil {
				t.Fatal(err)
			}
			if start.ddl != nil {
				if err := p.Exec(ctx, db, start.ddl(DefaultTable)); err != nil {
					t.Fatal(err)
				}
			}
			for range 2 { // it must be safe to run again
				if err := p.Exec(ctx, db, string(sql)); err != nil {
					t.Fatalf("run %s on %s: %v", MigrationFile, start.version, err)
				}
			}
			pool := newPool(t, dbURL)
			if got, want := columns(t, pool, DefaultTable), referenceColumns(t, pool); !slices.Equal(got, want) {
				t.Errorf("%s on %s makes columns\n%s\nwant those of TableDDL:\n%s",
					MigrationFile, start.version, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		}
	})

	t.Run("ensure is idempotent and quotes names", func(t *testing.T) {
		ctx := t.Context()
		if err := p.Exec(ctx, testDB, `CREATE SCHEMA "Relay Schema"`); err != nil {
			t.Fatal(err)
		}
		for _, table := range []string{"", "Relay Schema.Check-points", "bare_table"} {
			s := NewTableStore(admin, table)
			for range 2 {
				if err := s.Ensure(ctx); err != nil {
					t.Fatalf("Ensure(%q): %v", table, err)
				}
			}
			c := Checkpoint{Slot: "orders", SystemID: "1", LSN: 0x16B3748, UpdatedAt: time.Unix(1700000000, 0), RelayName: "r"}
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
		}
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM "Relay Schema"."Check-points"`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("quoted table has %d rows (err %v), want 1", n, err)
		}
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM public.cdc_relay_checkpoints`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("default table has %d rows (err %v), want 1", n, err)
		}
	})

	t.Run("lsn column is pg_lsn", func(t *testing.T) {
		ctx := t.Context()
		s := NewTableStore(admin, "public.ckpt_types")
		if err := s.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		mustSave(t, ctx, s, Checkpoint{Slot: "orders", SystemID: "1", LSN: 0x1_0000_0010})
		var lsn string
		err := admin.QueryRow(ctx, `SELECT lsn::text FROM public.ckpt_types WHERE lsn > '0/FFFFFFFF'::pg_lsn`).Scan(&lsn)
		if err != nil || lsn != "1/10" {
			t.Fatalf("stored lsn = %q (err %v), want 1/10 compared as pg_lsn", lsn, err)
		}
	})

	t.Run("save writes WAL", func(t *testing.T) {
		ctx := t.Context()
		s := NewTableStore(admin, "public.ckpt_heartbeat")
		if err := s.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		walLSN := func() (lsn string) {
			t.Helper()
			if err := admin.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
				t.Fatal(err)
			}
			return lsn
		}
		before := walLSN()
		mustSave(t, ctx, s, Checkpoint{Slot: "orders", SystemID: "1", LSN: 1})
		var moved bool
		if err := admin.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn() > $1::text::pg_lsn", before).Scan(&moved); err != nil || !moved {
			t.Fatalf("WAL insert position did not move past %s after Save (err %v)", before, err)
		}
	})

	t.Run("role without CREATE", func(t *testing.T) {
		ctx := t.Context()
		role := fmt.Sprintf("cdc_relay_ckpt_%d", time.Now().UnixNano())
		// Public has no CREATE for other roles since PostgreSQL 15; revoked
		// here so that 13 and 14 test the same refusal.
		if err := p.Exec(ctx, testDB, fmt.Sprintf(`REVOKE CREATE ON SCHEMA public FROM PUBLIC;
CREATE ROLE %s LOGIN PASSWORD 'secret';
%s;
GRANT SELECT, INSERT, UPDATE ON public.ckpt_premigrated TO %s`, role, TableDDL("public.ckpt_premigrated"), role)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // t.Context is done by now
			defer cancel()
			if err := p.Exec(ctx, testDB, "DROP OWNED BY "+role); err != nil {
				t.Errorf("drop owned by %s: %v", role, err)
			}
			if err := p.Exec(ctx, "postgres", "DROP ROLE "+role); err != nil {
				t.Errorf("drop role %s: %v", role, err)
			}
		})
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(role, "secret")
		limited := newPool(t, u.String())

		// An old table the role may use but not alter: Ensure says to migrate.
		if err := p.Exec(ctx, testDB, oldTables[0].ddl("public.ckpt_unupgraded")+
			"; GRANT SELECT, INSERT, UPDATE ON public.ckpt_unupgraded TO "+role); err != nil {
			t.Fatal(err)
		}
		err = NewTableStore(limited, "public.ckpt_unupgraded").Ensure(ctx)
		checkErr(t, "Ensure on an old table without privilege", err,
			[]string{"migrations/002_checkpoints.sql", "public.ckpt_unupgraded", "commit_time, kafka_offsets", "may not alter"})

		// Public has no CREATE for other roles (revoked above).
		err = NewTableStore(limited, "public.ckpt_unmigrated").Ensure(ctx)
		checkErr(t, "Ensure without privilege", err, []string{"migrations/002_checkpoints.sql", "public.ckpt_unmigrated"})
		if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("Ensure error does not wrap the insufficient_privilege PgError: %v", err)
		}

		// After the migration ran, the limited role needs no CREATE privilege.
		s := NewTableStore(limited, "public.ckpt_premigrated")
		if err := s.Ensure(ctx); err != nil {
			t.Fatalf("Ensure on a migrated table: %v", err)
		}
		c := Checkpoint{Slot: "orders", SystemID: "1", LSN: 9, UpdatedAt: time.Unix(1700000000, 0)}
		mustSave(t, ctx, s, c)
		c.LSN = 10
		mustSave(t, ctx, s, c)
		mustLoad(t, ctx, s, "orders", c, true)
	})

	t.Run("errors name the table", func(t *testing.T) {
		ctx := t.Context()
		s := NewTableStore(admin, "public.ckpt_never_created")
		_, _, err := s.Load(ctx, "orders")
		checkErr(t, "Load", err, []string{"public.ckpt_never_created", `slot "orders"`})
		err = s.Save(ctx, Checkpoint{Slot: "orders", SystemID: "1", LSN: 0x10})
		checkErr(t, "Save", err, []string{"public.ckpt_never_created", `slot "orders"`, "0/10"})
		if errors.Is(err, pgx.ErrNoRows) {
			t.Errorf("Save error is ErrNoRows: %v", err)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("error leaks a password: %v", err)
		}
	})
}

// oldTable is a version of the checkpoint table before some of addedColumns.
type oldTable struct {
	version string
	ddl     func(table string) string
}

// oldTables are the checkpoint tables earlier relays made, oldest first.
var oldTables = []oldTable{
	{"v1", func(table string) string {
		return "CREATE TABLE " + quoteTable(table) + ` (
    slot_name  text        PRIMARY KEY,
    system_id  text        NOT NULL,
    lsn        pg_lsn      NOT NULL,
    relay_name text        NOT NULL DEFAULT '',
    updated_at timestamptz NOT NULL DEFAULT now())`
	}},
	{"v2_commit_time", func(table string) string {
		return "CREATE TABLE " + quoteTable(table) + ` (
    slot_name  text        PRIMARY KEY,
    system_id  text        NOT NULL,
    lsn        pg_lsn      NOT NULL,
    relay_name text        NOT NULL DEFAULT '',
    updated_at timestamptz NOT NULL DEFAULT now(),
    commit_time timestamptz)`
	}},
}

// columns describes the columns of table as "name type [not null] [default]",
// sorted by name, to compare tables made different ways.
func columns(t *testing.T, pool *pgxpool.Pool, table string) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT concat_ws(' ', a.attname, format_type(a.atttypid, a.atttypmod),
       CASE WHEN a.attnotnull THEN 'not null' END, 'default ' || pg_get_expr(d.adbin, d.adrelid))
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attname`, quoteTable(table))
	if err != nil {
		t.Fatalf("describe %s: %v", table, err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(cols) == 0 {
		t.Fatalf("describe %s: %q, %v", table, cols, err)
	}
	return cols
}

// referenceColumns are the columns of a table made by TableDDL.
func referenceColumns(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	if _, err := pool.Exec(t.Context(), TableDDL("public.ckpt_reference")); err != nil {
		t.Fatalf("create reference table: %v", err)
	}
	return columns(t, pool, "public.ckpt_reference")
}
