// Package config is cdc-relay's configuration document and its overlays on
// the command line: the settings' declarations (tagged fields of the
// command line's flag structs, read by reflection), a YAML file by key in
// sections (source: {slot: …}) or by flag name, and --set key=value, each a
// kong.Resolver that supplies flags the command line left unset. The
// command line (internal/cli) owns the declarations and the flags; this
// package owns how a document is read and applied.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	yaml "go.yaml.in/yaml/v3"
)

// The configuration file: a YAML mapping of sections of keys (source:
// {slot: …}), or of flag names without the dashes. It is a kong.Resolver, so
// kong applies it like any other source: a flag on the command line wins,
// then its environment variable, then the file, then the flag's default.
// Kong itself applies environment variables before resolvers and lets a
// resolver override them, so Resolve steps aside for a flag whose variable is
// set.
//
// One file serves every command: a key is an error only when no command has
// that flag; a command ignores the keys of flags it does not take. A flag
// tagged nofile:"" never takes its key from the file: it shares a name with
// another command's flag of another meaning (dlq's --topic is not run's).

// File is a loaded configuration file and the kong.Resolver over it.
type File struct {
	path   string
	values map[string]*yaml.Node // key → value node
	lines  map[string]int        // key → line of the key
	// used records the keys Resolve supplied a value for, so errors about
	// those flags can point at the file.
	used map[string]bool
	// written is the key as the file wrote it, by flag: the flag name, or
	// the setting's key (source.slot) in the sectioned form.
	written map[string]string
	byKey   map[string]string // setting key → flag (modelKeys)
}

var _ kong.Resolver = (*File)(nil)

// Error is a problem with the configuration file, its line included
// where there is one. Its message stands alone: it names the file and key.
type Error struct {
	Path string
	Line int // 0: the whole file
	Msg  string
}

// Error returns the message, prefixed with the file and its line.
func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("config file %s, line %d: %s", e.Path, e.Line, e.Msg)
	}
	return fmt.Sprintf("config file %s: %s", e.Path, e.Msg)
}

// LoadFile reads and checks path against known, the flag names a file may
// use as keys, and byKey, every setting's key → its flag (Keys): an unknown
// key is an error that names the closest known one. check says where the
// path came from, for an unreadable file.
func LoadFile(path string, known map[string]bool, byKey map[string]string, check string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{Path: path, Msg: fmt.Sprintf("cannot be read (check %s): %v", check, err)}
	}
	cf := &File{path: path, values: map[string]*yaml.Node{}, lines: map[string]int{}, used: map[string]bool{}, written: map[string]string{}, byKey: byKey}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return cf, nil // an empty file sets nothing
		}
		line, msg := syntaxErrorLine(data, err)
		return nil, &Error{Path: path, Line: line, Msg: "not valid YAML: " + msg}
	}
	if len(doc.Content) == 0 {
		return cf, nil // comments only
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return cf, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, &Error{Path: path, Line: root.Line, Msg: "want a mapping of sections (source: {slot: …}) or of flag names without the dashes (pg-url: postgres://relay@db:5432/app) to values"}
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, &Error{Path: path, Line: k.Line, Msg: "a key must be a section such as source, or a flag name such as pg-url"}
		}
		key := k.Value
		if v.Kind == yaml.MappingNode && cf.isSection(key) { // a section; a flag of the same name (delivery, format) takes a scalar
			if err := cf.section(key, v); err != nil {
				return nil, err
			}
			continue
		}
		if key == "tables" {
			key = "table" // the list's key in the sectioned form
		}
		switch {
		case key == "config":
			return nil, &Error{Path: path, Line: k.Line, Msg: "key \"config\" cannot be set in a config file (use --config or CDC_RELAY_CONFIG)"}
		case strings.HasPrefix(key, "-"):
			return nil, &Error{Path: path, Line: k.Line, Msg: fmt.Sprintf("key %q: write flag names without the dashes, e.g. %q", key, strings.TrimLeft(key, "-"))}
		case !known[key]:
			msg := fmt.Sprintf("unknown key %q", key)
			if s := Closest(key, cf.keyNames(known)); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			return nil, &Error{Path: path, Line: k.Line, Msg: msg + "; keys are the settings' keys by section (source: {slot: …}, see docs/configuration.md) or the flag names of cdc-relay's commands without the dashes (see cdc-relay <command> --help)"}
		}
		if err := cf.set(key, k.Value, v, k.Line); err != nil {
			return nil, err
		}
	}
	return cf, nil
}

