package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// EnvPGURL names the environment variable that, when set, makes
	// StartPostgres and NewPostgres wrap an existing server instead of
	// starting one. Its value is a URL of a superuser on a server with
	// wal_level=logical, e.g. postgres://postgres:secret@db:5432/postgres.
	EnvPGURL = "CDC_RELAY_TEST_PG_URL"
)

// pgStartAttempts is how many free ports StartPostgres tries when another
// process takes the chosen port between FreePort and the server's bind.
const pgStartAttempts = 3

// pgCtlTimeout bounds how long pg_ctl waits for the server to start or stop.
const pgCtlTimeout = 60 * time.Second

// pgLogTailLines is how many lines of the server log errors include.
const pgLogTailLines = 20

// settingName is what a postgresql.conf parameter name may look like; it
// keeps caller-provided settings from injecting other configuration lines.
var settingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*$`)

// PGOptions configures a PostgreSQL cluster started by StartPostgres.
type PGOptions struct {
	// WalLevel is the server's wal_level; "" means "logical". Tests of the
	// relay's configuration checks use "replica".
	WalLevel string

	// Settings are extra postgresql.conf parameters, e.g.
	// {"logical_decoding_work_mem": "64kB"}. They are applied after this
	// package's defaults, so they may override them.
	Settings map[string]string

	// TLS turns on TLS (ssl=on) with a server certificate for "localhost",
	// 127.0.0.1 and ::1, signed by a CA generated for this cluster, and puts
	// "hostssl" lines for 127.0.0.1 at the top of pg_hba.conf (they match
	// normal and logical replication connections alike). Clients verify the
	// server with CAFile (TLSURL has sslmode=verify-full); UntrustedCAFile is
	// an unrelated CA for tests of the refusal. Plaintext connections still
	// work: URL keeps sslmode=disable.
	TLS bool

	// HBA are extra pg_hba.conf lines, placed before every other line so
	// they win (the first matching line decides), e.g.
	// "host all cdc_relay 127.0.0.1/32 scram-sha-256" to make one role log
	// in with its password while the others keep trust authentication.
	HBA []string
}

// Postgres is a PostgreSQL server for tests: either a throwaway cluster this
// package initialised in a temporary directory, or an existing server named by
// CDC_RELAY_TEST_PG_URL (External reports which). Its methods are safe for
// concurrent use.
type Postgres struct {
	// Set once by StartPostgres or AttachPostgres.
	external *url.URL    // nil for a local cluster
	user     *serverUser // nil: run binaries as the current user
	bin      PGBin       // zero for an external server
	version  string      // server_version, e.g. "15.14"
	major    int         // server_version_num / 10000
	rootDir  string      // temporary directory holding dataDir and logFile
	dataDir  string
	logFile  string
	port     int
	tls      pgTLS // zero without PGOptions.TLS

	mu      sync.Mutex // guards running and closed, serialises pg_ctl
	running bool
	closed  bool
}

// StartPostgres initialises a new PostgreSQL cluster in a temporary
// directory, with the server binaries FindPGBin finds (Bin says which), and
// starts it on a free port of 127.0.0.1, with wal_level=logical
// (or opts.WalLevel), trust authentication for the user "postgres" and
// durability switched off for speed. Call Close to stop it and delete its
// files.
//
// If CDC_RELAY_TEST_PG_URL is set, StartPostgres calls AttachPostgres with it
// instead.
func StartPostgres(ctx context.Context, opts PGOptions) (*Postgres, error) {
	if raw := os.Getenv(EnvPGURL); raw != "" {
		return AttachPostgres(ctx, raw, opts)
	}
	bin, err := FindPGBin(ctx)
	if err != nil {
		return nil, err
	}
	return startLocal(ctx, bin, opts)
}

// startLocal is StartPostgres with the binaries bin.
func startLocal(ctx context.Context, bin PGBin, opts PGOptions) (*Postgres, error) {
	walLevel := opts.WalLevel
	if walLevel == "" {
		walLevel = "logical"
	}
	conf, err := pgConf(walLevel, opts.Settings)
	if err != nil {
		return nil, err
	}
	if err := checkHBA(opts.HBA); err != nil {
		return nil, err
	}
	if missing := missingServerBinaries(bin.Dir); len(missing) > 0 {
		return nil, fmt.Errorf("start postgres: %s has no %s", bin.Dir, strings.Join(missing, ", "))
	}
	user, err := lookupServerUser()
	if err != nil {
		return nil, err
	}
	// Not t.TempDir: its parents are 0700 and root-owned, so the postgres OS
	// user could not reach the data directory.
	root, err := os.MkdirTemp(os.TempDir(), "cdc-relay-pg-")
	if err != nil {
		return nil, fmt.Errorf("create postgres temp dir: %w", err)
	}
	p := &Postgres{
		user:    user,
		bin:     bin,
		version: bin.Version,
		major:   bin.Major,
		rootDir: root,
		dataDir: filepath.Join(root, "data"),
		logFile: filepath.Join(root, "postgres.log"),
	}
	if err := p.initAndStart(ctx, conf, opts); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	return p, nil
}

// initAndStart runs initdb, writes the configuration (and with opts.TLS the
// certificates) and starts the server, retrying with another port if the
// chosen one was taken meanwhile.
func (p *Postgres) initAndStart(ctx context.Context, conf string, opts PGOptions) error {
	if err := p.user.chown(p.rootDir); err != nil {
		return err
	}
	args := []string{"-D", p.dataDir, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C"}
	if p.major >= 14 { // initdb 13 has no --no-instructions
		args = append(args, "--no-instructions")
	}
	out, err := p.run(ctx, "initdb", args...)
	if err != nil {
		return fmt.Errorf("run initdb: %w\n%s", err, out)
	}
	if opts.TLS {
		if p.tls, err = writePGTLS(p.rootDir, p.user); err != nil {
			return err
		}
		// Before conf, so opts.Settings may still override these.
		conf = "\n# cdc-relay sandbox: PGOptions.TLS\n" +
			"ssl = on\n" +
			"ssl_cert_file = " + confQuote(p.tls.server.ServerCert) + "\n" +
			"ssl_key_file = " + confQuote(p.tls.server.ServerKey) + "\n" + conf
	}
	conf += "unix_socket_directories = " + confQuote(p.dataDir) + "\n"
	if err := appendFile(filepath.Join(p.dataDir, "postgresql.conf"), conf); err != nil {
		return err
	}
	if err := writeHBA(filepath.Join(p.dataDir, "pg_hba.conf"), opts); err != nil {
		return err
	}

	return p.startOnFreePort(ctx)
}

// startOnFreePort starts the cluster on a free port, retrying with another
// when the chosen one was taken meanwhile.
func (p *Postgres) startOnFreePort(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return err
		}
		// A later "port" line overrides an earlier one from a failed attempt.
		if err := appendFile(filepath.Join(p.dataDir, "postgresql.conf"), fmt.Sprintf("port = %d\n", port)); err != nil {
			return err
		}
		p.port = port
		err = p.startLocked(ctx)
		if err == nil {
			return nil
		}
		if attempt == pgStartAttempts || !strings.Contains(p.logTail(), "could not bind") {
			return err
		}
	}
}

// pgConf renders the postgresql.conf lines for a local cluster, without port,
// socket directory and TLS files.
func pgConf(walLevel string, settings map[string]string) (string, error) {
	var b strings.Builder
	b.WriteString("\n# cdc-relay sandbox\n")
	b.WriteString("listen_addresses = '127.0.0.1'\n")
	b.WriteString("wal_level = " + confQuote(walLevel) + "\n")
	b.WriteString("max_wal_senders = 20\n")
	b.WriteString("max_replication_slots = 20\n")
	b.WriteString("fsync = off\n")
	b.WriteString("full_page_writes = off\n")
	// The default from PostgreSQL 14; 13 stores md5 hashes, which the
	// "scram-sha-256" lines of PGOptions.HBA then refuse.
	b.WriteString("password_encryption = 'scram-sha-256'\n")
	for _, name := range slices.Sorted(maps.Keys(settings)) {
		if !settingName.MatchString(name) {
			return "", fmt.Errorf("validate postgres setting %q: not a parameter name", name)
		}
		b.WriteString(name + " = " + confQuote(settings[name]) + "\n")
	}
	return b.String(), nil
}

// pgTLS are the certificate files of a cluster started with PGOptions.TLS.
type pgTLS struct {
	server    TLSFiles // the CA and the server certificate the cluster presents
	untrusted TLSFiles // another CA, which signed nothing the cluster presents
}

// writePGTLS writes the certificates of a TLS cluster under root: two
// unrelated CAs (WriteTLSFiles), the server's certificate and key of the
// first given to the server's OS user, as the server requires of its key
// (mode 0600, owned by the user it runs as).
func writePGTLS(root string, user *serverUser) (pgTLS, error) {
	var t pgTLS
	for _, d := range []struct {
		files *TLSFiles
		dir   string
	}{{&t.server, "tls"}, {&t.untrusted, "tls-untrusted"}} {
		dir := filepath.Join(root, d.dir)
		// 0755: the server's OS user must reach its files in here.
		if err := os.Mkdir(dir, 0o755); err != nil {
			return t, fmt.Errorf("create tls dir: %w", err)
		}
		files, err := WriteTLSFiles(dir)
		if err != nil {
			return t, err
		}
		*d.files = files
	}
	for _, f := range []string{t.server.ServerCert, t.server.ServerKey} {
		if err := user.chown(f); err != nil {
			return t, err
		}
	}
	return t, nil
}

// checkHBA validates PGOptions.HBA: one non-empty line each, so a caller
// cannot slip in other lines.
func checkHBA(lines []string) error {
	for _, l := range lines {
		if strings.TrimSpace(l) == "" || strings.ContainsAny(l, "\r\n") {
			return fmt.Errorf("validate pg_hba.conf line %q: want one non-empty line", l)
		}
	}
	return nil
}

// writeHBA rewrites initdb's pg_hba.conf at path: opts.HBA first, then, with
// opts.TLS, hostssl lines, then initdb's lines, then explicit trust lines
// for 127.0.0.1.
func writeHBA(path string, opts PGOptions) error {
	initdb, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	var b strings.Builder
	if len(opts.HBA) > 0 {
		b.WriteString("# cdc-relay sandbox: PGOptions.HBA\n")
		for _, l := range opts.HBA {
			b.WriteString(l + "\n")
		}
	}
	if opts.TLS {
		// A logical replication connection (replication=database) matches
		// the database lines; the "replication" keyword is for physical ones.
		b.WriteString("# cdc-relay sandbox: PGOptions.TLS\n")
		b.WriteString("hostssl all all 127.0.0.1/32 trust\n")
		b.WriteString("hostssl replication all 127.0.0.1/32 trust\n")
	}
	if b.Len() > 0 {
		b.WriteString("\n")
	}
	b.Write(initdb)
	// initdb -A trust already trusts local TCP connections; say so explicitly
	// so the relay's replication connections never depend on that default.
	b.WriteString("\n# cdc-relay sandbox\n" +
		"host all all 127.0.0.1/32 trust\n" +
		"host replication all 127.0.0.1/32 trust\n")
	// The file exists: WriteFile keeps its owner and mode.
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// confQuote quotes v as a postgresql.conf string value.
func confQuote(v string) string {
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// AttachPostgres wraps the existing server at rawURL, a URL of a superuser on
// a server with wal_level=logical. It checks the connection and wal_level.
// The server cannot be stopped or reconfigured, so a non-logical
// opts.WalLevel, any opts.Settings or opts.HBA, and opts.TLS fail with an
// error wrapping ErrExternal.
func AttachPostgres(ctx context.Context, rawURL string, opts PGOptions) (*Postgres, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// The error would echo the URL and its password.
		return nil, fmt.Errorf("parse %s: not a URL", EnvPGURL)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return nil, fmt.Errorf("parse %s %s: scheme must be postgres://", EnvPGURL, u.Redacted())
	}
	if opts.WalLevel != "" && opts.WalLevel != "logical" {
		return nil, fmt.Errorf("set wal_level=%s on external server %s: %w", opts.WalLevel, u.Redacted(), ErrExternal)
	}
	if len(opts.Settings) > 0 {
		return nil, fmt.Errorf("apply settings %v to external server %s: %w", opts.Settings, u.Redacted(), ErrExternal)
	}
	if opts.TLS {
		return nil, fmt.Errorf("set up TLS with a test CA on external server %s: %w", u.Redacted(), ErrExternal)
	}
	if len(opts.HBA) > 0 {
		return nil, fmt.Errorf("add pg_hba.conf lines to external server %s: %w", u.Redacted(), ErrExternal)
	}
	p := &Postgres{external: u}
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return nil, fmt.Errorf("connect to external postgres %s: %w", u.Redacted(), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var level string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return nil, fmt.Errorf("query wal_level of %s: %w", u.Redacted(), err)
	}
	var num int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('server_version_num')::int").Scan(&p.version, &num); err != nil {
		return nil, fmt.Errorf("query server version of %s: %w", u.Redacted(), err)
	}
	p.major = num / 10000
	if level != "logical" {
		return nil, fmt.Errorf("check external postgres %s: wal_level is %q, need logical", u.Redacted(), level)
	}
	return p, nil
}

// External reports whether p wraps a server named by CDC_RELAY_TEST_PG_URL.
func (p *Postgres) External() bool { return p.external != nil }

// Bin returns the server binaries a local cluster runs, and how they were
// found; it is the zero PGBin for an external server.
func (p *Postgres) Bin() PGBin { return p.bin }

// Version returns the server's version, e.g. "15.14": from
// `postgres --version` for a local cluster, server_version for an external one.
func (p *Postgres) Version() string { return p.version }

// Major returns the server's major version, e.g. 15, for tests of features
// that differ between majors.
func (p *Postgres) Major() int { return p.major }

// Describe says which server p is, for a log line: "PostgreSQL 15.14 from
// /usr/lib/postgresql/15/bin (pg_config --bindir), port 41234" or
// "external PostgreSQL 16.4 at postgres://postgres:xxxxx@db:5432/postgres
// (CDC_RELAY_TEST_PG_URL)". It never holds a password.
func (p *Postgres) Describe() string {
	if p.external != nil {
		return fmt.Sprintf("external PostgreSQL %s at %s (%s)", p.version, p.external.Redacted(), EnvPGURL)
	}
	return fmt.Sprintf("%s, port %d", p.bin, p.port)
}

// URL returns a connection URL for database on p. For a local cluster it is
// postgres://postgres@127.0.0.1:PORT/DATABASE?sslmode=disable; for an external
// server it is CDC_RELAY_TEST_PG_URL with the database replaced (and so may
// hold a password: never log it, log a redacted form).
func (p *Postgres) URL(database string) string {
	if p.external != nil {
		u := *p.external
		u.Path = "/" + database
		u.RawPath = ""
		return u.String()
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)),
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// TLSURL returns a URL for database on a cluster started with PGOptions.TLS
// that makes the client verify the server: host localhost (the name in the
// server's certificate), sslmode=verify-full and sslrootcert=CAFile. It
// returns "" for a cluster without TLS and for an external server.
func (p *Postgres) TLSURL(database string) string {
	if p.tls.server.CA == "" {
		return ""
	}
	q := url.Values{}
	q.Set("sslmode", "verify-full")
	q.Set("sslrootcert", p.tls.server.CA)
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     net.JoinHostPort("localhost", strconv.Itoa(p.port)),
		Path:     "/" + database,
		RawQuery: q.Encode(),
	}
	return u.String()
}

// CAFile returns the PEM file of the CA that signed the server certificate of
// a cluster started with PGOptions.TLS (a client's sslrootcert), or "".
func (p *Postgres) CAFile() string { return p.tls.server.CA }

// UntrustedCAFile returns the PEM file of a CA generated alongside CAFile
// that signed nothing the server presents: a client that trusts only it must
// refuse the server. It is "" without PGOptions.TLS.
func (p *Postgres) UntrustedCAFile() string { return p.tls.untrusted.CA }

// Port returns the server's TCP port.
func (p *Postgres) Port() int {
	if p.external != nil {
		port, err := strconv.Atoi(p.external.Port())
		if err != nil {
			return 5432
		}
		return port
	}
	return p.port
}

// DataDir returns the cluster's data directory, or "" for an external server.
func (p *Postgres) DataDir() string { return p.dataDir }

// LogFile returns the path of the server log, or "" for an external server.
func (p *Postgres) LogFile() string { return p.logFile }

// adminURL is where CreateDatabase connects: the "postgres" database of a
// local cluster, or exactly CDC_RELAY_TEST_PG_URL.
func (p *Postgres) adminURL() string {
	if p.external != nil {
		return p.external.String()
	}
	return p.URL("postgres")
}

// CreateDatabase creates the database name and returns its URL. If the
// database exists, it is dropped first with its replication slots, after
// disconnecting its sessions, replication connections included.
func (p *Postgres) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, p.adminURL())
	if err != nil {
		return "", fmt.Errorf("connect to postgres on port %d: %w", p.Port(), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// WITH (FORCE) disconnects sessions but not a walsender streaming from a
	// slot in the database (say, a relay a failed test left running), whose
	// active slot blocks the drop. Wait up to 5s for each to exit.
	if err := terminateSlotHolders(ctx, conn, p.major, name); err != nil {
		return "", fmt.Errorf("terminate replication connections to database %q: %w", name, err)
	}
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return "", fmt.Errorf("drop database %s: %w", ident, err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", fmt.Errorf("create database %s: %w", ident, err)
	}
	return p.URL(name), nil
}

// terminateSlotHolders ends the walsenders streaming from a slot of
// database and waits up to 5s for each to exit: with pg_terminate_backend's
// timeout from PostgreSQL 14, polling pg_replication_slots before.
func terminateSlotHolders(ctx context.Context, conn *pgx.Conn, major int, database string) error {
	if major >= 14 {
		_, err := conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid, 5000)
			FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, database)
		return err
	}
	const active = `SELECT count(*) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid)
		FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, database); err != nil {
		return err
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		var n int
		if err := conn.QueryRow(ctx, active, database).Scan(&n); err != nil {
			return err
		}
		if n == 0 || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Exec runs sql with args in database on a fresh connection and closes it.
// Without args, sql may hold several statements separated by semicolons;
// they run in one implicit transaction.
func (p *Postgres) Exec(ctx context.Context, database, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, p.URL(database))
	if err != nil {
		return fmt.Errorf("connect to database %q: %w", database, err)
	}
	_, err = conn.Exec(ctx, sql, args...)
	closeErr := conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("exec in database %q: %w", database, err)
	}
	if closeErr != nil {
		return fmt.Errorf("close connection to database %q: %w", database, closeErr)
	}
	return nil
}

