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
			out[cmdPath(n)] = n
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(app.Node)
	return out
}

// cmdPath is n's path below the application: "dlq replay".
func cmdPath(n *kong.Node) string { return strings.Join(strings.Fields(n.Path()), " ") }

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
			if f.Name == "kafka-brokers" && !slices.Contains([]string{"run", "config print"}, cmdPath(n)) && !strings.HasPrefix(f.Help, "Required unless --dry-run.") {
				t.Errorf("%s --kafka-brokers: help %q, want it to start \"Required unless --dry-run.\"", cmdPath(n), f.Help)
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
		{"no brokers", "", nil, []string{"--pg-url", "postgres://db/app"}, "--kafka-brokers (CDC_RELAY_KAFKA_BROKERS) is required"},
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
