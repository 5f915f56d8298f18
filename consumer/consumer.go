// Package consumer is the consumer half of the outbox: it turns the relay's
// at-least-once delivery into a business effect that happens once.
//
// cdc-relay guarantees that every committed outbox event reaches Kafka, with
// its event id in the "id" header; it cannot guarantee that a consumer acts
// on it once (a crash between the consumer's commit and its offset commit, a
// rebalance, a replay, a duplicate in the topic all deliver it again). Run
// closes that gap with an idempotent consumer. For each record, in
// partition order:
//
//  1. it begins a transaction in the consumer's own database;
//  2. it claims (Config.Name, id) in processed_messages with
//     INSERT … ON CONFLICT DO NOTHING; a claim that exists already means the
//     message took effect before: it is skipped and counted, never an error;
//  3. it calls the Handler with the transaction, so the business change and
//     the claim commit together or not at all;
//  4. it commits, and only then commits the record's Kafka offset.
//
// A crash anywhere in between redelivers the record, and the claim turns the
// redelivery into a skip. Transient handler failures are retried with
// exponential backoff and full jitter (RetryPolicy), the transaction rolled
// back each time; a later record of the partition (hence of the key) waits.
// Permanent failures, and transient ones that used up the budget, are stored
// in the dead-letter table with the claim, in one transaction committed
// before the offset: the message is isolated, not lost, and not retried on
// redelivery.
//
// Dead letters follow the state model the relay's follow too (package
// internal/letterstate): pending → processing → completed, retry_wait after
// a transient failure, dead once the budget is spent. Run stores a permanent
// failure as dead, and a transient one as pending when Config.AutoReprocess
// is on (dead otherwise). Reprocessing (Reprocess by an operator after the
// fix, ReprocessDue and AutoReprocess automatically) claims a letter
// atomically with a lease (claimed_by, claimed_until): two reprocessors
// never run one letter, and the letters of one that died are taken over
// once its lease expired. Success completes the letter in the handler's
// transaction; a failure moves it to retry_wait with a full-jitter backoff,
// or to dead when permanent or past AutoReprocess.Budget. Every change is
// recorded, with who made it and why, in <table>_transitions (History).
//
// The tables come from MigrationFile (or Migrate); Prune trims old claims.
package consumer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/cdc-relay/cdc-relay/internal/backoff"
)

// Handler applies one message's business effect inside tx, the transaction
// that also holds the message's claim. It runs only for a message not
// processed before. Returning nil commits the effect and the claim together;
// returning an error rolls both back, and the consumer retries the message or
// dead-letters it (see IsPermanent; mark errors with Permanent, Transient and
// WithCode). The handler must not commit or roll back tx itself, and must do
// everything with an effect outside the database idempotently (pass msg.ID as
// the idempotency key of an external API), because a transient failure calls
// it again.
//
// ctx is cancelled when Run has to stop before the handler finished (the
// Config.ShutdownTimeout after Run's context is done).
type Handler func(ctx context.Context, tx pgx.Tx, msg Message) error

// Defaults of Config.
const (
	DefaultShutdownTimeout = 10 * time.Second
	// commitTimeout bounds one Kafka offset commit; kafka-go's commit waits
	// for the group's generation, so it may take a rebalance.
	commitTimeout = 30 * time.Second
	// statsInterval is how often Run reads the reader's statistics.
	statsInterval = 500 * time.Millisecond
	// rollbackTimeout bounds a rollback after a failure.
	rollbackTimeout = 5 * time.Second
	// fetchMaxWait is how long the broker may hold a fetch while there is
	// nothing new. kafka-go does not interrupt a fetch in flight when the
	// reader closes or the generation ends, so this also bounds how long a
	// stop or a rebalance waits for it (kafka-go's default is 10 s, long
	// enough to let the session expire before the member leaves).
	fetchMaxWait = 500 * time.Millisecond
)

