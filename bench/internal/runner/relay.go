package runner

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cdc-relay/cdc-relay/bench/internal/child"
	"github.com/cdc-relay/cdc-relay/bench/internal/cpusplit"
	"github.com/cdc-relay/cdc-relay/internal/relayproc"
	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// relayProc is the relay binary running as `cdc-relay run`.
type relayProc struct {
	*child.Process
	base string // http://127.0.0.1:PORT
}

// relayOptions say how to start one relay process.
type relayOptions struct {
	slot        string
	topicPrefix string    // topics are topicPrefix + "{aggregate_type}"
	topic       string    // a fixed topic instead, when set
	delivery    string    // --delivery
	logLevel    string    // --log-level; "" is warn
	pprof       bool      // --pprof
	tables      []string  // --table, each; none: the default, public.outbox_events
	stderr      io.Writer // also receives the relay's log, when set
}

// relayArgs are the flags of `cdc-relay run` for o, serving metrics on
// addr. The limit reader is given the same flags, so it decodes and routes
// with the relay's configuration.
func (b *bench) relayArgs(o relayOptions, addr string) []string {
	if o.logLevel == "" {
		o.logLevel = "warn"
	}
	topic := o.topicPrefix + "{aggregate_type}"
	if o.topic != "" {
		topic = o.topic
	}
	args := []string{
		"--pg-url", b.relayPGURL(),
		"--kafka-brokers", strings.Join(b.brokers, ","),
		"--slot", o.slot,
		"--publication", publication,
		"--topic", topic,
		"--delivery", o.delivery,
		"--metrics-addr", addr,
		"--log-format", "json",
		"--log-level", o.logLevel,
	}
	if o.pprof {
		args = append(args, "--pprof")
	}
	for _, t := range o.tables {
		args = append(args, "--table", t)
	}
	return append(args, b.cfg.RelayFlags...)
}

// relayPGURL is the URL the relay and the limit reader connect with: the
// relay database's, through the server's Unix socket with Config.PGSocket
// (a relay deployed beside Postgres), else over loopback TCP.
func (b *bench) relayPGURL() string {
	if !b.cfg.PGSocket {
		return b.relayURL
	}
	u, err := url.Parse(b.relayURL)
	if err != nil {
		return b.relayURL // the sandbox's own URL: never fails
	}
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable",
		strings.TrimPrefix(u.Path, "/"), url.QueryEscape(b.pg.DataDir()), b.pg.Port())
}

