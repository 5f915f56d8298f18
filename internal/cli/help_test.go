package cli

import (
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/cdc-relay/cdc-relay/internal/relay"
)

// helpModel returns the command line model as Run builds it (the parse of
// "version", which reads nothing).
func helpModel(t *testing.T) *kong.Application {
	t.Helper()
	clearEnv(t)
	var c CLI
	kctx, err := parse(&c, []string{"version"}, io.Discard, io.Discard, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	return kctx.Model
}

// commands returns every command of app that takes flags of its own, by its
// path ("dlq replay").
func commands(app *kong.Application) map[string]*kong.Node {
	out := map[string]*kong.Node{}
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		if n.Type == kong.CommandNode && len(n.Children) == 0 {
			out[commandPath(n)] = n
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(app.Node)
	return out
}

// ownFlags are n's flags without --help.
func ownFlags(n *kong.Node) []*kong.Flag {
	var out []*kong.Flag
	for _, f := range n.Flags {
		if f.Name != "help" {
			out = append(out, f)
		}
	}
	return out
}

// TestHelpGroups checks that every flag of the commands listed is in one of
// helpGroups (a flag without a group would be listed under "Flags:" with
// --help and --config, one with a misspelt key under a group of its own),
// that the groups come in the order given, and that no other command groups
// only some of its flags.
func TestHelpGroups(t *testing.T) {
	known := map[string]kong.Group{}
	for _, g := range helpGroups {
		if g.Title == "" || g.Description == "" || strings.Contains(g.Description, "\n") {
			t.Errorf("group %q: want a title and a one-line description, got %q, %q", g.Key, g.Title, g.Description)
		}
		known[g.Key] = g
	}
	cmds := commands(helpModel(t))
	tests := []struct {
		cmd    string
		groups []string // in the order --help lists them
	}{
		{"run", []string{"postgres", "kafka", "routing", "delivery", "operations"}},
		{"config print", []string{"postgres", "kafka", "routing", "delivery", "operations", "output"}},
		{"replay", []string{"postgres", "kafka", "routing", "selection", "replay"}},
		{"dlq replay", []string{"postgres", "kafka", "routing", "selection", "replay"}},
		{"dlq list", []string{"postgres", "selection", "output"}},
		{"dlq show", []string{"postgres", "selection", "output"}},
		{"dlq purge", []string{"postgres", "selection"}},
		{"dlq history", []string{"postgres", "selection", "output"}},
		{"status", []string{"postgres", "output"}},
		{"prune", []string{"postgres", "selection"}},
	}
	for _, tt := range tests {
		t.Run(tt.cmd, func(t *testing.T) {
			n := cmds[tt.cmd]
			if n == nil {
				t.Fatalf("no command %q", tt.cmd)
			}
			var order []string
			for _, f := range ownFlags(n) {
				switch {
				case f.Group == nil:
					t.Errorf("--%s is in no group", f.Name)
				case f.Group.Title != known[f.Group.Key].Title:
					t.Errorf("--%s is in group %q, which helpGroups lacks", f.Name, f.Group.Key)
				case !slices.Contains(order, f.Group.Key):
					order = append(order, f.Group.Key)
				}
			}
			if !slices.Equal(order, tt.groups) {
				t.Errorf("%s --help lists groups %v, want %v", tt.cmd, order, tt.groups)
			}
		})
		delete(cmds, tt.cmd)
	}
	for path, n := range cmds { // the rest: all flags in no group, or none
		grouped := 0
		for _, f := range ownFlags(n) {
			if f.Group != nil {
				grouped++
			}
		}
		if grouped > 0 && grouped < len(ownFlags(n)) {
			t.Errorf("%s: %d of its %d flags are in a group; put each in one, and the command in this test", path, grouped, len(ownFlags(n)))
		}
	}
}

// TestRunHelpShowsGroups checks the groups' titles in run --help, in order,
// and the example above them.
func TestRunHelpShowsGroups(t *testing.T) {
	clearEnv(t)
	err, out, _ := run(t, canceled(), "run", "--help")
	if err != nil {
		t.Fatal(err)
	}
	at := -1
	for _, want := range []string{"Example:", "    cdc-relay run \\", "\nFlags:\n", "\nPostgres:\n", "\nKafka:\n", "\nRouting and format:\n", "\nDelivery and failures:\n", "\nOperations:\n"} {
		i := strings.Index(out, want)
		if i <= at {
			t.Fatalf("run --help: %q missing or out of order:\n%s", want, out)
		}
		at = i
	}
}

var requiredHelp = regexp.MustCompile(`^Required\b`)

// TestRequiredMarkers checks which flags' help starts with "Required": those
// each command's Validate refuses to run without (a kong required tag would
// also refuse config print, which takes run's flags and checks nothing).
func TestRequiredMarkers(t *testing.T) {
	cmds := commands(helpModel(t))
	want := map[string][]string{
		"run":          {"pg-url", "kafka-brokers"},
		"config print": {"pg-url", "kafka-brokers"}, // run's, as config print shows them
		"config check": {"pg-url", "kafka-brokers"}, // run's, which config check requires as run does
		"replay":       {"pg-url", "kafka-brokers", "since"},
		"dlq replay":   {"pg-url", "kafka-brokers"},
		"dlq list":     {"pg-url"},
		"dlq show":     {"pg-url"},
		"dlq purge":    {"pg-url", "older-than"},
		"dlq history":  {"pg-url"},
		"status":       {"pg-url"},
		"prune":        {"pg-url", "older-than"},
	}
	for path, n := range cmds {
		var got []string
		for _, f := range ownFlags(n) {
			if requiredHelp.MatchString(f.Help) {
				got = append(got, f.Name)
			}
		}
		if !slices.Equal(got, want[path]) {
			t.Errorf("%s: flags marked required %v, want %v", path, got, want[path])
		}
	}
	for _, n := range cmds {
		for _, f := range ownFlags(n) {
			if f.Name == "kafka-brokers" && !slices.Contains([]string{"run", "config print", "config check"}, commandPath(n)) && !strings.HasPrefix(f.Help, "Required unless --dry-run.") {
				t.Errorf("%s --kafka-brokers: help %q, want it to start \"Required unless --dry-run.\"", commandPath(n), f.Help)
			}
		}
	}
}

// TestRunRequired checks that run refuses to start without the flags its
// help marks required, and takes them from the config file or the
// environment as from the command line (they carry no kong required tag,
// which would check before the file is read).
func TestRunRequired(t *testing.T) {
	tests := []struct {
		name    string
		file    string // the config file, none when ""
		env     map[string]string
		args    []string
		wantErr string // "" for none
	}{
		{"no pg-url", "", nil, []string{"--kafka-brokers", "k:9092"}, "--pg-url (CDC_RELAY_PG_URL) is required"},
		{"no brokers", "", nil, []string{"--pg-url", "postgres://db/app"}, "is required: comma-separated Kafka brokers, e.g. kafka-1:9092,kafka-2:9092; set the brokers kafka.brokers (--kafka-brokers / CDC_RELAY_KAFKA_BROKERS)"},
		{"pg-url in file, brokers in env", "pg-url: postgres://relay@db:5432/app\n",
			map[string]string{"CDC_RELAY_KAFKA_BROKERS": "k:9092"}, nil, ""},
		{"pg-url-file in env, brokers in file", "kafka-brokers: [k:9092]\n",
			map[string]string{"CDC_RELAY_PG_URL_FILE": "PGURLFILE"}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			dir := t.TempDir()
			args := append([]string{"run"}, tt.args...)
			if tt.file != "" {
				args = append(args, "--config", writeFile(t, dir, "relay.yaml", tt.file))
			}
			for k, v := range tt.env {
				if v == "PGURLFILE" {
					v = writeFile(t, dir, "pg-url", "postgres://relay@db:5432/app\n")
				}
				t.Setenv(k, v)
			}
			c, err := parseArgs(t, args...)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("parse %q: %v", args, err)
			case tt.wantErr == "" && (c.Run.PGURL != "postgres://relay@db:5432/app" || !slices.Equal(c.Run.KafkaBrokers, []string{"k:9092"})):
				t.Errorf("--pg-url %q, --kafka-brokers %q: not the file's and environment's", c.Run.PGURL, c.Run.KafkaBrokers)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("parse %q: err = %v, want %q", args, err, tt.wantErr)
			}
		})
	}
}

