package runner

// The drain cells: the limit reader, the relay, the poller and the check of what reached Kafka.

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/bench/internal/child"
	"github.com/cdc-relay/cdc-relay/bench/internal/cpusplit"
	"github.com/cdc-relay/cdc-relay/bench/internal/pgload"
	"github.com/cdc-relay/cdc-relay/bench/internal/pgstat"
	"github.com/cdc-relay/cdc-relay/bench/internal/results"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// drainPhase runs the selected drain cells in order. The headline cell's
// database also hosts the start-up cells (their slots are created with the
// headline's, before its backlog), so it is set up when only those run.
func (b *bench) drainPhase(ctx context.Context) error {
	var startup []int
	for _, n := range b.cfg.ReconcilePartitions {
		if b.cfg.selected(startupCellName(n)) {
			startup = append(startup, n)
		}
	}
	cells := b.cfg.DrainCells()
	todo := 0
	for _, c := range cells {
		if b.cfg.selected(c.Name) {
			todo++
		}
	}
	done := 0
	for _, c := range cells {
		drain := b.cfg.selected(c.Name)
		var st []int
		if c.Headline {
			st = startup
		}
		if !drain && len(st) == 0 {
			continue
		}
		if drain {
			done++
			b.say("cell %s (%d of %d drain cells): %d events, %d per transaction, %d partitions, %d topics, ~%d B payload",
				c.Name, done, todo, c.Events, c.Shape.TxnSize, c.Shape.Partitions, c.Shape.Topics, c.Shape.Payload)
		}
		if err := b.drainCell(ctx, c, drain, st); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("cell %s: %w", c.Name, err)
			}
			// One failed cell must not cost the rest of a long matrix: it is
			// recorded and reported, and the next cell runs.
			b.say("  cell %s FAILED: %v", c.Name, err)
			b.res.FailedCells = append(b.res.FailedCells, results.FailedCell{Name: c.Name, Error: err.Error()})
			for _, db := range []string{"cell_" + c.Tag, "poller_" + c.Tag} {
				if err := b.pg.Exec(ctx, "postgres", "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
					b.say("  (could not drop database %s: %v)", db, err)
				}
			}
		}
	}
	return nil
}

