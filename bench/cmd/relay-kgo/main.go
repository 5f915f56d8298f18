// Command relay-kgo is cdc-relay with the benchmark's kgo producer
// (internal/kgosink) in place of the relay's own, for measuring the two
// side by side (issue 38): bin/bench -relay-bin bin/relay-kgo. Its command
// line is cdc-relay's. It is not a release binary.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/cdc-relay/cdc-relay/bench/internal/kgosink"
	"github.com/cdc-relay/cdc-relay/internal/cli"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.Run(ctx, os.Args[1:], cli.Env{Version: version + "+kgo", SetMemoryLimit: debug.SetMemoryLimit, OpenProducer: openKgo})
	stop()
	if err != nil {
		if !cli.Reported(err) {
			fmt.Fprintln(os.Stderr, cli.ErrorLine(err))
		}
		os.Exit(cli.ExitCode(err)) // 2: fix the command line or configuration; 1: a runtime failure
	}
}

// openKgo opens the kgo producer as relay.Config.OpenProducer.
func openKgo(ctx context.Context, cfg sink.Config) (relay.Producer, error) {
	k, err := kgosink.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return k, nil
}
