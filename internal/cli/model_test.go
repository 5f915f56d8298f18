package cli

import (
	"reflect"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/config"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
)

// TestSettingsDeclaredOnce: every key is declared by one field, which
// every command that takes the setting embeds; a flag name means one key
// wherever it appears; and every flag of run is a setting with a key.
func TestSettingsDeclaredOnce(t *testing.T) {
	owners := map[string]map[string]bool{} // key → declaring fields
	var commands func(t reflect.Type)
	commands = func(ct reflect.Type) {
		for _, d := range config.Declarations(ct) {
			if owners[d.Key] == nil {
				owners[d.Key] = map[string]bool{}
			}
			// config print's runFlagSet is RunCmd converted: its declarations.
			owners[d.Key][strings.Replace(d.Owner, "cli.runFlagSet.", "cli.RunCmd.", 1)] = true
		}
		for i := range ct.NumField() {
			if f := ct.Field(i); f.Tag.Get("cmd") != "" || strings.Contains(string(f.Tag), `cmd:""`) {
				commands(f.Type)
			}
		}
	}
	commands(reflect.TypeOf(CLI{}))
	if len(owners) < 80 {
		t.Fatalf("found %d keys; the model has about 90", len(owners))
	}
	for key, o := range owners {
		if len(o) != 1 {
			t.Errorf("key %s is declared by %d fields: %v; declare it once and embed the declaring struct", key, len(o), o)
		}
	}

	var c CLI
	k, err := kong.New(&c, kong.Exit(func(int) {}), kong.PostBuild(expandDefaults))
	if err != nil {
		t.Fatal(err)
	}
	keyOf := map[string]string{}
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, f := range n.Flags {
			key := f.Tag.Get("key")
			if n.Name == "run" && key == "" && f.Name != "help" {
				t.Errorf("run's --%s has no key: every run flag is a setting", f.Name)
			}
			if key == "" {
				continue
			}
			if prev, ok := keyOf[f.Name]; ok && prev != key {
				t.Errorf("--%s has key %s in %s and %s elsewhere", f.Name, key, n.Name, prev)
			}
			keyOf[f.Name] = key
		}
		for _, ch := range n.Children {
			walk(ch)
		}
	}
	walk(k.Model.Node)
}

