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
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
)

// DLQShowCmd is "cdc-relay dlq show [ID] [--event-id E]…".
type DLQShowCmd struct {
	PGFlags       `embed:"" group:"postgres"`
	dlqStoreFlags `embed:"" group:"postgres"`

	ID      int64    `arg:"" optional:"" help:"Dead letter id (the ID column of dlq list)."`
	EventID []string `group:"selection" name:"event-id" help:"Show the letter of this event id instead (or too), as the relay logs it (event_id); repeat the flag or separate with commas." placeholder:"ID"`
	JSON    bool     `group:"output" name:"json" help:"Print JSON: one letter as an object, several as an array."`
}

// Validate checks the flags.
func (c *DLQShowCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	var events []string
	for _, e := range c.EventID {
		if e = strings.TrimSpace(e); e != "" {
			events = append(events, e)
		}
	}
	c.EventID = events
	if c.ID < 0 || c.ID == 0 && len(events) == 0 {
		return fmt.Errorf("<id> is %d: give the id of a dead letter, a positive number (the ID column of cdc-relay dlq list), or --event-id", c.ID)
	}
	return c.dlqStoreFlags.validate()
}

// Run prints the letters.
func (c *DLQShowCmd) Run(ctx context.Context, env Env) error {
	return withStore(ctx, c.PGURL, c.DLQTable, func(s *deadletter.Store) error {
		var letters []deadletter.Letter
		if c.ID != 0 {
			l, err := s.Get(ctx, c.ID)
			if err != nil {
				return err
			}
			letters = append(letters, l)
		}
		if len(c.EventID) > 0 {
			found, err := s.List(ctx, deadletter.Filter{EventIDs: c.EventID})
			if err != nil {
				return err
			}
			have := map[string]bool{}
			for _, l := range found {
				have[l.EventID] = true
				if l.ID != c.ID {
					letters = append(letters, l)
				}
			}
			for _, e := range c.EventID {
				if !have[e] {
					return fmt.Errorf("show the dead letter of event %s from %s: %w", e, s.Table(), deadletter.ErrNotFound)
				}
			}
		}
		return writeLetters(env.Stdout, letters, c.JSON)
	})
}

// writeLetters prints each letter with every field and its payload, or as
// JSON (an object for one letter, an array for several).
func writeLetters(w io.Writer, letters []deadletter.Letter, asJSON bool) error {
	if asJSON {
		if len(letters) == 1 {
			return writeJSON(w, "JSON", toJSON(letters[0]))
		}
		out := make([]letterJSON, len(letters))
		for i, l := range letters {
			out[i] = toJSON(l)
		}
		return writeJSON(w, "JSON", out)
	}
	for i, l := range letters {
		if i > 0 {
			fmt.Fprintln(w)
		}
		printLetter(w, l)
	}
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
	status := statusText(l)
	if l.ReplayedAt != nil {
		status += fmt.Sprintf(" (replayed %d times, last at %s)", l.ReplayCount, timeText(*l.ReplayedAt))
	}
	row("status", status)
	attempts := fmt.Sprint(l.Attempts)
	if l.LastAttemptAt != nil {
		attempts += " (last at " + timeText(*l.LastAttemptAt) + ")"
	}
	row("attempts", attempts)
	row("last attempt error", l.LastAttemptError)
	row("error code", l.ErrorCode)
	row("error message", l.ErrorMessage)
	row("retries", fmt.Sprint(l.RetryCount))
	row("first failure", timeText(l.FirstFailedAt))
	row("last failure", timeText(l.LastFailedAt))
	row("topic", l.Topic)
	if l.SourceTable != "" {
		row("source table", l.SourceTable)
	}
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
