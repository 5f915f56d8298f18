package clidoc

import (
	"os"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/cdc-relay/cdc-relay/internal/cli"
)

// TestConfigurationReferenceCurrent fails when docs/configuration.md's flag
// reference differs from what the command line defines.
func TestConfigurationReferenceCurrent(t *testing.T) {
	const path = "../../docs/configuration.md"
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	doc, err := UpdateReference(string(old))
	if err != nil {
		t.Fatal(err)
	}
	if doc != string(old) {
		have, want := strings.Split(string(old), "\n"), strings.Split(doc, "\n")
		line := 0
		for line < len(have) && line < len(want) && have[line] == want[line] {
			line++
		}
		got, exp := "(end of file)", "(end of file)"
		if line < len(have) {
			got = have[line]
		}
		if line < len(want) {
			exp = want[line]
		}
		t.Fatalf("docs/configuration.md is stale: its flag reference differs from the flags internal/cli defines; run `make docs` (go run ./internal/clidoc/gendocs) and commit the result.\nFirst difference, line %d:\n  file:      %s\n  generated: %s", line+1, got, exp)
	}
}

// TestReferenceCoversEveryFlag checks the generated text against the model:
// every visible flag of every command appears with its environment variable,
// and a flag's kong group becomes a heading over it.
func TestReferenceCoversEveryFlag(t *testing.T) {
	var b strings.Builder
	if err := WriteReference(&b); err != nil {
		t.Fatal(err)
	}
	ref := b.String()
	for _, want := range []string{
		"### `cdc-relay run`", "### `cdc-relay dlq replay`", "### `cdc-relay config print`",
		"`--pg-url=URL` | `CDC_RELAY_PG_URL` | `source.pg_url` |",
		"`--[no-]create-slot` | `CDC_RELAY_CREATE_SLOT` | `source.create_slot` | `true` |",
		"| `--config=FILE` | `CDC_RELAY_CONFIG` | — |",
	} {
		if !strings.Contains(ref, want) {
			t.Errorf("reference lacks %q", want)
		}
	}
	app, err := cli.Model()
	if err != nil {
		t.Fatal(err)
	}
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, f := range visibleFlags(n.Flags) {
			if !strings.Contains(ref, "`--"+f.Name) && !strings.Contains(ref, "`--[no-]"+f.Name) {
				t.Errorf("cdc-relay %s: --%s missing from the reference", n.Path(), f.Name)
			}
			for _, env := range f.Envs {
				if !strings.Contains(ref, "`"+env+"`") {
					t.Errorf("cdc-relay %s: %s missing from the reference", n.Path(), env)
				}
			}
			if f.Group != nil && !strings.Contains(ref, "**"+groupTitle(f.Group)+"**") {
				t.Errorf("group %q of --%s has no heading", f.Group.Title, f.Name)
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(app.Node)
}

// TestReferenceGroups checks that flags with a kong group are listed under
// its title, in the order the groups first appear, and the rest after them;
// a command without groups gets one table with no heading.
func TestReferenceGroups(t *testing.T) {
	var grammar struct {
		Run struct {
			PGURL   string `name:"pg-url" group:"Postgres" help:"The database."`
			Brokers string `group:"Kafka" help:"The brokers."`
			Slot    string `group:"Postgres" default:"s" help:"The slot."`
			Other   bool   `help:"Something else."`
		} `cmd:"" help:"Run it."`
		Plain struct {
			Limit int `default:"5" help:"How many."`
		} `cmd:"" help:"No groups."`
	}
	k, err := kong.New(&grammar, kong.Name("x"), kong.DefaultEnvars("X"), kong.Exit(func(int) {}))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := writeReference(&b, k.Model.Node); err != nil {
		t.Fatal(err)
	}
	ref := b.String()
	order := []string{"### `x run`", "**Postgres**", "`--pg-url`", "`--slot`", "**Kafka**", "`--brokers`", "**Other flags**", "`--other`", "### `x plain`", "`--limit`"}
	at := 0
	for _, want := range order {
		i := strings.Index(ref[at:], want)
		if i < 0 {
			t.Fatalf("%q missing or out of order in:\n%s", want, ref)
		}
		at += i + len(want)
	}
	plain := ref[strings.Index(ref, "### `x plain`"):]
	if strings.Contains(plain, "**") {
		t.Errorf("a command without groups got a group heading:\n%s", plain)
	}
	if !strings.Contains(ref, "| `--slot` | `X_SLOT` | `slot` | `s` | The slot. |") {
		t.Errorf("--slot's row is not as expected:\n%s", ref)
	}
}
