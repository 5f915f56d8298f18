package cli

import (
	"fmt"
	"io"
	"os"
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
	Print        ConfigPrintCmd        `cmd:"" help:"Show the effective configuration of run: every run flag's value and where it came from (flag, env, file, debezium or default), with secrets redacted. Takes the same flags as run, and checks nothing but their syntax."`
	Check        ConfigCheckCmd        `cmd:"" help:"Check the configuration of run as run does before it connects (bounds, values, tables: entries, topic templates), without connecting: exit 0 when run would start with it, 2 naming the key to fix."`
	FromDebezium ConfigFromDebeziumCmd `cmd:"" name:"from-debezium" help:"Print the --config YAML equivalent to a Debezium connector configuration (see --debezium-config)."`
}

// runFlagSet is RunCmd's flags without RunCmd's methods, so config print
// takes every run flag but not run's checks: it shows a configuration that is
// incomplete too.
type runFlagSet RunCmd

// ConfigPrintCmd is "cdc-relay config print".
type ConfigPrintCmd struct {
	runFlagSet `embed:""` // run's flags, in run's help groups

	JSON bool `name:"json" group:"output" help:"Print JSON instead of a table."`

	file     string        `kong:"-"` // the --config file, "" for none
	settings []flagSetting `kong:"-"` // taken by BeforeApply
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
	p.settings = p.settings[:0]
	for _, f := range node.Flags {
		if f.Name == "help" || f.Name == "json" {
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
		p.settings = append(p.settings, s)
	}
	return nil
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
			ConfigFile string        `json:"config_file"`
			Settings   []flagSetting `json:"settings"`
		}{p.file, p.settings})
	}
	return printSettings(env.Stdout, p.file, p.settings)
}

// printSettings prints settings as an aligned table.
func printSettings(w io.Writer, file string, settings []flagSetting) error {
	if file == "" {
		file = "(none)"
	}
	if _, err := fmt.Fprintf(w, "config file: %s\n", file); err != nil {
		return fmt.Errorf("write configuration: %w", err)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tFLAG\tVALUE\tSOURCE")
	for _, s := range settings {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Key, s.Flag, s.text, s.Source)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write configuration: %w", err)
	}
	return nil
}