// set records the file's value v for flag, written as key on line.
func (cf *File) set(flag, key string, v *yaml.Node, line int) error {
	if prev, dup := cf.lines[flag]; dup {
		if cf.written[flag] == key {
			return &Error{Path: cf.path, Line: line, Msg: fmt.Sprintf("key %q is set twice (first on line %d)", key, prev)}
		}
		return &Error{Path: cf.path, Line: line, Msg: fmt.Sprintf("key %q sets what %q (line %d) already sets: keep one", key, cf.written[flag], prev)}
	}
	cf.values[flag], cf.lines[flag], cf.written[flag] = v, line, key
	return nil
}

// isSection reports whether prefix is a section of the model: some key
// begins with prefix and a dot.
func (cf *File) isSection(prefix string) bool {
	for k := range cf.byKey {
		if strings.HasPrefix(k, prefix+".") {
			return true
		}
	}
	return false
}

// section reads the mapping v of section prefix (source, kafka.tls …).
func (cf *File) section(prefix string, v *yaml.Node) error {
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], v.Content[i+1]
		key := prefix + "." + k.Value
		if flag, ok := cf.byKey[key]; ok {
			if err := cf.set(flag, key, val, k.Line); err != nil {
				return err
			}
			continue
		}
		if val.Kind == yaml.MappingNode && cf.isSection(key) {
			if err := cf.section(key, val); err != nil {
				return err
			}
			continue
		}
		msg := fmt.Sprintf("unknown key %q", key)
		if s := Closest(key, cf.keyNames(nil)); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		return &Error{Path: cf.path, Line: k.Line, Msg: msg + "; docs/configuration.md lists every key"}
	}
	return nil
}

// keyNames returns the model's keys and the names in flags, the names a
// file may use.
func (cf *File) keyNames(flags map[string]bool) map[string]bool {
	out := maps.Clone(flags)
	if out == nil {
		out = map[string]bool{}
	}
	for k := range cf.byKey {
		out[k] = true
	}
	return out
}

var yamlErrorLine = regexp.MustCompile(`^(?:yaml: )?(?:line (\d+): )?`)

// syntaxErrorLine returns the 1-based line of data that err, yaml.v3's syntax
// error for it, is about, and err's message without yaml's own prefix and
// line. yaml.v3 counts the lines of its parser errors from 0 and of its
// scanner errors from 1, and names the line where the construct holding the
// mistake began rather than the mistake's own, so its number is often the
// line before the faulty one. The faulty line is found instead as the first
// line at which the file's beginning fails with the same problem: the line
// that makes an otherwise valid beginning invalid. 0 when there is none (the
// problem shows only at the end of the file).
func syntaxErrorLine(data []byte, err error) (int, string) {
	msg := yamlErrorLine.ReplaceAllString(err.Error(), "")
	lines := bytes.SplitAfter(data, []byte("\n"))
	if len(lines) > 5000 { // too long to reparse line by line: yaml's own number, perhaps a line early
		if m := yamlErrorLine.FindStringSubmatch(err.Error()); m[1] != "" {
			n, _ := strconv.Atoi(m[1])
			return n, msg
		}
		return 0, msg
	}
	for n := 1; n <= len(lines); n++ {
		var doc yaml.Node
		perr := yaml.NewDecoder(bytes.NewReader(bytes.Join(lines[:n], nil))).Decode(&doc)
		if perr != nil && !errors.Is(perr, io.EOF) && yamlErrorLine.ReplaceAllString(perr.Error(), "") == msg {
			return n, msg
		}
	}
	return 0, msg
}