// Stop stops the server with pg_ctl's shutdown mode ("smart", "fast" or
// "immediate") and waits until it is down. "immediate" is a crash: the next
// Start runs recovery. Stopping a stopped server does nothing. For an
// external server Stop returns ErrExternal.
func (p *Postgres) Stop(mode string) error {
	if p.external != nil {
		return fmt.Errorf("stop postgres: %w", ErrExternal)
	}
	if err := checkStopMode(mode); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("stop postgres: closed")
	}
	return p.stopLocked(mode)
}

// Start starts a stopped server again with the same data directory and port.
// Starting a running server does nothing. For an external server Start
// returns ErrExternal.
func (p *Postgres) Start() error {
	if p.external != nil {
		return fmt.Errorf("start postgres: %w", ErrExternal)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("start postgres: closed")
	}
	return p.startLocked(context.Background())
}

// Restart is Stop(mode) followed by Start. Clients must reconnect.
func (p *Postgres) Restart(mode string) error {
	if err := p.Stop(mode); err != nil {
		return err
	}
	return p.Start()
}

// Close stops the server (mode "immediate") and removes its files. It is
// idempotent and does nothing to an external server.
func (p *Postgres) Close() error {
	if p.external != nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	// Also after a failed start: a postmaster may be up without pg_ctl
	// having seen it become ready.
	if _, err := os.Stat(filepath.Join(p.dataDir, "postmaster.pid")); err == nil || p.running {
		if err := p.stopLocked("immediate"); err != nil {
			errs = append(errs, err, killPostmaster(p.dataDir))
		}
	}
	if err := os.RemoveAll(p.rootDir); err != nil {
		errs = append(errs, fmt.Errorf("remove postgres dir: %w", err))
	}
	return errors.Join(errs...)
}

