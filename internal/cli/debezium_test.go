package cli

import (
	"reflect"
	"testing"
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
