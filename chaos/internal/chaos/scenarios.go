package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Relay metrics the scenarios read.
const (
	metricReconnects     = "cdc_relay_replication_reconnects_total"
	metricRetries        = "cdc_relay_produce_retries_total"
	metricInFlightBytes  = "cdc_relay_in_flight_bytes"
	metricBackpressured  = `cdc_relay_state{state="backpressured"}`
	walSenderTimeout     = 2 * time.Second
	walSenderTimeoutText = "2s"
)

// recoverTimeout bounds the wait for the relay to show it noticed a fault
// (a reconnect, a retry) once the fault is over.
const recoverTimeout = 15 * time.Second

// Scenarios returns every scenario, sized by opts (Kills, Episodes, Window;
// zero values take the defaults).
func Scenarios(opts Options) []Scenario {
	o := opts
	o.setDefaults()
	n := o.Episodes
	all := []Scenario{
		{
			Name:      "sigkill-loop",
			Fault:     fmt.Sprintf("SIGKILL the relay %d times, 100-600ms after each start, restarting it each time", o.Kills),
			MinFaults: o.Kills,
			inject:    injectKills,
		},
		{
			Name:             "sigkill-loop-at-least-once",
			Fault:            fmt.Sprintf("as sigkill-loop, with --delivery at-least-once: SIGKILL the relay %d times, 100-600ms after each start", o.Kills),
			MinFaults:        o.Kills,
			DuplicatesReason: "--delivery at-least-once: after each kill, events sent but not yet checkpointed are sent again",
			relayArgs:        []string{"--delivery", "at-least-once"},
			inject:           injectKills,
		},
		{
			Name:      "pg-restart-immediate",
			Fault:     fmt.Sprintf("restart Postgres with pg_ctl -m immediate (a crash) %d times mid-stream", n),
			MinFaults: n, localPG: true,
			inject: restartPostgres("immediate"),
		},
		{
			Name:      "pg-restart-fast",
			Fault:     fmt.Sprintf("restart Postgres with pg_ctl -m fast %d times mid-stream", n),
			MinFaults: n, localPG: true,
			inject: restartPostgres("fast"),
		},
		{
			Name:      "pg-net-reset-peer",
			Fault:     fmt.Sprintf("reset the relay's Postgres connections (toxiproxy reset_peer) %d times", n),
			MinFaults: n, pgProxy: true,
			inject: pgEpisodes("reset_peer", func(r *run) (func() error, time.Duration, error) {
				err := r.pgProxy.add(toxic{Name: "reset", Type: "reset_peer", Stream: "downstream", Attributes: map[string]any{"timeout": 0}})
				return func() error { return r.pgProxy.remove(context.Background(), "reset") }, 300 * time.Millisecond, err
			}),
		},
		{
			Name:      "pg-net-timeout",
			Fault:     fmt.Sprintf("black-hole the relay's Postgres connections, closed after 1s (toxiproxy timeout), %d times", n),
			MinFaults: n, pgProxy: true,
			inject: pgEpisodes("timeout", func(r *run) (func() error, time.Duration, error) {
				err := r.pgProxy.add(toxic{Name: "timeout", Type: "timeout", Stream: "downstream", Attributes: map[string]any{"timeout": 1000}})
				return func() error { return r.pgProxy.remove(context.Background(), "timeout") }, 1500 * time.Millisecond, err
			}),
		},
		{
			Name:      "pg-net-cut",
			Fault:     fmt.Sprintf("cut the relay's Postgres connections and refuse new ones for 0.5-1s, %d times", n),
			MinFaults: n, pgProxy: true,
			inject: pgEpisodes("cut", func(r *run) (func() error, time.Duration, error) {
				r.pgProxy.cut()
				return r.pgProxy.restore, r.between(500*time.Millisecond, time.Second), nil
			}),
		},
		{
			Name:      "pg-net-latency",
			Fault:     fmt.Sprintf("200ms ±100ms latency each way on the relay's Postgres connections for %v", o.Window),
			MinFaults: 1, pgProxy: true,
			inject: pgLatency,
		},
		{
			Name:      "pg-net-bandwidth",
			Fault:     fmt.Sprintf("throttle Postgres to the relay to 16 KB/s for %v", o.Window),
			MinFaults: 1, pgProxy: true,
			inject: pgBandwidth,
		},
		{
			Name: "wal-sender-timeout",
			Fault: fmt.Sprintf("stall every produce request for %v with wal_sender_timeout=%s and --max-in-flight-mib 1: the relay backpressures",
				stallTime(o), walSenderTimeoutText),
			MinFaults: 1, localKafka: true,
			relayArgs: []string{"--max-in-flight-mib", "1", "--status-interval", "1s"},
			prepare:   prepareWalSenderTimeout,
			inject:    injectProduceStall,
		},
		{
			Name:      "kafka-net-reset",
			Fault:     fmt.Sprintf("reset the relay's Kafka connections (toxiproxy reset_peer) %d times", n),
			MinFaults: n, kafka: kafkaProxied,
			inject: kafkaReset,
		},
		{
			Name:      "kafka-net-latency",
			Fault:     fmt.Sprintf("200ms ±50ms latency each way on the relay's Kafka connections for %v", o.Window),
			MinFaults: 1, kafka: kafkaProxied,
			inject: kafkaLatency,
		},
		{
			Name:      "kafka-not-leader",
			Fault:     fmt.Sprintf("answer 30%% of produce requests NOT_LEADER_OR_FOLLOWER for %v", o.Window),
			MinFaults: n, localKafka: true,
			inject: brokerErrors(kerr.NotLeaderForPartition, 0.3, nil),
		},
		{
			Name:      "kafka-request-timed-out",
			Fault:     fmt.Sprintf("answer 30%% of produce requests REQUEST_TIMED_OUT after appending them, for %v", o.Window),
			MinFaults: n, localKafka: true,
			inject: brokerErrors(kerr.RequestTimedOut, 0.3, nil),
		},
		{
			Name: "kafka-partial-batch",
			Fault: fmt.Sprintf("fail partitions 0 and 2 (NOT_ENOUGH_REPLICAS_AFTER_APPEND) of 40%% of the produce requests that also carry 1 or 3, for %v",
				o.Window),
			MinFaults: n, localKafka: true,
			inject: brokerErrors(kerr.NotEnoughReplicasAfterAppend, 0.4, []int32{0, 2}),
		},
		{
			Name:      "kafka-slow",
			Fault:     fmt.Sprintf("delay every other produce response by 100-700ms for %v", o.Window),
			MinFaults: n, localKafka: true,
			inject: kafkaSlow,
		},
		{
			Name:      "kafka-restart",
			Fault:     fmt.Sprintf("stop the broker for 0.5-1.5s and start it on its data, %d times", n),
			MinFaults: n, localKafka: true,
			inject: kafkaRestart,
		},
		{
			Name:      "kafka-leader-move",
			Fault:     fmt.Sprintf("move partition leaders between 3 brokers every 200-500ms for %v", o.Window),
			MinFaults: n, kafka: kafkaThreeBrokers,
			inject: kafkaLeaderMove,
		},
	}
	for i := range all {
		all[i].size = size{kills: o.Kills, episodes: o.Episodes, window: o.Window}
	}
	return all
}

