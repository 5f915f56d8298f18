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
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"
	"golang.org/x/term"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
	"github.com/cdc-relay/cdc-relay/internal/config"
	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// EnvPrefix prefixes the environment variable of every flag: --pg-url is
// CDC_RELAY_PG_URL.
const EnvPrefix = "CDC_RELAY"

// CLI is the command tree.
type CLI struct {
	HelpAll helpAllFlag `name:"help-all" env:"-" help:"Show every flag, not only the common ones."`

	ConfigFile     string   `name:"config" help:"YAML file of settings by key (source: {slot: …}); the environment, --set and flags override it." placeholder:"FILE"`
	Set            []string `name:"set" sep:"none" env:"-" placeholder:"KEY=VALUE" help:"Set one setting by key (source.slot=orders), over the environment and the file; repeat it."`
	DebeziumConfig string   `name:"debezium-config" help:"Debezium PostgresConnector configuration with the Outbox Event Router (Connect JSON or .properties), translated to these settings; flags, --set, environment variables and --config override it. See cdc-relay config from-debezium." placeholder:"FILE"`

	Run     RunCmd     `cmd:"" help:"Relay committed outbox INSERTs from Postgres to Kafka, each once in the Kafka log (at least once with --delivery at-least-once)."`
	Version VersionCmd `cmd:"" help:"Print the version."`
	DLQ     DLQCmd     `cmd:"" name:"dlq" help:"List, show, replay and purge dead letters (events that failed permanently)."`
	Replay  ReplayCmd  `cmd:"" help:"Publish rows still in the outbox table again, as extra copies (e.g. for consumers rebuilding state)."`
	Prune   PruneCmd   `cmd:"" help:"Delete old rows from the outbox table, in batches."`
	Status  StatusCmd  `cmd:"" help:"Show the slot, lag, retained WAL, stored checkpoint and dead letters, read from the database (works while the relay is down; exits 3 on a problem)."`
	Config  ConfigCmd  `cmd:"" name:"config" help:"Show (print), check (check) or translate (from-debezium) the configuration."`
}

// Env holds what the process gives a command.
type Env struct {
	Stdout, Stderr io.Writer
	Version        string
	// OnRelay, when set, is called with the relay once it is built, before it
	// runs (the demo and tests watch its readiness).
	OnRelay func(*relay.Relay)
	// OpenProducer is "run"'s relay.Config.OpenProducer (nil: sink.Kafka).
	OpenProducer func(context.Context, sink.Config) (relay.Producer, error)
	// SetMemoryLimit, when set, is runtime/debug.SetMemoryLimit: "run" sets the
	// process's soft memory limit from --max-in-flight-mib (see memoryLimit)
	// unless Getenv("GOMEMLIMIT") is set. Left nil where cli.Run shares a process
	// (tests, the demo).
	SetMemoryLimit func(int64) int64
	// Getenv reads the environment; nil means os.Getenv.
	Getenv func(string) string
}

// Run parses args (without the program name) and runs the chosen subcommand.
// A failure is returned for main to print with ErrorLine, unless Reported
// (run logs its failures itself in JSON mode), and to exit with ExitCode.
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
		err = &usageError{err}
		getenv := env.Getenv
		if getenv == nil {
			getenv = os.Getenv
		}
		if format := usageLogFormat(&c, args, getenv); format != "" && logsJSON(env.Stderr, format) {
			return reportJSON(env.Stderr, err, "cdc-relay: invalid command line or configuration")
		}
		return err
	}
	// Each command's Run method takes what it needs of these.
	kctx.BindTo(ctx, (*context.Context)(nil))
	return kctx.Run(env)
}

// parse fills c from args and the environment, running every Validate hook.
// exit is called instead of os.Exit after --help.
func parse(c *CLI, args []string, stdout, stderr io.Writer, exit func(int)) (*kong.Context, error) {
	config := configLoader{stderr: stderr}
	parser, err := kong.New(c,
		kong.Name("cdc-relay"),
		kong.Description(description),
		kong.ExplicitGroups(helpGroups),
		kong.Help(printHelp),
		kong.ValueFormatter(helpValue),
		kong.DefaultEnvars(EnvPrefix),
		kong.Writers(stdout, stderr),
		kong.Exit(exit),
		kong.PostBuild(expandDefaults),
		kong.WithBeforeResolve(config.beforeResolve),
		kong.Bind(&config),
	)
	if err != nil {
		return nil, fmt.Errorf("build command line: %w", err)
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		return nil, parseError(err, &config)
	}
	return kctx, nil
}

var leadingFlag = regexp.MustCompile(`^--([a-z0-9-]+)`)

// parseError adds the environment variable to kong's errors about a flag, since
// the bad value may have come from there, and the --set or the config file's
// key and line when the value came from one of those (l holds them). Errors
// about the file itself name it and pass unchanged.
func parseError(err error, l *configLoader) error {
	var ce *config.Error
	if errors.As(err, &ce) {
		return ce
	}
	var se *config.SetError
	if errors.As(err, &se) {
		return se
	}
	if flag, given := l.sets.FromSet(err.Error()); flag != "" {
		return fmt.Errorf("%w (set by %s; --%s overrides it)", err, given, flag)
	}
	if flag, where := l.file.FromFile(err.Error()); flag != "" {
		return fmt.Errorf("%w (set by %s; --%s or %s override it)", err, where, flag, envName(flag))
	}
	if m := leadingFlag.FindStringSubmatch(err.Error()); m != nil {
		if m[1] == setFlag { // the message names the --set; it has no variable
			return err
		}
		return fmt.Errorf("%w (set by --%s or %s)", err, m[1], envName(m[1]))
	}
	return fmt.Errorf("%w (every flag can also be set as a %s_* environment variable or in the --config file; see --help)", err, EnvPrefix)
}

