package gaps

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

func TestReconcile(t *testing.T) {
	const (
		slot     = "orders_outbox"
		systemID = "7351234567890123456"
		storedAt = "2024-05-17T08:30:00Z"
	)
	var (
		storedLSN = pglogrepl.LSN(0x3_016B3748) // 3/16B3748
		behind    = pglogrepl.LSN(0x3_01600000) // 3/1600000
		ahead     = pglogrepl.LSN(0x3_02000000) // 3/2000000
	)
	when, _ := time.Parse(time.RFC3339, storedAt)
	stored := checkpoint.Checkpoint{Slot: slot, SystemID: systemID, LSN: storedLSN, UpdatedAt: when, RelayName: "relay-a"}
	healthy := func(confirmed pglogrepl.LSN) replication.SlotState {
		return replication.SlotState{Exists: true, Plugin: "pgoutput", Database: "shop", ConfirmedFlush: confirmed, WALStatus: "reserved"}
	}
	with := func(s replication.SlotState, f func(*replication.SlotState)) replication.SlotState { f(&s); return s }

	tests := []struct {
		name       string
		stored     checkpoint.Checkpoint
		haveStored bool
		slot       replication.SlotState
		wantKind   GapKind // 0: no error
		wantStart  pglogrepl.LSN
		want       []string // substrings of the error, or of the joined warnings
		wantNoWarn bool
	}{
		{
			name:       "first run, no slot",
			slot:       replication.SlotState{},
			wantStart:  0,
			wantNoWarn: true,
		},
		{
			name:      "first run, slot exists",
			slot:      healthy(behind),
			wantStart: behind,
			want:      []string{"no stored checkpoint", slot, behind.String()},
		},
		{
			name:     "first run, slot with another plugin",
			slot:     with(healthy(behind), func(s *replication.SlotState) { s.Plugin = "test_decoding" }),
			wantKind: WrongPlugin,
			want:     []string{`"test_decoding"`, "pg_drop_replication_slot('orders_outbox')", "no stored checkpoint"},
		},
		{
			name:     "first run, slot lost",
			slot:     with(healthy(behind), func(s *replication.SlotState) { s.WALStatus = "lost" }),
			wantKind: SlotLost,
			want:     []string{"max_slot_wal_keep_size", "pg_drop_replication_slot('orders_outbox')"},
		},
		{
			name:       "stored, slot missing",
			stored:     stored,
			haveStored: true,
			slot:       replication.SlotState{},
			wantKind:   SlotMissing,
			want: []string{
				"does not exist", "cannot be streamed",
				"DELETE FROM public.cdc_relay_checkpoints WHERE slot_name = 'orders_outbox';",
				"(command replay since=" + storedAt,
			},
		},
		{
			name:       "stored, slot lost",
			stored:     stored,
			haveStored: true,
			slot:       with(healthy(behind), func(s *replication.SlotState) { s.WALStatus = "lost" }),
			wantKind:   SlotLost,
			want: []string{
				"wal_status 'lost'", "max_slot_wal_keep_size", "SELECT pg_drop_replication_slot('orders_outbox');",
				"DELETE FROM public.cdc_relay_checkpoints", "ALTER SYSTEM SET max_slot_wal_keep_size",
				"(command replay since=" + storedAt,
			},
		},
		{
			name:       "stored, system identifier changed",
			stored:     stored,
			haveStored: true,
			slot:       healthy(behind),
			wantKind:   SystemChanged,
			want: []string{
				systemID, "6999999999999999999", "restored from a backup, cloned", "different cluster",
				"DELETE FROM public.cdc_relay_checkpoints", "(command replay since=" + storedAt,
			},
		},
		{
			name:       "stored, system changed and slot missing: system wins",
			stored:     stored,
			haveStored: true,
			slot:       replication.SlotState{},
			wantKind:   SystemChanged,
			want:       []string{"the slot here is missing"},
		},
		{
			name:       "stored, wrong plugin",
			stored:     stored,
			haveStored: true,
			slot:       with(healthy(behind), func(s *replication.SlotState) { s.Plugin = "wal2json" }),
			wantKind:   WrongPlugin,
			want: []string{
				`"wal2json"`, `"pgoutput"`, "give the relay its own slot name",
				"SELECT pg_drop_replication_slot('orders_outbox');", "DELETE FROM public.cdc_relay_checkpoints",
				"(command replay since=" + storedAt,
			},
		},
		{
			name:       "stored, slot ahead",
			stored:     stored,
			haveStored: true,
			slot:       healthy(ahead),
			wantKind:   SlotAhead,
			want: []string{
				"past the stored checkpoint", "another consumer", "may never have reached Kafka",
				"UPDATE public.cdc_relay_checkpoints SET lsn = '3/2000000'", "(command replay since=" + storedAt,
			},
		},
		{
			// A promoted standby's copy of a failover slot, ahead of the
			// checkpoint it replayed: still a refusal (the relay cannot
			// tell its own confirmation from another consumer's), in the
			// words of a promotion.
			name:       "stored, synced slot ahead on a promoted server",
			stored:     stored,
			haveStored: true,
			slot:       with(healthy(ahead), func(s *replication.SlotState) { s.Synced = true }),
			wantKind:   SlotAhead,
			want: []string{
				"past the stored checkpoint 3/16B3748", "This server was promoted", "synchronized_standby_slots",
				"the events up to 3/2000000 reached Kafka", "another consumer", "may never have reached Kafka",
				"UPDATE public.cdc_relay_checkpoints SET lsn = '3/2000000'", "(command replay since=" + storedAt,
			},
		},
		{
			// The same on a standby: no promotion to speak of.
			name:       "stored, synced slot ahead on a standby",
			stored:     stored,
			haveStored: true,
			slot:       with(healthy(ahead), func(s *replication.SlotState) { s.Synced, s.InRecovery = true, true }),
			wantKind:   SlotAhead,
			want:       []string{"another consumer advanced the slot", "may never have reached Kafka"},
		},
		{
			name:       "stored, slot equal",
			stored:     stored,
			haveStored: true,
			slot:       healthy(storedLSN),
			wantStart:  storedLSN,
			wantNoWarn: true,
		},
		{
			name:       "stored, slot behind: redelivery warning",
			stored:     stored,
			haveStored: true,
			slot:       healthy(behind),
			// The store is ahead: streaming starts after what Kafka acknowledged
			// (the relay always did; the slot's position was only Reconcile's answer).
			wantStart: storedLSN,
			want:      []string{"behind the stored checkpoint", "delivered again", slot, behind.String(), storedLSN.String()},
		},
		{
			name:       "stored, slot active elsewhere and unreserved: warnings only",
			stored:     stored,
			haveStored: true,
			slot: with(healthy(storedLSN), func(s *replication.SlotState) {
				s.Active, s.ActivePID, s.WALStatus = true, 4242, "unreserved"
			}),
			wantStart: storedLSN,
			want:      []string{"in use by process 4242", "pg_stat_replication", "'unreserved'"},
		},
		{
			name:       "stored without system identifier: warning, not an error",
			stored:     checkpoint.Checkpoint{Slot: slot, LSN: storedLSN, UpdatedAt: when},
			haveStored: true,
			slot:       healthy(storedLSN),
			wantStart:  storedLSN,
			want:       []string{"no system identifier"},
		},
		{
			name:       "stored without time: replay hint still says what to do",
			stored:     checkpoint.Checkpoint{Slot: slot, SystemID: systemID, LSN: storedLSN},
			haveStored: true,
			slot:       replication.SlotState{},
			wantKind:   SlotMissing,
			want:       []string{"at an unknown time", "(command replay since=<time of the last delivered event>)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sys := systemID
			if tt.wantKind == SystemChanged {
				sys = "6999999999999999999"
			}
			warnings, err := Reconcile(slot, sys, tt.stored, tt.haveStored, tt.slot)
			if tt.wantKind == 0 {
				if err != nil {
					t.Fatalf("Reconcile: %v", err)
				}
				// Where streaming starts is the checkpoint package's answer.
				if got := startFrom(t, tt.stored, tt.haveStored, tt.slot.ConfirmedFlush); got != tt.wantStart {
					t.Errorf("start = %s, want %s", got, tt.wantStart)
				}
				if tt.wantNoWarn && len(warnings) > 0 {
					t.Errorf("Warnings = %q, want none", warnings)
				}
				joined := strings.Join(warnings, "\n")
				for _, w := range tt.want {
					if !strings.Contains(joined, w) {
						t.Errorf("Warnings %q do not contain %q", warnings, w)
					}
				}
				return
			}

			var gapErr *GapError
			if !errors.As(fmt.Errorf("start relay: %w", err), &gapErr) {
				t.Fatalf("Reconcile error = %v (warnings %q), want a *GapError", err, warnings)
			}
			if gapErr.Kind != tt.wantKind {
				t.Fatalf("Kind = %s, want %s; error: %v", gapErr.Kind, tt.wantKind, err)
			}
			if gapErr.Slot != slot || gapErr.StoredLSN != tt.stored.LSN || gapErr.SlotLSN != tt.slot.ConfirmedFlush {
				t.Errorf("GapError fields = %q %s %s, want %q %s %s", gapErr.Slot, gapErr.StoredLSN, gapErr.SlotLSN,
					slot, tt.stored.LSN, tt.slot.ConfirmedFlush)
			}
			want := append([]string{slot, tt.wantKind.String()}, tt.want...)
			if tt.haveStored {
				want = append(want, tt.stored.LSN.String())
			}
			if tt.slot.Exists {
				want = append(want, tt.slot.ConfirmedFlush.String())
			}
			msg := err.Error()
			for _, w := range want {
				if !strings.Contains(msg, w) {
					t.Errorf("error does not contain %q:\n%s", w, msg)
				}
			}
			if warnings != nil {
				t.Errorf("warnings %q returned with an error", warnings)
			}
		})
	}
}

