package replication_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// TestPublishedTables: PublishedTables names each table a publication
// streams once, a partition as its root whichever way the publication lists
// it, and returns a WAL position past the publication's last change.
func TestPublishedTables(t *testing.T) {
	p := testenv.NewPostgres(t, sandbox.PGOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE TABLE public.outbox_events (id int);
		CREATE TABLE public.outbox_p (id int, at int) PARTITION BY RANGE (at);
		CREATE TABLE public.outbox_p_1 PARTITION OF public.outbox_p FOR VALUES FROM (0) TO (10);
		CREATE TABLE public.outbox_p_2 PARTITION OF public.outbox_p FOR VALUES FROM (10) TO (20);
		CREATE SCHEMA "Bill ing"; CREATE TABLE "Bill ing".outbox_events (id int);
		CREATE PUBLICATION via_root FOR TABLE public.outbox_events, public.outbox_p WITH (publish_via_partition_root = true);
		CREATE PUBLICATION leaves FOR TABLE public.outbox_p, "Bill ing".outbox_events;
		CREATE PUBLICATION one_leaf FOR TABLE public.outbox_p_2;
		CREATE PUBLICATION none`); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		pub  string
		want []string
	}{
		{pub: "via_root", want: []string{"public.outbox_events", "public.outbox_p"}},
		{pub: "leaves", want: []string{"Bill ing.outbox_events", "public.outbox_p"}},
		{pub: "one_leaf", want: []string{"public.outbox_p"}},
		{pub: "none", want: []string{}},
		{pub: "missing", want: []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.pub, func(t *testing.T) {
			var text string
			if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&text); err != nil {
				t.Fatal(err)
			}
			before, err := pglogrepl.ParseLSN(text)
			if err != nil {
				t.Fatal(err)
			}
			got, at, err := replication.PublishedTables(ctx, conn, tt.pub)
			if err != nil {
				t.Fatal(err)
			}
			if got == nil || !slices.Equal(got, tt.want) {
				t.Errorf("PublishedTables(%s) = %q, want %q", tt.pub, got, tt.want)
			}
			if at < before {
				t.Errorf("position %s, before the position read ahead of the call (%s)", at, before)
			}
		})
	}
}
