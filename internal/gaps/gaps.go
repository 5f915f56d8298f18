// Package gaps is the one owner of DESIGN invariant 6, loud, never silent,
// gaps: every check of the replication slot, the stored checkpoint, the
// publication's coverage of the outbox table, the database's identity and the
// slot's WAL status lives here, as a list of checks the relay runs at start
// (Checker.Publication, Checker.Slot) and every monitor interval
// (Checker.Watch), and `cdc-relay status` runs over what it reads
// (JudgeStatus). A judgment that more than one phase makes is one function
// listed in each, so that the start-up, the monitor and status give the same
// verdict in the same words.
//
// It is its own package, not part of checkpoint or replication, because a gap
// is a disagreement between them: the checkpoint package owns what was
// confirmed, replication reads what the server holds, and a gap is judged over
// both. It imports both; neither imports it.
//
// Adding a check is a local change: append a Check to the list of its phase
// (slotChecks, publicationChecks, watchChecks, failoverChecks) with a name, which is its
// metric label, and a Judge that reads Facts and returns the verdict with the
// operator's message and the exact fix. When the check needs a fact no check
// reads yet, add the field to Facts and read it in the phase's read step.
package gaps

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// Verdict is what a check found.
type Verdict int

// The verdicts, from harmless to stopping.
const (
	// OK: nothing to say.
	OK Verdict = iota
	// Info: a change worth a log line at info level (a slot back to
	// wal_status reserved).
	Info
	// Warn: the relay goes on, but the operator should know (events will be
	// delivered again, WAL is at risk).
	Warn
	// Alert: something was already lost and cannot be streamed again, or
	// will be unless an operator acts now (wal_status unreserved); the relay
	// goes on and logs at error level with the way to recover or prevent
	// it. Status reports it as a problem.
	Alert
	// Repair: the caller repairs what the check found, as it is configured
	// to (a retaken initial snapshot), and logs what it does. Ends the round
	// like Fatal, but is neither counted nor an error.
	Repair
	// Fatal: the relay stops (or does not start) until an operator acts;
	// Finding.Err is the error to return. Counted in
	// cdc_relay_slot_problems_total{kind=<check name>}.
	Fatal
)

// Phase is when a check runs.
type Phase int

// The phases.
const (
	// PhasePublication: at start, once the publication exists.
	PhasePublication Phase = iota + 1
	// PhaseSlot: at start, the stored checkpoint against the slot.
	PhaseSlot
	// PhaseWatch: every monitor interval while the relay streams.
	PhaseWatch
	// PhaseFailover: at start, once the slot exists, and in status: what a
	// failover of the server would do to the slot (failover.go).
	PhaseFailover
	// PhaseWatchTable: every monitor interval, for each outbox table after
	// the first (replication.SetupConfig.Also): PhaseWatch's checks of the
	// table. The slot and the publication are judged once, with the first.
	PhaseWatchTable
	// PhaseStatus: in `cdc-relay status` (JudgeStatus), the slot against the
	// stored checkpoint with the start-up's judgments, and its lag.
	PhaseStatus
	// PhaseStatusTable: in `cdc-relay status`, for each outbox table, the
	// start-up's judgments of the publication's coverage.
	PhaseStatusTable
)

// Facts are what the checks of one phase judge, read once per round.
type Facts struct {
	Setup replication.SetupConfig // names the slot, publication and table

	// PhaseSlot.
	SystemID        string // what IDENTIFY_SYSTEM reports now
	Database        string // current_database() of the relay's connection
	Stored          checkpoint.Checkpoint
	HaveStored      bool
	SnapshotPending bool // the stored checkpoint is an unfinished initial snapshot's marker
	RetakeSnapshot  bool // the relay takes an unfinished snapshot again (--snapshot initial)
	// Joined are the outbox tables (schema.table) the relay added to the
	// publication in this start, publishing the rows they held.
	Joined []string

	// PhaseSlot and PhaseWatch.
	Slot replication.SlotState

	// PhasePublication and PhaseWatch.
	Coverage replication.Coverage

	// PhaseFailover.
	Failover     replication.FailoverState
	FailoverMode string // replication.FailoverAuto, On or Off

	// PhaseWatch: what the previous rounds saw.
	Prev Previous

	// PhaseStatus: a slot lag (LagBytes) above it is a problem; 0: none is.
	MaxLagBytes int64
}

// Previous is what the watch remembers between rounds.
type Previous struct {
	// Seen: a round found the publication covering the table (TableOID,
	// RelOID and LastOK are of the newest such round).
	Seen             bool
	TableOID, RelOID uint32
	LastOK           time.Time
	// WALStatus is the slot's wal_status at the last round ("missing" when
	// the slot was gone, "" before the first).
	WALStatus string
}

// Finding is a check's verdict.
type Finding struct {
	Verdict Verdict
	// Msg is the complete sentence for the log: what happened, what may be
	// lost and what to run. For Fatal it is Err's message and may be empty.
	Msg string
	// Fields are logged with Msg.
	Fields map[string]any
	// Err is the error a Fatal finding returns (*GapError, or a
	// *replication.ConfigError for a problem of the configuration).
	Err error
}

