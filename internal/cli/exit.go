package cli

// How a failure leaves the process: one shape per output and an exit code
// that tells a usage mistake from a runtime failure. docs/troubleshooting.md
// documents both.

import (
	"errors"
	"io"
	"regexp"
	"strings"

	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// Exit codes. status exits 3 (statusProblem) when it finds a problem with
// the slot (see StatusCmd).
const (
	// ExitFailure is a runtime failure: a dependency refused or could not be
	// reached, the relay halted.
	ExitFailure = 1
	// ExitUsage is a mistake in the command line, the environment variables
	// or the configuration file: fix the flag the message names and run again.
	ExitUsage = 2
)

// usageError is a mistake in the command line, environment or --config file.
type usageError struct{ error }

func (e *usageError) Unwrap() error { return e.error }

// ExitCode is the process's exit code for err, as Run returned it: 0 for
// nil, an *ExitError's Code, ExitUsage for a mistake in the command line,
// environment or configuration found before connecting anywhere (flags,
// --config file, a *setting.FieldError from the relay's own checks), and
// ExitFailure for anything else, including what the servers refuse (a
// *replication.ConfigError: wal_level, a missing table, privileges).
func ExitCode(err error) int {
	var exit *ExitError
	var usage *usageError
	var server *replication.ConfigError
	var field *setting.FieldError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.Code
	case errors.As(err, &usage):
		return ExitUsage
	case errors.As(err, &server): // found on the server, even when a setting is the fix
		return ExitFailure
	case errors.As(err, &field):
		return ExitUsage
	}
	return ExitFailure
}

var lineBreaks = regexp.MustCompile(`\s*\n\s*`)

// oneLineError is err's message on one line: errors joined on several lines
// (errors.Join, pgconn) are separated by "; " instead.
func oneLineError(err error) string {
	return lineBreaks.ReplaceAllString(strings.TrimSpace(err.Error()), "; ")
}

// ErrorLine is the plain shape of a failure, for a terminal or a console
// log: "cdc-relay: " and the message, on one line.
func ErrorLine(err error) string {
	return "cdc-relay: " + oneLineError(err)
}

// logsJSON reports whether "run" with --log-format format writes JSON to w.
func logsJSON(w io.Writer, format string) bool {
	return format == "json" || (format != "console" && !isTerminal(w))
}

// reportJSON writes err as the JSON log line of a failed command and returns
// it marked as reported, so main prints nothing more.
func reportJSON(w io.Writer, err error, msg string) error {
	log := NewLogger(w, "error", "json")
	log.Error().Str("error", oneLineError(err)).Int("exit_code", ExitCode(err)).Msg(msg)
	return &reportedError{err}
}

// usageLogFormat is the --log-format of a command line that failed to parse,
// for the shape of its error: the flag's value, else its variable's, else
// the value kong parsed before it failed (from the --config file, or the
// default), or "" when the command is not "run" (the only command with a log;
// the others print plain errors).
func usageLogFormat(c *CLI, args []string, getenv func(string) string) string {
	command := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		if v, ok := strings.CutPrefix(a, "--log-format="); ok {
			return v
		}
		if a == "--log-format" && i+1 < len(args) {
			return args[i+1]
		}
		if command == "" && !strings.HasPrefix(a, "-") {
			command = a
		}
		if a == "--"+configFlag || a == "--"+debeziumFlag {
			i++ // the flag's value, not the command
		}
	}
	if command != "run" {
		return ""
	}
	if v := getenv(envName("log-format")); v != "" {
		return v
	}
	if c.Run.LogFormat != "" {
		return c.Run.LogFormat
	}
	return "auto"
}