// injectKills SIGKILLs the relay at random points and restarts it at once.
func injectKills(ctx context.Context, r *run) error {
	streaming := 0
	for i := 1; i <= r.opts.Kills; i++ {
		if err := sleep(ctx, r.between(100*time.Millisecond, 600*time.Millisecond)); err != nil {
			return err
		}
		if r.relay.Readyz(ctx) == http.StatusOK {
			streaming++
		}
		if !r.relay.Kill() {
			return fmt.Errorf("kill %d: the relay had exited by itself with code %d", i, r.relay.ExitCode())
		}
		r.faults++
		if err := r.relay.Start(); err != nil {
			return err
		}
	}
	r.note("%d of %d kills while streaming", streaming, r.opts.Kills)
	start := time.Now()
	if err := r.relay.WaitReady(ctx, readyTimeout); err != nil {
		return fmt.Errorf("after the last kill: %w", err)
	}
	r.note("ready %v after the last restart", time.Since(start).Round(10*time.Millisecond))
	return nil
}

// restartPostgres stops and starts the shared cluster with pg_ctl's mode.
func restartPostgres(mode string) func(context.Context, *run) error {
	return func(ctx context.Context, r *run) error {
		var stops, recovered []string
		for i := 1; i <= r.opts.Episodes; i++ {
			if err := sleep(ctx, r.between(r.opts.Window/4, r.opts.Window/2)); err != nil {
				return err
			}
			before := r.metric(ctx, metricReconnects)
			start := time.Now()
			stopErr := r.env.pg.Stop(mode)
			stops = append(stops, time.Since(start).Round(10*time.Millisecond).String())
			// Start even after a failed stop: later scenarios share the cluster.
			if err := errors.Join(stopErr, r.env.pg.Start()); err != nil {
				return err
			}
			start = time.Now()
			if !r.waitMetricAbove(ctx, metricReconnects, before, recoverTimeout) {
				r.note("restart %d: the relay did not reconnect within %v", i, recoverTimeout)
				continue
			}
			if err := r.relay.WaitReady(ctx, readyTimeout); err != nil {
				return fmt.Errorf("after restart %d: %w", i, err)
			}
			r.faults++
			recovered = append(recovered, time.Since(start).Round(10*time.Millisecond).String())
		}
		r.note("pg_ctl stop -m %s took %s; relay streaming again %s after each start", mode, strings.Join(stops, ", "), strings.Join(recovered, ", "))
		return nil
	}
}

