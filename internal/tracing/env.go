package tracing

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"
)

// The OTLP exporter's variables, without the OTEL_EXPORTER_OTLP_ prefix;
// each also exists with TRACES_ after it, which wins.
const otlpPrefix = "OTEL_EXPORTER_OTLP_"

// destination is where and how spans are sent, as the exporter will read it
// from the environment.
type destination struct {
	endpoint string // scheme://host/path
	protocol string // http/protobuf or http/json
}

// Protocols of OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL: the OTLP/HTTP exporter
// (otlptracehttp) speaks the first two, the OTLP/gRPC one (otlptracegrpc)
// the third.
const (
	protoHTTPProtobuf = "http/protobuf"
	protoHTTPJSON     = "http/json"
	protoGRPC         = "grpc"
)

// checkEnv checks the OTEL_* variables the exporters and the SDK read, where
// they would silently ignore a bad value (a URL that does not parse, an
// unreadable certificate, a header without '=', an unknown protocol), and
// returns the destination they name. An error names the variable and never
// prints a header's value.
func checkEnv(getenv func(string) string, readFile func(string) ([]byte, error)) (destination, error) {
	get := func(name string) string { return strings.TrimSpace(getenv(name)) }
	// signal returns the TRACES_ variable when set, else the general one.
	signal := func(suffix string) (name, value string) {
		if v := get(otlpPrefix + "TRACES_" + suffix); v != "" {
			return otlpPrefix + "TRACES_" + suffix, v
		}
		return otlpPrefix + suffix, get(otlpPrefix + suffix)
	}

	d := destination{protocol: protoHTTPProtobuf}
	if name, v := signal("PROTOCOL"); v != "" {
		switch v {
		case protoHTTPProtobuf, protoHTTPJSON, protoGRPC:
			d.protocol = v
		default:
			return d, fmt.Errorf("%s=%q: use http/protobuf (the default), http/json or grpc", name, v)
		}
	}

	// The endpoint, as the exporters resolve it. OTLP/HTTP: the per-signal
	// URL as it is (path "/" when it has none), else the general one with
	// /v1/traces appended to its path, else https://localhost:4318/v1/traces.
	// OTLP/gRPC: the host of either (per-signal first), else localhost:4317.
	// The scheme decides TLS, unless an _INSECURE variable says otherwise.
	u := &url.URL{Scheme: "https", Host: "localhost:4318", Path: "/v1/traces"}
	if d.protocol == protoGRPC {
		u.Host = "localhost:4317"
	}
	if v := get(otlpPrefix + "ENDPOINT"); v != "" {
		base, err := endpointURL(otlpPrefix+"ENDPOINT", v)
		if err != nil {
			return d, err
		}
		u = base
		u.Path = path.Join(base.Path, "/v1/traces")
	}
	if v := get(otlpPrefix + "TRACES_ENDPOINT"); v != "" {
		full, err := endpointURL(otlpPrefix+"TRACES_ENDPOINT", v)
		if err != nil {
			return d, err
		}
		u = full
		if u.Path == "" {
			u.Path = "/"
		}
	}
	insecure := u.Scheme == "http"
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
		}
	}
	scheme := "https"
	if insecure {
		scheme = "http"
	}
	shown := &url.URL{Scheme: scheme, Host: u.Host, Path: u.Path}
	if d.protocol == protoGRPC {
		shown.Path = "" // the service's method names the path
	}
	d.endpoint = shown.String()

	for _, name := range []string{otlpPrefix + "HEADERS", otlpPrefix + "TRACES_HEADERS"} {
		if err := checkHeaders(name, get(name)); err != nil {
			return d, err
		}
	}
	for _, name := range []string{otlpPrefix + "COMPRESSION", otlpPrefix + "TRACES_COMPRESSION"} {
		if v := get(name); v != "" && v != "gzip" && v != "none" {
			return d, fmt.Errorf("%s=%q: use gzip or none", name, v)
		}
	}
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
	for _, name := range []string{otlpPrefix + "CERTIFICATE", otlpPrefix + "TRACES_CERTIFICATE"} {
		if file := get(name); file != "" {
			pem, err := readFile(file)
			if err != nil {
				return d, fmt.Errorf("%s: %w", name, err)
			}
			if !x509.NewCertPool().AppendCertsFromPEM(pem) {
				return d, fmt.Errorf("%s=%s: no PEM certificate in the file", name, file)
			}
		}
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
		if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
			return d, fmt.Errorf("%s and %s: %w", certName, keyName, err)
		}
	}
	if err := checkSampler(strings.ToLower(get("OTEL_TRACES_SAMPLER")), get("OTEL_TRACES_SAMPLER_ARG")); err != nil {
		return d, err
	}
	return d, nil
}

// endpointURL parses an endpoint variable: an http or https URL with a host.
func endpointURL(name, v string) (*url.URL, error) {
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

// checkHeaders checks a headers variable as the exporter reads it: key=value
// pairs separated by commas, keys HTTP tokens, values URL-encoded. Values
// are secrets (API keys) and are never printed.
func checkHeaders(name, v string) error {
	if v == "" {
		return nil
	}
	for i, pair := range strings.Split(v, ",") {
		key, val, ok := strings.Cut(pair, "=")
		key = strings.TrimSpace(key)
		if !ok {
			return fmt.Errorf("%s: entry %d has no '=': use key=value,key=value", name, i+1)
		}
		if !isToken(key) {
			return fmt.Errorf("%s: entry %d: %q is not a header name", name, i+1, key)
		}
		if _, err := url.PathUnescape(val); err != nil {
			return fmt.Errorf("%s: the value of %s is not URL-encoded (%%XX escapes)", name, key)
		}
	}
	return nil
}

// isToken reports whether s is an HTTP token (a header name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`()<>@,;:\"/[]?={}`, c) >= 0 {
			return false
		}
	}
	return true
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
