package config

import (
	"errors"
	"fmt"
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
	keys   map[string]string // flag → key
}

var _ kong.Resolver = (*Sets)(nil)

// LoadSets reads given, the --set flags' KEY=VALUE strings, against byKey,
// every setting's key → its flag (Keys); nil when none is given.
func LoadSets(given []string, byKey map[string]string) (*Sets, error) {
	if len(given) == 0 {
		return nil, nil
	}
	s := &Sets{values: map[string]*yaml.Node{}, keys: map[string]string{}}
	for _, kv := range given {
		key, text, ok := strings.Cut(kv, "=")
		flag, known := byKey[key]
		switch {
		case !ok:
			return nil, fmt.Errorf("--set %s: want KEY=VALUE, e.g. --set source.slot=orders", kv)
		case !known:
			msg := fmt.Sprintf("--set %s: unknown key %q", kv, key)
			names := map[string]bool{}
			for k := range byKey {
				names[k] = true
			}
			if c := Closest(key, names); c != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", c)
			}
			return nil, errors.New(msg + "; docs/configuration.md lists every key")
		case s.keys[flag] != "":
			return nil, fmt.Errorf("--set %s: %s is set twice", kv, key)
		}
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(text), &doc); err != nil || len(doc.Content) == 0 {
			doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.ScalarNode, Tag: "!!str", Value: text}}}
		}
		s.values[flag], s.keys[flag] = doc.Content[0], key
	}
	return s, nil
}

// Has reports whether a --set gave flag's value.
func (s *Sets) Has(flag string) bool { return s != nil && s.values[flag] != nil }

// Validate is part of kong.Resolver; the keys were checked when loaded.
func (s *Sets) Validate(*kong.Application) error { return nil }

// Resolve returns the --set value of flag, or nil when there is none.
func (s *Sets) Resolve(_ *kong.Context, _ *kong.Path, flag *kong.Flag) (any, error) {
	v, ok := s.values[flag.Name]
	if !ok || flag.Tag.Has("nofile") { // nofile: a flag of the same name and another meaning (dlq's --topic)
		return nil, nil
	}
	val, err := Value(v, flag.Target.Type())
	if err != nil {
		return nil, fmt.Errorf("--set %s: %w", s.keys[flag.Name], err)
	}
	return val, nil
}