// pgEpisodes repeats a Postgres network fault: apply returns how to undo it
// and how long to hold it. An episode counts once the relay re-established
// its replication connection after it.
func pgEpisodes(name string, apply func(r *run) (undo func() error, hold time.Duration, err error)) func(context.Context, *run) error {
	return func(ctx context.Context, r *run) error {
		var recovered []string
		for i := 1; i <= r.opts.Episodes; i++ {
			if err := sleep(ctx, r.between(r.opts.Window/4, r.opts.Window/2)); err != nil {
				return err
			}
			before := r.metric(ctx, metricReconnects)
			undo, hold, err := apply(r)
			if err != nil {
				return err
			}
			serr := sleep(ctx, hold)
			if err := undo(); err != nil {
				return err
			}
			if serr != nil {
				return serr
			}
			start := time.Now()
			if !r.waitMetricAbove(ctx, metricReconnects, before, recoverTimeout) {
				r.note("%s %d: the relay did not reconnect within %v", name, i, recoverTimeout)
				continue
			}
			if err := r.relay.WaitReady(ctx, readyTimeout); err != nil {
				return fmt.Errorf("after %s %d: %w", name, i, err)
			}
			r.faults++
			recovered = append(recovered, time.Since(start).Round(10*time.Millisecond).String())
		}
		r.note("relay streaming again %s after each %s", strings.Join(recovered, ", "), name)
		return nil
	}
}

// pgLatency slows the relay's Postgres connections both ways.
func pgLatency(ctx context.Context, r *run) error {
	attrs := map[string]any{"latency": 200, "jitter": 100}
	for _, stream := range []string{"upstream", "downstream"} {
		if err := r.pgProxy.add(toxic{Name: "latency_" + stream, Type: "latency", Stream: stream, Attributes: attrs}); err != nil {
			return err
		}
	}
	return r.timedPGFault(ctx, "SELECT 'x'", 300*time.Millisecond, func() {
		r.pgProxy.clear(context.Background())
	})
}

// pgBandwidth throttles what Postgres sends the relay.
func pgBandwidth(ctx context.Context, r *run) error {
	if err := r.pgProxy.add(toxic{Name: "bandwidth", Type: "bandwidth", Stream: "downstream", Attributes: map[string]any{"rate": 16}}); err != nil {
		return err
	}
	return r.timedPGFault(ctx, "SELECT repeat('x', 8192)", 250*time.Millisecond, func() {
		r.pgProxy.clear(context.Background())
	})
}