// Config configures Run (and Reprocess and ReprocessDue, which need only
// Name, Pool, DeadLetterTable, AutoReprocess and Logger).
type Config struct {
	// Brokers are the Kafka seed brokers, host:port.
	Brokers []string
	// GroupID is the Kafka consumer group. Processes with the same GroupID
	// share the topics' partitions.
	GroupID string
	// Topics are read by the group.
	Topics []string
	// Name is the consumer name, the first half of every claim in
	// processed_messages and the consumer_name of its dead letters. Choose it
	// once per business effect and never change it: a new name has no claims,
	// so everything Kafka still holds would take effect again. Two effects of
	// one message (points and an email) need two names.
	Name string
	// Pool is the consumer's database: the handler's transactions, the
	// claims and the dead letters. The caller owns it (Run does not close it).
	Pool *pgxpool.Pool
	// DeadLetterTable is where failed messages go, "table" or "schema.table";
	// "" means DefaultDeadLetterTable.
	DeadLetterTable string
	// Retry bounds the retries of transient failures; zero fields take
	// DefaultRetryPolicy's.
	Retry RetryPolicy
	// AutoReprocess, when its Interval is positive, reprocesses dead letters
	// of transient failures in the background; its other fields bound every
	// reprocessing (Reprocess, ReprocessDue) too.
	AutoReprocess AutoReprocess
	// Registerer receives the cdc_relay_consumer_* metrics; nil registers
	// none.
	Registerer prometheus.Registerer
	// Logger receives the consumer's log, and kafka-go's (its errors at warn,
	// its chatter at trace). The zero Logger logs nothing.
	Logger zerolog.Logger

	// TLS, when set, makes the Kafka connections use TLS with this config.
	TLS *tls.Config
	// SASL, when set, logs in to Kafka with this mechanism (kafka-go's
	// sasl/plain or sasl/scram).
	SASL sasl.Mechanism

	// FromLatest makes a group without committed offsets start at the end
	// of each partition instead of the beginning.
	FromLatest bool
	// SessionTimeout, HeartbeatInterval, RebalanceTimeout and
	// JoinGroupBackoff tune the group membership (kafka-go's ReaderConfig
	// fields of the same names; 0 keeps kafka-go's defaults: 30 s, 3 s, 30 s,
	// 5 s). A consumer that dies without leaving holds its partitions until
	// SessionTimeout passes.
	SessionTimeout    time.Duration
	HeartbeatInterval time.Duration
	RebalanceTimeout  time.Duration
	JoinGroupBackoff  time.Duration
	// ShutdownTimeout is how long Run lets the message in hand finish after
	// its context is done before cancelling the handler's context; 0 means
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
}

// Validate checks the configuration, naming the field to fix.
func (c Config) Validate() error {
	var problems []string
	if len(c.Brokers) == 0 {
		problems = append(problems, "Brokers is empty")
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			problems = append(problems, "Brokers has an empty address")
			break
		}
	}
	if c.GroupID == "" {
		problems = append(problems, "GroupID is empty")
	}
	if len(c.Topics) == 0 {
		problems = append(problems, "Topics is empty")
	}
	for _, t := range c.Topics {
		if t == "" {
			problems = append(problems, "Topics has an empty name")
			break
		}
	}
	problems = append(problems, c.validateStore()...)
	if err := c.Retry.withDefaults().validate(); err != nil {
		problems = append(problems, err.Error())
	}
	if err := c.AutoReprocess.validate(); err != nil {
		problems = append(problems, err.Error())
	}
	if c.SessionTimeout < 0 || c.HeartbeatInterval < 0 || c.RebalanceTimeout < 0 || c.JoinGroupBackoff < 0 || c.ShutdownTimeout < 0 {
		problems = append(problems, "SessionTimeout, HeartbeatInterval, RebalanceTimeout, JoinGroupBackoff and ShutdownTimeout must not be negative")
	}
	if c.SessionTimeout > 0 && c.HeartbeatInterval > 0 && c.HeartbeatInterval >= c.SessionTimeout {
		problems = append(problems, "HeartbeatInterval must be shorter than SessionTimeout")
	}
	if len(problems) > 0 {
		return fmt.Errorf("consumer config: %s", strings.Join(problems, "; "))
	}
	return nil
}

