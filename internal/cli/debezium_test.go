package cli

import (
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/debezium"
)

// minimalDbz is the least a connector config needs for cdc-relay.
const minimalDbz = `connector.class=io.debezium.connector.postgresql.PostgresConnector
database.hostname=db
database.user=relay
database.dbname=app
plugin.name=pgoutput
table.include.list=public.outbox
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
`

// TestDebeziumPrecedence: flags > env > --config file > --debezium-config >
// defaults, and config print names the debezium source.
func TestDebeziumPrecedence(t *testing.T) {
	tests := []struct {
		name   string
		file   string // --config YAML, "" for none
		env    string
		args   []string
		want   string
		source string
	}{
		{"debezium over default", "", "", nil, "orders", sourceDebezium},
		{"file over debezium", "slot: from_file\n", "", nil, "from_file", sourceFile},
		{"env over debezium", "", "from_env", nil, "from_env", sourceEnv},
		{"flag over all", "slot: from_file\n", "from_env", []string{"--slot", "from_flag"}, "from_flag", sourceFlag},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			dir := t.TempDir()
			dbz := writeFile(t, dir, "c.properties", minimalDbz+"slot.name=orders\n")
			args := []string{"--debezium-config", dbz, "--kafka-brokers", "k:9092"}
			if tt.file != "" {
				args = append(args, "--config", writeFile(t, dir, "relay.yaml", tt.file))
			}
			if tt.env != "" {
				t.Setenv(envName("slot"), tt.env)
			}
			args = append(args, tt.args...)
			c, err := parseArgs(t, append([]string{"run"}, args...)...)
			if err != nil {
				t.Fatalf("run %q: %v", args, err)
			}
			if c.Run.Slot != tt.want {
				t.Errorf("--slot = %q, want %q", c.Run.Slot, tt.want)
			}
			if c.Run.Topic != "outbox.event.{aggregate_type}" || c.Run.ColumnAggregateType != "aggregatetype" {
				t.Errorf("topic %q, aggregate type column %q: the debezium file was not applied", c.Run.Topic, c.Run.ColumnAggregateType)
			}
			p := configPrint(t, args...)
			if got := p.source("slot"); got != tt.source {
				t.Errorf("config print: source of --slot = %q, want %q", got, tt.source)
			}
		})
	}
}

// TestFromDebeziumRoundTrip: config from-debezium prints YAML that --config
// loads into the same run configuration as --debezium-config.
func TestFromDebeziumRoundTrip(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	dbz := writeFile(t, dir, "c.json", `{"name": "orders", "config": {
		"connector.class": "io.debezium.connector.postgresql.PostgresConnector",
		"database.hostname": "db", "database.port": "5433", "database.user": "relay",
		"database.password": "p@ss: \"x\"", "database.dbname": "app", "plugin.name": "pgoutput",
		"table.include.list": "public.outbox", "heartbeat.interval.ms": 30000,
		"publication.autocreate.mode": "disabled", "snapshot.mode": "never",
		"key.converter": "org.apache.kafka.connect.storage.StringConverter",
		"value.converter": "org.apache.kafka.connect.storage.StringConverter",
		"transforms": "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
		"transforms.outbox.table.fields.additional.placement": "type:header:eventType,aggregatetype:header:kind"}}`)
	err, out, _ := run(t, canceled(), "config", "from-debezium", dbz)
	if err != nil {
		t.Fatal(err)
	}
	yamlPath := writeFile(t, dir, "relay.yaml", out)
	fromYAML, err := parseArgs(t, "run", "--config", yamlPath, "--kafka-brokers", "k:9092")
	if err != nil {
		t.Fatalf("load printed YAML: %v\n%s", err, out)
	}
	fromDbz, err := parseArgs(t, "run", "--debezium-config", dbz, "--kafka-brokers", "k:9092")
	if err != nil {
		t.Fatal(err)
	}
	fromYAML.ConfigFile, fromDbz.DebeziumConfig = "", ""
	if !reflect.DeepEqual(fromYAML.Run, fromDbz.Run) {
		t.Errorf("run configurations differ:\nYAML     %+v\ndebezium %+v\nYAML file:\n%s", fromYAML.Run, fromDbz.Run, out)
	}
	if got := fromDbz.Run.HeaderColumns; !reflect.DeepEqual(got, []string{"type=eventType", "aggregatetype=kind"}) {
		t.Errorf("--header-columns = %q", got)
	}
	if fromDbz.Run.HeartbeatInterval.String() != "30s" || fromDbz.Run.CreatePublication || fromDbz.Run.RelayName != "orders" {
		t.Errorf("heartbeat %v, create-publication %v, relay-name %q", fromDbz.Run.HeartbeatInterval, fromDbz.Run.CreatePublication, fromDbz.Run.RelayName)
	}
}

