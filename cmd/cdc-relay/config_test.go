package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/relayproc/relaytest"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// TestRunFromConfigFile starts the built relay with nothing on its command
// line but "run --config FILE" and no CDC_RELAY_* variable: everything comes
// from the YAML file. An event committed in Postgres must reach Kafka, and
// config print must report the file as the source of what it set.
func TestRunFromConfigFile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	port, err := sandbox.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	metrics := "127.0.0.1:" + strconv.Itoa(port)
	var brokers strings.Builder
	for _, b := range f.brokers {
		fmt.Fprintf(&brokers, "\n  - %s", b)
	}
	path := filepath.Join(t.TempDir(), "cdc-relay.yaml")
	config := `# cdc-relay configuration: keys are the flag names without the dashes.
pg-url: ` + f.url + `
kafka-brokers:` + brokers.String() + `
topic: ` + f.topic + `
slot: ` + f.slot + `
metrics-addr: ` + metrics + `
log-format: json
status-interval: 200ms
retry-cap: 1s
create-slot: true
header-columns: [aggregate_id=x-aggregate]
rate: 10   # a replay flag: run ignores it
`
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}

	// config print: the file's settings, their source, the password hidden.
	show := exec.Command(relayBin, "config", "print", "--config", path)
	show.Env = cleanEnv()
	out, err := show.CombinedOutput()
	if err != nil {
		t.Fatalf("config print: %v\n%s", err, out)
	}
	for _, want := range []string{"kafka-brokers  ", f.topic, f.slot, metrics} {
		if !strings.Contains(string(out), want) {
			t.Errorf("config print lacks %q:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "topic ") && !strings.HasSuffix(line, " file") {
			t.Errorf("config print: %q, want source file", line)
		}
	}

	// The config file sets the metrics address: no --metrics-addr added.
	r := relaytest.New(t, relayproc.Options{Path: relayBin, Args: []string{"run", "--config", path}, MetricsAddr: metrics})
	r.Start()
	r.WaitReady(30 * time.Second)

	if err := f.pg.Exec(ctx, f.db, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', 'order-7', 'created', '{"total": 42}')`); err != nil {
		t.Fatal(err)
	}
	f.waitRecords(ctx, t, 1, 30*time.Second)
	recs := f.read(ctx, t)
	if len(recs) != 1 {
		t.Fatalf("%d records in %s, want 1", len(recs), f.topic)
	}
	rec := recs[0]
	if string(rec.Key) != "order-7" || !strings.Contains(string(rec.Value), `"total": 42`) {
		t.Errorf("record key %q value %q", rec.Key, rec.Value)
	}
	if rec.Headers["x-aggregate"] != "order-7" {
		t.Errorf("header x-aggregate = %q, want order-7 (header-columns from the file); headers %v", rec.Headers["x-aggregate"], rec.Headers)
	}
	if !r.HasLog("starting cdc-relay") {
		t.Errorf("no JSON start log line (log-format: json from the file)")
	}
	r.Stop(10 * time.Second)
}