// validateStore checks the fields Reprocess needs too.
func (c Config) validateStore() []string {
	var problems []string
	if c.Name == "" {
		problems = append(problems, "Name is empty (the consumer name keys processed_messages; choose it once)")
	}
	if c.Pool == nil {
		problems = append(problems, "Pool is nil")
	}
	if _, err := newTables(c.DeadLetterTable); err != nil {
		problems = append(problems, err.Error())
	}
	return problems
}

// Run consumes cfg.Topics as a member of cfg.GroupID until ctx is done, so
// that the handler's changes commit at most once per message id for
// cfg.Name (see the package documentation for the loop and its guarantees).
//
// Messages are processed one at a time, in order per partition: a message
// being retried holds back every later message of its partition, and, since
// one Run reads all its partitions through one reader, the others too. For
// more throughput run more processes in the group (up to the partition
// count).
//
// Failures of Kafka and of the consumer's database are retried without end
// (logged when the state changes); Run returns an error only for a bad
// configuration, metrics it cannot register, or missing tables at start. When ctx is done it stops
// fetching, lets the message in hand finish (up to cfg.ShutdownTimeout),
// commits its offset, leaves the group and returns nil; a message cut short
// is rolled back and delivered again later.
func Run(ctx context.Context, cfg Config, handler Handler) error {
	if handler == nil {
		return errors.New("consumer: handler is nil")
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	t, _ := newTables(cfg.DeadLetterTable)
	log := cfg.Logger.With().Str("component", "consumer").Str("consumer", cfg.Name).Str("group", cfg.GroupID).Logger()
	if err := waitTables(ctx, cfg.Pool, t, cfg.Retry.withDefaults(), log); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("start consumer %s: %w", cfg.Name, err)
	}
	m, err := newMetrics(cfg.Registerer, cfg.Name)
	if err != nil {
		return err
	}
	r := &runner{
		cfg:     cfg,
		handler: handler,
		tables:  t,
		retry:   cfg.Retry.withDefaults(),
		m:       m,
		log:     log,
		reader:  kafka.NewReader(readerConfig(cfg)),
	}
	log.Info().Strs("topics", cfg.Topics).Msg("consumer starting")
	return r.run(ctx)
}

// waitTables checks the tables, waiting while the database is unreachable.
func waitTables(ctx context.Context, pool *pgxpool.Pool, t tables, retry RetryPolicy, log zerolog.Logger) error {
	for n := 0; ; n++ {
		err := t.check(ctx, pool)
		var se *storeError
		if err == nil || !errors.As(err, &se) || !isConnError(se.err) || ctx.Err() != nil {
			return err
		}
		if n == 0 {
			log.Error().Err(err).Msg("consumer database unavailable at start; waiting for it")
		}
		if backoff.SleepFor(ctx, retry.jitter().Delay(n)) != nil {
			return ctx.Err()
		}
	}
}

// readerConfig is the kafka-go consumer-group reader of cfg: synchronous,
// explicit offset commits (CommitMessages returns once the broker has the
// offset), read-committed isolation, partition changes watched.
func readerConfig(cfg Config) kafka.ReaderConfig {
	start := kafka.FirstOffset
	if cfg.FromLatest {
		start = kafka.LastOffset
	}
	kl := cfg.Logger.With().Str("component", "kafka-go").Str("consumer", cfg.Name).Str("group", cfg.GroupID).Logger()
	rc := kafka.ReaderConfig{
		Brokers:               cfg.Brokers,
		GroupID:               cfg.GroupID,
		GroupTopics:           cfg.Topics,
		Dialer:                &kafka.Dialer{Timeout: 10 * time.Second, DualStack: true, TLS: cfg.TLS, SASLMechanism: cfg.SASL},
		CommitInterval:        0, // synchronous commits, one per message, after the database commit
		StartOffset:           start,
		IsolationLevel:        kafka.ReadCommitted,
		WatchPartitionChanges: true,
		MaxWait:               fetchMaxWait,
		SessionTimeout:        cfg.SessionTimeout,
		HeartbeatInterval:     cfg.HeartbeatInterval,
		RebalanceTimeout:      cfg.RebalanceTimeout,
		JoinGroupBackoff:      cfg.JoinGroupBackoff,
		ErrorLogger: kafka.LoggerFunc(func(msg string, args ...any) {
			kl.Warn().Msgf(strings.TrimSpace(msg), args...)
		}),
	}
	if kl.GetLevel() <= zerolog.TraceLevel {
		rc.Logger = kafka.LoggerFunc(func(msg string, args ...any) {
			kl.Trace().Msgf(strings.TrimSpace(msg), args...)
		})
	}
	return rc
}

