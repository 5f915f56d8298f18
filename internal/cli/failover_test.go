package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestSlotFailoverOnRefusedBelow17: run --slot-failover on against a server
// older than 17 stops at start, before Kafka, naming the version and the flag.
func TestSlotFailoverOnRefusedBelow17(t *testing.T) {
	pg := testenv.NewPostgres(t, sandbox.PGOptions{})
	if pg.Major() >= 17 {
		t.Skipf("skip: the refusal needs a server older than 17, the test started %s", pg.Describe())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url, err := pg.CreateDatabase(ctx, "cdc_relay_cli_failover")
	if err != nil {
		t.Fatal(err)
	}
	sql, err := os.ReadFile(filepath.Join("..", "..", "migrations", "001_outbox.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, "cdc_relay_cli_failover", string(sql)); err != nil {
		t.Fatal(err)
	}
	err, _, _ = run(t, ctx, "run", "--pg-url", url, "--kafka-brokers", closedAddr(t), "--slot-failover", "on")
	if err == nil {
		t.Fatal("run --slot-failover on started below PostgreSQL 17")
	}
	t.Logf("refused: %v", err)
	for _, want := range []string{fmt.Sprintf("the server is PostgreSQL %d.", pg.Major()), "--slot-failover", "CDC_RELAY_SLOT_FAILOVER"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "Kafka") {
		t.Errorf("error %q is about Kafka: the failover mode must be refused first", err)
	}
}
