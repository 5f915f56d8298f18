package gaps_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// TestWatchSlotHealth judges the slot's health columns as each server version
// reports them: an invalidated slot (wal_status lost on 13+, conflicting on
// 16, invalidation_reason on 17+) stops the relay with a slot_lost gap and
// the way out; unreserved is a loud alert that does not stop it.
func TestWatchSlotHealth(t *testing.T) {
	yes, no := true, false
	safe := int64(-4096)
	base := replication.SlotState{Exists: true, Plugin: "pgoutput", WALStatus: "reserved", WALKeepSize: 1 << 20}
	with := func(f func(s *replication.SlotState)) replication.SlotState { s := base; f(&s); return s }
	cov := replication.Coverage{TableOID: 1, PubExists: true, PubInsert: true, Covered: true}
	tests := []struct {
		name    string
		slot    replication.SlotState
		fatal   bool
		verdict gaps.Verdict // of the wal_status check, when not fatal
		want    []string
	}{
		{"reserved, 16, not conflicting", with(func(s *replication.SlotState) { s.Conflicting = &no }), false, gaps.OK, nil},
		{"unreserved", with(func(s *replication.SlotState) { s.WALStatus, s.SafeWALSize = "unreserved", &safe }), false, gaps.Alert,
			[]string{"'unreserved'", "1048576 bytes", "ALTER SYSTEM SET max_slot_wal_keep_size"}},
		{"lost on 13-15", with(func(s *replication.SlotState) { s.WALStatus = "lost" }), true, 0,
			[]string{"wal_status 'lost'", "max_slot_wal_keep_size allows", "Backfill", "pg_drop_replication_slot('orders_outbox')", "(command replay since="}},
		{"conflicting on 16", with(func(s *replication.SlotState) { s.WALStatus, s.Conflicting = "reserved", &yes }), true, 0,
			[]string{"conflicting", "hot_standby_feedback", "pg_drop_replication_slot"}},
		// 16.14 sets conflicting on a slot whose WAL was removed too: on a
		// primary lost wins; on a standby the conflict does.
		{"lost and conflicting on 16", with(func(s *replication.SlotState) { s.WALStatus, s.Conflicting = "lost", &yes }), true, 0,
			[]string{"max_slot_wal_keep_size"}},
		{"lost and conflicting on a 16 standby", with(func(s *replication.SlotState) {
			s.WALStatus, s.Conflicting, s.InRecovery = "lost", &yes, true
		}), true, 0, []string{"conflict with recovery", "hot_standby_feedback = on"}},
		{"idle timeout on 18", with(func(s *replication.SlotState) {
			s.WALStatus, s.Conflicting, s.InvalidationReason = "lost", &no, "idle_timeout"
		}), true, 0, []string{"invalidation_reason 'idle_timeout'", "idle_replication_slot_timeout"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &gaps.Facts{Setup: replication.SetupConfig{Slot: "orders_outbox", Publication: "p", Schema: "public", Table: "outbox"},
				Slot: tt.slot, Coverage: cov, Prev: gaps.Previous{WALStatus: "reserved"}}
			r := gaps.Judge(gaps.PhaseWatch, f)
			var gap *gaps.GapError
			var msg string
			if tt.fatal {
				if !errors.As(r.Err, &gap) || gap.Kind != gaps.SlotLost || r.Failed != gaps.SlotLost.String() {
					t.Fatalf("report = %+v, want a fatal slot_lost gap", r)
				}
				msg = r.Err.Error()
			} else {
				if r.Err != nil {
					t.Fatalf("fatal %v, want none", r.Err)
				}
				got := gaps.OK
				for _, n := range r.Findings {
					if n.Check == gaps.CheckWALStatus {
						got, msg = n.Verdict, n.Msg
					}
				}
				if got != tt.verdict {
					t.Fatalf("wal_status verdict %v, want %v (%+v)", got, tt.verdict, r)
				}
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message lacks %q:\n%s", w, msg)
				}
			}
		})
	}
}

