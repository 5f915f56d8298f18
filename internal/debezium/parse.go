package debezium

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Reading a Kafka Connect connector configuration: the JSON users POST to
// Connect ({"name": …, "config": {…}} or the bare config object) or a Java
// .properties file, with Connect's ${file:…} and ${env:…} indirections
// resolved. The result is a flat map of property → value.

// parseConnectorConfig reads data as JSON when its first non-blank byte is
// '{', as Java properties otherwise.
func parseConnectorConfig(data []byte) (map[string]string, error) {
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
		return parseConnectorJSON(t)
	}
	return parseProperties(string(data))
}

// parseConnectorJSON reads a connector's JSON: the object POSTed to Connect's
// /connectors ({"name": …, "config": {…}}) or the bare config object PUT to
// /connectors/NAME/config. Numbers and booleans become their text, as Connect
// accepts them.
func parseConnectorJSON(data []byte) (map[string]string, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	obj := top
	var name string
	if raw, ok := top["config"]; ok {
		obj = nil // a fresh map: Unmarshal into top would merge
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, fmt.Errorf("\"config\" must be an object of property names to values: %w", err)
		}
		if raw, ok := top["name"]; ok {
			if err := json.Unmarshal(raw, &name); err != nil {
				return nil, fmt.Errorf("\"name\" must be a string: %w", err)
			}
		}
		for k := range top {
			if k != "config" && k != "name" {
				return nil, fmt.Errorf("unexpected key %q next to \"config\" (want {\"name\": …, \"config\": {…}})", k)
			}
		}
	}
	props := make(map[string]string, len(obj))
	for k, raw := range obj {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("property %s: %w", k, err)
		}
		switch x := v.(type) {
		case string:
			props[k] = x
		case json.Number:
			props[k] = x.String()
		case bool:
			props[k] = strconv.FormatBool(x)
		case nil:
			// Connect treats null as unset.
		default:
			return nil, fmt.Errorf("property %s: want a string, number or boolean, not %s", k, bytes.TrimSpace(raw))
		}
	}
	if _, ok := props["name"]; !ok && name != "" {
		props["name"] = name
	}
	return props, nil
}

// parseProperties reads Java properties syntax (java.util.Properties.load):
// key=value, key: value or key value; # and ! comment lines; a line ending in
// an odd number of backslashes continues on the next, whose leading blanks
// are dropped; escapes \t \n \r \f \uXXXX, and \c for any other c. A key set
// twice keeps its last value, as Java does.
func parseProperties(text string) (map[string]string, error) {
	props := map[string]string{}
	lines := strings.Split(strings.ReplaceAll(strings.ReplaceAll(text, "\r\n", "\n"), "\r", "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		lineNo := i + 1
		line := strings.TrimLeft(lines[i], " \t\f")
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		for continues(line) && i+1 < len(lines) {
			i++
			line = line[:len(line)-1] + strings.TrimLeft(lines[i], " \t\f")
		}
		if continues(line) { // a continuation at the end of the file
			line = line[:len(line)-1]
		}
		key, value, err := splitProperty(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", lineNo, err)
		}
		props[key] = value
	}
	return props, nil
}

// continues reports whether line ends in an odd number of backslashes.
func continues(line string) bool {
	n := 0
	for i := len(line) - 1; i >= 0 && line[i] == '\\'; i-- {
		n++
	}
	return n%2 == 1
}

// splitProperty splits a logical line into its unescaped key and value.
func splitProperty(line string) (key, value string, err error) {
	end := len(line)
	for i := 0; i < len(line); i++ {
		c := line[i]
		if c == '\\' {
			i++
			continue
		}
		if c == '=' || c == ':' || c == ' ' || c == '\t' || c == '\f' {
			end = i
			break
		}
	}
	rest := strings.TrimLeft(line[end:], " \t\f")
	if rest != "" && (rest[0] == '=' || rest[0] == ':') {
		rest = strings.TrimLeft(rest[1:], " \t\f")
	}
	if key, err = unescapeProperty(line[:end]); err != nil {
		return "", "", err
	}
	if value, err = unescapeProperty(rest); err != nil {
		return "", "", fmt.Errorf("property %s: %w", key, err)
	}
	return key, value, nil
}

// unescapeProperty resolves the backslash escapes of properties syntax.
func unescapeProperty(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch s[i] {
		case 't':
			b.WriteByte('\t')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 'f':
			b.WriteByte('\f')
		case 'u':
			if i+5 > len(s) {
				return "", fmt.Errorf("malformed \\uXXXX escape %q", s[i-1:])
			}
			r, err := strconv.ParseUint(s[i+1:i+5], 16, 16)
			if err != nil {
				return "", fmt.Errorf("malformed \\uXXXX escape %q", s[i-1:i+5])
			}
			b.WriteRune(rune(r))
			i += 4
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			b.WriteRune(r)
			i += size - 1
		}
	}
	return b.String(), nil
}

// indirection is a Kafka Connect config provider reference: ${provider:args}.
// Debezium's own ${routedByValue} has no provider and is not one.
var indirection = regexp.MustCompile(`\$\{([A-Za-z][A-Za-z0-9_]*):([^}]*)\}`)

// resolveIndirections replaces ${env:NAME} with the environment variable and
// ${file:/path:key} with key's value in the properties file /path, as
// Connect's EnvVarConfigProvider and FileConfigProvider do. It returns the
// properties it could not resolve, each with why; those keep their value.
func resolveIndirections(props map[string]string, getenv func(string) (string, bool)) map[string]string {
	files := map[string]map[string]string{}
	unresolved := map[string]string{}
	for k, v := range props {
		var firstErr error
		out := indirection.ReplaceAllStringFunc(v, func(ref string) string {
			m := indirection.FindStringSubmatch(ref)
			val, err := resolveOne(m[1], m[2], getenv, files)
			if err != nil && firstErr == nil {
				firstErr = fmt.Errorf("cannot resolve %s: %w", ref, err)
			}
			return val
		})
		if firstErr != nil {
			unresolved[k] = firstErr.Error()
			continue
		}
		props[k] = out
	}
	return unresolved
}

func resolveOne(provider, args string, getenv func(string) (string, bool), files map[string]map[string]string) (string, error) {
	switch provider {
	case "env":
		v, ok := getenv(args)
		if !ok {
			return "", fmt.Errorf("environment variable %s is not set", args)
		}
		return v, nil
	case "file":
		i := strings.LastIndexByte(args, ':')
		if i <= 0 {
			return "", fmt.Errorf("want ${file:/path/to/file.properties:key}")
		}
		path, key := args[:i], args[i+1:]
		kv, ok := files[path]
		if !ok {
			data, err := os.ReadFile(path)
			if err != nil {
				return "", fmt.Errorf("read %s: %w", path, err)
			}
			if kv, err = parseProperties(string(data)); err != nil {
				return "", fmt.Errorf("read %s: %w", path, err)
			}
			files[path] = kv
		}
		v, ok := kv[key]
		if !ok {
			return "", fmt.Errorf("key %q is not in %s", key, path)
		}
		return v, nil
	}
	return "", fmt.Errorf("config provider %q is not supported (cdc-relay resolves ${env:NAME} and ${file:/path:key})", provider)
}
