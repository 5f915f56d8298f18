// Package kafkaconn is how cdc-relay connects to Kafka: the brokers'
// addresses (ParseBrokers), TLS from PEM files, a SASL mechanism with its
// password (or a file holding it), the kafka-go Transport carrying both, the
// log line saying how the relay connects, and the hint an error from
// reaching Kafka gets when these settings may have caused it. It names
// settings by its Config's fields, through Names; the password is never
// printed: not in errors nor logs.
package kafkaconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// Config is how to connect to Kafka. Its zero value is plain TCP without
// SASL.
type Config struct {
	TLS  TLS
	SASL SASL
	// Names names the fields of this Config in errors and log lines
	// ("TLS.CAFile").
	Names setting.Namer
}

// TLS is the TLS of the connection. Any field set turns it on.
type TLS struct {
	Enabled            bool   // TLS 1.2 or later, verified against the system's CAs or CAFile
	CAFile             string // PEM CA certificates of the brokers' certificates ("": the system's)
	CertFile, KeyFile  string // PEM client certificate and its key, both or neither
	ServerName         string // name the brokers' certificates must carry ("": each broker's host)
	InsecureSkipVerify bool   // accept any certificate: for tests only, logged as a warning
}

// on reports whether TLS is on: every field implies Enabled.
func (t TLS) on() bool {
	return t.Enabled || t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify
}

// SASL is the login of the connection.
type SASL struct {
	Mechanism    string // none (or ""), plain, scram-sha-256 or scram-sha-512
	Username     string
	Password     string // or PasswordFile, not both
	PasswordFile string // a file holding the password; a trailing newline is ignored
}

// Conn is a checked Config: its files read, its TLS config and SASL
// mechanism built. Make it with New; it is safe for concurrent use.
type Conn struct {
	cfg  Config      // with the password of PasswordFile
	tls  *tls.Config // nil: plain TCP
	sasl *saslWatch  // nil: no SASL
}

// New checks cfg, reads its files and builds the TLS config and SASL
// mechanism. An error is a *setting.FieldError naming the setting to fix,
// never the password.
func New(cfg Config) (*Conn, error) {
	if err := cfg.ReadPasswordFile(); err != nil {
		return nil, err
	}
	mech, err := saslMechanism(cfg)
	if err != nil {
		return nil, err
	}
	tc, err := tlsConfig(cfg)
	if err != nil {
		return nil, err
	}
	c := &Conn{cfg: cfg, tls: tc}
	if mech != nil {
		c.sasl = &saslWatch{Mechanism: mech}
	}
	return c, nil
}

// ReadPasswordFile reads SASL.PasswordFile into SASL.Password and clears
// it, so that a second call keeps the password. New calls it; a caller that
// shows its settings calls it first to show the password as set.
func (cfg *Config) ReadPasswordFile() error {
	s, n := &cfg.SASL, cfg.Names
	if s.PasswordFile == "" {
		return nil
	}
	if s.Password != "" {
		return n.Errorf("SASL.PasswordFile", "a SASL password %s and a password file are both set: unset one, the password or the file", n.Name("SASL.Password"))
	}
	b, err := os.ReadFile(s.PasswordFile)
	if err != nil {
		return n.Errorf("SASL.PasswordFile", "the SASL password file cannot be read: %w; check the file", err)
	}
	pw := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if pw == "" {
		return n.Errorf("SASL.PasswordFile", "the SASL password file %s is empty: write the password into it, or fix the file", s.PasswordFile)
	}
	s.Password, s.PasswordFile = pw, ""
	return nil
}

// mechanism is cfg's SASL mechanism in lower case, "none" for none.
func (cfg Config) mechanism() string {
	if m := strings.ToLower(cfg.SASL.Mechanism); m != "" {
		return m
	}
	return "none"
}

