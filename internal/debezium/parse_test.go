package debezium

import (
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestParseConnectorConfig(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want map[string]string
	}{
		{"json with wrapper", `{"name": "orders", "config": {"connector.class": "x", "tasks.max": 1, "b": true, "n": null}}`,
			map[string]string{"name": "orders", "connector.class": "x", "tasks.max": "1", "b": "true"}},
		{"json wrapper name inside config wins", `{"name": "outer", "config": {"name": "inner"}}`, map[string]string{"name": "inner"}},
		{"json bare", ` {"connector.class": "x", "database.port": 5432}`, map[string]string{"connector.class": "x", "database.port": "5432"}},
		{"properties separators", "a=1\nb: 2\nc 3\nd   =   4  \ne=\n", map[string]string{"a": "1", "b": "2", "c": "3", "d": "4  ", "e": ""}},
		{"properties comments and blanks", "# c\n! c\n\n   \n  a = 1\n", map[string]string{"a": "1"}},
		{"properties continuation", "list=a,\\\n    b,\\\n    c\nnext=x\n", map[string]string{"list": "a,b,c", "next": "x"}},
		{"properties even backslashes do not continue", "a=x\\\\\nb=y\n", map[string]string{"a": `x\`, "b": "y"}},
		{"properties escapes", `k\=ey\:x=t\tn\u00e9\\ \= z` + "\n", map[string]string{"k=ey:x": "t\tné\\ = z"}},
		{"properties escaped space in key", `a\ b=c` + "\n", map[string]string{"a b": "c"}},
		{"properties crlf and last wins", "a=1\r\na=2\r\n", map[string]string{"a": "2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseConnectorConfig([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestParseConnectorConfigErrors(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"bad json", `{"a": `, "not valid JSON"},
		{"config not object", `{"config": "x"}`, `"config" must be an object`},
		{"stray key", `{"name": "n", "config": {}, "tasks": []}`, `unexpected key "tasks"`},
		{"nested value", `{"a": {"b": 1}}`, "property a: want a string"},
		{"bad unicode escape", "a=\\u12\n", "line 1: property a: malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConnectorConfig([]byte(tt.in))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestResolveIndirections(t *testing.T) {
	dir := t.TempDir()
	secrets := filepath.Join(dir, "secrets.properties")
	if err := os.WriteFile(secrets, []byte("password=s3cr:et\nuser = relay\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"PGHOST": "db.internal"}
	getenv := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	tests := []struct {
		name    string
		in      map[string]string
		want    map[string]string
		wantErr string
	}{
		{"file and env", map[string]string{"p": "${file:" + secrets + ":password}", "h": "${env:PGHOST}:5432", "u": "${file:" + secrets + ":user}"},
			map[string]string{"p": "s3cr:et", "h": "db.internal:5432", "u": "relay"}, ""},
		{"routedByValue is not an indirection", map[string]string{"r": "outbox.event.${routedByValue}"}, map[string]string{"r": "outbox.event.${routedByValue}"}, ""},
		{"unset env", map[string]string{"database.password": "${env:NOPE}"}, nil, "database.password: cannot resolve ${env:NOPE}: environment variable NOPE is not set"},
		{"missing key", map[string]string{"database.user": "${file:" + secrets + ":nope}"}, nil, `database.user: cannot resolve`},
		{"missing file", map[string]string{"database.user": "${file:/nonexistent/x.properties:a}"}, nil, "database.user: cannot resolve ${file:/nonexistent/x.properties:a}: read /nonexistent"},
		{"unknown provider", map[string]string{"x": "${vault:secret/db:pw}"}, nil, `x: cannot resolve ${vault:secret/db:pw}: config provider "vault"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			unresolved := resolveIndirections(tt.in, getenv)
			var got []string
			for _, k := range slices.Sorted(maps.Keys(unresolved)) {
				got = append(got, k+": "+unresolved[k])
			}
			if tt.wantErr != "" {
				if len(got) != 1 || !strings.Contains(got[0], tt.wantErr) {
					t.Fatalf("unresolved %q, want one containing %q", got, tt.wantErr)
				}
				return
			}
			if len(got) > 0 {
				t.Fatal(got)
			}
			if !reflect.DeepEqual(tt.in, tt.want) {
				t.Errorf("got %q, want %q", tt.in, tt.want)
			}
		})
	}
}
