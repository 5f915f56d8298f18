package gaps

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/setting"
)

// The names of the failover checks (PhaseFailover).
const (
	// CheckFailoverUnsupported: the server is older than 17, so the slot
	// cannot follow a promotion.
	CheckFailoverUnsupported = "failover_unsupported"
	// CheckSlotNotFailover: on 17+, the slot is not a failover slot.
	CheckSlotNotFailover = "slot_not_failover"
	// CheckStandbySlotsUnset: the slot is a failover slot but
	// synchronized_standby_slots is empty.
	CheckStandbySlotsUnset = "synchronized_standby_slots_unset"
	// CheckFailoverReady: both hold.
	CheckFailoverReady = "failover_ready"
	// CheckSlotOnStandby: the slot lives on a hot standby (the relay decodes
	// there), which no failover slot synchronizes.
	CheckSlotOnStandby = "slot_on_standby"
)

// failoverChecks judge whether a failover of the server keeps the slot and
// every event the relay published (PhaseFailover): once at start, after the
// relay created the slot or switched its failover on, and in status. None
// stops the relay: a failover is not a gap until it happens, and one that
// loses the slot takes the slot-loss path (SlotMissing) then.
func failoverChecks() []Check {
	return []Check{
		{CheckSlotOnStandby, func(f *Facts) Finding {
			if !f.Failover.InRecovery {
				return Finding{}
			}
			return Finding{Verdict: Info, Msg: fmt.Sprintf(
				"replication slot %q lives on the hot standby the relay decodes on: a promotion of this standby keeps it, "+
					"but a failover to another server (or rebuilding this standby) does not, and the relay stops with slot_missing "+
					"and the steps to recover (docs/postgres.md, Decoding on a standby)", f.Setup.Slot)}
		}},
		{CheckFailoverUnsupported, func(f *Facts) Finding {
			s := f.Failover
			if s.Supported() || f.FailoverMode == replication.FailoverOff || s.InRecovery {
				return Finding{}
			}
			return Finding{Verdict: Info, Msg: fmt.Sprintf(
				"PostgreSQL %s has no failover slots (they need 17 or later): replication slot %q lives on this server only, "+
					"so a standby promoted in its place has no copy of it. After a failover the relay stops with slot_missing "+
					"and the steps to recover (or, with %s, republishes the outbox rows from the stored checkpoint on)",
				replication.VersionName(s.ServerVersion), f.Setup.Slot, f.Setup.Names.Name("Backfill")),
				Fields: map[string]any{"server_version_num": s.ServerVersion}}
		}},
		{CheckSlotNotFailover, func(f *Facts) Finding {
			s := f.Failover
			if !s.Supported() || !s.SlotExists || s.SlotFailover || s.InRecovery {
				return Finding{}
			}
			why := "a relay with slot failover auto or on switches it on when it acquires the slot"
			if f.FailoverMode == replication.FailoverOff {
				why = "slot failover is off " + f.Setup.Names.Name("SlotFailover")
			}
			return warn(fmt.Sprintf(
				"replication slot %q is not a failover slot (%s): standbys do not get a copy, so a promotion loses the slot "+
					"and the relay stops with slot_missing. To keep it across a failover, set slot failover to auto or on %s, "+
					"or run ALTER_REPLICATION_SLOT %s (FAILOVER true) on a replication connection while the slot is idle",
				f.Setup.Slot, why, f.Setup.Names.Name("SlotFailover"), f.Setup.Slot))
		}},
		{CheckStandbySlotsUnset, func(f *Facts) Finding {
			s := f.Failover
			if !s.Supported() || !s.SlotFailover || s.StandbySlots != "" || s.InRecovery {
				return Finding{}
			}
			return warn(fmt.Sprintf(
				"replication slot %q is a failover slot, but synchronized_standby_slots is empty: the relay may publish events "+
					"of transactions a standby has not received yet, and a promotion of that standby loses those transactions "+
					"while Kafka keeps their events; the standby's copy of the slot may also be behind what was published. "+
					"Name the physical slot of every standby that may be promoted: "+
					"ALTER SYSTEM SET synchronized_standby_slots = '<physical slot>[, …]'; SELECT pg_reload_conf(); (docs/postgres.md, Failover)",
				f.Setup.Slot))
		}},
		{CheckFailoverReady, func(f *Facts) Finding {
			s := f.Failover
			if !s.Supported() || !s.SlotFailover || s.StandbySlots == "" {
				return Finding{}
			}
			return Finding{Verdict: Info, Msg: fmt.Sprintf(
				"replication slot %q is a failover slot and the relay receives only WAL the standbys of synchronized_standby_slots (%s) have: "+
					"a standby with sync_replication_slots = on keeps a copy, and a promotion keeps every published event",
				f.Setup.Slot, s.StandbySlots),
				Fields: map[string]any{"synchronized_standby_slots": s.StandbySlots, "synced": s.SlotSynced}}
		}},
	}
}

// Failover reads the failover facts of the slot and logs, once, what a
// failover would do to it (PhaseFailover); mode is the relay's slot failover
// setting. The state is returned for the caller's metrics.
func (c *Checker) Failover(ctx context.Context, db replication.QueryRower, mode string) (replication.FailoverState, error) {
	s, err := replication.ReadFailover(ctx, db, c.setup.Slot)
	if err != nil {
		return s, err
	}
	f := &Facts{Setup: c.setup, Failover: s, FailoverMode: mode}
	return s, c.report(Judge(PhaseFailover, f), true, false)
}

// slotMissing reports whether err is the walsender's "replication slot does
// not exist" (START_REPLICATION), which no reconnect can cure.
func slotMissing(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42704" && strings.HasPrefix(pgErr.Message, "replication slot ")
}

// slotMissingMidStream is the gap of a slot that disappeared while the relay
// ran: typically a promotion to a server without a copy of it. The relay
// stops; its next start finds the stored checkpoint without a slot and takes
// the slot-loss path (SlotMissing: fail with the steps, or backfill).
func slotMissingMidStream(slot string, names setting.Namer) *GapError {
	return &GapError{Kind: SlotMissing, Slot: slot, msg: fmt.Sprintf("replication slot %q: %s: the slot does not exist on the server the relay reconnected to: "+
		"a failover promoted a server without a copy of it (not a failover slot, no standby synchronizing it, or the copy was not yet persistent), "+
		"or it was dropped. Events committed after the relay's checkpoint cannot be streamed from it. The relay stopped after saving its checkpoint; "+
		"start it again: it refuses with slot_missing and the steps to recover, or with %s creates a new slot and republishes "+
		"the outbox rows since the checkpoint", slot, SlotMissing, names.Name("Backfill"))}
}
