package cli

import (
	"errors"
	"io"

	"github.com/alecthomas/kong"

	"github.com/cdc-relay/cdc-relay/internal/config"
)

// The command line's overlays of the settings' declarations (internal/config
// reads them): the --config file, --set and --debezium-config, each added to
// the parse as a kong.Resolver. Precedence, lowest first: the default, the
// Debezium file, the --config file, the environment, --set, the flag.
//
// One file serves every command: a key is an error only when no command has
// it; a command ignores the keys of flags it does not take. A flag tagged
// nofile:"" never takes its key from the file: it shares a name with another
// command's flag of another meaning (dlq's --topic is not run's).

// configFlag, setFlag and debeziumFlag (debezium_cmd.go) are the global
// flags that name the overlays.
const (
	configFlag = "config"
	setFlag    = "set"
)

// configLoader loads the file --config or CDC_RELAY_CONFIG names, --set and
// --debezium-config, and adds them to the parse as resolvers. Kong calls a
// BeforeResolve hook once per element of the parsed path, so it loads them
// the first time only.
type configLoader struct {
	loaded   bool
	file     *config.File  // nil: no file
	debezium *debeziumFile // nil: no --debezium-config (debezium_cmd.go)
	sets     *config.Sets  // nil: no --set
	stderr   io.Writer     // warnings
}

// beforeResolve is the kong.WithBeforeResolve hook.
func (l *configLoader) beforeResolve(ctx *kong.Context) error {
	if l.loaded {
		return nil
	}
	l.loaded = true
	var path string
	var given []string
	found := false
	for _, f := range ctx.Model.Flags {
		switch f.Name {
		case configFlag:
			path, _ = ctx.FlagValue(f).(string)
			found = true
		case setFlag:
			given, _ = ctx.FlagValue(f).([]string)
		}
	}
	if !found {
		return errors.New("no --config flag in the command line model")
	}
	if err := l.loadDebezium(ctx); err != nil {
		return err
	}
	byKey, _ := config.Keys(ctx.Model)
	if path != "" {
		cf, err := config.LoadFile(kong.ExpandPath(path), knownKeys(ctx.Model), byKey, "--config / "+envName(configFlag))
		if err != nil {
			return err
		}
		l.file = cf
		ctx.AddResolver(cf)
	}
	sets, err := config.LoadSets(given, byKey)
	if err != nil || sets == nil {
		return err
	}
	l.sets = sets
	ctx.AddResolver(sets)
	return nil
}

// knownKeys are the flag names a file may use as keys, those of FileKey:
// a nofile flag shares its name with another command's, which counts.
func knownKeys(app *kong.Application) map[string]bool {
	known := map[string]bool{}
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, f := range n.Flags {
			if FileKey(f) != "" {
				known[f.Name] = true
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(app.Node)
	return known
}

// tables returns the file's table entries (nil without a file).
func (l *configLoader) tables() ([]config.TableEntry, error) {
	if l.file == nil {
		return nil, nil
	}
	return l.file.TableEntries()
}
