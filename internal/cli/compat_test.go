package cli

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	yaml "go.yaml.in/yaml/v3"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// compatSurfaceFile is the frozen command line surface: every command, flag,
// environment variable and config file key docs/configuration.md listed on
// 2026-12-04. Never regenerate it from later docs (its header says why).
const compatSurfaceFile = "testdata/compat-surface.txt"

// compatSurfaceRows is how many rows the frozen file has, so that a
// truncated file cannot make the test pass by checking less.
const compatSurfaceRows = 367

// none is the surface file's "no value" cell.
const none = "—"

// surfaceRow is one row of the surface file (its header explains the
// columns).
type surfaceRow struct {
	line     int
	command  string // "dlq replay"
	flag     string // "--pg-url", "--no-create-slot"
	env      string // "" for none
	key      string // "" for none
	kind     string // string, int, float, duration, bool, list
	def      string // "" for none or required
	sample   string // "" for a negation, which takes no value
	with     []compatSetting
	setting  string // the setting that must hold want after parsing
	want     string // the sample, or the reaches column's value
	negation bool
}

// compatSetting is one flag=value of a with column or of a command's base.
type compatSetting struct{ flag, value string }

// family is the setting a flag belongs to for batching: a *-file flag is one
// setting with the flag it reads (--pg-url-file and --pg-url may not both be
// set).
func family(flag string) string { return strings.TrimSuffix(flag, "-file") }

func (r surfaceRow) name() string { return r.command + "/" + r.flag }

// loadSurface reads and checks the surface file.
func loadSurface(t *testing.T) []surfaceRow {
	t.Helper()
	f, err := os.Open(compatSurfaceFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []surfaceRow
	seen := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cells := strings.Split(line, " | ")
		if len(cells) != 9 {
			t.Fatalf("%s:%d: %d columns, want 9: %q", compatSurfaceFile, n, len(cells), line)
		}
		for i := range cells {
			if cells[i] = strings.TrimSpace(cells[i]); cells[i] == none {
				cells[i] = ""
			}
		}
		r := surfaceRow{line: n, command: cells[0], flag: cells[1], env: cells[2], key: cells[3], kind: cells[4],
			def: cells[5], sample: cells[6]}
		if r.def == "required" {
			r.def = ""
		}
		for _, w := range strings.Fields(cells[7]) {
			flag, value, ok := strings.Cut(strings.TrimPrefix(w, "--"), "=")
			if !ok {
				value = "true" // --flag of a bool
			}
			r.with = append(r.with, compatSetting{flag, value})
		}
		r.setting, r.want = strings.TrimPrefix(r.flag, "--"), r.sample
		if reaches := cells[8]; reaches != "" {
			var ok bool
			if r.setting, r.want, ok = strings.Cut(reaches, "="); !ok {
				t.Fatalf("%s:%d: reaches %q is not flag=value", compatSurfaceFile, n, reaches)
			}
		}
		r.negation = r.sample == ""
		switch {
		case r.negation && (!strings.HasPrefix(r.flag, "--no-") || r.kind != "bool" || r.setting != strings.TrimPrefix(r.flag, "--no-")):
			t.Fatalf("%s:%d: a row without a sample must be the negation --no-X of a bool X, reaching X", compatSurfaceFile, n)
		case !r.negation && r.sample == r.def:
			t.Fatalf("%s:%d: the sample is the default: it could not show that the value reached the setting", compatSurfaceFile, n)
		}
		if prev, dup := seen[r.name()]; dup {
			t.Fatalf("%s:%d: %s listed twice (first on line %d)", compatSurfaceFile, n, r.name(), prev)
		}
		seen[r.name()] = n
		rows = append(rows, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) != compatSurfaceRows {
		t.Fatalf("%s has %d rows, want %d: it is frozen", compatSurfaceFile, len(rows), compatSurfaceRows)
	}
	return rows
}

// compatFiles writes the files the samples name as @NAME and returns their
// paths by @NAME.
func compatFiles(t *testing.T) map[string]string {
	t.Helper()
	dir := t.TempDir()
	pki, err := sandbox.WriteTLSFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"@ca.pem": pki.CA, "@client.pem": pki.ClientCert, "@client-key.pem": pki.ClientKey}
	for name, content := range map[string]string{
		"@empty.yaml":   "",
		"@pg-url.txt":   "postgres://compat-file@db.example:5432/app\n",
		"@password.txt": "compat-file-pw\n",
		"@token.txt":    "compat-file-token\n",
		"@debezium.properties": `connector.class=io.debezium.connector.postgresql.PostgresConnector
database.hostname=dbz.example
database.user=compat
database.dbname=app
plugin.name=pgoutput
table.include.list=public.outbox
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
`,
	} {
		files[name] = writeFile(t, dir, strings.TrimPrefix(name, "@"), content)
	}
	return files
}

