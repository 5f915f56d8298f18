package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/alecthomas/kong"
	yaml "go.yaml.in/yaml/v3"
)

// Sets are the --set key=value overlays, by flag: a kong.Resolver added
// after the files, so it wins over them, and that does not step aside for
// an environment variable, so it wins over those too. A flag given by name
// on the command line wins over it (kong resolves only unset flags).
type Sets struct {
	values map[string]*yaml.Node
	texts  map[string]string // flag → the value as given
	bad    map[string]error  // flag → why the value is not YAML
	keys   map[string]string // flag → key
	used   map[string]bool   // flags Resolve supplied a value for
}

var _ kong.Resolver = (*Sets)(nil)

// LoadSets reads given, the --set flags' KEY=VALUE strings, against byKey,
// every setting's key → its flag (Keys); nil when none is given. A setting's
// flag name is taken for its key (--set slot=orders), as the file takes it.
func LoadSets(given []string, byKey map[string]string) (*Sets, error) {
	if len(given) == 0 {
		return nil, nil
	}
	byFlag := make(map[string]string, len(byKey))
	for k, f := range byKey {
		byFlag[f] = k
	}
	s := &Sets{values: map[string]*yaml.Node{}, texts: map[string]string{}, bad: map[string]error{}, keys: map[string]string{}, used: map[string]bool{}}
	for _, kv := range given {
		key, text, ok := strings.Cut(kv, "=")
		if k, isFlag := byFlag[key]; isFlag {
			key = k
		}
		flag, known := byKey[key]
		switch {
		case !ok:
			return nil, fmt.Errorf("--set %s: want KEY=VALUE, e.g. --set source.slot=orders", kv)
		case !known:
			msg := fmt.Sprintf("--set %s: unknown key %q", kv, key)
			cands := map[string]string{}
			for k := range byKey {
				cands[k] = k
				cands[k[strings.LastIndexByte(k, '.')+1:]] = k // slott: source.slot
			}
			if c := suggest(key, cands); c != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", c)
			}
			return nil, errors.New(msg + "; docs/configuration.md lists every key")
		case s.keys[flag] != "":
			return nil, fmt.Errorf("--set %s: %s is set twice", kv, key)
		}
		var doc yaml.Node
		err := yaml.Unmarshal([]byte(text), &doc)
		if err != nil || len(doc.Content) == 0 {
			if err != nil {
				s.bad[flag] = err
			}
			doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.ScalarNode, Tag: "!!str", Value: text}}}
		}
		s.values[flag], s.texts[flag], s.keys[flag] = doc.Content[0], text, key
	}
	return s, nil
}

// SetError is a --set whose value is wrong for its setting. Its message
// stands alone: it names the --set as given.
type SetError struct {
	Given string // key=value
	Msg   string
}

// Error returns "--set key=value: " and the problem.
func (e *SetError) Error() string { return "--set " + e.Given + ": " + e.Msg }

// Has reports whether a --set gave flag's value.
func (s *Sets) Has(flag string) bool { return s != nil && s.values[flag] != nil }

// Validate is part of kong.Resolver; the keys were checked when loaded.
func (s *Sets) Validate(*kong.Application) error { return nil }

// Resolve returns the --set value of flag, or nil when there is none. A
// value that is not YAML is taken as it is ({aggregate_type}.events for a
// topic), except for a list that begins as a YAML list and is none
// ([a:1,b:2 is no broker "[a:1").
func (s *Sets) Resolve(_ *kong.Context, _ *kong.Path, flag *kong.Flag) (any, error) {
	v, ok := s.values[flag.Name]
	if !ok || flag.Tag.Has("nofile") { // nofile: a flag of the same name and another meaning (dlq's --topic)
		return nil, nil
	}
	t, text := flag.Target.Type(), s.texts[flag.Name]
	given := s.keys[flag.Name] + "=" + text
	if err := s.bad[flag.Name]; err != nil && t.Kind() == reflect.Slice && strings.HasPrefix(strings.TrimSpace(text), "[") {
		return nil, &SetError{Given: given, Msg: fmt.Sprintf("not a YAML list (%s): write [a, b] or a,b", strings.TrimPrefix(err.Error(), "yaml: "))}
	}
	if t.Kind() == reflect.String && v.Kind != yaml.ScalarNode {
		v = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: text} // {aggregate_type}.events is a template, not a mapping
	}
	val, err := Value(v, t)
	if err != nil {
		return nil, &SetError{Given: given, Msg: err.Error()}
	}
	s.used[flag.Name] = true
	return val, nil
}

// FromSet returns the first flag named in msg whose value a --set gave,
// and the --set as given ("--set kafka.max_in_flight_requests=9"); "", ""
// when none did (s may be nil: no --set).
func (s *Sets) FromSet(msg string) (flag, given string) {
	if s == nil {
		return "", ""
	}
	for _, m := range anyFlag.FindAllStringSubmatch(msg, -1) {
		if s.used[m[1]] {
			return m[1], "--set " + s.keys[m[1]] + "=" + s.texts[m[1]]
		}
	}
	return "", ""
}
