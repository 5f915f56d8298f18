package runner

// The table cells (issue 42 point 7): rows already in an outbox table,
// published by `cdc-relay replay`, and by the relay when the table joins the
// publication of its slot while an application inserts into it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-relay/cdc-relay/bench/internal/child"
	"github.com/cdc-relay/cdc-relay/bench/internal/pgload"
	"github.com/cdc-relay/cdc-relay/bench/internal/results"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// tableCell is one table cell: kind (results.KindReplay or KindJoin) over
// rows rows.
type tableCell struct {
	kind string
	rows int
}

// name is the cell's name for -cell: replay/rows=N, join/rows=N.
func (t tableCell) name() string { return t.kind + "/rows=" + strconv.Itoa(t.rows) }

// tag names the cell's database and topics: replay100000, join100000.
func (t tableCell) tag() string { return t.kind + strconv.Itoa(t.rows) }

// topic is the topic of the cell's rows of aggregate type aggType.
func (t tableCell) topic(aggType string) string {
	return relayTopicPrefix + t.tag() + "." + aggType
}

// tableCells lists the table cells in the order they run: for each of
// TableRows, the replay, then the join.
func (c Config) tableCells() []tableCell {
	var out []tableCell
	for _, n := range c.TableRows {
		out = append(out, tableCell{results.KindReplay, n}, tableCell{results.KindJoin, n})
	}
	return out
}

// The table cells' rows, tables and settings.
const (
	// fillChunk is the rows of one INSERT … SELECT that fills a table: the
	// rows of a statement share its created_at, as a bulk writer's do.
	fillChunk     = 50000
	fillAggType   = "filled" // aggregate_type of the rows filled in
	appAggType    = "app"    // of the application's rows during a join
	firstAggType  = "first"  // of the row the relay publishes before the join
	joinTable     = "public.join_events"
	joinSlot      = "relay_join"
	replayBatch   = 1000 // replay's --batch-size
	appMinGap     = 10 * time.Millisecond
	appMaxGap     = 20 * time.Millisecond
	appConns      = 40 // the application writer's pool: INSERTs that wait pile up to this many
	appWarmUp     = time.Second
	joinDoneRegex = `^join snapshot done`
	// replayPublished finds the rows a replay published in its summary:
	// "replay 1 (outbox, by bench): selected N, published N, …".
	replayPublishedRegex = `published (\d+)`
	countIdle            = 5 // empty polls of a second that end countRecords short of its count
)

var replayPublished = regexp.MustCompile(replayPublishedRegex)

// tablePhase runs the selected table cells in order; a failed cell is
// recorded and the next one runs.
func (b *bench) tablePhase(ctx context.Context) error {
	var todo []tableCell
	for _, t := range b.cfg.tableCells() {
		if b.cfg.selected(t.name()) {
			todo = append(todo, t)
		}
	}
	for i, t := range todo {
		b.say("cell %s (%d of %d table cells): %d rows of ~%d B in a second outbox table", t.name(), i+1, len(todo), t.rows, 300)
		run := b.replayCell
		if t.kind == results.KindJoin {
			run = b.joinCell
		}
		cell, err := run(ctx, t)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("cell %s: %w", t.name(), err)
			}
			b.say("  cell %s FAILED: %v", t.name(), err)
			b.res.FailedCells = append(b.res.FailedCells, results.FailedCell{Name: t.name(), Error: err.Error()})
			if err := b.dropDatabase(ctx, "table_"+t.tag()); err != nil {
				b.say("  (could not drop database table_%s: %v)", t.tag(), err)
			}
			continue
		}
		b.res.TableCells = append(b.res.TableCells, cell)
	}
	return nil
}

// tableDatabase creates the cell's database with the outbox, checkpoint and
// dead-letter tables, and topics of the headline's partitions for aggTypes.
func (b *bench) tableDatabase(ctx context.Context, t tableCell, aggTypes ...string) (string, error) {
	url, err := b.pg.CreateDatabase(ctx, "table_"+t.tag())
	if err != nil {
		return "", fmt.Errorf("create database: %w", err)
	}
	if err := pgload.ApplyMigrations(ctx, url, b.root+"/migrations", "001_outbox.sql", "002_checkpoints.sql", "005_dead_letters.sql"); err != nil {
		return "", err
	}
	for _, a := range aggTypes {
		if err := sandbox.CreateTopic(ctx, b.brokers, t.topic(a), b.cfg.Headline().Partitions); err != nil {
			return "", fmt.Errorf("create topic %s: %w", t.topic(a), err)
		}
	}
	return url, nil
}

