package cli

import (
	"bytes"
	"io"
	"strings"

	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// runFlags maps the relay.Config fields that library packages name (in a
// *setting.FieldError, or as a setting.Token in a hint or a log line) to the
// flag that sets them. The command line alone knows flags: libraries name
// their own fields. A flag may carry the value the message asks for
// ("on-slot-loss=backfill" for Backfill, a hook the relay runs only then).
// A library names a field of its own configuration ("Brokers" of
// sink.Config); a token whose field is no key here is found as the one key
// that ends with it ("Sink.Brokers"), see flagText.
var runFlags = map[string]string{
	"PGURL":                         "pg-url",
	"Slot":                          "slot",
	"Publication":                   "publication",
	"CreateSlot":                    "create-slot",
	"SlotFailover":                  "slot-failover",
	"CreatePublication":             "create-publication",
	"Delivery":                      "delivery",
	"OnOutboxUpdate":                "on-outbox-update",
	"Topic":                         "topic",
	"TopicRegex":                    "topic-regex",
	"Backfill":                      "on-slot-loss=backfill",
	"Snapshot":                      "snapshot=initial",
	"OpenDeadLetters":               "on-error=dlq",
	"Sink.Brokers":                  "kafka-brokers",
	"Sink.Topics":                   "topic",
	"Sink.MaxInFlight":              "max-in-flight-requests",
	"Decoder.Schema":                "table",
	"Decoder.Table":                 "table",
	"Decoder.Columns.ID":            "column-id",
	"Decoder.Columns.AggregateType": "column-aggregate-type",
	"Decoder.Columns.AggregateID":   "column-aggregate-id",
	"Decoder.Columns.EventType":     "column-event-type",
	"Decoder.Columns.Payload":       "column-payload",
	"Decoder.Columns":               "column-*",
	"Decoder.HeaderColumns":         "header-columns",
	"Decoder.ContentType":           "content-type",
	"Decoder.TimestampColumn":       "column-timestamp",
	"Decoder.PartitionColumn":       "column-partition",
	"Decoder.EnvelopeColumns":       "envelope-columns",
	"Pool":                          "pg-url",
	"PrimaryPGURL":                  "primary-pg-url",
	"PrimaryPool":                   "primary-pg-url",
	"Checkpoints":                   "checkpoint-store",
	"Decoder.SchemaVersionColumn":   "column-schema-version",
	"Decoder.JSON":                  "value-encoding,key-encoding",
	"Decoder.MessagePrefix":         "messages-prefix",
}

// flagText is how the command line names field: "(--flag / CDC_RELAY_FLAG)",
// with a value "(--flag=value / CDC_RELAY_FLAG=value)", for several flags
// (a comma-separated entry) each so, separated by commas. field is a key of
// flags or, failing that, the end of exactly one key ("Columns.ID" of
// "Decoder.Columns.ID"). ok is false for a field flags does not name.
func flagText(flags map[string]string, field string) (text string, ok bool) {
	flag, ok := flags[field]
	if !ok {
		found := 0
		for k, f := range flags {
			if strings.HasSuffix(k, "."+field) {
				flag, found = f, found+1
			}
		}
		if found != 1 {
			return "", false
		}
	}
	var named []string
	for _, f := range strings.Split(flag, ",") {
		name, value, hasValue := strings.Cut(f, "=")
		if hasValue {
			value = "=" + value
		}
		named = append(named, "--"+f+" / "+envName(name)+value)
	}
	return "(" + strings.Join(named, ", ") + ")", true
}

// nameFlags rewrites the settings named in err's text as the flags and
// environment variables of flags (field → flag name), so the message tells
// the operator what to set: each *setting.FieldError's token by its full
// field path (setting.Within), then every other setting.Token by flagText.
// Other errors pass unchanged.
func nameFlags(err error, flags map[string]string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, f := range setting.Fields(err) {
		if text, ok := flagText(flags, f.Field); ok {
			msg = strings.ReplaceAll(msg, f.Token(), text)
		}
	}
	msg = setting.ReplaceTokens(msg, func(field string) (string, bool) { return flagText(flags, field) })
	if msg == err.Error() {
		return err
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

// flagWriter writes log lines with the settings their messages name
// (setting.Token) rewritten as flags, as nameFlags does for errors. zerolog
// writes each line with one Write.
type flagWriter struct {
	w     io.Writer
	flags map[string]string
}

// tokenStart is how every setting.Token begins.
var tokenStart = []byte(setting.Token("")[:len(setting.Token(""))-1])

func (fw flagWriter) Write(p []byte) (int, error) {
	if !bytes.Contains(p, tokenStart) {
		return fw.w.Write(p)
	}
	line := setting.ReplaceTokens(string(p), func(field string) (string, bool) { return flagText(fw.flags, field) })
	if _, err := io.WriteString(fw.w, line); err != nil {
		return 0, err
	}
	return len(p), nil
}
