package cli

import (
	"fmt"
	"io"

	"github.com/alecthomas/kong"
)

// What the command line shows of itself to the tools that describe it
// (internal/clidoc generates docs/configuration.md's reference from these).

// Model returns the command line's model exactly as Run builds it: every
// command and flag with the groups, defaults and interpolated help --help
// shows. Reading it runs no command.
func Model() (*kong.Application, error) {
	var c CLI
	kctx, err := parse(&c, []string{"version"}, io.Discard, io.Discard, func(int) {})
	if err != nil {
		return nil, fmt.Errorf("build the command line model: %w", err)
	}
	return kctx.Model, nil
}

// FileKey returns the key that sets f in the --config file: the setting's
// key (its flag name is accepted too), or a command argument's flag name; ""
// for the flags the file cannot set: those naming the files themselves,
// --set, those tagged nofile (config.go) and --help.
func FileKey(f *kong.Flag) string {
	if f.Name == configFlag || f.Name == debeziumFlag || f.Name == setFlag || f.Tag.Has("nofile") || isHelpFlag(f) {
		return ""
	}
	if k := f.Tag.Get("key"); k != "" {
		return k
	}
	return f.Name
}

// IsHelpFlag reports whether f is --help or --help-all, which are neither
// settings nor config file keys.
func IsHelpFlag(f *kong.Flag) bool { return isHelpFlag(f) }
