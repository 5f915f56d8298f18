package gaps_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// TestJudgeStatus: what status reports is the verdict of the phase that
// judges the same facts at start or while streaming, in the same words;
// what a running relay's normal state shows (a snapshot's marker, a table
// or publication the start creates) is no problem.
func TestJudgeStatus(t *testing.T) {
	setup := replication.SetupConfig{Slot: "orders", Publication: "pub", Schema: "public", Table: "outbox_events"}
	when := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	stored := checkpoint.Checkpoint{Slot: "orders", LSN: 0x2000, UpdatedAt: when}
	slot := replication.SlotState{Exists: true, Plugin: "pgoutput", Database: "app", ConfirmedFlush: 0x2000, WALStatus: "reserved", WALKeepSize: 1 << 20, LagBytes: 500}
	with := func(f func(s *replication.SlotState)) replication.SlotState { s := slot; f(&s); return s }
	covered := replication.Coverage{TableOID: 1, PubExists: true, PubInsert: true, Covered: true, Leaves: 1, RootPublished: true}
	// startUp is the start-up's verdict over the same facts.
	startUp := func(phase gaps.Phase, f gaps.Facts) string {
		f.Setup = setup
		r := gaps.Judge(phase, &f)
		if r.Err != nil {
			return r.Err.Error()
		}
		for _, n := range r.Findings {
			return n.Msg
		}
		return ""
	}
	tests := []struct {
		name         string
		probe        gaps.Probe
		wantProblems []string // exactly, in order
		wantContains string   // in the only problem, when wantProblems is nil
		wantWarnings int
	}{
		{name: "healthy", probe: gaps.Probe{Slot: slot, Stored: stored, HaveStored: true, Coverage: []replication.Coverage{covered}, MaxLagBytes: 1000}},
		{
			name:         "slot missing, no checkpoint",
			probe:        gaps.Probe{Coverage: []replication.Coverage{covered}},
			wantContains: `replication slot "orders" does not exist and no checkpoint is stored for it`,
		},
		{
			name:         "slot missing, checkpoint stored",
			probe:        gaps.Probe{Stored: stored, HaveStored: true},
			wantProblems: []string{startUp(gaps.PhaseSlot, gaps.Facts{Database: "app", Stored: stored, HaveStored: true})},
		},
		{
			name:         "slot lost",
			probe:        gaps.Probe{Slot: with(func(s *replication.SlotState) { s.WALStatus = "lost" }), Stored: stored, HaveStored: true},
			wantProblems: []string{startUp(gaps.PhaseSlot, gaps.Facts{Database: "app", Stored: stored, HaveStored: true, Slot: with(func(s *replication.SlotState) { s.WALStatus = "lost" })})},
		},
		{
			name:  "slot ahead of the checkpoint",
			probe: gaps.Probe{Slot: with(func(s *replication.SlotState) { s.ConfirmedFlush = 0x3000 }), Stored: stored, HaveStored: true},
			wantProblems: []string{startUp(gaps.PhaseSlot, gaps.Facts{Database: "app", Stored: stored, HaveStored: true,
				Slot: with(func(s *replication.SlotState) { s.ConfirmedFlush = 0x3000 })})},
		},
		{
			name:  "the marker of a snapshot under way is no position",
			probe: gaps.Probe{Slot: with(func(s *replication.SlotState) { s.ConfirmedFlush = 0x3000 }), Stored: checkpoint.Checkpoint{Slot: "orders"}, HaveStored: true},
		},
		{
			name: "wal_status unreserved: the start-up's and the monitor's words",
			probe: gaps.Probe{Slot: with(func(s *replication.SlotState) { s.WALStatus = "unreserved" }), Stored: stored, HaveStored: true,
				Coverage: []replication.Coverage{covered}},
			wantProblems: []string{startUp(gaps.PhaseWatch, gaps.Facts{Slot: with(func(s *replication.SlotState) { s.WALStatus = "unreserved" }),
				Coverage: covered, Prev: gaps.Previous{WALStatus: "reserved"}})},
		},
		{
			name:         "lag above the limit",
			probe:        gaps.Probe{Slot: with(func(s *replication.SlotState) { s.LagBytes = 5000 }), Stored: stored, HaveStored: true, MaxLagBytes: 1000},
			wantContains: `replication slot "orders" lags 5000 bytes behind the server's WAL end, more than the limit of 1000 bytes`,
		},
		{
			name:  "lag without a limit",
			probe: gaps.Probe{Slot: with(func(s *replication.SlotState) { s.LagBytes = 5000 }), Stored: stored, HaveStored: true},
		},
		{
			name: "table not covered",
			probe: gaps.Probe{Slot: slot, Stored: stored, HaveStored: true,
				Coverage: []replication.Coverage{{TableOID: 1, PubExists: true, PubInsert: true, Leaves: 1, Uncovered: []string{"public.outbox_events"}}}},
			wantProblems: []string{startUp(gaps.PhasePublication, gaps.Facts{
				Coverage: replication.Coverage{TableOID: 1, PubExists: true, PubInsert: true, Leaves: 1, Uncovered: []string{"public.outbox_events"}}})},
		},
		{
			name:  "no table, no publication yet: the start creates or names them",
			probe: gaps.Probe{Slot: slot, Stored: stored, HaveStored: true, Coverage: []replication.Coverage{{PubExists: true}, {TableOID: 1}}},
		},
		{
			name: "partitions listed one by one: a warning",
			probe: gaps.Probe{Slot: slot, Stored: stored, HaveStored: true,
				Coverage: []replication.Coverage{{TableOID: 1, PubExists: true, PubInsert: true, Partitioned: true, Leaves: 2, Covered: true}}},
			wantWarnings: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.probe
			p.Setup, p.Database = setup, "app"
			if len(p.Coverage) > 1 {
				p.Setup.Also = []replication.TableSetup{{Name: decoder.TableName{Schema: "public", Table: "other"}}}
			}
			r := gaps.JudgeStatus(p)
			switch {
			case tt.wantContains != "":
				if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], tt.wantContains) {
					t.Errorf("problems %q, want one with %q", r.Problems, tt.wantContains)
				}
			case !slices.Equal(r.Problems, tt.wantProblems):
				t.Errorf("problems\n%q\nwant\n%q", r.Problems, tt.wantProblems)
			}
			if slices.Contains(tt.wantProblems, "") {
				t.Fatal("the phase compared with found nothing")
			}
			if len(r.Warnings) != tt.wantWarnings {
				t.Errorf("warnings %q, want %d", r.Warnings, tt.wantWarnings)
			}
		})
	}
}

