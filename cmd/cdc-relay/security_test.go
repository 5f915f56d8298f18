package main

// Security claims, checked with the built binary: the relay verifies Postgres'
// certificate (sslmode=verify-full) and really encrypts every connection it
// opens; and it runs end to end as the least-privilege role of
// migrations/004_role.sql, which cannot do more than the relay needs.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/status"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestPostgresVerifyFull: with sslmode=verify-full against the test CA the
// relay delivers events, its replication connection and its pool connections
// are TLS (pg_stat_ssl), and status and replay work too; trusting another CA,
// run and status refuse the server at start with an error that names the
// certificate problem and not the password.
func TestPostgresVerifyFull(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg := testenv.NewPostgres(t, sandbox.PGOptions{TLS: true})
	f := newFixture(t, pg, t.Name(), true)
	const (
		appName  = "cdc-relay-tls-test"
		password = "tls-test-Secret-9c1"
	)
	// Trust authentication ignores the password; it is there to check that no
	// message shows it.
	goodURL := withPassword(t, pg.TLSURL(f.db), password, "application_name", appName)
	badURL := withPassword(t, pg.TLSURL(f.db), password, "sslrootcert", pg.UntrustedCAFile())

	t.Run("untrusted CA", func(t *testing.T) {
		for _, args := range [][]string{
			{"run", "--pg-url", badURL, "--kafka-brokers", strings.Join(f.brokers, ","), "--topic", f.topic,
				"--slot", f.slot, "--metrics-addr", "127.0.0.1:0", "--log-format", "json"},
			{"status", "--pg-url", badURL, "--slot", f.slot},
		} {
			code, stdout, stderr := runCommand(ctx, t, 20*time.Second, args...)
			out := stdout + stderr
			if code == 0 {
				t.Errorf("%s with an untrusted CA exited 0:\n%s", args[0], out)
			}
			if !strings.Contains(out, "failed to verify certificate") {
				t.Errorf("%s: output does not name the certificate problem:\n%s", args[0], out)
			}
			if strings.Contains(out, password) {
				t.Errorf("%s: output shows the password:\n%s", args[0], out)
			}
			t.Logf("%s trusting another CA: exit %d: %s", args[0], code, strings.TrimSpace(stderr))
		}
		if exists := slotExists(ctx, t, f.url, f.slot); exists {
			t.Error("the refused relay created its slot")
		}
	})

	r := newRelay(t, withFlag(f.relayArgs(), "--pg-url", goodURL))
	r.Start()
	r.WaitReady(30 * time.Second)
	want := insertEvents(ctx, t, f.url, 20)
	f.waitRecords(ctx, t, len(want), 30*time.Second)
	if got := sandbox.IDs(f.read(ctx, t)); !slices.Equal(got, want) {
		t.Errorf("event ids in Kafka %v, want %v", got, want)
	}

	// Every connection the relay holds is encrypted: the walsender of its
	// replication connection and the regular sessions of its pool.
	conns := sslConnections(ctx, t, f.url, appName)
	kinds := map[string]bool{}
	for _, c := range conns {
		kinds[c.backendType] = true
		if !c.ssl || c.version == "" {
			t.Errorf("relay connection %+v is not TLS", c)
		}
	}
	if !kinds["walsender"] || !kinds["client backend"] {
		t.Errorf("relay connections %+v: want a walsender and at least one client backend", conns)
	}
	if strings.Contains(r.Logs(), password) {
		t.Errorf("relay log shows the password")
	}

	// status and replay over verify-full (that status verifies the certificate
	// too shows in the untrusted-CA case above). The relay stores its
	// checkpoint up to --status-interval after Kafka acknowledged the events,
	// so status is asked until it shows one.
	testenv.Eventually(t, 30*time.Second, func() error {
		code, stdout, stderr := runCommand(ctx, t, 20*time.Second, "status", "--pg-url", goodURL, "--slot", f.slot, "--json")
		var st status.Report
		if code != 0 || json.Unmarshal([]byte(stdout), &st) != nil || !st.SlotExists || !st.Active || st.Checkpoint == nil {
			return fmt.Errorf("status over verify-full: exit %d, %+v; want exit 0, an active slot and a checkpoint\n%s%s", code, st, stdout, stderr)
		}
		return nil
	})

	replayTopic := f.topic + ".replay"
	code, stdout, stderr := runCommand(ctx, t, 20*time.Second, "replay", "--pg-url", goodURL,
		"--kafka-brokers", strings.Join(f.brokers, ","), "--topic", replayTopic, "--since", "1h", "--rate", "0", "--actor", "tls-test")
	if code != 0 || !strings.Contains(stdout, "published 20") {
		t.Errorf("replay over verify-full: exit %d\n%s%s", code, stdout, stderr)
	}
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	replayed, err := sandbox.WaitForRecords(rctx, f.brokers, len(want), replayTopic)
	if err != nil {
		t.Fatalf("wait for replayed records: %v", err)
	}
	if got := sandbox.IDs(replayed); !slices.Equal(got, want) {
		t.Errorf("replayed event ids %v, want %v", got, want)
	}
	r.Stop(15 * time.Second)
}

