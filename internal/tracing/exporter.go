package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
)

// Limits the OTLP/HTTP specification recommends.
const (
	// maxRequestBytes bounds a request's body before compression: a larger
	// batch is not sent.
	maxRequestBytes = 64 << 20
	// maxResponseBytes bounds what is read of a response's body.
	maxResponseBytes = 4 << 20
	// keepBufferBytes bounds the request buffer kept between exports (a
	// batch of 512 of the relay's spans takes about 300 KB).
	keepBufferBytes = 4 << 20
)

// Waits between attempts of an export without the receiver's Retry-After:
// the first, doubled for each next one up to the second, each with a random
// part (from half to the whole).
const (
	firstBackoff = time.Second
	maxBackoff   = 30 * time.Second
)

// errShutDown ends the exports still running when the exporter shuts down.
var errShutDown = errors.New("the exporter is shut down")

// exporter sends the spans the batch span processor hands it to an OTLP/HTTP
// receiver: each batch as one POST of an ExportTraceServiceRequest in binary
// protobuf, optionally gzipped, retried after 429, 502, 503 and 504 answers
// and failed connections, after the receiver's Retry-After or an exponential
// backoff, until the export's timeout. It counts every batch's result and
// logs failures itself, then reports them handled: the processor would pass
// them to OpenTelemetry's global error handler, which writes plain lines
// with the standard library's log into the relay's JSON log, and which the
// relay leaves alone (no global state). The processor makes one export at a
// time; the exporter makes them wait for each other all the same.
type exporter struct {
	dest      destination
	header    http.Header // of every request
	transport *http.Transport
	client    *http.Client
	log       zerolog.Logger // sampled
	backoff   time.Duration  // the first wait between attempts (tests shorten it)

	exported, failed prometheus.Counter

	stop  context.Context         // ends the export in progress: at Shutdown, or its deadline
	abort context.CancelCauseFunc // ends stop, saying why

	busy chan struct{} // holds a token while an export or Shutdown runs; guards what follows
	shut bool
	body []byte // the request, reused by each export
	zbuf bytes.Buffer
	zw   *gzip.Writer
}

var _ sdktrace.SpanExporter = (*exporter)(nil)

