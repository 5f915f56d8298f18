package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alecthomas/kong"

	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/relay"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/setting"
	"github.com/cdc-relay/cdc-relay/internal/sink"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/waitlog"
)

// TestLibrariesNameKeyFlagAndVariable: what a library writes, an error or a
// log line, names a setting by its key, flag and environment variable when
// the command line's Namer (runNames) configured it, however the error is
// wrapped and whatever configuration the setting is nested in.
func TestLibrariesNameKeyFlagAndVariable(t *testing.T) {
	valid := relay.Config{PGURL: "postgres://u@127.0.0.1:1/app", Slot: "s", Publication: "p",
		Decoder: decoder.Config{Schema: "public", Table: "outbox", Columns: decoder.DefaultColumns()},
		Topic:   "t", Sink: sink.Config{Brokers: []string{"k:9092"}}, Names: runNames}
	tests := []struct {
		name string
		text func(t *testing.T) string // the library's text, made with runNames
		want string
	}{
		{"relay's field error", func(t *testing.T) string {
			c := valid
			c.Slot = "Bad"
			return fmt.Sprint(c.Validate())
		}, `slot name "Bad" is invalid: use lowercase letters, digits and underscores, at most 63 source.slot (--slot / CDC_RELAY_SLOT)`},
		{"decoder's field error, nested in the relay's", func(t *testing.T) string {
			c := valid
			c.Decoder.Columns.AggregateID = ""
			return fmt.Sprint(c.Validate())
		}, "new decoder: column name is empty: set it outbox.columns.aggregate_id (--column-aggregate-id / CDC_RELAY_COLUMN_AGGREGATE_ID)"},
		{"sink's field error", func(t *testing.T) string {
			_, err := sink.Open(t.Context(), sink.Config{Names: runNames.Within("Sink")})
			return fmt.Sprint(err)
		}, "no Kafka brokers configured: set them kafka.brokers (--kafka-brokers / CDC_RELAY_KAFKA_BROKERS)"},
		{"router's hint, wrapped by the command line", func(t *testing.T) string {
			f := KafkaFlags{Topic: "outbox.$1"}
			return fmt.Sprint(f.validateTopic())
		}, `--topic (CDC_RELAY_TOPIC) topic template "outbox.$1": "$1" refers to a group of the topic regex outbox.topic_regex (--topic-regex / CDC_RELAY_TOPIC_REGEX), which is not set`},
		{"replication's hint", func(t *testing.T) string {
			return replication.ConnectError("postgres://u:secret@127.0.0.1:1/app", errors.New("dial tcp: connection refused"), runNames).Error()
		}, "connect to Postgres postgres://u:REDACTED@127.0.0.1:1/app (check the Postgres URL source.pg_url (--pg-url / CDC_RELAY_PG_URL)): dial tcp: connection refused"},
		{"a setting with the value asked for", func(t *testing.T) string { return runNames.Name("Backfill") },
			"delivery.on_slot_loss=backfill (--on-slot-loss=backfill / CDC_RELAY_ON_SLOT_LOSS=backfill)"},
		{"a field set by two settings", func(t *testing.T) string { return runNames.Within("Decoder").Name("JSON") },
			"outbox.key_encoding (--key-encoding / CDC_RELAY_KEY_ENCODING), outbox.value_encoding (--value-encoding / CDC_RELAY_VALUE_ENCODING)"},
		{"a command to run", func(t *testing.T) string { return runNames.Command("dlq replay", "id", "<dead_letter_id>") },
			"cdc-relay dlq replay --id <dead_letter_id>"},
		{"sink's log hint while the brokers do not answer", func(t *testing.T) string {
			// Open waits for the brokers, logging the wait after
			// waitlog.First; the line is awaited, then the wait ended.
			var buf syncBuffer
			ctx, cancel := context.WithCancel(t.Context())
			opened := make(chan error, 1)
			go func() {
				_, err := sink.Open(ctx, sink.Config{Brokers: []string{closedAddr(t)}, Names: runNames.Within("Sink"),
					Logger: NewLogger(&buf, "info", "json")})
				opened <- err
			}()
			testenv.Eventually(t, waitlog.First+30*time.Second, func() error {
				if !strings.Contains(buf.String(), "waiting for Kafka brokers") {
					return errors.New("no line about the wait yet")
				}
				return nil
			})
			cancel()
			if err := <-opened; err == nil {
				t.Error("sink.Open reached a closed port")
			}
			return buf.String()
		}, `check the brokers kafka.brokers (--kafka-brokers / CDC_RELAY_KAFKA_BROKERS)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.text(t); !strings.Contains(got, tt.want) {
				t.Errorf("got  %q\nwant %q in it", got, tt.want)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for the logger's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestFieldErrorKeepsThePath: a library's field error keeps the full path of
// the setting in relay.Config for errors.As, nested however deep.
func TestFieldErrorKeepsThePath(t *testing.T) {
	c := relay.Config{PGURL: "postgres://u@127.0.0.1:1/app", Slot: "s", Publication: "p",
		Decoder: decoder.Config{Schema: "public", Table: "outbox", Columns: decoder.DefaultColumns(),
			HeaderColumns: map[string]string{"c": ""}}, Names: runNames}
	var fe *setting.FieldError
	if err := c.Validate(); !errors.As(err, &fe) || fe.Field != "Decoder.HeaderColumns" {
		t.Fatalf("Validate = %v, want a FieldError of Decoder.HeaderColumns", err)
	}
	if _, ok := runFlags[fe.Field]; !ok {
		t.Errorf("runFlags does not map %q", fe.Field)
	}
}

// TestLibraryFieldsHaveFlags: every configuration field a library package
// names, through its Namer's Errorf or Name (directly, through a helper of
// its package, or as a Field/TableField value handed to replication), has a
// run setting, so the operator reads a key and flag and never "(setting X)".
// It reads the packages' source, where a field is named relative to the
// package's own configuration ("Columns.ID" in the decoder, "Decoder.Columns.ID"
// in the relay): it must be a key of runFlags or the end of one. A new field
// named anywhere fails here until runFlags maps it.
func TestLibraryFieldsHaveFlags(t *testing.T) {
	named := namedLibraryFields(t)
	if len(named) < 20 { // the scan itself must work: today's sources name ~30
		t.Fatalf("found only %d named fields: %v", len(named), named)
	}
	// The scan finds the Namer in each way a package holds it: a Config
	// field (sink, gaps' Setup), a field of its own (route), a parameter
	// (decoder, replication's helper).
	for _, f := range []string{"Brokers", "Snapshot", "TopicRegex", "Columns.ID", "PGURL"} {
		if _, ok := named[f]; !ok {
			t.Errorf("the scan did not find the field %q the library packages name", f)
		}
	}
	for field, at := range named {
		found := false
		for k := range runFlags {
			found = found || k == field || strings.HasSuffix(k, "."+field)
		}
		if !found {
			t.Errorf("%s names field %q, which runFlags does not map to a setting", at, field)
		}
	}
}

// namedLibraryFields returns the fields named in the non-test sources of the
// library packages (internal/ but cli, the test and tool packages, and
// consumer/), each with where it is named.
func namedLibraryFields(t *testing.T) map[string]string {
	t.Helper()
	skip := map[string]bool{"cli": true, "testenv": true, "sandbox": true, "verify": true, "chaos": true, "testdata": true}
	var dirs []string
	for _, root := range []string{"..", filepath.Join("..", "..", "consumer")} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if path != root && skip[d.Name()] {
					return filepath.SkipDir
				}
				dirs = append(dirs, path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	named := map[string]string{}
	for _, dir := range dirs {
		scanFieldNames(t, dir, named)
	}
	return named
}

// scanFieldNames adds to named the fields the package in dir names.
func scanFieldNames(t *testing.T, dir string, named map[string]string) {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	pkgs := map[string][]*ast.File{} // by package name: the sources of one directory
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		pkgs[f.Name.Name] = append(pkgs[f.Name.Name], f)
	}
	for _, files := range pkgs {
		// Package-level string constants and string-slice/array variables.
		values := map[string][]string{}
		for _, f := range files {
			for _, decl := range f.Decls {
				gd, ok := decl.(*ast.GenDecl)
				if !ok {
					continue
				}
				for _, spec := range gd.Specs {
					vs, ok := spec.(*ast.ValueSpec)
					if !ok {
						continue
					}
					for i, name := range vs.Names {
						if i < len(vs.Values) {
							values[name.Name] = stringsOf(vs.Values[i])
						}
					}
				}
			}
		}
		// Helpers of the package that pass a parameter on as the field, by
		// the parameter's index.
		helpers := map[string]int{}
		for _, f := range files {
			for _, decl := range f.Decls {
				fd, ok := decl.(*ast.FuncDecl)
				if !ok || fd.Type.Params == nil {
					continue
				}
				var params []string
				for _, p := range fd.Type.Params.List {
					for _, id := range p.Names {
						params = append(params, id.Name)
					}
				}
				ast.Inspect(fd, func(n ast.Node) bool {
					if call, ok := n.(*ast.CallExpr); ok && namesField(call, nil) && len(call.Args) > 0 {
						if id, ok := call.Args[0].(*ast.Ident); ok {
							if i := slices.Index(params, id.Name); i >= 0 {
								helpers[fd.Name.Name] = i
							}
						}
					}
					return true
				})
			}
		}
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.KeyValueExpr: // replication.Column{Field: "..."}, SetupConfig{TableField: "..."}
					if k, ok := n.Key.(*ast.Ident); ok && (k.Name == "Field" || k.Name == "TableField") {
						for _, s := range stringsOf(n.Value) {
							named[s] = fset.Position(n.Pos()).String()
						}
					}
				case *ast.CallExpr:
					if !namesField(n, helpers) {
						return true
					}
					i := 0
					if id, ok := n.Fun.(*ast.Ident); ok {
						i = helpers[id.Name]
					}
					if len(n.Args) <= i {
						return true
					}
					arg := n.Args[i]
					if ix, ok := arg.(*ast.IndexExpr); ok {
						arg = ix.X
					}
					var fields []string
					switch a := arg.(type) {
					case *ast.BasicLit:
						fields = stringsOf(a)
					case *ast.Ident:
						fields = values[a.Name]
					case *ast.SelectorExpr: // c.Field, cfg.TableField: found where they are set
						if a.Sel.Name == "Field" || a.Sel.Name == "TableField" {
							return true
						}
					}
					pos := fset.Position(n.Pos()).String()
					if len(fields) == 0 {
						if _, helper := helpers[enclosingHelper(f, n)]; helper && isParam(f, n, arg) {
							return true // the helper's own call: its callers are scanned
						}
						t.Errorf("%s: cannot tell which field this names; use a string constant", pos)
					}
					for _, s := range fields {
						named[s] = pos
					}
				}
				return true
			})
		}
	}
}

// namesField reports whether call is the Errorf or Name of a setting.Namer
// (by convention an identifier or field called names or Names, perhaps
// Within a field) or a helper of the package that passes one of its
// parameters to one of them.
func namesField(call *ast.CallExpr, helpers map[string]int) bool {
	switch fn := call.Fun.(type) {
	case *ast.SelectorExpr:
		return (fn.Sel.Name == "Errorf" || fn.Sel.Name == "Name") && isNamer(fn.X)
	case *ast.Ident:
		_, ok := helpers[fn.Name]
		return ok
	}
	return false
}

// isNamer reports whether e is a setting.Namer by the convention of its
// name: names, x.Names, or one of them Within a field.
func isNamer(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name == "names" || e.Name == "Names"
	case *ast.SelectorExpr:
		return e.Sel.Name == "names" || e.Sel.Name == "Names"
	case *ast.CallExpr:
		sel, ok := e.Fun.(*ast.SelectorExpr)
		return ok && sel.Sel.Name == "Within" && isNamer(sel.X)
	}
	return false
}

// stringsOf returns the string literals of e: a literal, or the elements of
// a composite literal.
func stringsOf(e ast.Expr) []string {
	switch e := e.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(e.Value); err == nil && e.Kind == token.STRING {
			return []string{s}
		}
	case *ast.CompositeLit:
		var out []string
		for _, el := range e.Elts {
			out = append(out, stringsOf(el)...)
		}
		return out
	}
	return nil
}

// enclosingHelper returns the name of the function of f that holds n.
func enclosingHelper(f *ast.File, n ast.Node) string {
	for _, decl := range f.Decls {
		if fd, ok := decl.(*ast.FuncDecl); ok && fd.Pos() <= n.Pos() && n.End() <= fd.End() {
			return fd.Name.Name
		}
	}
	return ""
}

// isParam reports whether arg is a parameter of the function of f that
// holds n.
func isParam(f *ast.File, n ast.Node, arg ast.Expr) bool {
	id, ok := arg.(*ast.Ident)
	if !ok {
		return false
	}
	name := id.Name
	for _, decl := range f.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok || fd.Pos() > n.Pos() || n.End() > fd.End() {
			continue
		}
		for _, p := range fd.Type.Params.List {
			for _, id := range p.Names {
				if id.Name == name {
					return true
				}
			}
		}
	}
	return false
}

// TestFieldTagsResolve: every field tag of every command's settings, every
// field runFlags maps, and every Within("X") of the command line's sources
// names a field of the library configurations (namedConfig), so none can
// drift from the struct it names, as OpenDeadLetters (relay.Config has
// DeadLetter), Sink.ContentType (sink.Config has none) and Admin.* (not in
// relay.Config) once did.
func TestFieldTagsResolve(t *testing.T) {
	root := reflect.TypeOf(namedConfig{})
	for _, bad := range []string{"OpenDeadLetters", "Sink.ContentType", "Admin.Nope", "Slot.X"} {
		if _, err := fieldPath(root, bad); err == nil {
			t.Errorf("fieldPath resolves %q, which names no field", bad)
		}
	}
	tags := 0
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, f := range n.Flags {
			for _, field := range strings.Split(f.Tag.Get("field"), ",") {
				if field == "" {
					continue
				}
				tags++
				path, _, _ := strings.Cut(field, "=")
				if _, err := fieldPath(root, path); err != nil {
					t.Errorf("%s --%s: field tag %q: %v", n.FullPath(), f.Name, field, err)
				}
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(helpModel(t).Node)
	if tags < 40 {
		t.Fatalf("found %d field tags; the walk must reach every command's flags", tags)
	}
	for field := range runFlags {
		if _, err := fieldPath(root, field); err != nil {
			t.Errorf("runFlags: %v", err)
		}
	}
	within := regexp.MustCompile(`Within\("([A-Za-z.]+)"\)`)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range within.FindAllStringSubmatch(string(src), -1) {
			found++
			if ft, err := fieldPath(root, m[1]); err != nil {
				t.Errorf("%s: Within(%q): %v", name, m[1], err)
			} else if ft.Kind() != reflect.Struct {
				t.Errorf("%s: Within(%q) names a %s, not a configuration", name, m[1], ft)
			}
		}
	}
	if found < 5 {
		t.Fatalf("found %d Within calls in the command line's sources", found)
	}
}