// compatBase is what each command needs besides the flags under test to get
// past its checks: the required settings, and the positional arguments.
var compatBase = map[string]struct {
	settings   []compatSetting
	positional []string
}{
	"run":                  {settings: []compatSetting{{"pg-url", "postgres://compat-base@db.example:5432/app"}, {"kafka-brokers", "kafka-base:9092"}}},
	"version":              {},
	"dlq list":             {settings: []compatSetting{{"pg-url", "postgres://compat-base@db.example:5432/app"}}},
	"dlq show":             {settings: []compatSetting{{"pg-url", "postgres://compat-base@db.example:5432/app"}}, positional: []string{"1"}},
	"dlq replay":           {settings: []compatSetting{{"pg-url", "postgres://compat-base@db.example:5432/app"}, {"kafka-brokers", "kafka-base:9092"}}},
	"dlq purge":            {settings: []compatSetting{{"pg-url", "postgres://compat-base@db.example:5432/app"}, {"older-than", "7d"}}},
	"dlq history":          {settings: []compatSetting{{"pg-url", "postgres://compat-base@db.example:5432/app"}}},
	"replay":               {settings: []compatSetting{{"pg-url", "postgres://compat-base@db.example:5432/app"}, {"kafka-brokers", "kafka-base:9092"}, {"since", "2024-05-01"}}},
	"prune":                {settings: []compatSetting{{"pg-url", "postgres://compat-base@db.example:5432/app"}, {"older-than", "7d"}}},
	"status":               {settings: []compatSetting{{"pg-url", "postgres://compat-base@db.example:5432/app"}}},
	"config print":         {},
	"config from-debezium": {positional: []string{"@debezium.properties"}},
}

// compatParse is the test's one seam with the parser: it parses args as Run
// does, without running the command, and returns every setting of the chosen
// command by flag name. A new parser only needs this function adapted.
func compatParse(args []string) (map[string]any, error) {
	var c CLI
	exited := false
	kctx, err := parse(&c, args, io.Discard, io.Discard, func(int) { exited = true })
	if err != nil {
		return nil, err
	}
	if exited {
		return nil, fmt.Errorf("exited (printed help?)")
	}
	values := map[string]any{}
	for _, f := range kctx.Flags() {
		values[f.Name] = kctx.FlagValue(f)
	}
	return values, nil
}

// The ways a row's sample is given.
const (
	viaFlag = "flag"
	viaEnv  = "env"
	viaFile = "file"
)

// takes reports whether row r can be given via mode.
func (r surfaceRow) takes(mode string) bool {
	switch mode {
	case viaEnv:
		return r.env != ""
	case viaFile:
		return r.key != ""
	}
	return true
}

// batch is rows of one command that can be given together: each setting is
// given once, so each row's value can only have come from its own flag,
// variable or key. A row's with settings are given on the command line,
// unless a row under test in the batch gives the same value.
type batch struct {
	rows    []surfaceRow
	tested  map[string]string // family → the setting under test
	samples map[string]string // setting under test → its sample
	context map[string]string // with settings by flag
}

// value is the value r gives its setting, as with columns write it.
func (r surfaceRow) value() string {
	if r.negation {
		return "false"
	}
	return r.sample
}

// fits reports whether r can join b.
func (b *batch) fits(r surfaceRow) bool {
	if _, ok := b.tested[family(r.setting)]; ok {
		return false
	}
	for flag, v := range b.context {
		if family(flag) == family(r.setting) && (flag != r.setting || v != r.value()) {
			return false
		}
	}
	for _, w := range r.with {
		if s, ok := b.tested[family(w.flag)]; ok && (s != w.flag || b.samples[s] != w.value) {
			return false
		}
		for flag, v := range b.context {
			if family(flag) == family(w.flag) && (flag != w.flag || v != w.value) {
				return false
			}
		}
	}
	return true
}

func (b *batch) add(r surfaceRow) {
	b.rows = append(b.rows, r)
	b.tested[family(r.setting)] = r.setting
	b.samples[r.setting] = r.value()
	for _, w := range r.with {
		b.context[w.flag] = w.value
	}
}

func newBatch(rows []surfaceRow) *batch {
	b := &batch{tested: map[string]string{}, samples: map[string]string{}, context: map[string]string{}}
	for _, r := range rows {
		b.add(r)
	}
	return b
}

