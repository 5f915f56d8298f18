// Package pgload writes the benchmark's outbox rows: the schema, a backlog of
// committed transactions written as fast as Postgres takes them, and a steady
// load at a target rate.
package pgload

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// namePattern restricts names this package puts into SQL text.
var namePattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ApplyMigrations runs the given files of dir, in order, on url.
func ApplyMigrations(ctx context.Context, url, dir string, files ...string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect to apply migrations: %w", err)
	}
	defer conn.Close(context.Background())
	for _, f := range files {
		sql, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return fmt.Errorf("read migration: %w", err)
		}
		if _, err := conn.Exec(ctx, string(sql)); err != nil {
			return fmt.Errorf("apply migration %s: %w", f, err)
		}
	}
	return nil
}

// CreatePublicationAndSlots creates the publication on the outbox table (inserts
// only) and then all slots in one statement, so they start at the same WAL
// position.
func CreatePublicationAndSlots(ctx context.Context, url, publication string, slots ...string) error {
	if !namePattern.MatchString(publication) {
		return fmt.Errorf("create publication: invalid name %q", publication)
	}
	sels := make([]string, 0, len(slots))
	for _, s := range slots {
		if !namePattern.MatchString(s) {
			return fmt.Errorf("create slot: invalid name %q", s)
		}
		sels = append(sels, fmt.Sprintf("pg_create_logical_replication_slot('%s', 'pgoutput')", s))
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect to create slots: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE public.outbox_events WITH (publish = 'insert')", publication)); err != nil {
		return fmt.Errorf("create publication %s: %w", publication, err)
	}
	if _, err := conn.Exec(ctx, "SELECT "+strings.Join(sels, ", ")); err != nil {
		return fmt.Errorf("create slots %v: %w", slots, err)
	}
	return nil
}

// Backlog describes rows written ahead of a drain.
type Backlog struct {
	Events     int
	Aggregates int // aggregate ids agg-0 .. agg-(Aggregates-1), round robin
	TxnSize    int // rows per committed transaction
	Payload    int // approximate size of the JSON payload in bytes
	// AggregateType names the rows' aggregate_type (and so their topic).
	AggregateType string
	// Types, when more than 1, spreads the rows over that many aggregate
	// types, AggregateType followed by 0 … Types-1: aggregate a's rows have
	// type a mod Types, so each aggregate stays in one topic.
	Types int
}

// padFor returns the pad length giving a payload of about size bytes: the rest
// of {"agg": 1234, "pad": "", "seq": 12} takes about 40.
func padFor(size int) int { return max(0, size-40) }

// LoadBacklog commits b.Events rows, b.TxnSize per transaction, in event order.
// Row g (from 0) has aggregate agg-(g mod Aggregates) and payload
// {"agg": g mod Aggregates, "seq": g div Aggregates, "pad": "xx…"}, so each
// aggregate's seq counts up in commit order; its id is derived from g, so two
// loads write the same events. With b.Types > 1, row g's aggregate_type is
// AggregateType followed by (g mod Aggregates) mod Types. Rows are written by a server-side loop that
// commits every transaction; progress, if not nil, is called after every chunk
// with the number of rows committed so far.
func LoadBacklog(ctx context.Context, url string, b Backlog, progress func(done int)) error {
	if !namePattern.MatchString(b.AggregateType) {
		return fmt.Errorf("load backlog: invalid aggregate type %q", b.AggregateType)
	}
	if b.Events <= 0 || b.Aggregates <= 0 || b.TxnSize <= 0 {
		return fmt.Errorf("load backlog: events, aggregates and txn size must be positive")
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect to load backlog: %w", err)
	}
	defer conn.Close(context.Background())
	aggType := fmt.Sprintf("'%s'", b.AggregateType)
	if b.Types > 1 {
		aggType = fmt.Sprintf("'%s' || ((g %% %d) %% %d)", b.AggregateType, b.Aggregates, b.Types)
	}
	txns := (b.Events + b.TxnSize - 1) / b.TxnSize
	chunk := max(1, 50000/b.TxnSize) // transactions per round trip
	for t0 := 0; t0 < txns; t0 += chunk {
		t1 := min(t0+chunk, txns)
		sql := fmt.Sprintf(`DO $$
DECLARE k bigint;
BEGIN
  FOR k IN %[1]d..%[2]d LOOP
    INSERT INTO public.outbox_events (id, aggregate_type, aggregate_id, event_type, payload)
    SELECT md5('bench-' || g)::uuid, %[3]s, 'agg-' || (g %% %[4]d), 'BacklogEvent',
           jsonb_build_object('agg', g %% %[4]d, 'seq', g / %[4]d, 'pad', repeat('x', %[5]d))
      FROM generate_series(k * %[6]d, least((k + 1) * %[6]d, %[7]d) - 1) AS g;
    COMMIT;
  END LOOP;
END $$`, t0, t1-1, aggType, b.Aggregates, padFor(b.Payload), b.TxnSize, b.Events)
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("insert backlog transactions %d..%d: %w", t0, t1-1, err)
		}
		if progress != nil {
			progress(min(t1*b.TxnSize, b.Events))
		}
	}
	return nil
}