// closest returns the known key nearest to key by edit distance, or "" when
// none is near enough to be a likely typo. A known key that ends with key
// ("brokers" for "kafka-brokers") counts as near.
func Closest(key string, known map[string]bool) string {
	best, bestD := "", -1
	for k := range known {
		d := levenshtein(key, k)
		if strings.HasSuffix(k, "-"+key) {
			d = min(d, 2)
		}
		if bestD < 0 || d < bestD || (d == bestD && k < best) {
			best, bestD = k, d
		}
	}
	if bestD < 0 || bestD > max(2, len(key)/3) {
		return ""
	}
	return best
}

// levenshtein is the edit distance between a and b (insertions, deletions
// and substitutions of bytes; flag names are ASCII).
func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// Path returns the file's path.
func (cf *File) Path() string { return cf.path }

// Used reports whether the file supplied flag's value.
func (cf *File) Used(flag string) bool { return cf != nil && cf.used[flag] }

// Validate is part of kong.Resolver; the keys were checked when the file was
// loaded, before any command's own checks.
func (cf *File) Validate(*kong.Application) error { return nil }

// Resolve returns the file's value for flag, or nil when the file has none
// or the flag's environment variable is set (the environment wins over the
// file; kong has already applied it). Values are checked against the flag's
// type here, so an error names the line.
func (cf *File) Resolve(_ *kong.Context, _ *kong.Path, flag *kong.Flag) (any, error) {
	v, ok := cf.values[flag.Name]
	if !ok || (v.Kind == yaml.ScalarNode && v.Tag == "!!null") || flag.Tag.Has("nofile") {
		return nil, nil
	}
	for _, env := range flag.Envs {
		if _, set := os.LookupEnv(env); set {
			return nil, nil
		}
	}
	if flag.Name == "table" && v.Kind == yaml.SequenceNode {
		entries, err := cf.TableEntries()
		if err != nil {
			return nil, err
		}
		names := make([]any, len(entries))
		for i, e := range entries {
			names[i] = e.Name
		}
		cf.used[flag.Name] = true
		return names, nil
	}
	val, err := Value(v, flag.Target.Type())
	if err != nil {
		return nil, &Error{Path: cf.path, Line: v.Line, Msg: flag.Name + ": " + err.Error()}
	}
	cf.used[flag.Name] = true
	return val, nil
}

// TableEntry is one entry of the file's table list: a table's name, and
// for an entry written as a mapping ({name: schema.table, topic: …}) the
// settings it overrides for that table (see RunCmd.applyTable).
type TableEntry struct {
	Name      string
	Line      int
	Overrides map[string]*yaml.Node // flag → value, without name
	Written   map[string]string     // flag → the key as the entry wrote it
}

// tableEntries reads the table key: a name, a list of names, or a list
// whose entries may be mappings naming a table and what it overrides.
func (cf *File) TableEntries() ([]TableEntry, error) {
	v, ok := cf.values["table"]
	if !ok || v.Kind != yaml.SequenceNode {
		return nil, nil
	}
	var out []TableEntry
	for _, item := range v.Content {
		switch item.Kind {
		case yaml.ScalarNode:
			out = append(out, TableEntry{Name: item.Value, Line: item.Line})
		case yaml.MappingNode:
			e := TableEntry{Line: item.Line, Overrides: map[string]*yaml.Node{}, Written: map[string]string{}}
			if err := cf.entryKeys(&e, "", item); err != nil {
				return nil, err
			}
			if e.Name == "" {
				return nil, &Error{Path: cf.path, Line: item.Line, Msg: "table: an entry written as a mapping needs name: schema.table"}
			}
			out = append(out, e)
		default:
			return nil, &Error{Path: cf.path, Line: item.Line, Msg: "tables: want a list of schema.table names, or of mappings {name: schema.table, <key of section outbox>: <value>, …}"}
		}
	}
	return out, nil
}

