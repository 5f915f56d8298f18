package main

import (
	"context"
	"flag"
	"os"

	"github.com/cdc-relay/cdc-relay/bench/internal/runner"
)

// runMessages is "bench messages": the same backlog of one-event
// transactions as outbox rows and as logical decoding messages, side by
// side (runner.RunMessages).
//
//	make bench BENCHFLAGS='messages -events 100000 -rounds 2'
func runMessages(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench messages", flag.ContinueOnError)
	events := fs.Int("events", 100000, "one-event transactions in each shape's backlog")
	aggregates := fs.Int("aggregates", 1000, "distinct aggregate ids (Kafka keys)")
	payload := fs.Int("payload", 300, "approximate payload bytes")
	rounds := fs.Int("rounds", 2, "rounds; each runs the table shape, then the message shape")
	relayBin := fs.String("relay-bin", "", "cdc-relay binary to measure (default: build ./cmd/cdc-relay)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	_, err := runner.RunMessages(ctx, runner.MessagesConfig{
		Events: *events, Aggregates: *aggregates, Payload: *payload, Rounds: *rounds, RelayBin: *relayBin, Out: os.Stdout,
	})
	return err
}