func TestGapKindString(t *testing.T) {
	for k, want := range map[GapKind]string{
		SlotMissing: "slot_missing", SlotLost: "slot_lost", SlotAhead: "slot_ahead",
		SystemChanged: "system_changed", WrongPlugin: "wrong_plugin", TableJoined: "table_joined", 0: "gap_kind_0",
	} {
		if got := k.String(); got != want {
			t.Errorf("GapKind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
}

// startFrom is where the checkpoint package starts streaming given the stored
// checkpoint (if have) and the slot's confirmed position.
func startFrom(t *testing.T, stored checkpoint.Checkpoint, have bool, confirmed pglogrepl.LSN) pglogrepl.LSN {
	t.Helper()
	store := checkpoint.NewFileStore(filepath.Join(t.TempDir(), "cp.json"))
	if have {
		if err := store.Save(context.Background(), stored); err != nil {
			t.Fatal(err)
		}
	}
	op, err := checkpoint.Open(context.Background(), store, checkpoint.Checkpoint{Slot: stored.Slot})
	if err != nil {
		t.Fatal(err)
	}
	return op.StartFrom(confirmed)
}

// TestTableJoined: an outbox table the relay reads that the publication did
// not cover at the stored checkpoint, and that the relay did not add to the
// publication in this start, stops it (table_joined) with what may be missing
// and what to run; a table covered then (read by the relay or not), or joined
// now, or a checkpoint that does not say (older relays), does not.
func TestTableJoined(t *testing.T) {
	const slot = "orders_outbox"
	at, _ := time.Parse(time.RFC3339, "2026-12-04T10:00:00Z")
	setup := replication.SetupConfig{Slot: slot, Publication: "cdc_relay_outbox", Schema: "public", Table: "outbox_events",
		Also: []replication.TableSetup{{Name: decoder.TableName{Schema: "billing", Table: "outbox_events"}}}}
	stored := func(tables ...string) checkpoint.Checkpoint {
		return checkpoint.Checkpoint{Slot: slot, SystemID: "7", LSN: 0x1_0000, CommitTime: at, UpdatedAt: at, Tables: tables}
	}
	live := replication.SlotState{Exists: true, Plugin: "pgoutput", Database: "shop", ConfirmedFlush: 0x1_0000, WALStatus: "reserved"}
	tests := []struct {
		name    string
		stored  checkpoint.Checkpoint
		have    bool
		pending bool
		joined  []string
		slot    replication.SlotState
		want    string   // the check that fails, "" for none
		msg     []string // substrings of its error
	}{
		{name: "both covered at the checkpoint", stored: stored("billing.outbox_events", "public.outbox_events"), have: true, slot: live},
		{name: "covered at the checkpoint beside others", stored: stored("billing.outbox_events", "public.other", "public.outbox_events"), have: true, slot: live},
		{name: "joined in this start", stored: stored("public.outbox_events"), have: true, joined: []string{"billing.outbox_events"}, slot: live},
		{name: "older checkpoint without tables", stored: stored(), have: true, slot: live},
		{name: "no checkpoint", slot: live},
		{name: "snapshot marker: that check first", stored: checkpoint.Checkpoint{Slot: slot, Tables: []string{}}, have: true, pending: true, slot: live, want: "snapshot_incomplete"},
		{
			name: "not covered at the checkpoint, not joined now", stored: stored("public.outbox_events"), have: true, slot: live,
			want: "table_joined",
			msg: []string{"reads outbox table billing.outbox_events", "did not cover it at the relay's stored checkpoint (LSN 0/10000", "by hand", "may be missing downstream",
				`ALTER PUBLICATION "cdc_relay_outbox" DROP TABLE "billing"."outbox_events";`,
				"`(command replay table=billing.outbox_events since=2026-12-04T10:00:00Z)`",
				"UPDATE public.cdc_relay_checkpoints SET outbox_tables = NULL WHERE slot_name = 'orders_outbox';"},
		},
		{
			name: "none covered at the checkpoint", stored: stored([]string{}...), have: true, slot: live,
			want: "table_joined", msg: []string{"reads outbox table public.outbox_events, billing.outbox_events"},
		},
		{name: "slot missing: that gap first", stored: stored("public.outbox_events"), have: true, want: "slot_missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &Facts{Setup: setup, SystemID: "7", Database: "shop", Stored: tt.stored, HaveStored: tt.have,
				SnapshotPending: tt.pending, Joined: tt.joined, Slot: tt.slot}
			r := Judge(PhaseSlot, f)
			if r.Failed != tt.want {
				t.Fatalf("failed check %q (%v), want %q", r.Failed, r.Err, tt.want)
			}
			if tt.want == "" {
				return
			}
			var gap *GapError
			if tt.want == "table_joined" && (!errors.As(r.Err, &gap) || gap.Kind != TableJoined) {
				t.Fatalf("error %v, want a table_joined *GapError", r.Err)
			}
			for _, m := range tt.msg {
				if !strings.Contains(r.Err.Error(), m) {
					t.Errorf("error does not contain %q:\n%s", m, r.Err)
				}
			}
		})
	}
}
