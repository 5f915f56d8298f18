package gaps

import (
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/replication"
)

func TestFailoverChecks(t *testing.T) {
	v15 := replication.FailoverState{ServerVersion: 150014}
	noFailover := replication.FailoverState{ServerVersion: 170002, SlotExists: true}
	unsafe := replication.FailoverState{ServerVersion: 170002, SlotExists: true, SlotFailover: true}
	safe := replication.FailoverState{ServerVersion: 170002, SlotExists: true, SlotFailover: true, StandbySlots: "sb1"}
	standby := replication.FailoverState{ServerVersion: 170002, SlotExists: true, InRecovery: true}
	tests := []struct {
		name  string
		state replication.FailoverState
		mode  string
		check string  // the one finding's check; "" for none
		level Verdict // its verdict
		want  []string
	}{
		{"below 17, auto", v15, replication.FailoverAuto, CheckFailoverUnsupported, Info, []string{"PostgreSQL 15.14 has no failover slots", "slot_missing"}},
		{"below 17, off", v15, replication.FailoverOff, "", OK, nil},
		{"17, slot without failover", noFailover, replication.FailoverAuto, CheckSlotNotFailover, Warn, []string{"is not a failover slot (a relay with slot failover auto or on switches it on", "ALTER_REPLICATION_SLOT s (FAILOVER true)"}},
		{"17, off", noFailover, replication.FailoverOff, CheckSlotNotFailover, Warn, []string{"slot failover is off"}},
		{"17, no synchronized_standby_slots", unsafe, replication.FailoverAuto, CheckStandbySlotsUnset, Warn, []string{"synchronized_standby_slots is empty", "ALTER SYSTEM SET synchronized_standby_slots"}},
		{"17, safe", safe, replication.FailoverAuto, CheckFailoverReady, Info, []string{"(sb1)"}},
		{"17, on a standby", standby, replication.FailoverAuto, CheckSlotOnStandby, Info, []string{"lives on the hot standby", "a failover to another server", "slot_missing"}},
		{"16, on a standby", replication.FailoverState{ServerVersion: 160014, SlotExists: true, InRecovery: true}, replication.FailoverAuto, CheckSlotOnStandby, Info, []string{"a promotion of this standby keeps it"}},
		{"17, slot missing", replication.FailoverState{ServerVersion: 170002, StandbySlots: "sb1"}, replication.FailoverAuto, "", OK, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Judge(PhaseFailover, &Facts{Setup: replication.SetupConfig{Slot: "s"}, Failover: tt.state, FailoverMode: tt.mode})
			if r.Err != nil || r.Failed != "" {
				t.Fatalf("a failover check ended the round: %+v", r)
			}
			if tt.check == "" {
				if len(r.Findings) != 0 {
					t.Fatalf("findings %+v, want none", r.Findings)
				}
				return
			}
			if len(r.Findings) != 1 || r.Findings[0].Check != tt.check || r.Findings[0].Verdict != tt.level {
				t.Fatalf("findings %+v, want one %s at verdict %d", r.Findings, tt.check, tt.level)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.Findings[0].Msg, w) {
					t.Errorf("message %q does not mention %q", r.Findings[0].Msg, w)
				}
			}
		})
	}
}
