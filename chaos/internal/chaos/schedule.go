package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// A schedule is a random sequence of operations drawn from a seed — tables
// joining and leaving the relay, partitions attached, detached and dropped,
// the relay killed or stopped, the broker restarted or made to stop
// reading, Postgres restarted — run while writers commit rows and
// table-less messages. A ledger of every event tried then checks Kafka: none
// lost, none duplicated (unless the run may have some and says why), per-key
// commit order kept, nothing that never committed. NewPlan is a pure
// function of the seed and the server's major version, so a seed's number
// replays its schedule.

// PlanConfig sizes a plan.
type PlanConfig struct {
	// Steps is how many operations the plan runs (8).
	Steps int
	// PGMajor is the Postgres server's major version: messages need 14+,
	// a standby 16+.
	PGMajor int
}

// Plan is one seed's schedule: the world it starts with and its steps.
type Plan struct {
	Seed uint64
	// Layout is how the publication covers the partitioned outbox table:
	// "root" (the relay creates it, publish_via_partition_root) or
	// "listed" (created beforehand listing the partitions by name).
	Layout string
	// Delivery is the relay's --delivery.
	Delivery string
	// Messages says whether the writers emit logical decoding messages
	// beside rows (--messages-prefix; PostgreSQL 14+).
	Messages bool
	// Source is where the relay decodes: "primary", or "standby" (a hot
	// standby of it, PostgreSQL 16+, with --primary-pg-url).
	Source string
	// BMember says whether outbox_b is in the relay's --table list from the
	// start.
	BMember bool
	// Buckets are the partitions of outbox_p at the start.
	Buckets []int
	// Snapshot says whether the relay's first start creates its slot with
	// --snapshot initial, the tables already holding rows the writers and
	// a bulk burst (multi-row INSERT ... SELECT, COPY, transactions that
	// commit in another order than they began) wrote before it.
	Snapshot bool
	// CatchUp says whether the relay runs with the catch-up path at its
	// lowest threshold (--catch-up-threshold-mib 1, small batches), and each
	// relay-kill or relay-stop leaves it a backlog of one-event transactions
	// over the threshold, which its restart reads in batches before it
	// streams (issue 44).
	CatchUp bool
	Steps   []Step
}

// Step is one operation of a plan, with the parameters drawn for it.
type Step struct {
	// Wait is how long the writers run before the operation.
	Wait time.Duration
	Op   string
	// Params are the operation's drawn parameters, printed with it.
	Mode    string        // kill|term for relay stops, fast|immediate for Postgres, the delay of standby-lag
	Bucket  int           // the partition of partition operations
	Down    time.Duration // how long something stays down
	Lagging bool          // partition-detach: with the relay down, so it reads the rows after the detach
	Drop    bool          // partition-detach: drop the table right after
	Reorder bool          // partition-attach: the new table has its columns in another order
	Rows    int           // table-join-large: the rows outbox_b holds when it joins
}

// String prints the step as the schedule line shows it.
func (s Step) String() string {
	var p []string
	if s.Mode != "" {
		p = append(p, s.Mode)
	}
	if s.Bucket != 0 {
		p = append(p, partitionName(s.Bucket))
	}
	if s.Down > 0 {
		p = append(p, "down="+s.Down.String())
	}
	if s.Lagging {
		p = append(p, "lagging")
	}
	if s.Drop {
		p = append(p, "drop")
	}
	if s.Reorder {
		p = append(p, "reordered")
	}
	if s.Rows > 0 {
		p = append(p, fmt.Sprintf("rows=%d", s.Rows))
	}
	return fmt.Sprintf("+%v %s(%s)", s.Wait, s.Op, strings.Join(p, ","))
}

// String prints the whole plan on one line: it replays with the seed alone,
// and says what the seed did.
func (p Plan) String() string {
	steps := make([]string, len(p.Steps))
	for i, s := range p.Steps {
		steps[i] = fmt.Sprintf("%d:%s", i+1, s)
	}
	snapshot := ""
	if p.Snapshot {
		snapshot = " snapshot=initial"
	}
	if p.CatchUp {
		snapshot += " catch-up"
	}
	return fmt.Sprintf("seed=%d schedule=[source=%s layout=%s delivery=%s messages=%v outbox_b=%v partitions=%v%s; %s]",
		p.Seed, p.Source, p.Layout, p.Delivery, p.Messages, p.BMember, p.Buckets, snapshot, strings.Join(steps, "; "))
}