// fillTable inserts rows rows into table with INSERT … SELECT
// generate_series, fillChunk rows per autocommitted statement, then vacuums
// and checkpoints: not timed. It returns the statements and their seconds.
func (b *bench) fillTable(ctx context.Context, url, table string, rows int) (int, float64, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, 0, fmt.Errorf("fill %s: connect: %w", table, err)
	}
	defer conn.Close(context.Background())
	start := time.Now()
	q := `INSERT INTO ` + table + ` (aggregate_type, aggregate_id, event_type, payload)
		SELECT $1, 'agg-' || (g % $2), 'Filled', jsonb_build_object('seq', g, 'pad', repeat('x', 250))
		FROM generate_series($3::bigint, $4::bigint) g`
	statements := 0
	for from := 0; from < rows; from += fillChunk {
		to := min(rows, from+fillChunk) - 1
		if _, err := conn.Exec(ctx, q, fillAggType, b.cfg.Aggregates, from, to); err != nil {
			return 0, 0, fmt.Errorf("fill %s: %w", table, err)
		}
		statements++
	}
	secs := time.Since(start).Seconds()
	for _, sql := range []string{"VACUUM (ANALYZE) " + table, "CHECKPOINT"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return 0, 0, fmt.Errorf("fill %s: %s: %w", table, sql, err)
		}
	}
	b.say("  %s filled with %d rows by %d INSERT … SELECT statements in %.1fs (not timed); VACUUM ANALYZE and CHECKPOINT", table, rows, statements, secs)
	return statements, secs, nil
}

// tableTimeout bounds one table cell's publishing: Config.TableTimeout, or
// else at least 500 rows/s, plus start-up.
func (b *bench) tableTimeout(rows int) time.Duration {
	if b.cfg.TableTimeout > 0 {
		return b.cfg.TableTimeout
	}
	return 2*time.Minute + time.Duration(rows)*2*time.Millisecond
}

// tooSlow is the error of a cell whose process did not finish within
// timeout: how many of the rows Kafka held by then.
func (b *bench) tooSlow(ctx context.Context, t tableCell, what string, timeout time.Duration) error {
	v, err := countRecords(ctx, b.brokers, t.name(), t.topic(fillAggType), t.rows, true, time.Minute)
	if err != nil {
		return fmt.Errorf("%s did not finish within %s (-table-timeout), and reading Kafka failed: %w", what, timeout, err)
	}
	return fmt.Errorf("%s did not finish within %s (-table-timeout): Kafka held %d of the %d rows by then (%.0f rows/s), %d duplicates",
		what, timeout, v.Unique, t.rows, float64(v.Unique)/timeout.Seconds(), v.Duplicates)
}