// batches groups rows (of one command) into batches, first fit.
func batches(rows []surfaceRow) []*batch {
	var out []*batch
next:
	for _, r := range rows {
		for _, b := range out {
			if b.fits(r) {
				b.add(r)
				continue next
			}
		}
		out = append(out, newBatch([]surfaceRow{r}))
	}
	return out
}

// compatResult is what a parse made of one row's sample.
type compatResult struct {
	args  []string // the command line
	input string   // how the sample was given, for messages
	got   any      // the setting's value
	found bool     // the setting exists
	err   error    // the parse's error
}

// surfaceRun parses batches of rows and records each row's result.
type surfaceRun struct {
	t       *testing.T
	files   map[string]string
	parses  int
	splits  int // batches parsed again in halves because they failed
	results map[string]map[string]compatResult
}

// file resolves @NAME to a written file's path.
func (s *surfaceRun) file(v string) string {
	if p, ok := s.files[v]; ok {
		return p
	}
	if strings.HasPrefix(v, "@") {
		s.t.Fatalf("no file %s for a sample", v)
	}
	return v
}

// parseBatch gives rows of command together via mode, records each row's
// result, and when the parse fails parses each half again, so a failure is
// pinned on the rows that cause it.
func (s *surfaceRun) parseBatch(command, mode string, rows []surfaceRow) {
	s.t.Helper()
	b := newBatch(rows)
	args := strings.Fields(command)
	given := func(flag string) bool { // by a row or a with setting
		if _, ok := b.tested[family(flag)]; ok {
			return true
		}
		for f := range b.context {
			if family(f) == family(flag) {
				return true
			}
		}
		return false
	}
	for _, base := range compatBase[command].settings {
		if !given(base.flag) {
			args = append(args, "--"+base.flag+"="+s.file(base.value))
		}
	}
	for _, flag := range slices.Sorted(maps.Keys(b.context)) {
		if _, tested := b.samples[flag]; !tested {
			args = append(args, "--"+flag+"="+s.file(b.context[flag]))
		}
	}
	inputs := make([]string, len(rows))
	var unset []string
	fileKeys := map[string]any{}
	for i, r := range rows {
		sample := s.file(r.sample)
		switch mode {
		case viaFlag:
			switch {
			case r.negation:
				args = append(args, r.flag)
			case r.kind == "bool" && sample == "true":
				args = append(args, r.flag)
			default:
				args = append(args, r.flag+"="+sample)
			}
			inputs[i] = args[len(args)-1]
		case viaEnv:
			s.t.Setenv(r.env, sample) // restored when the test ends
			unset = append(unset, r.env)
			inputs[i] = r.env + "=" + sample
		case viaFile:
			v, err := yamlSample(r.kind, sample)
			if err != nil {
				s.t.Fatalf("%s:%d: %v", compatSurfaceFile, r.line, err)
			}
			fileKeys[r.key] = v
			inputs[i] = fmt.Sprintf("key %s: %s in the --config file", r.key, sample)
		}
	}
	if mode == viaFile {
		data, err := yaml.Marshal(fileKeys)
		if err != nil {
			s.t.Fatal(err)
		}
		path := writeFile(s.t, s.t.TempDir(), "relay.yaml", string(data))
		args = append(args, "--config="+path)
	}
	for _, p := range compatBase[command].positional {
		args = append(args, s.file(p))
	}
	values, err := compatParse(args)
	s.parses++
	for _, k := range unset {
		if err := os.Unsetenv(k); err != nil {
			s.t.Fatal(err)
		}
	}
	if err != nil && len(rows) > 1 {
		s.splits++
		s.parseBatch(command, mode, rows[:len(rows)/2])
		s.parseBatch(command, mode, rows[len(rows)/2:])
		return
	}
	for i, r := range rows {
		res := compatResult{args: args, input: inputs[i], err: err}
		if err == nil {
			res.got, res.found = values[r.setting]
		}
		if s.results[r.name()] == nil {
			s.results[r.name()] = map[string]compatResult{}
		}
		s.results[r.name()][mode] = res
	}
}

// yamlSample is sample as a person writes it in the YAML file: a boolean or
// a number unquoted, a list as a sequence, and a string as yaml writes it
// (quoted only where YAML needs it).
func yamlSample(kind, sample string) (any, error) {
	switch kind {
	case "bool":
		return strconv.ParseBool(sample)
	case "int":
		return strconv.ParseInt(sample, 10, 64)
	case "float":
		return strconv.ParseFloat(sample, 64)
	case "list":
		return strings.Split(sample, ","), nil
	case "string", "duration", "numbers":
		return sample, nil
	}
	return nil, fmt.Errorf("unknown kind %q", kind)
}

