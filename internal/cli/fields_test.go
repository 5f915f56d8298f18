package cli

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// TestNameFlags: a library's field error reads as the run flag and its
// environment variable, however it is wrapped, and still unwraps.
func TestNameFlags(t *testing.T) {
	missing := errors.New("outbox column missing")
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"plain", setting.Errorf("Slot", "slot name %q is invalid", "Bad"),
			`slot name "Bad" is invalid (--slot / CDC_RELAY_SLOT)`},
		{"nested and wrapped", fmt.Errorf("start: %w", &replication.ConfigError{
			Err: setting.Within("Decoder", setting.Errorf("Columns.AggregateID", "%w: no column %q", missing, "agg"))}),
			`start: outbox column missing: no column "agg" (--column-aggregate-id / CDC_RELAY_COLUMN_AGGREGATE_ID)`},
		{"unknown field stays", setting.Errorf("Nope", "bad"), "bad (setting Nope)"},
		{"token in a hint, with the flag's value", fmt.Errorf("slot lost: restart with backfilling on %s", setting.Token("Backfill")),
			"slot lost: restart with backfilling on (--on-slot-loss=backfill / CDC_RELAY_ON_SLOT_LOSS=backfill)"},
		{"token of a nested library's own field", fmt.Errorf("reach Kafka (check the brokers %s)", setting.Token("Brokers")),
			"reach Kafka (check the brokers (--kafka-brokers / CDC_RELAY_KAFKA_BROKERS))"},
		{"field set by two flags", setting.Within("Decoder", setting.Errorf("JSON", "column %q unsupported", "c")),
			`column "c" unsupported (--value-encoding / CDC_RELAY_VALUE_ENCODING, --key-encoding / CDC_RELAY_KEY_ENCODING)`},
		{"no field error", errors.New("plain"), "plain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := nameFlags(tt.err, runFlags)
			if got.Error() != tt.want {
				t.Errorf("nameFlags = %q, want %q", got, tt.want)
			}
			if !errors.Is(got, tt.err) {
				t.Errorf("nameFlags(%v) does not unwrap to the original", tt.err)
			}
		})
	}
}

// TestLogsNameFlags: a library's log line that names a setting reads as the
// flag in the process log, JSON or console.
func TestLogsNameFlags(t *testing.T) {
	for _, format := range []string{"json", "console"} {
		var buf bytes.Buffer
		log := NewLogger(&buf, "info", format)
		log.Info().Msg("check the Postgres URL " + setting.Token("PGURL"))
		if !strings.Contains(buf.String(), "check the Postgres URL (--pg-url / CDC_RELAY_PG_URL)") {
			t.Errorf("%s log %q does not name the flag", format, buf.String())
		}
	}
}

// TestLibraryFieldsHaveFlags: every configuration field a library package
// names, in a setting.Errorf or a setting.Token (directly, through a helper of
// its package, or as a Field/TableField value handed to replication), has a
// run flag, so the operator reads a flag and never "(setting X)". It reads
// the packages' source: a new field named anywhere fails here until
// runFlags maps it.
func TestLibraryFieldsHaveFlags(t *testing.T) {
	named := libraryFields(t)
	if len(named) < 20 { // the scan itself must work: today's sources name ~30
		t.Fatalf("found only %d named fields: %v", len(named), named)
	}
	for field, at := range named {
		if _, ok := flagText(runFlags, field); !ok {
			t.Errorf("%s names field %q, which runFlags does not map to a flag (or matches several keys)", at, field)
		}
	}
}

// libraryFields returns the fields named in the non-test sources of the
// library packages (internal/ but cli, the test and tool packages, and
// consumer/), each with where it is named.
func libraryFields(t *testing.T) map[string]string {
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
		// Helpers of the package that pass a parameter on as the field.
		helpers := map[string]bool{}
		for _, f := range files {
			for _, decl := range f.Decls {
				fd, ok := decl.(*ast.FuncDecl)
				if !ok || fd.Type.Params == nil || len(fd.Type.Params.List) == 0 || len(fd.Type.Params.List[0].Names) == 0 {
					continue
				}
				first := fd.Type.Params.List[0].Names[0].Name
				ast.Inspect(fd, func(n ast.Node) bool {
					if call, ok := n.(*ast.CallExpr); ok && namesField(call, nil) && len(call.Args) > 0 {
						if id, ok := call.Args[0].(*ast.Ident); ok && id.Name == first {
							helpers[fd.Name.Name] = true
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
					if !namesField(n, helpers) || len(n.Args) == 0 {
						return true
					}
					arg := n.Args[0]
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
						if id, ok := arg.(*ast.Ident); ok && helpers[enclosingHelper(f, n)] && isParam(f, n, id.Name) {
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

// namesField reports whether call is setting.Errorf, setting.Token or a
// helper of the package that passes its first parameter to one of them.
func namesField(call *ast.CallExpr, helpers map[string]bool) bool {
	switch fn := call.Fun.(type) {
	case *ast.SelectorExpr:
		pkg, ok := fn.X.(*ast.Ident)
		return ok && pkg.Name == "setting" && (fn.Sel.Name == "Errorf" || fn.Sel.Name == "Token")
	case *ast.Ident:
		return helpers[fn.Name]
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

// isParam reports whether name is a parameter of the function of f that
// holds n.
func isParam(f *ast.File, n ast.Node, name string) bool {
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
