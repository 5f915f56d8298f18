// Command rewards is the source articles' example of an idempotent consumer,
// written with the consumer package: a reward-points service that reads
// RewardGranted events ({"player_id": "...", "points": N}) that another
// service committed to its outbox and cdc-relay published, and adds the
// points to the player — once per event, whatever Kafka redelivers.
//
//	go run ./examples/rewards -brokers 127.0.0.1:9092 -pg-url postgres://.../points
//
// It creates its tables in the -pg-url database (the consumer's, not the
// outbox's): player_points, and processed_messages and consumer_dead_letters
// (consumer.Migrate). With -reprocess it runs the given dead letters again
// instead (after a fix) and exits. See consumer/README.md, "Try it: the
// rewards example".
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/cdc-relay/cdc-relay/consumer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "rewards: %v\n", err)
		os.Exit(1)
	}
}

// EventType is the event this consumer acts on; other events on the topic
// are claimed and ignored.
const EventType = "RewardGranted"

// schema is the business table, created if missing.
const schema = `CREATE TABLE IF NOT EXISTS player_points (
    player_id text   PRIMARY KEY,
    points    bigint NOT NULL
)`

// options are the command line.
type options struct {
	brokers, topic, group, name, pgURL string
	metricsAddr, logLevel, logFormat   string
	session, heartbeat, rebalance      time.Duration
	retention                          time.Duration
	reprocess                          []int64
	actor                              string
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("rewards", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.brokers, "brokers", "", "Kafka brokers, comma-separated host:port (required)")
	fs.StringVar(&o.topic, "topic", "outbox.player", "topic of the reward events")
	fs.StringVar(&o.group, "group", "rewards", "Kafka consumer group")
	fs.StringVar(&o.name, "name", "reward-consumer", "consumer name in processed_messages: choose once, never change")
	fs.StringVar(&o.pgURL, "pg-url", "", "the consumer's Postgres database (required)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9188); empty: none")
	fs.StringVar(&o.logLevel, "log-level", "info", "trace, debug (one line per skipped duplicate), info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "json", "json or console")
	fs.DurationVar(&o.session, "session-timeout", 0, "group session timeout (0: kafka-go's 30s); a killed consumer holds its partitions this long")
	fs.DurationVar(&o.heartbeat, "heartbeat-interval", 0, "group heartbeat interval (0: kafka-go's 3s); below -session-timeout")
	fs.DurationVar(&o.rebalance, "rebalance-timeout", 0, "how long a rebalance waits for members to rejoin (0: kafka-go's 30s)")
	fs.DurationVar(&o.retention, "retention", 0, "prune processed_messages rows older than this, hourly; 0 keeps them forever (the right choice for points and money)")
	reprocess := fs.String("reprocess", "", "comma-separated dead-letter ids (consumer_dead_letters.id) to run again, then exit")
	fs.StringVar(&o.actor, "actor", os.Getenv("USER"), "who reprocesses (recorded on the dead letters)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.brokers == "" && *reprocess == "" {
		return o, errors.New("-brokers is required")
	}
	if o.pgURL == "" {
		return o, errors.New("-pg-url is required")
	}
	for _, s := range strings.Split(*reprocess, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return o, fmt.Errorf("-reprocess: %q is not a dead-letter id", s)
		}
		o.reprocess = append(o.reprocess, id)
	}
	return o, nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	log, err := newLogger(o, stderr)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, o.pgURL)
	if err != nil {
		return fmt.Errorf("connect to the consumer's database: %w", err)
	}
	defer pool.Close()
	if err := consumer.Migrate(ctx, pool, ""); err != nil {
		return err
	}
	// Under a lock: two instances starting at once would otherwise race in
	// CREATE TABLE IF NOT EXISTS.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('rewards schema'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schema)
		return err
	})
	if err != nil {
		return fmt.Errorf("create player_points: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg := consumer.Config{
		Brokers:           strings.Split(o.brokers, ","),
		GroupID:           o.group,
		Topics:            []string{o.topic},
		Name:              o.name,
		Pool:              pool,
		Registerer:        reg,
		Logger:            log,
		SessionTimeout:    o.session,
		HeartbeatInterval: o.heartbeat,
		RebalanceTimeout:  o.rebalance,
	}
	if len(o.reprocess) > 0 {
		return reprocess(ctx, cfg, o)
	}

	g, ctx := errgroup.WithContext(ctx)
	if o.metricsAddr != "" {
		if err := serveMetrics(ctx, g, o.metricsAddr, reg, log); err != nil {
			return err
		}
	}
	if o.retention > 0 {
		g.Go(func() error { return prune(ctx, pool, o.name, o.retention, log) })
	}
	g.Go(func() error { return consumer.Run(ctx, cfg, grant) })
	return g.Wait()
}

