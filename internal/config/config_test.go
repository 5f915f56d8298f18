package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	yaml "go.yaml.in/yaml/v3"
)

func TestClosestKey(t *testing.T) {
	known := map[string]bool{"pg-url": true, "pg-url-file": true, "kafka-brokers": true, "topic": true, "slot": true, "retry-cap": true}
	tests := []struct{ key, want string }{
		{"pg-ulr", "pg-url"},
		{"pgurl", "pg-url"},
		{"kafka-broker", "kafka-brokers"},
		{"brokers", "kafka-brokers"},
		{"topics", "topic"},
		{"slots", "slot"},
		{"retry_cap", "retry-cap"},
		{"colour", ""},
		{"x", ""},
	}
	for _, tt := range tests {
		if got := Closest(tt.key, known); got != tt.want {
			t.Errorf("Closest(%q) = %q, want %q", tt.key, got, tt.want)
		}
	}
}

// TestDeclSet: a table entry's value reaches the declared field as the flag
// would take it, and a value of the wrong kind is refused with a reason.
func TestDeclSet(t *testing.T) {
	type section struct {
		Topic   string        `key:"outbox.topic"`
		OnError string        `key:"outbox.on_error" enum:"dlq,halt"`
		Headers []string      `key:"outbox.header_columns"`
		Wait    time.Duration `key:"outbox.wait"`
		On      bool          `key:"outbox.on"`
		N       int           `key:"outbox.n"`
	}
	type command struct {
		section `embed:""`
	}
	decls := Declarations(reflect.TypeOf(command{}))
	if len(decls) != 6 || decls["outbox.on_error"].Flag != "on-error" || decls["outbox.header_columns"].Flag != "headers" {
		t.Fatalf("declarations %v", decls)
	}
	for _, tt := range []struct {
		key, yaml string
		get       func(command) any
		want      any
		err       string
	}{
		{"outbox.topic", "a.b", func(c command) any { return c.Topic }, "a.b", ""},
		{"outbox.on_error", "halt", func(c command) any { return c.OnError }, "halt", ""},
		{"outbox.on_error", "retry", nil, nil, `"retry": want one of dlq, halt`},
		{"outbox.header_columns", "[a, b=x]", func(c command) any { return c.Headers }, []string{"a", "b=x"}, ""},
		{"outbox.header_columns", "a,b=x", func(c command) any { return c.Headers }, []string{"a", "b=x"}, ""},
		{"outbox.header_columns", "{a: b}", nil, nil, "want a list"},
		{"outbox.wait", "1m30s", func(c command) any { return c.Wait }, 90 * time.Second, ""},
		{"outbox.wait", "5", nil, nil, "want a Go duration"},
		{"outbox.on", "true", func(c command) any { return c.On }, true, ""},
		{"outbox.topic", "[a]", nil, nil, "want a single value, not a list"},
		{"outbox.n", "3", func(c command) any { return c.N }, 3, ""},
		{"outbox.n", "three", nil, nil, `want a whole number, got "three"`},
		{"outbox.on", "yes", nil, nil, `want true or false, got "yes"`},
		{"outbox.on", "1", nil, nil, `want true or false, got "1"`},
	} {
		t.Run(tt.key+"="+tt.yaml, func(t *testing.T) {
			var doc yaml.Node
			if err := yaml.Unmarshal([]byte(tt.yaml), &doc); err != nil {
				t.Fatal(err)
			}
			var c command
			err := decls[tt.key].Set(reflect.ValueOf(&c), doc.Content[0])
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("Set = %v, want an error containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.get(c); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %#v, want %#v", got, tt.want)
			}
		})
	}
}

