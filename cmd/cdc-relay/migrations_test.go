package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// migrationFiles are the files of migrations/, in the order docs/postgres.md
// applies them.
var migrationFiles = []string{
	"001_outbox.sql", "002_checkpoints.sql", "003_publication.sql", "004_role.sql",
	"005_dead_letters.sql", "006_consumer.sql", "007_outbox_emit.sql",
}

// TestMigrationsRerunQuietly applies every migration twice, as a superuser
// with psql: the first pass says only what it created, the second, which
// changes nothing, prints no NOTICE ("already exists, skipping" is noise an
// operator has to read past to find a real message).
func TestMigrationsRerunQuietly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg := testenv.NewPostgres(t, sandbox.PGOptions{})
	url, err := pg.CreateDatabase(ctx, "rerun_quietly")
	if err != nil {
		t.Fatal(err)
	}
	notice := regexp.MustCompile(`NOTICE: +(.*)`)
	created := regexp.MustCompile(`^created (role|publication) cdc_relay`)
	for pass := 1; pass <= 2; pass++ {
		for _, f := range migrationFiles {
			out, err := psqlRun(ctx, t, url, f, "cdc_relay_password=rerun-Secret-1")
			if err != nil {
				t.Fatalf("pass %d: psql -f migrations/%s: %v\n%s", pass, f, err, out)
			}
			for _, m := range notice.FindAllStringSubmatch(out, -1) {
				if pass == 2 || !created.MatchString(m[1]) {
					t.Errorf("pass %d of migrations/%s printed %q", pass, f, strings.TrimSpace(m[0]))
				}
			}
		}
	}
}