// Check is one question about a gap.
type Check struct {
	// Name says what is checked and is the metric label (slot_problems_total
	// kind) of its Fatal findings.
	Name string
	// Judge reads the facts and returns the verdict.
	Judge func(f *Facts) Finding
}

// Checks returns the checks of phase, in the order they run: the first Fatal
// or Repair finding ends a round.
func Checks(phase Phase) []Check {
	switch phase {
	case PhasePublication:
		return publicationChecks()
	case PhaseSlot:
		return slotChecks()
	case PhaseWatch:
		return watchChecks()
	case PhaseFailover:
		return failoverChecks()
	case PhaseStatus:
		return statusChecks()
	case PhaseStatusTable:
		return statusTableChecks()
	case PhaseWatchTable:
		var cs []Check
		for _, c := range watchChecks() {
			switch c.Name {
			case CheckTableDropped, CheckTableCovered, CheckTableRecreated, CheckTableReadded:
				cs = append(cs, c)
			}
		}
		return cs
	}
	return nil
}

// Report is one round's verdicts: the non-OK findings in check order, and the
// Fatal or Repair one that ended the round, by name.
type Report struct {
	Findings []Named
	// Failed is the name of the check whose Fatal or Repair finding ended the
	// round; "" when none did.
	Failed string
	// Err is the Fatal finding's error; nil for a Repair.
	Err error
}

// Named is a finding with the name of its check.
type Named struct {
	Check string
	Finding
}

// Judge runs the checks of phase over f, in order, up to the first Fatal or
// Repair finding. It reads nothing and logs nothing: Checker does both.
func Judge(phase Phase, f *Facts) Report {
	var r Report
	for _, c := range Checks(phase) {
		fd := c.Judge(f)
		if fd.Verdict == OK {
			continue
		}
		r.Findings = append(r.Findings, Named{Check: c.Name, Finding: fd})
		if fd.Verdict == Fatal || fd.Verdict == Repair {
			r.Failed, r.Err = c.Name, fd.Err
			break
		}
	}
	return r
}

// Config configures a Checker.
type Config struct {
	Setup   replication.SetupConfig
	Logger  zerolog.Logger
	Metrics *metrics.Metrics
}

// Checker runs the checks against Postgres, logs every finding and counts the
// fatal ones. One Checker serves a relay's start and its monitor; Watch keeps
// what the previous rounds saw, so one goroutine calls it.
type Checker struct {
	setup   replication.SetupConfig
	log     zerolog.Logger
	m       *metrics.Metrics
	prev    Previous
	prevs   []Previous // of each table of setup.Also, as prev is of the first
	stopped bool       // a Watch round was fatal: the relay is stopping
}

// New returns a Checker.
func New(cfg Config) *Checker {
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.Discard()
	}
	return &Checker{setup: cfg.Setup, log: cfg.Logger, m: cfg.Metrics, prevs: make([]Previous, len(cfg.Setup.Also))}
}

// Publication runs the start-up checks of the publication's coverage of the
// outbox table (the publication exists: replication.CheckServer created it or
// refused). Every failure is a *replication.ConfigError naming the fix.
func (c *Checker) Publication(ctx context.Context, db replication.QueryRower) error {
	for _, setup := range c.setup.PerTable() {
		cov, err := replication.ReadCoverage(ctx, db, setup)
		if err != nil {
			return err
		}
		f := &Facts{Setup: setup, Coverage: cov}
		if err := c.report(Judge(PhasePublication, f), true, false); err != nil {
			return err
		}
	}
	return nil
}

// SlotFacts are the facts of the slot's start-up checks that come from the
// relay rather than from the server.
type SlotFacts struct {
	SystemID        string // IDENTIFY_SYSTEM's system identifier
	Stored          checkpoint.Checkpoint
	HaveStored      bool
	SnapshotPending bool // checkpoint.Opening.SnapshotPending
	// RetakeSnapshot: with a SnapshotPending marker the caller drops the slot
	// and takes the snapshot again (--snapshot initial) rather than refuse.
	RetakeSnapshot bool
	// Joined are the outbox tables (schema.table) the relay added to the
	// publication in this start, publishing the rows they held
	// (replication.JoinTables): the stream carries the rest of theirs.
	Joined []string
}

// Slot reads the slot and judges it against the stored checkpoint before
// streaming. Warnings are logged only when no check ended the round; a Fatal
// finding is counted and returned with its check's name (Report.Failed), so
// that the caller can repair what it is configured to repair (a backfill); a
// Repair finding (a retaken snapshot) is only named. The slot's state is
// returned in every case.
func (c *Checker) Slot(ctx context.Context, db replication.QueryRower, sf SlotFacts) (replication.SlotState, Report, error) {
	state, err := replication.ReadSlot(ctx, db, c.setup.Slot)
	if err != nil {
		return state, Report{}, err
	}
	dbName, err := replication.CurrentDatabase(ctx, db)
	if err != nil {
		return state, Report{}, err
	}
	f := &Facts{
		Setup: c.setup, SystemID: sf.SystemID, Database: dbName,
		Stored: sf.Stored, HaveStored: sf.HaveStored, SnapshotPending: sf.SnapshotPending,
		RetakeSnapshot: sf.RetakeSnapshot, Joined: sf.Joined, Slot: state,
	}
	r := Judge(PhaseSlot, f)
	return state, r, c.report(r, r.Failed == "", false)
}

