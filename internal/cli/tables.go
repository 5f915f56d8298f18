package cli

// Several outbox tables (run's --table, given more than once): the settings
// each table may override in the configuration file, as an entry of its
// table list written as a mapping:
//
//	table:
//	  - billing.outbox_events
//	  - name: shipping.parcels_outbox
//	    column-aggregate-id: parcel_id
//	    topic: shipping.{aggregate_type}
//	    on-error: halt

import (
	"fmt"
	"slices"
	"strings"

	yaml "go.yaml.in/yaml/v3"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/relay"
)

// perTableKeys are the flags an entry of the table list may set for its
// table: how its rows are read, where its events go and what a permanent
// failure of one does. The rest (Kafka, the slot, the sink's formats) is
// the relay's, one for all tables.
var perTableKeys = []string{
	"topic", "topic-regex", "topic-regex-field",
	"column-id", "column-aggregate-type", "column-aggregate-id", "column-event-type", "column-payload",
	"column-created-at", "column-tracing", "column-timestamp", "column-partition", "column-schema-version",
	"header-columns", "envelope-columns", "content-type", "key-encoding", "value-encoding", "on-error",
}

// BeforeApply keeps the configuration file's table entries, whose
// overrides Validate checks and config applies.
func (r *RunCmd) BeforeApply(loader *configLoader) error {
	entries, err := loader.tables()
	if slices.ContainsFunc(entries, func(e tableEntry) bool { return len(e.overrides) > 0 }) {
		r.tableEntries, r.configPath = entries, loader.file.path
	}
	return err
}

// forTable returns the run settings of outbox table name: r itself, or a
// copy with the overrides of the table's entry in the configuration file.
func (r *RunCmd) forTable(name string) (*RunCmd, error) {
	i := slices.IndexFunc(r.tableEntries, func(e tableEntry) bool { return e.name == name })
	if i < 0 || len(r.tableEntries[i].overrides) == 0 {
		return r, nil
	}
	e := r.tableEntries[i]
	rr := *r
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range e.overrides {
			if !yield(k) {
				return
			}
		}
	}) {
		v := e.overrides[k]
		bad := func(msg string) error {
			return &configError{path: r.configPath, line: v.Line, msg: fmt.Sprintf("table %s: %s: %s", name, k, msg)}
		}
		one := func() (string, error) {
			if v.Kind != yaml.ScalarNode {
				return "", bad("want one value")
			}
			return v.Value, nil
		}
		list := func() ([]string, error) {
			switch v.Kind {
			case yaml.ScalarNode:
				return strings.Split(v.Value, ","), nil
			case yaml.SequenceNode:
				var out []string
				for _, item := range v.Content {
					if item.Kind != yaml.ScalarNode {
						return nil, bad("want a list of values")
					}
					out = append(out, item.Value)
				}
				return out, nil
			}
			return nil, bad("want a list: a YAML sequence or a comma-separated string")
		}
		var (
			s   string
			l   []string
			err error
		)
		switch k {
		case "header-columns", "envelope-columns":
			l, err = list()
		default:
			s, err = one()
		}
		if err != nil {
			return nil, err
		}
		switch k {
		case "topic":
			rr.Topic = s
		case "topic-regex":
			rr.TopicRegex = s
		case "topic-regex-field":
			rr.TopicRegexField = s
		case "column-id":
			rr.ColumnID = s
		case "column-aggregate-type":
			rr.ColumnAggregateType = s
		case "column-aggregate-id":
			rr.ColumnAggregateID = s
		case "column-event-type":
			rr.ColumnEventType = s
		case "column-payload":
			rr.ColumnPayload = s
		case "column-created-at":
			rr.ColumnCreatedAt = s
		case "column-tracing":
			rr.ColumnTracing = s
		case "column-timestamp":
			rr.ColumnTimestamp = s
		case "column-partition":
			rr.ColumnPartition = s
		case "column-schema-version":
			rr.ColumnSchemaVersion = s
		case "header-columns":
			rr.HeaderColumns = l
		case "envelope-columns":
			rr.EnvelopeColumns = l
		case "content-type":
			rr.ContentType = s
		case "key-encoding":
			rr.KeyEncoding = s
		case "value-encoding":
			rr.ValueEncoding = s
		case "on-error":
			if s != "dlq" && s != "halt" {
				return nil, bad(fmt.Sprintf("%q: want dlq or halt", s))
			}
			rr.OnError = s
		default:
			return nil, bad("cannot be set per table; an entry of the table list may set " + strings.Join(perTableKeys, ", "))
		}
	}
	return &rr, nil
}

