package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/config"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/relay"
)

// printed is config print --json's output.
type printed struct {
	ConfigFile string `json:"config_file"`
	Settings   []struct {
		Flag   string `json:"flag"`
		Value  any    `json:"value"`
		Source string `json:"source"`
		Env    string `json:"env"`
	} `json:"settings"`
}

// configPrint runs config print --json with args and decodes its output.
func configPrint(t *testing.T, args ...string) printed {
	t.Helper()
	err, out, _ := run(t, canceled(), append([]string{"config", "print", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("config print %q: %v", args, err)
	}
	var p printed
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("config print --json: %v\n%s", err, out)
	}
	return p
}

// source returns the source config print shows for flag.
func (p printed) source(flag string) string {
	for _, s := range p.Settings {
		if s.Flag == flag {
			return s.Source
		}
	}
	return "(not printed)"
}

// TestConfigPrecedence checks flags > environment > file > defaults for a
// string, a list, a duration and a boolean, in what run parses and in what
// config print says the source is.
func TestConfigPrecedence(t *testing.T) {
	tests := []struct {
		name   string
		flag   string // the flag under test
		file   string // YAML beside the required settings
		env    string // the flag's environment variable, unset when ""
		args   []string
		get    func(*RunCmd) any
		want   any
		source string
	}{
		{"string default", "topic", "", "", nil, func(r *RunCmd) any { return r.Topic }, "outbox.events", sourceDefault},
		{"string file", "topic", "topic: from.file", "", nil, func(r *RunCmd) any { return r.Topic }, "from.file", sourceFile},
		{"string env over file", "topic", "topic: from.file", "from.env", nil, func(r *RunCmd) any { return r.Topic }, "from.env", sourceEnv},
		{"string flag over env and file", "topic", "topic: from.file", "from.env", []string{"--topic", "from.flag"}, func(r *RunCmd) any { return r.Topic }, "from.flag", sourceFlag},

		{"list default", "header-columns", "", "", nil, func(r *RunCmd) any { return r.HeaderColumns }, []string(nil), sourceDefault},
		{"list file sequence", "header-columns", "header-columns: [a, b=x-b]", "", nil, func(r *RunCmd) any { return r.HeaderColumns }, []string{"a", "b=x-b"}, sourceFile},
		{"list file block sequence", "header-columns", "header-columns:\n  - a\n  - b=x-b", "", nil, func(r *RunCmd) any { return r.HeaderColumns }, []string{"a", "b=x-b"}, sourceFile},
		{"list file comma string", "header-columns", "header-columns: a,b=x-b", "", nil, func(r *RunCmd) any { return r.HeaderColumns }, []string{"a", "b=x-b"}, sourceFile},
		{"list env over file", "header-columns", "header-columns: [a, b]", "c,d", nil, func(r *RunCmd) any { return r.HeaderColumns }, []string{"c", "d"}, sourceEnv},
		{"list flag over env and file", "header-columns", "header-columns: [a, b]", "c", []string{"--header-columns", "e"}, func(r *RunCmd) any { return r.HeaderColumns }, []string{"e"}, sourceFlag},

		{"duration default", "status-interval", "", "", nil, func(r *RunCmd) any { return r.StatusInterval }, relay.DefaultStatusInterval, sourceDefault},
		{"duration file", "status-interval", "status-interval: 250ms", "", nil, func(r *RunCmd) any { return r.StatusInterval }, 250 * time.Millisecond, sourceFile},
		{"duration file quoted", "status-interval", `status-interval: "1m30s"`, "", nil, func(r *RunCmd) any { return r.StatusInterval }, 90 * time.Second, sourceFile},
		{"duration env over file", "status-interval", "status-interval: 250ms", "2s", nil, func(r *RunCmd) any { return r.StatusInterval }, 2 * time.Second, sourceEnv},
		{"duration flag over env and file", "status-interval", "status-interval: 250ms", "2s", []string{"--status-interval", "3s"}, func(r *RunCmd) any { return r.StatusInterval }, 3 * time.Second, sourceFlag},

		{"bool default", "create-slot", "", "", nil, func(r *RunCmd) any { return r.CreateSlot }, true, sourceDefault},
		{"bool file", "create-slot", "create-slot: false", "", nil, func(r *RunCmd) any { return r.CreateSlot }, false, sourceFile},
		{"bool env over file", "create-slot", "create-slot: false", "true", nil, func(r *RunCmd) any { return r.CreateSlot }, true, sourceEnv},
		{"bool negated flag over env and file", "create-slot", "create-slot: true", "true", []string{"--no-create-slot"}, func(r *RunCmd) any { return r.CreateSlot }, false, sourceFlag},

		{"enum default", "cloudevents-mode", "format: cloudevents", "", nil, func(r *RunCmd) any { return r.CloudEventsMode }, "binary", sourceDefault},
		{"enum file", "cloudevents-mode", "format: cloudevents\ncloudevents-mode: structured", "", nil, func(r *RunCmd) any { return r.CloudEventsMode }, "structured", sourceFile},
		{"enum env over file", "cloudevents-mode", "format: cloudevents\ncloudevents-mode: binary", "structured", nil, func(r *RunCmd) any { return r.CloudEventsMode }, "structured", sourceEnv},
		{"enum flag over env", "cloudevents-mode", "format: cloudevents", "structured", []string{"--cloudevents-mode", "binary"}, func(r *RunCmd) any { return r.CloudEventsMode }, "binary", sourceFlag},

		{"int file", "batch-max-events", "batch-max-events: 500", "", nil, func(r *RunCmd) any { return r.BatchMaxEvents }, 500, sourceFile},
		{"brokers file sequence", "kafka-brokers", "kafka-brokers: [a:9092, b:9092]", "", nil, func(r *RunCmd) any { return r.KafkaBrokers }, []string{"a:9092", "b:9092"}, sourceFile},
		{"brokers file comma string", "kafka-brokers", "kafka-brokers: a:9092,b:9092", "", nil, func(r *RunCmd) any { return r.KafkaBrokers }, []string{"a:9092", "b:9092"}, sourceFile},
		{"null value is unset", "topic", "topic:", "", nil, func(r *RunCmd) any { return r.Topic }, "outbox.events", sourceDefault},

		// The sectioned form of the file, and --set key=value over the
		// environment and the files, under the flags.
		{"string by key", "topic", "outbox:\n  topic: from.file", "", nil, func(r *RunCmd) any { return r.Topic }, "from.file", sourceFile},
		{"string set over env and file", "topic", "topic: from.file", "from.env", []string{"--set", "outbox.topic=from.set"}, func(r *RunCmd) any { return r.Topic }, "from.set", sourceSet},
		{"string flag over set", "topic", "", "", []string{"--set", "outbox.topic=from.set", "--topic", "from.flag"}, func(r *RunCmd) any { return r.Topic }, "from.flag", sourceFlag},
		{"list by key", "header-columns", "outbox:\n  header_columns: [a, b=x-b]", "", nil, func(r *RunCmd) any { return r.HeaderColumns }, []string{"a", "b=x-b"}, sourceFile},
		{"list set", "header-columns", "", "c", []string{"--set", "outbox.header_columns=[a, b=x-b]"}, func(r *RunCmd) any { return r.HeaderColumns }, []string{"a", "b=x-b"}, sourceSet},
		{"list set comma string", "header-columns", "", "", []string{"--set", "outbox.header_columns=a,b=x-b"}, func(r *RunCmd) any { return r.HeaderColumns }, []string{"a", "b=x-b"}, sourceSet},
		{"duration set over env", "status-interval", "", "2s", []string{"--set", "source.status_interval=3s"}, func(r *RunCmd) any { return r.StatusInterval }, 3 * time.Second, sourceSet},
		{"duration nested section", "retry-base", "delivery:\n  retry:\n    base: 50ms", "", nil, func(r *RunCmd) any { return r.RetryBase }, 50 * time.Millisecond, sourceFile},
		{"bool by key", "create-slot", "source:\n  create_slot: false", "", nil, func(r *RunCmd) any { return r.CreateSlot }, false, sourceFile},
		{"bool set over env", "create-slot", "", "true", []string{"--set", "source.create_slot=false"}, func(r *RunCmd) any { return r.CreateSlot }, false, sourceSet},
		{"brokers by key", "kafka-brokers", "kafka:\n  brokers: [a:9092, b:9092]", "", nil, func(r *RunCmd) any { return r.KafkaBrokers }, []string{"a:9092", "b:9092"}, sourceFile},
		{"table list by key", "table", "tables: [a.one, b.two]", "", nil, func(r *RunCmd) any { return r.Table }, []string{"a.one", "b.two"}, sourceFile},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			file := "pg-url: postgres://relay@db:5432/app\n" + tt.file + "\n"
			if tt.flag != "kafka-brokers" {
				file += "kafka-brokers: k:9092\n"
			}
			path := writeFile(t, t.TempDir(), "relay.yaml", file)
			if tt.env != "" {
				t.Setenv(envName(tt.flag), tt.env)
			}
			args := append([]string{"--config", path}, tt.args...)
			c, err := parseArgs(t, append([]string{"run"}, args...)...)
			if err != nil {
				t.Fatalf("run %q with file\n%s: %v", args, file, err)
			}
			if got := tt.get(&c.Run); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("--%s = %#v, want %#v", tt.flag, got, tt.want)
			}
			p := configPrint(t, args...)
			if got := p.source(tt.flag); got != tt.source {
				t.Errorf("config print: source of --%s = %q, want %q", tt.flag, got, tt.source)
			}
			if p.ConfigFile != path {
				t.Errorf("config print: config_file = %q, want %q", p.ConfigFile, path)
			}
		})
	}
}

