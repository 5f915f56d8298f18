package runner

// The message-outbox mode ("bench messages"): the same backlog of one-event
// transactions written as outbox rows and as logical decoding messages
// (migrations/007_outbox_emit.sql), side by side: what Postgres spends to
// write each, and how fast the relay drains each.

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/cdc-relay/cdc-relay/bench/internal/hoststat"
	"github.com/cdc-relay/cdc-relay/bench/internal/pgload"
	"github.com/cdc-relay/cdc-relay/bench/internal/pgstat"
	"github.com/cdc-relay/cdc-relay/bench/internal/results"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// The two outbox shapes.
const (
	ShapeTable    = "table"
	ShapeMessages = "messages"
)

// messagesPrefix is the message outbox's prefix in the message shape.
const messagesPrefix = "outbox"

// MessagesConfig configures RunMessages.
type MessagesConfig struct {
	Events     int // one-event transactions in each shape's backlog
	Aggregates int // distinct aggregate ids
	Payload    int // approximate payload bytes
	Rounds     int // each round runs both shapes (table, then messages)
	// RelayBin is a cdc-relay binary to measure; "" builds ./cmd/cdc-relay.
	RelayBin string
	Out      io.Writer
}

// ShapeRun is one shape's backlog load and relay drain.
type ShapeRun struct {
	Shape string
	Round int
	// The load: N one-event transactions committed by a server-side loop.
	LoadSeconds      float64
	LoadPGUSPerEvent float64 // Postgres CPU (every process) per event
	LoadWALPerEvent  float64 // WAL bytes per event
	// The drain: the relay (--delivery effectively-once) from start until
	// Kafka acknowledged every event.
	DrainRate           float64 // events/s
	RelayCPUUSPerEvent  float64
	WalsenderUSPerEvent float64
	// The cleanup a table needs once its rows are published (DELETE, then
	// VACUUM); none for messages.
	CleanupPGUSPerEvent float64
	CleanupWALPerEvent  float64
}

// RunMessages runs the message-outbox mode and prints a table per run and the
// ratios of messages to table (means over the rounds).
func RunMessages(ctx context.Context, mc MessagesConfig) ([]ShapeRun, error) {
	out := mc.Out
	if out == nil {
		out = io.Discard
	}
	b := &bench{cfg: Config{Out: out}, out: out, started: time.Now()}
	load0, err := hoststat.LoadAvg()
	if err != nil {
		return nil, err
	}
	b.say("load average %.2f on %d CPUs at the start", load0, runtime.NumCPU())
	if b.root, err = moduleRoot(); err != nil {
		return nil, err
	}
	if b.tmp, err = os.MkdirTemp("", "cdc-relay-bench-messages-"); err != nil {
		return nil, fmt.Errorf("create temp dir: %w", err)
	}
	defer os.RemoveAll(b.tmp)
	if mc.RelayBin != "" {
		b.relayBin = mc.RelayBin
	} else if err := b.buildRelay(ctx); err != nil {
		return nil, err
	}
	b.say("starting PostgreSQL 15 and the in-process Kafka broker (kfake)")
	if b.pg, err = sandbox.StartPostgres(ctx, sandbox.PGOptions{Settings: PGSettings}); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	defer func() {
		if err := b.pg.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: stop postgres: %v\n", err)
		}
	}()
	if b.pg.External() {
		return nil, fmt.Errorf("the benchmark measures Postgres processes through /proc: unset %s", sandbox.EnvPGURL)
	}
	if b.cpu, err = pgstat.NewCPUSampler(b.pg.DataDir()); err != nil {
		return nil, err
	}
	kafka, err := sandbox.StartKafka(sandbox.KafkaOptions{Partitions: 8})
	if err != nil {
		return nil, fmt.Errorf("start kafka: %w", err)
	}
	defer kafka.Close()
	b.brokers = kafka.Brokers()

	var runs []ShapeRun
	for round := 1; round <= max(1, mc.Rounds); round++ {
		for _, shape := range []string{ShapeTable, ShapeMessages} {
			r, err := b.shapeRun(ctx, mc, shape, round)
			if err != nil {
				return nil, fmt.Errorf("%s shape, round %d: %w", shape, round, err)
			}
			runs = append(runs, r)
		}
	}
	load1, err := hoststat.LoadAvg()
	if err != nil {
		return nil, err
	}
	printShapes(out, runs, mc, load0, load1)
	return runs, nil
}

