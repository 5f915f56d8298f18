package cli

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// secret is the SASL password of these tests; no output may show it.
const secret = "Kafka-s3cret-pw"

// securityFlags returns the TLS and SASL flags of the command args[0] of c.
func securityFlags(c *CLI, command string) *KafkaSecurityFlags {
	switch command {
	case "replay":
		return &c.Replay.KafkaSecurityFlags
	case "dlq":
		return &c.DLQ.Replay.KafkaSecurityFlags
	}
	return &c.Run.KafkaSecurityFlags
}

// writeFile writes content to a new file in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestKafkaSecurityFlags parses the TLS and SASL flags (and their environment
// variables) of every command that talks to Kafka, checking what they build
// and that each mistake is reported with the flag to fix and never the
// password.
func TestKafkaSecurityFlags(t *testing.T) {
	dir := t.TempDir()
	pki, err := sandbox.WriteTLSFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	pwFile := writeFile(t, dir, "pw", secret+"\n")
	emptyFile := writeFile(t, dir, "empty", "")
	notPEM := writeFile(t, dir, "not-pem", "hello")
	brokenPEM := writeFile(t, dir, "broken-pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")

	type want struct {
		tls        bool
		serverName string
		insecure   bool
		rootCAs    bool
		clientCert bool
		sasl       string // mechanism name, "" for none
	}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    want
		wantErr []string // substrings of the error
	}{
		{name: "none", want: want{}},
		{name: "tls", args: []string{"--kafka-tls"}, want: want{tls: true}},
		{name: "tls from env", env: map[string]string{"CDC_RELAY_KAFKA_TLS": "true"}, want: want{tls: true}},
		{name: "CA file implies tls", args: []string{"--kafka-tls-ca-file", pki.CA}, want: want{tls: true, rootCAs: true}},
		{name: "CA file from env", env: map[string]string{"CDC_RELAY_KAFKA_TLS_CA_FILE": pki.CA}, want: want{tls: true, rootCAs: true}},
		{name: "client certificate", args: []string{"--kafka-tls-cert-file", pki.ClientCert, "--kafka-tls-key-file", pki.ClientKey},
			want: want{tls: true, clientCert: true}},
		{name: "server name", args: []string{"--kafka-tls-server-name", "kafka.internal"}, want: want{tls: true, serverName: "kafka.internal"}},
		{name: "insecure", args: []string{"--kafka-tls-insecure-skip-verify"}, want: want{tls: true, insecure: true}},
		{name: "plain", args: []string{"--kafka-sasl-mechanism", "plain", "--kafka-sasl-username", "u", "--kafka-sasl-password", secret},
			want: want{sasl: "PLAIN"}},
		{name: "scram-sha-256 from env", env: map[string]string{"CDC_RELAY_KAFKA_SASL_MECHANISM": "scram-sha-256",
			"CDC_RELAY_KAFKA_SASL_USERNAME": "u", "CDC_RELAY_KAFKA_SASL_PASSWORD": secret}, want: want{sasl: "SCRAM-SHA-256"}},
		{name: "scram-sha-512 with password file and tls", args: []string{"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-username", "u",
			"--kafka-sasl-password-file", pwFile, "--kafka-tls-ca-file", pki.CA}, want: want{sasl: "SCRAM-SHA-512", tls: true, rootCAs: true}},
		{name: "password file from env", args: []string{"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-username", "u"},
			env: map[string]string{"CDC_RELAY_KAFKA_SASL_PASSWORD_FILE": pwFile}, want: want{sasl: "SCRAM-SHA-512"}},

		{name: "unreadable CA file", args: []string{"--kafka-tls-ca-file", filepath.Join(dir, "nope.pem")},
			wantErr: []string{"the TLS CA file cannot be read", "check the CA file kafka.tls.ca_file (--kafka-tls-ca-file / CDC_RELAY_KAFKA_TLS_CA_FILE)"}},
		{name: "CA file not PEM", args: []string{"--kafka-tls-ca-file", notPEM},
			wantErr: []string{"no PEM certificate", "check the CA file kafka.tls.ca_file (--kafka-tls-ca-file / CDC_RELAY_KAFKA_TLS_CA_FILE)"}},
		{name: "CA file with a broken certificate", args: []string{"--kafka-tls-ca-file", brokenPEM},
			wantErr: []string{"certificate #1 that cannot be parsed", "check the CA file kafka.tls.ca_file (--kafka-tls-ca-file / CDC_RELAY_KAFKA_TLS_CA_FILE)"}},
		{name: "certificate without key", args: []string{"--kafka-tls-cert-file", pki.ClientCert},
			wantErr: []string{"the TLS key file is required with a client certificate file kafka.tls.cert_file (--kafka-tls-cert-file / CDC_RELAY_KAFKA_TLS_CERT_FILE): set the private key of the client certificate kafka.tls.key_file (--kafka-tls-key-file / CDC_RELAY_KAFKA_TLS_KEY_FILE)"}},
		{name: "key without certificate", args: []string{"--kafka-tls-key-file", pki.ClientKey},
			wantErr: []string{"the TLS client certificate file is required with a key file kafka.tls.key_file (--kafka-tls-key-file / CDC_RELAY_KAFKA_TLS_KEY_FILE): set the client certificate of the key kafka.tls.cert_file (--kafka-tls-cert-file / CDC_RELAY_KAFKA_TLS_CERT_FILE)"}},
		{name: "key of another certificate", args: []string{"--kafka-tls-cert-file", pki.ClientCert, "--kafka-tls-key-file", pki.ServerKey},
			wantErr: []string{"private key does not match", "check the key file kafka.tls.key_file (--kafka-tls-key-file / CDC_RELAY_KAFKA_TLS_KEY_FILE) and the certificate file kafka.tls.cert_file (--kafka-tls-cert-file / CDC_RELAY_KAFKA_TLS_CERT_FILE)"}},
		{name: "certificate not PEM", args: []string{"--kafka-tls-cert-file", notPEM, "--kafka-tls-key-file", pki.ClientKey},
			wantErr: []string{"load client certificate", "kafka.tls.cert_file (--kafka-tls-cert-file / CDC_RELAY_KAFKA_TLS_CERT_FILE)"}},
		{name: "mechanism without user", args: []string{"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-password", secret},
			wantErr: []string{"a SASL user name is required with SASL mechanism scram-sha-512: set the user name kafka.sasl.username (--kafka-sasl-username / CDC_RELAY_KAFKA_SASL_USERNAME)"}},
		{name: "mechanism without password", args: []string{"--kafka-sasl-mechanism", "plain", "--kafka-sasl-username", "u"},
			wantErr: []string{"a SASL password is required with SASL mechanism plain: set a password file kafka.sasl.password_file (--kafka-sasl-password-file / CDC_RELAY_KAFKA_SASL_PASSWORD_FILE), or the password kafka.sasl.password (--kafka-sasl-password / CDC_RELAY_KAFKA_SASL_PASSWORD)"}},
		{name: "user without mechanism", args: []string{"--kafka-sasl-username", "u"},
			wantErr: []string{"a SASL user name kafka.sasl.username (--kafka-sasl-username / CDC_RELAY_KAFKA_SASL_USERNAME) is set, but the SASL mechanism is none", "as the mechanism kafka.sasl.mechanism (--kafka-sasl-mechanism / CDC_RELAY_KAFKA_SASL_MECHANISM)"}},
		{name: "password without mechanism", env: map[string]string{"CDC_RELAY_KAFKA_SASL_PASSWORD": secret},
			wantErr: []string{"a SASL password is set, but the SASL mechanism is none", "as the mechanism kafka.sasl.mechanism (--kafka-sasl-mechanism / CDC_RELAY_KAFKA_SASL_MECHANISM)"}},
		{name: "password and password file", args: []string{"--kafka-sasl-mechanism", "plain", "--kafka-sasl-username", "u",
			"--kafka-sasl-password", secret, "--kafka-sasl-password-file", pwFile},
			wantErr: []string{"a SASL password kafka.sasl.password (--kafka-sasl-password / CDC_RELAY_KAFKA_SASL_PASSWORD) and a password file are both set: unset one, the password or the file kafka.sasl.password_file (--kafka-sasl-password-file / CDC_RELAY_KAFKA_SASL_PASSWORD_FILE)"}},
		{name: "missing password file", args: []string{"--kafka-sasl-mechanism", "plain", "--kafka-sasl-username", "u",
			"--kafka-sasl-password-file", filepath.Join(dir, "nope")}, wantErr: []string{"the SASL password file cannot be read", "check the file kafka.sasl.password_file (--kafka-sasl-password-file / CDC_RELAY_KAFKA_SASL_PASSWORD_FILE)"}},
		{name: "empty password file", args: []string{"--kafka-sasl-mechanism", "plain", "--kafka-sasl-username", "u",
			"--kafka-sasl-password-file", emptyFile}, wantErr: []string{"is empty", "fix the file kafka.sasl.password_file (--kafka-sasl-password-file / CDC_RELAY_KAFKA_SASL_PASSWORD_FILE)"}},
		{name: "SCRAM password SASLprep refuses", args: []string{"--kafka-sasl-mechanism", "scram-sha-256", "--kafka-sasl-username", "u",
			"--kafka-sasl-password", secret + "\x07"}, wantErr: []string{"the SASL password cannot be used with SCRAM", "fix the password kafka.sasl.password (--kafka-sasl-password / CDC_RELAY_KAFKA_SASL_PASSWORD)"}},
		{name: "SCRAM user SASLprep refuses", args: []string{"--kafka-sasl-mechanism", "scram-sha-256", "--kafka-sasl-username", "u\x07",
			"--kafka-sasl-password", secret}, wantErr: []string{"the SASL user name cannot be used with SCRAM", "fix the user name kafka.sasl.username (--kafka-sasl-username / CDC_RELAY_KAFKA_SASL_USERNAME)"}},
		{name: "unknown mechanism", args: []string{"--kafka-sasl-mechanism", "gssapi", "--kafka-sasl-username", "u", "--kafka-sasl-password", secret},
			wantErr: []string{"--kafka-sasl-mechanism must be one of", "CDC_RELAY_KAFKA_SASL_MECHANISM"}},
	}
	commands := map[string][]string{
		"run":    {"run", "--pg-url", "postgres://u@h/db", "--kafka-brokers", "k:9092"},
		"replay": {"replay", "--pg-url", "postgres://u@h/db", "--kafka-brokers", "k:9092", "--since", "1h"},
		"dlq":    {"dlq", "replay", "--pg-url", "postgres://u@h/db", "--kafka-brokers", "k:9092"},
	}
	for _, command := range slices.Sorted(maps.Keys(commands)) {
		for _, tt := range tests {
			t.Run(command+"/"+tt.name, func(t *testing.T) {
				clearEnv(t)
				for k, v := range tt.env {
					t.Setenv(k, v)
				}
				c, err := parseArgs(t, append(slices.Clone(commands[command]), tt.args...)...)
				if tt.wantErr != nil {
					if err == nil {
						t.Fatalf("no error, want one containing %q", tt.wantErr)
					}
					for _, w := range tt.wantErr {
						if !strings.Contains(err.Error(), w) {
							t.Errorf("error %q lacks %q", err, w)
						}
					}
					if strings.Contains(err.Error(), secret) {
						t.Errorf("error shows the password: %v", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				f := securityFlags(c, command)
				conn, err := f.kafkaConn()
				if err != nil {
					t.Fatal(err)
				}
				tr := conn.Transport()
				if tt.want == (want{}) {
					if tr != nil {
						t.Errorf("transport = %+v, want nil (plain TCP)", tr)
					}
					return
				}
				if tr == nil {
					t.Fatal("transport = nil")
				}
				var got want
				if tc := tr.TLS; tc != nil {
					if tc.MinVersion != tls.VersionTLS12 {
						t.Errorf("TLS MinVersion = %x, want TLS 1.2", tc.MinVersion)
					}
					got.tls, got.serverName, got.insecure = true, tc.ServerName, tc.InsecureSkipVerify
					got.rootCAs, got.clientCert = tc.RootCAs != nil, len(tc.Certificates) == 1
				}
				if tr.SASL != nil {
					got.sasl = tr.SASL.Name()
				}
				if got != tt.want {
					t.Errorf("transport = %+v, want %+v", got, tt.want)
				}
				if strings.Contains(tt.name, "password file") && f.KafkaSASLPassword != secret {
					t.Errorf("password from the file is %q, want it without the newline", f.KafkaSASLPassword)
				}
			})
		}
	}
}

// TestKafkaSecurityHelp: every command that talks to Kafka lists the flags
// with their environment variables in --help-all, warns about skipping
// verification, and shows no password even when one is set (--help lists
// some of these flags; TestShortHelp checks which).
func TestKafkaSecurityHelp(t *testing.T) {
	clearEnv(t)
	t.Setenv("CDC_RELAY_KAFKA_SASL_PASSWORD", secret)
	for _, args := range [][]string{{"run", "--help-all"}, {"replay", "--help-all"}, {"dlq", "replay", "--help-all"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			err, out, errOut := run(t, canceled(), append(args, "--kafka-sasl-password", secret)...)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range []string{
				"--kafka-tls ", "($CDC_RELAY_KAFKA_TLS, key kafka.tls.enabled)", "--kafka-tls-ca-file=FILE", "($CDC_RELAY_KAFKA_TLS_CA_FILE, key kafka.tls.ca_file)",
				"--kafka-tls-cert-file=FILE", "--kafka-tls-key-file=FILE", "--kafka-tls-server-name=NAME",
				"--kafka-tls-insecure-skip-verify", "INSECURE",
				"--kafka-sasl-mechanism=", "scram-sha-512", "--kafka-sasl-username=USER",
				"--kafka-sasl-password=PASSWORD", "($CDC_RELAY_KAFKA_SASL_PASSWORD, key kafka.sasl.password)",
				"--kafka-sasl-password-file=FILE", "($CDC_RELAY_KAFKA_SASL_PASSWORD_FILE, key kafka.sasl.password_file)",
			} {
				if !strings.Contains(strings.Join(strings.Fields(out), " "), w) {
					t.Errorf("help lacks %q", w)
				}
			}
			if strings.Contains(out+errOut, secret) {
				t.Errorf("help shows the password:\n%s", out)
			}
		})
	}
}

// securedBroker starts a broker with TLS and a SCRAM-SHA-512 user.
func securedBroker(t *testing.T) *sandbox.Kafka {
	t.Helper()
	k := testenv.NewKafka(t, sandbox.KafkaOptions{TLS: true, SASLUsers: []sandbox.SASLUser{
		{Mechanism: sandbox.SASLScramSHA512, User: "relay", Password: secret},
	}})
	testenv.RequireLocalKafka(t, k)
	return k
}

// securedArgs are the flags that reach a securedBroker as its user; without
// --kafka-sasl-password when password is "".
func securedArgs(k *sandbox.Kafka, password string) []string {
	args := []string{"--kafka-brokers", strings.Join(k.Brokers(), ","), "--kafka-tls-ca-file", k.TLSFiles().CA,
		"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-username", "relay"}
	if password != "" {
		args = append(args, "--kafka-sasl-password", password)
	}
	return args
}

// TestKafkaSecurityCommands runs run, replay and dlq replay against a broker
// that requires TLS and SCRAM-SHA-512: with the right settings the events
// arrive; with a wrong password or a certificate that cannot be verified,
// they fail with an error naming the flag to fix. Neither errors nor logs
// show the password.
func TestKafkaSecurityCommands(t *testing.T) {
	clearEnv(t)
	ctx := t.Context()
	pg := testenv.NewPostgres(t, sandbox.PGOptions{})
	url, err := pg.CreateDatabase(ctx, "cdc_relay_cli_kafka_security")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ddl, err := os.ReadFile(filepath.Join("..", "..", "migrations", "001_outbox.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, string(ddl)); err != nil {
		t.Fatalf("create outbox: %v", err)
	}
	k := securedBroker(t)
	insert := func(t *testing.T, n int) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, created_at)
			SELECT 'order', 'o-' || i, 'OrderPlaced', jsonb_build_object('i', i), now() - interval '1 minute'
			FROM generate_series(1, $1::int) i`, n); err != nil {
			t.Fatal(err)
		}
	}
	runArgs := []string{"run", "--pg-url", url, "--metrics-addr", "", "--log-format", "json", "--log-level", "debug",
		"--status-interval", "200ms", "--kafka-start-timeout", "2s", "--retry-cap", "200ms"}
	replayArgs := []string{"replay", "--pg-url", url, "--since", "1h", "--rate", "0", "--topic", "secured.replay", "--kafka-start-timeout", "2s"}
	const dlqTable = "public.secured_dead_letters"
	dlqArgs := []string{"dlq", "replay", "--pg-url", url, "--dlq-table", dlqTable, "--rate", "0", "--kafka-start-timeout", "2s"}

	t.Run("run delivers", func(t *testing.T) {
		// The password comes from a file named by the environment, as from a mounted secret.
		t.Setenv("CDC_RELAY_KAFKA_SASL_PASSWORD_FILE", writeFile(t, t.TempDir(), "pw", secret+"\n"))
		args := append(append(slices.Clone(runArgs), securedArgs(k, "")...), "--topic", "secured.run", "--slot", "secured_run")
		rctx, cancel := context.WithCancel(ctx)
		var log sandbox.Buffer
		var rl atomic.Pointer[relay.Relay]
		done := make(chan error, 1)
		go func() {
			done <- Run(rctx, args, Env{Stdout: &log, Stderr: &log, Version: "test", OnRelay: func(r *relay.Relay) { rl.Store(r) }})
		}()
		stopped := false
		stop := func() error {
			if stopped {
				return nil
			}
			stopped = true
			cancel()
			return <-done
		}
		defer stop()

		// Rows inserted before the relay created its slot would be missed:
		// wait until it is ready.
		testenv.Eventually(t, 20*time.Second, func() error {
			select {
			case err := <-done:
				stopped = true // stop must not wait for done again
				t.Fatalf("relay stopped: %v\n%s", err, log.String())
			default:
			}
			if r := rl.Load(); r == nil || !r.Ready() {
				return fmt.Errorf("relay not ready:\n%s", log.String())
			}
			return nil
		})
		insert(t, 3)
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		recs, err := k.WaitForRecords(wctx, 3, "secured.run")
		if err != nil {
			t.Fatalf("%v\nrelay log:\n%s", err, log.String())
		}
		var keys []string
		for _, r := range recs {
			keys = append(keys, string(r.Key))
		}
		if slices.Sort(keys); !slices.Equal(keys, []string{"o-1", "o-2", "o-3"}) {
			t.Errorf("keys %v, want o-1..o-3", keys)
		}
		if err := stop(); err != nil {
			t.Errorf("relay: %v", err)
		}
		if !strings.Contains(log.String(), `"tls":true,"sasl":"scram-sha-512","sasl_user":"relay"`) {
			t.Errorf("the log does not say how the relay connects to Kafka:\n%s", log.String())
		}
		if strings.Contains(log.String(), secret) {
			t.Errorf("the log shows the password:\n%s", log.String())
		}
	})

	t.Run("replay delivers", func(t *testing.T) {
		err, out, errOut := run(t, ctx, append(slices.Clone(replayArgs), securedArgs(k, secret)...)...)
		if err != nil {
			t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
		}
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if recs, err := k.ReadAll(rctx, "secured.replay"); err != nil || len(recs) != 3 {
			t.Errorf("topic has %d records (%v), want 3", len(recs), err)
		}
		if strings.Contains(out+errOut, secret) {
			t.Errorf("the output shows the password:\n%s\n%s", out, errOut)
		}
	})

	t.Run("dlq replay delivers", func(t *testing.T) {
		s := deadletter.NewStore(pool, dlqTable)
		if err := s.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		topics := []string{"secured.dlq.a", "secured.dlq.b"} // two topics: a sink each, sharing the flags' settings
		for i, topic := range topics {
			if err := s.Add(ctx, deadletter.Letter{
				EventID: fmt.Sprintf("dl-%d", i), AggregateType: "order", AggregateID: "o-9", EventType: "OrderPlaced",
				Key: []byte("o-9"), Payload: []byte(`{}`), Topic: topic, ErrorCode: "message_too_large", ErrorMessage: "too large",
				FirstFailedAt: time.Now(), LastFailedAt: time.Now(), RelayName: "r",
			}); err != nil {
				t.Fatal(err)
			}
		}
		err, out, errOut := run(t, ctx, append(slices.Clone(dlqArgs), securedArgs(k, secret)...)...)
		if err != nil {
			t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
		}
		for _, topic := range topics {
			rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			recs, err := k.ReadAll(rctx, topic)
			cancel()
			if err != nil || len(recs) != 1 {
				t.Errorf("topic %s has %d records (%v), want 1", topic, len(recs), err)
			}
		}
	})

	otherCA, err := sandbox.WriteTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	wrongPassword := []string{"refused the SASL login", "the password kafka.sasl.password (--kafka-sasl-password / CDC_RELAY_KAFKA_SASL_PASSWORD)"}
	untrusted := []string{"x509: certificate signed by unknown authority", "the broker's TLS certificate is not trusted: check the CA file kafka.tls.ca_file (--kafka-tls-ca-file / CDC_RELAY_KAFKA_TLS_CA_FILE)"}
	// Each waits --kafka-start-timeout: the relay waits for Kafka that long.
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"run/wrong password", append(slices.Clone(runArgs), securedArgs(k, "wrong-"+secret)...), wrongPassword},
		{"run/another CA", append(append(slices.Clone(runArgs), securedArgs(k, secret)...), "--kafka-tls-ca-file", otherCA.CA), untrusted},
		{"run/wrong server name", append(append(slices.Clone(runArgs), securedArgs(k, secret)...), "--kafka-tls-server-name", "kafka.example.com"),
			[]string{"certificate is valid for", "the server name kafka.tls.server_name (--kafka-tls-server-name / CDC_RELAY_KAFKA_TLS_SERVER_NAME)"}},
		{"replay/wrong password", append(slices.Clone(replayArgs), securedArgs(k, "wrong-"+secret)...), wrongPassword},
		{"dlq replay/wrong password", append(slices.Clone(dlqArgs), securedArgs(k, "wrong-"+secret)...), wrongPassword},
	}
	t.Run("errors", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				args := tt.args
				if args[0] == "run" { // halt: no dead-letter table for the parallel runs to race on creating
					args = append(slices.Clone(args), "--topic", "secured.fail", "--slot", "secured_fail", "--on-error", "halt")
				}
				rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				err, out, errOut := run(t, rctx, args...)
				if err == nil {
					t.Fatal("no error")
				}
				for _, w := range tt.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error lacks %q:\n%v", w, err)
					}
				}
				if args[0] == "run" && !strings.Contains(errOut, "cdc-relay stopped with an error") {
					t.Errorf("the error was not logged:\n%s", errOut)
				}
				for what, s := range map[string]string{"error": err.Error(), "stdout": out, "log": errOut} {
					if strings.Contains(s, secret) {
						t.Errorf("the %s shows the password:\n%s", what, s)
					}
				}
			})
		}
	})
	var slots int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'secured_fail'").Scan(&slots); err != nil || slots != 0 {
		t.Errorf("failed starts left %d slots (%v): a relay that cannot reach Kafka must create none", slots, err)
	}
}
