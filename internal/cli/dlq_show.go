package cli

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
)

// DLQShowCmd is "cdc-relay dlq show ID".
type DLQShowCmd struct {
	PGFlags       `embed:""`
	dlqStoreFlags `embed:""`

	ID   int64 `arg:"" help:"Dead letter id (the ID column of dlq list)."`
	JSON bool  `name:"json" help:"Print JSON."`
}

// Validate checks the flags.
func (c *DLQShowCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	if c.ID <= 0 {
		return fmt.Errorf("<id> is %d: give the id of a dead letter, a positive number (the ID column of cdc-relay dlq list)", c.ID)
	}
	return c.dlqStoreFlags.validate()
}

// Run prints the letter.
func (c *DLQShowCmd) Run(ctx context.Context, env Env) error {
	return withStore(ctx, c.PGURL, c.DLQTable, func(s *deadletter.Store) error {
		l, err := s.Get(ctx, c.ID)
		if err != nil {
			return err
		}
		return writeLetter(env.Stdout, l, c.JSON)
	})
}

// writeLetter prints l with every field and its payload, or as JSON.
func writeLetter(w io.Writer, l deadletter.Letter, asJSON bool) error {
	if asJSON {
		return writeJSON(w, "JSON", toJSON(l))
	}
	printLetter(w, l)
	return nil
}

// printLetter prints l as a list of fields, then its headers and payload.
func printLetter(w io.Writer, l deadletter.Letter) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	row := func(k, v string) {
		if v == "" {
			v = "-"
		}
		fmt.Fprintf(tw, "%s:\t%s\n", k, v)
	}
	row("id", fmt.Sprint(l.ID))
	row("event id", l.EventID)
	status := l.Status
	if l.ReplayedAt != nil {
		status += fmt.Sprintf(" (replayed %d times, last at %s)", l.ReplayCount, timeText(*l.ReplayedAt))
	}
	row("status", status)
	row("error code", l.ErrorCode)
	row("error message", l.ErrorMessage)
	row("retries", fmt.Sprint(l.RetryCount))
	row("first failure", timeText(l.FirstFailedAt))
	row("last failure", timeText(l.LastFailedAt))
	row("topic", l.Topic)
	row("aggregate type", l.AggregateType)
	row("aggregate id", l.AggregateID)
	row("event type", l.EventType)
	row("payload type", l.PayloadType.String())
	switch {
	case l.Key == nil:
		row("key", "(none)")
	case utf8.Valid(l.Key):
		row("key", fmt.Sprintf("%q", l.Key))
	default:
		row("key", "0x"+hex.EncodeToString(l.Key))
	}
	lsn := "(unknown)"
	if l.CommitLSN != 0 {
		lsn = l.CommitLSN.String()
	}
	row("commit lsn", lsn)
	row("relay", l.RelayName)
	row("correlation id", l.CorrelationID)
	row("schema version", l.SchemaVersion)
	tw.Flush()
	fmt.Fprintln(w, "headers:")
	for _, k := range slices.Sorted(maps.Keys(l.Headers)) {
		fmt.Fprintf(w, "  %s: %s\n", k, l.Headers[k])
	}
	var pretty bytes.Buffer
	switch {
	case json.Valid(l.Payload) && json.Indent(&pretty, l.Payload, "", "  ") == nil:
		fmt.Fprintf(w, "payload (JSON, %d bytes):\n%s\n", len(l.Payload), pretty.Bytes())
	case utf8.Valid(l.Payload):
		fmt.Fprintf(w, "payload (text, %d bytes):\n%s\n", len(l.Payload), l.Payload)
	default:
		fmt.Fprintf(w, "payload (binary, %d bytes):\n%s", len(l.Payload), hex.Dump(l.Payload))
	}
}
