package cli

import "github.com/cdc-relay/cdc-relay/internal/kafkaconn"

// KafkaSecurityFlags are the TLS and SASL flags of every command that talks
// to Kafka. The password is never printed: not in errors, logs or --help.
// The file flags are strings, not kong paths, which would turn an empty
// value (a variable set to "") into the working directory.
type KafkaSecurityFlags struct {
	KafkaTLS                   bool   `key:"kafka.tls.enabled" field:"Kafka.TLS.Enabled" name:"kafka-tls" help:"Connect to Kafka over TLS 1.2+, verifying the brokers' certificates against the system's CAs or --kafka-tls-ca-file (implied by every other --kafka-tls-* flag)."`
	KafkaTLSCAFile             string `key:"kafka.tls.ca_file" field:"Kafka.TLS.CAFile" name:"kafka-tls-ca-file" help:"PEM file of the CA certificates that signed the brokers' certificates (default: the system's CAs)." placeholder:"FILE"`
	KafkaTLSCertFile           string `key:"kafka.tls.cert_file" field:"Kafka.TLS.CertFile" name:"kafka-tls-cert-file" help:"PEM client certificate, for brokers that require one (with --kafka-tls-key-file)." placeholder:"FILE"`
	KafkaTLSKeyFile            string `key:"kafka.tls.key_file" field:"Kafka.TLS.KeyFile" name:"kafka-tls-key-file" help:"PEM private key of --kafka-tls-cert-file." placeholder:"FILE"`
	KafkaTLSServerName         string `key:"kafka.tls.server_name" field:"Kafka.TLS.ServerName" name:"kafka-tls-server-name" help:"Name the brokers' certificates must be issued for (default: the host of each broker address)." placeholder:"NAME"`
	KafkaTLSInsecureSkipVerify bool   `key:"kafka.tls.insecure_skip_verify" field:"Kafka.TLS.InsecureSkipVerify" name:"kafka-tls-insecure-skip-verify" help:"INSECURE, for tests only: accept any broker certificate, so anyone on the network path can read and change the traffic and take the SASL credentials."`

	KafkaSASLMechanism    string `key:"kafka.sasl.mechanism" field:"Kafka.SASL.Mechanism" name:"kafka-sasl-mechanism" default:"none" enum:"none,plain,scram-sha-256,scram-sha-512" help:"SASL mechanism to log in to Kafka with: none, plain (sends the password itself: use it with TLS only), scram-sha-256 or scram-sha-512."`
	KafkaSASLUsername     string `key:"kafka.sasl.username" field:"Kafka.SASL.Username" name:"kafka-sasl-username" help:"SASL user name." placeholder:"USER"`
	KafkaSASLPassword     string `key:"kafka.sasl.password" field:"Kafka.SASL.Password" name:"kafka-sasl-password" help:"SASL password. Prefer the environment variable or --kafka-sasl-password-file: other users of the host can see a command line." placeholder:"PASSWORD"`
	KafkaSASLPasswordFile string `key:"kafka.sasl.password_file" field:"Kafka.SASL.PasswordFile" name:"kafka-sasl-password-file" help:"Read --kafka-sasl-password from this file instead (e.g. a mounted secret); a trailing newline is ignored." placeholder:"FILE"`

	conn *kafkaconn.Conn `kong:"-"` // set by resolveKafkaSecurity
}

// resolveKafkaSecurity checks the TLS and SASL flags and reads their files
// (kafkaconn.New); the password file is read into the password flag.
// Calling it again does nothing.
func (f *KafkaSecurityFlags) resolveKafkaSecurity() error {
	if f.conn != nil {
		return nil
	}
	cfg := kafkaconn.Config{
		TLS: kafkaconn.TLS{Enabled: f.KafkaTLS, CAFile: f.KafkaTLSCAFile, CertFile: f.KafkaTLSCertFile, KeyFile: f.KafkaTLSKeyFile,
			ServerName: f.KafkaTLSServerName, InsecureSkipVerify: f.KafkaTLSInsecureSkipVerify},
		SASL: kafkaconn.SASL{Mechanism: f.KafkaSASLMechanism, Username: f.KafkaSASLUsername, Password: f.KafkaSASLPassword,
			PasswordFile: f.KafkaSASLPasswordFile},
		Names: runNames.Within("Kafka"),
	}
	if err := cfg.ReadPasswordFile(); err != nil {
		return err
	}
	// The file's password is the password setting, as every file flag's value is.
	f.KafkaSASLPassword, f.KafkaSASLPasswordFile = cfg.SASL.Password, cfg.SASL.PasswordFile
	conn, err := kafkaconn.New(cfg)
	f.conn = conn
	return err
}

// kafkaConn returns the connection settings of the flags, resolving them
// first.
func (f *KafkaSecurityFlags) kafkaConn() (*kafkaconn.Conn, error) {
	err := f.resolveKafkaSecurity()
	return f.conn, err
}
