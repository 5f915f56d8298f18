package chaos

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// Headers of republished records (package replay's HeaderReplay,
// HeaderSnapshot, HeaderBackfill; not imported: it would bring the relay's
// Kafka client into this module).
const (
	headerReplay   = "cdc_relay_replay"
	headerSnapshot = "cdc_relay_snapshot"
	headerBackfill = "cdc_relay_backfill"
)

// replayTimeout bounds one cdc-relay replay of a schedule.
const replayTimeout = time.Minute

// replayRun is one cdc-relay replay a schedule ran beside the stream: what
// it printed and the rows its window held.
type replayRun struct {
	Step int
	ID   string // its id in the replay history, the value of its messages' cdc_relay_replay header
	// Selected, Published, Failed are the counts it printed.
	Selected, Published, Failed int
	// Window is the rows of outbox_events whose created_at is in its
	// --since/--until window, read once it ended (every transaction that
	// began before --until had ended before it started).
	Window []string
}

// replayLine is the line cdc-relay replay prints with its counts.
var replayLine = regexp.MustCompile(`replay (\d+) \(outbox, by [^)]*\): selected (\d+), published (\d+), skipped (\d+), failed (\d+)`)

// replayBeside writes a bulk burst into outbox_events, then replays a window
// of the table around it with cdc-relay replay while the relay streams and
// the writers write, and keeps what the replay printed and the window's
// rows for the check (checkReplays).
func (r *schedRun) replayBeside(ctx context.Context, step int) error {
	since, err := r.serverClock(ctx)
	if err != nil {
		return err
	}
	if err := r.bulkBurst(ctx, "r"+strconv.Itoa(step), step); err != nil {
		return err
	}
	until, err := r.serverClock(ctx)
	if err != nil {
		return err
	}
	// The window is whole once every transaction that began before until
	// (created_at is the transaction's start) has ended.
	if err := r.waitTransactionsBefore(ctx, until); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, replayTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(rctx, r.opts.RelayBin, "replay",
		"--pg-url", r.url,
		"--kafka-brokers", strings.Join(r.kafka.brokers(), ","),
		"--topic", r.topic,
		"--table", "public."+tableMain,
		"--since", since.UTC().Format(time.RFC3339Nano),
		"--until", until.UTC().Format(time.RFC3339Nano),
		"--rate", "0") // unlimited: its default, 50 a second, takes ~12 s a window
	cmd.Stdout, cmd.Stderr = &out, &out
	began := time.Now()
	runErr := cmd.Run()
	m := replayLine.FindStringSubmatch(out.String())
	if m == nil {
		return fmt.Errorf("cdc-relay replay printed no counts (%v): %s", runErr, lastLines(out.String(), 5))
	}
	rr := replayRun{Step: step, ID: m[1]}
	rr.Selected, _ = strconv.Atoi(m[2])
	rr.Published, _ = strconv.Atoi(m[3])
	rr.Failed, _ = strconv.Atoi(m[5])
	if runErr != nil {
		return fmt.Errorf("cdc-relay replay %s: %w: %s", rr.ID, runErr, lastLines(out.String(), 5))
	}
	if rr.Window, err = r.windowRows(ctx, since, until); err != nil {
		return err
	}
	r.replays = append(r.replays, rr)
	r.note("step %d replay %s: window %s..%s, selected %d, published %d, failed %d, in %v", step, rr.ID,
		since.UTC().Format("15:04:05.000000"), until.UTC().Format("15:04:05.000000"), rr.Selected, rr.Published, rr.Failed, time.Since(began).Round(10*time.Millisecond))
	return nil
}

// serverClock reads the database server's clock (created_at's).
func (r *schedRun) serverClock(ctx context.Context) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	var t time.Time
	if err := queryRow(ctx, r.url, "SELECT clock_timestamp()", &t); err != nil {
		return t, fmt.Errorf("read the server's clock: %w", err)
	}
	return t, nil
}

