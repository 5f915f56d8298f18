// Command cdc-relay relays committed outbox INSERTs from Postgres logical
// replication to Kafka. See README.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/cdc-relay/cdc-relay/internal/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.Run(ctx, os.Args[1:], cli.Env{Version: version, SetMemoryLimit: debug.SetMemoryLimit})
	stop()
	if err != nil {
		if !cli.Reported(err) {
			fmt.Fprintln(os.Stderr, cli.ErrorLine(err))
		}
		os.Exit(cli.ExitCode(err)) // 2: fix the command line or configuration; 1: a runtime failure
	}
}