// timedPGFault holds a Postgres network fault for the window, counting it
// when a probe query through the proxy takes at least slow, and notes how far
// the slot fell behind and whether the relay reconnected.
func (r *run) timedPGFault(ctx context.Context, probe string, slow time.Duration, undo func()) error {
	defer undo()
	before := r.metric(ctx, metricReconnects)
	stopLag := r.sampleLag(ctx)
	took, err := probePG(ctx, r.relayURL, probe)
	if err != nil {
		r.note("probe through the proxy: %v", err)
	} else if took >= slow {
		r.faults++
	}
	serr := sleep(ctx, r.opts.Window)
	undo()
	peak := stopLag()
	r.note("probe took %v; slot lag peaked at %d KiB; relay reconnects: %v",
		took.Round(time.Millisecond), peak>>10, r.metric(ctx, metricReconnects)-before)
	return serr
}

// probePG times connecting to url and running query.
func probePG(ctx context.Context, url, query string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, fmt.Errorf("probe postgres: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var s string
	if err := conn.QueryRow(ctx, query).Scan(&s); err != nil {
		return 0, fmt.Errorf("probe postgres: %w", err)
	}
	return time.Since(start), nil
}

// sampleLag samples the slot's lag (WAL written minus confirmed) every 200ms
// until the returned function is called, which returns the peak in bytes.
func (r *run) sampleLag(ctx context.Context) func() int64 {
	ctx, cancel := context.WithCancel(ctx)
	var peak atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := pgx.Connect(ctx, r.url)
		if err != nil {
			return
		}
		defer conn.Close(context.WithoutCancel(ctx))
		for ctx.Err() == nil {
			var lag int64
			err := conn.QueryRow(ctx, `SELECT coalesce((pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, 0)
				FROM pg_replication_slots WHERE slot_name = $1`, r.slot).Scan(&lag)
			if err == nil && lag > peak.Load() {
				peak.Store(lag)
			}
			if sleep(ctx, 200*time.Millisecond) != nil {
				return
			}
		}
	}()
	return func() int64 {
		cancel()
		wg.Wait()
		return peak.Load()
	}
}

// stallTime is how long the produce stall lasts: three wal_sender_timeouts,
// or the window if longer.
func stallTime(o Options) time.Duration { return max(3*walSenderTimeout, o.Window) }