// TestSummariesMatchGuarantee checks that cdc-relay --help states what the
// default --delivery guarantees, and that no command's summary promises only
// "at least once" where it is the floor or the other mode.
func TestSummariesMatchGuarantee(t *testing.T) {
	if defaults["default_delivery"] != relay.DeliveryEffectivelyOnce {
		t.Fatalf("the default delivery is %q: say what it guarantees in description and update this test", defaults["default_delivery"])
	}
	clearEnv(t)
	err, out, _ := run(t, canceled(), "--help")
	if err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"--delivery effectively-once", "each committed outbox row appears once in the Kafka log"} {
		if !strings.Contains(flat, want) {
			t.Errorf("cdc-relay --help does not say %q:\n%s", want, out)
		}
	}
	var check func(n *kong.Node)
	check = func(n *kong.Node) {
		for _, sentence := range strings.Split(n.Help, ". ") {
			if strings.Contains(sentence, "at least once") && !strings.Contains(sentence, "--delivery at-least-once") && !strings.Contains(sentence, "floor") {
				t.Errorf("%q's help promises at least once, without naming it the floor or --delivery at-least-once: %q", n.FullPath(), sentence)
			}
		}
		for _, c := range n.Children {
			check(c)
		}
	}
	check(helpModel(t).Node)
}

