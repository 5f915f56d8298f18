package setting

import (
	"errors"
	"regexp"
)

// Token is the old way of naming a setting, rewritten by the command line;
// it goes once every package renders through a Namer.
func Token(field string) string { return Namer{}.Name(field) }

var tokens = regexp.MustCompile(`\(setting ([A-Za-z][A-Za-z0-9.]*)\)`)

// ReplaceTokens replaces every Token in s (going, see Token).
func ReplaceTokens(s string, name func(field string) (text string, ok bool)) string {
	return tokens.ReplaceAllStringFunc(s, func(tok string) string {
		if text, ok := name(tokens.FindStringSubmatch(tok)[1]); ok {
			return text
		}
		return tok
	})
}

// Errorf is Namer{}.Errorf (going, see Token).
func Errorf(field, format string, args ...any) error { return Namer{}.Errorf(field, format, args...) }

// Within prefixes the field of err's outermost *FieldError (going, see Token).
func Within(prefix string, err error) error {
	var fe *FieldError
	if errors.As(err, &fe) {
		fe.Field = prefix + "." + fe.Field
	}
	return err
}

// Token returns the token naming the field in the error's text (going).
func (e *FieldError) Token() string { return e.name }