// errStopped reports that Run is stopping and the message in hand was left
// uncommitted (it is delivered again).
var errStopped = errors.New("consumer stopping")

// storeError is a failure to begin a transaction or to write a claim: the
// consumer's database, not the message, is at fault.
type storeError struct{ err error }

func (e *storeError) Error() string { return e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

// runner is one Run: the reader and the state of its loop. Its fields are
// used by the loop's goroutine only, but for reader, m and log.
type runner struct {
	cfg     Config
	handler Handler
	tables  tables
	retry   RetryPolicy
	m       *metrics
	log     zerolog.Logger
	reader  *kafka.Reader

	storeDown     bool // the consumer's database is failing (logged once)
	storeFailures int  // consecutive store failures, for the backoff
}

// run is Run's loop; it owns the reader and the goroutines it starts.
func (r *runner) run(ctx context.Context) error {
	grace := r.cfg.ShutdownTimeout
	if grace == 0 {
		grace = DefaultShutdownTimeout
	}
	// work is the context of the message in hand: it outlives ctx by grace.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			cancelWork()
		}
	}()
	go func() {
		defer wg.Done()
		r.watchStats(done)
	}()
	if r.cfg.AutoReprocess.Interval > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.autoReprocess(ctx)
		}()
	}

	fetchFailures := 0
	for ctx.Err() == nil {
		km, err := r.reader.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if fetchFailures == 0 {
				r.log.Warn().Err(err).Msg("fetching from Kafka failed; retrying")
			}
			_ = backoff.SleepFor(ctx, r.retry.jitter().Delay(fetchFailures))
			fetchFailures++
			continue
		}
		if fetchFailures > 0 {
			r.log.Info().Int("failures", fetchFailures).Msg("fetching from Kafka again")
			fetchFailures = 0
		}
		msg := fromKafka(km)
		if err := r.process(ctx, work, msg); err != nil {
			logMsg(r.log.Info(), msg).Msg("stopped before the message was done; it will be delivered again")
			break
		}
		r.m.setLag(km.Topic, km.Partition, km.HighWaterMark-km.Offset-1)
		r.commitOffset(work, km)
	}
	close(done)
	wg.Wait()
	if err := r.reader.Close(); err != nil {
		return fmt.Errorf("consumer %s: leave group and close the Kafka reader: %w", r.cfg.Name, err)
	}
	r.log.Info().Msg("consumer stopped")
	return nil
}

// watchStats reads the reader's statistics until done: each new group
// generation is counted and logged, and resets the lag gauges (partitions
// assigned elsewhere now must not keep reporting).
func (r *runner) watchStats(done <-chan struct{}) {
	t := time.NewTicker(statsInterval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		s := r.reader.Stats() // counters since the last call
		if s.Rebalances > 0 {
			r.m.rebalances.Add(float64(s.Rebalances))
			r.m.lag.Reset()
			r.log.Info().Int64("rebalances", s.Rebalances).Msg("joined a new consumer group generation")
		}
	}
}

// autoReprocess calls ReprocessDue every AutoReprocess.Interval until ctx
// is done, at once again while it finds a full batch. Its failures (the
// database, mostly) are logged once per streak and tried again at the next
// tick: the main loop waits for the database on its own.
func (r *runner) autoReprocess(ctx context.Context) {
	t := time.NewTicker(r.cfg.AutoReprocess.Interval)
	defer t.Stop()
	batch := r.cfg.AutoReprocess.withDefaults().BatchSize
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for ctx.Err() == nil {
			res, err := ReprocessDue(ctx, r.cfg, r.handler, "consumer "+r.cfg.Name)
			if err != nil {
				if !failing && ctx.Err() == nil {
					r.log.Warn().Err(err).Msg("automatic reprocessing of dead letters failed; retrying at the next interval")
				}
				failing = true
				break
			}
			failing = false
			for _, x := range res {
				if x.Outcome == Reprocessed || x.Outcome == ReprocessFailed {
					r.m.reprocessed.WithLabelValues(x.Status).Inc()
				}
			}
			if len(res) < batch {
				break
			}
		}
	}
}