// startLocked runs pg_ctl start and waits until the server accepts
// connections. p.mu must be held.
func (p *Postgres) startLocked(ctx context.Context) error {
	if p.running {
		return nil
	}
	out, err := p.run(ctx, "pg_ctl", "-D", p.dataDir, "-l", p.logFile, "-w",
		"-t", strconv.Itoa(int(pgCtlTimeout/time.Second)), "start")
	if err != nil {
		return fmt.Errorf("start postgres on port %d: %w\n%s\nserver log (%s):\n%s", p.port, err, out, p.logFile, p.logTail())
	}
	p.running = true
	return nil
}

// stopLocked runs pg_ctl stop and waits until the server is down. p.mu must
// be held.
func (p *Postgres) stopLocked(mode string) error {
	if !p.running {
		if _, err := os.Stat(filepath.Join(p.dataDir, "postmaster.pid")); err != nil {
			return nil
		}
	}
	out, err := p.run(context.Background(), "pg_ctl", "-D", p.dataDir, "-m", mode, "-w",
		"-t", strconv.Itoa(int(pgCtlTimeout/time.Second)), "stop")
	if err != nil {
		return fmt.Errorf("stop postgres (%s): %w\n%s\nserver log (%s):\n%s", mode, err, out, p.logFile, p.logTail())
	}
	p.running = false
	return nil
}