// saslMechanism returns the SASL mechanism of cfg, nil for none.
func saslMechanism(cfg Config) (sasl.Mechanism, error) {
	s, n, mechanism := cfg.SASL, cfg.Names, cfg.mechanism()
	const choose = "choose plain, scram-sha-256 or scram-sha-512 as the mechanism"
	if mechanism == "none" {
		switch {
		case s.Username != "":
			return nil, n.Errorf("SASL.Mechanism", "a SASL user name %s is set, but the SASL mechanism is none: unset the user name, or "+choose, n.Name("SASL.Username"))
		case s.Password != "":
			return nil, n.Errorf("SASL.Mechanism", "a SASL password is set, but the SASL mechanism is none: unset the password, or "+choose)
		}
		return nil, nil
	}
	if s.Username == "" {
		return nil, n.Errorf("SASL.Username", "a SASL user name is required with SASL mechanism %s: set the user name", mechanism)
	}
	if s.Password == "" {
		return nil, n.Errorf("SASL.Password", "a SASL password is required with SASL mechanism %s: set a password file %s, or the password", mechanism, n.Name("SASL.PasswordFile"))
	}
	var algo scram.Algorithm
	switch mechanism {
	case "plain":
		return plain.Mechanism{Username: s.Username, Password: s.Password}, nil
	case "scram-sha-256":
		algo = scram.SHA256
	case "scram-sha-512":
		algo = scram.SHA512
	default:
		return nil, n.Errorf("SASL.Mechanism", "SASL mechanism %q is unknown: use none, or "+choose, s.Mechanism)
	}
	m, err := scram.Mechanism(algo, s.Username, s.Password)
	if err == nil {
		return m, nil
	}
	// The library's error quotes the password: say which value it refused,
	// not what it was.
	const why = "cannot be used with SCRAM: it has characters SASLprep (RFC 4013) prohibits, such as control characters; fix the"
	if _, uerr := scram.Mechanism(algo, s.Username, "x"); uerr != nil {
		return nil, n.Errorf("SASL.Username", "the SASL user name "+why+" user name")
	}
	return nil, n.Errorf("SASL.Password", "the SASL password "+why+" password")
}

