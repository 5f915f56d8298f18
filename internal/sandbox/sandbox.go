// Package sandbox starts real, throwaway servers on this machine for the
// programs that need them besides the relay: the tests (through testenv), the
// demo (cmd/cdc-relay-demo), the benchmarks and the fault-injection tool. It
// holds a PostgreSQL cluster (initdb + pg_ctl, binaries from FindPGBin), an
// in-process Kafka-protocol broker (kfake), the TLS files both can serve
// with, and a Kafka reader on franz-go's kgo, a different client than the
// relay's kafka-go producer, so a check never reads the producer with itself.
//
// Nothing here is a mock, and nothing depends on package testing: every call
// takes a context where it blocks and returns errors. testenv wraps it for
// tests (fail on error, skip where the environment cannot serve, clean up).
// The relay's own binary never imports it.
//
// Both servers can be replaced by existing ones through the environment:
// CDC_RELAY_TEST_PG_URL (see EnvPGURL) and CDC_RELAY_TEST_KAFKA_BROKERS (see
// EnvKafkaBrokers); CDC_RELAY_PG_BINDIR (EnvPGBinDir) picks the server
// binaries.
package sandbox

import (
	"errors"
	"fmt"
	"net"
)

// ErrExternal is returned by lifecycle methods (Stop, Start, Restart) and by
// options that cannot be honoured when a component wraps an existing server
// named by the environment instead of one this package started. Tests that
// hit it should skip, which NewPostgres, RequireLocal and RequireLocalKafka do.
var ErrExternal = errors.New("component is external")

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. Another
// process may take it before the caller binds it, so callers that can retry
// with a new port should.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("listen on free port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		return 0, fmt.Errorf("close free port listener: %w", err)
	}
	return port, nil
}
