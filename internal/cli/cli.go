// Package cli is the cdc-relay command line: it parses flags and environment
// variables into typed configuration, validates it, and runs the subcommands.
// main only builds a signal context and calls Run.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"
	"golang.org/x/term"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// EnvPrefix prefixes the environment variable of every flag: --pg-url is
// CDC_RELAY_PG_URL.
const EnvPrefix = "CDC_RELAY"

// PGFlags are the Postgres connection and outbox flags shared by subcommands.
type PGFlags struct {
	PGURL       string `name:"pg-url" help:"Postgres URL of the database holding the outbox table (the relay adds replication=database itself)." placeholder:"URL"`
	PGURLFile   string `name:"pg-url-file" type:"path" help:"Read --pg-url from this file instead (e.g. a mounted secret), so the password is in neither the command line nor the environment." placeholder:"FILE"`
	Slot        string `default:"cdc_relay" help:"Logical replication slot the relay streams (one relay per slot)."`
	Publication string `default:"cdc_relay_outbox" help:"Publication covering the outbox table."`
	Table       string `default:"public.outbox_events" help:"Outbox table, schema-qualified."`
}

// resolve reads --pg-url-file into PGURL (every command checks its Postgres
// flags through requirePG, which calls this first).
func (p *PGFlags) resolve() error {
	if p.PGURLFile == "" {
		return nil
	}
	if p.PGURL != "" {
		return flagError("pg-url-file", "and --pg-url (CDC_RELAY_PG_URL) are both set: use one")
	}
	b, err := os.ReadFile(p.PGURLFile)
	if err != nil {
		return flagError("pg-url-file", fmt.Sprintf("cannot be read: %v", err))
	}
	p.PGURL = strings.TrimSpace(string(b))
	if p.PGURL == "" {
		return flagError("pg-url-file", fmt.Sprintf("names %s, which is empty", p.PGURLFile))
	}
	p.PGURLFile = "" // read: a second resolve keeps the URL
	return nil
}

// KafkaFlags are the Kafka flags shared by subcommands.
type KafkaFlags struct {
	KafkaBrokers []string `name:"kafka-brokers" sep:"," help:"Kafka bootstrap brokers, comma-separated host:port." placeholder:"HOST:PORT"`
	Topic        string   `default:"outbox.events" help:"Topic, or a template over columns: {aggregate_type}, {event_type}."`

	KafkaSecurityFlags `embed:""` // --kafka-tls*, --kafka-sasl-*: kafkasec.go
}

