package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/user"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/outboxtable"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// timeHelp describes the forms parseTime accepts, for flag help.
const timeHelp = "RFC 3339 (2024-05-01T10:00:00Z), a date (2024-05-01, UTC) or a duration ago (30m, 2h, 7d)"

// ReplayCmd is "cdc-relay replay": publish rows still in the outbox table again.
type ReplayCmd struct {
	PGFlags           `embed:""`
	KafkaFlags        `embed:""`
	outboxColumnFlags `embed:""`
	dlqStoreFlags     `embed:""`
	publishFlags      `embed:""`

	Since       string   `help:"Replay rows created at or after this time (required): RFC 3339 (2024-05-01T10:00:00Z), a date (2024-05-01, UTC) or a duration ago (30m, 2h, 7d)." placeholder:"TIME"`
	Until       string   `help:"Replay rows created before this time (same forms as --since; default: now)." placeholder:"TIME"`
	AggregateID string   `help:"Only rows of this aggregate id." placeholder:"ID"`
	EventType   string   `help:"Only rows of this event type." placeholder:"TYPE"`
	ID          []string `name:"id" help:"Only these event ids (repeat the flag or separate with commas)." placeholder:"EVENT-ID"`
	Limit       int      `help:"Replay at most this many rows (0: all)."`

	since, until time.Time         `kong:"-"`
	headers      map[string]string `kong:"-"`
}

// outboxColumnFlags are the outbox's column names, as "cdc-relay run" takes them.
type outboxColumnFlags struct {
	ColumnID            string   `default:"id" help:"Outbox column holding the event id (header 'id')."`
	ColumnAggregateType string   `default:"aggregate_type" help:"Outbox column holding the aggregate type."`
	ColumnAggregateID   string   `default:"aggregate_id" help:"Outbox column holding the aggregate id (the Kafka key)."`
	ColumnEventType     string   `default:"event_type" help:"Outbox column holding the event type."`
	ColumnPayload       string   `default:"payload" help:"Outbox column holding the payload (the Kafka value)."`
	ColumnCreatedAt     string   `default:"created_at" help:"Outbox column holding the insert time (for --since, --until and the order)."`
	HeaderColumns       []string `sep:"," help:"Extra outbox columns sent as Kafka headers: column or column=header, comma-separated." placeholder:"COL[=HEADER]"`
}

func (f *outboxColumnFlags) columns(headers map[string]string) outboxtable.Columns {
	return outboxtable.Columns{
		Columns: decoder.Columns{
			ID: f.ColumnID, AggregateType: f.ColumnAggregateType, AggregateID: f.ColumnAggregateID,
			EventType: f.ColumnEventType, Payload: f.ColumnPayload,
		},
		CreatedAt: f.ColumnCreatedAt,
		Headers:   headers,
	}
}

// publishFlags pace a replay and say who runs it.
type publishFlags struct {
	DryRun            bool          `help:"Publish nothing: show and record what would be published."`
	Rate              float64       `default:"50" help:"Most events published per second (0: unlimited)."`
	BatchSize         int           `default:"100" help:"Events published at once (and the rate limiter's burst)."`
	Actor             string        `help:"Who runs the replay, for the history (default: the OS user)."`
	KafkaStartTimeout time.Duration `default:"30s" help:"How long to wait for Kafka, and for a topic not used yet, before giving up."`
}

func (f *publishFlags) validate() error {
	if f.Rate < 0 {
		return flagError("rate", "must be 0 (unlimited) or a positive number of events per second")
	}
	if f.BatchSize < 1 {
		return flagError("batch-size", "must be at least 1")
	}
	if f.KafkaStartTimeout <= 0 {
		return flagError("kafka-start-timeout", "must be a positive duration such as 30s")
	}
	return nil
}

// checkKafka checks the brokers and the TLS/SASL flags a replay publishes
// with; a dry run needs neither.
func (f *publishFlags) checkKafka(brokers *[]string, sec *KafkaSecurityFlags) error {
	if f.DryRun {
		return nil
	}
	list, err := checkBrokers(*brokers, " (or use --dry-run)")
	if err != nil {
		return err
	}
	*brokers = list
	return sec.resolveKafkaSecurity()
}

