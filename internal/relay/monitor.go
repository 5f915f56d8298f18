package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/gaps"
	"github.com/cdc-relay/cdc-relay/internal/metrics"
	"github.com/cdc-relay/cdc-relay/internal/replication"
)

// monitor runs the gap checks (slot, WAL status, publication) every interval,
// writes heartbeats, and refreshes gauges derived from the stream, until ctx
// is done.
type monitor struct {
	pool      *pgxpool.Pool
	writer    *pgxpool.Pool // the primary's pool when pool reaches a standby
	every     time.Duration
	heartbeat time.Duration // 0: no heartbeat
	counts    func(context.Context) (map[string]int64, error)
	// replayTotals reads the replay history's totals (Config.ReplayTotals).
	replayTotals func(context.Context) ([]ReplayTotal, error)
	retention    func(context.Context) (int64, error)
	gaps         *gaps.Checker
	fatal        chan<- error // gets a gap check's fatal error; the relay stops
	ticks        int
	h            *handler
	log          zerolog.Logger
	m            *metrics.Metrics

	hbFailing bool
}

func (mo *monitor) run(ctx context.Context) {
	t := time.NewTicker(mo.every)
	defer t.Stop()
	var hb <-chan time.Time
	if mo.heartbeat > 0 {
		ht := time.NewTicker(mo.heartbeat)
		defer ht.Stop()
		hb = ht.C
	}
	mo.checkGaps(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			mo.checkGaps(ctx)
			mo.lag()
			if mo.retention != nil && mo.ticks%60 == 0 {
				if n, err := mo.retention(ctx); err != nil {
					mo.log.Warn().Err(err).Msg("dead-letter retention failed")
				} else if n > 0 {
					mo.log.Info().Int64("deleted", n).Msg("dead-letter retention: deleted old letters")
				}
			}
			mo.ticks++
			mo.deadLetters(ctx)
			mo.replays(ctx)
		case <-hb:
			mo.beat(ctx)
		}
	}
}

// deadLetters reads the dead letters by status into their gauges.
func (mo *monitor) deadLetters(ctx context.Context) {
	if mo.counts == nil {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	counts, err := mo.counts(qctx)
	if err != nil {
		return // Postgres unreachable: the stream reports that
	}
	var backlog int64
	for status, n := range counts {
		mo.m.DeadLettersByStatus.WithLabelValues(status).Set(float64(n))
		if status != "completed" {
			backlog += n
		}
	}
	mo.m.DeadLetterBacklog.Set(float64(backlog))
}

// ReplayTotal is how many events the replays of one kind (dlq, outbox) in the
// replay history ended with one result (published, skipped, failed).
type ReplayTotal struct {
	Kind, Result string
	Events       int64
}

// replays reads the replay history's totals into their gauge.
func (mo *monitor) replays(ctx context.Context) {
	if mo.replayTotals == nil {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	totals, err := mo.replayTotals(qctx)
	if err != nil {
		return // Postgres unreachable: the stream reports that
	}
	for _, t := range totals {
		mo.m.ReplayHistoryEvents.WithLabelValues(t.Kind, t.Result).Set(float64(t.Events))
	}
}

// checkGaps runs the gap checks; a fatal one stops the relay.
func (mo *monitor) checkGaps(ctx context.Context) {
	if err := mo.gaps.Watch(ctx, mo.pool); err != nil {
		select {
		case mo.fatal <- err:
		default:
		}
	}
}

// lag sets replication_lag_seconds: 0 with nothing in flight, else how old
// the newest acknowledged commit is (how far behind Kafka is).
func (mo *monitor) lag() {
	_, events := mo.h.tracker.InFlight()
	if events == 0 {
		mo.m.LagSeconds.Set(0)
		return
	}
	if last := mo.h.lastAckCommit.Load(); last > 0 {
		mo.m.LagSeconds.Set(time.Since(time.Unix(0, last)).Seconds())
	}
}

// beat writes a logical decoding message (WAL in this database, no table
// touched), so keepalives move an idle database's slot forward.
func (mo *monitor) beat(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := replication.EmitHeartbeat(qctx, mo.writer); err != nil {
		mo.m.Heartbeats.WithLabelValues("error").Inc()
		if !mo.hbFailing {
			mo.hbFailing = true
			mo.log.Warn().Err(err).Msg("heartbeat failed (pg_logical_emit_message); the slot may not advance on an idle database")
		}
		return
	}
	mo.m.Heartbeats.WithLabelValues("ok").Inc()
	if mo.hbFailing {
		mo.hbFailing = false
		mo.log.Info().Msg("heartbeat works again")
	}
}