// commitOffset commits km's offset after its transaction committed. A
// failure is logged and counted, not retried: the next commit covers it, and
// if none comes the message is delivered again and skipped as a duplicate.
func (r *runner) commitOffset(work context.Context, km kafka.Message) {
	ctx, cancel := context.WithTimeout(work, commitTimeout)
	defer cancel()
	if err := r.reader.CommitMessages(ctx, km); err != nil {
		r.m.commitErrors.Inc()
		r.log.Warn().Err(err).Str("topic", km.Topic).Int("partition", km.Partition).Int64("offset", km.Offset).
			Msg("committing the Kafka offset failed; the message may be delivered again and skipped as a duplicate")
	}
}

// process settles one message: processed, skipped as a duplicate, or
// dead-lettered. It returns errStopped, and only that, when Run is stopping
// and the message is left for a later delivery.
func (r *runner) process(ctx, work context.Context, msg Message) error {
	if msg.ID == "" {
		now := time.Now()
		return r.deadLetter(ctx, work, msg, StatusDead, CodeMissingID,
			`the record has no "id" header, so it cannot be deduplicated; the handler was not called`, 0, now, now)
	}
	var first time.Time        // of the first handler failure
	var excluded time.Duration // waiting for the store after the first failure
	for attempt := 1; ; {
		began := time.Now()
		dup, err := r.attempt(work, msg)
		if err == nil {
			r.storeUp()
			switch {
			case dup:
				r.m.duplicates.Inc()
				logMsg(r.log.Debug(), msg).Msg("skipped a duplicate: the message took effect before")
			case attempt > 1:
				r.m.processed.Inc()
				logMsg(r.log.Info(), msg).Int("attempts", attempt).Msg("message processed after retries")
			default:
				r.m.processed.Inc()
			}
			return nil
		}
		if work.Err() != nil {
			return errStopped // cut short by the shutdown: says nothing about the message
		}
		var se *storeError
		if errors.As(err, &se) {
			r.storeFailed(err)
			if backoff.SleepFor(ctx, r.retry.jitter().Delay(r.storeFailures-1)) != nil {
				return errStopped
			}
			if !first.IsZero() {
				excluded += time.Since(began)
			}
			continue
		}
		r.storeUp()
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		if IsPermanent(err) {
			return r.deadLetter(ctx, work, msg, StatusDead, errorCode(err, false), err.Error(), attempt-1, first, now)
		}
		delay, ok := r.retry.next(attempt, now.Sub(first)-excluded)
		if !ok {
			status := StatusDead // nothing would retry it
			if r.cfg.AutoReprocess.Interval > 0 {
				status = StatusPending
			}
			return r.deadLetter(ctx, work, msg, status, errorCode(err, true), err.Error(), attempt-1, first, now)
		}
		if ctx.Err() != nil {
			return errStopped // no retries while stopping
		}
		r.m.retries.Inc()
		ev := r.log.Debug()
		if attempt == 1 {
			ev = r.log.Warn()
		}
		logMsg(ev, msg).Err(err).Int("attempt", attempt).Dur("retry_in", delay).Msg("handler failed; retrying")
		if backoff.SleepFor(ctx, delay) != nil {
			return errStopped
		}
		attempt++
	}
}

// attempt runs one transaction for msg: begin, claim, handler, commit. dup
// reports that the claim existed (nothing was done). Errors of begin and
// claim are *storeError.
func (r *runner) attempt(ctx context.Context, msg Message) (dup bool, err error) {
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return false, &storeError{fmt.Errorf("begin transaction for %s: %w", msg, err)}
	}
	defer rollback(tx)
	isNew, err := r.tables.claim(ctx, tx, r.cfg.Name, msg.claimID())
	if err != nil {
		return false, &storeError{err}
	}
	if !isNew {
		return true, nil
	}
	start := time.Now()
	err = callHandler(ctx, r.handler, tx, msg)
	r.m.handlerTime.Observe(time.Since(start).Seconds())
	if err != nil {
		return false, fmt.Errorf("handle %s: %w", msg, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("commit the transaction of %s: %w", msg, err)
	}
	return false, nil
}