// prepareWalSenderTimeout sets wal_sender_timeout for the relay's sessions
// (a per-connection setting since PostgreSQL 12, so the shared cluster is
// left alone), checks it took, and makes events bigger so 1 MiB in flight
// fills quickly.
func prepareWalSenderTimeout(ctx context.Context, r *run) error {
	u, err := url.Parse(r.relayURL)
	if err != nil {
		return fmt.Errorf("parse postgres url: %w", err)
	}
	// pgconn does not read "+" as a space: encode it as %20.
	opt := "options=" + strings.ReplaceAll(url.QueryEscape("-c wal_sender_timeout="+walSenderTimeoutText), "+", "%20")
	if u.RawQuery != "" {
		opt = "&" + opt
	}
	u.RawQuery += opt
	r.relayURL = u.String()
	conn, err := pgx.Connect(ctx, r.relayURL)
	if err != nil {
		return fmt.Errorf("connect with wal_sender_timeout: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var v string
	if err := conn.QueryRow(ctx, "SHOW wal_sender_timeout").Scan(&v); err != nil {
		return fmt.Errorf("show wal_sender_timeout: %w", err)
	}
	if v != walSenderTimeoutText {
		return fmt.Errorf("wal_sender_timeout is %s for the relay's sessions, want %s", v, walSenderTimeoutText)
	}
	r.writer.Pad = 2000
	return nil
}

// injectProduceStall holds every produce request for stallTime: the relay's
// 1 MiB in-flight bound fills, it stops reading, and must keep its
// replication connection alive (or reconnect) though nothing is confirmed for
// longer than wal_sender_timeout.
func injectProduceStall(ctx context.Context, r *run) error {
	c := r.kafka.kfake()
	logFile := r.env.pg.LogFile()
	var logStart int64
	if fi, err := os.Stat(logFile); err == nil {
		logStart = fi.Size()
	}
	before := r.metric(ctx, metricReconnects)

	var stalling atomic.Bool
	var held atomic.Int64
	release := make(chan struct{})
	var once sync.Once
	unstall := func() {
		once.Do(func() {
			stalling.Store(false)
			close(release)
		})
	}
	defer unstall()
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		if stalling.Load() {
			held.Add(1)
			c.SleepControl(func() { <-release })
		}
		return nil, nil, false // then handled as usual
	})
	stalling.Store(true)
	start := time.Now()
	backpressured := false
	var peak float64
	for time.Since(start) < stallTime(r.opts) {
		m, err := r.relay.Scrape(ctx)
		if err == nil {
			backpressured = backpressured || m[metricBackpressured] == 1
			peak = max(peak, m[metricInFlightBytes])
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	unstall()
	if backpressured {
		r.faults++
	} else {
		r.note("the relay never reported backpressure")
	}
	timeouts := "n/a (external server)"
	if b, err := os.ReadFile(logFile); err == nil && int64(len(b)) >= logStart {
		timeouts = fmt.Sprint(strings.Count(string(b[logStart:]), "terminating walsender process due to replication timeout"))
	}
	r.note("produce requests held: %d, for %v; in flight peaked at %.1f MiB; walsender timeouts: %s; relay reconnects: %v",
		held.Load(), stallTime(r.opts), peak/(1<<20), timeouts, r.metric(ctx, metricReconnects)-before)
	return nil
}

// kafkaReset resets the relay's Kafka connections; an episode counts once the
// relay retried a produce request after it.
func kafkaReset(ctx context.Context, r *run) error {
	for i := 1; i <= r.opts.Episodes; i++ {
		if err := sleep(ctx, r.between(r.opts.Window/4, r.opts.Window/2)); err != nil {
			return err
		}
		before := r.metric(ctx, metricRetries)
		if err := r.kafka.proxy.add(toxic{Name: "reset", Type: "reset_peer", Stream: "downstream", Attributes: map[string]any{"timeout": 0}}); err != nil {
			return err
		}
		// reset_peer resets a connection when an answer passes it: keep it
		// on until the relay saw a reset (a busy machine may pass no answer
		// in the first 300ms), at most recoverTimeout.
		serr := sleep(ctx, 300*time.Millisecond)
		took := serr == nil && r.waitMetricAbove(ctx, metricRetries, before, recoverTimeout)
		if err := r.kafka.proxy.remove(context.Background(), "reset"); err != nil {
			return err
		}
		if serr != nil {
			return serr
		}
		if !took {
			r.note("reset %d: the relay retried nothing", i)
			continue
		}
		if err := r.relay.WaitReady(ctx, readyTimeout); err != nil {
			return fmt.Errorf("after reset %d: %w", i, err)
		}
		r.faults++
	}
	r.note("produce retries: %v", r.metric(ctx, metricRetries))
	return nil
}

// kafkaLatency slows the relay's Kafka connections both ways.
func kafkaLatency(ctx context.Context, r *run) error {
	attrs := map[string]any{"latency": 200, "jitter": 50}
	for _, stream := range []string{"upstream", "downstream"} {
		if err := r.kafka.proxy.add(toxic{Name: "latency_" + stream, Type: "latency", Stream: stream, Attributes: attrs}); err != nil {
			return err
		}
	}
	defer r.kafka.proxy.clear(context.Background())
	took, err := probeKafka(ctx, r.kafka.brokers[0])
	if err != nil {
		r.note("probe through the proxy: %v", err)
	} else if took >= 300*time.Millisecond {
		r.faults++
	}
	serr := sleep(ctx, r.opts.Window)
	r.kafka.proxy.clear(context.Background())
	r.note("probe took %v; produce retries: %v", took.Round(time.Millisecond), r.metric(ctx, metricRetries))
	return serr
}

// probeKafka times an ApiVersions request to the broker at addr on a new
// connection.
func probeKafka(ctx context.Context, addr string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return 0, fmt.Errorf("probe kafka: %w", err)
	}
	defer cl.Close()
	start := time.Now()
	if _, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl); err != nil {
		return 0, fmt.Errorf("probe kafka: %w", err)
	}
	return time.Since(start), nil
}

