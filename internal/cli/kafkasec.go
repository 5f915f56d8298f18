package cli

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
)

// KafkaSecurityFlags are the TLS and SASL flags of every command that talks
// to Kafka. The password is never printed: not in errors, logs or --help.
// The file flags are strings, not kong paths, which would turn an empty
// value (a variable set to "") into the working directory.
type KafkaSecurityFlags struct {
	KafkaTLS                   bool   `key:"kafka.tls.enabled" name:"kafka-tls" help:"Connect to Kafka over TLS (1.2 or later), verifying the brokers' certificates against the system's CAs or --kafka-tls-ca-file. Implied by every other --kafka-tls-* flag."`
	KafkaTLSCAFile             string `key:"kafka.tls.ca_file" name:"kafka-tls-ca-file" help:"PEM file of the CA certificates that signed the brokers' certificates (default: the system's CAs)." placeholder:"FILE"`
	KafkaTLSCertFile           string `key:"kafka.tls.cert_file" name:"kafka-tls-cert-file" help:"PEM client certificate, for brokers that require one (with --kafka-tls-key-file)." placeholder:"FILE"`
	KafkaTLSKeyFile            string `key:"kafka.tls.key_file" name:"kafka-tls-key-file" help:"PEM private key of --kafka-tls-cert-file." placeholder:"FILE"`
	KafkaTLSServerName         string `key:"kafka.tls.server_name" name:"kafka-tls-server-name" help:"Name the brokers' certificates must be issued for (default: the host of each broker address)." placeholder:"NAME"`
	KafkaTLSInsecureSkipVerify bool   `key:"kafka.tls.insecure_skip_verify" name:"kafka-tls-insecure-skip-verify" help:"INSECURE, for tests only: accept any broker certificate, so anyone on the network path can read and change the traffic and take the SASL credentials."`

	KafkaSASLMechanism    string `key:"kafka.sasl.mechanism" name:"kafka-sasl-mechanism" default:"none" enum:"none,plain,scram-sha-256,scram-sha-512" help:"SASL mechanism to log in to Kafka with: none, plain (sends the password itself: use it with TLS only), scram-sha-256 or scram-sha-512."`
	KafkaSASLUsername     string `key:"kafka.sasl.username" name:"kafka-sasl-username" help:"SASL user name." placeholder:"USER"`
	KafkaSASLPassword     string `key:"kafka.sasl.password" name:"kafka-sasl-password" help:"SASL password. Prefer the environment variable or --kafka-sasl-password-file: other users of the host can see a command line." placeholder:"PASSWORD"`
	KafkaSASLPasswordFile string `key:"kafka.sasl.password_file" name:"kafka-sasl-password-file" help:"Read --kafka-sasl-password from this file instead (e.g. a mounted secret); a trailing newline is ignored." placeholder:"FILE"`

	sec *kafkaSecurity `kong:"-"` // set by resolveKafkaSecurity
}