// callHandler runs h, turning a panic into an error.
func callHandler(ctx context.Context, h Handler, tx pgx.Tx, msg Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = WithCode(CodeHandlerPanic, fmt.Errorf("handler panicked: %v\n%s", p, debug.Stack()))
		}
	}()
	return h(ctx, tx, msg)
}

// deadLetter stores msg's dead letter, with status (StatusDead or
// StatusPending), together with its claim, waiting while the database is
// unavailable. When the claim exists already (another
// delivery of the message took effect meanwhile) nothing is stored and the
// message counts as a duplicate.
func (r *runner) deadLetter(ctx, work context.Context, msg Message, status, code, text string, retries int, first, last time.Time) error {
	l := letter{
		consumer: r.cfg.Name, msg: msg, code: code, text: text, retries: retries, first: first, last: last,
		correlationID: msg.CorrelationID(), schemaVersion: msg.SchemaVersion(), status: status,
	}
	for {
		dup, err := r.storeLetter(work, l)
		if err == nil {
			r.storeUp()
			if dup {
				r.m.duplicates.Inc()
				logMsg(r.log.Info(), msg).Msg("not dead-lettered: another delivery of the message took effect meanwhile")
				return nil
			}
			r.m.deadLetters.WithLabelValues(code).Inc()
			if status == StatusPending {
				logMsg(r.log.Warn(), msg).Str("code", code).Int("retries", retries).Str("error", text).
					Str("table", r.tables.dlName).Str("status", status).Msg("message dead-lettered; it is reprocessed automatically")
				return nil
			}
			logMsg(r.log.Error(), msg).Str("code", code).Int("retries", retries).Str("error", text).
				Str("table", r.tables.dlName).Str("status", status).Msg("message dead-lettered; fix the cause, then reprocess it")
			return nil
		}
		if work.Err() != nil {
			return errStopped
		}
		r.storeFailed(err)
		if backoff.SleepFor(work, r.retry.jitter().Delay(r.storeFailures-1)) != nil {
			return errStopped
		}
	}
}

// storeLetter writes l and its claim in one transaction.
func (r *runner) storeLetter(ctx context.Context, l letter) (dup bool, err error) {
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("begin transaction for the dead letter of %s: %w", l.msg, err)
	}
	defer rollback(tx)
	isNew, err := r.tables.claim(ctx, tx, l.consumer, l.msg.claimID())
	switch {
	case err != nil:
		return false, err
	case !isNew:
		return true, nil
	}
	if err := r.tables.addLetter(ctx, tx, l); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("commit the dead letter of %s: %w", l.msg, err)
	}
	return false, nil
}

// storeFailed records a failure of the consumer's database, logging the
// change to failing.
func (r *runner) storeFailed(err error) {
	r.storeFailures++
	if !r.storeDown {
		r.storeDown = true
		r.m.storeWaiting.Set(1)
		r.log.Error().Err(err).Msg("consumer database unavailable; waiting for it (messages are not dead-lettered meanwhile)")
	}
}

// storeUp records that the consumer's database works, logging the change.
func (r *runner) storeUp() {
	r.storeFailures = 0
	if r.storeDown {
		r.storeDown = false
		r.m.storeWaiting.Set(0)
		r.log.Info().Msg("consumer database available again")
	}
}

// logMsg adds msg's position and id to ev.
func logMsg(ev *zerolog.Event, msg Message) *zerolog.Event {
	return ev.Str("topic", msg.Topic).Int("partition", msg.Partition).Int64("offset", msg.Offset).Str("message_id", msg.ID)
}

// rollback rolls tx back, if it is still open; its error is of no use (the
// transaction is discarded either way, and a broken connection is not
// returned to the pool).
func rollback(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(ctx)
}