// tlsConfig returns the TLS config of cfg, nil when TLS is off.
func tlsConfig(cfg Config) (*tls.Config, error) {
	t, n := cfg.TLS, cfg.Names
	if !t.on() {
		return nil, nil
	}
	c := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, // asked for, and warned about in the log
	}
	if t.CAFile != "" {
		pool, err := readCAs(t.CAFile)
		if err != nil {
			return nil, n.Errorf("TLS.CAFile", "%w; check the CA file", err)
		}
		c.RootCAs = pool
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		return nil, n.Errorf("TLS.KeyFile", "the TLS key file is required with a client certificate file %s: set the private key of the client certificate", n.Name("TLS.CertFile"))
	case t.KeyFile != "" && t.CertFile == "":
		return nil, n.Errorf("TLS.CertFile", "the TLS client certificate file is required with a key file %s: set the client certificate of the key", n.Name("TLS.KeyFile"))
	case t.CertFile != "":
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, n.Errorf("TLS.CertFile", "load client certificate %s and key %s: %w; check the key file %s and the certificate file",
				t.CertFile, t.KeyFile, err, n.Name("TLS.KeyFile"))
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// readCAs reads a PEM file of CA certificates. Unlike
// x509.CertPool.AppendCertsFromPEM it refuses a file with a broken
// certificate or none at all, instead of trusting whatever it could parse.
func readCAs(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the TLS CA file cannot be read: %w", err)
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("the TLS CA file %s has a certificate #%d that cannot be parsed: %w", path, n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("the TLS CA file %s holds no PEM certificate (-----BEGIN CERTIFICATE-----)", path)
	}
	return pool, nil
}

// Transport returns a new kafka-go Transport carrying the TLS config and
// SASL mechanism, or nil (plain TCP, no SASL) when neither is set. A new one
// per call: a Transport holds connections, and each sink closes its own.
func (c *Conn) Transport() *kafka.Transport {
	if c.tls == nil && c.sasl == nil {
		return nil
	}
	t := &kafka.Transport{TLS: c.tls}
	if c.sasl != nil {
		t.SASL = c.sasl
	}
	return t
}

// Log logs how the relay connects to Kafka, with a warning for settings
// that give the connection away. It never logs the password.
func (c *Conn) Log(log zerolog.Logger) {
	n, tlsOn, mechanism := c.cfg.Names, c.tls != nil, c.cfg.mechanism()
	if tlsOn && c.cfg.TLS.InsecureSkipVerify {
		log.Warn().Msg("Kafka TLS certificates are NOT verified, as skipping verification " + n.Name("TLS.InsecureSkipVerify") +
			" asks: anyone on the network path can read and change the traffic and take the SASL credentials; use it for tests only")
	}
	if !tlsOn && mechanism == "plain" {
		log.Warn().Msg("SASL PLAIN without TLS sends the Kafka password in clear text: turn TLS on " + n.Name("TLS.Enabled"))
	}
	ev := log.Info().Bool("tls", tlsOn).Str("sasl", mechanism)
	if c.sasl != nil {
		ev = ev.Str("sasl_user", c.cfg.SASL.Username)
	}
	ev.Msg("Kafka connection security")
}

// Explain adds the TLS or SASL settings to check to an error from reaching
// Kafka that they may have caused. nil stays nil, and so do errors of
// connecting to Postgres, which has TLS errors of its own.
func (c *Conn) Explain(err error) error {
	var pgConnect *pgconn.ConnectError
	if err == nil || errors.As(err, &pgConnect) {
		return err
	}
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		op      *net.OpError
		n       = c.cfg.Names
	)
	switch {
	case errors.Is(err, kafka.SASLAuthenticationFailed),
		c.sasl.refused() && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)):
		return fmt.Errorf("%w (the broker refused the SASL login: check the user name %s, the password %s or its file %s and the mechanism %s)",
			err, n.Name("SASL.Username"), n.Name("SASL.Password"), n.Name("SASL.PasswordFile"), n.Name("SASL.Mechanism"))
	case errors.Is(err, kafka.UnsupportedSASLMechanism):
		return fmt.Errorf("%w (the broker does not offer SASL mechanism %s: check the mechanism %s)", err, c.cfg.mechanism(), n.Name("SASL.Mechanism"))
	case c.tls == nil: // the errors below are TLS errors, not Kafka's
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &host):
		return fmt.Errorf("%w (the broker's TLS certificate is not trusted: check the CA file %s and the server name %s)",
			err, n.Name("TLS.CAFile"), n.Name("TLS.ServerName"))
	case errors.As(err, &op) && op.Op == "remote error": // a TLS alert from the broker
		return fmt.Errorf("%w (the broker refused the TLS handshake: if it requires a client certificate, set the certificate file %s and the key file %s)",
			err, n.Name("TLS.CertFile"), n.Name("TLS.KeyFile"))
	}
	return err
}

// saslWatch is a SASL mechanism that counts the logins it began and
// finished. A broker may refuse a login by closing the connection instead of
// answering SASL_AUTHENTICATION_FAILED (kfake does), which kafka-go reports
// as an unexpected EOF; logins begun but none finished tell that apart.
type saslWatch struct {
	sasl.Mechanism
	begun, finished atomic.Int64
}

// Start begins a login.
func (w *saslWatch) Start(ctx context.Context) (sasl.StateMachine, []byte, error) {
	sm, ir, err := w.Mechanism.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	w.begun.Add(1)
	return &watchedLogin{StateMachine: sm, w: w}, ir, nil
}

// refused reports whether logins were begun and none finished.
func (w *saslWatch) refused() bool {
	return w != nil && w.begun.Load() > 0 && w.finished.Load() == 0
}

// watchedLogin is one login of a saslWatch.
type watchedLogin struct {
	sasl.StateMachine
	w *saslWatch
}

// Next takes the broker's next challenge.
func (l *watchedLogin) Next(ctx context.Context, challenge []byte) (bool, []byte, error) {
	done, resp, err := l.StateMachine.Next(ctx, challenge)
	if done && err == nil {
		l.w.finished.Add(1)
	}
	return done, resp, err
}
