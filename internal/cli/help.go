package cli

import (
	"fmt"
	"go/doc/comment"
	"slices"
	"strings"

	"github.com/alecthomas/kong"
)

// What --help shows beyond each flag's own help: the groups its flags are
// listed in, and the examples at the top of the commands that have one.

// description is the application's one-line summary, the first thing
// cdc-relay --help says: the guarantee of the default --delivery.
const description = "Relays committed outbox INSERTs from Postgres logical replication to Kafka, in per-aggregate order. By default (--delivery effectively-once) each committed outbox row appears once in the Kafka log; nothing committed is lost, so at least once is the floor (and all that --delivery at-least-once promises)."

// helpGroups are the groups a command's flags are listed in, by the key of
// their group tag. A command lists its groups in the order of their first
// flag in its struct; flags without a group (--help, --help-all, --config,
// --debezium-config) come first, under "Flags:". A group tag naming no
// group here is a mistake TestRunHelpGroups catches for run.
var helpGroups = []kong.Group{
	{Key: "postgres", Title: "Postgres:", Description: "The database, its replication slot and publication, the outbox table's columns."},
	{Key: "kafka", Title: "Kafka:", Description: "The brokers, TLS and SASL, and how records are batched."},
	{Key: "routing", Title: "Routing and format:", Description: "Each event's topic, partition, headers, key and value encoding."},
	{Key: "delivery", Title: "Delivery and failures:", Description: "The guarantee, checkpoints, retries, and what becomes of an event or a slot that fails."},
	{Key: "operations", Title: "Operations:", Description: "The /metrics, /healthz and /readyz endpoints, logs, tracing, memory and shutdown."},
	{Key: "selection", Title: "Selection:", Description: "Which rows or dead letters the command acts on, and how many at once."},
	{Key: "replay", Title: "Replaying:", Description: "A dry run, the pace, and who the replay history records."},
	{Key: "output", Title: "Output:", Description: "What the command prints."},
}

// shortHelp names, per command ("dlq replay"), the flags its --help lists:
// the required ones and those most deployments set, its own or those every
// command takes (--config); --help and --help-all are always listed. The
// others are only not listed: every command accepts all its flags as
// before, and --help-all and docs/configuration.md list them. A command not
// named here lists all its flags.
var shortHelp = map[string][]string{
	"": {}, // cdc-relay --help: the commands; each lists the flags every command takes
	"run": {
		"config", "set",
		"pg-url", "pg-url-file", "table", "slot", "publication",
		"kafka-brokers", "kafka-tls", "kafka-sasl-mechanism", "kafka-sasl-username", "kafka-sasl-password-file",
		"topic",
		"delivery",
		"metrics-addr", "metrics-token-file",
	},
	"config print": {"config", "set", "json", "changed"},
	"config check": {"config", "set", "pg-url", "kafka-brokers"},
	"replay": {
		"config", "pg-url", "kafka-brokers",
		"since", "until", "aggregate-id", "id", "dry-run", "rate",
	},
	"dlq replay": {
		"config", "pg-url", "kafka-brokers",
		"error-code", "since", "event-id", "dry-run", "rate",
	},
	"dlq list": {
		"config", "pg-url",
		"error-code", "since", "until", "aggregate-id", "event-type", "status", "limit", "json",
	},
	"dlq history": {"config", "pg-url", "replay", "event-id", "limit", "json"},
	"dlq show":    {"config", "pg-url", "pg-url-file", "dlq-table", "event-id", "json"},
	"dlq purge":   {"config", "pg-url", "pg-url-file", "dlq-table", "older-than", "status"},
	"status":      {"config", "pg-url", "pg-url-file", "slot", "publication", "table", "max-lag-bytes", "json"},
}

// helpValue is the kong.HelpValueFormatter of --help: a flag's help,
// then its environment variable and, for a setting, its key, the three
// names of one setting: "(CDC_RELAY_SLOT, key source.slot)".
func helpValue(value *kong.Value) string {
	key := value.Tag.Get("key")
	if key == "" || len(value.Tag.Envs) == 0 {
		return kong.DefaultHelpValueFormatter(value)
	}
	suffix := "($" + strings.Join(value.Tag.Envs, ", $") + ", key " + key + ")"
	if h, ok := strings.CutSuffix(value.Help, "."); ok {
		return h + " " + suffix + "."
	}
	return strings.TrimSpace(value.Help + " " + suffix)
}

// helpAllFlag is --help-all: --help listing every flag of the command.
type helpAllFlag bool

// BeforeReset prints the full help and exits, as kong's --help does. Kong
// calls it only when --help-all is on the command line.
func (helpAllFlag) BeforeReset(ctx *kong.Context) error {
	if err := ctx.PrintUsage(false); err != nil {
		return err
	}
	ctx.Kong.Exit(0)
	return nil
}

// helpAllName is --help-all's name.
const helpAllName = "help-all"

// isHelpFlag reports whether f is --help or --help-all, which are neither
// settings nor config file keys.
func isHelpFlag(f *kong.Flag) bool { return f.Name == "help" || f.Name == helpAllName }

