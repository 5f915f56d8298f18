package config

import (
	"errors"
	"fmt"
	"io"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// Entry is one setting of a document to write: its key, its value (a
// string, a bool, or a list), and a comment written after it.
type Entry struct {
	Key     string
	Value   any // string, bool or []string
	Comment string
}

// WriteDocument writes entries as a configuration file by key, in sections
// (source: {slot: …}), in their order, under the comment head. A list is
// written as a flow sequence ([a, b]).
func WriteDocument(w io.Writer, head string, entries []Entry) error {
	root := &yaml.Node{Kind: yaml.MappingNode}
	for _, e := range entries {
		parent, path := root, strings.Split(e.Key, ".")
		for _, sec := range path[:len(path)-1] {
			parent = sectionNode(parent, sec)
		}
		k := &yaml.Node{Kind: yaml.ScalarNode, Value: path[len(path)-1], LineComment: e.Comment}
		var v *yaml.Node
		switch x := e.Value.(type) {
		case bool:
			v = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: fmt.Sprint(x)}
		case string:
			v = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: x}
		case []string:
			v = &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle, LineComment: e.Comment}
			k.LineComment = "" // yaml.v3 drops a key's comment before a flow sequence
			for _, item := range x {
				v.Content = append(v.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: item})
			}
		default:
			return errors.New("write configuration: unexpected value type")
		}
		parent.Content = append(parent.Content, k, v)
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, HeadComment: head, Content: []*yaml.Node{root}}); err != nil {
		return fmt.Errorf("write configuration: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("write configuration: %w", err)
	}
	return nil
}

// sectionNode returns the mapping of section name in m, added at its end
// when m has none yet.
func sectionNode(m *yaml.Node, name string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == name && m.Content[i+1].Kind == yaml.MappingNode {
			return m.Content[i+1]
		}
	}
	sec := &yaml.Node{Kind: yaml.MappingNode}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: name}, sec)
	return sec
}
