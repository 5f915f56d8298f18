package sandbox_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// testTimeout bounds each test's work against the real servers.
const testTimeout = 30 * time.Second

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// queryString runs a one-value query on a fresh connection to url.
func queryString(ctx context.Context, t *testing.T, url, sql string) string {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	var s string
	if err := conn.QueryRow(ctx, sql).Scan(&s); err != nil {
		t.Fatalf("query %q: %v", sql, err)
	}
	return s
}

// TestPostgres runs the checks that can share one cluster in sequence.
func TestPostgres(t *testing.T) {
	t.Parallel()
	p := testenv.NewPostgres(t, sandbox.PGOptions{})
	t.Run("settings", func(t *testing.T) { testPostgresSettings(t, p) })
	t.Run("create database replaces", func(t *testing.T) { testPostgresCreateDatabaseReplaces(t, p) })
	t.Run("stop start", func(t *testing.T) { testPostgresStopStart(t, p) })
	t.Run("logical replication survives crash", func(t *testing.T) { testPostgresLogicalReplicationSurvivesCrash(t, p) })
}

func testPostgresSettings(t *testing.T, p *sandbox.Postgres) {
	ctx := testContext(t)
	if got := queryString(ctx, t, p.URL("postgres"), "SHOW wal_level"); got != "logical" {
		t.Errorf("wal_level = %q, want logical", got)
	}
	testenv.RequireLocal(t, p)
	for _, tc := range []struct{ sql, want string }{
		{"SHOW fsync", "off"},
		{"SHOW full_page_writes", "off"},
		{"SHOW max_replication_slots", "20"},
		{"SHOW max_wal_senders", "20"},
		{"SHOW listen_addresses", "127.0.0.1"},
		{"SHOW server_encoding", "UTF8"},
		{"SHOW unix_socket_directories", p.DataDir()},
		{"SELECT current_user", "postgres"},
	} {
		if got := queryString(ctx, t, p.URL("postgres"), tc.sql); got != tc.want {
			t.Errorf("%s = %q, want %q", tc.sql, got, tc.want)
		}
	}
}

func testPostgresLogicalReplicationSurvivesCrash(t *testing.T, p *sandbox.Postgres) {
	ctx := testContext(t)
	url, err := p.CreateDatabase(ctx, "relay_test")
	if err != nil {
		t.Fatal(err)
	}
	if url != p.URL("relay_test") {
		t.Errorf("CreateDatabase URL = %q, want %q", url, p.URL("relay_test"))
	}
	err = p.Exec(ctx, "relay_test", `
		CREATE TABLE outbox (id bigserial PRIMARY KEY, topic text NOT NULL, payload text);
		CREATE PUBLICATION relay_pub FOR TABLE outbox;`)
	if err != nil {
		t.Fatal(err)
	}
	// A multi-statement Exec is one transaction, and a slot must be created
	// in a transaction without writes.
	if err := p.Exec(ctx, "relay_test", "SELECT pg_create_logical_replication_slot('relay_slot', 'pgoutput')"); err != nil {
		t.Fatal(err)
	}

	// pg_hba must let the relay open a replication connection over TCP.
	rconn, err := pgconn.Connect(ctx, url+"&replication=database")
	if err != nil {
		t.Fatalf("open replication connection: %v", err)
	}
	if _, err := rconn.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll(); err != nil {
		t.Errorf("IDENTIFY_SYSTEM: %v", err)
	}
	if err := rconn.Close(ctx); err != nil {
		t.Errorf("close replication connection: %v", err)
	}

	testenv.RequireLocal(t, p)
	port := p.Port()
	if err := p.Restart("immediate"); err != nil {
		t.Fatal(err)
	}
	if p.Port() != port {
		t.Errorf("port after restart = %d, want %d", p.Port(), port)
	}
	if err := p.Exec(ctx, "relay_test", "INSERT INTO outbox (topic, payload) VALUES ($1, $2)", "orders", "hello"); err != nil {
		t.Fatalf("insert after crash restart: %v", err)
	}
	changes := queryString(ctx, t, url, `
		SELECT count(*)::text FROM pg_logical_slot_peek_binary_changes('relay_slot', NULL, NULL,
			'proto_version', '1', 'publication_names', 'relay_pub')`)
	if changes == "0" {
		t.Errorf("slot relay_slot decoded no changes after the crash restart")
	}
}