// shapeRun loads one shape's backlog into a database of its own, then drains
// it with the relay.
func (b *bench) shapeRun(ctx context.Context, mc MessagesConfig, shape string, round int) (ShapeRun, error) {
	r := ShapeRun{Shape: shape, Round: round}
	db := "msgbench_" + shape + strconv.Itoa(round)
	url, err := b.pg.CreateDatabase(ctx, db)
	if err != nil {
		return r, err
	}
	defer func() { _ = b.dropDatabase(context.WithoutCancel(ctx), db) }()
	b.relayURL = url
	migrations := filepath.Join(b.root, "migrations")
	slot := "relay_" + shape
	setup := []string{"CREATE PUBLICATION " + publication + " FOR TABLE public.outbox_events WITH (publish = 'insert')"}
	if err := pgload.ApplyMigrations(ctx, url, migrations, "001_outbox.sql", "002_checkpoints.sql"); err != nil {
		return r, err
	}
	if shape == ShapeMessages {
		if err := pgload.ApplyMigrations(ctx, url, migrations, "007_outbox_emit.sql"); err != nil {
			return r, err
		}
		setup = []string{"CREATE PUBLICATION " + publication}
	}
	setup = append(setup, "SELECT pg_create_logical_replication_slot('"+slot+"', 'pgoutput')")
	for _, sql := range setup {
		if err := execSQL(ctx, url, sql); err != nil {
			return r, err
		}
	}

	b.say("%s #%d: committing %d one-event transactions", shape, round, mc.Events)
	w, err := pgstat.Begin(ctx, b.cpu, url)
	if err != nil {
		return r, err
	}
	start := time.Now()
	if err := loadShape(ctx, url, shape, mc); err != nil {
		w.Close()
		return r, err
	}
	r.LoadSeconds = time.Since(start).Seconds()
	u, err := w.End(ctx)
	if err != nil {
		return r, err
	}
	n := float64(mc.Events)
	r.LoadPGUSPerEvent = float64(u.CPU.Microseconds()) / n
	r.LoadWALPerEvent = float64(u.WALBytes) / n
	for _, sql := range []string{"VACUUM (ANALYZE)", "CHECKPOINT"} {
		if err := execSQL(ctx, url, sql); err != nil {
			return r, err
		}
	}

	b.say("%s #%d: relay draining into Kafka", shape, round)
	b.cfg.RelayFlags = nil
	if shape == ShapeMessages {
		b.cfg.RelayFlags = []string{"--messages-prefix", messagesPrefix}
	}
	proc, err := b.startRelay(relayOptions{slot: slot, topic: "msgbench." + shape + strconv.Itoa(round), delivery: results.EffectivelyOnce})
	if err != nil {
		return r, err
	}
	defer func() { _, _ = proc.Stop(stopGrace) }()
	end, err := proc.waitPublished(ctx, mc.Events, 2*time.Minute+time.Duration(mc.Events)*time.Millisecond)
	if err != nil {
		return r, err
	}
	ws, err := walsenderOf(ctx, url, slot)
	if err != nil {
		return r, err
	}
	wcpu, err := pgstat.ProcessCPU(ws)
	if err != nil {
		return r, err
	}
	usage, err := proc.Stop(stopGrace)
	if err != nil {
		return r, fmt.Errorf("stop relay: %w", err)
	}
	r.DrainRate = n / end.Sub(proc.Started()).Seconds()
	r.RelayCPUUSPerEvent = float64((usage.User + usage.System).Microseconds()) / n
	r.WalsenderUSPerEvent = float64(wcpu.Microseconds()) / n
	if shape == ShapeTable {
		if w, err = pgstat.Begin(ctx, b.cpu, url); err != nil {
			return r, err
		}
		for _, sql := range []string{"DELETE FROM public.outbox_events", "VACUUM public.outbox_events"} {
			if err := execSQL(ctx, url, sql); err != nil {
				return r, err
			}
		}
		if u, err = w.End(ctx); err != nil {
			return r, err
		}
		r.CleanupPGUSPerEvent = float64(u.CPU.Microseconds()) / n
		r.CleanupWALPerEvent = float64(u.WALBytes) / n
	}
	b.say("  load %.1fs: Postgres %.1f µs/ev, WAL %.0f B/ev; drain %.0f ev/s, relay %.1f µs/ev, walsender %.1f µs/ev; cleanup Postgres %.1f µs/ev, WAL %.0f B/ev",
		r.LoadSeconds, r.LoadPGUSPerEvent, r.LoadWALPerEvent, r.DrainRate, r.RelayCPUUSPerEvent, r.WalsenderUSPerEvent,
		r.CleanupPGUSPerEvent, r.CleanupWALPerEvent)
	return r, nil
}