// RunCmd is "cdc-relay run".
type RunCmd struct {
	PGFlags    `embed:""`
	KafkaFlags `embed:""`

	AdminFlags `embed:""` // --metrics-addr, --metrics-token…: admin_flags.go

	CreateSlot        bool `default:"true" negatable:"" help:"Create the slot when it is missing (--no-create-slot or --create-slot=false for locked-down databases)."`
	CreatePublication bool `default:"true" negatable:"" help:"Create the publication when it is missing."`

	ColumnID            string   `default:"id" help:"Outbox column holding the event id (header 'id')."`
	ColumnAggregateType string   `default:"aggregate_type" help:"Outbox column holding the aggregate type."`
	ColumnAggregateID   string   `default:"aggregate_id" help:"Outbox column holding the aggregate id (the Kafka key)."`
	ColumnEventType     string   `default:"event_type" help:"Outbox column holding the event type."`
	ColumnPayload       string   `default:"payload" help:"Outbox column holding the payload (the Kafka value)."`
	HeaderColumns       []string `sep:"," help:"Extra outbox columns sent as Kafka headers: column or column=header, comma-separated." placeholder:"COL[=HEADER]"`

	OnError      string        `default:"dlq" enum:"dlq,halt" help:"What to do with an event that fails permanently (too large, invalid topic, no key): dlq stores it in the dead-letter table and goes on; halt stops without confirming past it."`
	DLQTable     string        `name:"dlq-table" default:"public.cdc_relay_dead_letters" help:"Dead-letter table (on-error=dlq)."`
	DLQRetention time.Duration `name:"dlq-retention" default:"0s" help:"Delete dead letters whose last failure (and last replay) is older than this, checked every 10 minutes (0 keeps them; see also cdc-relay dlq purge)."`

	OnSlotLoss      string        `default:"fail" enum:"fail,backfill" help:"When the slot was dropped, lost its WAL (wal_status 'lost') or moved past the stored checkpoint: fail refuses to start and explains how to recover; backfill recreates the slot and republishes the outbox rows still in the table created since the checkpoint's commit time less --backfill-margin, with header cdc_relay_backfill (duplicates possible, nothing lost that is still in the table)."`
	BackfillMargin  time.Duration `default:"10m" help:"How far before the stored commit time a backfill starts (covers transactions that inserted rows before they committed, and clock differences)."`
	ColumnCreatedAt string        `default:"created_at" help:"Outbox column holding the insert time (for --on-slot-loss=backfill)."`

	CheckpointStore string `default:"table" enum:"table,file" help:"Where the checkpoint is persisted: table (in the source database) or file."`
	CheckpointTable string `default:"public.cdc_relay_checkpoints" help:"Checkpoint table (checkpoint-store=table)."`
	CheckpointFile  string `default:"cdc-relay-checkpoint.json" help:"Checkpoint file (checkpoint-store=file)."`

	MaxInFlightMiB    int           `name:"max-in-flight-mib" default:"16" help:"Events read but not yet acknowledged by Kafka, in MiB; reading pauses at this bound. The Go soft memory limit is set to twice this plus 12 MiB unless GOMEMLIMIT is set."`
	BatchMaxEvents    int           `default:"10000" help:"Most events in one produce request."`
	BatchMaxBytes     int           `default:"921600" help:"Most bytes in one produce request (keep below the broker's message.max.bytes)."`
	Compression       string        `default:"none" enum:"none,gzip,snappy,lz4,zstd" help:"Produce compression."`
	StatusInterval    time.Duration `default:"1s" help:"How often the checkpoint is persisted and confirmed to the slot."`
	ShutdownTimeout   time.Duration `default:"10s" help:"Bound on a clean stop (finish transaction, flush, confirm)."`
	KafkaStartTimeout time.Duration `default:"30s" help:"How long to wait for Kafka at start before giving up."`
	RetryBase         time.Duration `default:"100ms" help:"Backoff base: retry n waits rand(0, min(cap, base*2^n))."`
	RetryCap          time.Duration `default:"30s" help:"Backoff cap."`
	RelayName         string        `help:"Name of this relay in checkpoints and logs (default: host name)."`
	HeartbeatInterval time.Duration `default:"0s" help:"Write a logical decoding message this often so the slot of an idle database keeps moving while others write WAL (0 disables)."`
	MonitorInterval   time.Duration `default:"10s" help:"How often the slot's wal_status and retained WAL are read into metrics."`

	LogLevel  string `default:"info" enum:"debug,info,warn,error" help:"Log level."`
	LogFormat string `default:"auto" enum:"auto,json,console" help:"Log format: auto is console on a terminal, JSON otherwise."`
}

// VersionCmd is "cdc-relay version".
type VersionCmd struct{}

// CLI is the command tree.
type CLI struct {
	Run     RunCmd     `cmd:"" help:"Relay committed outbox INSERTs from Postgres to Kafka."`
	Version VersionCmd `cmd:"" help:"Print the version."`
	DLQ     DLQCmd     `cmd:"" name:"dlq" help:"List, show, replay and purge dead letters (events that failed permanently)."`
	Replay  ReplayCmd  `cmd:"" help:"Publish rows still in the outbox table again (e.g. for consumers rebuilding state)."`
	Prune   PruneCmd   `cmd:"" help:"Delete old rows from the outbox table, in batches."`
	Status  StatusCmd  `cmd:"" help:"Show the slot, lag, retained WAL, stored checkpoint and dead letters, read from the database (works while the relay is down; exits 2 on a problem)."`
}

// Env holds what the process gives a command.
type Env struct {
	Stdout, Stderr io.Writer
	Version        string
	// OnRelay, when set, is called with the relay once it is built, before it
	// runs (the demo and tests watch its readiness).
	OnRelay func(*relay.Relay)
	// SetMemoryLimit, when set, is runtime/debug.SetMemoryLimit: "run" sets the
	// process's soft memory limit from --max-in-flight-mib (see memoryLimit)
	// unless Getenv("GOMEMLIMIT") is set. Left nil where cli.Run shares a process
	// (tests, the demo).
	SetMemoryLimit func(int64) int64
	// Getenv reads the environment; nil means os.Getenv.
	Getenv func(string) string
}

