package cli

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/cdc-relay/cdc-relay/internal/admin"
	"github.com/cdc-relay/cdc-relay/internal/config"
	"github.com/cdc-relay/cdc-relay/internal/kafkaconn"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// runFlags maps the library configuration fields, as the command line nests
// them (relay.Config's, and "Kafka." for kafkaconn's), that packages name (through
// the setting.Namer of runNames, in an error or a log line) to the setting
// that sets them: its key and its flag. Each setting's declaration says
// which fields it sets (a field tag, model.go): "Sink.Brokers" is the sink's
// Brokers as relay.Config nests it (setting.Namer.Within), and a field
// after which a value follows ("Backfill=backfill") is set by that value,
// a hook the relay runs only then. A field several settings set
// (Decoder.JSON) names them all, separated by commas.
var runFlags = libraryFields(reflect.TypeOf(RunCmd{}))

// namedConfig is the configuration whose fields runNames names: relay.Config
// at its root, and beside it the two configurations the command line builds
// and names under a field of its own (runNames.Within("Admin"),
// Within("Kafka")). Every field tag and every Within of the command line is
// a path in it (TestFieldTagsResolve), so a renamed library field fails a
// test instead of leaving an operator with "(setting Old)".
type namedConfig struct {
	relay.Config
	Admin admin.Config
	Kafka kafkaconn.Config
}

// fieldPath returns the type of the field at path ("Sink.Brokers") in t, a
// struct type, or an error naming the first part t lacks.
func fieldPath(t reflect.Type, path string) (reflect.Type, error) {
	for _, name := range strings.Split(path, ".") {
		if t.Kind() != reflect.Struct {
			return nil, fmt.Errorf("%s: %s is a %s, which has no field %s", path, t, t.Kind(), name)
		}
		f, ok := t.FieldByName(name)
		if !ok {
			return nil, fmt.Errorf("%s: %s has no field %s", path, t, name)
		}
		t = f.Type
	}
	return t, nil
}

// libraryFields reads the field tags of the settings of command type t.
func libraryFields(t reflect.Type) map[string]runSetting {
	decls := config.Declarations(t)
	out := map[string]runSetting{
		// The outbox columns as a whole: every key and flag of the group.
		"Decoder.Columns": {"outbox.columns.*", "column-*"},
	}
	for _, key := range slices.Sorted(maps.Keys(decls)) {
		d := decls[key]
		for _, f := range d.Fields {
			field, value, hasValue := strings.Cut(f, "=")
			k, fl := d.Key, d.Flag
			if hasValue {
				fl += "=" + value // the key takes it as the flag does (cliNames.Setting)
			}
			if prev, ok := out[field]; ok {
				k, fl = prev.key+","+k, prev.flag+","+fl
			}
			out[field] = runSetting{k, fl}
		}
	}
	return out
}

// runSetting is the setting of a relay.Config field: its key and flag, each
// with the value the message asks for when there is one ("flag=value"), or
// several, separated by commas.
type runSetting struct{ key, flag string }

// runNames names the settings of relay.Config as the command line sets them
// (runFlags): every command hands it to the library packages it configures,
// Within the field of a nested configuration as relay.Config holds it.
var runNames = setting.NewNamer(&cliNames{settings: runFlags})

// cliNames is the command line's setting.Names: a setting as its key, flag
// and environment variable (settings: field path → setting), a command as
// the command line that runs it. It is used by pointer, which compares.
type cliNames struct{ settings map[string]runSetting }

// Setting names field's setting as "key (--flag / CDC_RELAY_FLAG)", with a
// value "key=value (--flag=value / CDC_RELAY_FLAG=value)", several so
// separated by commas. A field the map lacks keeps the library's own name.
func (n *cliNames) Setting(field string) string {
	s, ok := n.settings[field]
	if !ok {
		return setting.Namer{}.Name(field)
	}
	keys, flags := strings.Split(s.key, ","), strings.Split(s.flag, ",")
	named := make([]string, len(flags))
	for i, f := range flags {
		name, value, hasValue := strings.Cut(f, "=")
		if hasValue {
			value = "=" + value
		}
		named[i] = keys[i] + value + " (--" + f + " / " + envName(name) + value + ")"
	}
	return strings.Join(named, ", ")
}

// Command returns "cdc-relay name --arg value ...".
func (*cliNames) Command(name string, args ...string) string {
	var b strings.Builder
	b.WriteString("cdc-relay " + name)
	for i := 0; i+1 < len(args); i += 2 {
		b.WriteString(" --" + args[i])
		if args[i+1] != "" {
			b.WriteString(" " + args[i+1])
		}
	}
	return b.String()
}
