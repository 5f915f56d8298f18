package config

import (
	"reflect"
	"slices"
	"strings"

	"github.com/alecthomas/kong"
	yaml "go.yaml.in/yaml/v3"
)

// TableSection is the section an entry of the tables list overrides, and
// a dot.
const TableSection = "outbox."

// Decl is one setting's declaration, as reflection finds it: a field with
// a key tag (`key:"source.slot"`).
type Decl struct {
	Key   string
	Flag  string       // the name tag, or the field's name in kebab case, as kong names it
	Index []int        // the field within the command's struct
	Type  reflect.Type // the field's type
	Enum  []string     // the enum tag's values
	Owner string       // the declaring struct and field, e.g. "cli.PGFlags.Slot"
	// Check and Example are the bound the setting declares and the
	// example its message shows (Check).
	Check, Example string
	// Fields are the library configuration fields the setting sets, as
	// their packages name them (a field tag, e.g. "Sink.Brokers", or
	// "Backfill=backfill" for a field one value of the setting sets).
	Fields []string
}

// Declarations returns the settings of command struct type t (a pointer or
// struct), by key: the fields with a key tag, in t and the structs it embeds.
func Declarations(t reflect.Type) map[string]Decl {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	out := map[string]Decl{}
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
			out[key] = Decl{Key: key, Flag: flag, Index: idx, Type: f.Type, Enum: enum, Owner: t.String() + "." + f.Name, Fields: fields,
				Check: f.Tag.Get("check"), Example: f.Tag.Get("example")}
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

// Keys maps every setting key of app's commands to its flag name, and
// every flag name that has a key to the key.
func Keys(app *kong.Application) (byKey, byFlag map[string]string) {
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

// Set sets the setting d of the struct v points to from node, a YAML value,
// read as every overlay reads one (Convert), its enum checked.
func (d Decl) Set(v reflect.Value, node *yaml.Node) error {
	x, err := Convert(node, d.Type, d.Enum)
	if err != nil {
		return err
	}
	setField(v.Elem().FieldByIndex(d.Index), x)
	return nil
}