// Run parses args (without the program name) and runs the chosen subcommand.
func Run(ctx context.Context, args []string, env Env) error {
	if env.Stdout == nil {
		env.Stdout = os.Stdout
	}
	if env.Stderr == nil {
		env.Stderr = os.Stderr
	}
	var c CLI
	exitCode := -1
	kctx, err := parse(&c, args, env.Stdout, env.Stderr, func(code int) { exitCode = code })
	if exitCode >= 0 { // --help
		return nil
	}
	if err != nil {
		return err
	}
	switch kctx.Command() {
	case "version":
		fmt.Fprintf(env.Stdout, "cdc-relay %s (%s)\n", env.Version, runtime.Version())
		return nil
	case "run":
		return c.Run.run(ctx, env)
	case "dlq list":
		return c.DLQ.List.run(ctx, env)
	case "dlq show <id>":
		return c.DLQ.Show.run(ctx, env)
	case "dlq replay":
		return c.DLQ.Replay.run(ctx, env)
	case "dlq purge":
		return c.DLQ.Purge.run(ctx, env)
	case "dlq history":
		return c.DLQ.History.run(ctx, env)
	case "replay":
		return c.Replay.run(ctx, env)
	case "prune":
		return c.Prune.run(ctx, env)
	case "status":
		return c.Status.run(ctx, env)
	}
	return fmt.Errorf("unknown command %q", kctx.Command())
}

// parse fills c from args and the environment, running every Validate hook.
// exit is called instead of os.Exit after --help.
func parse(c *CLI, args []string, stdout, stderr io.Writer, exit func(int)) (*kong.Context, error) {
	parser, err := kong.New(c,
		kong.Name("cdc-relay"),
		kong.Description("Relays committed outbox INSERTs from Postgres logical replication to Kafka, at least once, in per-aggregate order."),
		kong.DefaultEnvars(EnvPrefix),
		kong.Writers(stdout, stderr),
		kong.Exit(exit),
	)
	if err != nil {
		return nil, fmt.Errorf("build command line: %w", err)
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		return nil, parseError(err)
	}
	return kctx, nil
}

var leadingFlag = regexp.MustCompile(`^--([a-z0-9-]+)`)

// parseError adds the environment variable to kong's errors about a flag, since
// the bad value may have come from there.
func parseError(err error) error {
	if m := leadingFlag.FindStringSubmatch(err.Error()); m != nil {
		return fmt.Errorf("%w (set by --%s or %s)", err, m[1], envName(m[1]))
	}
	return fmt.Errorf("%w (every flag can also be set as a %s_* environment variable; see --help)", err, EnvPrefix)
}

func envName(flag string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// flagError names a flag and its environment variable.
func flagError(flag, problem string) error {
	return fmt.Errorf("--%s (%s) %s", flag, envName(flag), problem)
}

// Validate checks the run flags and returns an error naming the flag and its
// environment variable.
func (r *RunCmd) Validate() error {
	if err := requirePG(&r.PGFlags); err != nil {
		return err
	}
	brokers, err := checkBrokers(r.KafkaBrokers, "")
	if err != nil {
		return err
	}
	r.KafkaBrokers = brokers
	if err := r.resolveKafkaSecurity(); err != nil {
		return err
	}
	if _, err := route.New(r.Topic); err != nil {
		return flagError("topic", err.Error())
	}
	if _, _, err := splitTable(r.Table); err != nil {
		return flagError("table", err.Error())
	}
	if _, err := r.headerColumns(); err != nil {
		return flagError("header-columns", err.Error())
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"status-interval", r.StatusInterval}, {"shutdown-timeout", r.ShutdownTimeout}, {"kafka-start-timeout", r.KafkaStartTimeout}, {"retry-base", r.RetryBase}, {"retry-cap", r.RetryCap}} {
		if d.v <= 0 {
			return flagError(d.flag, "must be a positive duration such as 500ms or 10s")
		}
	}
	if err := r.validateSlotLoss(); err != nil {
		return err
	}
	if r.DLQRetention < 0 {
		return flagError("dlq-retention", "must be 0 (keep) or a positive duration such as 168h")
	}
	if r.HeartbeatInterval < 0 {
		return flagError("heartbeat-interval", "must be 0 (off) or a positive duration such as 1m")
	}
	if r.MonitorInterval <= 0 {
		return flagError("monitor-interval", "must be a positive duration such as 10s")
	}
	if r.MaxInFlightMiB <= 0 {
		return flagError("max-in-flight-mib", "must be at least 1")
	}
	if r.BatchMaxEvents <= 0 {
		return flagError("batch-max-events", "must be at least 1")
	}
	if r.BatchMaxBytes < 1024 {
		return flagError("batch-max-bytes", "must be at least 1024")
	}
	if r.CheckpointStore == "file" && strings.TrimSpace(r.CheckpointFile) == "" {
		return flagError("checkpoint-file", "is required with --checkpoint-store=file")
	}
	return nil
}

