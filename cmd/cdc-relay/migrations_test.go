package main

import (
	"context"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// migrationFiles are the files of migrations/, in the order docs/postgres.md
// applies them.
var migrationFiles = []string{
	"001_outbox.sql", "002_checkpoints.sql", "003_publication.sql", "004_role.sql",
	"005_dead_letters.sql", "006_consumer.sql", "007_outbox_emit.sql",
}

// TestMigrationsRerunQuietly applies every migration twice, as a superuser
// with psql: the first pass says only what it created, the second, which
// changes nothing, prints no NOTICE ("already exists, skipping" is noise an
// operator has to read past to find a real message).
func TestMigrationsRerunQuietly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg := testenv.NewPostgres(t, sandbox.PGOptions{})
	url, err := pg.CreateDatabase(ctx, "rerun_quietly")
	if err != nil {
		t.Fatal(err)
	}
	notice := regexp.MustCompile(`NOTICE: +(.*)`)
	created := regexp.MustCompile(`^created (role|publication) cdc_relay`)
	for pass := 1; pass <= 2; pass++ {
		for _, f := range migrationFiles {
			out, err := psqlRun(ctx, t, url, f, "cdc_relay_password=rerun-Secret-1")
			if err != nil {
				t.Fatalf("pass %d: psql -f migrations/%s: %v\n%s", pass, f, err, out)
			}
			for _, m := range notice.FindAllStringSubmatch(out, -1) {
				if pass == 2 || !created.MatchString(m[1]) {
					t.Errorf("pass %d of migrations/%s printed %q", pass, f, strings.TrimSpace(m[0]))
				}
			}
		}
	}
}

// TestRoleMigrationAsManagedAdmin applies migrations/004_role.sql as a managed
// service's admin: a role with CREATEROLE and REPLICATION but not a superuser
// (Supabase's postgres, Azure's and Cloud SQL's admin users), owning the
// database, which ran 001-003 and 005 itself. With the provider's replication
// role (-v cdc_relay_replication_role=…, rds_replication on RDS, here a role
// the superuser made and gave the admin WITH ADMIN OPTION) the file works on
// every major. Without it, it gives cdc_relay the REPLICATION attribute, which
// from PostgreSQL 16 a CREATEROLE role that has REPLICATION may do (and
// cdc_relay then creates a slot); before 16 only a superuser may, and the
// file stops with an error that names the switch. Each case runs the file
// twice: the second run changes nothing and prints no NOTICE.
func TestRoleMigrationAsManagedAdmin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pg := testenv.NewPostgres(t, sandbox.PGOptions{})
	testenv.RequireLocal(t, pg) // creates cluster-wide roles
	const db = "managed_admin"
	superURL, err := pg.CreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	setup := "CREATE ROLE admin LOGIN CREATEROLE CREATEDB REPLICATION NOSUPERUSER; " +
		"CREATE ROLE provider_replication NOLOGIN; GRANT provider_replication TO admin WITH ADMIN OPTION; " +
		"ALTER DATABASE " + db + " OWNER TO admin"
	if pg.Major() < 15 {
		// What 15 made the default: public belongs to the database owner.
		setup += "; ALTER SCHEMA public OWNER TO admin; REVOKE CREATE ON SCHEMA public FROM PUBLIC"
	}
	if err := pg.Exec(ctx, db, setup); err != nil {
		t.Fatal(err)
	}
	adminURL := withUser(t, superURL, url.User("admin"))
	for _, f := range []string{"001_outbox.sql", "002_checkpoints.sql", "003_publication.sql", "005_dead_letters.sql"} {
		psqlFile(ctx, t, adminURL, f)
	}
	for _, tt := range []struct {
		name     string
		vars     []string
		wantErr  string // "" when the file must succeed
		wantRepl bool   // cdc_relay has the REPLICATION attribute
		member   string // a role cdc_relay must be a member of
	}{
		{
			name:   "provider replication role",
			vars:   []string{"cdc_relay_replication_role=provider_replication"},
			member: "provider_replication",
		},
		{
			name:     "replication attribute",
			wantRepl: pg.Major() >= 16,
			wantErr:  map[bool]string{true: "cdc_relay_replication_role"}[pg.Major() < 16],
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			vars := append([]string{"cdc_relay_password=managed-Secret-7"}, tt.vars...)
			for run := 1; run <= 2; run++ {
				out, err := psqlRun(ctx, t, adminURL, "004_role.sql", vars...)
				if tt.wantErr != "" {
					if err == nil || !strings.Contains(out, tt.wantErr) {
						t.Fatalf("004_role.sql as admin on PostgreSQL %d: err %v, want an error naming %q:\n%s", pg.Major(), err, tt.wantErr, out)
					}
					t.Logf("refused as expected: %s", strings.TrimSpace(out))
					return
				}
				if err != nil {
					t.Fatalf("run %d of 004_role.sql as admin: %v\n%s", run, err, out)
				}
				if run == 2 && strings.Contains(out, "NOTICE") {
					t.Errorf("the second run of 004_role.sql printed a NOTICE:\n%s", out)
				}
			}
			var super, createDB, createRole, repl, login, bypass, member, canConnect, canRead bool
			if err := queryRow(ctx, t, superURL, `SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolcanlogin, rolbypassrls,
				$1 = '' OR pg_has_role('cdc_relay', $1, 'MEMBER'),
				has_database_privilege('cdc_relay', current_database(), 'CONNECT'),
				has_table_privilege('cdc_relay', 'public.outbox_events', 'SELECT')
				FROM pg_roles WHERE rolname = 'cdc_relay'`, []any{tt.member},
				&super, &createDB, &createRole, &repl, &login, &bypass, &member, &canConnect, &canRead); err != nil {
				t.Fatal(err)
			}
			if super || createDB || createRole || bypass || !login || repl != tt.wantRepl || !member || !canConnect || !canRead {
				t.Errorf("cdc_relay: super %v createdb %v createrole %v bypassrls %v login %v replication %v (want %v) member of %q %v connect %v select outbox %v",
					super, createDB, createRole, bypass, login, repl, tt.wantRepl, tt.member, member, canConnect, canRead)
			}
			if tt.wantRepl {
				var slot string
				relayURL := withUser(t, superURL, url.UserPassword("cdc_relay", "managed-Secret-7"))
				if err := queryRow(ctx, t, relayURL, "SELECT slot_name FROM pg_create_logical_replication_slot('managed_admin_slot', 'pgoutput')", nil, &slot); err != nil {
					t.Errorf("cdc_relay creates a logical slot: %v", err)
				}
			}
			// The next case starts without the role.
			if err := pg.Exec(ctx, db, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots; DROP OWNED BY cdc_relay; DROP ROLE cdc_relay"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