func testPostgresStopStart(t *testing.T, p *sandbox.Postgres) {
	ctx := testContext(t)
	testenv.RequireLocal(t, p)
	if err := p.Exec(ctx, "postgres", "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"smart", "fast", "immediate"} {
		t.Run(mode, func(t *testing.T) {
			if err := p.Stop(mode); err != nil {
				t.Fatal(err)
			}
			if err := p.Stop(mode); err != nil {
				t.Errorf("second Stop: %v", err)
			}
			if err := p.Exec(ctx, "postgres", "SELECT 1"); err == nil {
				t.Errorf("Exec on a stopped server succeeded")
			}
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			if err := p.Start(); err != nil {
				t.Errorf("second Start: %v", err)
			}
			if got := queryString(ctx, t, p.URL("postgres"), "SELECT v::text FROM kept"); got != "42" {
				t.Errorf("kept row = %q, want 42", got)
			}
		})
	}
	if err := p.Stop("sideways"); err == nil {
		t.Errorf("Stop with an unknown mode succeeded")
	}
}

func testPostgresCreateDatabaseReplaces(t *testing.T, p *sandbox.Postgres) {
	ctx := testContext(t)
	const db = "Mixed-Case db"
	url, err := p.CreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Exec(ctx, db, "CREATE TABLE gone (v int); CREATE PUBLICATION pub FOR ALL TABLES"); err != nil {
		t.Fatal(err)
	}
	// Neither an open session nor a walsender streaming from a slot, as a
	// relay a failed test left running, may stop the drop.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rconn, err := pgconn.Connect(ctx, url+"&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	defer rconn.Close(ctx)
	if _, err := pglogrepl.CreateReplicationSlot(ctx, rconn, "busy", "pgoutput", pglogrepl.CreateReplicationSlotOptions{}); err != nil {
		t.Fatal(err)
	}
	err = pglogrepl.StartReplication(ctx, rconn, "busy", 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'pub'"},
	})
	if err != nil {
		t.Fatal(err)
	}

	if _, err := p.CreateDatabase(ctx, db); err != nil {
		t.Fatal(err)
	}
	if got := queryString(ctx, t, url, "SELECT count(*)::text FROM pg_tables WHERE tablename = 'gone'"); got != "0" {
		t.Errorf("table survived CreateDatabase: count = %s", got)
	}
	if got := queryString(ctx, t, p.URL("postgres"), "SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = 'busy'"); got != "0" {
		t.Errorf("slot survived CreateDatabase: count = %s", got)
	}
}

