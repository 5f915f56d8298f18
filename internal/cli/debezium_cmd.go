package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/alecthomas/kong"
	"github.com/cdc-relay/cdc-relay/internal/config"
	"github.com/cdc-relay/cdc-relay/internal/debezium"
)

// debeziumFlag is the name of the global flag that names a Debezium
// connector configuration (--debezium-config FILE, CDC_RELAY_DEBEZIUM_CONFIG).
const debeziumFlag = "debezium-config"

// sourceDebezium is config print's source of a value translated from the
// --debezium-config file.
const sourceDebezium = "debezium"

// debeziumFile is a translated connector configuration and the kong.Resolver
// over it. The loader adds it before the --config file's resolver, and kong
// keeps the last resolver's value, so the precedence is flags > env >
// --config file > --debezium-config file > defaults.
type debeziumFile struct {
	path  string
	tr    *debezium.Translation
	keys  map[string]string // flag → key, in the command line's model
	flags map[string]string // key → flag
	lists map[string]bool   // the keys of list settings
	used  map[string]bool   // flags Resolve supplied a value for
}

var _ kong.Resolver = (*debeziumFile)(nil)

// loadDebeziumFile reads and translates the connector configuration at path
// for the command line app. getenv resolves ${env:NAME}.
func loadDebeziumFile(app *kong.Application, path string, getenv func(string) (string, bool)) (*debeziumFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("debezium config %s cannot be read (check --%s / %s): %w", path, debeziumFlag, envName(debeziumFlag), err)
	}
	tr, err := debezium.Translate(path, data, getenv)
	if err != nil {
		return nil, err
	}
	byKey, byFlag := config.Keys(app)
	for _, s := range tr.Settings {
		if byKey[s.Key] == "" {
			return nil, fmt.Errorf("debezium config %s: %s translates to %s, which is not a setting of this command line", path, s.Property, s.Key)
		}
	}
	lists := map[string]bool{}
	_ = kong.Visit(app.Node, func(n kong.Visitable, next kong.Next) error {
		if f, ok := n.(*kong.Flag); ok && f.Tag.Get("key") != "" && f.Target.Kind() == reflect.Slice {
			lists[f.Tag.Get("key")] = true
		}
		return next(nil)
	})
	return &debeziumFile{path: path, tr: tr, keys: byFlag, flags: byKey, lists: lists, used: map[string]bool{}}, nil
}

// Validate is part of kong.Resolver; the file was checked when loaded.
func (d *debeziumFile) Validate(*kong.Application) error { return nil }

// Resolve returns the translated value for flag, or nil when there is none or
// the flag's environment variable is set (kong has applied it already).
func (d *debeziumFile) Resolve(_ *kong.Context, _ *kong.Path, flag *kong.Flag) (any, error) {
	key := d.keys[flag.Name]
	if key == "" || envSet(flag.Envs) || flag.Tag.Has("nofile") { // nofile: another command's flag of the same name
		return nil, nil
	}
	v, ok := d.tr.Value(key)
	if !ok {
		return nil, nil
	}
	d.used[flag.Name] = true
	return v, nil
}

// warn prints the translation's warnings to w, naming the file as given.
func (d *debeziumFile) warn(w io.Writer, given string) {
	for _, msg := range d.tr.Warnings {
		fmt.Fprintf(w, "cdc-relay: warning: debezium config %s: %s\n", given, msg)
	}
}

// loadDebezium is configLoader's step for --debezium-config: it loads the
// file the flag names, prints its warnings and adds its resolver (before the
// --config file's, which therefore wins).
func (l *configLoader) loadDebezium(ctx *kong.Context) error {
	var path string
	for _, f := range ctx.Model.Flags {
		if f.Name == debeziumFlag {
			path, _ = ctx.FlagValue(f).(string)
		}
	}
	if path == "" {
		return nil
	}
	d, err := loadDebeziumFile(ctx.Model, kong.ExpandPath(path), os.LookupEnv)
	if err != nil {
		return err
	}
	if l.stderr != nil {
		d.warn(l.stderr, path)
	}
	l.debezium = d
	ctx.AddResolver(d)
	return nil
}

// resolvedSource is config print's source of a flag a resolver set.
func (l *configLoader) resolvedSource(flag string) string {
	if l != nil && l.sets.Has(flag) {
		return sourceSet
	}
	if l == nil || l.file.Used(flag) || l.debezium == nil || !l.debezium.used[flag] {
		return sourceFile
	}
	return sourceDebezium
}

// ConfigFromDebeziumCmd is "cdc-relay config from-debezium FILE".
type ConfigFromDebeziumCmd struct {
	File string `arg:"" type:"path" help:"Kafka Connect connector configuration: the JSON POSTed to Connect ({\"name\": …, \"config\": {…}} or the config object) or a .properties file."`
}

// Run prints the native YAML equivalent of the file, loadable by --config.
// A connector configuration it cannot translate is a usage error (exit 2),
// printed one property per line.
func (c *ConfigFromDebeziumCmd) Run(kctx *kong.Context, env Env) error {
	getenv := os.LookupEnv
	if env.Getenv != nil {
		getenv = func(k string) (string, bool) { v := env.Getenv(k); return v, v != "" }
	}
	d, err := loadDebeziumFile(kctx.Model, c.File, getenv)
	var refused *debezium.Refusal
	if errors.As(err, &refused) {
		for _, p := range refused.Problems() {
			fmt.Fprintln(env.Stderr, "cdc-relay: "+p)
		}
		fmt.Fprintln(env.Stderr, "cdc-relay: remove or change these properties (docs/debezium.md says what each maps to)")
		return &reportedError{&usageError{err}}
	}
	if err != nil {
		return &usageError{err}
	}
	d.warn(env.Stderr, c.File)
	return writeDebeziumYAML(env.Stdout, d)
}

// writeDebeziumYAML writes d's settings as a --config file by keys, in
// sections in config print's order (source, tables, outbox, format, kafka,
// delivery, dead_letters, operations), by key within one; a key the
// connector's property set is commented with it, one it left to Debezium's
// default is not. A list setting is a YAML list.
func writeDebeziumYAML(w io.Writer, d *debeziumFile) error {
	settings := slices.SortedFunc(slices.Values(d.tr.Settings), func(a, b debezium.Setting) int {
		if ra, rb := sectionRank(a.Key), sectionRank(b.Key); ra != rb {
			return ra - rb
		}
		return strings.Compare(a.Key, b.Key)
	})
	entries := make([]config.Entry, len(settings))
	for i, s := range settings {
		entries[i] = config.Entry{Key: s.Key, Value: s.Value}
		if s.Given {
			entries[i].Comment = "from " + s.Property
		}
		if v, ok := s.Value.(string); ok && d.lists[s.Key] && v != "" {
			entries[i].Value = strings.Split(v, ",")
		}
	}
	return config.WriteDocument(w, "cdc-relay configuration translated from the Debezium connector config "+d.path+
		"\n(load it with cdc-relay run --config FILE; it holds the database password if the connector did)"+
		"\nA key without a comment is Debezium's default for a property the connector leaves out.", entries)
}
