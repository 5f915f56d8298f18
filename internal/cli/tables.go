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
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/cdc-relay/cdc-relay/internal/config"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// BeforeApply keeps the configuration file's table entries, whose
// overrides Validate checks and config applies.
func (r *RunCmd) BeforeApply(loader *configLoader) error {
	entries, err := loader.tables()
	if slices.ContainsFunc(entries, func(e config.TableEntry) bool { return len(e.Overrides) > 0 }) {
		r.tableEntries, r.configPath = entries, loader.file.Path()
	}
	return err
}

// forTable returns the run settings of outbox table name: r itself, or a
// copy with the overrides of the table's entry in the configuration file,
// applied through the outbox section's declarations.
func (r *RunCmd) forTable(name string) (*RunCmd, error) {
	i := slices.IndexFunc(r.tableEntries, func(e config.TableEntry) bool { return e.Name == name })
	if i < 0 || len(r.tableEntries[i].Overrides) == 0 {
		return r, nil
	}
	e := r.tableEntries[i]
	rr := *r
	byFlag := map[string]config.Decl{}
	var allowed []string
	for k, d := range config.Declarations(reflect.TypeOf(r)) {
		if strings.HasPrefix(k, config.TableSection) {
			byFlag[d.Flag] = d
			allowed = append(allowed, strings.TrimPrefix(k, config.TableSection))
		}
	}
	slices.Sort(allowed)
	for _, k := range slices.Sorted(maps.Keys(e.Overrides)) {
		v := e.Overrides[k]
		bad := func(msg string) error {
			return &config.Error{Path: r.configPath, Line: v.Line, Msg: fmt.Sprintf("table %s: %s: %s", name, e.Written[k], msg)}
		}
		d, ok := byFlag[k]
		if !ok {
			return nil, bad("cannot be set per table; an entry of the tables list may set " + strings.Join(allowed, ", ") + " (the keys of section outbox)")
		}
		if err := d.Set(reflect.ValueOf(&rr), v); err != nil {
			return nil, bad(err.Error())
		}
	}
	return &rr, nil
}

// checkTableOverrides checks each table's settings as Validate checks the
// run's, naming the table, and the entry's key and line where an override
// is at fault.
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
			return r.tableError(name, err)
		}
		if _, err := rr.headerColumns(); err != nil {
			return r.tableError(name, err)
		}
		if err := rr.payloadFormatFlags.validate(); err != nil {
			return r.tableError(name, err)
		}
		if _, err := rr.jsonOptions(name, rr.Topic, rr.TombstoneOnEmptyPayload); err != nil {
			return r.tableError(name, err)
		}
	}
	return nil
}

// tableError is err, a check of table name's settings, as an error about
// its entry in the configuration file when the setting at fault is one the
// entry overrides: at the override's line, by the key as the entry wrote
// it (topic: …). Otherwise it names the table.
func (r *RunCmd) tableError(name string, err error) error {
	var flag, problem string
	var se *settingError
	var fe *setting.FieldError
	switch {
	case errors.As(err, &se):
		flag, problem = se.flag, se.problem
	case errors.As(err, &fe):
		if s, ok := runFlags[fe.Field]; ok && !strings.Contains(s.flag, ",") {
			flag, problem = s.flag, fe.Err.Error()
		}
	}
	if i := slices.IndexFunc(r.tableEntries, func(e config.TableEntry) bool { return e.Name == name }); i >= 0 && flag != "" {
		e := r.tableEntries[i]
		if v, ok := e.Overrides[flag]; ok {
			return &config.Error{Path: r.configPath, Line: v.Line, Msg: fmt.Sprintf("table %s: %s: %s", name, e.Written[flag], problem)}
		}
	}
	return fmt.Errorf("table %s: %w", name, err)
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
		return decoder.Config{}, err
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
