package replication_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/setting"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

func TestWantFailover(t *testing.T) {
	tests := []struct {
		mode    string
		version int
		want    bool
		err     string // substring of the error; "" for none
	}{
		{mode: "auto", version: 150014, want: false},
		{mode: "", version: 160004, want: false},
		{mode: "auto", version: 170000, want: true},
		{mode: "auto", version: 180001, want: true},
		{mode: "off", version: 170002, want: false},
		{mode: "on", version: 170002, want: true},
		{mode: "on", version: 150014, err: "failover slots need PostgreSQL 17 or later, but the server is PostgreSQL 15.14 (server_version_num 150014)"},
		{mode: "on", version: 130020, err: "PostgreSQL 13.20"},
		{mode: "maybe", version: 170002, err: `unknown slot failover mode "maybe"`},
	}
	for _, tt := range tests {
		got, err := replication.WantFailover(tt.mode, tt.version, setting.Namer{})
		if tt.err == "" {
			if err != nil || got != tt.want {
				t.Errorf("WantFailover(%q, %d) = %v, %v; want %v, nil", tt.mode, tt.version, got, err, tt.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("WantFailover(%q, %d) error = %v; want one containing %q", tt.mode, tt.version, err, tt.err)
			continue
		}
		var fe *setting.FieldError
		if !errors.As(err, &fe) || fe.Field != "SlotFailover" {
			t.Errorf("WantFailover(%q, %d) error %v does not name the setting SlotFailover", tt.mode, tt.version, err)
		}
		if !errors.As(err, new(*replication.ConfigError)) {
			t.Errorf("WantFailover(%q, %d) error %v is not a *ConfigError", tt.mode, tt.version, err)
		}
	}
}

func TestVersionName(t *testing.T) {
	for num, want := range map[int]string{170002: "17.2", 150014: "15.14", 180000: "18.0", 90624: "9.6.24"} {
		if got := replication.VersionName(num); got != want {
			t.Errorf("VersionName(%d) = %q, want %q", num, got, want)
		}
	}
}

// slotFailover reads pg_replication_slots.failover (17+).
func slotFailover(t *testing.T, ctx context.Context, conn *pgx.Conn, slot string) bool {
	t.Helper()
	var on bool
	if err := conn.QueryRow(ctx, "SELECT failover FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&on); err != nil {
		t.Fatalf("read failover of slot %s: %v", slot, err)
	}
	return on
}

// TestFailoverSlots runs on whatever server the sandbox starts: below 17 it
// checks that auto resolves to off and on is refused, and that ReadFailover
// reads only the version; on 17+ that CreateSlot makes a failover slot and
// EnableFailover switches an existing slot on.
func TestFailoverSlots(t *testing.T) {
	p := testenv.NewPostgres(t, sandbox.PGOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	url := p.URL("postgres")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	version, err := replication.ServerVersion(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if got := version / 10000; got != p.Major() {
		t.Fatalf("ServerVersion = %d, but the sandbox reports major %d", version, p.Major())
	}
	want, err := replication.WantFailover(replication.FailoverAuto, version, setting.Namer{})
	if err != nil {
		t.Fatal(err)
	}
	if want != (p.Major() >= 17) {
		t.Fatalf("auto on PostgreSQL %d resolved to failover %v", p.Major(), want)
	}
	_, onErr := replication.WantFailover(replication.FailoverOn, version, setting.Namer{})

	if p.Major() < 17 {
		if onErr == nil || !strings.Contains(onErr.Error(), "PostgreSQL "+replication.VersionName(version)) {
			t.Fatalf("on below 17: error %v, want one naming the version %s", onErr, replication.VersionName(version))
		}
		if err := replication.CreateSlot(ctx, url, "plain", false, setting.Namer{}); err != nil {
			t.Fatal(err)
		}
		s, err := replication.ReadFailover(ctx, conn, "plain")
		if err != nil {
			t.Fatal(err)
		}
		if s.Supported() || s.SlotExists || s.ServerVersion != version {
			t.Fatalf("ReadFailover below 17 = %+v, want only the version %d", s, version)
		}
		return
	}

	if onErr != nil {
		t.Fatalf("on at PostgreSQL %d: %v", p.Major(), onErr)
	}
	// Created with failover.
	if err := replication.CreateSlot(ctx, url, "fo", true, setting.Namer{}); err != nil {
		t.Fatal(err)
	}
	if !slotFailover(t, ctx, conn, "fo") {
		t.Fatal("slot created with failover has failover = false")
	}
	// Created with an exported snapshot and failover.
	if _, err := replication.CreateSlotWithSnapshot(ctx, url, "fo_snap", true, setting.Namer{}, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if !slotFailover(t, ctx, conn, "fo_snap") {
		t.Fatal("slot created with a snapshot and failover has failover = false")
	}
	// Created without, then switched on.
	if err := replication.CreateSlot(ctx, url, "plain", false, setting.Namer{}); err != nil {
		t.Fatal(err)
	}
	s, err := replication.ReadFailover(ctx, conn, "plain")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Supported() || !s.SlotExists || s.SlotFailover || s.SlotSynced || s.StandbySlots != "" || s.InRecovery {
		t.Fatalf("ReadFailover of a new plain slot = %+v", s)
	}
	if err := replication.EnableFailover(ctx, url, "plain", setting.Namer{}); err != nil {
		t.Fatal(err)
	}
	if s, err = replication.ReadFailover(ctx, conn, "plain"); err != nil || !s.SlotFailover {
		t.Fatalf("after EnableFailover: %+v, %v", s, err)
	}
	// A missing slot.
	if s, err = replication.ReadFailover(ctx, conn, "none"); err != nil || s.SlotExists || s.SlotFailover {
		t.Fatalf("ReadFailover of a missing slot: %+v, %v", s, err)
	}
	// A slot in use is ErrSlotBusy.
	repl, err := replication.ConnectReplication(ctx, url, setting.Namer{})
	if err != nil {
		t.Fatal(err)
	}
	defer repl.Close(context.Background())
	if err := replication.CreateSlot(ctx, url, "busy", false, setting.Namer{}); err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.StartReplication(ctx, repl, "busy", 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'none'"},
	}); err != nil {
		t.Fatalf("start replication of slot busy: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		err := replication.EnableFailover(ctx, url, "busy", setting.Namer{})
		if !errors.Is(err, replication.ErrSlotBusy) {
			return errors.New("EnableFailover of a slot in use returned " + errString(err) + ", want ErrSlotBusy")
		}
		return nil
	})
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// TestFailoverStandbySlots checks that ReadFailover reads
// synchronized_standby_slots (17+ only).
func TestFailoverStandbySlots(t *testing.T) {
	p := testenv.NewPostgres(t, sandbox.PGOptions{})
	if p.Major() < 17 {
		t.Skipf("skip: needs PostgreSQL 17 or later (failover slots), the sandbox started %s: set %s to the bin directory of a 17+ server", p.Describe(), sandbox.EnvPGBinDir)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, q := range []string{
		"SELECT pg_create_physical_replication_slot('sb1')",
		"ALTER SYSTEM SET synchronized_standby_slots = 'sb1'",
		"SELECT pg_reload_conf()",
	} {
		if err := p.Exec(ctx, "postgres", q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		conn, err := pgx.Connect(ctx, p.URL("postgres"))
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		s, err := replication.ReadFailover(ctx, conn, "none")
		if err != nil {
			return err
		}
		if s.StandbySlots != "sb1" {
			return errors.New("StandbySlots = " + s.StandbySlots + ", want sb1")
		}
		return nil
	})
}

// TestEnableFailoverRefusesBadName: the slot name is spliced into a
// replication command, so an invalid one is refused before connecting.
func TestEnableFailoverRefusesBadName(t *testing.T) {
	err := replication.EnableFailover(t.Context(), "postgres://127.0.0.1:1/x", "x (FAILOVER false); --", setting.Namer{})
	if err == nil || !strings.Contains(err.Error(), "invalid slot name") {
		t.Fatalf("EnableFailover with an invalid name: %v, want an invalid-name error", err)
	}
}

// TestReadStandbyFlush (17+): the standbys' flush position is the least
// restart_lsn of the physical slots synchronized_standby_slots names, 0
// while one of them is missing or never used, and nothing without the
// setting; the WAL end is past a transaction committed before the read.
func TestReadStandbyFlush(t *testing.T) {
	p := testenv.NewPostgres(t, sandbox.PGOptions{})
	if p.Major() < 17 {
		t.Skipf("skip: needs PostgreSQL 17 or later (synchronized_standby_slots), the sandbox started %s: set %s to the bin directory of a 17+ server", p.Describe(), sandbox.EnvPGBinDir)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	exec := func(q string) {
		t.Helper()
		if err := p.Exec(ctx, "postgres", q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// sb1 and sb2 reserve WAL at creation (restart_lsn: the last
	// checkpoint's redo position); sb3 does not.
	exec("SELECT pg_create_physical_replication_slot('sb1', true)")
	exec("CREATE TABLE t (n int)")
	exec("CHECKPOINT")
	exec("SELECT pg_create_physical_replication_slot('sb2', true)")
	exec("SELECT pg_create_physical_replication_slot('sb3')")
	restart := func(conn *pgx.Conn, slot string) pglogrepl.LSN {
		t.Helper()
		var s string
		if err := conn.QueryRow(ctx, "SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&s); err != nil {
			t.Fatal(err)
		}
		lsn, err := pglogrepl.ParseLSN(s)
		if err != nil {
			t.Fatal(err)
		}
		return lsn
	}
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	sb1, sb2 := restart(conn, "sb1"), restart(conn, "sb2")
	if sb1 >= sb2 {
		t.Fatalf("sb1 reserved at %s, sb2 at %s: want sb1 first", sb1, sb2)
	}
	tests := []struct {
		setting string
		want    pglogrepl.LSN
	}{
		{"", 0},
		{"sb2", sb2},
		{"sb2, sb1", sb1},
		{`"sb1"`, sb1},
		{"sb1,sb3", 0}, // never used: no restart_lsn
		{"sb1,gone", 0},
	}
	for _, tt := range tests {
		exec("ALTER SYSTEM SET synchronized_standby_slots = '" + strings.ReplaceAll(tt.setting, "'", "''") + "'")
		exec("SELECT pg_reload_conf()")
		// pg_reload_conf only signals: new backends see the setting.
		testenv.Eventually(t, 10*time.Second, func() error {
			c, err := pgx.Connect(ctx, p.URL("postgres"))
			if err != nil {
				return err
			}
			defer c.Close(context.Background())
			var committed string
			if err := c.QueryRow(ctx, "INSERT INTO t VALUES (2) RETURNING pg_current_wal_insert_lsn()::text").Scan(&committed); err != nil {
				return err
			}
			before, err := pglogrepl.ParseLSN(committed)
			if err != nil {
				return err
			}
			s, err := replication.ReadStandbyFlush(ctx, c)
			if err != nil {
				return err
			}
			if s.Slots != tt.setting || s.Flushed != tt.want {
				return fmt.Errorf("synchronized_standby_slots %q: read slots %q flushed %s, want %q and %s", tt.setting, s.Slots, s.Flushed, tt.setting, tt.want)
			}
			if s.WALEnd <= before {
				return fmt.Errorf("WAL end %s, not past the insert committed at %s", s.WALEnd, before)
			}
			return nil
		})
	}
}