// replayCell fills the outbox table and times `cdc-relay replay --rate 0`
// from its start to its exit, then checks that Kafka holds every row once.
func (b *bench) replayCell(ctx context.Context, t tableCell) (results.TableCell, error) {
	cell := results.TableCell{Name: t.name(), Kind: t.kind, Rows: t.rows}
	url, err := b.tableDatabase(ctx, t, fillAggType)
	if err != nil {
		return cell, err
	}
	since := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	if cell.FillStatements, cell.FillSeconds, err = b.fillTable(ctx, url, "public.outbox_events", t.rows); err != nil {
		return cell, err
	}
	args := []string{"replay", "--pg-url", url, "--table", "public.outbox_events", "--since", since.Format(time.RFC3339),
		"--kafka-brokers", strings.Join(b.brokers, ","), "--topic", relayTopicPrefix + t.tag() + ".{aggregate_type}",
		"--rate", "0", "--batch-size", strconv.Itoa(replayBatch), "--actor", "bench"}
	b.say("  cdc-relay replay --since %s --rate 0 --batch-size %d: until it exits", since.Format(time.RFC3339), replayBatch)
	d := results.Drain{Name: t.name(), Events: t.rows}
	w, err := b.beginWindow(ctx, url)
	if err != nil {
		return cell, err
	}
	defer w.close()
	p, err := child.Start(child.Options{Name: "replay", Path: b.relayBin, Dir: b.tmp, Args: args})
	if err != nil {
		return cell, err
	}
	timeout := b.tableTimeout(t.rows)
	usage, err := p.Wait(timeout, stopGrace)
	end := time.Now()
	out := drainLines(p)
	if end.Sub(p.Started()) >= timeout {
		return cell, b.tooSlow(ctx, t, "the replay", timeout)
	}
	if err != nil {
		return cell, fmt.Errorf("replay: %w; its output: %s", err, strings.Join(out, " | "))
	}
	if err := b.endWindow(ctx, w, url, usage, &d); err != nil {
		return cell, err
	}
	d.Seconds = end.Sub(p.Started()).Seconds()
	d.Fill()
	cell.Run = d
	for _, l := range out {
		b.say("    replay: %s", l)
		if m := replayPublished.FindStringSubmatch(l); m != nil {
			cell.Published, _ = strconv.Atoi(m[1])
		}
	}
	if cell.Kafka, err = countRecords(ctx, b.brokers, t.name()+" replay", t.topic(fillAggType), t.rows, true, 3*time.Minute); err != nil {
		return cell, err
	}
	b.say("    %.0f rows/s (%.2fs), CPU %.2f µs/row, Postgres %.2f µs/row; Kafka: %d records, %d lost, %d duplicates; other processes %.0f%% of the machine",
		d.Rate, d.Seconds, d.CPUPerEventUS, d.PGCPUPerEventUS, cell.Kafka.Records, cell.Kafka.Missing, cell.Kafka.Duplicates, 100*d.ForeignShare)
	return cell, b.dropDatabase(ctx, "table_"+t.tag())
}

