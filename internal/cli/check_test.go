package cli

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

// update rewrites the golden files of this package's tests from what the
// code prints now: go test ./internal/cli/ -run Golden -update.
var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// golden compares got with testdata/name, or writes it there with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := "testdata/" + name
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to write it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("output differs from %s (-update rewrites it; review the diff):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// checkBase is a complete configuration; each case adds its mistake.
const checkBase = `source:
  pg_url: postgres://relay@db:5432/app
kafka:
  brokers: [k:9092]
`

// checkCases are the mistakes of a new user (issue 45), each with the
// configuration file and the command line that makes it.
var checkCases = []struct {
	name, file string
	args       []string
}{
	{"a good configuration", checkBase, nil},
	{"a bound of a kafka key", checkBase + "  max_in_flight_requests: 9\n", nil},
	{"a duration without a unit", "source:\n  pg_url: postgres://relay@db:5432/app\n  status_interval: 5\nkafka:\n  brokers: [k:9092]\n", nil},
	{"a list --set that is no YAML list", checkBase, []string{"--set", "kafka.brokers=[a:1,b:2"}},
	{"a --set by flag name", checkBase, []string{"--set", "slot=orders"}},
	{"a --set misspelt", checkBase, []string{"--set", "slott=orders"}},
	{"a --set topic template, unquoted", checkBase, []string{"--set", "outbox.topic={aggregate_type}.events"}},
	{"a --set bound", checkBase, []string{"--set", "kafka.max_in_flight_requests=9"}},
	{"a table entry's key misspelt", checkBase + "tables:\n  - public.outbox_events\n  - name: shipping.parcels_outbox\n    colums: {aggregate_id: parcel_id}\n", nil},
	{"a table entry's column misspelt", checkBase + "tables:\n  - name: shipping.parcels_outbox\n    columns:\n      agregate_id: parcel_id\n", nil},
	{"a table entry's slot", checkBase + "tables:\n  - name: shipping.parcels_outbox\n    slot: parcels\n", nil},
	{"a table entry's compression", checkBase + "tables:\n  - name: shipping.parcels_outbox\n    compression: gzip\n", nil},
	{"a table entry's policy", checkBase + "tables:\n  - name: shipping.parcels_outbox\n    on_error: explode\n", nil},
	{"a table entry's topic", checkBase + "tables:\n  - name: shipping.parcels_outbox\n    topic: 'bad topic'\n", nil},
	{"a table entry's header columns", checkBase + "tables:\n  - name: shipping.parcels_outbox\n    header_columns: [a=]\n", nil},
	{"a dotted key", "source.slot: orders\n" + checkBase, nil},
	{"a misspelt section", "sources:\n  slot: orders\n" + checkBase, nil},
	{"a key at the wrong level", checkBase + "metrics_port: 9187\n", nil},
	{"an unquoted topic template", checkBase + "outbox:\n  topic: {aggregate_type}.events\n", nil},
	{"a metrics port out of range", checkBase + "operations:\n  metrics_addr: 127.0.0.1:99999\n", nil},
	{"a topic routing by a missing column", checkBase + "outbox:\n  topic: 'x.{event_type}'\n  columns: {event_type: ''}\n", nil},
}

// TestConfigCheckGolden: config check refuses each mistake with exit 2 and
// a message naming the key as the user wrote it, with its line, and
// accepts a good configuration; the messages are golden text
// (testdata/config-check.golden).
func TestConfigCheckGolden(t *testing.T) {
	var b strings.Builder
	for _, tc := range checkCases {
		clearEnv(t)
		dir := t.TempDir()
		path := writeFile(t, dir, "relay.yaml", tc.file)
		args := append([]string{"config", "check", "--config", path}, tc.args...)
		err, out, _ := run(t, canceled(), args...)
		text := out
		if err != nil {
			text = ErrorLine(err) + "\n"
		}
		fmt.Fprintf(&b, "## %s\n$ cdc-relay config check --config relay.yaml %s\n%s", tc.name, strings.Join(tc.args, " "), strings.ReplaceAll(text, dir+"/", ""))
		fmt.Fprintf(&b, "exit %d\n\n", ExitCode(err))
		good := tc.name == "a good configuration" || strings.HasPrefix(tc.name, "a --set by flag name") ||
			tc.name == "a --set topic template, unquoted" || tc.name == "a dotted key"
		if want := map[bool]int{true: 0, false: ExitUsage}[good]; ExitCode(err) != want {
			t.Errorf("%s: exit %d, want %d", tc.name, ExitCode(err), want)
		}
	}
	golden(t, "config-check.golden", b.String())
}

// TestRunRefusesBadMetricsAddr: run refuses a metrics port out of range as
// a configuration error (exit 2) before it connects anywhere, not as a
// runtime failure when it listens.
func TestRunRefusesBadMetricsAddr(t *testing.T) {
	clearEnv(t)
	for _, addr := range []string{"127.0.0.1:99999", "127.0.0.1", "127.0.0.1:port"} {
		err, _, _ := run(t, canceled(), "run", "--pg-url", "postgres://relay@127.0.0.1:1/app", "--kafka-brokers", "127.0.0.1:1",
			"--metrics-addr", addr, "--log-format", "console")
		if ExitCode(err) != ExitUsage || !strings.Contains(fmt.Sprint(err), "operations.metrics_addr: --metrics-addr") {
			t.Errorf("run --metrics-addr %s: exit %d, %v; want exit %d naming the key", addr, ExitCode(err), err, ExitUsage)
		}
	}
}

// TestConfigPrintTablesGolden: config print shows the whole document: the
// tables entries with their overrides, the rows by section (source,
// tables, outbox, format, kafka, delivery, dead_letters, operations), and
// with --changed only what differs from the defaults; as text and as JSON
// (testdata/config-print-tables.golden).
func TestConfigPrintTablesGolden(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	path := writeFile(t, dir, "relay.yaml", `source:
  pg_url: postgres://relay:secret-1@db:5432/app
kafka:
  brokers: [kafka-1:9092, kafka-2:9092]
  compression: zstd
tables:
  - public.outbox_events
  - name: shipping.parcels_outbox
    topic: 'shipping.{aggregate_type}'
    columns: {aggregate_id: parcel_id}
    on-error: halt
    header_columns: [carrier, region=x-region]
delivery:
  mode: at-least-once
operations:
  metrics_addr: 0.0.0.0:9187
`)
	var b strings.Builder
	for _, args := range [][]string{{"--changed"}, {"--changed", "--json"}} {
		err, out, _ := run(t, canceled(), append([]string{"config", "print", "--config", path, "--set", "slot=orders"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "$ cdc-relay config print --config relay.yaml --set slot=orders %s\n%s\n", strings.Join(args, " "), strings.ReplaceAll(out, dir+"/", ""))
	}
	golden(t, "config-print-tables.golden", b.String())
	// Without --changed every setting is there, by section.
	err, out, _ := run(t, canceled(), "config", "print", "--config", path)
	if err != nil {
		t.Fatal(err)
	}
	var sections []string
	for _, line := range strings.Split(out, "\n")[2:] {
		if sec, _, _ := strings.Cut(strings.Fields(line + " x")[0], "."); len(sections) == 0 || sections[len(sections)-1] != sec {
			sections = append(sections, sec)
		}
	}
	want := "source tables tables[shipping messages outbox format kafka delivery dead_letters operations x"
	if got := strings.Join(sections, " "); got != want {
		t.Errorf("sections in the order %s, want %s", got, want)
	}
}