// kafkaSecurity is what the TLS and SASL flags resolve to.
type kafkaSecurity struct {
	tls  *tls.Config // nil: plain TCP
	sasl *saslWatch  // nil: no SASL
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

// tlsOn reports whether any TLS flag is set: each implies --kafka-tls.
func (f *KafkaSecurityFlags) tlsOn() bool {
	return f.KafkaTLS || f.KafkaTLSCAFile != "" || f.KafkaTLSCertFile != "" || f.KafkaTLSKeyFile != "" ||
		f.KafkaTLSServerName != "" || f.KafkaTLSInsecureSkipVerify
}

// resolveKafkaSecurity checks the TLS and SASL flags, reads their files and
// builds the TLS config and SASL mechanism. Errors name the flag and its
// environment variable, never the password. Calling it again does nothing.
func (f *KafkaSecurityFlags) resolveKafkaSecurity() error {
	if f.sec != nil {
		return nil
	}
	if err := f.readPasswordFile(); err != nil {
		return err
	}
	mech, err := f.saslMechanism()
	if err != nil {
		return err
	}
	tc, err := f.tlsConfig()
	if err != nil {
		return err
	}
	f.sec = &kafkaSecurity{tls: tc}
	if mech != nil {
		f.sec.sasl = &saslWatch{Mechanism: mech}
	}
	return nil
}

// readPasswordFile reads --kafka-sasl-password-file into KafkaSASLPassword.
func (f *KafkaSecurityFlags) readPasswordFile() error {
	if f.KafkaSASLPasswordFile == "" {
		return nil
	}
	if f.KafkaSASLPassword != "" {
		return flagError("kafka-sasl-password-file", "and --kafka-sasl-password ("+envName("kafka-sasl-password")+") are both set: use one")
	}
	b, err := os.ReadFile(f.KafkaSASLPasswordFile)
	if err != nil {
		return flagError("kafka-sasl-password-file", fmt.Sprintf("cannot be read: %v", err))
	}
	pw := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if pw == "" {
		return flagError("kafka-sasl-password-file", fmt.Sprintf("names %s, which is empty", f.KafkaSASLPasswordFile))
	}
	f.KafkaSASLPassword = pw
	f.KafkaSASLPasswordFile = "" // read: a second call keeps the password
	return nil
}

// saslMechanism returns the mechanism of the SASL flags, nil for none.
func (f *KafkaSecurityFlags) saslMechanism() (sasl.Mechanism, error) {
	mechanism := strings.ToLower(f.KafkaSASLMechanism)
	if mechanism == "" || mechanism == "none" {
		switch {
		case f.KafkaSASLUsername != "":
			return nil, flagError("kafka-sasl-mechanism", "is none, but --kafka-sasl-username is set: choose plain, scram-sha-256 or scram-sha-512, or unset the user name")
		case f.KafkaSASLPassword != "":
			return nil, flagError("kafka-sasl-mechanism", "is none, but a SASL password is set: choose plain, scram-sha-256 or scram-sha-512, or unset the password")
		}
		return nil, nil
	}
	if f.KafkaSASLUsername == "" {
		return nil, flagError("kafka-sasl-username", fmt.Sprintf("is required with --kafka-sasl-mechanism=%s", mechanism))
	}
	if f.KafkaSASLPassword == "" {
		return nil, flagError("kafka-sasl-password", fmt.Sprintf("is required with --kafka-sasl-mechanism=%s (or set --kafka-sasl-password-file / %s)", mechanism, envName("kafka-sasl-password-file")))
	}
	var algo scram.Algorithm
	switch mechanism {
	case "plain":
		return plain.Mechanism{Username: f.KafkaSASLUsername, Password: f.KafkaSASLPassword}, nil
	case "scram-sha-256":
		algo = scram.SHA256
	case "scram-sha-512":
		algo = scram.SHA512
	default:
		return nil, flagError("kafka-sasl-mechanism", fmt.Sprintf("is %q: use none, plain, scram-sha-256 or scram-sha-512", f.KafkaSASLMechanism))
	}
	m, err := scram.Mechanism(algo, f.KafkaSASLUsername, f.KafkaSASLPassword)
	if err == nil {
		return m, nil
	}
	// The library's error quotes the password: say which value it refused,
	// not what it was.
	const why = "cannot be used with SCRAM: it has characters SASLprep (RFC 4013) prohibits, such as control characters"
	if _, uerr := scram.Mechanism(algo, f.KafkaSASLUsername, "x"); uerr != nil {
		return nil, flagError("kafka-sasl-username", why)
	}
	return nil, flagError("kafka-sasl-password", why)
}

// tlsConfig returns the TLS config of the TLS flags, nil when TLS is off.
func (f *KafkaSecurityFlags) tlsConfig() (*tls.Config, error) {
	if !f.tlsOn() {
		return nil, nil
	}
	c := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         f.KafkaTLSServerName,
		InsecureSkipVerify: f.KafkaTLSInsecureSkipVerify, // asked for, and warned about in --help and the log
	}
	if f.KafkaTLSCAFile != "" {
		pool, err := readCAs(f.KafkaTLSCAFile)
		if err != nil {
			return nil, flagError("kafka-tls-ca-file", err.Error())
		}
		c.RootCAs = pool
	}
	switch {
	case f.KafkaTLSCertFile != "" && f.KafkaTLSKeyFile == "":
		return nil, flagError("kafka-tls-key-file", "is required with --kafka-tls-cert-file: the private key of the client certificate")
	case f.KafkaTLSKeyFile != "" && f.KafkaTLSCertFile == "":
		return nil, flagError("kafka-tls-cert-file", "is required with --kafka-tls-key-file: the client certificate of the key")
	case f.KafkaTLSCertFile != "":
		cert, err := tls.LoadX509KeyPair(f.KafkaTLSCertFile, f.KafkaTLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-cert-file (%s) and --kafka-tls-key-file (%s): load client certificate %s and key %s: %w",
				envName("kafka-tls-cert-file"), envName("kafka-tls-key-file"), f.KafkaTLSCertFile, f.KafkaTLSKeyFile, err)
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
		return nil, fmt.Errorf("cannot be read: %w", err)
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
			return nil, fmt.Errorf("names %s, whose certificate #%d cannot be parsed: %w", path, n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("names %s, which holds no PEM certificate (-----BEGIN CERTIFICATE-----)", path)
	}
	return pool, nil
}

// kafkaTransport returns a new kafka-go Transport carrying the TLS and SASL
// flags, or nil (plain TCP, no SASL) when none is set. A new one per call:
// a Transport holds connections, and each sink closes its own.
func (f *KafkaSecurityFlags) kafkaTransport() (*kafka.Transport, error) {
	if err := f.resolveKafkaSecurity(); err != nil {
		return nil, err
	}
	if f.sec.tls == nil && f.sec.sasl == nil {
		return nil, nil
	}
	t := &kafka.Transport{TLS: f.sec.tls}
	if f.sec.sasl != nil {
		t.SASL = f.sec.sasl
	}
	return t, nil
}

// logKafkaSecurity logs how the commands connect to Kafka, with a warning for
// settings that give the connection away. It never logs the password.
func (f *KafkaSecurityFlags) logKafkaSecurity(log zerolog.Logger) {
	if f.resolveKafkaSecurity() != nil {
		return // the command fails on the error elsewhere
	}
	tlsOn, mechanism := f.sec.tls != nil, strings.ToLower(f.KafkaSASLMechanism)
	if tlsOn && f.KafkaTLSInsecureSkipVerify {
		log.Warn().Msg("Kafka TLS certificates are NOT verified (--kafka-tls-insecure-skip-verify): anyone on the network path can read and change the traffic and take the SASL credentials; use it for tests only")
	}
	if !tlsOn && mechanism == "plain" {
		log.Warn().Msg("SASL PLAIN without TLS sends the Kafka password in clear text: set --kafka-tls")
	}
	ev := log.Info().Bool("tls", tlsOn).Str("sasl", mechanism)
	if f.sec.sasl != nil {
		ev = ev.Str("sasl_user", f.KafkaSASLUsername)
	}
	ev.Msg("Kafka connection security")
}

// explainKafkaError adds the TLS or SASL flags to check to an error from
// reaching Kafka that they may have caused. nil stays nil, and so do errors
// of connecting to Postgres, which has TLS errors of its own.
func (f *KafkaSecurityFlags) explainKafkaError(err error) error {
	var pgConnect *pgconn.ConnectError
	if err == nil || errors.As(err, &pgConnect) {
		return err
	}
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		op      *net.OpError
	)
	tlsOn := f.tlsOn()
	saslRefused := f.sec != nil && f.sec.sasl.refused()
	switch {
	case errors.Is(err, kafka.SASLAuthenticationFailed),
		saslRefused && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)):
		return fmt.Errorf("%w (the broker refused the SASL login: check --kafka-sasl-username (%s), --kafka-sasl-password or --kafka-sasl-password-file (%s, %s) and --kafka-sasl-mechanism (%s))",
			err, envName("kafka-sasl-username"), envName("kafka-sasl-password"), envName("kafka-sasl-password-file"), envName("kafka-sasl-mechanism"))
	case errors.Is(err, kafka.UnsupportedSASLMechanism):
		return fmt.Errorf("%w (the broker does not offer SASL mechanism %s: check --kafka-sasl-mechanism (%s))", err, f.KafkaSASLMechanism, envName("kafka-sasl-mechanism"))
	case !tlsOn: // the errors below are TLS errors, not Kafka's
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &host):
		return fmt.Errorf("%w (the broker's TLS certificate is not trusted: check --kafka-tls-ca-file (%s) and --kafka-tls-server-name (%s))",
			err, envName("kafka-tls-ca-file"), envName("kafka-tls-server-name"))
	case errors.As(err, &op) && op.Op == "remote error": // a TLS alert from the broker
		return fmt.Errorf("%w (the broker refused the TLS handshake: if it requires a client certificate, set --kafka-tls-cert-file (%s) and --kafka-tls-key-file (%s))",
			err, envName("kafka-tls-cert-file"), envName("kafka-tls-key-file"))
	}
	return err
}