// joinCell runs the relay on a slot of the outbox table, stops it, fills a
// second table (not in the publication), and restarts the relay with both
// tables, so the second joins: it times the relay's start to its "join
// snapshot done" line (every joined row acknowledged by Kafka), while an
// application inserts into the joining table every 10-20 ms and times each
// INSERT+COMMIT.
func (b *bench) joinCell(ctx context.Context, t tableCell) (results.TableCell, error) {
	cell := results.TableCell{Name: t.name(), Kind: t.kind, Rows: t.rows}
	url, err := b.tableDatabase(ctx, t, fillAggType, appAggType, firstAggType)
	if err != nil {
		return cell, err
	}
	b.relayURL = url
	if err := execSQL(ctx, url, "CREATE TABLE "+joinTable+" (LIKE public.outbox_events INCLUDING ALL)"); err != nil {
		return cell, err
	}
	if err := pgload.CreatePublicationAndSlots(ctx, url, publication, joinSlot); err != nil {
		return cell, err
	}
	opts := relayOptions{slot: joinSlot, topicPrefix: relayTopicPrefix + t.tag() + ".", delivery: results.EffectivelyOnce}

	// The relay on its slot, with the outbox table alone: one event, a checkpoint.
	b.say("  relay on slot %s with public.outbox_events alone: one event, then stopped", joinSlot)
	if err := execSQL(ctx, url, "INSERT INTO public.outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('"+firstAggType+"', 'agg-0', 'First', '{\"seq\": 0}')"); err != nil {
		return cell, err
	}
	first, err := b.startRelay(opts)
	if err != nil {
		return cell, err
	}
	if _, err := first.waitPublished(ctx, 1, time.Minute); err != nil {
		_, _ = first.Stop(stopGrace)
		return cell, err
	}
	if _, err := first.Stop(stopGrace); err != nil {
		return cell, fmt.Errorf("stop the relay before the join: %w", err)
	}

	if cell.FillStatements, cell.FillSeconds, err = b.fillTable(ctx, url, joinTable, t.rows); err != nil {
		return cell, err
	}
	d := results.Drain{Name: t.name(), Events: t.rows, Delivery: results.EffectivelyOnce}
	w, err := b.beginWindow(ctx, url)
	if err != nil {
		return cell, err
	}
	defer w.close()
	app, err := startAppWriter(ctx, url)
	if err != nil {
		return cell, err
	}
	defer func() { _, _, _ = app.stop() }() // a no-op once stopped; cleanup on early return
	select {
	case <-ctx.Done():
		return cell, ctx.Err()
	case <-time.After(appWarmUp):
	}
	b.say("  relay restarted with --table public.outbox_events --table %s (the second joins), an application inserting into it every %s-%s", joinTable, appMinGap, appMaxGap)
	opts.tables = []string{"public.outbox_events", joinTable}
	opts.logLevel = "info"
	logs := newLogWatch(regexp.MustCompile(joinDoneRegex))
	opts.stderr = logs
	r, err := b.startRelay(opts)
	if err != nil {
		return cell, err
	}
	defer func() { _, _ = r.Stop(stopGrace) }() // a no-op once stopped; cleanup on early return
	timeout := b.tableTimeout(t.rows)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var line string
	select {
	case line = <-logs.found:
	case <-r.Done():
		return cell, r.exited()
	case <-ctx.Done():
		return cell, ctx.Err()
	case <-timer.C:
		// Stopping the relay ends the join's transaction, and with it the
		// lock the application's INSERTs wait on.
		_, _ = r.Stop(stopGrace)
		stopped := time.Now()
		err := b.tooSlow(ctx, t, "the join", timeout)
		lat, _, _ := app.stop()
		p50, p99, mx := results.Quantiles(appDuring(lat, r.Started(), stopped))
		return cell, fmt.Errorf("%w; the application's INSERTs due meanwhile: p50 %.1f p99 %.1f max %.1f ms", err, p50, p99, mx)
	}
	joined := time.Now()
	var done struct {
		Events int `json:"events"`
	}
	if err := json.Unmarshal([]byte(line), &done); err != nil {
		return cell, fmt.Errorf("parse the relay's join snapshot done line %q: %w", line, err)
	}
	cell.Published = done.Events
	d.Seconds = joined.Sub(r.Started()).Seconds()
	lat, total, failed := app.stop()
	if failed != nil {
		return cell, fmt.Errorf("the application's INSERTs failed: %w", failed)
	}
	a := &results.AppInserts{Total: total}
	during := appDuring(lat, r.Started(), joined)
	a.Count = len(during)
	a.P50Ms, a.P99Ms, a.MaxMs = results.Quantiles(during)
	cell.App = a
	if a.Kafka, err = countRecords(ctx, b.brokers, t.name()+" app rows", t.topic(appAggType), total, false, 3*time.Minute); err != nil {
		return cell, err
	}
	usage, err := r.Stop(stopGrace)
	if err != nil {
		return cell, fmt.Errorf("stop relay after the join: %w", err)
	}
	if err := b.endWindow(ctx, w, url, usage, &d); err != nil {
		return cell, err
	}
	d.Fill()
	cell.Run = d
	if cell.Kafka, err = countRecords(ctx, b.brokers, t.name()+" joined rows", t.topic(fillAggType), t.rows, true, 3*time.Minute); err != nil {
		return cell, err
	}
	b.say("    %.0f rows/s (%.2fs to the joined rows all in Kafka; the relay said it published %d), relay CPU %.2f µs/row (its whole run); app INSERT+COMMIT during the join: %d, p50 %.1f p99 %.1f max %.1f ms; Kafka: %d lost, %d duplicates; app rows %d of %d streamed, %d duplicates; other processes %.0f%% of the machine",
		d.Rate, d.Seconds, cell.Published, d.CPUPerEventUS, a.Count, a.P50Ms, a.P99Ms, a.MaxMs, cell.Kafka.Missing, cell.Kafka.Duplicates, a.Kafka.Unique, total, a.Kafka.Duplicates, 100*d.ForeignShare)
	return cell, b.dropDatabase(ctx, "table_"+t.tag())
}

// appSample is one application INSERT: when it was due, and due → COMMIT
// returned.
type appSample struct {
	due time.Time
	ms  float64
}

