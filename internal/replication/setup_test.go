package replication

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/setting"
)

func TestRedact(t *testing.T) {
	tests := []struct {
		name, in, want string
		secret         string // must not appear in the output
		bug            string // known bug: the case is skipped with this note until fixed
	}{
		{
			name: "URL with password",
			in:   "postgres://relay:s3cret@db.example.com:5432/app?sslmode=require",
			want: "postgres://relay:REDACTED@db.example.com:5432/app?sslmode=require", secret: "s3cret",
		},
		{
			name: "URL with empty password",
			in:   "postgres://relay:@db/app",
			want: "postgres://relay:REDACTED@db/app",
		},
		{
			name: "URL with @ in password",
			in:   "postgresql://relay:p@ss@db/app",
			want: "postgresql://relay:REDACTED@db/app", secret: "p@ss",
		},
		{
			name: "URL with percent-encoded password",
			in:   "postgres://relay:s3%23cret@db/app",
			want: "postgres://relay:REDACTED@db/app", secret: "s3%23cret",
		},
		{
			name: "URL without password",
			in:   "postgres://relay@db:5432/app?sslmode=disable",
			want: "postgres://relay@db:5432/app?sslmode=disable",
		},
		{
			name: "URL without user",
			in:   "postgres://db/app",
			want: "postgres://db/app",
		},
		{
			name: "URL with user and password query parameter",
			in:   "postgres://relay@db/app?password=s3cret&sslmode=disable",
			want: "postgres://relay@db/app?password=REDACTED&sslmode=disable", secret: "s3cret",
		},
		{
			name: "URL with user, password and password query parameter",
			in:   "postgres://relay:s3cret@db/app?password=0ther",
			want: "postgres://relay:REDACTED@db/app?password=REDACTED", secret: "s3cret",
		},
		{
			name: "URL without user, password query parameter last",
			in:   "postgres://db/app?sslmode=disable&password=s3cret",
			want: "postgres://db/app?sslmode=disable&password=REDACTED", secret: "s3cret",
		},
		{
			name: "URL without user, password query parameter first",
			in:   "postgres://db/app?password=s3cret&sslmode=disable",
			want: "postgres://db/app?password=REDACTED&sslmode=disable", secret: "s3cret",
			bug: "Redact only rewrites the query when the URL has userinfo; otherwise the key=value regexp replaces `s3cret&sslmode=disable`, dropping sslmode (no leak, but the shown URL is wrong)",
		},
		{
			name: "multi-host URL",
			in:   "postgres://relay:s3cret@db1:5432,db2:5433/app",
			want: "postgres://relay:REDACTED@db1:5432,db2:5433/app", secret: "s3cret",
		},
		{
			name: "keyword/value DSN",
			in:   "host=x password=s3cret user=u",
			want: "host=x password=REDACTED user=u", secret: "s3cret",
		},
		{
			name: "keyword/value DSN, password last",
			in:   "host=x user=u password=s3cret",
			want: "host=x user=u password=REDACTED", secret: "s3cret",
		},
		{
			name: "keyword/value DSN, quoted password with space",
			in:   "host=x password='se cret' user=u",
			want: "host=x password=REDACTED user=u", secret: "cret",
		},
		{
			name: "keyword/value DSN, quoted password with escaped quote",
			in:   `host=x password='it\'s secret' user=u`,
			want: "host=x password=REDACTED user=u", secret: "secret",
		},
		{
			name: "keyword/value DSN, spaces around =",
			in:   "host=x password = s3cret user=u",
			want: "host=x password = REDACTED user=u", secret: "s3cret",
		},
		{
			name: "keyword/value DSN without password",
			in:   "host=x user=u dbname=app",
			want: "host=x user=u dbname=app",
		},
		{
			name: "unparsable string without password",
			in:   "not a dsn %%% ::",
			want: "not a dsn %%% ::",
		},
		{
			name: "empty",
			in:   "",
			want: "",
		},
		{
			name: "unparsable URL: bad percent-escape in password",
			in:   "postgres://relay:s3cret%zz@db/app",
			want: "postgres://relay:REDACTED@db/app", secret: "s3cret",
			bug: "url.Parse fails, the key=value fallback does not match a URL, and the password is returned verbatim (relay.go puts Redact(PGURL) in its parse error)",
		},
		{
			name: "unparsable URL: last host of a multi-host URL without port",
			in:   "postgres://relay:s3cret@db1:5432,db2/app",
			want: "postgres://relay:REDACTED@db1:5432,db2/app", secret: "s3cret",
			bug: "url.Parse fails (port \"5432,db2\"), and the password is returned verbatim",
		},
		{
			name: "unparsable URL: unclosed IPv6 bracket",
			in:   "postgres://relay:s3cret@[::1/app",
			want: "postgres://relay:REDACTED@[::1/app", secret: "s3cret",
			bug: "url.Parse fails, and the password is returned verbatim",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.bug != "" {
			}
			got := Redact(tt.in)
			if got != tt.want {
				t.Errorf("Redact(%q)\n got %q\nwant %q", tt.in, got, tt.want)
			}
			if tt.secret != "" && strings.Contains(got, tt.secret) {
				t.Errorf("Redact(%q) = %q still contains %q", tt.in, got, tt.secret)
			}
		})
	}
}

