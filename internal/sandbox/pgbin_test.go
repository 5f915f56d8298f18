package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixtureScript writes an executable shell script at dir/name printing out.
// The scripts are fixtures for the path lookup, which only checks that the
// files exist and are executable (and runs pg_config); they never stand in
// for a server.
func fixtureScript(t *testing.T, dir, name, out string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\necho '" + out + "'\n"
	if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

// serverDir makes dir a complete server bin dir: initdb, pg_ctl, postgres.
func serverDir(t *testing.T, dir string) string {
	t.Helper()
	for _, name := range pgServerBinaries {
		fixtureScript(t, dir, name, "postgres (PostgreSQL) 16.4")
	}
	return dir
}

func TestPGLookupOrder(t *testing.T) {
	t.Parallel()
	type layout struct {
		envDir   string // "" leaves CDC_RELAY_PG_BINDIR unset
		path     []string
		debian   string
		wantDir  string
		wantFrom string
		wantErr  []string
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, root string) layout
	}{
		{
			name: "env var wins over everything",
			setup: func(t *testing.T, root string) layout {
				env := serverDir(t, filepath.Join(root, "env"))
				cfg := serverDir(t, filepath.Join(root, "cfg"))
				fixtureScript(t, filepath.Join(root, "cfgbin"), "pg_config", cfg)
				path := serverDir(t, filepath.Join(root, "path"))
				serverDir(t, filepath.Join(root, "debian", "15", "bin"))
				return layout{envDir: env, path: []string{filepath.Join(root, "cfgbin"), path}, debian: filepath.Join(root, "debian"),
					wantDir: env, wantFrom: EnvPGBinDir}
			},
		},
		{
			name: "env var without postgres is an error, no fallback",
			setup: func(t *testing.T, root string) layout {
				env := filepath.Join(root, "env")
				fixtureScript(t, env, "initdb", "")
				fixtureScript(t, env, "pg_ctl", "")
				path := serverDir(t, filepath.Join(root, "path"))
				return layout{envDir: env, path: []string{path}, debian: filepath.Join(root, "debian"),
					wantErr: []string{EnvPGBinDir + "=" + env + " has no postgres"}}
			},
		},
		{
			name: "pg_config --bindir before PATH",
			setup: func(t *testing.T, root string) layout {
				cfg := serverDir(t, filepath.Join(root, "cfg"))
				fixtureScript(t, filepath.Join(root, "cfgbin"), "pg_config", cfg)
				path := serverDir(t, filepath.Join(root, "path"))
				return layout{path: []string{filepath.Join(root, "cfgbin"), path}, debian: filepath.Join(root, "debian"),
					wantDir: cfg, wantFrom: "pg_config --bindir"}
			},
		},
		{
			name: "pg_config naming a client-only dir falls through to PATH",
			setup: func(t *testing.T, root string) layout {
				client := filepath.Join(root, "client")
				fixtureScript(t, client, "psql", "")
				fixtureScript(t, client, "pg_config", client)
				path := serverDir(t, filepath.Join(root, "path"))
				return layout{path: []string{client, path}, debian: filepath.Join(root, "debian"),
					wantDir: path, wantFrom: "initdb on PATH"}
			},
		},
		{
			name: "a failing pg_config falls through to PATH",
			setup: func(t *testing.T, root string) layout {
				bad := filepath.Join(root, "bad")
				if err := os.MkdirAll(bad, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(bad, "pg_config"), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
					t.Fatal(err)
				}
				path := serverDir(t, filepath.Join(root, "path"))
				return layout{path: []string{bad, path}, debian: filepath.Join(root, "debian"),
					wantDir: path, wantFrom: "initdb on PATH"}
			},
		},
		{
			name: "a lone initdb symlink on PATH resolves to its server dir",
			setup: func(t *testing.T, root string) layout {
				real := serverDir(t, filepath.Join(root, "cellar", "bin"))
				link := filepath.Join(root, "links")
				if err := os.MkdirAll(link, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(filepath.Join(real, "initdb"), filepath.Join(link, "initdb")); err != nil {
					t.Fatal(err)
				}
				serverDir(t, filepath.Join(root, "debian", "15", "bin"))
				return layout{path: []string{link}, debian: filepath.Join(root, "debian"),
					wantDir: real, wantFrom: "initdb on PATH"}
			},
		},
		{
			name: "a non-executable initdb on PATH is skipped",
			setup: func(t *testing.T, root string) layout {
				dir := serverDir(t, filepath.Join(root, "path"))
				if err := os.Chmod(filepath.Join(dir, "initdb"), 0o644); err != nil {
					t.Fatal(err)
				}
				deb := serverDir(t, filepath.Join(root, "debian", "16", "bin"))
				return layout{path: []string{dir}, debian: filepath.Join(root, "debian"),
					wantDir: deb, wantFrom: "Debian layout"}
			},
		},
		{
			name: "Debian layout prefers 15",
			setup: func(t *testing.T, root string) layout {
				serverDir(t, filepath.Join(root, "debian", "13", "bin"))
				want := serverDir(t, filepath.Join(root, "debian", "15", "bin"))
				serverDir(t, filepath.Join(root, "debian", "17", "bin"))
				return layout{path: []string{filepath.Join(root, "empty")}, debian: filepath.Join(root, "debian"),
					wantDir: want, wantFrom: "Debian layout"}
			},
		},
		{
			name: "Debian layout without 15 takes the newest complete major",
			setup: func(t *testing.T, root string) layout {
				serverDir(t, filepath.Join(root, "debian", "9", "bin"))
				want := serverDir(t, filepath.Join(root, "debian", "16", "bin"))
				// 18 has only the client programs (postgresql-client-18).
				fixtureScript(t, filepath.Join(root, "debian", "18", "bin"), "psql", "")
				fixtureScript(t, filepath.Join(root, "debian", "18", "bin"), "pg_config", "")
				return layout{debian: filepath.Join(root, "debian"),
					wantDir: want, wantFrom: "Debian layout"}
			},
		},
		{
			name: "nothing found names every fix",
			setup: func(t *testing.T, root string) layout {
				client := filepath.Join(root, "client")
				fixtureScript(t, client, "pg_config", client)
				return layout{path: []string{client}, debian: filepath.Join(root, "debian"),
					wantErr: []string{
						"none found",
						client + " has no initdb, pg_ctl, postgres (client-only)",
						"initdb: not on PATH",
						filepath.Join(root, "debian") + "/<major>/bin: none",
						"set " + EnvPGBinDir + " to the directory holding them",
						"apt-get install postgresql-15",
						"brew install postgresql@16",
						"bin directory on PATH",
						EnvPGURL + "=postgres://",
					}}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := tc.setup(t, t.TempDir())
			env := map[string]string{"PATH": strings.Join(l.path, string(os.PathListSeparator))}
			if l.envDir != "" {
				env[EnvPGBinDir] = l.envDir
			}
			dir, from, err := pgLookup{getenv: func(k string) string { return env[k] }, debianRoot: l.debian}.find(t.Context()) // pg_config runs within pgToolTimeout
			if len(l.wantErr) > 0 {
				if err == nil {
					t.Fatalf("found %s via %s, want an error", dir, from)
				}
				for _, want := range l.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error does not contain %q:\n%v", want, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if dir != l.wantDir || from != l.wantFrom {
				t.Errorf("found %s via %q, want %s via %q", dir, from, l.wantDir, l.wantFrom)
			}
		})
	}
}

func TestParsePostgresVersion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		out     string
		version string
		major   int
	}{
		{"postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)\n", "15.14", 15},
		{"postgres (PostgreSQL) 16.4 (Homebrew)", "16.4", 16},
		{"postgres (PostgreSQL) 13.22", "13.22", 13},
		{"postgres (PostgreSQL) 18beta1", "18beta1", 18},
		{"postgres (PostgreSQL) 9.6.24", "9.6.24", 9},
	} {
		version, major, err := parsePostgresVersion(tc.out)
		if err != nil || version != tc.version || major != tc.major {
			t.Errorf("parsePostgresVersion(%q) = %q, %d, %v; want %q, %d", tc.out, version, major, err, tc.version, tc.major)
		}
	}
	if _, _, err := parsePostgresVersion("psql (PostgreSQL)"); err == nil {
		t.Error("parsePostgresVersion without a version: no error")
	}
}