// sameValue reports whether a parsed setting holds want, written as the
// surface file writes values (lists comma-separated).
func sameValue(got any, want string) bool {
	if d, ok := got.(time.Duration); ok {
		w, err := time.ParseDuration(want)
		return err == nil && w == d
	}
	v := reflect.ValueOf(got)
	switch v.Kind() {
	case reflect.Slice:
		var parts []string
		if want != "" {
			parts = strings.Split(want, ",")
		}
		if v.Len() != len(parts) {
			return false
		}
		for i, p := range parts {
			if !sameValue(v.Index(i).Interface(), p) {
				return false
			}
		}
		return true
	case reflect.Bool:
		b, err := strconv.ParseBool(want)
		return err == nil && b == v.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(want, 10, 64)
		return err == nil && n == v.Int()
	case reflect.Float32, reflect.Float64:
		f, err := strconv.ParseFloat(want, 64)
		return err == nil && f == v.Float()
	case reflect.String:
		return v.String() == want
	}
	return false
}

// TestCompatibleSurface checks that every command, flag, environment
// variable and config file key of the frozen surface (testdata/
// compat-surface.txt, from docs/configuration.md of 2026-12-04) is still
// accepted: each row's sample, given as the flag, as the variable and as the
// key of a --config file, parses and reaches its setting, and a command
// given nothing has the documented default (issue 37: nothing that works
// today breaks).
//
// Parsing is costly (tens of milliseconds a parse under -race, mostly
// building the model), so the rows of a command are given a batch at a time,
// each batch setting every setting once; a batch that fails is parsed again
// in halves until the rows that fail are alone.
func TestCompatibleSurface(t *testing.T) {
	clearEnv(t)
	rows := loadSurface(t)
	s := &surfaceRun{t: t, files: compatFiles(t), results: map[string]map[string]compatResult{}}

	var commands []string
	byCommand := map[string][]surfaceRow{}
	for _, r := range rows {
		if _, ok := compatBase[r.command]; !ok {
			t.Fatalf("%s:%d: command %q has no base in compatBase", compatSurfaceFile, r.line, r.command)
		}
		if byCommand[r.command] == nil {
			commands = append(commands, r.command)
		}
		byCommand[r.command] = append(byCommand[r.command], r)
	}
	defaults := map[string]compatResult{}
	for _, command := range commands {
		for _, mode := range []string{viaFlag, viaEnv, viaFile} {
			var taking []surfaceRow
			for _, r := range byCommand[command] {
				if r.takes(mode) {
					taking = append(taking, r)
				}
			}
			for _, b := range batches(taking) {
				s.parseBatch(command, mode, b.rows)
			}
		}
		args := strings.Fields(command)
		for _, b := range compatBase[command].settings {
			args = append(args, "--"+b.flag+"="+b.value)
		}
		for _, p := range compatBase[command].positional {
			args = append(args, s.file(p))
		}
		values, err := compatParse(args)
		s.parses++
		defaults[command] = compatResult{args: args, err: err, got: values}
	}
	t.Logf("%d rows in %d parses (%d batches split after failing)", len(rows), s.parses, s.splits)

	for _, r := range rows {
		t.Run(r.name(), func(t *testing.T) {
			for _, mode := range []string{viaFlag, viaEnv, viaFile} {
				if !r.takes(mode) {
					continue
				}
				res := s.results[r.name()][mode]
				switch {
				case res.err != nil:
					t.Errorf("%s (line %d): %s is not accepted: %v\ncommand line: %q", mode, r.line, res.input, res.err, res.args)
				case !res.found:
					t.Errorf("%s (line %d): %s: the parsed %s has no setting %q", mode, r.line, res.input, r.command, r.setting)
				case !sameValue(res.got, s.file(r.want)):
					t.Errorf("%s (line %d): %s: %s is %v, want %s\ncommand line: %q", mode, r.line, res.input, r.setting, res.got, s.file(r.want), res.args)
				}
			}
			if r.def == "" || r.negation {
				return
			}
			d := defaults[r.command]
			if d.err != nil {
				t.Fatalf("default (line %d): %q fails: %v", r.line, d.args, d.err)
			}
			got, ok := d.got.(map[string]any)[r.setting]
			switch {
			case !ok:
				t.Errorf("default (line %d): %q has no setting %q", r.line, d.args, r.setting)
			case !sameValue(got, r.def):
				t.Errorf("default (line %d): %s is %v with %q, want the documented %s", r.line, r.setting, got, d.args, r.def)
			}
		})
	}
}