// Steady describes a load at a constant offered rate.
type Steady struct {
	Rate     int // events per second
	Duration time.Duration
	// TxnSize is events per transaction; 0 means max(1, Rate/1000), keeping
	// about 1,000 transactions per second.
	TxnSize       int
	Conns         int // connections committing in parallel; default 4
	AggregateType string
	Aggregates    int
	Payload       int
}

// SteadyResult is what a steady load achieved.
type SteadyResult struct {
	Committed int           // events committed
	Txns      int           // transactions committed
	Elapsed   time.Duration // the duration, or until the last commit if later
	TxnSize   int
}

// Rate returns committed events per second.
func (r SteadyResult) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Committed) / r.Elapsed.Seconds()
}

const steadyInsert = `INSERT INTO public.outbox_events (aggregate_type, aggregate_id, event_type, payload)
SELECT $1::text, 'agg-' || (($2::bigint + g) % $3::int), 'LoadEvent',
       jsonb_build_object('agg', ($2::bigint + g) % $3::int, 'seq', $2::bigint + g, 'pad', repeat('x', $4::int))
  FROM generate_series(0, $5::int - 1) AS g`

// Plan returns the events per transaction, the number of transactions and
// the interval between their scheduled commits; RunSteady commits
// txnSize*txns events when nothing fails.
func (s Steady) Plan() (txnSize, txns int, interval time.Duration) {
	txnSize = s.TxnSize
	if txnSize <= 0 {
		txnSize = max(1, s.Rate/1000)
	}
	if s.Rate <= 0 {
		return txnSize, 0, 0
	}
	interval = time.Duration(float64(time.Second) * float64(txnSize) / float64(s.Rate))
	return txnSize, int(s.Duration / interval), interval
}

// RunSteady commits transactions of s.TxnSize events on a fixed schedule that
// offers s.Rate events per second for s.Duration. It is open loop: a commit
// that runs late does not delay the schedule, later ones catch up, up to a
// bounded queue. Each transaction is one autocommitted INSERT.
func RunSteady(ctx context.Context, url string, s Steady) (SteadyResult, error) {
	if s.Conns <= 0 {
		s.Conns = 4
	}
	if s.Rate <= 0 || s.Duration <= 0 || s.Aggregates <= 0 {
		return SteadyResult{}, fmt.Errorf("steady load: rate, duration and aggregates must be positive")
	}
	txnSize, total, interval := s.Plan()
	s.TxnSize = txnSize
	res := SteadyResult{TxnSize: txnSize}
	conns := make([]*pgx.Conn, 0, s.Conns)
	defer func() {
		for _, c := range conns {
			c.Close(context.Background())
		}
	}()
	for range s.Conns {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			return res, fmt.Errorf("connect load generator: %w", err)
		}
		conns = append(conns, c)
	}
	jobs := make(chan int64, 4096)
	var committed, txns atomic.Int64
	var last atomic.Int64 // unix nanos of the last commit
	var firstErr error
	var errOnce sync.Once
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			for first := range jobs {
				if _, err := c.Exec(lctx, steadyInsert, s.AggregateType, first, s.Aggregates, padFor(s.Payload), s.TxnSize); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("commit load transaction: %w", err); cancel() })
					return
				}
				committed.Add(int64(s.TxnSize))
				txns.Add(1)
				last.Store(time.Now().UnixNano())
			}
		})
	}
	start := time.Now()
schedule:
	for k := range total {
		if d := time.Until(start.Add(time.Duration(k) * interval)); d > 0 {
			select {
			case <-lctx.Done():
				break schedule
			case <-time.After(d):
			}
		}
		select {
		case <-lctx.Done():
			break schedule
		case jobs <- int64(k) * int64(s.TxnSize):
		}
	}
	close(jobs)
	wg.Wait()
	res.Committed, res.Txns = int(committed.Load()), int(txns.Load())
	// On schedule, the last commit lands just before start+Duration; late
	// commits stretch the run and lower the achieved rate.
	res.Elapsed = s.Duration
	if l := last.Load(); l > 0 {
		res.Elapsed = max(res.Elapsed, time.Unix(0, l).Sub(start))
	}
	if firstErr != nil {
		return res, firstErr
	}
	return res, ctx.Err()
}