// printHelp is the kong.HelpPrinter of --help and --help-all: kong's own,
// over the flags shortHelp names for the command unless --help-all was
// given, with a last line saying how many more there are and where. It
// lists the others by leaving them out of the model's flag lists while it
// prints; parsing, config print and the docs read the model unchanged.
func printHelp(options kong.HelpOptions, ctx *kong.Context) error {
	node := ctx.Selected()
	if node == nil {
		node = ctx.Model.Node
	}
	shown, ok := shortHelp[commandPath(node)]
	if !ok || helpAllGiven(ctx) {
		return kong.DefaultHelpPrinter(options, ctx)
	}
	more := 0
	for n := node; n != nil; n = n.Parent {
		all := n.Flags
		n.Flags = nil
		for _, f := range all {
			switch {
			case f.Hidden || isHelpFlag(f) || slices.Contains(shown, f.Name):
				n.Flags = append(n.Flags, f)
			default:
				more++
			}
		}
		defer func() { n.Flags = all }()
	}
	if err := kong.DefaultHelpPrinter(options, ctx); err != nil {
		return err
	}
	var p comment.Printer // wraps at 80 columns
	note := fmt.Sprintf("%d more flags: see %s --help-all or docs/configuration.md.", more, node.FullPath())
	_, err := fmt.Fprintf(ctx.Stdout, "\n%s", p.Text(new(comment.Parser).Parse(note)))
	return err
}

// helpAllGiven reports whether --help-all is on the command line.
func helpAllGiven(ctx *kong.Context) bool {
	for _, p := range ctx.Path {
		if p.Flag != nil && p.Flag.Name == helpAllName {
			return true
		}
	}
	return false
}

// commandPath is n's path below the application: "dlq replay".
func commandPath(n *kong.Node) string { return strings.Join(strings.Fields(n.Path()), " ") }

// Help is the example and notes --help shows above run's flags (kong's
// HelpProvider). TestHelpExamplesParse parses its example.
func (*RunCmd) Help() string {
	return `Example:

    cdc-relay run \
      --pg-url 'postgres://relay@db.internal:5432/app?sslmode=verify-full' \
      --kafka-brokers kafka-1:9092,kafka-2:9092,kafka-3:9092 \
      --table public.outbox_events --topic 'outbox.{aggregate_type}' \
      --metrics-addr 0.0.0.0:9187 \
      --metrics-token-file /run/secrets/metrics-token

Required: --pg-url (or --pg-url-file) and --kafka-brokers; the Postgres password comes from the URL, PGPASSWORD or ~/.pgpass. Each setting is a flag, the variable and the key shown beside it (in a --config file or --set); cdc-relay config check checks a configuration without running it.`
}

// Help shows an example above replay's flags.
func (*ReplayCmd) Help() string {
	return `Example: publish again the last day's rows of one aggregate, 100 a second:

    cdc-relay replay --pg-url postgres://relay@db:5432/app \
      --kafka-brokers kafka-1:9092 --since 24h --aggregate-id order-42 \
      --rate 100

Consumers receive these events a second time (header cdc_relay_replay); --dry-run shows what would be published.`
}

// Help shows examples above dlq list's flags.
func (*DLQListCmd) Help() string {
	return `Example: the letters of the last hour that were too large:

    cdc-relay dlq list --pg-url postgres://relay@db:5432/app \
      --since 1h --error-code message_too_large`
}

// Help shows an example above dlq replay's flags.
func (*DLQReplayCmd) Help() string {
	return `Example: see, then publish again, the letters of the last hour:

    cdc-relay dlq replay --pg-url postgres://relay@db:5432/app \
      --kafka-brokers kafka-1:9092 --since 1h --dry-run
    cdc-relay dlq replay --pg-url postgres://relay@db:5432/app \
      --kafka-brokers kafka-1:9092 --since 1h`
}

// Help shows an example above prune's flags.
func (*PruneCmd) Help() string {
	return `Example: delete outbox rows older than a week, 1000 per transaction:

    cdc-relay prune --pg-url postgres://relay@db:5432/app --older-than 7d`
}

// Help shows an example above status's flags.
func (*StatusCmd) Help() string {
	return fmt.Sprintf(`Example: for a cron job or a probe; exits %d when there is a problem, e.g. a lag above 256 MiB:

    cdc-relay status --pg-url postgres://relay@db:5432/app \
      --max-lag-bytes 268435456`, statusProblem)
}

// Help shows an example above dlq purge's flags.
func (*DLQPurgeCmd) Help() string {
	return `Example: delete the replayed letters older than 30 days:

    cdc-relay dlq purge --pg-url postgres://relay@db:5432/app \
      --older-than 30d --status completed`
}

// Help says, above config print's own flags, that it takes run's: its --help
// lists only its own.
func (*ConfigPrintCmd) Help() string {
	return `It accepts every flag of run, as run does (from the command line, the environment, --config or --debezium-config): cdc-relay run --help-all lists them.`
}

// Help shows an example above config from-debezium's argument.
func (*ConfigFromDebeziumCmd) Help() string {
	return `Example: the connector's JSON as POSTed to Kafka Connect, as a --config file:

    cdc-relay config from-debezium connector.json

It prints the YAML; redirect it to a file (> relay.yaml) and start the relay with --config relay.yaml.`
}