// drainCell commits c's backlog into a database of its own, with the slots
// of every drain of it created by one statement before; drains it with the
// limit reader, the relay in each delivery mode and the limit reader again
// (when drain is set), runs the start-up cells of startup on it, drains a
// copy with the poller, checks what reached Kafka and drops the databases.
func (b *bench) drainCell(ctx context.Context, c DrainCell, drain bool, startup []int) error {
	b.cell = c
	db := "cell_" + c.Tag
	var err error
	if b.relayURL, err = b.pg.CreateDatabase(ctx, db); err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	if err := pgload.ApplyMigrations(ctx, b.relayURL, filepath.Join(b.root, "migrations"), "001_outbox.sql", "002_checkpoints.sql", "005_dead_letters.sql"); err != nil {
		return err
	}
	var slots []string
	if drain {
		slots = append(slots, "reader_a", "reader_b", "reader_lean", decodeAloneSlot)
		for _, run := range b.relayRuns() {
			slots = append(slots, run.drainSlot())
			if err := b.createTopics(ctx, c.topics(run.topicPrefix(c.Tag)), c.Shape.Partitions); err != nil {
				return err
			}
		}
	}
	for _, n := range startup {
		slots = append(slots, reconcileSlot(n))
	}
	if err := pgload.CreatePublicationAndSlots(ctx, b.relayURL, publication, slots...); err != nil {
		return err
	}
	b.say("  slots %s created together; committing the backlog", strings.Join(slots, ", "))
	secs, err := b.loadBacklog(ctx, b.relayURL, c)
	if err != nil {
		return err
	}
	if c.Headline {
		b.res.BacklogLoadSeconds = secs
	}
	cell := results.Cell{Name: c.Name, Shape: c.Shape, Events: c.Events, Transactions: c.Transactions()}
	if drain {
		if err := b.drainRelayAndLimit(ctx, c, &cell); err != nil {
			return err
		}
	}
	for _, n := range startup {
		rec, err := b.reconcileRun(ctx, n)
		if err != nil {
			return fmt.Errorf("%s: %w", startupCellName(n), err)
		}
		b.res.Reconcile = append(b.res.Reconcile, rec)
		b.res.Verify = append(b.res.Verify, rec.Verify)
	}
	if err := b.dropDatabase(ctx, db); err != nil {
		return err
	}
	if !drain {
		return nil
	}
	if err := b.pollerDrain(ctx, c, &cell); err != nil {
		return err
	}
	cell.Fill()
	b.res.Cells = append(b.res.Cells, cell)
	b.res.Verify = append(b.res.Verify, cell.Verify...)
	if c.Headline {
		b.res.LimitRuns, b.res.Limit = cell.LimitRuns, cell.Limit
		b.res.RelayRuns, b.res.Relay, b.res.Poller = cell.RelayRuns, cell.Relay, cell.Poller
	}
	b.say("  %s: limit %.0f, relay %.0f, poller %.0f ev/s; relay/limit %.2f; CPU µs/ev limit %.2f, relay %.2f, poller %.2f; walsender %.2f µs/ev, %.1f µs/txn (ceiling %.0f ev/s); relay peak RSS %.1f MiB",
		c.Name, cell.Limit.Rate, cell.Relay.Rate, cell.Poller.Rate, cell.RelayOverLimit, cell.Limit.CPUPerEventUS,
		cell.Relay.CPUPerEventUS, cell.Poller.CPUPerEventUS, cell.Limit.WalsenderUSPerEvent, cell.Limit.WalsenderUSPerTxn, cell.WalsenderCeiling(),
		float64(cell.Relay.PeakRSSBytes)/(1<<20))
	if n := len(cell.LimitRuns); n >= 3 && cell.LimitRuns[n-1].WalsenderUSPerEvent > 0 {
		lean := cell.LimitRuns[n-1]
		path := cell.LimitRuns[0]
		if cell.LimitRuns[1].Rate > path.Rate {
			path = cell.LimitRuns[1]
		}
		b.say("  %s: walsender µs/ev under the lean pglogrepl loop %.2f, the relay's read path %.2f (%.2f×), the relay %.2f (%.2f×); ev/s lean %.0f, read path %.0f, relay %.0f (relay/lean %.2f)",
			c.Name, lean.WalsenderUSPerEvent, path.WalsenderUSPerEvent, path.WalsenderUSPerEvent/lean.WalsenderUSPerEvent,
			cell.Relay.WalsenderUSPerEvent, cell.Relay.WalsenderUSPerEvent/lean.WalsenderUSPerEvent,
			lean.Rate, path.Rate, cell.Relay.Rate, cell.Relay.Rate/lean.Rate)
		if alone := cell.DecodeAloneUSPerEvent; alone > 0 {
			b.say("  %s: decoding alone (SQL, one backend, no socket) %.2f µs/ev; each walsender above it, what serving its reader cost: lean +%.2f, read path +%.2f, relay +%.2f µs/ev",
				c.Name, alone, lean.WalsenderUSPerEvent-alone, path.WalsenderUSPerEvent-alone, cell.Relay.WalsenderUSPerEvent-alone)
		}
	}
	return nil
}

// decodeAloneSlot is the slot decodeAlone decodes: created with the cell's
// other slots, so it holds the same backlog.
const decodeAloneSlot = "decode_alone"

