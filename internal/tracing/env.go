package tracing

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// The OTLP exporter's variables, without the OTEL_EXPORTER_OTLP_ prefix;
// each also exists with TRACES_ after it, which wins.
const otlpPrefix = "OTEL_EXPORTER_OTLP_"

// protoHTTPProtobuf is the one value of OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL
// the exporter speaks: OTLP/HTTP with binary protobuf bodies.
const protoHTTPProtobuf = "http/protobuf"

// Defaults of the OTLP/HTTP exporter, as the OpenTelemetry specification
// gives them.
const (
	defaultEndpoint = "http://localhost:4318"
	defaultTimeout  = 10 * time.Second
)

// destination is where and how spans are sent, as read from the environment.
type destination struct {
	endpoint    string        // scheme://host/path, as logged: no credentials, no query
	url         string        // what requests go to: the endpoint with its credentials and query
	protocol    string        // http/protobuf
	headers     http.Header   // of OTEL_EXPORTER_OTLP_[TRACES_]HEADERS
	gzip        bool          // OTEL_EXPORTER_OTLP_[TRACES_]COMPRESSION=gzip
	timeout     time.Duration // bounds one export, retries included; 0: no bound of its own
	timeoutName string        // the variable that set timeout, for errors
	tls         *tls.Config   // for https: the CA and client certificate of the variables
}