// TestOneConverter: a table entry (Decl.Set) and the file or --set (Value,
// what kong is given) read a YAML value alike: both take it or both refuse
// it with the same reason.
func TestOneConverter(t *testing.T) {
	type settings struct {
		S  string        `key:"a.s"`
		B  bool          `key:"a.b"`
		N  int           `key:"a.n"`
		F  float64       `key:"a.f"`
		D  time.Duration `key:"a.d"`
		L  []string      `key:"a.l"`
		NL []int         `key:"a.nl"`
	}
	decls := Declarations(reflect.TypeOf(settings{}))
	for _, key := range []string{"a.s", "a.b", "a.n", "a.f", "a.d", "a.l", "a.nl"} {
		for _, text := range []string{"x", "true", "yes", "1", "010", "-3", "2.5", "10s", "5", "[a, b]", "[1, 2]", "a,b", "{k: v}", `"true"`} {
			t.Run(key+"="+text, func(t *testing.T) {
				var doc yaml.Node
				if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
					t.Fatal(err)
				}
				d := decls[key]
				_, verr := Value(doc.Content[0], d.Type)
				var s settings
				serr := d.Set(reflect.ValueOf(&s), doc.Content[0])
				if fmt.Sprint(verr) != fmt.Sprint(serr) {
					t.Errorf("Value: %v; Decl.Set: %v", verr, serr)
				}
			})
		}
	}
}

// TestSuggest: an unknown word gets the nearest key, dashes and underscores
// alike, a key winning a tie with a flag name; nothing when none is near.
func TestSuggest(t *testing.T) {
	cands := map[string]string{"pg-url": "pg-url", "source.pg_url": "source.pg_url", "pg_url": "source.pg_url",
		"metrics-addr": "metrics-addr", "metrics_addr": "operations.metrics_addr", "source": "source", "topic": "topic", "outbox.topic": "outbox.topic"}
	for _, tt := range []struct{ word, want string }{
		{"pg_url", "source.pg_url"},
		{"pg-ulr", "pg-url"},
		{"metrics_port", "operations.metrics_addr"},
		{"sources", "source"},
		{"colour", ""},
	} {
		if got := suggest(tt.word, cands); got != tt.want {
			t.Errorf("suggest(%q) = %q, want %q", tt.word, got, tt.want)
		}
	}
}

// TestWriteDocument: entries nest by key into sections in their order, a
// list is a flow sequence, and the document reads back to the same keys.
func TestWriteDocument(t *testing.T) {
	var b strings.Builder
	err := WriteDocument(&b, "head", []Entry{
		{Key: "source.slot", Value: "s1", Comment: "from slot.name"},
		{Key: "kafka.tls.enabled", Value: true},
		{Key: "source.publication", Value: "p"},
		{Key: "outbox.header_columns", Value: []string{"a", "b=x"}, Comment: "from h"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `# head

source:
  slot: s1 # from slot.name
  publication: p
kafka:
  tls:
    enabled: true
outbox:
  header_columns: [a, b=x] # from h
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	if err := WriteDocument(&b, "", []Entry{{Key: "a.b", Value: 3}}); err == nil {
		t.Error("an int value was written; want an error")
	}
}

// TestCheck: each bound a declaration's check tag states is held, with the
// message its example completes, naming the flag.
func TestCheck(t *testing.T) {
	type settings struct {
		Interval time.Duration `key:"a.interval" check:"positive" example:"10s"`
		Retain   time.Duration `key:"a.retain" check:"zero=keep" example:"168h"`
		Buffer   int           `key:"a.buffer" check:"zero=the kernel's" example:"a size in KiB such as 32"`
		Bytes    int           `key:"a.bytes" check:"min=1024"`
	}
	good := settings{Interval: time.Second, Bytes: 1024}
	for _, tt := range []struct {
		name string
		set  func(*settings)
		want string
	}{
		{"all good", func(*settings) {}, ""},
		{"zero interval", func(s *settings) { s.Interval = 0 }, "--interval must be a positive duration such as 10s"},
		{"negative retention", func(s *settings) { s.Retain = -time.Second }, "--retain must be 0 (keep) or a positive duration such as 168h"},
		{"negative buffer", func(s *settings) { s.Buffer = -1 }, "--buffer must be 0 (the kernel's) or a size in KiB such as 32"},
		{"small bytes", func(s *settings) { s.Bytes = 1023 }, "--bytes must be at least 1024"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := good
			tt.set(&s)
			err := Check(&s, func(flag, problem string) error { return errors.New("--" + flag + " " + problem) })
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Check = %v, want nil", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Errorf("Check = %v, want %q", err, tt.want)
			}
		})
	}
}