// waitTransactionsBefore waits until no client transaction of the
// schedule's database that began before t is open.
func (r *schedRun) waitTransactionsBefore(ctx context.Context, t time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var open int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND backend_type = 'client backend' AND pid <> pg_backend_pid() AND xact_start < $1`, t).Scan(&open)
		if err != nil {
			return fmt.Errorf("wait for the transactions begun before %v: %w", t, err)
		}
		if open == 0 {
			return nil
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("%d transactions begun before %v still open: %w", open, t, err)
		}
	}
}

// windowRows returns the ids of outbox_events' rows created in [since, until).
func (r *schedRun) windowRows(ctx context.Context, since, until time.Time) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT id::text FROM public.`+tableMain+` WHERE created_at >= $1 AND created_at < $2`, since, until)
	if err != nil {
		return nil, fmt.Errorf("read the replay's window: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the replay's window: %w", err)
	}
	return ids, nil
}

// splitReplayed takes the records the schedule's replays published (their
// cdc_relay_replay header names one of them) out of records: the stream's
// ledger does not count them.
func splitReplayed(records []sandbox.Record, replays []replayRun) (stream []sandbox.Record, replayed map[string][]sandbox.Record) {
	replayed = map[string][]sandbox.Record{}
	for _, rr := range replays {
		replayed[rr.ID] = nil
	}
	for _, rec := range records {
		if id, ok := rec.Headers[headerReplay]; ok {
			if _, ours := replayed[id]; ours && rec.Headers[headerSnapshot] == "" && rec.Headers[headerBackfill] == "" {
				replayed[id] = append(replayed[id], rec)
				continue
			}
		}
		stream = append(stream, rec)
	}
	return stream, replayed
}

// checkReplays checks each replay's records: it published exactly the rows
// of its window, once each (missing: a row of the window not among them;
// repeated: a row twice within the replay; unselected: a record of no row of
// the window), its printed counts equal what reached Kafka, and each key's
// rows come in commit order. It adds the counts and samples to v.
func checkReplays(v *Verdict, committed map[string]ledgerEvent, replays []replayRun, replayed map[string][]sandbox.Record) {
	v.Replays = len(replays)
	for _, rr := range replays {
		recs := slices.Clone(replayed[rr.ID])
		v.Replayed += len(recs)
		slices.SortStableFunc(recs, func(a, b sandbox.Record) int {
			return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
		})
		window := map[string]bool{}
		for _, id := range rr.Window {
			window[id] = true
		}
		what := fmt.Sprintf("replay %s (step %d)", rr.ID, rr.Step)
		if rr.Selected != len(rr.Window) || rr.Published != len(recs) || rr.Failed != 0 {
			v.ReplayCounts++
			v.sample("replay counts", "%s printed selected %d, published %d, failed %d; its window holds %d rows and %d of its records are in Kafka",
				what, rr.Selected, rr.Published, rr.Failed, len(rr.Window), len(recs))
		}
		seen := map[string]string{}
		lastSeq := map[string]int{}
		for _, rec := range recs {
			id, key := rec.Headers["id"], string(rec.Key)
			at := fmt.Sprintf("%d@%d", rec.Partition, rec.Offset)
			if first, ok := seen[id]; ok {
				v.ReplayRepeated++
				v.sample("replay repeated", "%s: event %s at %s again at %s", what, id, first, at)
				continue
			}
			seen[id] = at
			ev, ok := committed[id]
			if !window[id] || !ok {
				v.ReplayUnselected++
				v.sample("replay unselected", "%s: record at %s with id %q, key %q is no row of its window", what, at, id, key)
				continue
			}
			if agg, seq, ok := aggSeqOf(rec.Value); key != ev.Key || !ok || agg != ev.Key || seq != ev.Seq {
				v.Mismatched++
				v.sample("mismatch", "%s: event %s at %s has key %q value %.80q, want key %q seq %d", what, id, at, key, rec.Value, ev.Key, ev.Seq)
			}
			if last, ok := lastSeq[key]; ok && ev.Seq <= last {
				v.ReplayOrder++
				v.sample("replay order", "%s: key %q: seq %d (event %s) at %s comes after seq %d", what, key, ev.Seq, id, at, last)
			}
			lastSeq[key] = max(lastSeq[key], ev.Seq)
		}
		for _, id := range rr.Window {
			if _, ok := seen[id]; !ok {
				v.ReplayMissing++
				ev := committed[id]
				v.sample("replay missing", "%s: row %s (key %q seq %d) of its window never published", what, id, ev.Key, ev.Seq)
			}
		}
	}
}