// readEnv reads the OTEL_EXPORTER_OTLP_* variables the exporter uses, and
// checks those of the SDK that it would silently replace by its default
// when bad (the sampler, the batch span processor's numbers). A bad value
// (a URL that does not parse, an unreadable certificate, a header without
// '=', a protocol other than http/protobuf) is an error that names the
// variable and never prints a header's value.
func readEnv(getenv func(string) string, readFile func(string) ([]byte, error)) (destination, error) {
	get := func(name string) string { return strings.TrimSpace(getenv(name)) }
	// signal returns the TRACES_ variable when set, else the general one.
	signal := func(suffix string) (name, value string) {
		if v := get(otlpPrefix + "TRACES_" + suffix); v != "" {
			return otlpPrefix + "TRACES_" + suffix, v
		}
		return otlpPrefix + suffix, get(otlpPrefix + suffix)
	}

	d := destination{protocol: protoHTTPProtobuf, timeout: defaultTimeout, timeoutName: otlpPrefix + "TIMEOUT"}
	if name, v := signal("PROTOCOL"); v != "" && v != protoHTTPProtobuf {
		return d, fmt.Errorf("%s=%q: cdc-relay exports OTLP over HTTP with protobuf bodies only: unset it or set http/protobuf, "+
			"and point %sENDPOINT at the collector's OTLP/HTTP port (4318, where the OpenTelemetry Collector's otlp receiver serves it)",
			name, v, otlpPrefix)
	}

	// _INSECURE says http (true) or https (false) over the endpoint's
	// scheme, and gives one to an endpoint written without it.
	insecureName := ""
	insecure := false
	for _, name := range []string{otlpPrefix + "INSECURE", otlpPrefix + "TRACES_INSECURE"} {
		if v := get(name); v != "" {
			switch strings.ToLower(v) {
			case "true":
				insecure = true
			case "false":
				insecure = false
			default:
				return d, fmt.Errorf("%s=%q: use true or false", name, v)
			}
			insecureName = name
		}
	}

	// The endpoint: the per-signal URL as it is (path "/" when it has none),
	// else the general one with /v1/traces appended to its path, else
	// http://localhost:4318/v1/traces.
	u, err := url.Parse(defaultEndpoint + "/v1/traces")
	if err != nil {
		return d, fmt.Errorf("parse the default endpoint: %w", err)
	}
	if v := get(otlpPrefix + "ENDPOINT"); v != "" {
		base, err := endpointURL(otlpPrefix+"ENDPOINT", v, insecureName, insecure)
		if err != nil {
			return d, err
		}
		u = base
		u.Path = path.Join(base.Path, "/v1/traces")
		u.RawPath = ""
	}
	if v := get(otlpPrefix + "TRACES_ENDPOINT"); v != "" {
		full, err := endpointURL(otlpPrefix+"TRACES_ENDPOINT", v, insecureName, insecure)
		if err != nil {
			return d, err
		}
		u = full
		if u.Path == "" {
			u.Path = "/"
		}
	}
	if insecureName != "" {
		u.Scheme = "https"
		if insecure {
			u.Scheme = "http"
		}
	}
	d.url = u.String()
	d.endpoint = (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}).String()

	// Headers: the per-signal variable replaces the general one; both are
	// checked.
	headers := map[string]http.Header{}
	for _, name := range []string{otlpPrefix + "HEADERS", otlpPrefix + "TRACES_HEADERS"} {
		h, err := parseHeaders(name, get(name))
		if err != nil {
			return d, err
		}
		headers[name] = h
	}
	name, _ := signal("HEADERS")
	d.headers = headers[name]

	for _, name := range []string{otlpPrefix + "COMPRESSION", otlpPrefix + "TRACES_COMPRESSION"} {
		if v := get(name); v != "" && v != "gzip" && v != "none" {
			return d, fmt.Errorf("%s=%q: use gzip or none", name, v)
		}
	}
	_, compression := signal("COMPRESSION")
	d.gzip = compression == "gzip"

	for _, name := range []string{
		otlpPrefix + "TIMEOUT", otlpPrefix + "TRACES_TIMEOUT",
		"OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
	} {
		if v := get(name); v != "" {
			if n, err := strconv.Atoi(v); err != nil || n < 0 {
				return d, fmt.Errorf("%s=%q: use a whole number (milliseconds for a delay or timeout)", name, v)
			}
		}
	}
	if name, v := signal("TIMEOUT"); v != "" {
		ms, _ := strconv.Atoi(v) // checked above
		d.timeout, d.timeoutName = time.Duration(ms)*time.Millisecond, name
	}

	// TLS: the per-signal CA file, else the general one (else the system's
	// CAs); the per-signal client certificate and key, else the general pair.
	d.tls = &tls.Config{MinVersion: tls.VersionTLS12}
	cas := map[string]*x509.CertPool{}
	for _, name := range []string{otlpPrefix + "CERTIFICATE", otlpPrefix + "TRACES_CERTIFICATE"} {
		if file := get(name); file != "" {
			pem, err := readFile(file)
			if err != nil {
				return d, fmt.Errorf("%s: %w", name, err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return d, fmt.Errorf("%s=%s: no PEM certificate in the file", name, file)
			}
			cas[name] = pool
		}
	}
	if name, _ := signal("CERTIFICATE"); cas[name] != nil {
		d.tls.RootCAs = cas[name]
	}
	for _, pre := range []string{otlpPrefix, otlpPrefix + "TRACES_"} {
		certName, keyName := pre+"CLIENT_CERTIFICATE", pre+"CLIENT_KEY"
		cert, key := get(certName), get(keyName)
		if (cert == "") != (key == "") {
			return d, fmt.Errorf("%s and %s: set both or neither", certName, keyName)
		}
		if cert == "" {
			continue
		}
		certPEM, err := readFile(cert)
		if err != nil {
			return d, fmt.Errorf("%s: %w", certName, err)
		}
		keyPEM, err := readFile(key)
		if err != nil {
			return d, fmt.Errorf("%s: %w", keyName, err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return d, fmt.Errorf("%s and %s: %w", certName, keyName, err)
		}
		d.tls.Certificates = []tls.Certificate{pair} // the TRACES_ pair, checked last, wins
	}

	if err := checkSampler(strings.ToLower(get("OTEL_TRACES_SAMPLER")), get("OTEL_TRACES_SAMPLER_ARG")); err != nil {
		return d, err
	}
	return d, nil
}

// endpointURL parses an endpoint variable: an http or https URL with a host,
// or a host without a scheme when an _INSECURE variable (insecureName) gives
// it one.
func endpointURL(name, v, insecureName string, insecure bool) (*url.URL, error) {
	if !strings.Contains(v, "://") {
		if insecureName == "" {
			return nil, fmt.Errorf("%s=%q has no scheme: write http://%s (plain text) or https://%s (TLS), or set %sINSECURE=true for plain text, false for TLS",
				name, redactURL(v), redactURL(v), redactURL(v), otlpPrefix)
		}
		scheme := "https://"
		if insecure {
			scheme = "http://"
		}
		v = scheme + v
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s=%q is not an http:// or https:// URL, e.g. http://otel-collector:4318", name, redactURL(v))
	}
	return u, nil
}

// redactURL hides the user information of a URL that may hold a password.
func redactURL(v string) string {
	if at := strings.LastIndex(v, "@"); at >= 0 {
		if scheme := strings.Index(v, "://"); scheme >= 0 && scheme < at {
			return v[:scheme+3] + "REDACTED" + v[at:]
		}
		return "REDACTED" + v[at:]
	}
	return v
}

// parseHeaders reads a headers variable: key=value pairs separated by
// commas (the W3C baggage format without properties), keys HTTP tokens,
// values URL-encoded, spaces around either ignored. Values are secrets (API
// keys) and are never printed.
func parseHeaders(name, v string) (http.Header, error) {
	h := http.Header{}
	if v == "" {
		return h, nil
	}
	for i, pair := range strings.Split(v, ",") {
		key, val, ok := strings.Cut(pair, "=")
		key = strings.TrimSpace(key)
		if !ok {
			return nil, fmt.Errorf("%s: entry %d has no '=': use key=value,key=value", name, i+1)
		}
		if !httpguts.ValidHeaderFieldName(key) {
			return nil, fmt.Errorf("%s: entry %d: %q is not a header name", name, i+1, key)
		}
		val, err := url.PathUnescape(strings.TrimSpace(val))
		if err != nil {
			return nil, fmt.Errorf("%s: the value of %s is not URL-encoded (%%XX escapes)", name, key)
		}
		if !httpguts.ValidHeaderFieldValue(val) {
			return nil, fmt.Errorf("%s: the value of %s holds a control character once decoded", name, key)
		}
		h.Add(key, val)
	}
	return h, nil
}

// checkSampler checks OTEL_TRACES_SAMPLER and its argument, which the SDK
// replaces by its default (parentbased_always_on) when it cannot read them.
func checkSampler(sampler, arg string) error {
	switch sampler {
	case "", "always_on", "always_off", "parentbased_always_on", "parentbased_always_off":
		return nil
	case "traceidratio", "parentbased_traceidratio":
		if arg == "" {
			return nil // the SDK's ratio 1
		}
		if r, err := strconv.ParseFloat(arg, 64); err != nil || r < 0 || r > 1 {
			return fmt.Errorf("OTEL_TRACES_SAMPLER_ARG=%q: use a ratio from 0 to 1", arg)
		}
		return nil
	}
	return fmt.Errorf("OTEL_TRACES_SAMPLER=%q: use always_on, always_off, traceidratio, parentbased_always_on (the default), parentbased_always_off or parentbased_traceidratio", sampler)
}
