package cli

import (
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
const surfaceNone = "—"

// surfaceRow is one row of the surface file (its header explains the
// columns).
type surfaceRow struct {
	line     int
	command  string // "dlq replay"
	flag     string // "--pg-url", "--no-create-slot"
	env      string // "" for none
	key      string // "" for none
	kind     string // string, int, float, duration, bool, list, numbers
	def      string // "" for none or required
	sample   string // "" for a negation, which takes no value
	with     []compatSetting
	setting  string // the setting that must hold want after parsing
	want     string // the sample, or the reaches column's value
	negation bool
	// otherEnv and otherKey are the variable and key of the flag's name
	// when the row has none but another row has them (dlq's --topic, run's
	// CDC_RELAY_TOPIC and topic): they must not reach this setting.
	otherEnv, otherKey string
}

// compatSetting is one flag=value of a with column or of a command's base.
type compatSetting struct{ flag, value string }

// settingFamily is the setting a flag belongs to for batching: a *-file flag is one
// setting with the flag it reads (--pg-url-file and --pg-url may not both be
// set).
func settingFamily(flag string) string { return strings.TrimSuffix(flag, "-file") }

func (r surfaceRow) name() string { return r.command + "/" + r.flag }

// loadSurface reads and checks the surface file.
func loadSurface(t *testing.T) []surfaceRow {
	t.Helper()
	data, err := os.ReadFile(compatSurfaceFile)
	if err != nil {
		t.Fatal(err)
	}
	var rows []surfaceRow
	seen := map[string]int{}
	for i, text := range strings.Split(string(data), "\n") {
		n, line := i+1, strings.TrimSpace(text)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cells := strings.Split(line, " | ")
		if len(cells) != 9 {
			t.Fatalf("%s:%d: %d columns, want 9: %q", compatSurfaceFile, n, len(cells), line)
		}
		for i := range cells {
			if cells[i] = strings.TrimSpace(cells[i]); cells[i] == surfaceNone {
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
	envs, keys := map[string]bool{}, map[string]bool{}
	for _, r := range rows {
		envs[r.env], keys[r.key] = true, true
	}
	for i, r := range rows {
		name := strings.TrimPrefix(r.flag, "--")
		if env := "CDC_RELAY_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")); r.env == "" && !r.negation && envs[env] {
			rows[i].otherEnv = env
		}
		if r.key == "" && !r.negation && keys[name] {
			rows[i].otherKey = name
		}
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
	viaFlag       = "flag"
	viaEnv        = "env"
	viaFile       = "file"                     // a list as a YAML sequence
	viaFileString = "file, list as one string" // a list comma-separated
	viaOtherEnv   = "another command's env"    // must not reach the setting
	viaOtherKey   = "another command's key"    // must not reach the setting
)

// compatModes are the ways to check, in order.
var compatModes = []string{viaFlag, viaEnv, viaFile, viaFileString, viaOtherEnv, viaOtherKey}

// takes reports whether row r can be given via mode.
func (r surfaceRow) takes(mode string) bool {
	switch mode {
	case viaEnv:
		return r.env != ""
	case viaFile:
		return r.key != ""
	case viaFileString:
		return r.key != "" && (r.kind == "list" || r.kind == "numbers")
	case viaOtherEnv:
		return r.otherEnv != ""
	case viaOtherKey:
		return r.otherKey != ""
	}
	return true
}

// refused reports whether mode gives a name the row must not take.
func refusedMode(mode string) bool { return mode == viaOtherEnv || mode == viaOtherKey }

// inFile reports whether mode gives the sample in the --config file.
func inFileMode(mode string) bool {
	return mode == viaFile || mode == viaFileString || mode == viaOtherKey
}

// value is the value r gives its setting, as with columns write it.
func (r surfaceRow) value() string {
	if r.negation {
		return "false"
	}
	return r.sample
}

// surfaceItem is one row given one way.
type surfaceItem struct {
	r    surfaceRow
	mode string
}

// surfaceBatch is items of one command that one parse can check: each setting is
// given once, whichever way, so each value can only have come from its own
// flag, variable or key. A row's with settings are given on the command
// line, unless an item of the batch gives the same value.
type surfaceBatch struct {
	items   []surfaceItem
	tested  map[string]string // family → the setting under test
	samples map[string]string // setting under test → the value it is given (not refused)
	context map[string]string // with settings by flag
	file    bool              // some item is in the --config file
}

func newSurfaceBatch(items []surfaceItem) *surfaceBatch {
	b := &surfaceBatch{tested: map[string]string{}, samples: map[string]string{}, context: map[string]string{}}
	for _, it := range items {
		b.add(it)
	}
	return b
}

// fits reports whether it can join b.
func (b *surfaceBatch) fits(it surfaceItem) bool {
	r := it.r
	if _, ok := b.tested[settingFamily(r.setting)]; ok {
		return false
	}
	// The --config row and the items in the file both set the file.
	if _, ok := b.tested["config"]; ok && inFileMode(it.mode) || r.setting == "config" && b.file {
		return false
	}
	for flag, v := range b.context {
		if settingFamily(flag) == settingFamily(r.setting) && (refusedMode(it.mode) || flag != r.setting || v != r.value()) {
			return false
		}
	}
	for _, w := range r.with {
		if s, ok := b.tested[settingFamily(w.flag)]; ok {
			if v, gives := b.samples[s]; !gives || s != w.flag || v != w.value {
				return false
			}
		}
		for flag, v := range b.context {
			if settingFamily(flag) == settingFamily(w.flag) && (flag != w.flag || v != w.value) {
				return false
			}
		}
	}
	return true
}

func (b *surfaceBatch) add(it surfaceItem) {
	b.items = append(b.items, it)
	b.tested[settingFamily(it.r.setting)] = it.r.setting
	if !refusedMode(it.mode) {
		b.samples[it.r.setting] = it.r.value()
	}
	for _, w := range it.r.with {
		b.context[w.flag] = w.value
	}
	b.file = b.file || inFileMode(it.mode)
}

// given reports whether flag is set by an item or a with setting of b.
func (b *surfaceBatch) given(flag string) bool {
	if _, ok := b.tested[settingFamily(flag)]; ok {
		return true
	}
	for f := range b.context {
		if settingFamily(f) == settingFamily(flag) {
			return true
		}
	}
	return false
}

// surfaceBatches groups items (of one command) into batches, first fit: a row's
// ways each land in another batch, and a command takes about as many
// parses as its busiest setting has items (--pg-url and --pg-url-file:
// six).
func surfaceBatches(items []surfaceItem) []*surfaceBatch {
	var out []*surfaceBatch
next:
	for _, it := range items {
		for _, b := range out {
			if b.fits(it) {
				b.add(it)
				continue next
			}
		}
		out = append(out, newSurfaceBatch([]surfaceItem{it}))
	}
	return out
}

// compatResult is what a parse made of one item.
type compatResult struct {
	args  []string // the command line
	input string   // how the sample was given, for messages
	got   any      // the setting's value
	found bool     // the setting exists
	err   error    // the parse's error
}

// compatParsed is one successful parse: the settings it gave and what every
// setting was after it, so that the defaults are read where nothing was
// given.
type compatParsed struct {
	args     []string
	values   map[string]any
	given    func(flag string) bool
	debezium bool // --debezium-config was given: many settings are not defaults
	base     bool // the command was given its base alone
}

// surfaceRun parses batches and records each item's result.
type surfaceRun struct {
	t       *testing.T
	files   map[string]string
	parses  int
	splits  int                                // batches parsed again in halves because they failed
	results map[string]map[string]compatResult // row name → mode → result
	parsed  map[string][]compatParsed          // command → its successful parses
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

// parseBatch gives items of command together, records each one's result,
// and when the parse fails parses each half again, so that a failure is
// pinned on the items that cause it.
func (s *surfaceRun) parseBatch(command string, items []surfaceItem) {
	s.t.Helper()
	b := newSurfaceBatch(items)
	args := strings.Fields(command)
	for _, base := range compatBase[command].settings {
		if !b.given(base.flag) {
			args = append(args, "--"+base.flag+"="+s.file(base.value))
		}
	}
	for _, flag := range slices.Sorted(maps.Keys(b.context)) {
		if _, tested := b.samples[flag]; !tested {
			args = append(args, "--"+flag+"="+s.file(b.context[flag]))
		}
	}
	inputs := make([]string, len(items))
	var unset []string
	fileKeys := map[string]any{}
	for i, it := range items {
		r, sample := it.r, s.file(it.r.sample)
		switch it.mode {
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
		case viaEnv, viaOtherEnv:
			env := r.env
			if it.mode == viaOtherEnv {
				env = r.otherEnv
			}
			s.t.Setenv(env, sample) // restored when the test ends
			unset = append(unset, env)
			inputs[i] = env + "=" + sample
		case viaFile, viaFileString, viaOtherKey:
			key, kind := r.key, r.kind
			switch it.mode {
			case viaOtherKey:
				key = r.otherKey
			case viaFileString:
				kind = "string"
			}
			v, err := compatYAMLValue(kind, sample)
			if err != nil {
				s.t.Fatalf("%s:%d: %v", compatSurfaceFile, r.line, err)
			}
			fileKeys[key] = v
			inputs[i] = fmt.Sprintf("key %s: %s in the --config file", key, sample)
		}
	}
	if len(fileKeys) > 0 {
		data, err := yaml.Marshal(fileKeys)
		if err != nil {
			s.t.Fatal(err)
		}
		args = append(args, "--config="+writeFile(s.t, s.t.TempDir(), "relay.yaml", string(data)))
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
	if err != nil && len(items) > 1 {
		s.splits++
		s.parseBatch(command, items[:len(items)/2])
		s.parseBatch(command, items[len(items)/2:])
		return
	}
	for i, it := range items {
		res := compatResult{args: args, input: inputs[i], err: err}
		if err == nil {
			res.got, res.found = values[it.r.setting]
		}
		if s.results[it.r.name()] == nil {
			s.results[it.r.name()] = map[string]compatResult{}
		}
		s.results[it.r.name()][it.mode] = res
	}
	if err == nil {
		_, debezium := b.tested["debezium-config"]
		s.parsed[command] = append(s.parsed[command], compatParsed{args: args, values: values, given: b.given, debezium: debezium})
	}
}

// defaultOf returns r's setting where nothing set it: from a parse that set
// neither it nor --debezium-config, when one has the documented default;
// else (another setting's check may change it, as dlq history's --id turns
// --transitions on) from the command given its base alone, parsed once.
func (s *surfaceRun) defaultOf(r surfaceRow) (got any, args []string, err error) {
	for _, p := range s.parsed[r.command] {
		if v, ok := p.values[r.setting]; ok && !p.debezium && !p.given(r.setting) && compatSameValue(v, r.def) {
			return v, p.args, nil
		}
	}
	var base *compatParsed
	for i, p := range s.parsed[r.command] {
		if p.base {
			base = &s.parsed[r.command][i]
		}
	}
	if base == nil {
		args := strings.Fields(r.command)
		for _, b := range compatBase[r.command].settings {
			args = append(args, "--"+b.flag+"="+s.file(b.value))
		}
		for _, p := range compatBase[r.command].positional {
			args = append(args, s.file(p))
		}
		values, err := compatParse(args)
		s.parses++
		if err != nil {
			return nil, args, err
		}
		s.parsed[r.command] = append(s.parsed[r.command], compatParsed{args: args, values: values, given: func(string) bool { return false }, base: true})
		base = &s.parsed[r.command][len(s.parsed[r.command])-1]
	}
	got, ok := base.values[r.setting]
	if !ok {
		return nil, base.args, fmt.Errorf("no setting %q", r.setting)
	}
	return got, base.args, nil
}

// compatYAMLValue is sample as a person writes it in the YAML file: a
// boolean or a number unquoted, a list as a sequence, and a string (numbers
// too) as yaml writes it, quoted only where YAML needs it.
func compatYAMLValue(kind, sample string) (any, error) {
	switch kind {
	case "bool":
		return strconv.ParseBool(sample)
	case "int":
		return strconv.ParseInt(sample, 10, 64)
	case "float":
		return strconv.ParseFloat(sample, 64)
	case "list":
		return strings.Split(sample, ","), nil
	case "numbers":
		var ns []int64
		for _, part := range strings.Split(sample, ",") {
			n, err := strconv.ParseInt(part, 10, 64)
			if err != nil {
				return nil, err
			}
			ns = append(ns, n)
		}
		return ns, nil
	case "string", "duration":
		return sample, nil
	}
	return nil, fmt.Errorf("unknown kind %q", kind)
}

// compatSameValue reports whether a parsed setting holds want, written as the
// surface file writes values (lists comma-separated).
func compatSameValue(got any, want string) bool {
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
			if !compatSameValue(v.Index(i).Interface(), p) {
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
// key of a --config file (a list both as a sequence and as one string),
// parses and reaches its setting; a command given nothing has the documented
// default; and a variable or key the row has not (—) but another command's
// flag of that name has does not reach it (issue 37: nothing that works
// today breaks).
//
// Parsing is costly (80 ms and more a parse under -race, mostly building the
// model), so a parse checks many rows of a command at once, each setting
// given once, one way; a parse that fails is repeated in halves until the
// items that fail are alone. The variables are the process's, so the parses
// run one after another.
func TestCompatibleSurface(t *testing.T) {
	clearEnv(t)
	rows := loadSurface(t)
	s := &surfaceRun{t: t, files: compatFiles(t), results: map[string]map[string]compatResult{}, parsed: map[string][]compatParsed{}}

	var commands []string
	byCommand := map[string][]surfaceItem{}
	for _, r := range rows {
		if _, ok := compatBase[r.command]; !ok {
			t.Fatalf("%s:%d: command %q has no base in compatBase", compatSurfaceFile, r.line, r.command)
		}
		if byCommand[r.command] == nil {
			commands = append(commands, r.command)
		}
		for _, mode := range compatModes {
			if r.takes(mode) {
				byCommand[r.command] = append(byCommand[r.command], surfaceItem{r, mode})
			}
		}
	}
	for _, command := range commands {
		for _, b := range surfaceBatches(byCommand[command]) {
			s.parseBatch(command, b.items)
		}
	}

	for _, r := range rows {
		t.Run(r.name(), func(t *testing.T) {
			for _, mode := range compatModes {
				if !r.takes(mode) {
					continue
				}
				res := s.results[r.name()][mode]
				if refusedMode(mode) {
					switch {
					case res.err != nil:
						t.Errorf("%s (line %d): %s, which is not %s's, breaks its parse: %v\ncommand line: %q", mode, r.line, res.input, r.command, res.err, res.args)
					case res.found && compatSameValue(res.got, s.file(r.want)):
						t.Errorf("%s (line %d): %s reached %s %s, which takes its value from neither (— in %s)", mode, r.line, res.input, r.command, r.flag, compatSurfaceFile)
					}
					continue
				}
				switch {
				case res.err != nil:
					t.Errorf("%s (line %d): %s is not accepted: %v\ncommand line: %q", mode, r.line, res.input, res.err, res.args)
				case !res.found:
					t.Errorf("%s (line %d): %s: the parsed %s has no setting %q", mode, r.line, res.input, r.command, r.setting)
				case !compatSameValue(res.got, s.file(r.want)):
					t.Errorf("%s (line %d): %s: %s is %v, want %s\ncommand line: %q", mode, r.line, res.input, r.setting, res.got, s.file(r.want), res.args)
				}
			}
			if r.def == "" || r.negation {
				return
			}
			got, args, err := s.defaultOf(r)
			switch {
			case err != nil:
				t.Errorf("default (line %d): %q: %v", r.line, args, err)
			case !compatSameValue(got, r.def):
				t.Errorf("default (line %d): %s is %v with %q, want the documented %s", r.line, r.setting, got, args, r.def)
			}
		})
	}
	t.Logf("%d rows in %d parses (%d batches split after failing)", len(rows), s.parses, s.splits)
}