// appWriter is the application during a join: an autocommitted INSERT into
// the joining table every appMinGap-appMaxGap, each on a connection of its
// own pool (open loop: an INSERT that waits does not hold back the next).
type appWriter struct {
	pool    *pgxpool.Pool
	cancel  context.CancelFunc
	ticks   sync.WaitGroup // the ticking goroutine
	inserts sync.WaitGroup // INSERTs in flight
	mu      sync.Mutex
	samples []appSample
	failed  error
	once    sync.Once
}

// startAppWriter starts the writer on url; stop ends it.
func startAppWriter(ctx context.Context, url string) (*appWriter, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("app writer: %w", err)
	}
	cfg.MaxConns = appConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("app writer: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	a := &appWriter{pool: pool, cancel: cancel}
	a.ticks.Add(1)
	go func() {
		defer a.ticks.Done()
		next := time.Now()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(next)):
			}
			a.inserts.Add(1)
			go a.insert(n, next)
			next = next.Add(appMinGap + rand.N(appMaxGap-appMinGap))
		}
	}()
	return a, nil
}

// insert commits the application's n-th row, due at due. It runs on to its
// commit after stop, which waits for it: a row the database has may not go
// uncounted.
func (a *appWriter) insert(n int, due time.Time) {
	defer a.inserts.Done()
	_, err := a.pool.Exec(context.Background(), "INSERT INTO "+joinTable+" (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, 'AppWrite', jsonb_build_object('seq', $3::int))",
		appAggType, "app-"+strconv.Itoa(n%100), n)
	ms := float64(time.Since(due)) / float64(time.Millisecond)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.failed = errors.Join(a.failed, err)
		return
	}
	a.samples = append(a.samples, appSample{due: due, ms: ms})
}

// stop ends the writer, waits for its INSERTs in flight and returns the
// samples, how many rows it committed and the errors of those that failed.
// Later calls return the same.
func (a *appWriter) stop() ([]appSample, int, error) {
	a.once.Do(func() {
		a.cancel()
		a.ticks.Wait()
		a.inserts.Wait()
		a.pool.Close()
	})
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.samples, len(a.samples), a.failed
}

// appDuring is the latency of the samples due from start to end, in ms.
func appDuring(samples []appSample, start, end time.Time) []float64 {
	var out []float64
	for _, s := range samples {
		if !s.due.Before(start) && !s.due.After(end) {
			out = append(out, s.ms)
		}
	}
	return out
}

// countRecords reads topic from its start with kgo and checks that it holds
// want distinct event ids (the "id" header), each once: the records, the
// distinct ids, the duplicates and the ids missing. It reads until a poll of
// a second brings nothing once it has seen want ids, or timeout; when done
// is set, whatever wrote the topic has finished, and countIdle polls in a
// row that bring nothing end it short of want too (a relay still streaming
// may be silent longer: it decodes the WAL before the rows). Only the ids
// are kept, so a million records fit.
func countRecords(ctx context.Context, brokers []string, system, topic string, want int, done bool, timeout time.Duration) (results.Verify, error) {
	v := results.Verify{System: system, Topic: topic}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(250*time.Millisecond))
	if err != nil {
		return v, fmt.Errorf("read back %s: %w", topic, err)
	}
	defer cl.Close()
	seen := make(map[string]struct{}, want)
	deadline := time.Now().Add(timeout)
	for idle := 0; time.Now().Before(deadline); {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fetches := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return v, ctx.Err()
		}
		for _, fe := range fetches.Errors() {
			if !errors.Is(fe.Err, context.DeadlineExceeded) && !errors.Is(fe.Err, context.Canceled) {
				return v, fmt.Errorf("read back %s: %w", topic, fe.Err)
			}
		}
		got := 0
		fetches.EachRecord(func(r *kgo.Record) {
			got++
			v.Records++
			id := ""
			for _, h := range r.Headers {
				if h.Key == "id" {
					id = string(h.Value)
				}
			}
			if _, dup := seen[id]; dup {
				v.Duplicates++
				return
			}
			seen[id] = struct{}{}
		})
		if got > 0 {
			idle = 0
			continue
		}
		if idle++; len(seen) >= want || done && idle >= countIdle {
			break
		}
	}
	v.Unique = len(seen)
	v.Missing = max(0, want-v.Unique)
	v.OK = v.Unique == want && v.Duplicates == 0
	return v, nil
}