// TestPostgresWalLevelReplica also shows that one process can run several
// clusters at once.
func TestPostgresWalLevelReplica(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	p := testenv.NewPostgres(t, sandbox.PGOptions{
		WalLevel: "replica",
		Settings: map[string]string{"logical_decoding_work_mem": "64kB", "max_wal_senders": "7"},
	})
	for _, tc := range []struct{ sql, want string }{
		{"SHOW wal_level", "replica"},
		{"SHOW logical_decoding_work_mem", "64kB"},
		{"SHOW max_wal_senders", "7"}, // overrides our default
	} {
		if got := queryString(ctx, t, p.URL("postgres"), tc.sql); got != tc.want {
			t.Errorf("%s = %q, want %q", tc.sql, got, tc.want)
		}
	}
	err := p.Exec(ctx, "postgres", "SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
	if err == nil || !strings.Contains(err.Error(), "wal_level") {
		t.Errorf("create logical slot with wal_level=replica: err = %v, want one naming wal_level", err)
	}
}

func TestPostgresCloseLeavesNothing(t *testing.T) {
	t.Parallel()
	if os.Getenv(sandbox.EnvPGURL) != "" {
		t.Skipf("skip: %s is set", sandbox.EnvPGURL)
	}
	p, err := sandbox.StartPostgres(testContext(t), sandbox.PGOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := p.DataDir()
	if dir == "" || p.External() {
		t.Fatalf("local cluster: DataDir = %q, External = %v", dir, p.External())
	}
	if !hasProcess(t, dir) {
		t.Fatalf("no postgres process for %s while running", dir)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if hasProcess(t, dir) {
		t.Errorf("postgres processes for %s survived Close", dir)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data dir after Close: stat err = %v, want not exist", err)
	}
	if err := p.Start(); err == nil {
		t.Errorf("Start after Close succeeded")
	}
}

// hasProcess reports whether a process has pattern in its command line.
func hasProcess(t *testing.T, pattern string) bool {
	t.Helper()
	err := exec.Command("pgrep", "-f", pattern).Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return true
	case errors.As(err, &exitErr) && exitErr.ExitCode() == 1:
		return false
	default:
		t.Fatalf("pgrep: %v", err)
		return false
	}
}

func TestStartPostgresBadSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		opts    sandbox.PGOptions
		wantErr string
	}{
		{
			name:    "injected line",
			opts:    sandbox.PGOptions{Settings: map[string]string{"x = 1\nfsync": "on"}},
			wantErr: "not a parameter name",
		},
		{
			name:    "hba line break",
			opts:    sandbox.PGOptions{HBA: []string{"host all all 127.0.0.1/32 trust\nhost all all 0.0.0.0/0 trust"}},
			wantErr: "want one non-empty line",
		},
		{
			// The server refuses to start; the error carries its log.
			name:    "bad wal_level",
			opts:    sandbox.PGOptions{WalLevel: "verbose"},
			wantErr: `invalid value for parameter "wal_level"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin, err := sandbox.FindPGBin(testContext(t))
			if err != nil {
				t.Fatal(err)
			}
			_, err = sandbox.StartLocal(testContext(t), bin, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestAttachPostgres uses a local cluster as the "external" server.
func TestAttachPostgres(t *testing.T) {
	ctx := testContext(t)
	local := testenv.NewPostgres(t, sandbox.PGOptions{})
	t.Setenv(sandbox.EnvPGURL, local.URL("postgres"))

	p, err := sandbox.StartPostgres(ctx, sandbox.PGOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !p.External() || p.DataDir() != "" || p.Port() != local.Port() {
		t.Errorf("External = %v, DataDir = %q, Port = %d; want true, \"\", %d", p.External(), p.DataDir(), p.Port(), local.Port())
	}
	if got, want := p.URL("other"), strings.Replace(local.URL("postgres"), "/postgres?", "/other?", 1); got != want {
		t.Errorf("URL(other) = %q, want %q", got, want)
	}
	if _, err := p.CreateDatabase(ctx, "attached"); err != nil {
		t.Errorf("CreateDatabase: %v", err)
	}
	for name, err := range map[string]error{
		"Stop":    p.Stop("fast"),
		"Start":   p.Start(),
		"Restart": p.Restart("fast"),
	} {
		if !errors.Is(err, sandbox.ErrExternal) {
			t.Errorf("%s: err = %v, want sandbox.ErrExternal", name, err)
		}
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}

	for name, opts := range map[string]sandbox.PGOptions{
		"wal_level": {WalLevel: "replica"},
		"settings":  {Settings: map[string]string{"fsync": "on"}},
		"tls":       {TLS: true},
		"hba":       {HBA: []string{"host all all 127.0.0.1/32 trust"}},
	} {
		if _, err := sandbox.StartPostgres(ctx, opts); !errors.Is(err, sandbox.ErrExternal) {
			t.Errorf("%s: err = %v, want sandbox.ErrExternal", name, err)
		}
	}
}

func TestAttachPostgresRedactsPassword(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	port, err := sandbox.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range []string{
		"postgres://u:s3cr3t@127.0.0.1:" + strconv.Itoa(port) + "/db",
		"mysql://u:s3cr3t@127.0.0.1/db",
		"postgres://u:s3cr3t@[bad",
	} {
		_, err := sandbox.AttachPostgres(ctx, raw, sandbox.PGOptions{})
		if err == nil {
			t.Errorf("sandbox.AttachPostgres(%q) succeeded", raw)
			continue
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("error leaks the password: %v", err)
		}
	}
}

// TestPostgresTLS: a cluster with TLS and an extra pg_hba.conf line. Normal
// and logical replication connections verify the server with CAFile
// (verify-full on "localhost") and are encrypted; a client trusting only
// UntrustedCAFile refuses the server; plaintext URL connections still work;
// the HBA line comes first, so its role needs its password.
func TestPostgresTLS(t *testing.T) {
	t.Parallel()
	p := testenv.NewPostgres(t, sandbox.PGOptions{TLS: true, HBA: []string{"host all pw_user 127.0.0.1/32 scram-sha-256"}})
	ctx := testContext(t)
	tlsURL := p.TLSURL("postgres")
	if tlsURL == "" || p.CAFile() == "" || p.UntrustedCAFile() == "" || p.CAFile() == p.UntrustedCAFile() {
		t.Fatalf("TLSURL %q, CAFile %q, UntrustedCAFile %q: want a URL and two CA files", tlsURL, p.CAFile(), p.UntrustedCAFile())
	}
	for _, want := range []string{"@localhost:", "sslmode=verify-full", "sslrootcert="} {
		if !strings.Contains(tlsURL, want) {
			t.Errorf("TLSURL = %q, want it to contain %q", tlsURL, want)
		}
	}
	const sslSQL = "SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()"

	if got := queryString(ctx, t, tlsURL, sslSQL); got != "true" {
		t.Errorf("verify-full connection: pg_stat_ssl.ssl = %s, want true", got)
	}
	if got := queryString(ctx, t, p.URL("postgres"), sslSQL); got != "false" {
		t.Errorf("URL (sslmode=disable) connection: pg_stat_ssl.ssl = %s, want false", got)
	}

	// A logical replication connection (replication=database) over TLS.
	cfg, err := pgconn.ParseConfig(tlsURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	repl, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("replication connection over TLS: %v", err)
	}
	if _, err := pglogrepl.IdentifySystem(ctx, repl); err != nil {
		t.Errorf("IDENTIFY_SYSTEM over TLS: %v", err)
	}
	res, err := repl.Exec(ctx, sslSQL).ReadAll()
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "true" {
		t.Errorf("replication connection: pg_stat_ssl = %v (%v), want ssl true", res, err)
	}
	if err := repl.Close(ctx); err != nil {
		t.Error(err)
	}

	// Trusting another CA, the client refuses the server.
	untrusted := strings.Replace(tlsURL, url.QueryEscape(p.CAFile()), url.QueryEscape(p.UntrustedCAFile()), 1)
	if untrusted == tlsURL {
		t.Fatalf("could not swap the CA in %q", tlsURL)
	}
	if conn, err := pgx.Connect(ctx, untrusted); err == nil {
		conn.Close(ctx)
		t.Error("connection trusting the untrusted CA succeeded")
	} else if !strings.Contains(err.Error(), "certificate") {
		t.Errorf("untrusted CA: err = %v, want a certificate error", err)
	}

	// The HBA line: pw_user must give its password, over TLS or not.
	if err := p.Exec(ctx, "postgres", "CREATE ROLE pw_user LOGIN PASSWORD 'pw-secret'"); err != nil {
		t.Fatal(err)
	}
	for _, base := range []string{p.URL("postgres"), tlsURL} {
		u, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.User("pw_user")
		if conn, err := pgx.Connect(ctx, u.String()); err == nil {
			conn.Close(ctx)
			t.Errorf("pw_user connected without its password (%s)", u.Query().Get("sslmode"))
		}
		u.User = url.UserPassword("pw_user", "pw-secret")
		if got := queryString(ctx, t, u.String(), "SELECT current_user"); got != "pw_user" {
			t.Errorf("current_user = %q, want pw_user", got)
		}
	}

	// The files survive a restart.
	testenv.RequireLocal(t, p)
	if err := p.Restart("fast"); err != nil {
		t.Fatal(err)
	}
	if got := queryString(ctx, t, tlsURL, sslSQL); got != "true" {
		t.Errorf("after restart: pg_stat_ssl.ssl = %s, want true", got)
	}
}

// TestPostgresWithoutTLS: the default cluster has TLS off and no TLS URL.
func TestPostgresWithoutTLS(t *testing.T) {
	t.Parallel()
	p := testenv.NewPostgres(t, sandbox.PGOptions{})
	if p.TLSURL("postgres") != "" || p.CAFile() != "" || p.UntrustedCAFile() != "" {
		t.Errorf("TLSURL %q, CAFile %q, UntrustedCAFile %q: want all empty", p.TLSURL("postgres"), p.CAFile(), p.UntrustedCAFile())
	}
	testenv.RequireLocal(t, p) // an external server may well have TLS on
	ctx := testContext(t)
	if got := queryString(ctx, t, p.URL("postgres"), "SHOW ssl"); got != "off" {
		t.Errorf("ssl = %q, want off", got)
	}
}

// symlinkFarm makes a directory under parent holding symlinks named initdb,
// pg_ctl and postgres to those in target.
func symlinkFarm(t *testing.T, parent, target string) string {
	t.Helper()
	dir := filepath.Join(parent, "bin")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range sandbox.PGServerBinaries {
		if err := os.Symlink(filepath.Join(target, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestStartPostgresFromEnvBinDir starts a real cluster from binaries named
// only by CDC_RELAY_PG_BINDIR: a symlink farm to the default binaries, in a
// directory no other lookup step would find.
func TestStartPostgresFromEnvBinDir(t *testing.T) {
	ctx := testContext(t)
	def, err := sandbox.FindPGBin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir: as root the cluster runs as postgres, which must reach it.
	parent, err := os.MkdirTemp("", "cdc-relay-pgbin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	farm := symlinkFarm(t, parent, def.Dir)
	t.Setenv(sandbox.EnvPGBinDir, farm)
	t.Setenv(sandbox.EnvPGURL, "")

	p := testenv.NewPostgres(t, sandbox.PGOptions{})
	if got := p.Bin(); got.Dir != farm || got.Source != sandbox.EnvPGBinDir {
		t.Errorf("Bin() = %+v, want Dir %s via %s", got, farm, sandbox.EnvPGBinDir)
	}
	if !strings.Contains(p.Describe(), farm) {
		t.Errorf("Describe() = %q, want it to name %s", p.Describe(), farm)
	}
	version := queryString(ctx, t, p.URL("postgres"), "SHOW server_version")
	num, err := strconv.Atoi(queryString(ctx, t, p.URL("postgres"), "SHOW server_version_num"))
	if err != nil {
		t.Fatal(err)
	}
	// server_version may add a suffix: "15.14 (Debian 15.14-0+deb12u1)".
	if !strings.HasPrefix(version, p.Version()) || p.Major() != num/10000 {
		t.Errorf("Version() = %q, Major() = %d; server says server_version %q, server_version_num %d", p.Version(), p.Major(), version, num)
	}
}

// TestFindPGBinUnreachableByServerUser: as root the server runs as the
// postgres OS user, which cannot enter t.TempDir (0700, root's). Binaries
// there must be refused up front with the fix, not fail later inside initdb.
func TestFindPGBinUnreachableByServerUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skip: only root runs the server as another OS user")
	}
	ctx := testContext(t)
	def, err := sandbox.FindPGBin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	farm := symlinkFarm(t, t.TempDir(), def.Dir)
	t.Setenv(sandbox.EnvPGBinDir, farm)
	_, err = sandbox.FindPGBin(ctx)
	if err == nil || !strings.Contains(err.Error(), "the postgres user must be able to read and execute "+farm) {
		t.Errorf("err = %v, want the permission fix for %s", err, farm)
	}
}

// envExpectPGMajor names the environment variable the version matrix
// (.ci/pg-matrix, make test-pg-versions) sets to the major it means to test,
// beside CDC_RELAY_PG_BINDIR.
const envExpectPGMajor = "CDC_RELAY_EXPECT_PG_MAJOR"

// TestServerMajorIsTheMatrixMajor makes the version matrix real: the server
// the tests start reports, in server_version_num, the major the matrix asked
// for. Were the bin dir lost on the way (a wrapper that drops the
// environment, a lookup that falls back to Debian's 15, a
// CDC_RELAY_TEST_PG_URL left set), every version's run would silently test
// 15 and pass; this test fails it instead. Outside the matrix it checks that
// Major() is what the server says.
func TestServerMajorIsTheMatrixMajor(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	p := testenv.NewPostgres(t, sandbox.PGOptions{})
	num, err := strconv.Atoi(queryString(ctx, t, p.URL("postgres"), "SHOW server_version_num"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Major() != num/10000 {
		t.Errorf("Major() = %d, server_version_num %d", p.Major(), num)
	}
	raw := os.Getenv(envExpectPGMajor)
	if raw == "" {
		t.Logf("%s unset: the server is PostgreSQL %d (%s)", envExpectPGMajor, num/10000, p.Describe())
		return
	}
	want, err := strconv.Atoi(raw)
	if err != nil {
		t.Fatalf("%s=%q: not a major version", envExpectPGMajor, raw)
	}
	if num/10000 != want {
		t.Fatalf("the server is PostgreSQL %d (server_version_num %d, %s), the matrix asked for %d (%s=%s, %s=%q)",
			num/10000, num, p.Describe(), want, envExpectPGMajor, raw, sandbox.EnvPGBinDir, os.Getenv(sandbox.EnvPGBinDir))
	}
}