func splitTable(t string) (schema, table string, err error) {
	parts := strings.Split(t, ".")
	switch {
	case len(parts) == 1 && parts[0] != "":
		return "public", parts[0], nil
	case len(parts) == 2 && parts[0] != "" && parts[1] != "":
		return parts[0], parts[1], nil
	}
	return "", "", fmt.Errorf("%q is not a table name: use schema.table, e.g. public.outbox_events", t)
}

func (r *RunCmd) headerColumns() (map[string]string, error) {
	return parseHeaderColumns(r.HeaderColumns)
}

// parseHeaderColumns reads --header-columns entries, "column" or
// "column=header", into a column → header map.
func parseHeaderColumns(list []string) (map[string]string, error) {
	if len(list) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(list))
	for _, hc := range list {
		col, hdr, ok := strings.Cut(strings.TrimSpace(hc), "=")
		col, hdr = strings.TrimSpace(col), strings.TrimSpace(hdr)
		if !ok {
			hdr = col
		}
		if col == "" || hdr == "" {
			return nil, fmt.Errorf("%q: use column or column=header", hc)
		}
		if prev, dup := m[col]; dup {
			return nil, fmt.Errorf("column %q is listed twice (as %q and %q)", col, prev, hdr)
		}
		switch hdr {
		case sink.HeaderID, sink.HeaderEventType, sink.HeaderAggregateType, sink.HeaderCommitLSN, sink.HeaderCommitTime:
			return nil, fmt.Errorf("%q: header %q is set by the relay itself; map the column to another header name", hc, hdr)
		}
		m[col] = hdr
	}
	return m, nil
}

func compression(name string) kafka.Compression {
	switch name {
	case "gzip":
		return kafka.Gzip
	case "snappy":
		return kafka.Snappy
	case "lz4":
		return kafka.Lz4
	case "zstd":
		return kafka.Zstd
	}
	return 0
}