// checkTableOverrides checks each table's settings as Validate checks the
// run's, naming the table.
func (r *RunCmd) checkTableOverrides() error {
	for _, name := range r.Table {
		rr, err := r.forTable(name)
		if err != nil || rr == r {
			if err != nil {
				return err
			}
			continue
		}
		if err := rr.validateTopic(); err != nil {
			return fmt.Errorf("table %s: %w", name, err)
		}
		if _, err := rr.headerColumns(); err != nil {
			return fmt.Errorf("table %s: %w", name, flagError("header-columns", err.Error()))
		}
		if _, err := rr.envelope(); err != nil {
			return fmt.Errorf("table %s: %w", name, flagError("envelope-columns", err.Error()))
		}
		if _, err := rr.jsonOptions(name, rr.Topic, rr.TombstoneOnEmptyPayload); err != nil {
			return fmt.Errorf("table %s: %w", name, err)
		}
	}
	return nil
}

// decoderConfig is how the run reads outbox table name (schema.table;
// "" with a message outbox alone).
func (r *RunCmd) decoderConfig(name string) (decoder.Config, error) {
	var schema, table string
	if name != "" {
		var err error
		if schema, table, err = splitTable(name); err != nil {
			return decoder.Config{}, err
		}
	}
	headers, err := r.headerColumns()
	if err != nil {
		return decoder.Config{}, err
	}
	envelope, err := r.envelope()
	if err != nil {
		return decoder.Config{}, flagError("envelope-columns", err.Error())
	}
	jsonOpts, err := r.jsonOptions(r.outboxName(name), r.Topic, r.TombstoneOnEmptyPayload)
	if err != nil {
		return decoder.Config{}, err
	}
	return decoder.Config{
		Schema: schema, Table: table,
		Columns: decoder.Columns{
			ID: r.ColumnID, AggregateType: r.ColumnAggregateType, AggregateID: r.ColumnAggregateID,
			EventType: r.ColumnEventType, Payload: r.ColumnPayload,
		},
		HeaderColumns:       headers,
		ContentType:         r.ContentType,
		TracingColumn:       r.ColumnTracing,
		TimestampColumn:     r.ColumnTimestamp,
		PartitionColumn:     r.ColumnPartition,
		EnvelopeColumns:     envelope,
		JSON:                jsonOpts,
		SchemaVersionColumn: r.ColumnSchemaVersion,
		RouteByEventType:    routeByEventType(r.Topic, r.topicRegex()),
		CreatedAtColumn:     r.ColumnCreatedAt,
	}, nil
}

// tablesConfig sets cfg's decoder tables after the first, each table's
// own topic where it has one, and the tables whose permanent failures halt.
func (r *RunCmd) tablesConfig(cfg *relay.Config) error {
	halt := map[decoder.TableName]bool{}
	anyDLQ := r.OnError == "dlq"
	for i, name := range r.Table {
		rr, err := r.forTable(name)
		if err != nil {
			return err
		}
		dc, err := rr.decoderConfig(name)
		if err != nil {
			return fmt.Errorf("table %s: %w", name, err)
		}
		t := decoder.TableName{Schema: dc.Schema, Table: dc.Table}
		if i == 0 {
			dc.MessagePrefix = cfg.Decoder.MessagePrefix
			cfg.Decoder = dc
		} else {
			cfg.Decoder.Also = append(cfg.Decoder.Also, dc)
		}
		if rr.Topic != r.Topic || rr.topicRegex() != r.topicRegex() {
			if cfg.TableRoutes == nil {
				cfg.TableRoutes = map[decoder.TableName]relay.TableRoute{}
			}
			cfg.TableRoutes[t] = relay.TableRoute{Topic: rr.Topic, Regex: rr.topicRegex()}
		}
		if rr.OnError == "halt" {
			halt[t] = true
		}
		anyDLQ = anyDLQ || rr.OnError == "dlq"
	}
	if r.OnError == "halt" {
		halt[decoder.TableName{}] = true // message-outbox events
	}
	if anyDLQ && len(halt) > 0 {
		cfg.HaltTables = halt
	}
	return nil
}

// dlqNeeded reports whether some table's events are dead-lettered.
func (r *RunCmd) dlqNeeded() bool {
	if r.OnError == "dlq" {
		return true
	}
	for _, name := range r.Table {
		if rr, err := r.forTable(name); err == nil && rr.OnError == "dlq" {
			return true
		}
	}
	return false
}
