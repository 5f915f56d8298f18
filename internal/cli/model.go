package cli

// The configuration model. Every setting is declared once: one field of the
// command line's flag structs, whose tags give its key (its dotted path in the
// YAML document, `key:"source.slot"`), its flag (the field's name, or a name
// tag), its environment variable (CDC_RELAY_ + the flag), its default and its
// help. A flag struct that several commands share is embedded where it is
// used, so the field stays one declaration. The YAML file (by key, or by flag
// name as before), the CDC_RELAY_* variables, --set key=value and the flags
// are overlays of that one declaration (internal/config); the settings of
// section outbox are what an entry of the tables list may override
// (tables.go).
// Command arguments (--since, --limit, --dry-run …) have no key: they say
// what one invocation does, not how the relay is configured.
//
// Adding a setting is adding one field with a key tag to the flag struct of
// the section it belongs to; TestSettingsDeclaredOnce fails when a key is
// declared by two fields.

import (
	"reflect"

	"github.com/cdc-relay/cdc-relay/internal/config"
)

// keyOfFlag returns the key of the setting flag sets, "" for a command
// argument. Every setting with a flag is one of run's (config print takes
// them too), status's --max-lag-bytes aside.
func keyOfFlag(flag string) string {
	for _, t := range []reflect.Type{reflect.TypeOf(RunCmd{}), reflect.TypeOf(StatusCmd{})} {
		for _, d := range config.Declarations(t) {
			if d.Flag == flag {
				return d.Key
			}
		}
	}
	return ""
}