// startRelay starts the built relay on the relay database.
func (b *bench) startRelay(o relayOptions) (*relayProc, error) {
	port, err := sandbox.FreePort()
	if err != nil {
		return nil, fmt.Errorf("pick metrics port: %w", err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if b.cfg.RelayLogDir != "" && o.stderr == nil {
		f, err := os.OpenFile(filepath.Join(b.cfg.RelayLogDir, o.slot+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("-relay-log: %w", err)
		}
		// The child's stderr copy ends when it exits; the file is closed
		// with the benchmark's process.
		o.stderr = f
		if o.logLevel == "" {
			o.logLevel = "info"
		}
	}
	p, err := child.Start(child.Options{
		Name:   "relay",
		Path:   b.relayBin,
		Dir:    b.tmp, // where a file checkpoint store would go; the table store is used
		Args:   append([]string{"run"}, b.relayArgs(o, addr)...),
		Stderr: o.stderr,
	})
	if err != nil {
		return nil, err
	}
	return &relayProc{Process: p, base: "http://" + addr}, nil
}

// exited returns the relay's exit as an error if it has stopped.
func (r *relayProc) exited() error {
	select {
	case <-r.Done():
		if err := r.ExitError(); err != nil {
			return err
		}
		return fmt.Errorf("relay exited unexpectedly%s", stderrSuffix(r.StderrTail()))
	default:
		return nil
	}
}

// relayMetrics is one scrape of the relay's /metrics.
type relayMetrics struct {
	sums    map[string]float64             // per metric name, summed over labels
	buckets map[string]map[float64]float64 // histogram name → le → cumulative count
}

// sum returns the sum of every sample of name over its labels.
func (m relayMetrics) sum(name string) float64 { return m.sums[name] }

// metrics scrapes /metrics: every metric, or only those named (the
// exposition's name[] filter, which spares the relay encoding the rest).
func (r *relayProc) metrics(ctx context.Context, names ...string) (relayMetrics, error) {
	m := relayMetrics{sums: map[string]float64{}, buckets: map[string]map[float64]float64{}}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	u := r.base + "/metrics"
	if len(names) > 0 {
		q := url.Values{"name[]": names}
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return m, fmt.Errorf("build metrics request: %w", err)
	}
	// Scraped every 50 ms during a drain: uncompressed, so the relay measured
	// does not spend its CPU gzipping for the benchmark.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return m, fmt.Errorf("scrape relay metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return m, fmt.Errorf("scrape relay metrics: %s", resp.Status)
	}
	samples, err := relayproc.ParseMetrics(resp.Body)
	if err != nil {
		return m, fmt.Errorf("read relay metrics: %w", err)
	}
	for _, s := range samples {
		m.sums[s.Name] += s.Value
		hist, ok := strings.CutSuffix(s.Name, "_bucket")
		le, hasLE := s.Label("le")
		if !ok || !hasLE {
			continue
		}
		bound, err := strconv.ParseFloat(le, 64) // "+Inf" parses as +Inf
		if err != nil {
			continue
		}
		if m.buckets[hist] == nil {
			m.buckets[hist] = map[float64]float64{}
		}
		m.buckets[hist][bound] += s.Value
	}
	return m, nil
}

// quantileSince estimates quantile q of histogram name over the observations
// made between before and m, interpolating linearly inside a bucket like
// Prometheus' histogram_quantile. It returns NaN without observations.
func (m relayMetrics) quantileSince(before relayMetrics, name string, q float64) float64 {
	bounds := make([]float64, 0, len(m.buckets[name]))
	for b := range m.buckets[name] {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	counts := make([]float64, len(bounds))
	for i, b := range bounds {
		counts[i] = m.buckets[name][b] - before.buckets[name][b]
	}
	if len(counts) == 0 || counts[len(counts)-1] <= 0 {
		return math.NaN()
	}
	rank := q * counts[len(counts)-1]
	lower, below := 0.0, 0.0
	for i, b := range bounds {
		if counts[i] >= rank {
			if math.IsInf(b, 1) {
				return lower // beyond the last finite bucket
			}
			if counts[i] == below {
				return b
			}
			return lower + (b-lower)*(rank-below)/(counts[i]-below)
		}
		lower, below = b, counts[i]
	}
	return lower
}

// waitPublished polls cdc_relay_events_published_total until it reaches n,
// and returns when it saw that. It polls every 50 ms once the end is near,
// less often before (see pollDelay): each scrape costs the relay measured
// ~0.5 ms of CPU, and at 50 ms throughout that was 4–5% of its CPU in a drain.
func (r *relayProc) waitPublished(ctx context.Context, n int, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	start := time.Now()
	last := 0.0
	for {
		wait := pollDelay(time.Since(start), last, float64(n))
		if until := time.Until(deadline); until < wait {
			wait = max(until, 0)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(wait):
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("relay published %.0f of %d events within %s%s", last, n, timeout, stderrSuffix(r.StderrTail()))
		}
		if err := r.exited(); err != nil {
			return time.Time{}, err
		}
		m, err := r.metrics(ctx, "cdc_relay_events_published_total")
		if err != nil {
			continue // not listening yet
		}
		if last = m.sum("cdc_relay_events_published_total"); last >= float64(n) {
			return time.Now(), nil
		}
	}
}

// pollFine is the polling interval near the end of a drain, and so the
// precision of its end time.
const pollFine = 50 * time.Millisecond

// pollDelay is how long to wait before the next poll, elapsed after the
// first, having seen done of want: pollFine until events flow, then a quarter
// of the time the rate so far says is left, between pollFine and 1 s.
func pollDelay(elapsed time.Duration, done, want float64) time.Duration {
	if done <= 0 || elapsed <= 0 || done >= want {
		return pollFine
	}
	left := time.Duration(float64(elapsed) * (want - done) / done / 4)
	return min(max(left, pollFine), time.Second)
}

// waitReady waits until /readyz answers 200: the relay streams and Kafka
// accepts events.
func (r *relayProc) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if err := r.exited(); err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.base+"/readyz", nil)
		if err != nil {
			return fmt.Errorf("build readiness request: %w", err)
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("relay not ready within %s%s", timeout, stderrSuffix(r.StderrTail()))
}

// cpuProfile is a CPU profile of the relay being taken.
type cpuProfile struct {
	path  string
	done  chan struct{}
	split []cpusplit.Share
	err   error
}

// startCPUProfile asks the relay (started with --pprof) for a CPU profile of
// the next secs seconds, saves it at path and splits it by part, in a
// goroutine that wait joins.
func (r *relayProc) startCPUProfile(ctx context.Context, secs int, path string) *cpuProfile {
	p := &cpuProfile{path: path, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		// The admin server listens a few milliseconds after the process starts.
		deadline := time.Now().Add(10 * time.Second)
		for {
			p.err = r.saveProfile(ctx, "profile?seconds="+strconv.Itoa(secs), path)
			if p.err == nil || time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if p.err != nil {
			return
		}
		f, err := os.Open(path)
		if err != nil {
			p.err = fmt.Errorf("open the relay's CPU profile: %w", err)
			return
		}
		defer f.Close()
		p.split, _, p.err = cpusplit.Split(f)
	}()
	return p
}

// wait returns the profile's split once it was taken.
func (p *cpuProfile) wait() ([]cpusplit.Share, error) {
	<-p.done
	return p.split, p.err
}

// saveProfile writes the relay's /debug/pprof/<name> to path.
func (r *relayProc) saveProfile(ctx context.Context, name, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.base+"/debug/pprof/"+name, nil)
	if err != nil {
		return fmt.Errorf("build profile request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("get the relay's %s profile: %w", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("get the relay's %s profile: %s", name, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read the relay's %s profile: %w", name, err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("save the relay's %s profile: %w", name, err)
	}
	return nil
}

func stderrSuffix(tail string) string {
	tail = strings.TrimSpace(tail)
	if tail == "" {
		return ""
	}
	return "; last stderr lines:\n    " + strings.ReplaceAll(tail, "\n", "\n    ")
}
