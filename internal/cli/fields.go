package cli

import (
	"strings"

	"github.com/cdc-relay/cdc-relay/internal/config"
)

// runFlags maps the relay.Config fields that library packages name in a
// *config.FieldError to the run flag that sets them. The command line alone
// knows flags: libraries name their own fields.
var runFlags = map[string]string{
	"PGURL":                         "pg-url",
	"Slot":                          "slot",
	"Publication":                   "publication",
	"Delivery":                      "delivery",
	"OnOutboxUpdate":                "on-outbox-update",
	"Topic":                         "topic",
	"Sink.Brokers":                  "kafka-brokers",
	"Decoder.Schema":                "table",
	"Decoder.Table":                 "table",
	"Decoder.Columns.ID":            "column-id",
	"Decoder.Columns.AggregateType": "column-aggregate-type",
	"Decoder.Columns.AggregateID":   "column-aggregate-id",
	"Decoder.Columns.EventType":     "column-event-type",
	"Decoder.Columns.Payload":       "column-payload",
	"Decoder.HeaderColumns":         "header-columns",
	"Decoder.ContentType":           "content-type",
	"Decoder.TimestampColumn":       "column-timestamp",
	"Decoder.PartitionColumn":       "column-partition",
	"Decoder.EnvelopeColumns":       "envelope-columns",
	"Pool":                          "pg-url",
	"Checkpoints":                   "checkpoint-store",
}

// nameFlags rewrites the settings named in err's *config.FieldErrors as the
// flags and environment variables of flags (field → flag name), so the message
// tells the operator what to set. Other errors pass unchanged.
func nameFlags(err error, flags map[string]string) error {
	fields := config.Fields(err)
	if len(fields) == 0 {
		return err
	}
	msg := err.Error()
	for _, f := range fields {
		if flag, ok := flags[f.Field]; ok {
			msg = strings.ReplaceAll(msg, f.Token(), "(--"+flag+" / "+envName(flag)+")")
		}
	}
	return &flagNamedError{msg: msg, err: err}
}

// flagNamedError is an error whose text names flags instead of fields; it
// unwraps to the original.
type flagNamedError struct {
	msg string
	err error
}

func (e *flagNamedError) Error() string { return e.msg }
func (e *flagNamedError) Unwrap() error { return e.err }
