package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
	"github.com/cdc-relay/cdc-relay/internal/verify"
)

// TestHundredThousandRowTransaction relays one ~150 MB transaction (spilled
// to disk by Postgres with logical_decoding_work_mem=64kB) with a 4 MiB
// in-flight bound: everything arrives in order and the relay's peak RSS stays
// far below the transaction's size. An ALTER TABLE before it changes the
// relation mid-stream.
func TestHundredThousandRowTransaction(t *testing.T) {
	pg := testenv.NewPostgres(t, sandbox.PGOptions{Settings: map[string]string{"logical_decoding_work_mem": "64kB"}})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	f := newFixture(t, pg, t.Name(), true)
	conn := f.connect(ctx, t)
	var workMem string
	if err := conn.QueryRow(ctx, "SHOW logical_decoding_work_mem").Scan(&workMem); err != nil || workMem != "64kB" {
		t.Fatalf("logical_decoding_work_mem = %q (%v), want 64kB", workMem, err)
	}

	r := newRelay(t, f.relayArgs("--max-in-flight-mib", "4"))
	r.Start()
	r.WaitReady(30 * time.Second)

	// A schema change mid-stream, between events.
	w := verify.NewWriter(f.url, "small-", 3, 4)
	for _, aggs := range [][]string{{"small-0"}, {"small-1", "small-0"}} {
		if err := w.CommitTxn(ctx, conn, aggs); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, "ALTER TABLE outbox_events ADD COLUMN note text DEFAULT 'added mid-stream'"); err != nil {
		t.Fatal(err)
	}
	for _, aggs := range [][]string{{"small-0", "small-2"}, {"small-1"}} {
		if err := w.CommitTxn(ctx, conn, aggs); err != nil {
			t.Fatal(err)
		}
	}

	const rows = 100_000
	start := time.Now()
	_, err := conn.Exec(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'big', 'big-'||(i%50), 'Big', jsonb_build_object('agg', 'big-'||(i%50), 'seq', i, 'pad', repeat('x', 1500))
		FROM generate_series(1, $1::int) AS i`, rows)
	if err != nil {
		t.Fatalf("insert %d rows in one transaction: %v", rows, err)
	}
	commitDone := time.Now()
	var walEnd string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&walEnd); err != nil {
		t.Fatal(err)
	}
	var size int64
	if err := conn.QueryRow(ctx, "SELECT sum(pg_column_size(payload))::bigint FROM outbox_events WHERE aggregate_type = 'big'").Scan(&size); err != nil {
		t.Fatal(err)
	}
	t.Logf("committed %d rows (%d MB of payload) in one transaction in %v", rows, size>>20, commitDone.Sub(start).Round(time.Millisecond))

	committed := w.Committed()
	dbRows, err := conn.Query(ctx, "SELECT id::text, aggregate_id, (payload->>'seq')::int FROM outbox_events WHERE aggregate_type = 'big'")
	if err != nil {
		t.Fatal(err)
	}
	big, err := pgx.CollectRows(dbRows, func(row pgx.CollectableRow) (verify.Event, error) {
		ev := verify.Event{AggregateType: "big", EventType: "Big"}
		return ev, row.Scan(&ev.ID, &ev.Agg, &ev.Seq)
	})
	if err != nil {
		t.Fatal(err)
	}
	committed = append(committed, big...)

	// The relay confirms the slot only past events Kafka acknowledged: wait
	// for that (cheaper than consuming 150 MB twice), then read Kafka once.
	testenv.Eventually(t, 90*time.Second, func() error {
		var done bool
		err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2", walEnd, f.slot).Scan(&done)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			return nil
		}
		if r.Exited() {
			t.Fatalf("relay exited while relaying the transaction")
		}
		return fmt.Errorf("slot not confirmed past %s since the commit", walEnd)
	})
	t.Logf("slot confirmed past the transaction %v after the commit", time.Since(commitDone).Round(time.Millisecond))
	// pg_stat_replication_slots is PostgreSQL 14+: on 13 the spill is not visible.
	var serverVersion int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&serverVersion); err != nil {
		t.Fatal(err)
	}
	if serverVersion >= 140000 {
		var spillTxns, spillBytes int64
		if err := conn.QueryRow(ctx, "SELECT spill_txns, spill_bytes FROM pg_stat_replication_slots WHERE slot_name = $1", f.slot).Scan(&spillTxns, &spillBytes); err != nil {
			t.Fatal(err)
		}
		t.Logf("Postgres spilled %d transactions, %d MB while decoding", spillTxns, spillBytes>>20)
		if spillBytes == 0 {
			t.Errorf("Postgres did not spill the transaction to disk: logical_decoding_work_mem had no effect")
		}
	}
	readStart := time.Now()
	// 150 MB read back by a client under -race, beside the other
	// packages' tests: 9 s alone, over 20 s under make test.
	res, _ := f.waitDelivered(ctx, t, func() []verify.Event { return committed }, 90*time.Second)
	t.Logf("100k-row transaction (read back in %v): %s", time.Since(readStart).Round(time.Millisecond), res)
	requireComplete(t, res)

	if r.Exited() {
		t.Fatalf("relay exited")
	}
	hwm, err := relayproc.PeakRSS(r.PID())
	if err != nil {
		t.Fatalf("read peak RSS: %v", err)
	}
	t.Logf("relay peak RSS (VmHWM): %.1f MB for a %d MB transaction with --max-in-flight-mib 4", float64(hwm)/(1<<20), size>>20)
	if hwm >= 100<<20 {
		t.Errorf("relay peak RSS %.1f MB, want < 100 MB: it buffers the transaction", float64(hwm)/(1<<20))
	}
	r.Stop(10 * time.Second)
}

// TestBadConfiguration runs the binary with configurations it must refuse at
// start, with a non-zero exit (2 for a mistake in the flags, 1 for what the
// servers refuse) and a message naming the fix.
func TestBadConfiguration(t *testing.T) {
	f := newFixture(t, sharedPG, t.Name(), true)
	noTable, err := sharedPG.CreateDatabase(context.Background(), "e2e_bad_config_no_table")
	if err != nil {
		t.Fatal(err)
	}
	closedPort, err := sandbox.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	brokers := strings.Join(f.brokers, ",")
	run := func(extra ...string) []string {
		return append([]string{"run", "--metrics-addr", "127.0.0.1:0", "--log-format", "json", "--topic", f.topic}, extra...)
	}

	tests := []struct {
		name     string
		args     []string
		setup    func(t *testing.T) []string // extra args, for cases that need their own server
		env      []string
		wantCode int // 0, 1 (runtime failure) or 2 (usage or configuration mistake)
		want     []string
		timeout  time.Duration
	}{
		{
			name: "missing pg-url",
			args: run("--kafka-brokers", brokers),
			want: []string{"--pg-url", "CDC_RELAY_PG_URL"}, wantCode: 2,
		},
		{
			name: "missing brokers",
			args: run("--pg-url", f.url),
			want: []string{"--kafka-brokers", "CDC_RELAY_KAFKA_BROKERS"}, wantCode: 2,
		},
		{
			name: "invalid topic",
			args: run("--pg-url", f.url, "--kafka-brokers", brokers, "--topic", "bad topic!"),
			want: []string{"--topic", "CDC_RELAY_TOPIC"}, wantCode: 2,
		},
		{
			name: "invalid topic from environment",
			args: []string{"run", "--metrics-addr", "127.0.0.1:0"},
			env:  []string{"CDC_RELAY_PG_URL=" + f.url, "CDC_RELAY_KAFKA_BROKERS=" + brokers, "CDC_RELAY_TOPIC=bad topic!"},
			want: []string{"--topic", "CDC_RELAY_TOPIC"}, wantCode: 2,
		},
		{
			name: "negative status interval",
			args: run("--pg-url", f.url, "--kafka-brokers", brokers, "--status-interval=-1s"),
			want: []string{"--status-interval", "CDC_RELAY_STATUS_INTERVAL"}, wantCode: 2,
		},
		{
			name: "wal_level replica",
			args: run("--kafka-brokers", brokers, "--slot", "slot_bad_wal_level"),
			setup: func(t *testing.T) []string {
				replica := testenv.NewPostgres(t, sandbox.PGOptions{WalLevel: "replica"})
				return []string{"--pg-url", replica.URL("postgres")}
			},
			want: []string{"wal_level", "logical"}, wantCode: 1,
		},
		{
			name: "outbox table missing",
			args: run("--pg-url", noTable, "--kafka-brokers", brokers, "--slot", "slot_bad_no_table"),
			want: []string{"does not exist", "--table"}, wantCode: 1,
		},
		{
			name: "unreachable broker",
			args: run("--pg-url", f.url, "--kafka-brokers", "127.0.0.1:"+strconv.Itoa(closedPort), "--kafka-start-timeout", "3s", "--slot", f.slot),
			want: []string{"--kafka-brokers"}, wantCode: 1, timeout: 20 * time.Second,
		},
		{
			name: "version",
			args: []string{"version"},
			want: []string{"cdc-relay " + buildVersion}, wantCode: 0,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.timeout == 0 {
				tc.timeout = 15 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			args := tc.args
			if tc.setup != nil {
				args = append(args, tc.setup(t)...)
			}
			cmd := exec.CommandContext(ctx, relayBin, args...)
			cmd.Env = append(cleanEnv(), tc.env...)
			var stdout, stderr sandbox.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			start := time.Now()
			err := cmd.Run()
			elapsed := time.Since(start).Round(time.Millisecond)
			defer func() {
				if t.Failed() {
					t.Logf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
				}
			}()
			if ctx.Err() != nil {
				t.Fatalf("still running after %v (killed)", tc.timeout)
			}
			code := cmd.ProcessState.ExitCode()
			if code != tc.wantCode {
				t.Fatalf("exit code %d (%v), want %d", code, err, tc.wantCode)
			}
			out := stderr.String()
			if tc.wantCode == 0 {
				out = stdout.String()
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not contain %q", w)
				}
			}
			t.Logf("exit %d after %v: %s", code, elapsed, strings.TrimSpace(out))
		})
	}
}

// slotRefusals counts the lines of pg's server log that refuse slot to a
// consumer because another process streams it; 0 for an external server.
func slotRefusals(t *testing.T, pg *sandbox.Postgres, slot string) int {
	t.Helper()
	if pg.LogFile() == "" {
		return 0
	}
	b, err := os.ReadFile(pg.LogFile())
	if err != nil {
		t.Fatalf("read the server log: %v", err)
	}
	return strings.Count(string(b), `replication slot "`+slot+`" is active for PID`)
}

// TestSlotHeldByAnotherConnection starts the relay while another replication
// connection streams its slot: the relay waits as a standby (running, not
// ready) and takes over within seconds once the slot is free.
func TestSlotHeldByAnotherConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	var slotLSN string
	conn := f.connect(ctx, t)
	if err := conn.QueryRow(ctx, "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')", f.slot).Scan(&slotLSN); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE PUBLICATION cdc_relay_outbox FOR TABLE outbox_events WITH (publish = 'insert')"); err != nil {
		t.Fatal(err)
	}
	startLSN, err := pglogrepl.ParseLSN(slotLSN)
	if err != nil {
		t.Fatal(err)
	}

	// Hold the slot: stream it, answer keepalives, confirm nothing new.
	cfg, err := pgconn.ParseConfig(f.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "e2e-slot-holder"
	holder, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = pglogrepl.StartReplication(ctx, holder, f.slot, startLSN, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'cdc_relay_outbox'"},
	})
	if err != nil {
		holder.Close(context.Background())
		t.Fatalf("start replication: %v", err)
	}
	holdCtx, release := context.WithCancel(ctx)
	held := make(chan struct{})
	go func() {
		defer close(held)
		defer holder.Close(context.Background())
		for holdCtx.Err() == nil {
			rctx, rcancel := context.WithTimeout(holdCtx, 500*time.Millisecond)
			_, err := holder.ReceiveMessage(rctx)
			rcancel()
			if err != nil && !pgconn.Timeout(err) {
				return
			}
			_ = pglogrepl.SendStandbyStatusUpdate(context.Background(), holder, pglogrepl.StandbyStatusUpdate{WALWritePosition: startLSN})
		}
	}()
	defer func() {
		release()
		<-held
	}()

	// Failover off: the test counts the server's refusals of START_REPLICATION;
	// on 17+ with failover on, the relay first asks whether the slot is active
	// (to switch failover on) and so waits without a refusal the log would show.
	r := newRelay(t, f.relayArgs("--slot-failover", "off"))
	r.Start()

	testenv.Eventually(t, 15*time.Second, func() error {
		if r.HasLog("held by another process") {
			return nil
		}
		if r.Exited() {
			code, _ := r.Wait(0)
			t.Fatalf("relay exited (code %d) while the slot was held", code)
		}
		return errors.New(`no "held by another process" log line`)
	})
	if code := r.Readyz(); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz = %d while the slot is held, want 503", code)
	}

	w := verify.NewWriter(f.url, "agg-", 5, 6)
	refused := slotRefusals(t, f.pg, f.slot)
	if err := w.CommitTxn(ctx, conn, []string{"agg-1", "agg-2"}); err != nil {
		t.Fatal(err)
	}
	// The relay tries for the slot again and again: two more refusals after
	// the commit show it went on waiting rather than exit or stream.
	if f.pg.LogFile() == "" {
		// A standby polls a held slot at most 2 s apart (full jitter, cap 2 s),
		// so 5 s cover at least two more attempts.
		t.Log("external server: its log cannot show the relay's attempts, waiting 5 s instead")
		time.Sleep(5 * time.Second)
	} else {
		testenv.Eventually(t, 30*time.Second, func() error {
			if n := slotRefusals(t, f.pg, f.slot) - refused; n < 2 {
				return fmt.Errorf("the server refused the slot %d times since the commit, want 2", n)
			}
			return nil
		})
	}
	if r.Exited() {
		code, _ := r.Wait(0)
		t.Fatalf("relay exited (code %d) while the slot was held", code)
	}
	if code := r.Readyz(); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz = %d while the slot is held, want 503", code)
	}
	if recs := f.read(ctx, t); len(recs) != 0 {
		t.Errorf("%d records in Kafka while the relay could not stream", len(recs))
	}

	release()
	<-held
	freed := time.Now()
	f.waitRecords(ctx, t, 2, 10*time.Second)
	t.Logf("relay delivered %v after the slot was released", time.Since(freed).Round(time.Millisecond))
	res, _ := f.waitDelivered(ctx, t, w.Committed, 5*time.Second)
	requireComplete(t, res)
	r.WaitReady(5 * time.Second)
	r.Stop(10 * time.Second)
}

// TestUnixSocket: a relay beside Postgres connects over its Unix socket (the
// docs/postgres.md's advice for one-event transactions: the walsender pays about half
// as much per transaction as over loopback TCP) and delivers everything, its
// replication connection on the socket.
func TestUnixSocket(t *testing.T) {
	if sharedPG.DataDir() == "" {
		t.Skip("an external Postgres: its socket directory is unknown")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newFixture(t, sharedPG, t.Name(), true)
	unixURL := fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", f.db, url.QueryEscape(sharedPG.DataDir()), sharedPG.Port())
	args := f.relayArgs()
	for i := range args {
		if args[i] == f.url {
			args[i] = unixURL
		}
	}
	r := newRelay(t, args)
	r.Start()
	r.WaitReady(30 * time.Second)

	conn := f.connect(ctx, t)
	var port int
	if err := conn.QueryRow(ctx, `SELECT a.client_port FROM pg_replication_slots s
		JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = $1`, f.slot).Scan(&port); err != nil {
		t.Fatalf("find the relay's replication connection: %v", err)
	}
	if port != -1 {
		t.Errorf("replication connection's client_port %d, want -1 (a Unix socket)", port)
	}

	w := verify.NewWriter(f.url, "agg-", 50, 2)
	if err := w.Run(ctx, nil, 500, 1000); err != nil {
		t.Fatal(err)
	}
	res, _ := f.waitDelivered(ctx, t, w.Committed, 30*time.Second)
	requireComplete(t, res)
	r.Stop(10 * time.Second)
}
