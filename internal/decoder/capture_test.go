package decoder

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

var update = flag.Bool("update", false, "regenerate testdata/*.bin from a throwaway PostgreSQL 15 cluster (see testdata/README.md)")

// captureSQL is the workload whose pgoutput stream the fixtures hold. Each entry runs
// as one statement on one connection, so the session-level replication origin applies.
// TestRealFixtures asserts on what it produces; keep the two in step.
var captureSQL = []string{
	`CREATE TYPE order_status AS ENUM ('new', 'paid')`,
	`CREATE TABLE orders (id bigint PRIMARY KEY, status order_status NOT NULL, total numeric NOT NULL)`,
	`ALTER TABLE orders REPLICA IDENTITY FULL`,
	`CREATE TABLE outbox_events (
		id             uuid PRIMARY KEY,
		aggregate_type text NOT NULL,
		aggregate_id   text NOT NULL,
		legacy         text,
		event_type     text NOT NULL,
		payload        jsonb NOT NULL,
		created_at     timestamptz NOT NULL DEFAULT now(),
		correlation_id text
	)`,
	`CREATE PUBLICATION pub FOR TABLE orders, outbox_events WITH (publish = 'insert, update, delete, truncate')`,
	`SELECT pg_create_logical_replication_slot('slot', 'pgoutput')`,

	// A business transaction: an order and its event.
	`BEGIN`,
	`INSERT INTO orders VALUES (1, 'new', 129.90)`,
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, legacy, event_type, payload, correlation_id)
	 VALUES ('00000000-0000-0000-0000-000000000001', 'order', '1', 'old', 'OrderPlaced', '{"order_id": 1, "total": "129.90"}', 'corr-1')`,
	`COMMIT`,

	// NULL in the nullable correlation_id, unicode in key and payload.
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
	 VALUES ('00000000-0000-0000-0000-000000000002', 'customer', 'ключ-7', 'CustomerRenamed', '{"name": "Zoë Ångström — 日本語 🚀"}')`,

	// A rolled-back transaction: absent from the stream.
	`BEGIN`,
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
	 VALUES ('00000000-0000-0000-0000-000000000003', 'order', '3', 'RolledBack', '{}')`,
	`ROLLBACK`,

	// A rolled-back savepoint: event 5 is absent, 4 and 6 are there.
	`BEGIN`,
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
	 VALUES ('00000000-0000-0000-0000-000000000004', 'order', '4', 'BeforeSavepoint', '{}')`,
	`SAVEPOINT s1`,
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
	 VALUES ('00000000-0000-0000-0000-000000000005', 'order', '5', 'RolledBackSavepoint', '{}')`,
	`ROLLBACK TO SAVEPOINT s1`,
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
	 VALUES ('00000000-0000-0000-0000-000000000006', 'order', '6', 'AfterSavepoint', '{}')`,
	`COMMIT`,

	// UPDATE and DELETE of the outbox, an UPDATE with an old tuple (replica identity
	// full), logical decoding messages inside and outside a transaction.
	`UPDATE outbox_events SET correlation_id = 'corr-2' WHERE id = '00000000-0000-0000-0000-000000000002'`,
	`BEGIN`,
	`UPDATE orders SET status = 'paid' WHERE id = 1`,
	`SELECT pg_logical_emit_message(true, 'cdc-relay', 'transactional')`,
	`DELETE FROM outbox_events WHERE id = '00000000-0000-0000-0000-000000000001'`,
	`COMMIT`,
	`SELECT pg_logical_emit_message(false, 'cdc-relay', 'non-transactional')`,

	// An event deleted in its own transaction is still published.
	`BEGIN`,
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
	 VALUES ('00000000-0000-0000-0000-000000000007', 'order', '7', 'DeletedRightAway', '{}')`,
	`DELETE FROM outbox_events WHERE id = '00000000-0000-0000-0000-000000000007'`,
	`COMMIT`,

	`TRUNCATE orders`,

	// A transaction with a replication origin: an Origin message after Begin.
	`SELECT pg_replication_origin_create('upstream')`,
	`SELECT pg_replication_origin_session_setup('upstream')`,
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
	 VALUES ('00000000-0000-0000-0000-000000000008', 'order', '8', 'FromOrigin', '{}')`,
	`SELECT pg_replication_origin_session_reset()`,

	// Schema change: the next insert brings a new Relation message with shifted columns.
	`ALTER TABLE outbox_events DROP COLUMN legacy, ADD COLUMN tenant text`,
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload, correlation_id, tenant)
	 VALUES ('00000000-0000-0000-0000-000000000009', 'order', '9', 'AfterAlter', '{"n": 9}', 'corr-9', 'acme')`,

	// A payload big enough to be stored out of line (TOAST); pgoutput sends it whole.
	`INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
	 SELECT '00000000-0000-0000-0000-000000000010', 'order', '10', 'Large',
	        jsonb_build_object('blob', string_agg(md5(i::text), '')) FROM generate_series(1, 200) i`,
}

// captureQuery reads the stream. Each row is one pgoutput message. messages=true adds
// logical decoding messages ('M'), which the relay may or may not ask for.
const captureQuery = `SELECT data FROM pg_logical_slot_peek_binary_changes('slot', NULL, NULL,
	'proto_version', '1', 'publication_names', 'pub', 'messages', 'true')`

// TestCaptureFixtures regenerates testdata/*.bin. It needs PostgreSQL 15 binaries
// (PG_BIN, default /usr/lib/postgresql/15/bin); as root it runs them as the
// postgres OS user.
//
//	go test ./internal/decoder -run TestCaptureFixtures -update
func TestCaptureFixtures(t *testing.T) {
	if !*update {
		t.Skip("run with -update to regenerate testdata from PostgreSQL 15")
	}
	capture(t, captureSQL, "testdata")
}

// capture runs workload on a throwaway PostgreSQL 15 cluster and replaces
// dir/*.bin with the pgoutput messages of slot "slot", publication "pub".
func capture(t *testing.T, workload []string, dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	url := startPostgres(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	var version string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(version, "15.") {
		t.Fatalf("server version %s, want 15.x", version)
	}
	for _, sql := range workload {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	rows, err := conn.Query(ctx, captureQuery)
	if err != nil {
		t.Fatal(err)
	}
	var msgs [][]byte
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, data)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	old, err := filepath.Glob(filepath.Join(dir, "*.bin"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	for i, m := range msgs {
		name := fmt.Sprintf("pg15-%03d-%s.bin", i, strings.ReplaceAll(messageName(m[0]), " ", "-"))
		if err := os.WriteFile(filepath.Join(dir, name), m, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("wrote %d messages from PostgreSQL %s to %s", len(msgs), version, dir)
}

// startPostgres starts a throwaway cluster with wal_level=logical on a free port and
// returns its URL. The cluster is stopped and removed when the test ends.
func startPostgres(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("PG_BIN")
	if bin == "" {
		bin = "/usr/lib/postgresql/15/bin"
	}
	// Not t.TempDir: its parent is private to root and the server runs as postgres.
	dir, err := os.MkdirTemp("", "cdc-relay-capture-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })

	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs a postgres OS user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}

	data := filepath.Join(dir, "data")
	run("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale")
	opts := fmt.Sprintf("-c port=%d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s "+
		"-c wal_level=logical -c max_replication_slots=4 -c max_wal_senders=4 -c fsync=off", port, dir)
	run("pg_ctl", "-D", data, "-l", filepath.Join(dir, "log"), "-w", "-o", opts, "start")
	t.Cleanup(func() { run("pg_ctl", "-D", data, "-m", "immediate", "-w", "stop") })
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
}
