package cli

// The configuration model. Every setting is declared once: one field of the
// command line's flag structs, whose tags give its key (its dotted path in the
// YAML document, `key:"source.slot"`), its flag (the field's name, or a name
// tag), its environment variable (CDC_RELAY_ + the flag), its default and its
// help. A flag struct that several commands share is embedded where it is
// used, so the field stays one declaration. The YAML file (by key, or by flag
// name as before), the CDC_RELAY_* variables, --set key=value and the flags
// are overlays of that one declaration (config.go); the settings of section
// outbox are what an entry of the tables list may override (tables.go).
// Command arguments (--since, --limit, --dry-run …) have no key: they say
// what one invocation does, not how the relay is configured.
//
// Adding a setting is adding one field with a key tag to the flag struct of
// the section it belongs to; TestSettingsDeclaredOnce fails when a key is
// declared by two fields.

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/kong"
)

// sectionOutbox is the section an entry of the tables list overrides.
const sectionOutbox = "outbox."

// decl is one setting's declaration, as reflection finds it.
type decl struct {
	key   string
	flag  string
	index []int // the field within the command's struct
	typ   reflect.Type
	enum  []string
	owner string // the declaring struct and field, e.g. "cli.PGFlags.Slot"
	// fields are the library configuration fields the setting sets, as
	// their packages name them (a field tag; fields.go).
	fields []string
}

// declarations returns the settings of command struct type t (a pointer or
// struct), by key: the fields with a key tag, in t and the structs it embeds.
func declarations(t reflect.Type) map[string]decl {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	out := map[string]decl{}
	var walk func(t reflect.Type, index []int)
	walk = func(t reflect.Type, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			idx := append(slices.Clone(index), i)
			if _, ok := f.Tag.Lookup("embed"); ok || (f.Anonymous && f.Type.Kind() == reflect.Struct && f.Tag.Get("key") == "") {
				walk(f.Type, idx)
				continue
			}
			key := f.Tag.Get("key")
			if key == "" {
				continue
			}
			flag := f.Tag.Get("name")
			if flag == "" {
				flag = kebabName(f.Name)
			}
			var enum []string
			if e := f.Tag.Get("enum"); e != "" {
				enum = strings.Split(e, ",")
			}
			var fields []string
			if fs := f.Tag.Get("field"); fs != "" {
				fields = strings.Split(fs, ",")
			}
			out[key] = decl{key: key, flag: flag, index: idx, typ: f.Type, enum: enum, owner: t.String() + "." + f.Name, fields: fields}
		}
	}
	walk(t, nil)
	return out
}

// kebabName is kong's flag name for a field without a name tag: its words in
// lower case, joined by dashes (ColumnAggregateID: column-aggregate-id).
func kebabName(field string) string {
	var b strings.Builder
	rs := []rune(field)
	for i, r := range rs {
		upper := r >= 'A' && r <= 'Z'
		if upper && i > 0 {
			prevLower := rs[i-1] >= 'a' && rs[i-1] <= 'z' || rs[i-1] >= '0' && rs[i-1] <= '9'
			nextLower := i+1 < len(rs) && rs[i+1] >= 'a' && rs[i+1] <= 'z'
			if prevLower || (nextLower && rs[i-1] >= 'A' && rs[i-1] <= 'Z') {
				b.WriteByte('-')
			}
		}
		if upper {
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// modelKeys maps every setting key of app's commands to its flag name, and
// every flag name that has a key to the key.
func modelKeys(app *kong.Application) (byKey, byFlag map[string]string) {
	byKey, byFlag = map[string]string{}, map[string]string{}
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, f := range n.Flags {
			if k := f.Tag.Get("key"); k != "" {
				byKey[k], byFlag[f.Name] = f.Name, k
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(app.Node)
	return byKey, byFlag
}

// setValue sets the setting d of the struct v points to from text (a list:
// items), as the flag would: enums checked, durations parsed.
func (d decl) setValue(v reflect.Value, text string, items []string) error {
	f := v.Elem().FieldByIndex(d.index)
	switch {
	case d.typ.Kind() == reflect.Slice && d.typ.Elem().Kind() == reflect.String:
		f.Set(reflect.ValueOf(slices.Clone(items)))
	case d.typ.Kind() == reflect.String:
		if len(d.enum) > 0 && !slices.Contains(d.enum, text) {
			return fmt.Errorf("%q: want one of %s", text, strings.Join(d.enum, ", "))
		}
		f.SetString(text)
	case d.typ == reflect.TypeOf(time.Duration(0)):
		dur, err := time.ParseDuration(text)
		if err != nil {
			return fmt.Errorf("want a Go duration such as 10s, got %q", text)
		}
		f.SetInt(int64(dur))
	case d.typ.Kind() == reflect.Bool:
		f.SetBool(text == "true")
	default:
		return fmt.Errorf("cannot be set per table")
	}
	return nil
}

// keyOfFlag returns the key of the setting flag sets, "" for a command
// argument. Every setting with a flag is one of run's (config print takes
// them too), status's --max-lag-bytes aside.
func keyOfFlag(flag string) string {
	for _, t := range []reflect.Type{reflect.TypeOf(RunCmd{}), reflect.TypeOf(StatusCmd{})} {
		for _, d := range declarations(t) {
			if d.flag == flag {
				return d.key
			}
		}
	}
	return ""
}
