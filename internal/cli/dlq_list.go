package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
)

// DLQListCmd is "cdc-relay dlq list".
type DLQListCmd struct {
	PGFlags           `embed:"" group:"postgres"`
	dlqStoreFlags     `embed:"" group:"postgres"`
	letterFilterFlags `embed:"" group:"selection"`

	// Topic is no run --topic: neither CDC_RELAY_TOPIC nor the config file's
	// topic key (the relay's template) sets it.
	Topic string `group:"selection" env:"-" nofile:"" help:"Only letters meant for this topic (the TOPIC column; set by neither CDC_RELAY_TOPIC nor the config file's topic, which are run's)." placeholder:"NAME"`
	Limit int    `group:"selection" default:"100" help:"Show at most this many letters, lowest ids first (0: all)."`
	JSON  bool   `group:"output" name:"json" help:"Print JSON instead of a table."`
}

// Validate checks the flags.
func (c *DLQListCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	if err := c.dlqStoreFlags.validate(); err != nil {
		return err
	}
	if c.Limit < 0 {
		return flagError("limit", "must be 0 (all) or more")
	}
	if err := c.letterFilterFlags.parse(time.Now()); err != nil {
		return err
	}
	c.filter.Topic = c.Topic
	return nil
}

// Run prints the letters and the summary per error code.
func (c *DLQListCmd) Run(ctx context.Context, env Env) error {
	return withStore(ctx, c.PGURL, c.DLQTable, func(s *deadletter.Store) error {
		list, err := listLetters(ctx, s, c.filter, c.Limit)
		if err != nil {
			return err
		}
		if c.JSON {
			return writeJSON(env.Stdout, "JSON", list.json())
		}
		printList(env.Stdout, list)
		return nil
	})
}

// letterList is what dlq list shows.
type letterList struct {
	Letters []deadletter.Letter    // the first letters f selects, up to the limit
	Summary []deadletter.CodeCount // every letter f selects, per error code
	Total   int64                  // letters f selects, beyond the limit too
}

// listLetters reads the first limit letters f selects (0: all) and the
// summary of all of them.
func listLetters(ctx context.Context, s *deadletter.Store, f deadletter.Filter, limit int) (letterList, error) {
	page := f
	page.Limit = limit
	letters, err := s.List(ctx, page)
	if err != nil {
		return letterList{}, err
	}
	summary, err := s.Summary(ctx, f)
	if err != nil {
		return letterList{}, err
	}
	list := letterList{Letters: letters, Summary: summary}
	for _, cc := range summary {
		list.Total += cc.Count
	}
	return list, nil
}

// printList prints the letters and the summary as two tables.
func printList(w io.Writer, list letterList) {
	letters, summary, total := list.Letters, list.Summary, list.Total
	if len(letters) == 0 {
		fmt.Fprintln(w, "no dead letters match")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tEVENT ID\tCODE\tAGGREGATE\tTYPE\tTOPIC\tRETRIES\tLAST FAILURE\tSTATUS\tATTEMPTS")
	for _, l := range letters {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\n", l.ID, oneLine(l.EventID), oneLine(l.ErrorCode),
			oneLine(l.AggregateType+"/"+l.AggregateID), oneLine(l.EventType), oneLine(l.Topic), l.RetryCount,
			timeText(l.LastFailedAt), statusText(l), l.Attempts)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d of %d matching letters shown", len(letters), total)
	if int64(len(letters)) < total {
		fmt.Fprint(w, " (raise --limit, or 0 for all)")
	}
	fmt.Fprintln(w, "; by error code:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CODE\tLETTERS\tNOT COMPLETED\tDEAD\tFIRST FAILURE\tLAST FAILURE")
	for _, cc := range summary {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\n", oneLine(cc.ErrorCode), cc.Count, cc.Pending, cc.Dead, timeText(cc.Oldest), timeText(cc.Newest))
	}
	tw.Flush()
}

// statusText is l's status, with the lease's owner while a replay holds it
// and the time of the next automatic attempt while it waits for one.
func statusText(l deadletter.Letter) string {
	switch {
	case l.Status == deadletter.StatusProcessing && l.ClaimedUntil != nil:
		return fmt.Sprintf("processing (%s until %s)", oneLine(l.ClaimedBy), timeText(*l.ClaimedUntil))
	case l.Status == deadletter.StatusRetryWait && l.NextAttemptAt != nil:
		return fmt.Sprintf("retry_wait (until %s)", timeText(*l.NextAttemptAt))
	}
	return l.Status
}

// listJSON is the output of "dlq list --json".
type listJSON struct {
	Letters []letterJSON `json:"letters"`
	Summary []codeJSON   `json:"summary"`
	Total   int64        `json:"total"` // letters matching the filters, beyond --limit too
}

type codeJSON struct {
	ErrorCode string    `json:"error_code"`
	Count     int64     `json:"count"`
	Pending   int64     `json:"pending"` // not completed: pending, processing, retry_wait or dead
	Dead      int64     `json:"dead"`
	Oldest    time.Time `json:"first_failed_at"`
	Newest    time.Time `json:"last_failed_at"`
}

// json is list as "dlq list --json" prints it.
func (list letterList) json() listJSON {
	out := listJSON{Letters: make([]letterJSON, len(list.Letters)), Summary: make([]codeJSON, len(list.Summary)), Total: list.Total}
	for i, l := range list.Letters {
		out.Letters[i] = toJSON(l)
	}
	for i, cc := range list.Summary {
		out.Summary[i] = codeJSON{cc.ErrorCode, cc.Count, cc.Pending, cc.Dead, cc.Oldest.UTC(), cc.Newest.UTC()}
	}
	return out
}
