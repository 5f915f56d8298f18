package tracing

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io/fs"
	"math/big"
	"strings"
	"testing"
	"time"
)

// TestReadEnv checks what the exporter reads from the OTEL_* variables:
// where spans go and how, and the values refused with the variable's name.
func TestReadEnv(t *testing.T) {
	cert, key := selfSigned(t)
	otherCert, otherKey := selfSigned(t)
	files := map[string][]byte{"/ca.pem": cert, "/client.pem": cert, "/client.key": key, "/empty.pem": nil,
		"/other.pem": otherCert, "/other.key": otherKey}
	readFile := func(name string) ([]byte, error) {
		if b, ok := files[name]; ok {
			return b, nil
		}
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	for _, tc := range []struct {
		name     string
		env      map[string]string
		endpoint string            // as logged
		url      string            // as requested, when not the endpoint
		headers  map[string]string // nil: not checked
		gzip     bool
		timeout  time.Duration // 0: the default
		ca       []byte        // the CA pool's one certificate; nil: the system's
		client   []byte        // the client certificate; nil: none
		wantErr  []string      // substrings; nil: no error
		secret   string        // must not appear in the error
	}{
		{name: "defaults", endpoint: "http://localhost:4318/v1/traces", headers: map[string]string{}},
		{name: "base endpoint gets /v1/traces",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
			endpoint: "http://collector:4318/v1/traces"},
		{name: "base endpoint with a path",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otlp.example.com/otel/"},
			endpoint: "https://otlp.example.com/otel/v1/traces"},
		{name: "traces endpoint as it is, over the base",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:9999/ingest"},
			endpoint: "http://b:9999/ingest"},
		{name: "traces endpoint without a path",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:9999"},
			endpoint: "http://b:9999/"},
		{name: "credentials and query are requested, never shown",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://user:hunter2@collector:4318?token=hunter2"},
			endpoint: "https://collector:4318/v1/traces", url: "https://user:hunter2@collector:4318/v1/traces?token=hunter2"},
		{name: "insecure over https",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318", "OTEL_EXPORTER_OTLP_INSECURE": "TRUE"},
			endpoint: "http://collector:4318/v1/traces"},
		{name: "traces insecure wins",
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_INSECURE": "true",
				"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "false"},
			endpoint: "https://collector:4318/v1/traces"},
		{name: "host without a scheme, insecure: plain http",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318", "OTEL_EXPORTER_OTLP_INSECURE": "true"},
			endpoint: "http://collector:4318/v1/traces"},
		{name: "host without a scheme, not insecure: https",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4318/ingest", "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "false"},
			endpoint: "https://collector:4318/ingest"},
		{name: "explicit http/protobuf", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
			endpoint: "http://localhost:4318/v1/traces"},
		{name: "everything valid", env: map[string]string{
			"OTEL_EXPORTER_OTLP_HEADERS": "api-key=s%20e,x-tenant=7", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
			"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/ca.pem", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/client.pem",
			"OTEL_EXPORTER_OTLP_CLIENT_KEY": "/client.key", "OTEL_TRACES_SAMPLER": "ParentBased_TraceIdRatio", "OTEL_TRACES_SAMPLER_ARG": "0.25",
		}, endpoint: "http://localhost:4318/v1/traces", headers: map[string]string{"Api-Key": "s e", "X-Tenant": "7"},
			gzip: true, timeout: 2500 * time.Millisecond, ca: cert, client: cert},
		{name: "traces variables win", env: map[string]string{
			"OTEL_EXPORTER_OTLP_HEADERS": "api-key=general", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": " authorization = Bearer%20t%2Cu ",
			"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "none",
			"OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "0",
			"OTEL_EXPORTER_OTLP_CERTIFICATE": "/ca.pem", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": "/other.pem",
			"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/client.pem", "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/client.key",
			"OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": "/other.pem", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": "/other.key",
		}, endpoint: "http://localhost:4318/v1/traces", headers: map[string]string{"Authorization": "Bearer t,u"},
			timeout: -1, ca: otherCert, client: otherCert},

		{name: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			wantErr: []string{`OTEL_EXPORTER_OTLP_PROTOCOL="grpc"`, "cdc-relay exports OTLP over HTTP with protobuf", "4318"}},
		{name: "http/json", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
			wantErr: []string{`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/json"`, "cdc-relay exports OTLP over HTTP with protobuf"}},
		{name: "traces protocol wins", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"}},
		{name: "unknown protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "thrift", "http/protobuf"}},
		{name: "endpoint without a scheme", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "no scheme", "http://collector:4318", "OTEL_EXPORTER_OTLP_INSECURE"}},
		{name: "endpoint of another scheme", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "grpc://collector:4317"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "not an http:// or https:// URL"}},
		{name: "endpoint that does not parse, password hidden", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://u:hunter2@[::1"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "REDACTED"}, secret: "hunter2"},
		{name: "endpoint without a scheme, password hidden", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "u:hunter2@collector"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "REDACTED"}, secret: "hunter2"},
		{name: "insecure not a boolean", env: map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "yes"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_INSECURE", "true or false"}},
		{name: "header without =, value not shown", env: map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cret,Bearer s3cret"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_HEADERS", "entry 2"}, secret: "s3cret"},
		{name: "header value not URL-encoded, value not shown", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "api-key=s3cret%zz"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS", "api-key", "URL-encoded"}, secret: "s3cret"},
		{name: "header value with a line break once decoded, value not shown", env: map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cret%0D%0AX-Evil:%201"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_HEADERS", "api-key", "control character"}, secret: "s3cret"},
		{name: "general headers checked though the traces ones win", env: map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a b=c", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "a=b"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_HEADERS", "not a header name"}},
		{name: "compression", env: map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_COMPRESSION", "gzip or none"}},
		{name: "timeout with a unit", env: map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_TIMEOUT", "milliseconds"}},
		{name: "queue size negative", env: map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "-1"},
			wantErr: []string{"OTEL_BSP_MAX_QUEUE_SIZE"}},
		{name: "CA file missing", env: map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nope.pem"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_CERTIFICATE", "/nope.pem"}},
		{name: "CA file without a certificate", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": "/empty.pem"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "no PEM certificate"}},
		{name: "client certificate without key", env: map[string]string{"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/client.pem"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_KEY", "both or neither"}},
		{name: "client key is not the certificate's", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": "/client.pem", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": "/ca.pem"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY"}},
		{name: "sampler", env: map[string]string{"OTEL_TRACES_SAMPLER": "jaeger_remote"},
			wantErr: []string{"OTEL_TRACES_SAMPLER", "parentbased_always_on"}},
		{name: "sampler ratio", env: map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
			wantErr: []string{"OTEL_TRACES_SAMPLER_ARG", "0 to 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := readEnv(func(k string) string { return tc.env[k] }, readFile)
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("accepted, want an error with %q", tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				if tc.secret != "" && strings.Contains(err.Error(), tc.secret) {
					t.Errorf("error %q shows the secret %q", err, tc.secret)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.endpoint != tc.endpoint {
				t.Errorf("endpoint %q, want %q", d.endpoint, tc.endpoint)
			}
			wantURL := tc.url
			if wantURL == "" {
				wantURL = tc.endpoint
			}
			if d.url != wantURL {
				t.Errorf("request URL %q, want %q", d.url, wantURL)
			}
			if d.protocol != protoHTTPProtobuf {
				t.Errorf("protocol %q, want %q", d.protocol, protoHTTPProtobuf)
			}
			if tc.headers != nil {
				got := map[string]string{}
				for k := range d.headers {
					got[k] = d.headers.Get(k)
				}
				if fmt.Sprint(got) != fmt.Sprint(tc.headers) {
					t.Errorf("headers %v, want %v", got, tc.headers)
				}
			}
			if d.gzip != tc.gzip {
				t.Errorf("gzip %v, want %v", d.gzip, tc.gzip)
			}
			wantTimeout := tc.timeout
			switch wantTimeout {
			case 0:
				wantTimeout = defaultTimeout
			case -1:
				wantTimeout = 0
			}
			if d.timeout != wantTimeout {
				t.Errorf("timeout %v, want %v", d.timeout, wantTimeout)
			}
			if tc.ca == nil && d.tls.RootCAs != nil {
				t.Error("a CA pool, want the system's")
			}
			if tc.ca != nil && (d.tls.RootCAs == nil || !d.tls.RootCAs.Equal(pool(t, tc.ca))) {
				t.Error("the CA pool is not the one of the winning variable")
			}
			if tc.client == nil && len(d.tls.Certificates) != 0 {
				t.Error("a client certificate, want none")
			}
			if tc.client != nil && (len(d.tls.Certificates) != 1 || !bytes.Equal(d.tls.Certificates[0].Certificate[0], der(t, tc.client))) {
				t.Error("the client certificate is not the one of the winning variables")
			}
		})
	}
}

// pool is a certificate pool of the PEM certificate.
func pool(t *testing.T, certPEM []byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(certPEM) {
		t.Fatal("no certificate")
	}
	return p
}

// der is the DER form of the PEM certificate.
func der(t *testing.T, certPEM []byte) []byte {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	if b == nil {
		t.Fatal("no PEM block")
	}
	return b.Bytes
}

// selfSigned returns a PEM certificate and its PEM key.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cdc-relay test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}