// TestPartialCoverage: a publication covering some outbox tables and not
// others is extended when the relay may change it, and otherwise refused
// with the statement to run; one covering all or none is left alone.
func TestPartialCoverage(t *testing.T) {
	cfg := replication.SetupConfig{Slot: "s", Publication: "pub", Schema: "public", Table: "a",
		Also: []replication.TableSetup{{Name: decoder.TableName{Schema: "public", Table: "b"}}}}
	covered := replication.Coverage{TableOID: 1, RelOID: 10, PubExists: true, PubInsert: true, Covered: true}
	outside := replication.Coverage{TableOID: 2, PubExists: true, PubInsert: true}
	snapshot := func(context.Context, pgx.Tx, []decoder.TableName, string) error { return nil }
	tests := []struct {
		name     string
		create   bool
		join     bool // the slot exists: JoinSnapshot set
		covs     []replication.Coverage
		wantJoin []decoder.TableName
		wantErr  []string
	}{
		{name: "all covered", covs: []replication.Coverage{covered, covered}},
		{name: "none covered: the publication checks say it", covs: []replication.Coverage{outside, outside}},
		{name: "one joins, relay may add it", create: true, covs: []replication.Coverage{covered, outside},
			wantJoin: []decoder.TableName{{Schema: "public", Table: "b"}}},
		{name: "one joins, relay may not add it", covs: []replication.Coverage{covered, outside},
			wantErr: []string{`publication "pub" does not cover outbox table "public"."b"`, `beside "public"."a"`, `run ALTER PUBLICATION "pub" ADD TABLE "public"."b";`, "(setting CreatePublication)"}},
		{name: "one joins a slot that exists, relay may not add it", join: true, covs: []replication.Coverage{covered, outside},
			wantErr: []string{`ADD TABLE "public"."b";`, "from a snapshot taken with the change", "table_joined"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cfg
			c.CreatePublication = tt.create
			if tt.join {
				c.JoinSnapshot = snapshot
			}
			join, err := gaps.PartialCoverage(c, tt.covs)
			if !slices.Equal(join, tt.wantJoin) {
				t.Errorf("join %v, want %v", join, tt.wantJoin)
			}
			var ce *replication.ConfigError
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("error %v, want none", err)
			case tt.wantErr != nil && !errors.As(err, &ce):
				t.Fatalf("error %v, want a *replication.ConfigError", err)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}
