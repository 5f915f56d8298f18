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
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// ErrExternal is returned by lifecycle methods (Stop, Start, Restart) and by
// options that cannot be honoured when a component wraps an existing server
// named by the environment instead of one this package started. Tests that
// hit it should skip, which NewPostgres, RequireLocal and RequireLocalKafka do.
var ErrExternal = errors.New("component is external")

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
//
// It picks one below the kernel's ephemeral range (ip_local_port_range),
// at random: a port the kernel handed out for a listener on :0 or an
// outgoing connection, which every test's Postgres, Kafka and clients make
// by the thousand, is never one of those, so only another FreePort caller
// could take it before the caller binds it (two relays of one test run lost
// their --metrics-addr that way, "bind: address already in use"). Where the
// range cannot be read it asks the kernel for one.
func FreePort() (int, error) {
	if lo := ephemeralLow(); lo > minFreePort+1000 {
		for range 100 {
			port := minFreePort + rand.IntN(lo-minFreePort)
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				continue // in use: another
			}
			if err := ln.Close(); err != nil {
				return 0, fmt.Errorf("close free port listener: %w", err)
			}
			return port, nil
		}
	}
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

// minFreePort is the lowest port FreePort picks: above the well-known
// services' ports.
const minFreePort = 20000

// ephemeralLow returns the lowest port of the kernel's ephemeral range, or 0
// when it cannot be read (not Linux).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return lo
}
