package replication

// What a failed connection attempt says first.

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// meaningfulConnectError returns the server's error among the connection
// attempts in err, if any, and err with the text of its *pgconn.ConnectError
// narrowed to the attempts a person should read, on one line. pgconn tries
// each host, and with sslmode=prefer (pgx's default) each host with TLS and
// then without, and joins every attempt's error on lines of their own: a
// wrong password on a server without TLS reads "server refused TLS
// connection" first. When the server answered an attempt (a
// *pgconn.PgError: authentication failed, database does not exist…), only
// the attempts it answered are kept; otherwise the TLS refusals are dropped
// when another attempt failed for another reason. The original stays in the
// chain for errors.Is and As.
func meaningfulConnectError(err error) (*pgconn.PgError, error) {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) || ce.Config == nil || ce.Unwrap() == nil {
		return nil, err
	}
	var attempts []error
	if joined, ok := ce.Unwrap().(interface{ Unwrap() []error }); ok {
		attempts = joined.Unwrap()
	} else {
		attempts = []error{ce.Unwrap()}
	}
	var answered, other []error
	var server *pgconn.PgError
	for _, a := range attempts {
		var pe *pgconn.PgError
		switch {
		case errors.As(a, &pe):
			if server == nil {
				server = pe
			}
			answered = append(answered, a)
		case !strings.HasSuffix(a.Error(), "server refused TLS connection"):
			other = append(other, a)
		}
	}
	keep := attempts
	if len(answered) > 0 {
		keep = answered
	} else if len(other) > 0 {
		keep = other
	}
	texts := make([]string, len(keep))
	for i, a := range keep {
		texts[i] = strings.ReplaceAll(a.Error(), "\n", " ")
	}
	prefix := fmt.Sprintf("failed to connect to `user=%s database=%s`: ", ce.Config.User, ce.Config.Database)
	narrowed := prefix + strings.Join(texts, "; ")
	msg := strings.Replace(err.Error(), ce.Error(), narrowed, 1)
	if msg == err.Error() {
		return server, err
	}
	return server, &redactedError{msg: msg, err: err}
}

// connectHint says what to check for a connection the server refused with pe.
func connectHint(pe *pgconn.PgError, names setting.Namer) string {
	url := "the Postgres URL " + names.Name("PGURL")
	switch pe.Code {
	case "28P01": // invalid_password
		return "wrong password: check the user and password in " + url + ", or PGPASSWORD / ~/.pgpass when the URL has no password"
	case "28000": // invalid_authorization_specification: no pg_hba.conf line, role missing
		return "the server refused this user: check the user in " + url + " and that the server's pg_hba.conf has a line for it, this database and the relay's address"
	case "3D000": // invalid_catalog_name
		return "the database named in " + url + " does not exist on this server: fix the URL or create the database"
	case "42501": // insufficient_privilege
		// A role without REPLICATION opening the replication connection: "must
		// be superuser or replication role to start walsender" (13-15),
		// "permission denied to start WAL sender" (16+).
		if m := strings.ToLower(pe.Message); strings.Contains(m, "walsender") || strings.Contains(m, "wal sender") {
			return "the user may not open a replication connection: grant it REPLICATION (ALTER ROLE <user> REPLICATION;, see migrations/004_role.sql), or fix the user in " + url
		}
		return "the user may not connect to this database: GRANT CONNECT ON DATABASE <db> TO <user>, or fix the user in " + url
	case "53300": // too_many_connections
		return "the server has no connection slot left: raise max_connections or close idle connections"
	case "57P03": // cannot_connect_now
		return "the server is starting up or shutting down: wait for it"
	}
	return "check " + url
}
