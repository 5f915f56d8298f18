package consumer

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the consumer's collectors, all prefixed cdc_relay_consumer_
// and labelled consumer=<Config.Name>, so consumers of different names can
// share a registry.
type metrics struct {
	processed    prometheus.Counter
	duplicates   prometheus.Counter
	retries      prometheus.Counter
	deadLetters  *prometheus.CounterVec // by code
	reprocessed  *prometheus.CounterVec // by status afterwards
	handlerTime  prometheus.Histogram
	lag          *prometheus.GaugeVec // by topic, partition
	rebalances   prometheus.Counter
	commitErrors prometheus.Counter
	storeWaiting prometheus.Gauge
}

// newMetrics creates the collectors and registers them on reg (nil: none).
// A collector already registered by an earlier Run of the same consumer name
// is reused, so counters continue.
func newMetrics(reg prometheus.Registerer, name string) (*metrics, error) {
	labels := prometheus.Labels{"consumer": name}
	opts := func(n, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "cdc_relay", Subsystem: "consumer", Name: n, Help: help, ConstLabels: labels}
	}
	m := &metrics{
		processed: prometheus.NewCounter(prometheus.CounterOpts(opts("processed_total",
			"Messages whose handler transaction committed (the effect happened)."))),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts(opts("duplicates_skipped_total",
			"Messages skipped because processed_messages already held their id (redeliveries, replays, duplicates in the topic)."))),
		retries: prometheus.NewCounter(prometheus.CounterOpts(opts("retries_total",
			"Handler attempts that failed transiently and were retried after a backoff."))),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts(opts("dead_letters_total",
			"Messages stored in the dead-letter table, by error code.")), []string{"code"}),
		reprocessed: prometheus.NewCounterVec(prometheus.CounterOpts(opts("reprocess_attempts_total",
			"Automatic reprocessing attempts (Config.AutoReprocess) of dead letters, by the letter's status afterwards: completed, retry_wait or dead.")), []string{"status"}),
		handlerTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "cdc_relay", Subsystem: "consumer", Name: "handler_duration_seconds", ConstLabels: labels,
			Help:    "Time of one handler call, successful or not (without the claim and the commit).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10), // 0.5ms .. ~131s
		}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("lag",
			"Records behind the partition's high watermark after the last message processed, per assigned partition.")), []string{"topic", "partition"}),
		rebalances: prometheus.NewCounter(prometheus.CounterOpts(opts("rebalances_total",
			"Consumer group generations this process joined (the first join included)."))),
		commitErrors: prometheus.NewCounter(prometheus.CounterOpts(opts("offset_commit_errors_total",
			"Kafka offset commits that failed after the database commit; the messages are delivered again and skipped as duplicates."))),
		storeWaiting: prometheus.NewGauge(prometheus.GaugeOpts(opts("store_unavailable",
			"1 while the consumer's database cannot begin a transaction or record a claim (the consumer waits, nothing is dead-lettered)."))),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	m.processed = register(reg, m.processed, &errs)
	m.duplicates = register(reg, m.duplicates, &errs)
	m.retries = register(reg, m.retries, &errs)
	m.deadLetters = register(reg, m.deadLetters, &errs)
	m.reprocessed = register(reg, m.reprocessed, &errs)
	m.handlerTime = register(reg, m.handlerTime, &errs)
	m.lag = register(reg, m.lag, &errs)
	m.rebalances = register(reg, m.rebalances, &errs)
	m.commitErrors = register(reg, m.commitErrors, &errs)
	m.storeWaiting = register(reg, m.storeWaiting, &errs)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("register consumer metrics: %w", err)
	}
	return m, nil
}

// register registers c on reg and returns it, or the collector an earlier
// registration of the same metric left there; errors are added to errs.
func register[T prometheus.Collector](reg prometheus.Registerer, c T, errs *[]error) T {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing
		}
	}
	*errs = append(*errs, err)
	return c
}

func (m *metrics) setLag(topic string, partition int, lag int64) {
	if lag < 0 {
		lag = 0
	}
	m.lag.WithLabelValues(topic, strconv.Itoa(partition)).Set(float64(lag))
}