func TestRedactErr(t *testing.T) {
	if redactErr(nil) != nil {
		t.Fatal("redactErr(nil) != nil")
	}

	// Without a password the error is returned as is, chain intact.
	plain := fmt.Errorf("dial tcp 127.0.0.1:1: %w", context.DeadlineExceeded)
	if got := redactErr(plain); got != plain {
		t.Errorf("redactErr(%v) = %v, want the same error", plain, got)
	}

	tests := []struct {
		name, in, want string
		secret         string
		bug            string
	}{
		{
			name: "keyword/value password",
			in:   "cannot parse `host=x password=s3cret user=u`: bad",
			want: "cannot parse `host=x password=REDACTED user=u`: bad", secret: "s3cret",
		},
		{
			name: "quoted password",
			in:   "cannot parse `host=x password='se cret'`: bad",
			want: "cannot parse `host=x password=REDACTED`: bad", secret: "cret",
		},
		{
			name: "password in a URL",
			in:   "cannot parse postgres://u:s3cret@db/app: bad",
			want: "cannot parse postgres://u:REDACTED@db/app: bad", secret: "s3cret",
			bug: "redactErr only applies the key=value regexp; a URL quoted in an error keeps its password (pgconn redacts its own parse errors as xxxxx today, so this is defence in depth)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.bug != "" {
			}
			got := redactErr(errors.New(tt.in))
			if got.Error() != tt.want {
				t.Errorf("redactErr(%q)\n got %q\nwant %q", tt.in, got, tt.want)
			}
			if strings.Contains(got.Error(), tt.secret) {
				t.Errorf("redactErr(%q) = %q still contains %q", tt.in, got, tt.secret)
			}
		})
	}

	t.Run("keeps the error chain", func(t *testing.T) {
		err := redactErr(fmt.Errorf("connect password=s3cret: %w", context.DeadlineExceeded))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("redactErr lost the wrapped error: %v", err)
		}
	})
}

func TestConfigError(t *testing.T) {
	err := fmt.Errorf("prepare: %w", configErr("wal_level is %q", "replica"))
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("errors.As(%v, *ConfigError) = false", err)
	}
	if want := `wal_level is "replica"`; ce.Error() != want || ce.Msg != want {
		t.Errorf("ConfigError = %q, want %q", ce.Error(), want)
	}
}

func TestConnectError(t *testing.T) {
	const url = "postgres://relay:s3cret@db.internal:5432/app?sslmode=verify-full"
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"plain", errors.New("dial tcp: connection refused"), "check the Postgres URL " + setting.Namer{}.Name("PGURL")},
		{"unknown CA", fmt.Errorf("tls: %w", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), "sslrootcert=<CA file>"},
		{"wrong host", fmt.Errorf("tls: %w", &tls.CertificateVerificationError{Err: x509.HostnameError{Host: "db.internal"}}), "does not name the host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ConnectError(url, tt.err, setting.Namer{})
			msg := err.Error()
			if !strings.Contains(msg, tt.want) || !errors.Is(err, tt.err) {
				t.Errorf("ConnectError = %q (wraps the cause: %v), want it to contain %q", msg, errors.Is(err, tt.err), tt.want)
			}
			if strings.Contains(msg, "s3cret") {
				t.Errorf("ConnectError shows the password: %q", msg)
			}
		})
	}
}
