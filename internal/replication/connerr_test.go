package replication

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/setting"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestConnectErrorServerRefusal connects to a real server without TLS, with
// pgx's default sslmode=prefer (a TLS attempt, then a plaintext one), and
// checks that the server's refusal (wrong password, missing database, no
// pg_hba.conf line) is what the error says, on one line, with what to fix,
// and without the TLS attempt's "server refused TLS connection".
func TestConnectErrorServerRefusal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg := testenv.NewPostgres(t, sandbox.PGOptions{HBA: []string{
		"host all pw_user 127.0.0.1/32 scram-sha-256",
		"host all nobody_allowed 127.0.0.1/32 reject",
	}})
	testenv.RequireLocal(t, pg)
	const password = "right-Pass-77"
	if err := pg.Exec(ctx, "postgres", "CREATE ROLE pw_user LOGIN PASSWORD '"+password+"'; CREATE ROLE nobody_allowed LOGIN; CREATE ROLE no_replication LOGIN"); err != nil {
		t.Fatal(err)
	}
	base, err := url.Parse(pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	q := base.Query()
	q.Del("sslmode") // pgx's default: prefer
	base.RawQuery = q.Encode()
	at := func(user *url.Userinfo, db string) string {
		u := *base
		u.User, u.Path = user, "/"+db
		return u.String()
	}
	tests := []struct {
		name, url string
		code      string
		want      []string
	}{
		{"wrong password", at(url.UserPassword("pw_user", "wrong-Pass-13"), "postgres"), "28P01",
			[]string{`password authentication failed for user "pw_user"`, "wrong password: check the user and password in the Postgres URL " + setting.Namer{}.Name("PGURL"), "PGPASSWORD"}},
		{"missing database", at(url.UserPassword("pw_user", password), "no_such_db"), "3D000",
			[]string{`database "no_such_db" does not exist`, "does not exist on this server"}},
		{"pg_hba.conf rejects", at(url.User("nobody_allowed"), "postgres"), "28000",
			[]string{"pg_hba.conf", "check the user in the Postgres URL " + setting.Namer{}.Name("PGURL")}},
		// The relay's replication connection as a role without REPLICATION:
		// 42501 like a missing CONNECT, but CONNECT is not what to grant.
		{"no REPLICATION", replicationURL(t, at(url.User("no_replication"), "postgres")), "42501",
			[]string{"the user may not open a replication connection: grant it REPLICATION (ALTER ROLE <user> REPLICATION;", "migrations/004_role.sql"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, cerr := pgx.Connect(ctx, tt.url)
			if cerr == nil {
				t.Fatal("connected")
			}
			if !strings.Contains(cerr.Error(), "server refused TLS connection") {
				t.Fatalf("pgx's own error lacks the TLS attempt this test is about (is the server's ssl on?): %v", cerr)
			}
			err := ConnectError(tt.url, cerr, setting.Namer{})
			msg := err.Error()
			t.Logf("before: %q\nafter: %s", cerr, msg)
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error lacks %q:\n%s", w, msg)
				}
			}
			if strings.Contains(msg, "refused TLS") || strings.Contains(msg, "\n") {
				t.Errorf("want one line without the TLS attempt:\n%s", msg)
			}
			if strings.Contains(msg, "wrong-Pass") || strings.Contains(msg, password) {
				t.Errorf("error shows a password: %s", msg)
			}
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != tt.code {
				t.Errorf("want the server's %s in the chain, got %v", tt.code, pe)
			}
			var ce *pgconn.ConnectError
			if !errors.As(err, &ce) {
				t.Error("the *pgconn.ConnectError is no longer in the chain")
			}
		})
	}
}

// replicationURL is raw with replication=database, as the relay's
// replication connection opens it.
func replicationURL(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("replication", "database")
	u.RawQuery = q.Encode()
	return u.String()
}