// brokerErrors answers a share p of the produce requests with code for the
// window; with parts, only those partitions fail, and only in requests that
// also carry another partition (a partial failure of the request).
func brokerErrors(code *kerr.Error, p float64, parts []int32) func(context.Context, *run) error {
	return func(ctx context.Context, r *run) error {
		c := r.kafka.kfake()
		// When is asked per partition; decide once per request.
		var mu sync.Mutex
		var last kmsg.Request
		var decided bool
		when := func(req kmsg.Request) bool {
			mu.Lock()
			defer mu.Unlock()
			if req != last {
				last = req
				decided = rand.Float64() < p && (parts == nil || carriesOther(req, parts))
			}
			return decided
		}
		before := r.metric(ctx, metricRetries)
		h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: r.topic, Partitions: parts, Err: code, Count: -1, When: when})
		serr := sleep(ctx, r.opts.Window)
		h.Remove()
		r.faults += h.Hits()
		r.note("%d requests answered %s; produce retries: %v", h.Hits(), code.Message, r.metric(ctx, metricRetries)-before)
		return serr
	}
}

// carriesOther reports whether a produce request carries a partition not in
// parts.
func carriesOther(req kmsg.Request, parts []int32) bool {
	pr, ok := req.(*kmsg.ProduceRequest)
	if !ok {
		return false
	}
	for _, t := range pr.Topics {
		for _, p := range t.Partitions {
			if !contains(parts, p.Partition) {
				return true
			}
		}
	}
	return false
}

func contains(s []int32, v int32) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// kafkaSlow delays every other produce response by 100-700ms for the window.
func kafkaSlow(ctx context.Context, r *run) error {
	c := r.kafka.kfake()
	var slowing atomic.Bool
	var seen, slowed atomic.Int64
	slowing.Store(true)
	defer slowing.Store(false)
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		if slowing.Load() && seen.Add(1)%2 == 1 {
			slowed.Add(1)
			d := 100*time.Millisecond + rand.N(600*time.Millisecond)
			c.SleepControl(func() { time.Sleep(d) })
		}
		return nil, nil, false // then handled as usual
	})
	err := sleep(ctx, r.opts.Window)
	slowing.Store(false)
	r.faults += int(slowed.Load())
	r.note("%d produce responses delayed", slowed.Load())
	return err
}

// kafkaRestart stops the broker and starts it again on its data directory.
func kafkaRestart(ctx context.Context, r *run) error {
	var recovered []string
	for i := 1; i <= r.opts.Episodes; i++ {
		if err := sleep(ctx, r.between(r.opts.Window/4, r.opts.Window/2)); err != nil {
			return err
		}
		r.kafka.local.Stop()
		serr := sleep(ctx, r.between(500*time.Millisecond, 1500*time.Millisecond))
		if err := r.kafka.local.Start(); err != nil {
			return err
		}
		if serr != nil {
			return serr
		}
		r.faults++
		start := time.Now()
		if err := r.relay.WaitReady(ctx, readyTimeout); err != nil {
			return fmt.Errorf("after broker restart %d: %w", i, err)
		}
		recovered = append(recovered, time.Since(start).Round(10*time.Millisecond).String())
	}
	r.note("relay ready %s after each start; produce retries: %v", strings.Join(recovered, ", "), r.metric(ctx, metricRetries))
	return nil
}

// kafkaLeaderMove moves partition leaders between the brokers.
func kafkaLeaderMove(ctx context.Context, r *run) error {
	c := r.kafka.cluster
	before := r.metric(ctx, metricRetries)
	end := time.Now().Add(r.opts.Window)
	for time.Now().Before(end) {
		p := int32(r.rng.IntN(partitions))
		leader := c.LeaderFor(r.topic, p)
		to := (leader + 1 + int32(r.rng.IntN(2))) % 3
		if err := c.MoveTopicPartition(r.topic, p, to); err != nil {
			return fmt.Errorf("move partition %d to broker %d: %w", p, to, err)
		}
		r.faults++
		if err := sleep(ctx, r.between(200*time.Millisecond, 500*time.Millisecond)); err != nil {
			return err
		}
	}
	r.note("produce retries: %v", r.metric(ctx, metricRetries)-before)
	return nil
}
