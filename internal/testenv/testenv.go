// Package testenv starts real, throwaway infrastructure for tests, the demo and
// the benchmarks: a PostgreSQL cluster (initdb + pg_ctl, binaries from FindPGBin), an in-process
// Kafka-protocol broker (kfake) and an in-process OTLP trace receiver. It also reads Kafka back with franz-go's kgo,
// a different client than the relay's kafka-go producer, so a test never
// checks the producer with itself.
//
// Nothing here is a mock. The core API takes a context and returns errors so
// non-test programs can use it; NewPostgres and NewKafka are thin testing.TB
// wrappers that fail the test on error and register cleanup.
//
// Both components can be replaced by existing servers through the environment:
// CDC_RELAY_TEST_PG_URL (see EnvPGURL) and CDC_RELAY_TEST_KAFKA_BROKERS (see
// EnvKafkaBrokers). Tests that need to stop or restart a component call
// RequireLocal or RequireLocalKafka first so they are skipped in that mode.
package testenv

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