// TestHelpExamplesParse parses every example command line in the help of
// each command (up to its Validate, connecting to nothing), so none goes
// stale, and checks they fit 80 columns. A file under /run/secrets/ is made
// in a temporary directory.
func TestHelpExamplesParse(t *testing.T) {
	n := 0
	for path, node := range commands(helpModel(t)) {
		for _, l := range strings.Split(node.Detail, "\n") {
			if strings.HasPrefix(l, "    ") && len(l) > 80 {
				t.Errorf("%s's help: the example line %q is wider than 80 columns", path, l)
			}
		}
		for _, line := range exampleLines(node.Detail) {
			n++
			t.Run(path+"/"+line[0], func(t *testing.T) {
				clearEnv(t)
				args, err := splitExample(line[1])
				if err != nil {
					t.Fatal(err)
				}
				if words := strings.Fields(path); len(args) < len(words) || !slices.Equal(args[:len(words)], words) {
					t.Fatalf("the example %q in %s's help is not of %s", line[1], path, path)
				}
				dir := t.TempDir()
				for i, a := range args {
					if strings.HasPrefix(a, "/run/secrets/") {
						args[i] = writeFile(t, dir, filepath.Base(a), "secret\n")
					}
				}
				if _, err := parseArgs(t, args...); err != nil {
					t.Errorf("cdc-relay %q: %v", args, err)
				}
			})
		}
	}
	if n < 9 {
		t.Errorf("%d examples found in the commands' help, want 9 or more", n)
	}
}

// exampleLines returns each command line of help, an indented "cdc-relay …"
// joined with its backslash continuations, with its line number.
func exampleLines(help string) [][2]string {
	var out [][2]string
	lines := strings.Split(help, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(lines[i], "    ") || !strings.HasPrefix(l, "cdc-relay ") {
			continue
		}
		start := i
		for strings.HasSuffix(l, "\\") && i+1 < len(lines) {
			i++
			l = strings.TrimSuffix(l, "\\") + " " + strings.TrimSpace(lines[i])
		}
		out = append(out, [2]string{fmt.Sprintf("line%d", start+1), l})
	}
	return out
}