// TestConfigEnvNamesFile reads the file CDC_RELAY_CONFIG names, and --config
// wins over it.
func TestConfigEnvNamesFile(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	envFile := writeFile(t, dir, "env.yaml", "pg-url: postgres://db/app\nkafka-brokers: [k:9092]\ntopic: from.env.file\n")
	flagFile := writeFile(t, dir, "flag.yaml", "pg-url: postgres://db/app\nkafka-brokers: [k:9092]\ntopic: from.flag.file\n")
	t.Setenv("CDC_RELAY_CONFIG", envFile)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"run"}, "from.env.file"},
		{[]string{"run", "--config", flagFile}, "from.flag.file"},
		{[]string{"--config", flagFile, "run"}, "from.flag.file"},
	} {
		c, err := parseArgs(t, tt.args...)
		if err != nil {
			t.Fatalf("%q: %v", tt.args, err)
		}
		if c.Run.Topic != tt.want {
			t.Errorf("%q: topic %q, want %q", tt.args, c.Run.Topic, tt.want)
		}
	}
}

// TestConfigOtherCommands checks that one file serves every command: a key
// of another command's flag is no error, and each command takes its own.
func TestConfigOtherCommands(t *testing.T) {
	clearEnv(t)
	path := writeFile(t, t.TempDir(), "relay.yaml", `
pg-url: postgres://relay@db:5432/app
kafka-brokers: [k1:9092, k2:9092]
topic: orders
slot: orders_slot
dlq-table: app.dead
rate: 5          # replay and dlq replay only
dry-run: true    # replay and dlq replay only
older-than: 7d   # prune only
status-interval: 250ms  # run only
`)
	tests := []struct {
		args  []string
		check func(*CLI) string // "" when right
	}{
		{[]string{"run"}, func(c *CLI) string {
			if c.Run.Slot != "orders_slot" || c.Run.Topic != "orders" || c.Run.StatusInterval != 250*time.Millisecond {
				return "run did not take slot, topic, status-interval"
			}
			return ""
		}},
		{[]string{"status"}, func(c *CLI) string {
			if c.Status.Slot != "orders_slot" || c.Status.PGURL != "postgres://relay@db:5432/app" {
				return "status did not take slot, pg-url"
			}
			return ""
		}},
		{[]string{"replay", "--since", "1h"}, func(c *CLI) string {
			if c.Replay.Rate != 5 || !c.Replay.DryRun || c.Replay.Topic != "orders" {
				return "replay did not take rate, dry-run, topic"
			}
			return ""
		}},
		{[]string{"dlq", "list"}, func(c *CLI) string {
			if c.DLQ.List.DLQTable != "app.dead" {
				return "dlq list did not take dlq-table"
			}
			if c.DLQ.List.Topic != "" {
				return "dlq list took run's topic as its --topic filter"
			}
			return ""
		}},
		{[]string{"dlq", "replay"}, func(c *CLI) string {
			if c.DLQ.Replay.Topic != "" || c.DLQ.Replay.Rate != 5 {
				return fmt.Sprintf("dlq replay: topic override %q (want none: run's topic is a template), rate %g", c.DLQ.Replay.Topic, c.DLQ.Replay.Rate)
			}
			return ""
		}},
		{[]string{"prune"}, func(c *CLI) string {
			if fmt.Sprint(c.Prune.Table) != "[public.outbox_events]" {
				return "prune changed table"
			}
			return ""
		}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			c, err := parseArgs(t, append(tt.args, "--config", path)...)
			if err != nil {
				t.Fatalf("%q: %v", tt.args, err)
			}
			if msg := tt.check(c); msg != "" {
				t.Error(msg)
			}
		})
	}
}