// decodeAlone decodes the cell's backlog from decodeAloneSlot with SQL in one
// backend (pg_logical_slot_get_binary_changes, pgoutput with the relay's
// publication) and returns that backend's CPU per event: logical decoding
// with no socket and no reader to wake, the walsender's own work. A
// walsender's CPU above it is what serving its reader cost; unlike the
// walsenders' figures it does not depend on how a reader takes the stream.
// The SQL function also keeps every message in a tuplestore (in memory
// here: work_mem 2GB), which a walsender does not.
func (b *bench) decodeAlone(ctx context.Context) (float64, error) {
	conn, err := pgx.Connect(ctx, b.relayURL)
	if err != nil {
		return 0, fmt.Errorf("decode alone: connect: %w", err)
	}
	defer conn.Close(context.Background())
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return 0, fmt.Errorf("decode alone: %w", err)
	}
	if _, err := conn.Exec(ctx, "SET work_mem = '2GB'"); err != nil {
		return 0, fmt.Errorf("decode alone: %w", err)
	}
	before, err := pgstat.ProcessCPU(pid)
	if err != nil {
		return 0, err
	}
	var n int64
	q := fmt.Sprintf("SELECT count(*) FROM pg_logical_slot_get_binary_changes('%s', NULL, NULL, 'proto_version', '1', 'publication_names', '%s')", decodeAloneSlot, publication)
	if err := conn.QueryRow(ctx, q).Scan(&n); err != nil {
		return 0, fmt.Errorf("decode alone: %w", err)
	}
	after, err := pgstat.ProcessCPU(pid)
	if err != nil {
		return 0, err
	}
	us := (after - before).Seconds() * 1e6 / float64(b.cell.Events)
	b.say("  decoding alone (SQL in one backend, slot %s): %d messages, %.2f µs/ev", decodeAloneSlot, n, us)
	return us, nil
}

// drainRelayAndLimit drains the cell's backlog with the limit reader, the
// relay's runs and the limit reader again, and checks the relay's topics.
func (b *bench) drainRelayAndLimit(ctx context.Context, c DrainCell, cell *results.Cell) error {
	a, err := b.readerDrain(ctx, "reader_a")
	if err != nil {
		return err
	}
	b.limitSeconds = a.Seconds
	for _, run := range b.relayRuns() {
		d, err := b.relayDrain(ctx, run)
		if err != nil {
			return err
		}
		cell.RelayRuns = append(cell.RelayRuns, d)
	}
	bb, err := b.readerDrain(ctx, "reader_b")
	if err != nil {
		return err
	}
	// The honest limit: the faster of the relay's read path and the leanest
	// pglogrepl loop, which makes Postgres' walsender work the least.
	lean, err := b.readerDrainMode(ctx, "reader_lean", true)
	if err != nil {
		return err
	}
	if cell.DecodeAloneUSPerEvent, err = b.decodeAlone(ctx); err != nil {
		return err
	}
	a.Name, bb.Name, lean.Name = "limit before", "limit after", "lean pglogrepl loop"
	cell.LimitRuns = []results.Drain{a, bb, lean}
	cell.Limit = a
	for _, d := range cell.LimitRuns[1:] {
		if d.Rate > cell.Limit.Rate {
			cell.Limit = d
		}
	}
	for _, d := range cell.RelayRuns {
		if d.Delivery == results.EffectivelyOnce && d.Rate > cell.Relay.Rate {
			cell.Relay = d
		}
	}
	for _, run := range b.relayRuns() {
		v, err := verifyDrain(ctx, b.brokers, c.Name+" relay "+run.tag(), c.topics(run.topicPrefix(c.Tag)), c.Events)
		if err != nil {
			return err
		}
		cell.Verify = append(cell.Verify, v)
	}
	return nil
}