// actor is --actor, or the OS user running the command.
func (f *publishFlags) actor() string {
	if f.Actor != "" {
		return f.Actor
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "unknown"
}

// publisher connects to Kafka for a replay, or returns nil for a dry run.
func (f *publishFlags) publisher(ctx context.Context, brokers []string, sec *KafkaSecurityFlags, stderr io.Writer) (*deadletter.KafkaPublisher, error) {
	if f.DryRun {
		return nil, nil
	}
	transport, err := sec.kafkaTransport()
	if err != nil {
		return nil, err
	}
	log := NewLogger(stderr, "warn", "auto")
	sec.logKafkaSecurity(log)
	octx, cancel := context.WithTimeout(ctx, f.KafkaStartTimeout)
	defer cancel()
	p, err := deadletter.NewKafkaPublisher(octx, sink.Config{
		Brokers:   brokers,
		Logger:    log,
		Transport: transport,
	})
	if err != nil {
		return nil, sec.explainKafkaError(err)
	}
	p.TopicWait = f.KafkaStartTimeout
	return p, nil
}

// Validate checks the flags and parses the times.
func (r *ReplayCmd) Validate() error {
	if err := requirePG(&r.PGFlags); err != nil {
		return err
	}
	if _, _, err := splitTable(r.Table); err != nil {
		return flagError("table", err.Error())
	}
	if err := r.dlqStoreFlags.validate(); err != nil {
		return err
	}
	if err := r.publishFlags.validate(); err != nil {
		return err
	}
	if err := r.checkKafka(&r.KafkaBrokers, &r.KafkaSecurityFlags); err != nil {
		return err
	}
	if _, err := route.New(r.Topic); err != nil {
		return flagError("topic", err.Error())
	}
	headers, err := parseHeaderColumns(r.HeaderColumns)
	if err != nil {
		return flagError("header-columns", err.Error())
	}
	r.headers = headers
	if strings.TrimSpace(r.Since) == "" {
		return flagError("since", "is required: the time to replay from, "+timeHelp)
	}
	now := time.Now()
	if r.since, err = parseTime(r.Since, now); err != nil {
		return flagError("since", err.Error())
	}
	if r.until, err = parseTime(r.Until, now); err != nil {
		return flagError("until", err.Error())
	}
	if !r.until.IsZero() && !r.until.After(r.since) {
		return flagError("until", fmt.Sprintf("(%s) must be after --since (%s)", r.until.Format(time.RFC3339), r.since.Format(time.RFC3339)))
	}
	if r.Limit < 0 {
		return flagError("limit", "must be 0 (all) or more")
	}
	return nil
}

func (r *ReplayCmd) run(ctx context.Context, env Env) error {
	pool, err := connect(ctx, r.PGURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := deadletter.NewStore(pool, r.DLQTable)
	if err := store.Ensure(ctx); err != nil {
		return err
	}
	p, err := r.publisher(ctx, r.KafkaBrokers, &r.KafkaSecurityFlags, env.Stderr)
	if err != nil {
		return err
	}
	var pub deadletter.Publisher
	if p != nil {
		defer p.Close()
		pub = p
	}
	res, err := outboxtable.Replay(ctx, pool, store, r.Table, r.columns(r.headers), pub, outboxtable.ReplayOptions{
		Since: r.since, Until: r.until, AggregateID: r.AggregateID, EventType: r.EventType, IDs: r.ID,
		Limit: r.Limit, Topic: r.Topic, Rate: r.Rate, BatchSize: r.BatchSize, DryRun: r.DryRun, Actor: r.actor(),
	})
	return printReplay(env.Stdout, "outbox", r.actor(), res, r.DryRun, err)
}

// printReplay prints what a replay did, and turns failed events into an error
// so the exit status shows them.
func printReplay(w io.Writer, kind, actor string, res deadletter.ReplayResult, dryRun bool, err error) error {
	if res.ReplayID == 0 {
		return err // it did not start
	}
	what := "replay"
	if dryRun {
		what = "dry run"
	}
	fmt.Fprintf(w, "%s %d (%s, by %s): selected %d, published %d, skipped %d, failed %d",
		what, res.ReplayID, kind, actor, res.Selected, res.Published, res.Skipped, res.Failed)
	if dryRun {
		fmt.Fprintf(w, ", would publish %d", res.DryRun)
	}
	fmt.Fprintln(w)
	if len(res.Failures) > 0 {
		fmt.Fprintln(w, "failures:")
		for _, f := range res.Failures {
			if f.DeadLetterID != 0 {
				fmt.Fprintf(w, "  dead letter %d, event %s: %s\n", f.DeadLetterID, f.EventID, f.Error)
			} else {
				fmt.Fprintf(w, "  event %s: %s\n", f.EventID, f.Error)
			}
		}
		if res.Failed > len(res.Failures) {
			fmt.Fprintf(w, "  ... and %d more: cdc-relay dlq history --replay %d\n", res.Failed-len(res.Failures), res.ReplayID)
		}
	}
	if err != nil {
		return fmt.Errorf("replay %d: %w", res.ReplayID, err)
	}
	if res.Failed > 0 {
		return fmt.Errorf("replay %d: %d of %d events failed (listed above)", res.ReplayID, res.Failed, res.Selected)
	}
	return nil
}

// PruneCmd is "cdc-relay prune": delete old outbox rows.
type PruneCmd struct {
	PGFlags `embed:""`

	OlderThan       string `required:"" help:"Delete rows created longer ago than this: 30m, 24h, 7d, 1d12h." placeholder:"AGE"`
	BatchSize       int    `default:"1000" help:"Rows deleted per transaction."`
	ColumnCreatedAt string `default:"created_at" help:"Outbox column holding the insert time."`

	olderThan time.Time `kong:"-"`
}

// Validate checks the flags.
func (c *PruneCmd) Validate() error {
	if err := requirePG(&c.PGFlags); err != nil {
		return err
	}
	if _, _, err := splitTable(c.Table); err != nil {
		return flagError("table", err.Error())
	}
	age, err := parseAge(c.OlderThan)
	if err != nil {
		return flagError("older-than", err.Error())
	}
	c.olderThan = time.Now().Add(-age)
	if c.BatchSize < 1 {
		return flagError("batch-size", "must be at least 1")
	}
	return nil
}

func (c *PruneCmd) run(ctx context.Context, env Env) error {
	pool, err := connect(ctx, c.PGURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, err := outboxtable.Prune(ctx, pool, c.Table, c.ColumnCreatedAt, c.olderThan, c.BatchSize)
	fmt.Fprintf(env.Stdout, "deleted %d rows of %s created before %s\n", n, c.Table, c.olderThan.UTC().Format(time.RFC3339))
	return err
}

// requirePG checks --pg-url.
func requirePG(p *PGFlags) error {
	if err := p.resolve(); err != nil {
		return err
	}
	if strings.TrimSpace(p.PGURL) == "" {
		return flagError("pg-url", "is required: the Postgres URL of the database with the outbox table, e.g. postgres://user:pass@host:5432/db")
	}
	return nil
}

// connect opens a small pool and checks that Postgres answers.
func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, flagError("pg-url", "cannot be parsed: "+err.Error())
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		if err = pool.Ping(ctx); err != nil {
			pool.Close()
		}
	}
	if err != nil {
		return nil, replication.ConnectError(url, err)
	}
	return pool, nil
}

// checkBrokers trims the brokers and checks each is host:port, as "run" does.
func checkBrokers(in []string, requiredHint string) ([]string, error) {
	var brokers []string
	for _, b := range in {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if len(brokers) == 0 {
		return nil, flagError("kafka-brokers", "is required: comma-separated Kafka brokers, e.g. kafka-1:9092,kafka-2:9092"+requiredHint)
	}
	for _, b := range brokers {
		if !strings.Contains(b, ":") {
			return nil, flagError("kafka-brokers", fmt.Sprintf("has %q without a port: use host:port, e.g. kafka-1:9092", b))
		}
		host, port, err := net.SplitHostPort(b)
		if err != nil || host == "" {
			return nil, flagError("kafka-brokers", fmt.Sprintf("has %q: use host:port, e.g. kafka-1:9092 or [::1]:9092", b))
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, flagError("kafka-brokers", fmt.Sprintf("has %q: the port must be a number from 1 to 65535", b))
		}
	}
	return brokers, nil
}

// parseAge parses an age such as 7d, 1d12h, 36h or 30m: a whole or decimal number
// of days, optionally followed by what time.ParseDuration accepts, or only the
// latter. time.ParseDuration has no day unit (a calendar day is not always 24
// hours), but retention is said in days; here a day is 24 hours. A trailing
// " ago" is allowed. The age must be positive.
func parseAge(s string) (time.Duration, error) {
	in := s
	bad := fmt.Errorf("is %q, not an age: use e.g. 7d, 1d12h, 36h or 30m", in)
	s = strings.TrimSuffix(strings.TrimSpace(s), " ago")
	if strings.ContainsAny(s, "+-") {
		return 0, bad // an age is positive, and so is each of its parts
	}
	var d time.Duration
	if days, rest, ok := strings.Cut(s, "d"); ok {
		if !decimal.MatchString(days) {
			return 0, bad
		}
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || n > 100000 {
			return 0, bad
		}
		d = time.Duration(n * float64(24*time.Hour))
		s = rest
	}
	if s != "" || d == 0 {
		rest, err := time.ParseDuration(s)
		if err != nil {
			return 0, bad
		}
		d += rest
	}
	if d <= 0 {
		return 0, fmt.Errorf("is %q: an age must be positive, e.g. 7d, 1d12h, 36h or 30m", in)
	}
	return d, nil
}

var decimal = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// parseTime parses a time flag: RFC 3339, a date (midnight UTC), or an age
// before now (see parseAge). "" is the zero time (no bound).
func parseTime(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	age, err := parseAge(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("is %q, not a time: use %s", s, timeHelp)
	}
	return now.Add(-age), nil
}
