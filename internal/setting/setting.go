// Package setting is how a library names, in an error or a log line, the
// configuration setting an operator must fix or the command to run, without
// knowing the command line. It holds no configuration: each package owns its
// Config struct, and the command line (cli) owns keys, flags, files and the
// environment.
//
// A library names a setting by its own configuration field ("Slot",
// "Columns.ID") through the Namer its caller put in its Config, at the point
// it writes the message: the Namer renders it as its caller's Names say
// (the command line writes the key, the flag and the environment variable),
// or, the zero Namer, as "(setting Columns.ID)", so that a library used alone
// still says what to set. A package that hands a nested configuration on
// gives it its Namer Within the nested field: the decoder's "Columns.ID"
// within the relay's "Decoder" is "Decoder.Columns.ID".
package setting

import (
	"fmt"
	"strings"
)

// Names is how a program names what a library's message asks the operator
// to set or to run; the command line implements it.
//
// Setting returns the text that names the setting of field, a dotted path of
// the outermost configuration ("Decoder.Columns.ID"), for the operator to set
// it, e.g. its key with its flag and environment variable; it is written
// where the message names the setting, after a word or two saying what it is
// ("check the Postgres URL <Setting("PGURL")>").
//
// Command returns the command line that runs the program's subcommand name
// ("replay", "dlq replay") with args, pairs of an argument's name and its
// value ("since", "2h"; an empty value is left out), e.g. "cdc-relay replay
// --since 2h".
//
// An implementation must be comparable (a pointer, say): configurations
// that hold a Namer are compared with ==.
type Names interface {
	Setting(field string) string
	Command(name string, args ...string) string
}

// Namer names the settings of one configuration for the messages of the
// library that reads it. The zero Namer renders a setting as "(setting
// Field)" and a command as "(command name arg=value)".
type Namer struct {
	names  Names
	prefix string // the path of this configuration in the outermost, with a trailing dot
}

// NewNamer returns the Namer of the outermost configuration, rendering
// through names (nil: as the zero Namer).
func NewNamer(names Names) Namer { return Namer{names: names} }

// Path returns the dotted path of field in the outermost configuration.
func (n Namer) Path(field string) string { return n.prefix + field }

// Name returns the text naming the setting of field.
func (n Namer) Name(field string) string {
	if n.names == nil {
		return "(setting " + n.Path(field) + ")"
	}
	return n.names.Setting(n.Path(field))
}

// Within returns the Namer of the configuration nested in field ("Decoder"),
// for the package that reads it.
func (n Namer) Within(field string) Namer {
	return Namer{names: n.names, prefix: n.Path(field) + "."}
}

// Command returns the text naming the command to run: subcommand name with
// args, pairs of an argument's name and value (see Names).
func (n Namer) Command(name string, args ...string) string {
	if n.names != nil {
		return n.names.Command(name, args...)
	}
	var b strings.Builder
	b.WriteString("(command " + name)
	for i := 0; i+1 < len(args); i += 2 {
		b.WriteString(" " + args[i])
		if args[i+1] != "" {
			b.WriteString("=" + args[i+1])
		}
	}
	return b.String() + ")"
}

// Errorf returns a *FieldError for field with a formatted message (which may
// wrap an error with %w), followed by the name of the setting.
func (n Namer) Errorf(field, format string, args ...any) error {
	return &FieldError{Field: n.Path(field), Err: fmt.Errorf(format, args...), name: n.Name(field)}
}

// FieldError is a bad configuration value: Err says what is wrong and how to
// fix it, Field names the setting as a dotted path of the outermost
// configuration, e.g. "Decoder.Columns.ID". Make it with Namer.Errorf.
type FieldError struct {
	Field string
	Err   error
	name  string // the setting as the Namer that made the error named it
}

// Error returns Err's text followed by the setting's name.
func (e *FieldError) Error() string {
	name := e.name
	if name == "" {
		name = Namer{}.Name(e.Field)
	}
	return fmt.Sprintf("%v %s", e.Err, name)
}

// Unwrap returns Err.
func (e *FieldError) Unwrap() error { return e.Err }

// Fields returns the field errors in err's chain, outermost first.
func Fields(err error) []*FieldError {
	var out []*FieldError
	for err != nil {
		if fe, ok := err.(*FieldError); ok {
			out = append(out, fe)
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				out = append(out, Fields(e)...)
			}
			return out
		default:
			return out
		}
	}
	return out
}