func envName(flag string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// flagError names a setting by its key, flag and environment variable (a
// command argument, which has no key, by its flag and variable).
func flagError(flag, problem string) error {
	return &settingError{key: keyOfFlag(flag), flag: flag, problem: problem}
}

// settingError is a bad value of one setting (flagError): what is wrong
// with it, and the setting's key ("" for a command argument) and flag, so
// that an error about a table entry's override can name the key as the
// entry wrote it (tables.go).
type settingError struct{ key, flag, problem string }

// Error names the key, the flag and its variable, then the problem.
func (e *settingError) Error() string {
	if e.key != "" {
		return fmt.Sprintf("%s: --%s (%s) %s", e.key, e.flag, envName(e.flag), e.problem)
	}
	return fmt.Sprintf("--%s (%s) %s", e.flag, envName(e.flag), e.problem)
}

// NewLogger builds the process logger: JSON, or console output on a terminal.
func NewLogger(w io.Writer, level, format string) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	console := format == "console" || (format == "auto" && isTerminal(w))
	if console {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger()
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
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

// ExitError asks main to exit with Code after printing Err.
type ExitError struct {
	Code int
	Err  error
}

// Error is Err's message: the exit code is for main, not for the reader.
func (e *ExitError) Error() string { return e.Err.Error() }

// Unwrap returns Err, so errors.Is and errors.As see through the exit code.
func (e *ExitError) Unwrap() error { return e.Err }

// defaults are the flag defaults that library packages state (relay.Default*,
// sink.Default*, backoff.Default), so each is written once; a flag's default
// tag names one as ${name}.
var defaults = map[string]string{
	"default_max_in_flight_mib":      strconv.Itoa(relay.DefaultMaxInFlightBytes >> 20),
	"default_delivery":               relay.DeliveryEffectivelyOnce,
	"default_batch_max_events":       strconv.Itoa(sink.DefaultBatchMaxEvents),
	"default_max_in_flight_requests": strconv.Itoa(sink.DefaultMaxInFlight),
	"default_batch_max_bytes":        strconv.Itoa(sink.DefaultBatchMaxBytes),
	"default_status_interval":        config.ShortDuration(relay.DefaultStatusInterval),
	"default_read_coalesce":          config.ShortDuration(relay.DefaultReadCoalesce),
	"default_read_buffer_kib":        strconv.Itoa(relay.DefaultReadBuffer >> 10),
	"default_catch_up_threshold_mib": strconv.Itoa(relay.DefaultCatchUpThreshold >> 20),
	"default_catch_up_batch":         strconv.Itoa(relay.DefaultCatchUpBatch),
	"default_shutdown_timeout":       config.ShortDuration(relay.DefaultShutdownTimeout),
	"default_kafka_start_timeout":    config.ShortDuration(relay.DefaultKafkaStartWait),
	"default_request_timeout":        config.ShortDuration(sink.DefaultRequestTimeout),
	"default_monitor_interval":       config.ShortDuration(relay.DefaultMonitorInterval),
	"default_backfill_margin":        config.ShortDuration(relay.DefaultBackfillMargin),
	"default_retry_base":             config.ShortDuration(backoff.Default.Base),
	"default_retry_cap":              config.ShortDuration(backoff.Default.Cap),

	"default_dlq_auto_retry_codes":    strings.Join(deadletter.DefaultRetryCodes, ","),
	"default_dlq_auto_retry_budget":   strconv.Itoa(deadletter.DefaultRetryBudget),
	"default_dlq_auto_retry_base":     config.ShortDuration(deadletter.DefaultRetry.Base),
	"default_dlq_auto_retry_cap":      config.ShortDuration(deadletter.DefaultRetry.Cap),
	"default_dlq_auto_retry_interval": config.ShortDuration(deadletter.DefaultRetryInterval),
	"default_dlq_auto_retry_timeout":  config.ShortDuration(deadletter.DefaultAttemptTimeout),
	"default_dlq_lease":               config.ShortDuration(deadletter.DefaultLease),
}

// expandDefaults replaces the ${name} of defaults in flag defaults before kong
// interpolates the model. Given to kong as variables they would cost far more:
// kong re-expands every variable it has for every flag of every command, which
// made each parse take a third of a second under the race detector. A name not
// in defaults is left for kong, which reports it as undefined.
func expandDefaults(k *kong.Kong) error {
	return kong.Visit(k.Model.Node, func(n kong.Visitable, next kong.Next) error {
		if v, ok := n.(*kong.Value); ok && strings.Contains(v.Default, "${") {
			for name, value := range defaults {
				v.Default = strings.ReplaceAll(v.Default, "${"+name+"}", value)
			}
		}
		return next(nil)
	})
}