// NewLogger builds the process logger: JSON, or console output on a terminal.
func NewLogger(w io.Writer, level, format string) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	if format == "console" || (format == "auto" && isTerminal(w)) {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger()
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// relayName defaults to the host name.
func relayName(name string) string {
	if name != "" {
		return name
	}
	if h, err := os.Hostname(); err == nil {
		return h
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "cdc-relay"
}

func (r *RunCmd) config(log zerolog.Logger, m *metrics.Metrics) (relay.Config, error) {
	schema, table, err := splitTable(r.Table)
	if err != nil {
		return relay.Config{}, err
	}
	headers, err := r.headerColumns()
	if err != nil {
		return relay.Config{}, err
	}
	transport, err := r.kafkaTransport()
	if err != nil {
		return relay.Config{}, err
	}
	cfg := relay.Config{
		PGURL:       r.PGURL,
		Slot:        r.Slot,
		Publication: r.Publication,
		Decoder: decoder.Config{
			Schema: schema, Table: table,
			Columns: decoder.Columns{
				ID: r.ColumnID, AggregateType: r.ColumnAggregateType, AggregateID: r.ColumnAggregateID,
				EventType: r.ColumnEventType, Payload: r.ColumnPayload,
			},
			HeaderColumns: headers,
		},
		Topic:             r.Topic,
		CreateSlot:        r.CreateSlot,
		CreatePublication: r.CreatePublication,
		Sink: sink.Config{
			Brokers:        r.KafkaBrokers,
			BatchMaxEvents: r.BatchMaxEvents,
			BatchMaxBytes:  r.BatchMaxBytes,
			Compression:    compression(r.Compression),
			Retry:          backoff.Policy{Base: r.RetryBase, Cap: r.RetryCap},
			Transport:      transport,
		},
		RelayName:        relayName(r.RelayName),
		MaxInFlightBytes: int64(r.MaxInFlightMiB) << 20,
		StatusInterval:   r.StatusInterval,
		ShutdownTimeout:  r.ShutdownTimeout,
		KafkaStartWait:   r.KafkaStartTimeout,
		Heartbeat:        r.HeartbeatInterval,
		MonitorInterval:  r.MonitorInterval,
		Retry:            backoff.Policy{Base: r.RetryBase, Cap: r.RetryCap},
		Logger:           log,
		Metrics:          m,
	}
	if r.OnError == "dlq" {
		var store *deadletter.Store
		table, name, topic := r.DLQTable, cfg.RelayName, r.Topic
		cfg.OpenDeadLetters = func(ctx context.Context, pool *pgxpool.Pool) (relay.DeadLetterFunc, error) {
			store = deadletter.NewStore(pool, table)
			if err := store.Ensure(ctx); err != nil {
				return nil, err
			}
			return store.Recorder(name, topic)
		}
		cfg.DeadLetterBacklog = func(ctx context.Context) (int64, error) { return store.Backlog(ctx) }
		if keep := r.DLQRetention; keep > 0 {
			cfg.DeadLetterRetention = func(ctx context.Context) (int64, error) {
				return store.Purge(ctx, time.Now().Add(-keep), "")
			}
		}
	}
	r.setBackfill(&cfg, log)
	switch r.CheckpointStore {
	case "file":
		path := r.CheckpointFile
		cfg.OpenStore = func(context.Context, *pgxpool.Pool) (relay.Store, error) {
			return checkpoint.NewFileStore(path), nil
		}
	default:
		tbl := r.CheckpointTable
		cfg.OpenStore = func(ctx context.Context, pool *pgxpool.Pool) (relay.Store, error) {
			s := checkpoint.NewTableStore(pool, tbl)
			if err := s.Ensure(ctx); err != nil {
				return nil, err
			}
			return s, nil
		}
	}
	return cfg, nil
}

// memoryLimit is the soft memory limit "run" gives the Go runtime: room for
// the events in flight twice over (the garbage collector's headroom) plus what
// the relay needs besides them. The garbage collector works harder only when
// the heap nears it, so peak memory follows --max-in-flight-mib whatever the
// backlog.
func memoryLimit(maxInFlightMiB int) int64 {
	return int64(maxInFlightMiB)<<21 + 12<<20
}

func (r *RunCmd) run(ctx context.Context, env Env) error {
	log := NewLogger(env.Stderr, r.LogLevel, r.LogFormat) // the relay adds the slot
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)
	m.BuildInfo.WithLabelValues(env.Version, runtime.Version()).Set(1)
	cfg, err := r.config(log, m)
	if err != nil {
		return err
	}
	rl := relay.New(cfg)
	if env.OnRelay != nil {
		env.OnRelay(rl)
	}
	srv, err := r.startAdmin(reg, rl.Ready, log)
	if err != nil {
		return err
	}
	getenv := env.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if env.SetMemoryLimit != nil && getenv("GOMEMLIMIT") == "" {
		limit := memoryLimit(r.MaxInFlightMiB)
		env.SetMemoryLimit(limit)
		log.Debug().Int64("bytes", limit).Msg("Go soft memory limit set from --max-in-flight-mib (GOMEMLIMIT overrides)")
	}
	log.Info().Str("version", env.Version).Str("slot", r.Slot).Str("table", r.Table).Str("topic", r.Topic).
		Strs("brokers", r.KafkaBrokers).Msg("starting cdc-relay")
	r.logKafkaSecurity(log)
	runErr := nameFlags(r.explainKafkaError(rl.Run(ctx)), runFlags)
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := srv.Shutdown(sctx); err != nil && runErr == nil {
			runErr = fmt.Errorf("stop metrics server: %w", err)
		}
		cancel()
	}
	if runErr != nil && errors.Is(runErr, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	if runErr != nil {
		// Logged here, in the log's format (JSON for collectors), and only here.
		log.Error().Err(runErr).Str("slot", r.Slot).Msg("cdc-relay stopped with an error")
		return &reportedError{runErr}
	}
	return nil
}

// reportedError is an error the command already logged.
type reportedError struct{ error }

func (e *reportedError) Unwrap() error { return e.error }

// Reported reports whether err was already written to the log, so main need
// not print it again.
func Reported(err error) bool {
	var r *reportedError
	return errors.As(err, &r)
}
