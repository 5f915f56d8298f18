package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPGURLFile: --pg-url-file (or CDC_RELAY_PG_URL_FILE) supplies the URL, for
// every command that takes the Postgres flags; errors name the flag.
func TestPGURLFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "url")
	if err := os.WriteFile(good, []byte("postgres://u:s3cret@127.0.0.1:5432/db\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		env     string
		wantErr string
	}{
		{name: "flag", args: []string{"run", "--pg-url-file", good, "--kafka-brokers", "k:9092"}},
		{name: "env", args: []string{"run", "--kafka-brokers", "k:9092"}, env: good},
		{name: "status command", args: []string{"status", "--pg-url-file", good}},
		{name: "both set", args: []string{"run", "--pg-url", "postgres://x/y", "--pg-url-file", good, "--kafka-brokers", "k:9092"}, wantErr: "--pg-url-file"},
		{name: "missing file", args: []string{"run", "--pg-url-file", filepath.Join(dir, "nope"), "--kafka-brokers", "k:9092"}, wantErr: "cannot be read"},
		{name: "empty file", args: []string{"run", "--pg-url-file", empty, "--kafka-brokers", "k:9092"}, wantErr: "is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			if tt.env != "" {
				t.Setenv("CDC_RELAY_PG_URL_FILE", tt.env)
			}
			c, err := parseArgs(t, tt.args...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Errorf("error shows the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			url := c.Run.PGURL
			if tt.args[0] == "status" {
				url = c.Status.PGURL
			}
			if url != "postgres://u:s3cret@127.0.0.1:5432/db" {
				t.Errorf("PGURL = %q, want the file's content without the newline", url)
			}
		})
	}
}