// Watch reads the slot and the publication's coverage, exports the slot's
// wal_status and retained WAL, and judges what changed since the last round.
// It returns the error of a Fatal finding once, which the relay stops with;
// nil when Postgres could not be read (the stream reports that) or nothing is
// fatal.
func (c *Checker) Watch(ctx context.Context, db replication.QueryRower) error {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	slot, err := replication.ReadSlot(qctx, db, c.setup.Slot)
	if err != nil {
		return nil
	}
	cov, err := replication.ReadCoverage(qctx, db, c.setup)
	if err != nil {
		return nil
	}
	status := walStatus(slot)
	c.m.SetWALStatus(status)
	if slot.Exists {
		c.m.SlotRetainedWAL.Set(float64(slot.RetainedWALBytes))
	}
	c.m.SetSlotHealth(SlotHealth(slot))
	f := &Facts{Setup: c.setup, Slot: slot, Coverage: cov, Prev: c.prev}
	r := Judge(PhaseWatch, f)
	c.prev.WALStatus = status
	if r.Err == nil {
		c.prev.Seen, c.prev.TableOID, c.prev.RelOID, c.prev.LastOK = true, cov.TableOID, cov.RelOID, time.Now()
	}
	for i, setup := range c.setup.PerTable()[1:] {
		if r.Err != nil {
			break
		}
		cov, err := replication.ReadCoverage(qctx, db, setup)
		if err != nil {
			return nil
		}
		tr := Judge(PhaseWatchTable, &Facts{Setup: setup, Slot: slot, Coverage: cov, Prev: c.prevs[i]})
		if tr.Err == nil {
			c.prevs[i] = Previous{Seen: true, TableOID: cov.TableOID, RelOID: cov.RelOID, LastOK: time.Now()}
		}
		r.Findings = append(r.Findings, tr.Findings...)
		r.Failed, r.Err = tr.Failed, tr.Err
	}
	if c.stopped {
		r.Err = nil // reported once: the relay is stopping
		if n := len(r.Findings); n > 0 && r.Findings[n-1].Verdict == Fatal {
			r.Findings = r.Findings[:n-1]
		}
	}
	if r.Err != nil {
		c.stopped = true
	}
	return c.report(r, true, true)
}

// SlotHealth is the slot's health as the metrics export it (a missing slot
// reports nothing; its wal_status "missing" says it).
func SlotHealth(s replication.SlotState) metrics.SlotHealth {
	if !s.Exists {
		return metrics.SlotHealth{WALKeepSize: -1}
	}
	_, reason := s.Invalidated()
	h := metrics.SlotHealth{
		SafeWALSize: s.SafeWALSize, WALKeepSize: s.WALKeepSize, Conflicting: s.Conflicting,
		InvalidReason: reason,
	}
	if !s.Active {
		h.InactiveSince = s.InactiveSince
	}
	return h
}

// StreamError turns an error of the replication stream that is a gap into the
// error the relay stops with, counted and explained: a dropped publication
// (*replication.ConfigError) or an invalidated slot (a SlotLost *GapError);
// it returns nil for any other error.
func (c *Checker) StreamError(err error) error {
	if invalid, reason := slotInvalidated(err); invalid {
		c.m.SlotProblems.WithLabelValues(SlotLost.String()).Inc()
		return invalidatedWhileStreaming(c.setup.Names, c.setup.Slot, replication.SlotState{}, reason, "the server says: "+err.Error())
	}
	if slotMissing(err) {
		c.m.SlotProblems.WithLabelValues(SlotMissing.String()).Inc()
		return slotMissingMidStream(c.setup.Slot, c.setup.Names)
	}
	if !publicationDropped(err) {
		return nil
	}
	c.m.SlotProblems.WithLabelValues(CheckPublicationDropped).Inc()
	return &replication.ConfigError{Msg: publicationDroppedMsg(c.setup.Names, c.setup.Publication, c.setup.Slot, "")}
}

// report logs r's findings (the non-fatal ones only when logWarnings, the
// fatal one only when logFatal: at start the caller logs the error it
// returns), counts its fatal one, and returns its error.
func (c *Checker) report(r Report, logWarnings, logFatal bool) error {
	for _, n := range r.Findings {
		if n.Verdict == Repair {
			continue
		}
		if n.Verdict == Fatal {
			c.m.SlotProblems.WithLabelValues(n.Check).Inc()
			if logFatal {
				c.log.Error().Fields(n.Fields).Msg(n.Err.Error())
			}
			continue
		}
		if !logWarnings {
			continue
		}
		ev := c.log.Warn()
		switch n.Verdict {
		case Info:
			ev = c.log.Info()
		case Alert:
			ev = c.log.Error()
		}
		ev.Fields(n.Fields).Msg(n.Msg)
	}
	return r.Err
}
