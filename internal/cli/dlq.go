package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
)

// DLQCmd is "cdc-relay dlq": the dead-letter store's commands.
type DLQCmd struct {
	List    DLQListCmd    `cmd:"" help:"List dead letters, with a summary per error code."`
	Show    DLQShowCmd    `cmd:"" help:"Show one dead letter with every field and its payload."`
	Replay  DLQReplayCmd  `cmd:"" help:"Publish dead letters again to their topic, keeping their event id."`
	Purge   DLQPurgeCmd   `cmd:"" help:"Delete old dead letters."`
	History DLQHistoryCmd `cmd:"" help:"List past replays (dlq and outbox), or the results of one."`
}

// dlqStoreFlags name the dead-letter table.
type dlqStoreFlags struct {
	DLQTable string `name:"dlq-table" default:"public.cdc_relay_dead_letters" help:"Dead-letter table, schema-qualified (its history: <table>_replays, <table>_replay_events)."`
}

func (f *dlqStoreFlags) validate() error {
	if _, _, err := splitTable(f.DLQTable); err != nil {
		return flagError("dlq-table", err.Error())
	}
	return nil
}

// letterFilterFlags select dead letters.
type letterFilterFlags struct {
	ErrorCode     string `help:"Only letters with this error code, e.g. message_too_large." placeholder:"CODE"`
	Since         string `help:"Only letters that last failed at or after this time: RFC 3339 (2024-05-01T10:00:00Z), a date (2024-05-01, UTC) or a duration ago (30m, 2h, 7d)." placeholder:"TIME"`
	Until         string `help:"Only letters that last failed before this time (same forms as --since)." placeholder:"TIME"`
	AggregateID   string `help:"Only letters of this aggregate id." placeholder:"ID"`
	AggregateType string `help:"Only letters of this aggregate type." placeholder:"TYPE"`
	EventType     string `help:"Only letters of this event type." placeholder:"TYPE"`
	Status        string `help:"Only letters with this status: pending or replayed." placeholder:"STATUS"`

	filter deadletter.Filter `kong:"-"`
}

// parse checks the filter flags and builds the filter.
func (f *letterFilterFlags) parse(now time.Time) error {
	since, err := parseTime(f.Since, now)
	if err != nil {
		return flagError("since", err.Error())
	}
	until, err := parseTime(f.Until, now)
	if err != nil {
		return flagError("until", err.Error())
	}
	if !since.IsZero() && !until.IsZero() && !until.After(since) {
		return flagError("until", fmt.Sprintf("is %s, not after --since (%s)", until.Format(time.RFC3339), since.Format(time.RFC3339)))
	}
	switch f.Status {
	case "", deadletter.StatusPending, deadletter.StatusReplayed:
	default:
		return flagError("status", fmt.Sprintf("is %q: use %s or %s", f.Status, deadletter.StatusPending, deadletter.StatusReplayed))
	}
	f.filter = deadletter.Filter{
		ErrorCode: f.ErrorCode, AggregateID: f.AggregateID, AggregateType: f.AggregateType,
		EventType: f.EventType, Status: f.Status, Since: since, Until: until,
	}
	return nil
}

// DLQListCmd is "cdc-relay dlq list".
type DLQListCmd struct {
	PGFlags           `embed:""`
	dlqStoreFlags     `embed:""`
	letterFilterFlags `embed:""`

	Limit int  `default:"100" help:"Show at most this many letters, lowest ids first (0: all)."`
	JSON  bool `name:"json" help:"Print JSON instead of a table."`
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
	return c.letterFilterFlags.parse(time.Now())
}

func (c *DLQListCmd) run(ctx context.Context, env Env) error {
	return withStore(ctx, c.PGURL, c.DLQTable, func(s *deadletter.Store) error {
		f := c.filter
		f.Limit = c.Limit
		letters, err := s.List(ctx, f)
		if err != nil {
			return err
		}
		summary, err := s.Summary(ctx, c.filter)
		if err != nil {
			return err
		}
		var total int64
		for _, cc := range summary {
			total += cc.Count
		}
		if c.JSON {
			out := listJSON{Letters: make([]letterJSON, len(letters)), Summary: make([]codeJSON, len(summary)), Total: total}
			for i, l := range letters {
				out.Letters[i] = toJSON(l)
			}
			for i, cc := range summary {
				out.Summary[i] = codeJSON{cc.ErrorCode, cc.Count, cc.Pending, cc.Oldest.UTC(), cc.Newest.UTC()}
			}
			return writeJSON(env.Stdout, out)
		}
		printList(env.Stdout, letters, summary, total)
		return nil
	})
}

