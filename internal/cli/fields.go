package cli

import (
	"strings"

	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// runFlags maps the relay.Config fields that library packages name (through
// the setting.Namer of runNames, in an error or a log line) to the setting
// that sets them: its key in the configuration (KEYS.md) and its flag. The
// command line alone knows keys and flags: libraries name their own
// fields, and a nested configuration's fields by their path in relay.Config
// ("Sink.Brokers": the sink's Brokers, setting.Namer.Within). A setting may
// carry the value the message asks for ("on-slot-loss=backfill" for
// Backfill, a hook the relay runs only then); several settings are separated
// by commas, each key with its flag.
var runFlags = map[string]runSetting{
	"PGURL":                         {"source.pg_url", "pg-url"},
	"Slot":                          {"source.slot", "slot"},
	"Publication":                   {"source.publication", "publication"},
	"CreateSlot":                    {"source.create_slot", "create-slot"},
	"SlotFailover":                  {"source.slot_failover", "slot-failover"},
	"CreatePublication":             {"source.create_publication", "create-publication"},
	"Delivery":                      {"delivery.mode", "delivery"},
	"OnOutboxUpdate":                {"delivery.on_outbox_update", "on-outbox-update"},
	"Topic":                         {"outbox.topic", "topic"},
	"TopicRegex":                    {"outbox.topic_regex", "topic-regex"},
	"Backfill":                      {"delivery.on_slot_loss", "on-slot-loss=backfill"},
	"Snapshot":                      {"delivery.snapshot", "snapshot=initial"},
	"OpenDeadLetters":               {"outbox.on_error", "on-error=dlq"},
	"Sink.Brokers":                  {"kafka.brokers", "kafka-brokers"},
	"Sink.Topics":                   {"outbox.topic", "topic"},
	"Sink.MaxInFlight":              {"kafka.max_in_flight_requests", "max-in-flight-requests"},
	"Sink.ContentType":              {"outbox.content_type", "content-type"},
	"Decoder.Schema":                {"tables", "table"},
	"Decoder.Table":                 {"tables", "table"},
	"Decoder.Columns.ID":            {"outbox.columns.id", "column-id"},
	"Decoder.Columns.AggregateType": {"outbox.columns.aggregate_type", "column-aggregate-type"},
	"Decoder.Columns.AggregateID":   {"outbox.columns.aggregate_id", "column-aggregate-id"},
	"Decoder.Columns.EventType":     {"outbox.columns.event_type", "column-event-type"},
	"Decoder.Columns.Payload":       {"outbox.columns.payload", "column-payload"},
	"Decoder.Columns":               {"outbox.columns.*", "column-*"},
	"Decoder.HeaderColumns":         {"outbox.header_columns", "header-columns"},
	"Decoder.ContentType":           {"outbox.content_type", "content-type"},
	"Decoder.TimestampColumn":       {"outbox.columns.timestamp", "column-timestamp"},
	"Decoder.PartitionColumn":       {"outbox.columns.partition", "column-partition"},
	"Decoder.EnvelopeColumns":       {"outbox.envelope_columns", "envelope-columns"},
	"Pool":                          {"source.pg_url", "pg-url"},
	"PrimaryPGURL":                  {"source.primary_pg_url", "primary-pg-url"},
	"PrimaryPool":                   {"source.primary_pg_url", "primary-pg-url"},
	"Checkpoints":                   {"delivery.checkpoint.store", "checkpoint-store"},
	"Decoder.SchemaVersionColumn":   {"outbox.columns.schema_version", "column-schema-version"},
	"Decoder.JSON":                  {"outbox.value_encoding,outbox.key_encoding", "value-encoding,key-encoding"},
	"Decoder.MessagePrefix":         {"messages.prefix", "messages-prefix"},
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