// splitExample splits a command line as a shell does for what the examples
// use: words and single-quoted strings. It drops the leading "cdc-relay".
func splitExample(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for _, r := range s {
		switch {
		case quoted && r == '\'':
			quoted = false
		case quoted:
			cur.WriteRune(r)
		case r == '\'':
			quoted, inWord = true, true
		case r == ' ':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case strings.ContainsRune(`"\$*?`, r):
			return nil, fmt.Errorf("%q: %q means something to a shell; keep the examples to words and single quotes", s, r)
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("%q: a quote is not closed", s)
	}
	if inWord {
		words = append(words, cur.String())
	}
	if len(words) == 0 || words[0] != "cdc-relay" {
		return nil, fmt.Errorf("%q: not a cdc-relay command line", s)
	}
	return words[1:], nil
}

// TestStatusHelpExitCode checks that every exit code status's help names
// ("exits 3 on a problem") is the one status returns on a problem.
func TestStatusHelpExitCode(t *testing.T) {
	node := commands(helpModel(t))["status"]
	if node == nil {
		t.Fatal("no status command")
	}
	codes := regexp.MustCompile(`\bexits (\d+)`).FindAllStringSubmatch(node.Help+"\n"+node.Detail, -1)
	if len(codes) == 0 {
		t.Fatalf("status's help names no exit code (%q)", node.Help+"\n"+node.Detail)
	}
	for _, c := range codes {
		if c[1] != fmt.Sprint(statusProblem) {
			t.Errorf("status's help says %q; status exits %d on a problem", c[0], statusProblem)
		}
	}
}

// everyCommand returns every command of app by its path, the application
// itself ("") and the commands with subcommands ("dlq") included.
func everyCommand(app *kong.Application) map[string]*kong.Node {
	out := map[string]*kong.Node{}
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		out[commandPath(n)] = n
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(app.Node)
	return out
}

// modelFlags are the names of the flags n takes, its own and those every
// command takes, as kong's model has them (hidden ones left out, as kong's
// help leaves them out).
func modelFlags(n *kong.Node) []string {
	var out []string
	for _, level := range n.AllFlags(true) {
		for _, f := range level {
			out = append(out, f.Name)
		}
	}
	slices.Sort(out)
	return out
}

var helpRow = regexp.MustCompile(`(?m)^(?:  |      )(?:-[a-zA-Z], )?--(?:\[no-\])?([a-z0-9][a-z0-9-]*)`)

// listedFlags returns the names of the flags a help text lists: the rows
// after its "Flags:" heading (the examples above it have flags too),
// indented as kong indents a row, deeper than it wraps a row's help.
func listedFlags(t *testing.T, help string) []string {
	t.Helper()
	_, rows, ok := strings.Cut(help, "\nFlags:\n")
	if !ok {
		t.Fatalf("no \"Flags:\" heading in:\n%s", help)
	}
	var out []string
	for _, m := range helpRow.FindAllStringSubmatch(rows, -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return out
}

// helpOf runs "cdc-relay <path> <flag>" and returns what it printed.
func helpOf(t *testing.T, path, flag string) string {
	t.Helper()
	clearEnv(t)
	err, out, errOut := run(t, canceled(), append(strings.Fields(path), flag)...)
	if err != nil || errOut != "" {
		t.Fatalf("cdc-relay %s %s: err %v, stderr %q", path, flag, err, errOut)
	}
	return out
}

// TestHelpFitsScreen checks the length of each command's --help at the 80
// columns kong wraps to when its output is not a terminal: run's, with the
// flags most deployments set, within 120 lines, every other within 60.
func TestHelpFitsScreen(t *testing.T) {
	t.Setenv("COLUMNS", "80") // kong's width: $COLUMNS, else the terminal's, else 80
	tests := []struct {
		cmd      string
		maxLines int
	}{
		{"", 60},
		{"run", 120},
		{"version", 60},
		{"dlq", 60},
		{"dlq list", 60},
		{"dlq show", 60},
		{"dlq replay", 60},
		{"dlq purge", 60},
		{"dlq history", 60},
		{"replay", 60},
		{"prune", 60},
		{"status", 60},
		{"config", 60},
		{"config print", 60},
		{"config check", 60},
		{"config from-debezium", 60},
	}
	cmds := everyCommand(helpModel(t))
	for _, tt := range tests {
		t.Run("cdc-relay "+tt.cmd, func(t *testing.T) {
			if cmds[tt.cmd] == nil {
				t.Fatalf("no command %q", tt.cmd)
			}
			lines := strings.Count(helpOf(t, tt.cmd, "--help"), "\n")
			t.Logf("%d lines", lines)
			if lines > tt.maxLines {
				t.Errorf("cdc-relay %s --help is %d lines, want at most %d: list fewer flags in shortHelp", tt.cmd, lines, tt.maxLines)
			}
		})
		delete(cmds, tt.cmd)
	}
	for path := range cmds {
		t.Errorf("command %q: give its --help a bound in this test", path)
	}
}

// TestShortHelp checks that each command's --help lists exactly the flags
// shortHelp names for it (every flag when it has no entry), --help and
// --help-all, among them every flag it requires, and that it says how many
// more there are and where they are.
func TestShortHelp(t *testing.T) {
	t.Setenv("COLUMNS", "80")
	cmds := everyCommand(helpModel(t))
	for path := range shortHelp {
		if cmds[path] == nil {
			t.Errorf("shortHelp names the command %q, which does not exist", path)
		}
	}
	for path, n := range cmds {
		t.Run("cdc-relay "+path, func(t *testing.T) {
			all := modelFlags(n)
			want := all
			if shown, ok := shortHelp[path]; ok {
				for _, name := range shown {
					if !slices.Contains(all, name) {
						t.Errorf("shortHelp[%q] names --%s, which the command does not take", path, name)
					}
				}
				want = slices.DeleteFunc(slices.Clone(all), func(name string) bool {
					return name != "help" && name != helpAllName && !slices.Contains(shown, name)
				})
			}
			for _, f := range ownFlags(n) {
				// config print takes run's flags, marks and all, and requires none.
				if requiredHelp.MatchString(f.Help) && path != "config print" && !slices.Contains(want, f.Name) {
					t.Errorf("--%s is required, but --help does not list it: add it to shortHelp[%q]", f.Name, path)
				}
			}
			out := helpOf(t, path, "--help")
			if got := listedFlags(t, out); !slices.Equal(got, want) {
				t.Errorf("--help lists %q, want %q", got, want)
			}
			flat := strings.Join(strings.Fields(out), " ")
			switch more := len(all) - len(want); {
			case more == 0 && strings.Contains(flat, "more flags"):
				t.Errorf("--help lists every flag but says there are more:\n%s", out)
			case more > 0:
				for _, w := range []string{fmt.Sprintf("%d more flags", more), n.FullPath() + " --help-all", "docs/configuration.md"} {
					if !strings.Contains(flat, w) {
						t.Errorf("--help lists %d of %d flags, and does not say %q:\n%s", len(want), len(all), w, out)
					}
				}
			}
		})
	}
}

// TestHelpAllListsEveryFlag checks that each command's --help-all lists
// every flag of the command in kong's model and is kong's own help, as
// --help was before it listed only the common flags.
func TestHelpAllListsEveryFlag(t *testing.T) {
	t.Setenv("COLUMNS", "80")
	clearEnv(t)
	var kongs strings.Builder
	var c CLI
	kctx, err := parse(&c, []string{"version"}, &kongs, io.Discard, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	for path, n := range everyCommand(kctx.Model) {
		t.Run("cdc-relay "+path, func(t *testing.T) {
			out := helpOf(t, path, "--help-all")
			if got, want := listedFlags(t, out), modelFlags(n); !slices.Equal(got, want) {
				t.Errorf("--help-all lists %q, want every flag of the model: %q", got, want)
			}
			kongs.Reset()
			trace, err := kong.Trace(kctx.Kong, strings.Fields(path))
			if err != nil {
				t.Fatal(err)
			}
			if err := kong.DefaultHelpPrinter(kong.HelpOptions{ValueFormatter: helpValue}, trace); err != nil {
				t.Fatal(err)
			}
			if out != kongs.String() {
				t.Errorf("--help-all is not kong's help of the command:\n%s\nkong's:\n%s", out, kongs.String())
			}
		})
	}
}

// TestHelpAllIsNoSetting checks that --help-all, like --help, is neither an
// environment variable nor a key of the config file.
func TestHelpAllIsNoSetting(t *testing.T) {
	clearEnv(t)
	t.Setenv(envName(helpAllName), "true")
	err, out, _ := run(t, canceled(), "version")
	if err != nil || strings.Contains(out, "Usage:") {
		t.Errorf("version with %s=true: err %v, printed %q; want the version", envName(helpAllName), err, out)
	}
	file := writeFile(t, t.TempDir(), "relay.yaml", "help-all: true\n")
	if _, err := parseArgs(t, "version", "--config", file); err == nil || !strings.Contains(err.Error(), `unknown key "help-all"`) {
		t.Errorf("a config file with help-all: err %v, want unknown key", err)
	}
}

// TestHelpShowsKeys: every setting --help lists shows its key beside its
// variable, and run's --help lists --config and --set and says that a
// tables: entry overrides a table's settings.
func TestHelpShowsKeys(t *testing.T) {
	t.Setenv("COLUMNS", "80")
	app := helpModel(t)
	checked := 0
	for path, n := range everyCommand(app) {
		out := helpOf(t, path, "--help")
		flat, listed := strings.Join(strings.Fields(out), " "), listedFlags(t, out)
		for _, f := range n.Flags {
			key := f.Tag.Get("key")
			if key == "" || !slices.Contains(listed, f.Name) {
				continue
			}
			checked++
			if want := "($" + envName(f.Name) + ", key " + key + ")"; !strings.Contains(flat, want) {
				t.Errorf("cdc-relay %s --help: --%s without %q", path, f.Name, want)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d flags: the test finds no listed flags", checked)
	}
	flat := strings.Join(strings.Fields(helpOf(t, "run", "--help")), " ")
	for _, want := range []string{"--config=FILE", "--set=KEY=VALUE", "an entry of the tables: list of the --config file may override the outbox settings of one table"} {
		if !strings.Contains(flat, want) {
			t.Errorf("run --help lacks %q", want)
		}
	}
}
