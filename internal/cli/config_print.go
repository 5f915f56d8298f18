package cli

import (
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/alecthomas/kong"

	"github.com/cdc-relay/cdc-relay/internal/config"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// ConfigCmd is "cdc-relay config".
type ConfigCmd struct {
	Print        ConfigPrintCmd        `cmd:"" help:"Show the configuration run would use: each setting's value and where it came from, secrets redacted (checks only the syntax)."`
	Check        ConfigCheckCmd        `cmd:"" help:"Check run's configuration without connecting: exit 0 if run would start."`
	FromDebezium ConfigFromDebeziumCmd `cmd:"" name:"from-debezium" help:"Print the --config YAML of a Debezium connector configuration."`
}

// runFlagSet is RunCmd's flags without RunCmd's methods, so config print
// takes every run flag but not run's checks: it shows a configuration that is
// incomplete too.
type runFlagSet RunCmd

// ConfigPrintCmd is "cdc-relay config print".
type ConfigPrintCmd struct {
	runFlagSet `embed:""` // run's flags, in run's help groups

	JSON    bool `name:"json" group:"output" help:"Print JSON instead of a table."`
	Changed bool `name:"changed" group:"output" help:"Show only the settings whose value differs from the default (and every table entry's overrides)."`

	file     string         `kong:"-"` // the --config file, "" for none
	settings []flagSetting  `kong:"-"` // taken by BeforeApply, in section order
	tables   []tableSetting `kong:"-"` // the file's table entries that override settings
}

// tableSetting is one entry of the file's tables list that overrides
// settings for its table, as config print shows it.
type tableSetting struct {
	Name     string        `json:"name"`
	Line     int           `json:"line"`
	Settings []flagSetting `json:"settings"` // Key without "outbox.", as an entry writes it
}

// sectionOrder is the order of the document's sections in config print:
// where events come from, what they are, where they go, how, and the
// process. A key of no section listed here comes after them.
var sectionOrder = []string{"source", "tables", "messages", "outbox", "format", "kafka", "delivery", "dead_letters", "operations"}

// sectionRank is key's place in sectionOrder.
func sectionRank(key string) int {
	sec, _, _ := strings.Cut(key, ".")
	if i := slices.Index(sectionOrder, sec); i >= 0 {
		return i
	}
	return len(sectionOrder)
}

// Sources of a setting, in the order of precedence.
const (
	sourceFlag    = "flag"
	sourceEnv     = "env"
	sourceFile    = "file"
	sourceSet     = "set"
	sourceDefault = "default"
)

// flagSetting is one run flag's effective value, as config print shows it.
type flagSetting struct {
	Key    string `json:"key"`
	Flag   string `json:"flag"`
	Value  any    `json:"value"` // string, bool, number or list of strings; secrets redacted
	Source string `json:"source"`
	Env    string `json:"env"`

	text string // Value in the table
}

// BeforeApply records each run flag's value and source before kong applies
// and checks them (the checks read the *-file flags, whose content is
// secret). Kong calls it as the parse's hook.
func (p *ConfigPrintCmd) BeforeApply(ctx *kong.Context, loader *configLoader) error {
	node := ctx.Selected()
	if node == nil {
		return fmt.Errorf("config print: no command selected")
	}
	from := map[*kong.Flag]string{}
	for _, tr := range ctx.Path {
		if tr.Flag == nil {
			continue
		}
		if tr.Resolved {
			from[tr.Flag] = loader.resolvedSource(tr.Flag.Name) // --config or --debezium-config
		} else {
			from[tr.Flag] = sourceFlag
		}
	}
	for _, f := range ctx.Model.Flags {
		if f.Name == configFlag {
			p.file, _ = ctx.FlagValue(f).(string)
		}
	}
	changed := false
	for _, f := range node.Flags {
		if f.Name == "changed" {
			changed, _ = ctx.FlagValue(f).(bool) // applied after this hook
		}
	}
	p.settings = p.settings[:0]
	for _, f := range node.Flags {
		if f.Name == "help" || f.Tag.Get("key") == "" { // print's own flags
			continue
		}
		src, ok := from[f]
		if !ok {
			src = sourceDefault
			if envSet(f.Envs) {
				src = sourceEnv
			}
		}
		s := flagSetting{Key: f.Tag.Get("key"), Flag: f.Name, Source: src, Env: envName(f.Name)}
		s.Value, s.text = shownValue(f.Name, ctx.FlagValue(f))
		if changed && s.text == defaultText(f) {
			continue
		}
		p.settings = append(p.settings, s)
	}
	slices.SortStableFunc(p.settings, func(a, b flagSetting) int { return sectionRank(a.Key) - sectionRank(b.Key) })
	return p.tableSettings(node, loader)
}

// tableSettings records the overrides of the file's table entries, each
// as the setting of the outbox section it overrides.
func (p *ConfigPrintCmd) tableSettings(node *kong.Node, loader *configLoader) error {
	entries, err := loader.tables()
	if err != nil {
		return err
	}
	byName := map[string]*kong.Flag{}
	for _, f := range node.Flags {
		byName[f.Name] = f
	}
	p.tables = p.tables[:0]
	for _, e := range entries {
		if len(e.Overrides) == 0 {
			continue
		}
		ts := tableSetting{Name: e.Name, Line: e.Line}
		for _, flag := range slices.Sorted(maps.Keys(e.Overrides)) {
			f, v := byName[flag], e.Overrides[flag]
			s := flagSetting{Key: e.Written[flag], Flag: flag, Source: sourceFile, Env: "—"}
			if f != nil {
				s.Key, s.Env = strings.TrimPrefix(f.Tag.Get("key"), config.TableSection), envName(flag)
				if x, err := config.Convert(v, f.Target.Type(), nil); err == nil {
					s.Value, s.text = shownValue(flag, x)
				}
			}
			if s.text == "" { // a value run refuses (config check says why): as written
				s.Value, s.text = v.Value, v.Value
			}
			ts.Settings = append(ts.Settings, s)
		}
		slices.SortStableFunc(ts.Settings, func(a, b flagSetting) int { return strings.Compare(a.Key, b.Key) })
		p.tables = append(p.tables, ts)
	}
	return nil
}

// defaultText is flag f's default as config print shows a value.
func defaultText(f *kong.Flag) string {
	def := f.Default
	switch t := f.Target.Type(); {
	case t.Kind() == reflect.Slice:
		if def == "" {
			return "[]"
		}
		return def
	case t == reflect.TypeOf(time.Duration(0)):
		d, _ := time.ParseDuration(def)
		return config.ShortDuration(d)
	case t.Kind() == reflect.Bool:
		return strconv.FormatBool(def == "true")
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Float64:
		if def == "" {
			return "0"
		}
	case def == "":
		return `""`
	}
	return def
}

// envSet reports whether one of envs is set (kong's test: set, even empty).
func envSet(envs []string) bool {
	for _, e := range envs {
		if _, ok := os.LookupEnv(e); ok {
			return true
		}
	}
	return false
}

// shownValue is v for JSON and as table text, with secrets redacted.
func shownValue(flag string, v any) (any, string) {
	switch x := v.(type) {
	case string:
		x = redactSetting(flag, x)
		if x == "" {
			return x, `""`
		}
		return x, x
	case []int64:
		return x, strings.Trim(strings.Join(strings.Fields(fmt.Sprint(x)), ","), "[]")
	case []string:
		out := make([]string, len(x))
		for i, s := range x {
			out[i] = redactSetting(flag, s)
		}
		if len(out) == 0 {
			return out, "[]"
		}
		return out, strings.Join(out, ",")
	case time.Duration:
		s := config.ShortDuration(x)
		return s, s
	case bool:
		return x, strconv.FormatBool(x)
	}
	return v, fmt.Sprint(v)
}

// redacted replaces a secret in config print.
const redacted = "REDACTED"

// redactSetting hides secrets: passwords and tokens whole, the password in a
// URL. The *-file flags name files, which config print does not read.
func redactSetting(flag, v string) string {
	if v == "" || strings.HasSuffix(flag, "-file") {
		return v
	}
	if strings.Contains(flag, "password") || strings.Contains(flag, "token") || strings.Contains(flag, "secret") {
		return redacted
	}
	return replication.Redact(v)
}

// Run prints the settings recorded by BeforeApply.
func (p *ConfigPrintCmd) Run(env Env) error {
	if p.JSON {
		return writeJSON(env.Stdout, "configuration", struct {
			ConfigFile string         `json:"config_file"`
			Settings   []flagSetting  `json:"settings"`
			Tables     []tableSetting `json:"tables,omitempty"`
		}{p.file, p.settings, p.tables})
	}
	return printSettings(env.Stdout, p.file, p.settings, p.tables)
}

// printSettings prints settings as an aligned table, each table entry's
// overrides after the tables row (tables[1].topic: the second entry's).
func printSettings(w io.Writer, file string, settings []flagSetting, tables []tableSetting) error {
	if file == "" {
		file = "(none)"
	}
	if _, err := fmt.Fprintf(w, "config file: %s\n", file); err != nil {
		return fmt.Errorf("write configuration: %w", err)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tFLAG\tVALUE\tSOURCE")
	printed := false
	printTables := func() {
		for _, t := range tables {
			for _, s := range t.Settings {
				fmt.Fprintf(tw, "tables[%s].%s\t%s\t%s\t%s\n", t.Name, s.Key, s.Flag, s.text, s.Source)
			}
		}
		printed = true
	}
	for _, s := range settings {
		if !printed && sectionRank(s.Key) > sectionRank("tables") {
			printTables()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Key, s.Flag, s.text, s.Source)
	}
	if !printed {
		printTables()
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write configuration: %w", err)
	}
	return nil
}