// TestDebeziumEveryKeyResolves: every setting a connector config translates
// to reaches its flag, through the model's key → flag: config print shows
// source debezium for each.
func TestDebeziumEveryKeyResolves(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	const p = "transforms.outbox."
	props := minimalDbz + "name=orders\ndatabase.password=pw\nslot.name=s\npublication.name=pub\npublication.autocreate.mode=filtered\n" +
		"heartbeat.interval.ms=1500\ntopic.prefix=dbserver1\n" +
		"key.converter=org.apache.kafka.connect.json.JsonConverter\nkey.converter.schemas.enable=false\n" +
		"value.converter=org.apache.kafka.connect.json.JsonConverter\n" +
		p + "table.expand.json.payload=true\n" + p + "table.json.payload.null.behavior=optional_bytes\n" +
		p + "table.json.payload.empty.array.behavior=optional_string\n" + p + "table.field.event.schema.version=v\n" +
		p + "table.fields.additional.placement=type:envelope:eventType,aggregatetype:header:kind,part:partition\n" +
		p + "route.topic.regex=(.*)\n" + p + "route.topic.replacement=x.$1\n" + p + "table.field.event.timestamp=ts\n"
	path := writeFile(t, dir, "c.properties", props)
	tr, err := debezium.Translate(path, []byte(props), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Settings) != 30 { // every key the translator writes
		t.Errorf("%d settings, want the config to exercise all 30", len(tr.Settings))
	}
	pr := configPrint(t, "--debezium-config", path)
	for _, s := range tr.Settings {
		source := "(no flag)"
		for _, ps := range pr.Settings {
			if keyOfFlag(ps.Flag) == s.Key {
				source = ps.Source
			}
		}
		if source != sourceDebezium {
			t.Errorf("%s (from %s): source %s, want %s", s.Key, s.Property, source, sourceDebezium)
		}
	}
}

// TestFromDebeziumDocument: config from-debezium prints the settings by key,
// in sections in config print's order, a key commented with its property
// only when the connector has that property, several tables as a tables
// list; warnings go to stderr; a connector it cannot translate is refused
// one property per line, with exit 2, every property checked even after
// an indirection it cannot resolve (testdata/from-debezium.golden).
func TestFromDebeziumDocument(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	path := writeFile(t, dir, "c.properties", minimalDbz+"name=orders\nheartbeat.interval.ms=1000\n"+
		"value.converter=org.apache.kafka.connect.json.JsonConverter\n"+
		"transforms.outbox.table.fields.additional.placement=type:header:eventType,aggregatetype:header,type:envelope:t\n"+
		"transforms.outbox.route.topic.regex=(.*)\ntransforms.outbox.route.topic.replacement=x.$1\n")
	tables := writeFile(t, dir, "tables.properties", strings.Replace(minimalDbz, "table.include.list=public.outbox", "table.include.list=public.outbox_events,shipping.parcels_outbox", 1))
	refused := writeFile(t, dir, "refused.properties", minimalDbz+"database.password=${file:/nonexistent/secrets.properties:pw}\nsnapshot.mode=sometimes\ncolumn.include.list=public.outbox.id\n")
	var b strings.Builder
	for _, p := range []string{path, tables, refused} {
		err, out, errOut := run(t, canceled(), "config", "from-debezium", p)
		if err != nil && !Reported(err) {
			errOut += ErrorLine(err) + "\n"
		}
		fmt.Fprintf(&b, "$ cdc-relay config from-debezium %s\n%s--- stderr\n%s--- exit %d\n\n", filepath.Base(p), out, errOut, ExitCode(err))
	}
	got := strings.ReplaceAll(b.String(), dir+"/", "")
	golden(t, "from-debezium.golden", got)
	if w := "cdc-relay: warning: debezium config c.properties: snapshot.mode initial (Debezium's default when absent) → delivery.snapshot: initial"; !strings.Contains(got, w) {
		t.Errorf("stderr does not hold %q", w)
	}
}