// TestLeastPrivilegeRole applies the migrations the way docs/postgres.md's production
// setup does (the owner "app" runs 001-003 and 005, a superuser runs 004 with
// psql and a password), then runs the relay as cdc_relay, logging in with that
// password: it creates its slot, delivers events, stores its checkpoint,
// dead-letters a poison event, and status works; cdc_relay cannot write the
// outbox, create tables or publications, or delete checkpoints.
func TestLeastPrivilegeRole(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// cdc_relay logs in with its password (scram), everyone else with trust.
	pg := testenv.NewPostgres(t, sandbox.PGOptions{HBA: []string{"host all cdc_relay 127.0.0.1/32 scram-sha-256"}})
	const (
		db       = "least_privilege"
		slot     = "lp_slot"
		topic    = "outbox.e2e.least_privilege"
		password = "lp-Secret-4b7e"
	)
	adminURL, err := pg.CreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, db, "CREATE ROLE app LOGIN; ALTER DATABASE "+db+" OWNER TO app"); err != nil {
		t.Fatal(err)
	}
	if pg.Major() < 15 {
		// What 15 made the default: public belongs to the database owner, and
		// other roles may not create in it (004_role.sql tells to revoke it).
		if err := pg.Exec(ctx, db, "ALTER SCHEMA public OWNER TO app; REVOKE CREATE ON SCHEMA public FROM PUBLIC"); err != nil {
			t.Fatal(err)
		}
	}
	appURL := withUser(t, adminURL, url.User("app"))
	relayURL := withUser(t, adminURL, url.UserPassword("cdc_relay", password))
	for _, m := range []struct{ file, url string }{
		{"001_outbox.sql", appURL},
		{"002_checkpoints.sql", appURL},
		{"003_publication.sql", appURL},
		{"004_role.sql", adminURL},
		{"005_dead_letters.sql", appURL},
	} {
		psqlFile(ctx, t, m.url, m.file, "cdc_relay_password="+password)
	}
	var super, createDB, createRole, replication, login bool
	if err := queryRow(ctx, t, adminURL, "SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolcanlogin FROM pg_roles WHERE rolname = 'cdc_relay'", nil,
		&super, &createDB, &createRole, &replication, &login); err != nil {
		t.Fatal(err)
	}
	if super || createDB || createRole || !replication || !login {
		t.Errorf("cdc_relay: super %v createdb %v createrole %v replication %v login %v; want LOGIN REPLICATION only",
			super, createDB, createRole, replication, login)
	}

	k := testenv.NewKafka(t, sandbox.KafkaOptions{Partitions: 4})
	brokers := strings.Join(k.Brokers(), ",")
	r := newRelay(t, []string{"run", "--pg-url", relayURL, "--kafka-brokers", brokers, "--topic", topic,
		"--slot", slot, "--no-create-publication", "--relay-name", "lp-relay", "--log-format", "json",
		"--status-interval", "200ms", "--retry-cap", "1s", "--heartbeat-interval", "200ms"})
	r.Start()
	r.WaitReady(30 * time.Second)
	if !r.HasLog("created replication slot") {
		t.Error("the relay did not report creating its slot")
	}
	var holder string
	if err := queryRow(ctx, t, adminURL, `SELECT a.usename FROM pg_replication_slots s
		JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = $1`, []any{slot}, &holder); err != nil {
		t.Fatalf("read the slot's walsender: %v", err)
	}
	if holder != "cdc_relay" {
		t.Errorf("slot %s is streamed by %q, want cdc_relay", slot, holder)
	}

	// The application (the owner) writes: events, a poison event larger than
	// the broker accepts, and one more after it.
	want := insertEvents(ctx, t, appURL, 5)
	var bigID string
	if err := queryRow(ctx, t, appURL, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', 'o-big', 'Huge', jsonb_build_object('pad', repeat('x', 2*1024*1024))) RETURNING id::text`, nil, &bigID); err != nil {
		t.Fatal(err)
	}
	var bigEnd string // at or after the end of the poison event's transaction
	if err := queryRow(ctx, t, adminURL, "SELECT pg_current_wal_lsn()::text", nil, &bigEnd); err != nil {
		t.Fatal(err)
	}
	want = append(want, insertEvents(ctx, t, appURL, 1)...)

	// The dead letter, stored by cdc_relay.
	var code, relayName string
	testenv.Eventually(t, 20*time.Second, func() error {
		err := queryRow(ctx, t, adminURL, "SELECT error_code, relay_name FROM cdc_relay_dead_letters WHERE event_id = $1",
			[]any{bigID}, &code, &relayName)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("dead letter of the poison event %s: %v", bigID, err)
		}
		if err != nil {
			return fmt.Errorf("dead letter of the poison event %s: %w", bigID, err)
		}
		return nil
	})
	if code != "message_too_large" || relayName != "lp-relay" {
		t.Errorf("dead letter: code %q relay %q, want message_too_large by lp-relay", code, relayName)
	}

	// One more event once the dead letter is stored: the relay saves a
	// checkpoint advance with no newly read transaction only every 10 s (an
	// idle advance), and the advance past the dead letter can look like one.
	want = append(want, insertEvents(ctx, t, appURL, 1)...)
	slices.Sort(want)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	recs, err := sandbox.WaitForRecords(wctx, k.Brokers(), len(want), topic)
	if err != nil {
		t.Fatalf("wait for records: %v", err)
	}
	if got := sandbox.IDs(recs); !slices.Equal(got, want) {
		t.Errorf("event ids in Kafka %v, want %v (and not the poison %s)", got, want, bigID)
	}

	// The checkpoint, stored by cdc_relay, past the dead-lettered event.
	testenv.Eventually(t, 20*time.Second, func() error {
		var past bool
		err := queryRow(ctx, t, adminURL, `SELECT lsn >= $2::pg_lsn FROM cdc_relay_checkpoints
			WHERE slot_name = $1 AND relay_name = 'lp-relay'`, []any{slot, bigEnd}, &past)
		if err != nil || !past {
			return fmt.Errorf("checkpoint of %s not stored past the poison event's transaction (%s): past %v, %v", slot, bigEnd, past, err)
		}
		return nil
	})

	// Heartbeats (pg_logical_emit_message), as cdc_relay: some succeed (the
	// first one a --heartbeat-interval after the start), none fails.
	testenv.Eventually(t, 20*time.Second, func() error {
		if ok := r.Metric(`cdc_relay_heartbeats_total{result="ok"}`); ok < 1 {
			return fmt.Errorf("heartbeats as cdc_relay: %v ok; want some", ok)
		}
		return nil
	})
	if failed := r.Metric(`cdc_relay_heartbeats_total{result="error"}`); failed != 0 {
		t.Errorf("heartbeats as cdc_relay: %v failed; want none", failed)
	}

	// status, as cdc_relay.
	exit, stdout, stderr := runCommand(ctx, t, 20*time.Second, "status", "--pg-url", relayURL, "--slot", slot, "--json")
	var st status.Report
	if exit != 0 || json.Unmarshal([]byte(stdout), &st) != nil || !st.SlotExists || st.Checkpoint == nil ||
		st.DeadLetters == nil || st.DeadLetters.Pending != 1 {
		t.Errorf("status as cdc_relay: exit %d, %+v; want exit 0, the slot, a checkpoint, one pending dead letter\n%s%s", exit, st, stdout, stderr)
	}
	if out := r.Logs() + stdout + stderr; strings.Contains(out, password) {
		t.Error("the relay or status printed cdc_relay's password")
	}

	// What cdc_relay must not do.
	conn, err := pgx.Connect(ctx, relayURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, sql := range []string{
		"DELETE FROM public.outbox_events",
		"UPDATE public.outbox_events SET event_type = 'x'",
		"INSERT INTO public.outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('x', 'x', 'x', '{}')",
		"TRUNCATE public.outbox_events",
		"DELETE FROM public.cdc_relay_checkpoints",
		"CREATE TABLE public.lp_probe (i int)",
		"CREATE PUBLICATION lp_probe FOR TABLE public.outbox_events",
		"ALTER PUBLICATION cdc_relay_outbox ADD TABLE public.cdc_relay_checkpoints",
	} {
		_, err := conn.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" { // insufficient_privilege
			t.Errorf("as cdc_relay, %s: err = %v, want permission denied (42501)", sql, err)
		}
	}
	r.Stop(15 * time.Second)
}