// newExporter returns an exporter to dest. Nothing connects before the
// first export. The caller must call Shutdown.
func newExporter(dest destination, version string, log zerolog.Logger, m *metrics.Metrics) *exporter {
	transport := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       dest.tls,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	header := http.Header{}
	header.Set("User-Agent", strings.TrimSuffix("cdc-relay/"+version, "/"))
	for k, vs := range dest.headers {
		header[k] = append([]string(nil), vs...)
	}
	header.Set("Content-Type", "application/x-protobuf")
	if dest.gzip {
		header.Set("Content-Encoding", "gzip")
	}
	stop, abort := context.WithCancelCause(context.Background())
	return &exporter{
		dest:      dest,
		header:    header,
		transport: transport,
		client: &http.Client{
			Transport: transport,
			// A redirect would turn the POST into a GET, or repeat it
			// elsewhere: it is reported instead.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		log:      log,
		backoff:  firstBackoff,
		exported: m.TraceSpans.WithLabelValues("exported"),
		failed:   m.TraceSpans.WithLabelValues("failed"),
		stop:     stop,
		abort:    abort,
		busy:     make(chan struct{}, 1),
	}
}

// ExportSpans sends spans, retrying as the receiver allows until the
// export's timeout (OTEL_EXPORTER_OTLP_TIMEOUT, and ctx: the processor's
// OTEL_BSP_EXPORT_TIMEOUT). Spans it cannot send, and those the receiver
// rejects, are counted, logged and dropped; the relay's events are not
// affected either way. It returns nil: the failure is handled.
func (e *exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	select {
	case e.busy <- struct{}{}:
	case <-ctx.Done():
		return e.dropped(len(spans), fmt.Errorf("export trace spans: %w", context.Cause(ctx)))
	}
	defer func() { <-e.busy }()
	if e.shut {
		return e.dropped(len(spans), fmt.Errorf("export trace spans: %w", errShutDown))
	}
	rejected, message, err := e.export(ctx, spans)
	if err != nil {
		return e.dropped(len(spans), err)
	}
	rejected = min(max(rejected, 0), int64(len(spans)))
	e.exported.Add(float64(int64(len(spans)) - rejected))
	if rejected > 0 {
		e.failed.Add(float64(rejected))
		e.log.Warn().Int64("rejected", rejected).Int("spans", len(spans)).Str("receiver_message", message).
			Msg("the OTLP receiver rejected trace spans; they are dropped (the events themselves are not affected)")
	} else if message != "" {
		e.log.Warn().Int("spans", len(spans)).Str("receiver_message", message).
			Msg("the OTLP receiver accepted the trace spans with a warning")
	}
	return nil
}

// dropped counts and logs n spans that could not be exported.
func (e *exporter) dropped(n int, err error) error {
	e.failed.Add(float64(n))
	e.log.Warn().Err(err).Int("spans", n).
		Msg("cannot export trace spans over OTLP; they are dropped (the events themselves are not affected)")
	return nil
}

// export encodes spans and posts them. It returns what a successful
// response says: the number of spans the receiver rejected, and its
// message.
func (e *exporter) export(ctx context.Context, spans []sdktrace.ReadOnlySpan) (rejected int64, message string, err error) {
	if err := context.Cause(e.stop); err != nil {
		return 0, "", fmt.Errorf("export trace spans: %w", err) // aborted: no request at all
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(e.stop, func() { cancel(context.Cause(e.stop)) })()
	if e.dest.timeout > 0 {
		var cancelTimeout context.CancelFunc
		ctx, cancelTimeout = context.WithTimeoutCause(ctx, e.dest.timeout,
			fmt.Errorf("the export timeout passed (%s=%d ms)", e.dest.timeoutName, e.dest.timeout.Milliseconds()))
		defer cancelTimeout()
	}

	e.body = appendExportRequest(e.body[:0], spans)
	defer func() {
		if cap(e.body) > keepBufferBytes {
			e.body = nil // a rare large batch: do not keep its buffer
		}
	}()
	if len(e.body) > maxRequestBytes {
		return 0, "", fmt.Errorf("export %d trace spans: the request would take %d bytes, more than the %d the exporter sends (lower OTEL_BSP_MAX_EXPORT_BATCH_SIZE)",
			len(spans), len(e.body), maxRequestBytes)
	}
	body := e.body
	if e.dest.gzip {
		e.zbuf.Reset()
		if e.zw == nil {
			e.zw = gzip.NewWriter(&e.zbuf)
		} else {
			e.zw.Reset(&e.zbuf)
		}
		if _, err := e.zw.Write(body); err != nil {
			return 0, "", fmt.Errorf("gzip the trace spans: %w", err)
		}
		if err := e.zw.Close(); err != nil {
			return 0, "", fmt.Errorf("gzip the trace spans: %w", err)
		}
		body = e.zbuf.Bytes()
	}
	return e.post(ctx, body)
}

// retryableError is a failed attempt that may succeed later: after the
// receiver's Retry-After when it sent one (after >= 0).
type retryableError struct {
	err   error
	after time.Duration
}

func (r *retryableError) Error() string { return r.err.Error() }
func (r *retryableError) Unwrap() error { return r.err }

// post sends body until an attempt succeeds or fails for good, the next
// attempt would start after ctx's deadline, or ctx ends.
func (e *exporter) post(ctx context.Context, body []byte) (rejected int64, message string, err error) {
	var previous error // of the attempt before, when it may be retried
	for attempt := 1; ; attempt++ {
		rejected, message, err = e.send(ctx, body)
		if err != nil && previous != nil && ctx.Err() != nil {
			// Cut short by the deadline: why the attempts before failed
			// says more than the deadline.
			return 0, "", fmt.Errorf("%w; the attempt before: %w (attempts: %d)", err, previous, attempt)
		}
		var r *retryableError
		if !errors.As(err, &r) {
			return rejected, message, err
		}
		previous = err
		wait := r.after
		if wait < 0 {
			wait = e.wait(attempt)
		}
		if deadline, ok := ctx.Deadline(); ok && time.Now().Add(wait).After(deadline) {
			return 0, "", fmt.Errorf("%w; not retried: the next attempt, in %v, would start after the export's deadline (attempts: %d)",
				err, wait.Round(time.Millisecond), attempt)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return 0, "", fmt.Errorf("%w; not retried: %w (attempts: %d)", err, context.Cause(ctx), attempt)
		case <-timer.C:
		}
	}
}

// wait is the backoff after attempt (1 for the first) failed.
func (e *exporter) wait(attempt int) time.Duration {
	d := e.backoff
	for i := 1; i < attempt && d < maxBackoff; i++ {
		d *= 2
	}
	d = min(d, maxBackoff)
	return d/2 + rand.N(d/2+1)
}

// send makes one attempt: it returns nil for a 2xx answer, a
// *retryableError when the attempt may be repeated, another error when it
// must not be.
func (e *exporter) send(ctx context.Context, body []byte) (rejected int64, message string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.dest.url, bytes.NewReader(body))
	if err != nil {
		return 0, "", fmt.Errorf("make the request to %s: %w", e.dest.endpoint, err)
	}
	req.Header = e.header.Clone()
	resp, err := e.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, "", fmt.Errorf("POST %s: %w", e.dest.endpoint, context.Cause(ctx))
		}
		// The url.Error's text holds the URL, and with it any credentials
		// or query: the endpoint replaces it.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		err = fmt.Errorf("POST %s: %w", e.dest.endpoint, err)
		var verify *tls.CertificateVerificationError
		var alert tls.AlertError
		if errors.As(err, &verify) || errors.As(err, &alert) {
			return 0, "", err // TLS refused: a certificate to fix, not a collector to wait for
		}
		return 0, "", &retryableError{err: err, after: -1}
	}
	// Closing a response body reports nothing worth knowing once it is read.
	defer func() { _ = resp.Body.Close() }()
	data, readErr := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))

	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if readErr != nil || !isProtobuf(resp.Header) {
			return 0, "", nil // accepted; a body without a partial success says nothing more
		}
		if len(data) > maxResponseBytes {
			return 0, "", fmt.Errorf("POST %s: %s with a body over %d bytes, not read", e.dest.endpoint, resp.Status, maxResponseBytes)
		}
		if rejected, message, err = partialSuccess(data); err != nil {
			return 0, "", nil // accepted, with a body that does not decode: nothing was rejected that it could say
		}
		return rejected, message, nil
	}

	err = fmt.Errorf("POST %s: %s%s", e.dest.endpoint, resp.Status, responseText(resp.Header, data))
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		after := retryAfter(resp.Header.Get("Retry-After"), time.Now())
		if after >= 0 {
			err = fmt.Errorf("%w (Retry-After: %v)", err, after)
		}
		return 0, "", &retryableError{err: err, after: after}
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return 0, "", fmt.Errorf("%w: the endpoint redirects; set %sENDPOINT to the receiver itself", err, otlpPrefix)
	}
	return 0, "", err
}

