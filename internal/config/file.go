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
	"os"
	"regexp"
	"strconv"
	"strings"

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
	byKey   map[string]string // setting key → flag (Keys)
	known   map[string]bool   // the flag names a file may use as keys
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
	cf := &File{path: path, values: map[string]*yaml.Node{}, lines: map[string]int{}, used: map[string]bool{}, written: map[string]string{}, byKey: byKey, known: known}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return cf, nil // an empty file sets nothing
		}
		line, msg := syntaxErrorLine(data, err)
		return nil, &Error{Path: path, Line: line, Msg: "not valid YAML: " + msg + quoteHint(data, line)}
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
		if flag, ok := byKey[key]; ok { // a key by its whole name: source.slot, tables
			if err := cf.set(flag, key, v, k.Line); err != nil {
				return nil, err
			}
			continue
		}
		if v.Kind == yaml.MappingNode && cf.isSection(key) { // a section; a flag of the same name (delivery, format) takes a scalar
			if err := cf.section(key, v); err != nil {
				return nil, err
			}
			continue
		}
		switch {
		case key == "config":
			return nil, &Error{Path: path, Line: k.Line, Msg: "key \"config\" cannot be set in a config file (use --config or CDC_RELAY_CONFIG)"}
		case strings.HasPrefix(key, "-"):
			return nil, &Error{Path: path, Line: k.Line, Msg: fmt.Sprintf("key %q: write flag names without the dashes, e.g. %q", key, strings.TrimLeft(key, "-"))}
		case !known[key]:
			msg := fmt.Sprintf("unknown key %q", key)
			if s := cf.suggestKey(key, ""); s != "" {
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

// isKeyOrSection reports whether path is a setting's key or a section.
func (cf *File) isKeyOrSection(path string) bool {
	_, ok := cf.byKey[path]
	return ok || cf.isSection(path)
}

// suggestEntryKey returns the key of a table entry nearest to word, an
// unknown key an entry wrote (colums: columns), or "".
func (cf *File) suggestEntryKey(word string) string {
	cands := map[string]string{"name": "name"}
	for k, flag := range cf.byKey {
		rest, ok := strings.CutPrefix(k, TableSection)
		if !ok {
			continue
		}
		cands[rest], cands[flag] = rest, rest
		if sec, _, nested := strings.Cut(rest, "."); nested {
			cands[sec] = sec
		}
	}
	return suggest(word, cands)
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
		if s := cf.suggestKey(key, prefix); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		return &Error{Path: cf.path, Line: k.Line, Msg: msg + "; docs/configuration.md lists every key"}
	}
	return nil
}

// suggestKey returns the key or flag name nearest to word, an unknown key
// the file wrote at the top level (prefix "") or in section prefix (word is
// then its whole key: source.slott), or "" when none is near. At the top
// level a section (sources: source), a key's last part (metrics_port:
// operations.metrics_addr) and a flag name count too.
func (cf *File) suggestKey(word, prefix string) string {
	cands := map[string]string{}
	for k := range cf.byKey {
		cands[k] = k
		for i := strings.IndexByte(k, '.'); i >= 0; i = next(k, i) {
			cands[k[:i]] = k[:i] // a section
		}
		if prefix == "" {
			cands[k[strings.LastIndexByte(k, '.')+1:]] = k
		}
	}
	if prefix == "" {
		for f := range cf.known {
			if _, isKey := cands[f]; !isKey {
				cands[f] = f
			}
		}
	}
	return suggest(word, cands)
}

// next returns the index of the dot after the one at i in k, or -1.
func next(k string, i int) int {
	j := strings.IndexByte(k[i+1:], '.')
	if j < 0 {
		return -1
	}
	return i + 1 + j
}

// flowValue is a line whose value begins as a YAML flow mapping or list
// ({…} or […]) and goes on after it closes: a topic template written bare.
var flowValue = regexp.MustCompile(`^(\s*(?:- )?[\w.-]+:\s*)([{\[][^#]*?)\s*(?:#.*)?$`)

// quoteHint is what to add to a syntax error on line (1-based) of data
// when that line's value starts with { or [ but is no mapping or list, as
// '{aggregate_type}.events' is not: quote it.
func quoteHint(data []byte, line int) string {
	lines := strings.Split(string(data), "\n")
	if line < 1 || line > len(lines) {
		return ""
	}
	m := flowValue.FindStringSubmatch(lines[line-1])
	if m == nil {
		return ""
	}
	return fmt.Sprintf(" (a value that begins with { or [ is a YAML mapping or list: quote it, %s'%s')", strings.TrimSpace(m[1])+" ", m[2])
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
		return nil, &Error{Path: cf.path, Line: v.Line, Msg: cf.written[flag.Name] + ": " + err.Error()}
	}
	cf.used[flag.Name] = true
	return val, nil
}

// TableEntry is one entry of the file's table list: a table's name, and
// for an entry written as a mapping ({name: schema.table, topic: …}) the
// settings it overrides for that table (see cli.RunCmd.forTable).
type TableEntry struct {
	Name      string
	Line      int
	Overrides map[string]*yaml.Node // flag → value, without name
	Written   map[string]string     // flag → the key as the entry wrote it
}

// TableEntries reads the table key: a name, a list of names, or a list
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
		case cf.known[path] || cf.isKeyOrSection(path):
			flag = path // a flag name, or another section's key: forTable refuses it by name
		default:
			msg := fmt.Sprintf("table %s: unknown key %q", e.Name, path)
			if e.Name == "" {
				msg = fmt.Sprintf("table: unknown key %q", path)
			}
			if s := cf.suggestEntryKey(path); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			return &Error{Path: cf.path, Line: v.Content[i].Line, Msg: msg + "; an entry of the tables list takes name and the keys of section outbox (topic, columns: {aggregate_id: …}, on_error …)"}
		}
		if _, dup := e.Written[flag]; dup {
			return &Error{Path: cf.path, Line: val.Line, Msg: fmt.Sprintf("table: key %q sets what %q already sets: keep one", path, e.Written[flag])}
		}
		e.Overrides[flag], e.Written[flag] = val, path
	}
	return nil
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

// FromFile returns the first flag named in msg whose value came from the
// file, and where, by the key as the file wrote it: "key delivery.mode in
// config file relay.yaml, line 4". It returns "", "" when none did (cf may be
// nil: no file).
func (cf *File) FromFile(msg string) (flag, where string) {
	if cf == nil {
		return "", ""
	}
	for _, m := range anyFlag.FindAllStringSubmatch(msg, -1) {
		if cf.used[m[1]] {
			return m[1], fmt.Sprintf("key %s in config file %s, line %d", cf.written[m[1]], cf.path, cf.lines[m[1]])
		}
	}
	return "", ""
}

var anyFlag = regexp.MustCompile(`--([a-z0-9-]+)`)