// reward is the payload of a RewardGranted event.
type reward struct {
	PlayerID string `json:"player_id"`
	Points   *int64 `json:"points"`
}

// parseReward decodes msg's payload. A payload that cannot be a reward is a
// permanent failure: retrying cannot fix it.
func parseReward(msg consumer.Message) (reward, error) {
	var r reward
	if err := json.Unmarshal(msg.Value, &r); err != nil {
		return r, consumer.WithCode("invalid_payload", consumer.Permanent(fmt.Errorf("decode reward: %w", err)))
	}
	if r.PlayerID == "" || r.Points == nil {
		return r, consumer.WithCode("invalid_payload", consumer.Permanent(fmt.Errorf("reward %s lacks player_id or points", msg.Value)))
	}
	return r, nil
}

// grant is the handler: it adds the reward's points to the player, in the
// transaction that also claims the event, so the points are added exactly
// once per event id.
func grant(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
	if msg.EventType() != EventType {
		return nil // not ours: claimed, nothing to do
	}
	r, err := parseReward(msg)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO player_points (player_id, points) VALUES ($1, $2)
ON CONFLICT (player_id) DO UPDATE SET points = player_points.points + EXCLUDED.points`, r.PlayerID, *r.Points)
	if err != nil {
		return fmt.Errorf("add %d points to player %s: %w", *r.Points, r.PlayerID, err)
	}
	return nil
}

// reprocess runs the dead letters of o.reprocess again and reports each.
func reprocess(ctx context.Context, cfg consumer.Config, o options) error {
	results, err := consumer.Reprocess(ctx, cfg, grant, o.actor, o.reprocess...)
	for _, r := range results {
		line := fmt.Sprintf("dead letter %d (message %s): %s", r.ID, r.MessageID, r.Outcome)
		if r.Status != "" {
			line += ", now " + r.Status
		}
		if r.Err != nil {
			line += ": " + r.Err.Error()
		}
		fmt.Println(line)
	}
	return err
}

// serveMetrics serves /metrics on addr until ctx is done, in g.
func serveMetrics(ctx context.Context, g *errgroup.Group, addr string, reg *prometheus.Registry, log zerolog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on -metrics-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Info().Str("addr", ln.Addr().String()).Msg("serving metrics")
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve metrics: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	return nil
}

// prune deletes claims older than retention now and every hour until ctx is
// done.
func prune(ctx context.Context, pool *pgxpool.Pool, name string, retention time.Duration, log zerolog.Logger) error {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		n, err := consumer.Prune(ctx, pool, name, retention)
		if err != nil && ctx.Err() == nil {
			log.Warn().Err(err).Msg("pruning processed_messages failed; trying again in an hour")
		} else if n > 0 {
			log.Info().Int64("deleted", n).Dur("older_than", retention).Msg("pruned processed_messages")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// newLogger is the zerolog logger of -log-level and -log-format.
func newLogger(o options, w io.Writer) (zerolog.Logger, error) {
	level, err := zerolog.ParseLevel(o.logLevel)
	if err != nil || o.logLevel == "" {
		return zerolog.Logger{}, fmt.Errorf("-log-level %q: want trace, debug, info, warn or error", o.logLevel)
	}
	switch o.logFormat {
	case "json":
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	default:
		return zerolog.Logger{}, fmt.Errorf("-log-format %q: want json or console", o.logFormat)
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger(), nil
}