// entryKeys reads the keys of a table entry's mapping v into e, by flag:
// name, the keys of section outbox without "outbox." (topic, columns:
// {aggregate_id: …}), or flag names as before (column-aggregate-id).
// prefix is the path of v within the entry ("" at its top).
func (cf *File) entryKeys(e *TableEntry, prefix string, v *yaml.Node) error {
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i].Value, v.Content[i+1]
		path := prefix + k
		if path == "name" {
			if val.Kind != yaml.ScalarNode {
				return &Error{Path: cf.path, Line: val.Line, Msg: "table: an entry's name is schema.table, one value"}
			}
			e.Name = val.Value
			continue
		}
		flag, ok := cf.byKey[TableSection+path]
		switch {
		case ok:
		case val.Kind == yaml.MappingNode && cf.isSection(TableSection+path):
			if err := cf.entryKeys(e, path+".", val); err != nil {
				return err
			}
			continue
		default:
			flag = path // a flag name, or a key forTable refuses by name
		}
		if _, dup := e.Written[flag]; dup {
			return &Error{Path: cf.path, Line: val.Line, Msg: fmt.Sprintf("table: key %q sets what %q already sets: keep one", path, e.Written[flag])}
		}
		e.Overrides[flag], e.Written[flag] = val, path
	}
	return nil
}

var durationType = reflect.TypeOf(time.Duration(0))

// yamlValue converts a YAML value to what kong parses for a flag of type t:
// a Go duration string, a YAML boolean, a number, a string, or for a list a
// YAML sequence or a comma-separated string.
func Value(v *yaml.Node, t reflect.Type) (any, error) {
	if t.Kind() == reflect.Slice {
		if v.Kind == yaml.SequenceNode {
			items := make([]any, 0, len(v.Content))
			for _, item := range v.Content {
				if item.Kind != yaml.ScalarNode || item.Tag == "!!null" {
					return nil, fmt.Errorf("line %d: want a list of values such as [kafka-1:9092, kafka-2:9092]", item.Line)
				}
				if k := t.Elem().Kind(); k >= reflect.Int && k <= reflect.Int64 {
					n, err := strconv.ParseInt(item.Value, 10, 64)
					if err != nil {
						return nil, fmt.Errorf("line %d: want a list of whole numbers such as [3, 4], got %q", item.Line, item.Value)
					}
					items = append(items, n) // kong reads a list item by its JSON form: a number, not a string
					continue
				}
				items = append(items, item.Value)
			}
			return items, nil
		}
		if v.Kind != yaml.ScalarNode {
			return nil, errors.New("want a list: a YAML sequence such as [a, b] or a comma-separated string")
		}
		return v.Value, nil
	}
	if v.Kind != yaml.ScalarNode {
		return nil, fmt.Errorf("want a single value, not a %s", kindName(v.Kind))
	}
	switch {
	case t == durationType:
		if _, err := time.ParseDuration(v.Value); err != nil {
			return nil, fmt.Errorf("want a Go duration such as 250ms, 10s or 5m, got %q", v.Value)
		}
		return v.Value, nil
	case t.Kind() == reflect.Bool:
		if v.Tag != "!!bool" {
			return nil, fmt.Errorf("want true or false, got %q", v.Value)
		}
		b, err := strconv.ParseBool(v.Value)
		if err != nil { // YAML 1.1 spellings yaml.v3 also tags !!bool
			return nil, fmt.Errorf("want true or false, got %q", v.Value)
		}
		return b, nil
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		if _, err := strconv.ParseInt(v.Value, 10, 64); err != nil {
			return nil, fmt.Errorf("want a whole number, got %q", v.Value)
		}
	case t.Kind() == reflect.Float64 || t.Kind() == reflect.Float32:
		if _, err := strconv.ParseFloat(v.Value, 64); err != nil {
			return nil, fmt.Errorf("want a number, got %q", v.Value)
		}
	}
	return v.Value, nil
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.AliasNode:
		return "alias"
	}
	return "value"
}

// fromFile returns the first flag named in msg whose value came from the
// file, and where: "key delivery in config file relay.yaml, line 4". It
// returns "", "" when none did (cf may be nil: no file).
func (cf *File) FromFile(msg string) (flag, where string) {
	if cf == nil {
		return "", ""
	}
	for _, m := range anyFlag.FindAllStringSubmatch(msg, -1) {
		if cf.used[m[1]] {
			return m[1], fmt.Sprintf("key %s in config file %s, line %d", m[1], cf.path, cf.lines[m[1]])
		}
	}
	return "", ""
}

var anyFlag = regexp.MustCompile(`--([a-z0-9-]+)`)