// runCommand runs the binary with args and returns its exit code, stdout and
// stderr; it fails t when the binary does not finish within timeout.
func runCommand(ctx context.Context, t *testing.T, timeout time.Duration, args ...string) (int, string, string) {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, relayBin, args...)
	cmd.Env = cleanEnv()
	var stdout, stderr sandbox.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if cctx.Err() != nil {
		t.Fatalf("cdc-relay %s did not finish within %v:\n%s%s", args[0], timeout, stdout.String(), stderr.String())
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatalf("run cdc-relay %s: %v", args[0], err)
	return 0, "", ""
}

// psqlFile runs migrations/<file> with psql on url, stopping at the first
// error, with the psql variables vars (name=value).
func psqlFile(ctx context.Context, t *testing.T, dbURL, file string, vars ...string) {
	t.Helper()
	if out, err := psqlRun(ctx, t, dbURL, file, vars...); err != nil {
		t.Fatalf("psql -f migrations/%s: %v\n%s", file, err, out)
	}
}

// psqlRun runs migrations/<file> as psqlFile does and returns what psql
// printed (stdout and stderr, where its NOTICEs go) and its error.
func psqlRun(ctx context.Context, t *testing.T, dbURL, file string, vars ...string) (string, error) {
	t.Helper()
	args := []string{"-X", "-q", "-v", "ON_ERROR_STOP=1"}
	for _, v := range vars {
		args = append(args, "-v", v)
	}
	args = append(args, "-d", dbURL, "-f", filepath.Join("..", "..", "migrations", file))
	psql, err := sandbox.PGClient(ctx, "psql")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, psql, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// queryRow runs sql with args on a fresh connection to dbURL and scans the
// row into dest.
func queryRow(ctx context.Context, t *testing.T, dbURL, sql string, args []any, dest ...any) error {
	t.Helper()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// insertEvents commits n outbox events, one transaction each, on dbURL and
// returns their ids, sorted.
func insertEvents(ctx context.Context, t *testing.T, dbURL string, n int) []string {
	t.Helper()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	var ids []string
	for i := range n {
		var id string
		if err := conn.QueryRow(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', 'o-' || $1::int % 3, 'Placed', jsonb_build_object('seq', $1::int)) RETURNING id::text`, i).Scan(&id); err != nil {
			t.Fatalf("insert event: %v", err)
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// sslConn is one server session and its pg_stat_ssl row.
type sslConn struct {
	pid         int32
	backendType string
	ssl         bool
	version     string
}

// sslConnections returns the sessions whose application_name is appName.
func sslConnections(ctx context.Context, t *testing.T, dbURL, appName string) []sslConn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT a.pid, a.backend_type, s.ssl, coalesce(s.version, '')
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
		WHERE a.application_name = $1 ORDER BY a.pid`, appName)
	if err != nil {
		t.Fatalf("query pg_stat_ssl: %v", err)
	}
	var out []sslConn
	for rows.Next() {
		var c sslConn
		if err := rows.Scan(&c.pid, &c.backendType, &c.ssl, &c.version); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// slotExists reports whether the replication slot exists.
func slotExists(ctx context.Context, t *testing.T, dbURL, slot string) bool {
	t.Helper()
	var exists bool
	if err := queryRow(ctx, t, dbURL, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", []any{slot}, &exists); err != nil {
		t.Fatal(err)
	}
	return exists
}

// withPassword returns rawURL with password set for its user and the query
// parameters kv (name, value, ...) set.
func withPassword(t *testing.T, rawURL, password string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), password)
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// withUser returns rawURL with its user information replaced.
func withUser(t *testing.T, rawURL string, user *url.Userinfo) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = user
	return u.String()
}

// withFlag returns args with the value after flag replaced by value.
func withFlag(args []string, flag, value string) []string {
	out := slices.Clone(args)
	for i := range out[:len(out)-1] {
		if out[i] == flag {
			out[i+1] = value
		}
	}
	return out
}