// Uses reports whether the plan's world or one of its steps is name: an
// operation, or "snapshot-initial" for Plan.Snapshot.
func (p Plan) Uses(name string) bool {
	if name == WorldSnapshot {
		return p.Snapshot
	}
	if name == WorldCatchUp {
		return p.CatchUp
	}
	return slices.ContainsFunc(p.Steps, func(s Step) bool { return s.Op == name })
}

// WorldSnapshot names Plan.Snapshot in Plan.Uses.
const WorldSnapshot = "snapshot-initial"

// WorldCatchUp names Plan.CatchUp in Plan.Uses.
const WorldCatchUp = "catch-up"

// largeJoinRows is how many rows outbox_b holds when table-join-large
// joins it.
const largeJoinRows = 50_000

// planState is what the plan has done so far, for the preconditions.
type planState struct {
	cfg      PlanConfig
	plan     *Plan
	bMember  bool
	attached []int
	detached []int // detached, not dropped
	next     int   // the next new bucket
}

// planOp is one kind of operation: when it may run, and what it draws.
type planOp struct {
	name   string
	weight int
	doc    string
	ok     func(s *planState) bool
	draw   func(r *rand.Rand, s *planState) Step
}

func always(*planState) bool { return true }

func between(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return (lo + time.Duration(r.Int64N(int64(hi-lo)))).Round(10 * time.Millisecond)
}

// planOps are the operations a schedule draws from, in the order the help
// lists them.
var planOps = []planOp{
	{
		name: "relay-kill", weight: 3, ok: always,
		doc: "SIGKILL the relay, start it again after 0-500ms",
		draw: func(r *rand.Rand, _ *planState) Step {
			return Step{Mode: "kill", Down: between(r, 0, 500*time.Millisecond)}
		},
	},
	{
		name: "relay-stop", weight: 2, ok: always,
		doc: "SIGTERM the relay (it must exit 0), start it again after 0-1.5s",
		draw: func(r *rand.Rand, _ *planState) Step {
			return Step{Mode: "term", Down: between(r, 0, 1500*time.Millisecond)}
		},
	},
	{
		name: "table-join", weight: 2, ok: func(s *planState) bool { return !s.bMember },
		doc: "stop the relay (SIGKILL or SIGTERM), write to outbox_b, start the relay with outbox_b added to --table (it adds the table to the publication)",
		draw: func(r *rand.Rand, s *planState) Step {
			s.bMember = true
			return Step{Mode: []string{"kill", "term"}[r.IntN(2)], Down: between(r, 100*time.Millisecond, time.Second)}
		},
	},
	{
		name: "table-join-large", weight: 1, ok: func(s *planState) bool { return !s.bMember },
		doc: "stop the relay (SIGKILL or SIGTERM), write outbox_b 50k rows at once (INSERT ... SELECT generate_series) while the writers write it too, start the relay with outbox_b added to --table; once it says the table joins, stop the broker for 0.5-1.5s and start it on its data",
		draw: func(r *rand.Rand, s *planState) Step {
			s.bMember = true
			return Step{Mode: []string{"kill", "term"}[r.IntN(2)], Down: between(r, 500*time.Millisecond, 1500*time.Millisecond), Rows: largeJoinRows}
		},
	},
	{
		name: "table-leave", weight: 1, ok: func(s *planState) bool { return s.bMember },
		doc: "stop writing outbox_b, wait until the slot confirmed its last row, SIGTERM the relay and start it without outbox_b",
		draw: func(_ *rand.Rand, s *planState) Step {
			s.bMember = false
			return Step{Mode: "term"}
		},
	},
	{
		name: "partition-attach", weight: 2, ok: always,
		doc: "create a table (sometimes with its columns in another order), add it to a listed publication, attach it to outbox_p and write to it",
		draw: func(r *rand.Rand, s *planState) Step {
			b := s.next
			s.next++
			s.attached = append(s.attached, b)
			return Step{Bucket: b, Reorder: r.IntN(2) == 0}
		},
	},
	{
		name: "partition-detach", weight: 2, ok: func(s *planState) bool { return len(s.attached) >= 2 },
		doc: "stop writing the oldest partition and detach it; sometimes with the relay down (it reads the rows after the detach), sometimes dropping it at once",
		draw: func(r *rand.Rand, s *planState) Step {
			b := s.attached[0]
			s.attached = s.attached[1:]
			st := Step{Bucket: b, Lagging: r.IntN(2) == 0, Drop: r.IntN(3) == 0}
			if st.Lagging {
				st.Down = between(r, 200*time.Millisecond, time.Second)
			}
			if !st.Drop {
				s.detached = append(s.detached, b)
			}
			return st
		},
	},
	{
		name: "partition-drop", weight: 1, ok: func(s *planState) bool { return len(s.detached) > 0 },
		doc: "drop a detached partition",
		draw: func(_ *rand.Rand, s *planState) Step {
			b := s.detached[0]
			s.detached = s.detached[1:]
			return Step{Bucket: b}
		},
	},
	{
		name: "broker-restart", weight: 2, ok: always,
		doc: "stop the Kafka broker for 0.3-1.5s and start it on its data",
		draw: func(r *rand.Rand, _ *planState) Step {
			return Step{Down: between(r, 300*time.Millisecond, 1500*time.Millisecond)}
		},
	},
	{
		name: "broker-stops-reading", weight: 2, ok: always,
		doc:  "the broker stops reading every connection open now, for good (new ones are served); payloads grow to 8 KiB for 1.5s so the relay's writes fill the socket buffers",
		draw: func(_ *rand.Rand, _ *planState) Step { return Step{Down: 1500 * time.Millisecond} },
	},
	{
		name: "standby-lag", weight: 3, ok: func(s *planState) bool { return s.plan.Source == "standby" },
		doc: "with the relay decoding on a standby (16+): recovery_min_apply_delay 1-3s on the standby for 1-3s, then off",
		draw: func(r *rand.Rand, _ *planState) Step {
			return Step{Mode: fmt.Sprintf("%ds", 1+r.IntN(3)), Down: between(r, time.Second, 3*time.Second)}
		},
	},
	{
		name: "replay", weight: 2, ok: always,
		doc:  "write a bulk burst to outbox_events (multi-row INSERT ... SELECT and COPY, larger than a replay page; transactions that commit in another order than they began), then run cdc-relay replay of a window of outbox_events around it while the relay streams and the writers write",
		draw: func(_ *rand.Rand, _ *planState) Step { return Step{} },
	},
	{
		name: "pg-restart", weight: 2, ok: always,
		doc: "restart Postgres (pg_ctl -m fast or immediate)",
		draw: func(r *rand.Rand, _ *planState) Step {
			return Step{Mode: []string{"fast", "immediate"}[r.IntN(2)]}
		},
	},
}