// withStore connects, runs fn with the store, and closes the connection.
func withStore(ctx context.Context, url, table string, fn func(*deadletter.Store) error) error {
	pool, err := connect(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	return fn(deadletter.NewStore(pool, table))
}

// timeText formats t for tables: UTC, to the second.
func timeText(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func printList(w io.Writer, letters []deadletter.Letter, summary []deadletter.CodeCount, total int64) {
	if len(letters) == 0 {
		fmt.Fprintln(w, "no dead letters match")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tEVENT ID\tCODE\tAGGREGATE\tTYPE\tTOPIC\tRETRIES\tLAST FAILURE\tSTATUS")
	for _, l := range letters {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", l.ID, oneLine(l.EventID), oneLine(l.ErrorCode),
			oneLine(l.AggregateType+"/"+l.AggregateID), oneLine(l.EventType), oneLine(l.Topic), l.RetryCount,
			timeText(l.LastFailedAt), l.Status)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d of %d matching letters shown", len(letters), total)
	if int64(len(letters)) < total {
		fmt.Fprint(w, " (raise --limit, or 0 for all)")
	}
	fmt.Fprintln(w, "; by error code:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CODE\tLETTERS\tPENDING\tFIRST FAILURE\tLAST FAILURE")
	for _, cc := range summary {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", oneLine(cc.ErrorCode), cc.Count, cc.Pending, timeText(cc.Oldest), timeText(cc.Newest))
	}
	tw.Flush()
}

// oneLine keeps a table cell on one line, and short.
func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if utf8.RuneCountInString(s) > 40 {
		s = string([]rune(s)[:39]) + "…"
	}
	return s
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
	Pending   int64     `json:"pending"`
	Oldest    time.Time `json:"first_failed_at"`
	Newest    time.Time `json:"last_failed_at"`
}

// letterJSON is a dead letter in JSON output. Key and payload are strings or
// JSON when they can be, base64 otherwise.
type letterJSON struct {
	ID            int64             `json:"id"`
	EventID       string            `json:"event_id"`
	AggregateType string            `json:"aggregate_type"`
	AggregateID   string            `json:"aggregate_id"`
	EventType     string            `json:"event_type"`
	Key           *string           `json:"key"` // null: no key
	KeyBase64     string            `json:"key_base64,omitempty"`
	Payload       json.RawMessage   `json:"payload,omitempty"` // when it is JSON
	PayloadBase64 string            `json:"payload_base64,omitempty"`
	Headers       map[string]string `json:"headers"`
	Topic         string            `json:"topic"`
	ErrorCode     string            `json:"error_code"`
	ErrorMessage  string            `json:"error_message"`
	RetryCount    int               `json:"retry_count"`
	FirstFailedAt time.Time         `json:"first_failed_at"`
	LastFailedAt  time.Time         `json:"last_failed_at"`
	RelayName     string            `json:"relay_name"`
	CorrelationID string            `json:"correlation_id,omitempty"`
	SchemaVersion string            `json:"schema_version,omitempty"`
	CommitLSN     string            `json:"commit_lsn,omitempty"`
	Status        string            `json:"status"`
	ReplayedAt    *time.Time        `json:"replayed_at"`
	ReplayCount   int               `json:"replay_count"`
}

func toJSON(l deadletter.Letter) letterJSON {
	j := letterJSON{
		ID: l.ID, EventID: l.EventID, AggregateType: l.AggregateType, AggregateID: l.AggregateID,
		EventType: l.EventType, Headers: l.Headers, Topic: l.Topic, ErrorCode: l.ErrorCode,
		ErrorMessage: l.ErrorMessage, RetryCount: l.RetryCount, FirstFailedAt: l.FirstFailedAt.UTC(),
		LastFailedAt: l.LastFailedAt.UTC(), RelayName: l.RelayName, CorrelationID: l.CorrelationID,
		SchemaVersion: l.SchemaVersion, Status: l.Status, ReplayCount: l.ReplayCount,
	}
	if l.Key != nil {
		if utf8.Valid(l.Key) {
			k := string(l.Key)
			j.Key = &k
		} else {
			j.KeyBase64 = base64.StdEncoding.EncodeToString(l.Key)
		}
	}
	if json.Valid(l.Payload) {
		j.Payload = json.RawMessage(l.Payload)
	} else {
		j.PayloadBase64 = base64.StdEncoding.EncodeToString(l.Payload)
	}
	if l.CommitLSN != 0 {
		j.CommitLSN = l.CommitLSN.String()
	}
	if l.ReplayedAt != nil {
		t := l.ReplayedAt.UTC()
		j.ReplayedAt = &t
	}
	if j.Headers == nil {
		j.Headers = map[string]string{}
	}
	return j
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}

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

func (c *DLQShowCmd) run(ctx context.Context, env Env) error {
	return withStore(ctx, c.PGURL, c.DLQTable, func(s *deadletter.Store) error {
		l, err := s.Get(ctx, c.ID)
		if err != nil {
			return err
		}
		if c.JSON {
			return writeJSON(env.Stdout, toJSON(l))
		}
		printLetter(env.Stdout, l)
		return nil
	})
}

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

// DLQReplayCmd is "cdc-relay dlq replay".
type DLQReplayCmd struct {
	PGFlags           `embed:""`
	dlqStoreFlags     `embed:""`
	letterFilterFlags `embed:""`
	publishFlags      `embed:""`

	// Not KafkaFlags: a dead letter goes back to the topic stored with it, so
	// --topic would mean nothing here.
	KafkaBrokers       []string `name:"kafka-brokers" sep:"," help:"Kafka bootstrap brokers, comma-separated host:port (not needed with --dry-run)." placeholder:"HOST:PORT"`
	KafkaSecurityFlags `embed:""`

	ID    []int64 `name:"id" help:"Only these dead letter ids (repeat the flag or separate with commas)." placeholder:"ID"`
	Force bool    `help:"Also publish letters that were replayed already (they are skipped otherwise)."`
	Limit int     `help:"Replay at most this many letters, lowest ids first (0: all)."`
}

// Validate checks the flags.
func (c *DLQReplayCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	if err := c.dlqStoreFlags.validate(); err != nil {
		return err
	}
	if err := c.publishFlags.validate(); err != nil {
		return err
	}
	if err := c.checkKafka(&c.KafkaBrokers, &c.KafkaSecurityFlags); err != nil {
		return err
	}
	for _, id := range c.ID {
		if id <= 0 {
			return flagError("id", fmt.Sprintf("has %d: dead letter ids are positive", id))
		}
	}
	if c.Limit < 0 {
		return flagError("limit", "must be 0 (all) or more")
	}
	return c.letterFilterFlags.parse(time.Now())
}

func (c *DLQReplayCmd) run(ctx context.Context, env Env) error {
	return withStore(ctx, c.PGURL, c.DLQTable, func(s *deadletter.Store) error {
		if err := s.Ensure(ctx); err != nil {
			return err
		}
		p, err := c.publisher(ctx, c.KafkaBrokers, &c.KafkaSecurityFlags, env.Stderr)
		if err != nil {
			return err
		}
		var pub deadletter.Publisher
		if p != nil {
			defer p.Close()
			pub = p
		}
		f := c.filter
		f.IDs, f.Limit = c.ID, c.Limit
		actor := c.actor()
		res, err := s.ReplayDeadLetters(ctx, pub, deadletter.ReplayOptions{
			Filter: f, DryRun: c.DryRun, Force: c.Force, Rate: c.Rate, BatchSize: c.BatchSize, Actor: actor,
		})
		return printReplay(env.Stdout, "dlq", actor, res, c.DryRun, err)
	})
}

// DLQPurgeCmd is "cdc-relay dlq purge".
type DLQPurgeCmd struct {
	PGFlags       `embed:""`
	dlqStoreFlags `embed:""`

	OlderThan string `required:"" help:"Delete letters whose last failure (and last replay) is longer ago than this: 30m, 24h, 7d, 1d12h." placeholder:"AGE"`
	Status    string `help:"Only letters with this status: pending or replayed (default: both)." placeholder:"STATUS"`

	olderThan time.Time `kong:"-"`
}

// Validate checks the flags.
func (c *DLQPurgeCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	if err := c.dlqStoreFlags.validate(); err != nil {
		return err
	}
	age, err := parseAge(c.OlderThan)
	if err != nil {
		return flagError("older-than", err.Error())
	}
	c.olderThan = time.Now().Add(-age)
	switch c.Status {
	case "", deadletter.StatusPending, deadletter.StatusReplayed:
	default:
		return flagError("status", fmt.Sprintf("is %q: use %s or %s", c.Status, deadletter.StatusPending, deadletter.StatusReplayed))
	}
	return nil
}

func (c *DLQPurgeCmd) run(ctx context.Context, env Env) error {
	return withStore(ctx, c.PGURL, c.DLQTable, func(s *deadletter.Store) error {
		n, err := s.Purge(ctx, c.olderThan, c.Status)
		status := c.Status
		if status == "" {
			status = "pending or replayed"
		}
		fmt.Fprintf(env.Stdout, "deleted %d dead letters (%s) last active before %s\n", n, status, c.olderThan.UTC().Format(time.RFC3339))
		return err
	})
}

// DLQHistoryCmd is "cdc-relay dlq history".
type DLQHistoryCmd struct {
	PGFlags       `embed:""`
	dlqStoreFlags `embed:""`

	Replay int64 `help:"Show the result of every event of this replay instead." placeholder:"ID"`
	Limit  int   `default:"20" help:"Show the newest replays, at most this many (0: all)."`
	JSON   bool  `name:"json" help:"Print JSON."`
}

// Validate checks the flags.
func (c *DLQHistoryCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	if c.Limit < 0 {
		return flagError("limit", "must be 0 (all) or more")
	}
	return c.dlqStoreFlags.validate()
}

func (c *DLQHistoryCmd) run(ctx context.Context, env Env) error {
	return withStore(ctx, c.PGURL, c.DLQTable, func(s *deadletter.Store) error {
		if c.Replay != 0 {
			events, err := s.ListReplayEvents(ctx, c.Replay)
			if err != nil {
				return err
			}
			if c.JSON {
				return writeJSON(env.Stdout, events)
			}
			if len(events) == 0 {
				fmt.Fprintf(env.Stdout, "replay %d recorded no events (or does not exist)\n", c.Replay)
				return nil
			}
			tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "AT\tEVENT ID\tDEAD LETTER\tRESULT\tERROR")
			for _, e := range events {
				dl := "-"
				if e.DeadLetterID != 0 {
					dl = fmt.Sprint(e.DeadLetterID)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", timeText(e.At), oneLine(e.EventID), dl, e.Result, e.Error)
			}
			return tw.Flush()
		}
		replays, err := s.ListReplays(ctx, c.Limit)
		if err != nil {
			return err
		}
		if c.JSON {
			return writeJSON(env.Stdout, replays)
		}
		if len(replays) == 0 {
			fmt.Fprintln(env.Stdout, "no replays yet")
			return nil
		}
		tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tKIND\tACTOR\tSTARTED\tFINISHED\tMODE\tRATE\tSELECTED\tPUBLISHED\tSKIPPED\tFAILED\tFILTERS")
		for _, r := range replays {
			finished := "(not finished)"
			if r.FinishedAt != nil {
				finished = timeText(*r.FinishedAt)
			}
			mode := "publish"
			switch {
			case r.DryRun:
				mode = "dry run"
			case r.Forced:
				mode = "forced"
			}
			rate := "unlimited"
			if r.RatePerSec > 0 {
				rate = fmt.Sprintf("%g/s", r.RatePerSec)
			}
			filters, _ := json.Marshal(r.Filters)
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", r.ID, r.Kind, oneLine(r.Actor),
				timeText(r.StartedAt), finished, mode, rate, r.Selected, r.Published, r.Skipped, r.Failed, filters)
		}
		return tw.Flush()
	})
}