// loadShape commits mc.Events one-event transactions of shape, by a
// server-side loop, so both shapes pay the same client cost (none): an
// INSERT into the outbox table, or outbox_emit's logical decoding message,
// with the same payload.
func loadShape(ctx context.Context, url, shape string, mc MessagesConfig) error {
	write := fmt.Sprintf(`INSERT INTO public.outbox_events (aggregate_type, aggregate_id, event_type, payload)
      VALUES ('bench', 'agg-' || (g %% %[1]d), 'BacklogEvent', jsonb_build_object('agg', g %% %[1]d, 'seq', g / %[1]d, 'pad', repeat('x', %[2]d)))`,
		mc.Aggregates, max(0, mc.Payload-40))
	if shape == ShapeMessages {
		write = fmt.Sprintf(`PERFORM public.outbox_emit('bench', 'agg-' || (g %% %[1]d), 'BacklogEvent',
      jsonb_build_object('agg', g %% %[1]d, 'seq', g / %[1]d, 'pad', repeat('x', %[2]d)), prefix => '%[3]s')`,
			mc.Aggregates, max(0, mc.Payload-40), messagesPrefix)
	}
	const chunk = 50000
	for g0 := 0; g0 < mc.Events; g0 += chunk {
		sql := fmt.Sprintf(`DO $$
DECLARE g bigint;
BEGIN
  FOR g IN %d..%d LOOP
    %s;
    COMMIT;
  END LOOP;
END $$`, g0, min(g0+chunk, mc.Events)-1, write)
		if err := execSQL(ctx, url, sql); err != nil {
			return fmt.Errorf("load the %s backlog: %w", shape, err)
		}
	}
	return nil
}

// printShapes prints every run and the ratios messages / table of the means.
func printShapes(out io.Writer, runs []ShapeRun, mc MessagesConfig, load0, load1 float64) {
	fmt.Fprintf(out, "\nmessage outbox vs outbox table: %d one-event transactions of ~%d B payloads each, %d aggregates; load average %.2f → %.2f on %d CPUs\n",
		mc.Events, mc.Payload, mc.Aggregates, load0, load1, runtime.NumCPU())
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shape\tround\tload PG µs/ev\tload WAL B/ev\trelay ev/s\trelay µs/ev\twalsender µs/ev\tcleanup PG µs/ev\tcleanup WAL B/ev\twrite+cleanup PG µs/ev\twrite+cleanup WAL B/ev\t")
	mean := map[string]*ShapeRun{ShapeTable: {}, ShapeMessages: {}}
	count := map[string]float64{}
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t%.0f\t%.1f\t%.0f\t\n", r.Shape, r.Round, r.LoadPGUSPerEvent, r.LoadWALPerEvent,
			r.DrainRate, r.RelayCPUUSPerEvent, r.WalsenderUSPerEvent, r.CleanupPGUSPerEvent, r.CleanupWALPerEvent,
			r.LoadPGUSPerEvent+r.CleanupPGUSPerEvent, r.LoadWALPerEvent+r.CleanupWALPerEvent)
		m := mean[r.Shape]
		m.LoadPGUSPerEvent += r.LoadPGUSPerEvent
		m.LoadWALPerEvent += r.LoadWALPerEvent
		m.DrainRate += r.DrainRate
		m.RelayCPUUSPerEvent += r.RelayCPUUSPerEvent
		m.WalsenderUSPerEvent += r.WalsenderUSPerEvent
		m.CleanupPGUSPerEvent += r.CleanupPGUSPerEvent
		m.CleanupWALPerEvent += r.CleanupWALPerEvent
		count[r.Shape]++
	}
	t, m := mean[ShapeTable], mean[ShapeMessages]
	ratio := func(a, b float64) float64 { return a / b } // the counts are equal: their sums' ratio is the means'
	if count[ShapeTable] > 0 && count[ShapeTable] == count[ShapeMessages] {
		fmt.Fprintf(tw, "messages/table\t\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\t\t%.2f\t%.2f\t\n",
			ratio(m.LoadPGUSPerEvent, t.LoadPGUSPerEvent), ratio(m.LoadWALPerEvent, t.LoadWALPerEvent), ratio(m.DrainRate, t.DrainRate),
			ratio(m.RelayCPUUSPerEvent, t.RelayCPUUSPerEvent), ratio(m.WalsenderUSPerEvent, t.WalsenderUSPerEvent),
			ratio(m.LoadPGUSPerEvent+m.CleanupPGUSPerEvent, t.LoadPGUSPerEvent+t.CleanupPGUSPerEvent),
			ratio(m.LoadWALPerEvent+m.CleanupWALPerEvent, t.LoadWALPerEvent+t.CleanupWALPerEvent))
	}
	_ = tw.Flush()
}
