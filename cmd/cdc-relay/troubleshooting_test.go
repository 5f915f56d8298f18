package main

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// troubleshootingQuotes returns the messages docs/troubleshooting.md quotes
// as the relay prints them: the bold code spans of "Common first-run errors"
// (whitespace joined to one space, as a line break in the Markdown is) and
// the lines starting "cdc-relay: " of its code blocks.
func troubleshootingQuotes(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	var quotes []string
	for _, line := range strings.Split(doc, "\n") {
		if l := strings.TrimSpace(line); strings.HasPrefix(l, "cdc-relay: ") {
			quotes = append(quotes, l)
		}
	}
	i := strings.Index(doc, "\n## Common first-run errors\n")
	if i < 0 {
		t.Fatal(`docs/troubleshooting.md has no section "Common first-run errors"`)
	}
	section := doc[i+1:]
	if j := strings.Index(section[3:], "\n## "); j >= 0 {
		section = section[:j+3]
	}
	space := regexp.MustCompile(`\s+`)
	for _, m := range regexp.MustCompile("\\*\\*`([^`]+)`\\*\\*").FindAllStringSubmatch(section, -1) {
		quotes = append(quotes, space.ReplaceAllString(m[1], " "))
	}
	if len(quotes) < 10 {
		t.Fatalf("found only %d quoted messages in docs/troubleshooting.md: %q", len(quotes), quotes)
	}
	return quotes
}

// quoteMatches reports whether out holds quote, where "…" in quote stands
// for any text: its pieces appear in out in order.
func quoteMatches(quote, out string) bool {
	for _, piece := range strings.Split(quote, "…") {
		piece = strings.TrimSpace(piece)
		i := strings.Index(out, piece)
		if i < 0 {
			return false
		}
		out = out[i+len(piece):]
	}
	return true
}

// TestTroubleshootingQuotes makes the first-run errors docs/troubleshooting.md
// lists happen, with the built binary against real servers (a wrong password,
// a pg_hba.conf that rejects the user, a missing database, nothing listening,
// wal_level=replica, no outbox table, no publication, a role without
// REPLICATION, no broker, a missing topic, a broken and a misspelt --config
// file, no --pg-url), and checks that every message the page quotes is in
// what the binary printed ("…" standing for any text), so that a search for
// the printed text finds its entry.
func TestTroubleshootingQuotes(t *testing.T) {
	quotes := troubleshootingQuotes(t)
	pg := testenv.NewPostgres(t, sandbox.PGOptions{HBA: []string{
		"host all ts_pw 127.0.0.1/32 scram-sha-256",
		"host all ts_rejected 127.0.0.1/32 reject",
	}})
	testenv.RequireLocal(t, pg)
	replica := testenv.NewPostgres(t, sandbox.PGOptions{WalLevel: "replica"})
	k := testenv.NewKafka(t, sandbox.KafkaOptions{NoAutoCreate: true, Topics: []string{"outbox.events"}})
	brokers := strings.Join(k.Brokers(), ",")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	if err := pg.Exec(ctx, "postgres", "CREATE ROLE ts_pw LOGIN REPLICATION PASSWORD 'right-Secret-5'; CREATE ROLE ts_rejected LOGIN; CREATE ROLE ts_norepl LOGIN"); err != nil {
		t.Fatal(err)
	}
	outboxURL, err := pg.CreateDatabase(ctx, "ts_outbox")
	if err != nil {
		t.Fatal(err)
	}
	applyMigrations(t, outboxURL)
	emptyURL, err := pg.CreateDatabase(ctx, "ts_empty")
	if err != nil {
		t.Fatal(err)
	}
	// ts_norepl owns its database and outbox: only REPLICATION is missing.
	noreplURL, err := pg.CreateDatabase(ctx, "ts_norepl")
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, "ts_norepl", "ALTER DATABASE ts_norepl OWNER TO ts_norepl; ALTER SCHEMA public OWNER TO ts_norepl"); err != nil {
		t.Fatal(err)
	}
	noreplURL = withUser(t, noreplURL, url.User("ts_norepl"))
	applyMigrations(t, noreplURL)

	closedPort, err := sandbox.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	closed := "127.0.0.1:" + strconv.Itoa(closedPort)
	pgAt := func(user *url.Userinfo, db string) string {
		u, err := url.Parse(pg.URL(db))
		if err != nil {
			t.Fatal(err)
		}
		u.User = user
		return u.String()
	}
	dir := t.TempDir()
	writeFile := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeFile("relay.yaml", "# a --config file\nslot: ts_yaml\n\ntopic: outbox.events\n\nmetrics-addr: 127.0.0.1:0\nkafka-brokers: [kafka-1:9092\n")
	writeFile("misspelt.yaml", "pg-ulr: postgres://db/app\n")

	runAt := func(brokers, pgURL, slot string, extra ...string) []string {
		return append([]string{"run", "--pg-url", pgURL, "--kafka-brokers", brokers, "--slot", slot,
			"--metrics-addr", "127.0.0.1:0", "--log-format", "console", "--kafka-start-timeout", "3s"}, extra...)
	}
	run := func(pgURL, slot string, extra ...string) []string { return runAt(brokers, pgURL, slot, extra...) }
	cases := []struct {
		name string
		args []string
	}{
		{"no pg-url", []string{"run", "--kafka-brokers", brokers, "--log-format", "console"}},
		{"wrong password", run(pgAt(url.UserPassword("ts_pw", "wrong-Secret-6"), "postgres"), "ts_pw")},
		{"pg_hba rejects", run(pgAt(url.User("ts_rejected"), "postgres"), "ts_rejected")},
		{"no database", run(pg.URL("ts_no_such_db"), "ts_no_db")},
		{"nothing listens", run("postgres://postgres@"+closed+"/postgres?sslmode=disable", "ts_closed")},
		{"wal_level replica", run(replica.URL("postgres"), "ts_replica")},
		{"no outbox table", run(emptyURL, "ts_empty")},
		{"no publication", run(outboxURL, "ts_no_pub", "--no-create-publication")},
		{"no REPLICATION", run(noreplURL, "ts_norepl")},
		{"no broker", runAt(closed, outboxURL, "ts_no_broker")},
		{"no topic", run(outboxURL, "ts_no_topic", "--topic", "ts.missing")},
		{"broken YAML", []string{"run", "--config", "relay.yaml", "--log-format", "console"}},
		{"misspelt key", []string{"run", "--config", "misspelt.yaml", "--log-format", "console"}},
	}
	var outputs []string
	for _, tc := range cases {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		cmd := exec.CommandContext(cctx, relayBin, tc.args...)
		cmd.Dir = dir
		cmd.Env = cleanEnv()
		out, _ := cmd.CombinedOutput()
		timedOut := cctx.Err() != nil
		cancel()
		if timedOut {
			t.Fatalf("%s: still running after 30s:\n%s", tc.name, out)
		}
		if cmd.ProcessState.ExitCode() == 0 {
			t.Errorf("%s: exited 0:\n%s", tc.name, out)
		}
		t.Logf("%s (exit %d):\n%s", tc.name, cmd.ProcessState.ExitCode(), strings.TrimSpace(string(out)))
		outputs = append(outputs, string(out))
	}
	for _, q := range quotes {
		found := false
		for _, out := range outputs {
			if quoteMatches(q, out) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("docs/troubleshooting.md quotes %q, which none of the failures printed (see the log above)", q)
		}
	}
}