// TestSlotHealthMetrics checks what each server version's columns export: a
// fact the server does not report has no series.
func TestSlotHealthMetrics(t *testing.T) {
	yes := true
	safe := int64(512 << 10)
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	count := func() int {
		n, err := testutil.GatherAndCount(reg, "cdc_relay_slot_safe_wal_size_bytes", "cdc_relay_slot_wal_keep_size_bytes",
			"cdc_relay_slot_conflicting", "cdc_relay_slot_inactive_since_timestamp_seconds", "cdc_relay_slot_invalidated")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// 13-15 without a limit: nothing to say.
	m.SetSlotHealth(gaps.SlotHealth(replication.SlotState{Exists: true, WALStatus: "reserved", WALKeepSize: -1}))
	if n := count(); n != 0 {
		t.Errorf("no limit, 13-15: %d series, want 0", n)
	}
	// 16, a limit, a conflict.
	m.SetSlotHealth(gaps.SlotHealth(replication.SlotState{Exists: true, WALStatus: "reserved", WALKeepSize: 1 << 20, SafeWALSize: &safe, Conflicting: &yes}))
	if n := count(); n != 4 {
		t.Errorf("16 with a limit and a conflict: %d series, want 4 (safe, keep, conflicting, invalidated)", n)
	}
	if v := testutil.ToFloat64(m.SlotSafeWALSize); v != float64(safe) {
		t.Errorf("safe_wal_size %v, want %d", v, safe)
	}
	if v := testutil.ToFloat64(m.SlotInvalidated.WithLabelValues("conflict")); v != 1 {
		t.Errorf("invalidated{reason=conflict} %v, want 1", v)
	}
	// Valid again (a new slot): the invalidation's series is gone.
	m.SetSlotHealth(gaps.SlotHealth(replication.SlotState{Exists: true, WALStatus: "reserved", WALKeepSize: 1 << 20, SafeWALSize: &safe}))
	if n := count(); n != 2 {
		t.Errorf("valid slot with a limit: %d series, want 2", n)
	}
}

// TestStreamErrorInvalidatedSlot: each version's refusal to stream an
// invalidated slot (the messages and details of 13-15, 16, 17 and 18) is a
// counted slot_lost gap naming the cause; a 55000 that is not about an
// invalidation is not.
func TestStreamErrorInvalidatedSlot(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	c := gaps.New(gaps.Config{Setup: replication.SetupConfig{Slot: "s1", Publication: "pub1"}, Metrics: m})
	tests := []struct {
		msg, detail, want string
	}{
		{`cannot read from logical replication slot "s1"`, "This slot has been invalidated because it exceeded the maximum reserved size.", "max_slot_wal_keep_size allows"},
		{`can no longer get changes from replication slot "s1"`, "This slot has been invalidated because it was conflicting with recovery.", "hot_standby_feedback"},
		{`can no longer get changes from replication slot "s1"`, `This replication slot has been invalidated due to "rows_removed".`, "hot_standby_feedback"},
		{`can no longer access replication slot "s1"`, `This replication slot has been invalidated due to "idle_timeout".`, "idle_replication_slot_timeout"},
	}
	for i, tt := range tests {
		err := c.StreamError(&pgconn.PgError{Code: "55000", Message: tt.msg, Detail: tt.detail})
		var gap *gaps.GapError
		if !errors.As(err, &gap) || gap.Kind != gaps.SlotLost {
			t.Errorf("StreamError(%s) = %v, want a slot_lost gap", tt.msg, err)
			continue
		}
		for _, w := range []string{tt.want, "pg_drop_replication_slot('s1')", "(command replay since="} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("case %d: the error lacks %q: %v", i, w, err)
			}
		}
	}
	if got := testutil.ToFloat64(m.SlotProblems.WithLabelValues(gaps.SlotLost.String())); got != float64(len(tests)) {
		t.Errorf("slot_problems_total{kind=slot_lost} = %v, want %d", got, len(tests))
	}
	if err := c.StreamError(&pgconn.PgError{Code: "55000", Message: `replication slot "s1" is active for PID 42`}); err != nil {
		t.Errorf("StreamError(slot active) = %v, want nil", err)
	}
}