// run runs a PostgreSQL binary as the server's OS user and returns its
// combined output.
func (p *Postgres) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin.Dir, bin), args...)
	cmd.Dir = p.rootDir
	cmd.Env = serverEnv()
	// pg_ctl hands the server the log file, not our pipes; should that
	// ever change, do not wait for the server to exit.
	cmd.WaitDelay = 5 * time.Second
	p.user.apply(cmd)
	out, err := cmd.CombinedOutput()
	return bytes.TrimSpace(out), err
}

// logTail returns the last lines of the server log, for error messages.
func (p *Postgres) logTail() string {
	b, err := os.ReadFile(p.logFile)
	if err != nil {
		return fmt.Sprintf("(read server log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > pgLogTailLines {
		lines = lines[len(lines)-pgLogTailLines:]
	}
	return strings.Join(lines, "\n")
}

// serverEnv is our environment without PG* variables, which could point
// the binaries at another server or data directory.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}

// checkStopMode validates a pg_ctl shutdown mode.
func checkStopMode(mode string) error {
	switch mode {
	case "smart", "fast", "immediate":
		return nil
	}
	return fmt.Errorf("stop postgres: unknown mode %q, want smart, fast or immediate", mode)
}

// killPostmaster kills the postmaster of dataDir, as a last resort when
// pg_ctl could not stop it; its children exit when they notice.
func killPostmaster(dataDir string) error {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return nil // gone already
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return fmt.Errorf("parse postmaster.pid: %w", err)
	}
	proc, err := os.FindProcess(pid)
	if err != nil {
		return fmt.Errorf("find postmaster %d: %w", pid, err)
	}
	if err := proc.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill postmaster %d: %w", pid, err)
	}
	return nil
}

// appendFile appends s to the existing file path, keeping its owner.
func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return fmt.Errorf("append to %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return nil
}
