// Package setting is how a library names the configuration setting an
// operator must fix, without knowing the command line: the error for a bad
// value (FieldError) and the token that names a setting inside a hint or a
// log line (Token). It holds no configuration: each package owns its Config
// struct, and the command line (cli) owns flags, files and the environment.
//
// Library packages name their own configuration fields ("Slot",
// "Decoder.Columns.ID"); they know nothing of flags. The command line alone
// maps a field to the flag and environment variable that set it (cli), so a
// message reads "--column-id / CDC_RELAY_COLUMN_ID" there and "(setting
// Columns.ID)" to a library caller.
package setting

import (
	"errors"
	"fmt"
	"regexp"
)

// FieldError is a bad configuration value: Err says what is wrong and how to
// fix it, Field names the setting as a dotted path of the configuration
// struct, e.g. "Decoder.Columns.ID".
type FieldError struct {
	Field string
	Err   error
	// named is Field as it was when the error was made: the name in its text,
	// which wrapping errors have already copied (see Within).
	named string
}

// Error returns Err's text followed by the field's token (see Token).
func (e *FieldError) Error() string { return fmt.Sprintf("%v %s", e.Err, e.Token()) }

// Token returns the token naming the field in the error's text: Token of the
// field as it was named when the error was made, before any Within.
func (e *FieldError) Token() string {
	if e.named == "" {
		return Token(e.Field)
	}
	return Token(e.named)
}

// Unwrap returns Err.
func (e *FieldError) Unwrap() error { return e.Err }

// Token is how a field is named inside an error's or a log line's text; the
// command line replaces it with the flag and environment variable (see
// ReplaceTokens). A library writes it where it would name a flag: as the
// setting to check in a hint, or as the fix of a *FieldError.
func Token(field string) string { return "(setting " + field + ")" }

// tokens matches Token's output.
var tokens = regexp.MustCompile(`\(setting ([A-Za-z][A-Za-z0-9.]*)\)`)

// ReplaceTokens returns s with every Token in it replaced by name's answer
// for its field; a token name does not know (ok false) stays as it is.
func ReplaceTokens(s string, name func(field string) (text string, ok bool)) string {
	return tokens.ReplaceAllStringFunc(s, func(tok string) string {
		if text, ok := name(tokens.FindStringSubmatch(tok)[1]); ok {
			return text
		}
		return tok
	})
}

// Errorf returns a *FieldError for field with a formatted message (which may
// wrap an error with %w).
func Errorf(field, format string, args ...any) error {
	return &FieldError{Field: field, Err: fmt.Errorf(format, args...), named: field}
}

// Within prefixes, in place, the field of the outermost *FieldError in err's
// chain with prefix and a dot, for a configuration nested in another
// ("Columns.ID" within "Decoder" is "Decoder.Columns.ID"), and returns err,
// whose wrapping is kept. The text keeps the token it was made with (wrapping
// errors copied it): read the full path with Fields. Call it once, where the
// nested configuration is used, on an error made for that call.
func Within(prefix string, err error) error {
	var fe *FieldError
	if errors.As(err, &fe) {
		fe.Field = prefix + "." + fe.Field
	}
	return err
}

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
