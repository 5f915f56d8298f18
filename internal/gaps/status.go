package gaps

import (
	"fmt"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// CheckSlotLag is the name of status's check of the slot's lag against
// Facts.MaxLagBytes.
const CheckSlotLag = "slot_lag"

// Probe is what `cdc-relay status` read from the database, for JudgeStatus.
// Status reads the slot before the checkpoint: a running relay stores its
// checkpoint before it confirms the slot, so the checkpoint read after is
// never behind the slot read before.
type Probe struct {
	Setup      replication.SetupConfig // the slot, the publication and the outbox tables
	Slot       replication.SlotState
	Database   string // current_database() of status's connection
	Stored     checkpoint.Checkpoint
	HaveStored bool
	// Coverage is the publication's coverage of each table of
	// Setup.PerTable(), in order.
	Coverage []replication.Coverage
	Failover replication.FailoverState
	// MaxLagBytes: a lag above it is a problem; 0: none is.
	MaxLagBytes int64
}

// StatusReport is what status reports: Problems (it exits non-zero) and
// Warnings (risks that are not problems yet), each a complete sentence in
// the words the relay logs.
type StatusReport struct {
	Problems []string
	Warnings []string
}

// JudgeStatus judges what status read with the relay's own checks: the slot
// against the stored checkpoint (PhaseStatus), the publication's coverage of
// each table (PhaseStatusTable) and what a failover would do to the slot
// (PhaseFailover, as with slot failover auto). A Fatal or Alert finding is
// a problem, a Warn a warning; Info is left out.
func JudgeStatus(p Probe) StatusReport {
	var r StatusReport
	add := func(rep Report) {
		for _, n := range rep.Findings {
			switch n.Verdict {
			case Fatal:
				r.Problems = append(r.Problems, n.Err.Error())
			case Alert:
				r.Problems = append(r.Problems, n.Msg)
			case Warn:
				r.Warnings = append(r.Warnings, n.Msg)
			}
		}
	}
	add(Judge(PhaseStatus, &Facts{
		Setup: p.Setup, Database: p.Database, Stored: p.Stored, HaveStored: p.HaveStored,
		// LSN 0/0 is the marker of an initial snapshot (checkpoint.Opening),
		// which a running relay may be taking: no position.
		SnapshotPending: p.HaveStored && p.Stored.LSN == 0,
		Slot:            p.Slot, MaxLagBytes: p.MaxLagBytes,
	}))
	for i, setup := range p.Setup.PerTable() {
		if i < len(p.Coverage) {
			add(Judge(PhaseStatusTable, &Facts{Setup: setup, Coverage: p.Coverage[i]}))
		}
	}
	add(Judge(PhaseFailover, &Facts{Setup: p.Setup, Failover: p.Failover, FailoverMode: replication.FailoverAuto}))
	return r
}

// statusChecks judge the slot for status (PhaseStatus): the start-up's
// judgments whose facts status reads (not the system identifier, not the
// tables a start joins, not an initial snapshot, which a running relay may be
// taking), without the start-up's warnings that describe a running relay's
// normal state (the slot in use, behind the checkpoint), and its lag.
func statusChecks() []Check {
	return []Check{
		{CheckSlotDatabase, judgeSlotDatabase},
		{SlotMissing.String(), func(f *Facts) Finding {
			if f.Slot.Exists {
				return Finding{}
			}
			if f.HaveStored {
				return judgeSlotMissing(f)
			}
			// A first start creates it: no gap, but nothing streams.
			return Finding{Verdict: Alert, Msg: fmt.Sprintf("replication slot %q does not exist and no checkpoint is stored for it: no relay streams from it; a relay creates it when it starts", f.Setup.Slot)}
		}},
		{WrongPlugin.String(), judgeWrongPlugin},
		{SlotLost.String(), judgeSlotLost},
		{CheckWALUnreserved, judgeUnreserved},
		{SlotAhead.String(), judgeSlotAhead},
		{CheckSlotLag, judgeSlotLag},
	}
}

// statusTableChecks are the start-up's publication checks
// (PhasePublication), where the publication and the table exist: otherwise
// the relay's start creates them or says what is missing
// (replication.CheckServer).
func statusTableChecks() []Check {
	var cs []Check
	for _, c := range publicationChecks() {
		judge := c.Judge
		cs = append(cs, Check{Name: c.Name, Judge: func(f *Facts) Finding {
			if !f.Coverage.PubExists || (!f.Coverage.NoTable && f.Coverage.TableOID == 0) {
				return Finding{}
			}
			return judge(f)
		}})
	}
	return cs
}

// judgeSlotLag: the slot is further behind the server's WAL end than
// Facts.MaxLagBytes.
func judgeSlotLag(f *Facts) Finding {
	s := f.Slot
	if f.MaxLagBytes <= 0 || !s.Exists || s.LagBytes <= f.MaxLagBytes {
		return Finding{}
	}
	return Finding{Verdict: Alert, Msg: fmt.Sprintf("replication slot %q lags %d bytes behind the server's WAL end, more than the limit of %d bytes: "+
		"the relay is behind, stopped or stuck (confirmed at %s; the slot retains %d bytes of WAL)",
		f.Setup.Slot, s.LagBytes, f.MaxLagBytes, s.ConfirmedFlush, s.RetainedWALBytes)}
}
