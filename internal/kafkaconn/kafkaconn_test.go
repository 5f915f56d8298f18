package kafkaconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"

	"github.com/cdc-relay/cdc-relay/internal/outbox"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/setting"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// secret is the SASL password of these tests; no output may show it.
const secret = "Kafka-s3cret-pw"

// mustNew returns New(cfg), failing the test on an error.
func mustNew(t *testing.T, cfg Config) *Conn {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
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

// TestNew checks what each Config builds, and that each mistake is a
// FieldError of the field to fix that never shows the password.
func TestNew(t *testing.T) {
	dir := t.TempDir()
	pki, err := sandbox.WriteTLSFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	pwFile := writeFile(t, dir, "pw", secret+"\r\n")
	emptyFile := writeFile(t, dir, "empty", "\n")
	notPEM := writeFile(t, dir, "not-pem", "hello")
	brokenPEM := writeFile(t, dir, "broken-pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
	plainUser := func(pw, file string) SASL {
		return SASL{Mechanism: "plain", Username: "u", Password: pw, PasswordFile: file}
	}

	type want struct {
		tls        bool
		serverName string
		insecure   bool
		rootCAs    bool
		clientCert bool
		sasl       string // mechanism name, "" for none
		login      string // the PLAIN login's initial response
	}
	tests := []struct {
		name      string
		cfg       Config
		want      want
		wantField string // the field of the error, "" for none
		wantErr   string // a substring of the error
	}{
		{name: "none", cfg: Config{SASL: SASL{Mechanism: "none"}}},
		{name: "zero", cfg: Config{}},
		{name: "tls", cfg: Config{TLS: TLS{Enabled: true}}, want: want{tls: true}},
		{name: "CA file implies tls", cfg: Config{TLS: TLS{CAFile: pki.CA}}, want: want{tls: true, rootCAs: true}},
		{name: "client certificate", cfg: Config{TLS: TLS{CertFile: pki.ClientCert, KeyFile: pki.ClientKey}}, want: want{tls: true, clientCert: true}},
		{name: "server name", cfg: Config{TLS: TLS{ServerName: "kafka.internal"}}, want: want{tls: true, serverName: "kafka.internal"}},
		{name: "insecure", cfg: Config{TLS: TLS{InsecureSkipVerify: true}}, want: want{tls: true, insecure: true}},
		{name: "plain", cfg: Config{SASL: plainUser(secret, "")}, want: want{sasl: "PLAIN", login: "\x00u\x00" + secret}},
		{name: "plain in capitals", cfg: Config{SASL: SASL{Mechanism: "PLAIN", Username: "u", Password: secret}}, want: want{sasl: "PLAIN", login: "\x00u\x00" + secret}},
		{name: "password file without its line end", cfg: Config{SASL: plainUser("", pwFile)}, want: want{sasl: "PLAIN", login: "\x00u\x00" + secret}},
		{name: "scram-sha-256", cfg: Config{SASL: SASL{Mechanism: "scram-sha-256", Username: "u", Password: secret}}, want: want{sasl: "SCRAM-SHA-256"}},
		{name: "scram-sha-512 and tls", cfg: Config{TLS: TLS{CAFile: pki.CA}, SASL: SASL{Mechanism: "scram-sha-512", Username: "u", PasswordFile: pwFile}},
			want: want{sasl: "SCRAM-SHA-512", tls: true, rootCAs: true}},

		{name: "unreadable CA file", cfg: Config{TLS: TLS{CAFile: filepath.Join(dir, "nope.pem")}}, wantField: "TLS.CAFile", wantErr: "the TLS CA file cannot be read"},
		{name: "CA file not PEM", cfg: Config{TLS: TLS{CAFile: notPEM}}, wantField: "TLS.CAFile", wantErr: "holds no PEM certificate"},
		{name: "CA file with a broken certificate", cfg: Config{TLS: TLS{CAFile: brokenPEM}}, wantField: "TLS.CAFile", wantErr: "certificate #1 that cannot be parsed"},
		{name: "certificate without key", cfg: Config{TLS: TLS{CertFile: pki.ClientCert}}, wantField: "TLS.KeyFile",
			wantErr: "the TLS key file is required with a client certificate file (setting TLS.CertFile)"},
		{name: "key without certificate", cfg: Config{TLS: TLS{KeyFile: pki.ClientKey}}, wantField: "TLS.CertFile",
			wantErr: "the TLS client certificate file is required with a key file (setting TLS.KeyFile)"},
		{name: "key of another certificate", cfg: Config{TLS: TLS{CertFile: pki.ClientCert, KeyFile: pki.ServerKey}}, wantField: "TLS.CertFile",
			wantErr: "private key does not match"},
		{name: "certificate not PEM", cfg: Config{TLS: TLS{CertFile: notPEM, KeyFile: pki.ClientKey}}, wantField: "TLS.CertFile", wantErr: "load client certificate"},
		{name: "mechanism without user", cfg: Config{SASL: SASL{Mechanism: "scram-sha-512", Password: secret}}, wantField: "SASL.Username",
			wantErr: "a SASL user name is required with SASL mechanism scram-sha-512"},
		{name: "mechanism without password", cfg: Config{SASL: plainUser("", "")}, wantField: "SASL.Password",
			wantErr: "a SASL password is required with SASL mechanism plain: set a password file (setting SASL.PasswordFile)"},
		{name: "user without mechanism", cfg: Config{SASL: SASL{Username: "u"}}, wantField: "SASL.Mechanism", wantErr: "but the SASL mechanism is none"},
		{name: "password without mechanism", cfg: Config{SASL: SASL{Mechanism: "none", Password: secret}}, wantField: "SASL.Mechanism", wantErr: "but the SASL mechanism is none"},
		{name: "password and password file", cfg: Config{SASL: plainUser(secret, pwFile)}, wantField: "SASL.PasswordFile", wantErr: "are both set"},
		{name: "missing password file", cfg: Config{SASL: plainUser("", filepath.Join(dir, "nope"))}, wantField: "SASL.PasswordFile", wantErr: "cannot be read"},
		{name: "empty password file", cfg: Config{SASL: plainUser("", emptyFile)}, wantField: "SASL.PasswordFile", wantErr: "is empty"},
		{name: "SCRAM password SASLprep refuses", cfg: Config{SASL: SASL{Mechanism: "scram-sha-256", Username: "u", Password: secret + "\x07"}},
			wantField: "SASL.Password", wantErr: "the SASL password cannot be used with SCRAM"},
		{name: "SCRAM user SASLprep refuses", cfg: Config{SASL: SASL{Mechanism: "scram-sha-256", Username: "u\x07", Password: secret}},
			wantField: "SASL.Username", wantErr: "the SASL user name cannot be used with SCRAM"},
		{name: "unknown mechanism", cfg: Config{SASL: SASL{Mechanism: "gssapi", Username: "u", Password: secret}}, wantField: "SASL.Mechanism",
			wantErr: `SASL mechanism "gssapi" is unknown`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.cfg)
			if tt.wantField != "" {
				if err == nil {
					t.Fatalf("no error, want one of %s containing %q", tt.wantField, tt.wantErr)
				}
				if f := setting.Fields(err); len(f) != 1 || f[0].Field != tt.wantField {
					t.Errorf("error %q is not a FieldError of %s", err, tt.wantField)
				}
				if !strings.Contains(err.Error(), tt.wantErr) || !strings.HasSuffix(err.Error(), "(setting "+tt.wantField+")") {
					t.Errorf("error %q lacks %q or does not end with the setting", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error shows the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tr := c.Transport()
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
				if got.sasl == "PLAIN" {
					_, ir, err := tr.SASL.Start(t.Context())
					if err != nil {
						t.Fatal(err)
					}
					got.login = string(ir)
				}
			}
			if got != tt.want {
				t.Errorf("transport = %+v, want %+v", got, tt.want)
			}
			if tr2 := c.Transport(); tr2 == tr {
				t.Error("Transport returned the same Transport twice: each sink needs its own")
			}
		})
	}
}

// TestLog: the log line says how the relay connects, warns about settings
// that give the connection away, and never shows the password.
func TestLog(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"plain TCP", Config{}, []string{`"tls":false,"sasl":"none","message":"Kafka connection security"`}},
		{"PLAIN without TLS", Config{SASL: SASL{Mechanism: "plain", Username: "u", Password: secret}},
			[]string{`"level":"warn"`, "clear text: turn TLS on (setting TLS.Enabled)", `"tls":false,"sasl":"plain","sasl_user":"u"`}},
		{"insecure", Config{TLS: TLS{InsecureSkipVerify: true}},
			[]string{`"level":"warn"`, "NOT verified, as skipping verification (setting TLS.InsecureSkipVerify) asks", `"tls":true,"sasl":"none"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log sandbox.Buffer
			mustNew(t, tt.cfg).Log(zerolog.New(&log))
			for _, w := range tt.want {
				if !strings.Contains(log.String(), w) {
					t.Errorf("log lacks %q:\n%s", w, log.String())
				}
			}
			if strings.Contains(log.String(), secret) {
				t.Errorf("the log shows the password:\n%s", log.String())
			}
		})
	}
}

// TestTransport delivers events through the sink with the Transport
// of each SASL mechanism, with and without TLS, and reads them back with kgo.
func TestTransport(t *testing.T) {
	t.Parallel()
	mechanisms := []struct{ flag, broker string }{
		{"none", ""}, {"plain", sandbox.SASLPlain}, {"scram-sha-256", sandbox.SASLScramSHA256}, {"scram-sha-512", sandbox.SASLScramSHA512},
	}
	for _, m := range mechanisms {
		for _, tlsMode := range []string{"off", "on", "mutual"} {
			t.Run(m.flag+"/tls-"+tlsMode, func(t *testing.T) {
				t.Parallel()
				opts := sandbox.KafkaOptions{TLS: tlsMode != "off", RequireClientCert: tlsMode == "mutual", Partitions: 2}
				cfg := Config{SASL: SASL{Mechanism: m.flag}}
				if m.broker != "" {
					opts.SASLUsers = []sandbox.SASLUser{{Mechanism: m.broker, User: "relay", Password: secret}}
					cfg.SASL.Username, cfg.SASL.Password = "relay", secret
				}
				k := testenv.NewKafka(t, opts)
				testenv.RequireLocalKafka(t, k)
				if tlsMode != "off" {
					cfg.TLS.CAFile = k.TLSFiles().CA
				}
				if tlsMode == "mutual" {
					cfg.TLS.CertFile, cfg.TLS.KeyFile = k.TLSFiles().ClientCert, k.TLSFiles().ClientKey
				}
				tr := mustNew(t, cfg).Transport()
				if (tr == nil) != (m.broker == "" && tlsMode == "off") {
					t.Fatalf("transport = %v", tr)
				}
				topic := "secured." + m.flag + "." + tlsMode
				sendEvents(t, sink.Config{Brokers: k.Brokers(), Topics: []string{topic}, Transport: tr}, 5)
				ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
				defer cancel()
				recs, err := k.ReadAll(ctx, topic)
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, r := range recs {
					ids = append(ids, r.Headers[sink.HeaderID])
				}
				if slices.Sort(ids); !slices.Equal(ids, []string{"ev-0", "ev-1", "ev-2", "ev-3", "ev-4"}) {
					t.Errorf("Kafka has events %v, want ev-0..ev-4", ids)
				}
			})
		}
	}
}

// sendEvents opens a sink with cfg, sends n events and waits for their acks.
func sendEvents(t *testing.T, cfg sink.Config, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	acked := 0
	done := make(chan struct{})
	cfg.Logger = zerolog.Nop()
	ack := func(_ sink.Message, _ sink.Stored, err error) error {
		if err != nil {
			t.Errorf("event failed: %v", err)
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if acked++; acked == n {
			close(done)
		}
		return nil
	}
	k, err := sink.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open sink: %v", err)
	}
	defer k.Close()
	for i := range n {
		ev := &outbox.Event{ID: fmt.Appendf(nil, "ev-%d", i), AggregateType: []byte("order"),
			AggregateID: fmt.Append(nil, i), EventType: []byte("OrderPlaced"), Payload: []byte(`{}`)}
		if err := k.Produce(sink.Message{Topic: cfg.Topics[0], Event: ev}, ack); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("%d of %d events acknowledged", acked, n)
	}
}

// TestInsecureSkipVerifyWarns: skipping verification reaches a broker
// whose CA is unknown, and says loudly that it is insecure.
func TestInsecureSkipVerifyWarns(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t, sandbox.KafkaOptions{TLS: true, SASLUsers: []sandbox.SASLUser{
		{Mechanism: sandbox.SASLScramSHA512, User: "relay", Password: secret},
	}})
	testenv.RequireLocalKafka(t, k)
	c := mustNew(t, Config{TLS: TLS{InsecureSkipVerify: true}, SASL: SASL{Mechanism: "scram-sha-512", Username: "relay", Password: secret}})
	var log sandbox.Buffer
	c.Log(zerolog.New(&log))
	if !strings.Contains(log.String(), `"level":"warn"`) || !strings.Contains(log.String(), "NOT verified") {
		t.Errorf("no warning logged:\n%s", log.String())
	}
	if strings.Contains(log.String(), secret) {
		t.Errorf("the log shows the password:\n%s", log.String())
	}
	sendEvents(t, sink.Config{Brokers: k.Brokers(), Topics: []string{"secured.insecure"}, Transport: c.Transport()}, 1)
}

// TestExplain opens the sink with settings the broker refuses and
// checks that the error names what to fix.
func TestExplain(t *testing.T) {
	t.Parallel()
	mutual := testenv.NewKafka(t, sandbox.KafkaOptions{RequireClientCert: true})
	testenv.RequireLocalKafka(t, mutual)
	scram256 := testenv.NewKafka(t, sandbox.KafkaOptions{SASLUsers: []sandbox.SASLUser{{Mechanism: sandbox.SASLScramSHA256, User: "u", Password: secret}}})
	tests := []struct {
		name string
		k    *sandbox.Kafka
		cfg  Config
		want string
	}{
		{"no client certificate", mutual, Config{TLS: TLS{CAFile: mutual.TLSFiles().CA}},
			"remote error: tls: certificate required (the broker refused the TLS handshake: if it requires a client certificate, set the certificate file (setting TLS.CertFile) and the key file (setting TLS.KeyFile))"},
		{"wrong mechanism", scram256, Config{SASL: SASL{Mechanism: "scram-sha-512", Username: "u", Password: secret}},
			"refused the SASL login: check the user name (setting SASL.Username)"},
		{"wrong user", scram256, Config{SASL: SASL{Mechanism: "scram-sha-256", Username: "v", Password: secret}},
			"refused the SASL login: check the user name (setting SASL.Username)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := mustNew(t, tt.cfg)
			// The sink retries until ctx ends and reports its last failure; a
			// loaded machine needs a few seconds for the first handshake.
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			k, err := sink.Open(ctx, sink.Config{Brokers: tt.k.Brokers(), Topics: []string{"explain"}, Transport: c.Transport(), Logger: zerolog.Nop()})
			if err == nil {
				k.Close()
				t.Fatal("sink opened")
			}
			if got := c.Explain(err).Error(); !strings.Contains(got, tt.want) {
				t.Errorf("error lacks %q:\n%s", tt.want, got)
			}
		})
	}
}

// TestExplainScope: hints go only on errors TLS or SASL settings
// can cause, and never on Postgres's.
func TestExplainScope(t *testing.T) {
	tlsOn := Config{TLS: TLS{Enabled: true}}
	untrusted := fmt.Errorf("fetch metadata: %w", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}})
	pgConnect := fmt.Errorf("connect to Postgres: %w", &pgconn.ConnectError{})
	sasl := fmt.Errorf("fetch metadata: %w", kafka.SASLAuthenticationFailed)
	other := errors.New("fetch metadata: unexpected EOF")
	tests := []struct {
		name string
		cfg  Config
		err  error
		hint string // "" for the error unchanged
	}{
		{"nil", tlsOn, nil, ""},
		{"untrusted certificate", tlsOn, untrusted, "(setting TLS.CAFile)"},
		{"TLS error without Kafka TLS", Config{}, untrusted, ""},
		{"Postgres connect error", tlsOn, pgConnect, ""},
		{"SASL authentication failed", Config{}, sasl, "(setting SASL.Password)"},
		{"EOF without a refused login", Config{}, other, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mustNew(t, tt.cfg).Explain(tt.err)
			if tt.hint == "" {
				if got != tt.err {
					t.Errorf("Explain(%v) = %v, want it unchanged", tt.err, got)
				}
				return
			}
			if !errors.Is(got, tt.err) || !strings.Contains(got.Error(), tt.hint) {
				t.Errorf("Explain(%v) = %v, want it wrapped with a hint naming %s", tt.err, got, tt.hint)
			}
		})
	}
}