// TestConfigErrors checks that each mistake in a file is reported with the
// file, the line where there is one, and what to write instead.
func TestConfigErrors(t *testing.T) {
	const base = "pg-url: postgres://relay@db:5432/app\nkafka-brokers: [k:9092]\n"
	tests := []struct {
		name string
		file string // "" with missing
		args []string
		want []string
	}{
		{"unknown key with suggestion", base + "pg-ulr: x\n", nil,
			[]string{"relay.yaml, line 3", `unknown key "pg-ulr"`, `did you mean "pg-url"?`}},
		{"unknown key, suffix of a flag", base + "brokers: a:9092\n", nil,
			[]string{"line 3", `unknown key "brokers"`, `did you mean "kafka.brokers"?`}},
		{"unknown key, underscores", "pg_url: x\n", nil,
			[]string{"line 1", `unknown key "pg_url"`, `did you mean "source.pg_url"?`}},
		{"unknown key, nothing near", base + "colour: blue\n", nil,
			[]string{"line 3", `unknown key "colour"`, "flag names"}},
		{"unknown key is an error for every command", base + "topci: x\n", []string{"status"},
			[]string{"line 3", `unknown key "topci"`, `did you mean "outbox.topic"?`}},
		{"key with dashes", "--topic: x\n", nil,
			[]string{"line 1", "without the dashes", `"topic"`}},
		{"config key", base + "config: other.yaml\n", nil,
			[]string{"line 3", `"config" cannot be set in a config file`}},
		{"duplicate key", base + "topic: a\ntopic: b\n", nil,
			[]string{"line 4", `"topic" is set twice (first on line 3)`}},
		{"bad YAML", base + "topic: a: b\n", nil,
			[]string{"relay.yaml", "not valid YAML", "line 3"}},
		{"bad YAML, two values on one line", base + "slot: s\ntopic: a b: c\n", nil,
			[]string{"not valid YAML", "line 4"}},
		{"not a mapping", "- pg-url\n", nil,
			[]string{"line 1", "want a mapping of"}},
		{"missing file", "", nil,
			[]string{"missing.yaml", "cannot be read", "--config / CDC_RELAY_CONFIG", "no such file"}},
		{"duration without unit", base + "status-interval: 5\n", nil,
			[]string{"line 3", "status-interval", "want a Go duration such as 250ms", `"5"`}},
		{"bool as string", base + "create-slot: \"no\"\n", nil,
			[]string{"line 3", "create-slot", "want true or false"}},
		{"bool yes", base + "create-slot: yes\n", nil,
			[]string{"line 3", "create-slot", "want true or false"}},
		{"int not a number", base + "batch-max-events: many\n", nil,
			[]string{"line 3", "batch-max-events", "whole number"}},
		{"mapping for a value", base + "topic:\n  name: x\n", nil,
			[]string{"line 4", "topic", "want a single value, not a mapping"}},
		{"list of mappings", "pg-url: x\nkafka-brokers:\n  - host: a\n", nil,
			[]string{"kafka-brokers", "want a list of values"}},
		{"enum from the file", base + "delivery: sometimes\n", nil,
			[]string{"--delivery must be one of", "set by key delivery in config file", "line 3", "--delivery or CDC_RELAY_DELIVERY override it"}},
		{"validation of a value from the file", "pg-url: postgres://db/app\nkafka-brokers: kafka-1\n", nil,
			[]string{`"kafka-1" without a port`, "set by key kafka-brokers in config file", "line 2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			dir := t.TempDir()
			path := dir + "/missing.yaml"
			if tt.file != "" {
				path = writeFile(t, dir, "relay.yaml", tt.file)
			}
			cmd := tt.args
			if cmd == nil {
				cmd = []string{"run"}
			}
			_, err := parseArgs(t, append(cmd, "--config", path)...)
			if err == nil {
				t.Fatalf("no error for file\n%s", tt.file)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
		})
	}
}

// TestConfigEmptyFile: an empty file, or one of comments, sets nothing.
func TestConfigEmptyFile(t *testing.T) {
	for _, content := range []string{"", "# nothing yet\n", "---\n"} {
		clearEnv(t)
		path := writeFile(t, t.TempDir(), "relay.yaml", content)
		c, err := parseArgs(t, "run", "--config", path, "--pg-url", "postgres://db/app", "--kafka-brokers", "k:9092")
		if err != nil {
			t.Fatalf("file %q: %v", content, err)
		}
		if c.Run.Topic != "outbox.events" {
			t.Errorf("file %q: topic %q", content, c.Run.Topic)
		}
	}
}

// TestConfigPrint checks config print's table and JSON: every run flag,
// aligned, and no secret, whichever source it came from.
func TestConfigPrint(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	tokenFile := writeFile(t, dir, "token", "tok-from-file-93ab\n")
	path := writeFile(t, dir, "relay.yaml", `
pg-url: postgres://relay:pg-pass-4471@db:5432/app?sslmode=disable
kafka-brokers: [k1:9092, k2:9092]
kafka-sasl-mechanism: scram-sha-256
kafka-sasl-username: relay
metrics-token-file: `+tokenFile+`
`)
	t.Setenv("CDC_RELAY_KAFKA_SASL_PASSWORD", "sasl-pass-8812")
	args := []string{"--config", path, "--metrics-token", "tok-flag-5521", "--slot", "s1"}
	secrets := []string{"pg-pass-4471", "sasl-pass-8812", "tok-flag-5521", "tok-from-file-93ab"}

	err, text, _ := run(t, canceled(), append([]string{"config", "print"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	err, js, _ := run(t, canceled(), append([]string{"config", "print", "--json"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets {
		if strings.Contains(text, s) || strings.Contains(js, s) {
			t.Errorf("config print shows secret %q:\n%s\n%s", s, text, js)
		}
	}
	wantLines(t, text,
		`^config file: `+regexp.QuoteMeta(path)+`$`,
		`^KEY +FLAG +VALUE +SOURCE$`,
		`^source\.pg_url +pg-url +postgres://relay:REDACTED@db:5432/app\?sslmode=disable +file$`,
		`^kafka\.brokers +kafka-brokers +k1:9092,k2:9092 +file$`,
		`^kafka\.sasl\.password +kafka-sasl-password +REDACTED +env$`,
		`^operations\.metrics_token +metrics-token +REDACTED +flag$`,
		`^operations\.metrics_token_file +metrics-token-file +`+regexp.QuoteMeta(tokenFile)+` +file$`,
		`^source\.slot +slot +s1 +flag$`,
		`^outbox\.topic +topic +outbox\.events +default$`,
		`^source\.status_interval +status-interval +1s +default$`,
	)
	// Aligned: the SOURCE column starts at the same place on every line.
	lines := strings.Split(strings.TrimSpace(text), "\n")[1:]
	col := strings.Index(lines[0], "SOURCE")
	for _, l := range lines[1:] {
		if strings.LastIndex(l, " ")+1 != col {
			t.Errorf("line %q: source not in column %d", l, col)
		}
	}

	// JSON: every run flag, by section (sectionOrder), each with its variable.
	var p printed
	if err := json.Unmarshal([]byte(js), &p); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range p.Settings {
		got = append(got, s.Flag)
		if s.Env != envName(s.Flag) {
			t.Errorf("%s: env %q", s.Flag, s.Env)
		}
	}
	if want := runFlagNames(t); !slices.Equal(got, want) {
		t.Errorf("config print flags\n%q\nwant run's\n%q", got, want)
	}
	for _, s := range p.Settings {
		switch s.Flag {
		case "kafka-brokers":
			if !reflect.DeepEqual(s.Value, []any{"k1:9092", "k2:9092"}) {
				t.Errorf("kafka-brokers value %#v", s.Value)
			}
		case "create-slot":
			if s.Value != true {
				t.Errorf("create-slot value %#v", s.Value)
			}
		case "batch-max-events":
			if _, ok := s.Value.(float64); !ok {
				t.Errorf("batch-max-events value %#v, want a number", s.Value)
			}
		}
	}
}

// runFlagNames are the run command's flags, in config print's order: by
// section, in --help order within one.
func runFlagNames(t *testing.T) []string {
	t.Helper()
	var c CLI
	p, err := kong.New(&c, kong.Name("cdc-relay"), kong.DefaultEnvars(EnvPrefix), kong.PostBuild(expandDefaults))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range p.Model.Children {
		if n.Name != "run" {
			continue
		}
		flags := slices.Clone(n.Flags)
		slices.SortStableFunc(flags, func(a, b *kong.Flag) int { return sectionRank(a.Tag.Get("key")) - sectionRank(b.Tag.Get("key")) })
		for _, f := range flags {
			if f.Name != "help" {
				names = append(names, f.Name)
			}
		}
	}
	return names
}

// TestConfigSyntaxErrorLine checks that a YAML syntax error names the faulty
// line itself: yaml.v3 alone names the line before it for most of these.
func TestConfigSyntaxErrorLine(t *testing.T) {
	const base = "# relay\npg-url: postgres://relay@db:5432/app\nkafka-brokers: [k:9092]\n" // lines 1-3
	tests := []struct {
		name string
		file string
		line int
	}{
		{"unclosed flow sequence", base + "slot: s\ntopic: [a, b\nrelay-name: r\n", 5},
		{"unclosed flow mapping at the end", base + "slot: s\ntopic: {a: b\n", 5},
		{"extra closing bracket", base + "slot: s\ntopic: [a, b]]\n", 5},
		{"list item in a mapping", base + "slot: s\n- topic\n", 5},
		{"tab indentation", base + "slot: s\n\ttopic: t\n", 5},
		{"two values on one line", base + "slot: s\ntopic: a b: c\n", 5},
		{"indented key", base + "slot: s\n  topic: t\n", 5},
		{"character that cannot start a token", base + "slot: @s\n", 4},
		{"unterminated quote", base + "slot: \"s\ntopic: t\n", 4},
		{"on the first line", "pg-url: [x\n", 1},
		{"unknown anchor", base + "slot: *s\n", 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			path := writeFile(t, t.TempDir(), "relay.yaml", tt.file)
			_, err := parseArgs(t, "run", "--config", path)
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("want a config file error, got %v", err)
			}
			if ce.Line != tt.line || !strings.Contains(err.Error(), fmt.Sprintf("relay.yaml, line %d: not valid YAML: ", tt.line)) {
				t.Errorf("want line %d, got %d: %v\nfile:\n%s", tt.line, ce.Line, err, tt.file)
			}
			if strings.Count(err.Error(), "line ") != 1 {
				t.Errorf("the line is named more than once: %v", err)
			}
		})
	}
}

// TestTableEntries: the config file's table list may name tables and, as a
// mapping, what one table overrides: its columns, headers, topic and
// failure policy become that table's decoder config, route and policy;
// a key that cannot be set per table, or a bad value, names the file's line.
func TestTableEntries(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", `pg-url: postgres://db/app
kafka-brokers: k:9092
topic: outbox.{schema}
on-error: halt
table:
  - billing.outbox_events
  - name: shipping.parcels_outbox
    column-aggregate-id: parcel_id
    header-columns: [carrier=x-carrier]
    topic: parcels.{aggregate_type}
    on-error: dlq
`)
	c, err := parseArgs(t, "--config", good, "run")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := c.Run.config(zerolog.Nop(), metrics.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Decoder.Table != "outbox_events" || cfg.Decoder.Columns.AggregateID != "aggregate_id" || len(cfg.Decoder.Also) != 1 {
		t.Fatalf("decoder: first table %s.%s keyed by %s, %d more; want billing.outbox_events by aggregate_id and one more",
			cfg.Decoder.Schema, cfg.Decoder.Table, cfg.Decoder.Columns.AggregateID, len(cfg.Decoder.Also))
	}
	parcels := cfg.Decoder.Also[0]
	if parcels.Schema != "shipping" || parcels.Table != "parcels_outbox" || parcels.Columns.AggregateID != "parcel_id" ||
		parcels.HeaderColumns["carrier"] != "x-carrier" || parcels.Columns.ID != "id" {
		t.Errorf("second table's decoder config %+v; want shipping.parcels_outbox keyed by parcel_id, header x-carrier, the other columns as the run's", parcels)
	}
	pt := decoder.TableName{Schema: "shipping", Table: "parcels_outbox"}
	if len(cfg.TableRoutes) != 1 || cfg.TableRoutes[pt].Topic != "parcels.{aggregate_type}" {
		t.Errorf("table routes %v, want parcels.{aggregate_type} for %s only", cfg.TableRoutes, pt)
	}
	if !cfg.HaltTables[decoder.TableName{Schema: "billing", Table: "outbox_events"}] || cfg.HaltTables[pt] || !cfg.HaltTables[decoder.TableName{}] {
		t.Errorf("halt tables %v; want billing and message-outbox events (the run's halt), not %s (its dlq)", cfg.HaltTables, pt)
	}

	for _, tc := range []struct{ name, entry, want string }{
		{"not per table", "    kafka-brokers: other:9092\n", "line 6: table shipping.parcels_outbox: kafka-brokers: cannot be set per table"},
		{"bad policy", "    on-error: retry\n", `line 6: table shipping.parcels_outbox: on-error: "retry": want one of dlq, halt`},
		{"bad topic", "    topic: \"bad topic\"\n", `line 6: table shipping.parcels_outbox: topic: topic template "bad topic": topic name "bad topic" has the character ' '`},
		{"no name", "", "needs name: schema.table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			entry := "  - name: shipping.parcels_outbox\n" + tc.entry
			if tc.name == "no name" {
				entry = "  - topic: x\n"
			}
			p := write("bad.yaml", "pg-url: postgres://db/app\nkafka-brokers: k:9092\ntable:\n  - billing.outbox_events\n"+entry)
			_, err := parseArgs(t, "--config", p, "run")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parse = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestTableList: --table repeated, comma-separated, or from
// CDC_RELAY_TABLE, names several outbox tables; one named twice is refused.
func TestTableList(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  string
		args []string
		want string // the tables, or the error
	}{
		{"repeated", "", []string{"--table", "a.x", "--table", "b.y"}, "[a.x b.y]"},
		{"commas", "", []string{"--table", "a.x,b.y"}, "[a.x b.y]"},
		{"environment", "a.x,b.y,c.z", nil, "[a.x b.y c.z]"},
		{"twice", "", []string{"--table", "a.x", "--table", "a.x"}, "names a.x twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			if tc.env != "" {
				t.Setenv("CDC_RELAY_TABLE", tc.env)
			}
			args := append([]string{"run", "--pg-url", "postgres://db/app", "--kafka-brokers", "k:9092"}, tc.args...)
			c, err := parseArgs(t, args...)
			switch {
			case err != nil:
				if !strings.Contains(err.Error(), tc.want) {
					t.Errorf("parse: %v, want %s", err, tc.want)
				}
			case fmt.Sprint(c.Run.Table) != tc.want:
				t.Errorf("tables %v, want %s", c.Run.Table, tc.want)
			}
		})
	}
}