// isProtobuf reports whether h says its body is binary protobuf.
func isProtobuf(h http.Header) bool {
	ct, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	ct = strings.TrimSpace(ct)
	return strings.EqualFold(ct, "application/x-protobuf") || strings.EqualFold(ct, "application/protobuf")
}

// responseText is what an error response's body says, for the error: the
// message of its google.rpc.Status, or the start of a text body (a proxy's
// error page), printable, on one line; "" for nothing.
func responseText(h http.Header, data []byte) string {
	var s string
	if isProtobuf(h) {
		msg, err := rpcStatusText(data)
		if err != nil {
			return ""
		}
		s = msg
	} else {
		s = string(data[:min(len(data), 512)])
	}
	s = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 256 {
		s = strings.ToValidUTF8(s[:256], "") + "…"
	}
	if s == "" {
		return ""
	}
	return ": " + s
}

// retryAfter reads a Retry-After header at now: seconds, or an HTTP date;
// -1 when there is none or it does not parse.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return -1
	}
	if secs, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return -1
}

// Shutdown waits for the export in progress, cut short when ctx ends, and
// closes the exporter's connections. Exports after it fail.
func (e *exporter) Shutdown(ctx context.Context) error {
	defer context.AfterFunc(ctx, func() { e.abort(context.Cause(ctx)) })()
	e.busy <- struct{}{} // every wait of an export ends with e.stop
	e.shut = true
	<-e.busy
	e.abort(errShutDown)
	e.transport.CloseIdleConnections()
	if ctx.Err() != nil {
		return fmt.Errorf("shut down the OTLP exporter: %w", context.Cause(ctx))
	}
	return nil
}