// TestSectionedFile: a file by keys configures run as the same file by
// flag names does, tables entries included; mixing both forms for one
// setting, or an unknown key, is an error naming the key and the line.
func TestSectionedFile(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	flat := writeFile(t, dir, "flat.yaml", `pg-url: postgres://db/app
kafka-brokers: [k1:9092, k2:9092]
slot: orders
topic: outbox.{schema}
on-error: halt
retry-base: 50ms
dlq-auto-retry-budget: 7
kafka-tls: true
kafka-tls-server-name: kafka.internal
table:
  - billing.outbox_events
  - name: shipping.parcels_outbox
    column-aggregate-id: parcel_id
    header-columns: [carrier=x-carrier]
    topic: parcels.{aggregate_type}
    on-error: dlq
`)
	sectioned := writeFile(t, dir, "sectioned.yaml", `source:
  pg_url: postgres://db/app
  slot: orders
kafka:
  brokers: [k1:9092, k2:9092]
  tls:
    enabled: true
    server_name: kafka.internal
outbox:
  topic: outbox.{schema}
  on_error: halt
delivery:
  retry:
    base: 50ms
dead_letters:
  auto_retry:
    budget: 7
tables:
  - billing.outbox_events
  - name: shipping.parcels_outbox
    columns:
      aggregate_id: parcel_id
    header_columns: [carrier=x-carrier]
    topic: parcels.{aggregate_type}
    on_error: dlq
`)
	configOf := func(path string) any {
		c, err := parseArgs(t, "--config", path, "run")
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		cfg, err := c.Run.config(zerolog.Nop(), metrics.Discard())
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		// What run makes of it, less what cannot be compared.
		return []any{c.Run.Slot, c.Run.KafkaBrokers, c.Run.Topic, c.Run.RetryBase, c.Run.DLQAutoRetryBudget,
			c.Run.KafkaTLSServerName, c.Run.KafkaTLS, cfg.Decoder.Also[0].Columns, cfg.Decoder.Also[0].HeaderColumns, cfg.TableRoutes, cfg.HaltTables}
	}
	if a, b := configOf(flat), configOf(sectioned); !reflect.DeepEqual(a, b) {
		t.Errorf("by flag names: %v\nby keys:       %v", a, b)
	}

	for _, tc := range []struct{ name, file, want string }{
		{"both forms", "slot: a\nsource:\n  slot: b\n", `line 3: key "source.slot" sets what "slot" (line 1) already sets`},
		{"unknown key", "source:\n  slott: b\n", `line 2: unknown key "source.slott" (did you mean "source.slot"?)`},
		{"unknown section", "sourcez:\n  slot: b\n", `line 1: unknown key "sourcez"`},
		{"entry key not per table", "tables:\n  - name: a.b\n    slot: x\n", "table a.b: slot: cannot be set per table; an entry of the tables list may set columns.aggregate_id"},
		{"entry both forms", "tables:\n  - name: a.b\n    topic_regex: x\n    topic-regex: y\n", `key "topic-regex" sets what "topic_regex" already sets`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, t.TempDir(), "bad.yaml", tc.file)
			_, err := parseArgs(t, "--config", p, "run", "--pg-url", "postgres://db/app", "--kafka-brokers", "k:9092")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parse = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestSetErrors: --set names an unknown key with the nearest one, and a
// bad value with its key.
func TestSetErrors(t *testing.T) {
	clearEnv(t)
	for _, tc := range []struct{ set, want string }{
		{"source.slott=x", `--set source.slott=x: unknown key "source.slott" (did you mean "source.slot"?)`},
		{"source.slot", "want KEY=VALUE"},
		{"source.status_interval=5", `--set source.status_interval=5: want a Go duration such as 250ms, 10s or 5m, got "5"`},
		{"source.create_slot=maybe", `--set source.create_slot=maybe: want true or false, got "maybe"`},
	} {
		t.Run(tc.set, func(t *testing.T) {
			_, err := parseArgs(t, "run", "--pg-url", "postgres://db/app", "--kafka-brokers", "k:9092", "--set", tc.set)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parse = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestOverlaysSkipOtherMeanings: --set and --debezium-config set a setting
// by key, never another command's flag of the same name: dlq's --topic
// (nofile) is not run's outbox.topic.
func TestOverlaysSkipOtherMeanings(t *testing.T) {
	clearEnv(t)
	dbz := writeFile(t, t.TempDir(), "connector.json", `{"name":"outbox","config":{
"connector.class":"io.debezium.connector.postgresql.PostgresConnector","database.hostname":"db","database.user":"relay","database.dbname":"app",
"snapshot.mode":"no_data","table.include.list":"public.outbox","transforms":"outbox","transforms.outbox.type":"io.debezium.transforms.outbox.EventRouter",
"transforms.outbox.route.topic.replacement":"events.${routedByValue}"}}`)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"set", []string{"--set", "outbox.topic=from.set"}},
		{"debezium", []string{"--debezium-config", dbz}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseArgs(t, append([]string{"dlq", "list", "--pg-url", "postgres://db/app"}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if c.DLQ.List.Topic != "" {
				t.Errorf("dlq list --topic = %q from %s; it takes its value from the command line only", c.DLQ.List.Topic, tc.name)
			}
			r, err := parseArgs(t, append([]string{"run", "--pg-url", "postgres://db/app", "--kafka-brokers", "k:9092"}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if r.Run.Topic == "outbox.events" {
				t.Errorf("run --topic kept its default: %s did not reach outbox.topic", tc.name)
			}
		})
	}
}