// createTopics creates topics with n partitions each.
func (b *bench) createTopics(ctx context.Context, topics []string, n int) error {
	for _, t := range topics {
		if err := sandbox.CreateTopic(ctx, b.brokers, t, n); err != nil {
			return fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	return nil
}

// dropDatabase drops the slots of database name, then the database.
func (b *bench) dropDatabase(ctx context.Context, name string) error {
	if err := b.pg.Exec(ctx, name, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database()"); err != nil {
		return fmt.Errorf("drop the slots of database %s: %w", name, err)
	}
	if err := b.pg.Exec(ctx, "postgres", "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// loadBacklog commits the backlog on url, then vacuums and checkpoints so the
// drains that follow do not pay for it.
func (b *bench) loadBacklog(ctx context.Context, url string, c DrainCell) (float64, error) {
	start := time.Now()
	lastSaid := start
	err := pgload.LoadBacklog(ctx, url, pgload.Backlog{
		Events: c.Events, Aggregates: b.cfg.Aggregates, TxnSize: c.Shape.TxnSize,
		Payload: c.Shape.Payload, AggregateType: drainAggType, Types: c.Shape.Topics,
	}, func(done int) {
		if time.Since(lastSaid) > 5*time.Second {
			lastSaid = time.Now()
			b.say("  %d events committed", done)
		}
	})
	if err != nil {
		return 0, err
	}
	secs := time.Since(start).Seconds()
	b.say("  backlog committed in %.1fs (%.0f events/s); VACUUM ANALYZE and CHECKPOINT", secs, float64(c.Events)/secs)
	for _, sql := range []string{"VACUUM (ANALYZE) public.outbox_events", "CHECKPOINT"} {
		if err := execSQL(ctx, url, sql); err != nil {
			return 0, err
		}
	}
	return secs, nil
}

// drainTimeout bounds one drain: at least 1,000 events/s, plus start-up.
func (b *bench) drainTimeout() time.Duration {
	return 2*time.Minute + time.Duration(b.cfg.Events)*time.Millisecond
}

// walsenderOf returns the pid of the walsender streaming slot (the slot's
// active_pid): a walsender is started for each replication connection, so its
// counters are the connection's.
func walsenderOf(ctx context.Context, url, slot string) (int, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, fmt.Errorf("connect to find the walsender: %w", err)
	}
	defer conn.Close(context.Background())
	var pid *int
	if err := conn.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid); err != nil {
		return 0, fmt.Errorf("find the walsender of slot %s: %w", slot, err)
	}
	if pid == nil {
		return 0, fmt.Errorf("find the walsender of slot %s: the slot is not active", slot)
	}
	return *pid, nil
}

// sampleStream records, into d, the CPU time of the walsender streaming slot
// over its life so far, and the read system calls of the reading process
// (pid): how finely it took the stream.
func sampleStream(ctx context.Context, url, slot string, pid int, d *results.Drain) error {
	ws, err := walsenderOf(ctx, url, slot)
	if err != nil {
		return err
	}
	cpu, err := pgstat.ProcessCPU(ws)
	if err != nil {
		return err
	}
	sc, err := pgstat.ProcessSyscalls(pid)
	if err != nil {
		return err
	}
	d.WalsenderCPUSeconds, d.ReaderReads = cpu.Seconds(), sc.Reads
	return nil
}

// readerDrain runs the limit reader on slot until it decoded the cell's
// backlog; it holds its connection until the walsender's CPU was read.
func (b *bench) readerDrain(ctx context.Context, slot string) (results.Drain, error) {
	return b.readerDrainMode(ctx, slot, false)
}

// readerDrainMode is readerDrain with the relay's read path, or with the
// minimal pglogrepl loop when lean is set.
func (b *bench) readerDrainMode(ctx context.Context, slot string, lean bool) (results.Drain, error) {
	c := b.cell
	what := "the relay's read path, producer discarding"
	if lean {
		what = "a minimal pglogrepl loop: ReceiveMessage, pglogrepl.Parse, a status every second"
	}
	b.say("  limit reader (%s) on slot %s: decoding %d events", what, slot, c.Events)
	d := results.Drain{Name: slot, Events: c.Events, Transactions: c.Transactions()}
	w, err := b.beginWindow(ctx, b.relayURL)
	if err != nil {
		return d, err
	}
	defer w.close()
	args := []string{"reader", "-count", strconv.Itoa(c.Events), "-hold"}
	if lean {
		args = append(args, "-lean")
	}
	args = append(append(args, "--"), b.relayArgs(b.drainRelayOptions(slot, relayRun{delivery: results.EffectivelyOnce}), "127.0.0.1:0")...)
	p, err := child.Start(child.Options{Name: "limit reader", Path: b.cfg.Self, Args: args})
	if err != nil {
		return d, err
	}
	defer func() { _, _ = p.Stop(stopGrace) }() // a no-op once stopped; cleanup on early return
	end, err := waitDone(ctx, p, b.drainTimeout())
	if err != nil {
		return d, err
	}
	if err := sampleStream(ctx, b.relayURL, slot, p.PID(), &d); err != nil {
		return d, err
	}
	bd, err := w.pg.Breakdown()
	if err != nil {
		return d, err
	}
	d.PGByProcess = perEvent(bd, d.Events)
	usage, err := p.Stop(stopGrace) // it holds the connection until told
	if err != nil {
		return d, err
	}
	if err := b.endWindow(ctx, w, b.relayURL, usage, &d); err != nil {
		return d, err
	}
	d.Seconds = end.Sub(p.Started()).Seconds()
	d.Fill()
	b.say("    %.0f events/s, CPU %.2fs (%.2f µs/ev), walsender %.2f µs/ev, %.2f reads/txn, Postgres CPU %.2fs, WAL %d B",
		d.Rate, d.CPUSeconds, d.CPUPerEventUS, d.WalsenderUSPerEvent, d.ReaderReadsPerTxn, d.PGCPUSeconds, d.WALBytes)
	return d, nil
}

// drainRelayOptions are the relay's options for a drain of the current cell
// from slot in run's delivery mode; the limit reader is given the same.
func (b *bench) drainRelayOptions(slot string, run relayRun) relayOptions {
	return relayOptions{slot: slot, topicPrefix: run.topicPrefix(b.cell.Tag), delivery: run.delivery}
}

// relayDrain runs the relay binary in run's delivery mode on its slot until
// Kafka acknowledged the backlog, then stops it with SIGTERM.
func (b *bench) relayDrain(ctx context.Context, run relayRun) (results.Drain, error) {
	c := b.cell
	b.say("  relay (built binary, --delivery %s, round %d) on slot %s: until Kafka acknowledged %d events",
		run.delivery, run.round, run.drainSlot(), c.Events)
	d := results.Drain{Name: "relay " + run.tag(), Events: c.Events, Transactions: c.Transactions(), Delivery: run.delivery, Round: run.round}
	w, err := b.beginWindow(ctx, b.relayURL)
	if err != nil {
		return d, err
	}
	defer w.close()
	o := b.drainRelayOptions(run.drainSlot(), run)
	o.pprof = b.cfg.ProfileDir != "" && run.delivery == results.EffectivelyOnce && run.round == 1
	r, err := b.startRelay(o)
	if err != nil {
		return d, err
	}
	defer func() { _, _ = r.Stop(stopGrace) }() // a no-op once stopped; cleanup on early return
	var prof *cpuProfile
	heapDone := make(chan error, 1)
	if o.pprof {
		// Most of the drain, from its start: as long as the limit reader took.
		secs := min(30, max(1, int(0.9*b.limitSeconds)))
		prof = r.startCPUProfile(ctx, secs, filepath.Join(b.cfg.ProfileDir, c.Tag+"-cpu.pprof"))
		// The heap half-way through, while events are in flight (the profile
		// also holds the allocations since the start).
		go func() {
			select {
			case <-ctx.Done():
				heapDone <- ctx.Err()
				return
			case <-time.After(time.Duration(b.limitSeconds / 2 * float64(time.Second))):
			}
			heapDone <- r.saveProfile(ctx, "heap", filepath.Join(b.cfg.ProfileDir, c.Tag+"-heap.pprof"))
		}()
	}
	end, err := r.waitPublished(ctx, c.Events, b.drainTimeout())
	if err != nil {
		return d, err
	}
	if prof != nil {
		if err := <-heapDone; err != nil {
			return d, err
		}
		split, err := prof.wait()
		if err != nil {
			return d, err
		}
		d.CPUSplit = map[string]float64{}
		for _, sh := range split {
			d.CPUSplit[sh.Part] = sh.Percent
		}
		b.say("    relay CPU profile (%s): %s", prof.path, cpusplit.Format(split))
	}
	if err := sampleStream(ctx, b.relayURL, run.drainSlot(), r.PID(), &d); err != nil {
		return d, err
	}
	bd, err := w.pg.Breakdown()
	if err != nil {
		return d, err
	}
	d.PGByProcess = perEvent(bd, d.Events)
	if m, err := r.metrics(ctx); err == nil {
		// The clean stop saves once more.
		d.CheckpointSaves = int(m.sum("cdc_relay_checkpoint_saves_total")) + 1
		d.ProduceRequests = int(m.sum("cdc_relay_produce_batches_total"))
		d.CatchUpBatches = int(m.sum("cdc_relay_catch_up_batches_total"))
		if d.ProduceRequests > 0 {
			d.MeanBatch = m.sum("cdc_relay_events_published_total") / float64(d.ProduceRequests)
		}
	}
	usage, err := r.Stop(stopGrace)
	if err != nil {
		return d, fmt.Errorf("stop relay after the drain: %w", err)
	}
	if err := b.endWindow(ctx, w, b.relayURL, usage, &d); err != nil {
		return d, err
	}
	d.Seconds = end.Sub(r.Started()).Seconds()
	d.Fill()
	b.say("    %.0f events/s, CPU %.2fs (%.2f µs/ev), walsender %.2f µs/ev, %.2f reads/txn, peak RSS %.1f MiB, Postgres CPU %.2fs, WAL %d B",
		d.Rate, d.CPUSeconds, d.CPUPerEventUS, d.WalsenderUSPerEvent, d.ReaderReadsPerTxn, float64(d.PeakRSSBytes)/(1<<20), d.PGCPUSeconds, d.WALBytes)
	return d, nil
}

// verifyDrain reads a drain's topics back with kgo and checks that every event
// arrived and that, per aggregate, the payload's seq increases in offset order
// (repeats of an event id count as duplicates, not as order violations).
func verifyDrain(ctx context.Context, brokers []string, system string, topics []string, n int) (results.Verify, error) {
	topic := topics[0]
	if len(topics) > 1 {
		topic = fmt.Sprintf("%s … (%d topics)", topics[0], len(topics))
	}
	v := results.Verify{System: system, Topic: topic}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	recs, err := sandbox.ReadAll(rctx, brokers, topics...)
	if err != nil {
		return v, fmt.Errorf("read back %s: %w", topic, err)
	}
	seen := make(map[string]struct{}, len(recs))
	last := make(map[string]int64)
	for _, r := range recs {
		v.Records++
		id := r.Headers["id"]
		if _, dup := seen[id]; dup {
			v.Duplicates++
			continue
		}
		seen[id] = struct{}{}
		var p struct {
			Seq *int64 `json:"seq"`
		}
		if err := json.Unmarshal(r.Value, &p); err != nil || p.Seq == nil {
			return v, fmt.Errorf("read back %s: record %d/%d has no seq: %q", topic, r.Partition, r.Offset, r.Value)
		}
		key := string(r.Key)
		if prev, ok := last[key]; ok && *p.Seq <= prev {
			v.OrderViolations++
		}
		last[key] = *p.Seq
	}
	v.Unique = len(seen)
	v.Missing = max(0, n-v.Unique)
	v.OK = v.Missing == 0 && v.OrderViolations == 0 && v.Unique == n
	return v, nil
}