// OpDocs returns each operation a schedule draws from with what it does.
func OpDocs() [][2]string {
	out := make([][2]string, len(planOps))
	for i, o := range planOps {
		out[i] = [2]string{o.name, o.doc}
	}
	return out
}

// NewPlan draws seed's schedule. It is a pure function of its arguments.
func NewPlan(seed uint64, cfg PlanConfig) Plan {
	if cfg.Steps <= 0 {
		cfg.Steps = 8
	}
	r := rand.New(rand.NewPCG(seed, 0x5c4ed01e))
	// Every draw is taken on every major, so a seed's steps differ between
	// majors only where the major rules an operation out.
	layout, messages, bMember, standby := r.IntN(2), r.IntN(5) != 0, r.IntN(2) == 0, r.IntN(3) == 0
	p := Plan{
		Seed:     seed,
		Source:   "primary",
		Layout:   []string{"root", "listed"}[layout],
		Delivery: "effectively-once",
		Messages: cfg.PGMajor >= 14 && messages,
		BMember:  bMember,
		Buckets:  []int{1, 2},
	}
	if cfg.PGMajor >= 16 && standby {
		p.Source = "standby"
	}
	if r.IntN(6) == 0 {
		p.Delivery = "at-least-once"
	}
	// The snapshot only on the primary: a schedule on a standby tests the
	// standby, not this.
	p.Snapshot = r.IntN(4) == 0 && p.Source == "primary"
	s := &planState{cfg: cfg, plan: &p, bMember: p.BMember, attached: slices.Clone(p.Buckets), next: 3}
	for len(p.Steps) < cfg.Steps {
		var cands []planOp
		total := 0
		for _, o := range planOps {
			if o.ok(s) {
				cands = append(cands, o)
				total += o.weight
			}
		}
		n := r.IntN(total)
		var op planOp
		for _, o := range cands {
			if n -= o.weight; n < 0 {
				op = o
				break
			}
		}
		wait := between(r, 200*time.Millisecond, 900*time.Millisecond)
		st := op.draw(r, s)
		st.Op, st.Wait = op.name, wait
		p.Steps = append(p.Steps, st)
	}
	// Drawn after the steps, so that adding it changed no earlier seed's
	// schedule; it takes effect at the relay's kills and stops.
	p.CatchUp = r.IntN(2) == 0
	return p
}
