package tracing

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io/fs"
	"math/big"
	"strings"
	"testing"
	"time"
)

// TestCheckEnv checks what the relay reads from the OTEL_* variables: where
// spans go (as the exporters resolve it), and the values the exporters would
// ignore or misread without a word, refused with the variable's name.
func TestCheckEnv(t *testing.T) {
	cert, key := selfSigned(t)
	files := map[string][]byte{"/ca.pem": cert, "/client.pem": cert, "/client.key": key, "/empty.pem": nil}
	readFile := func(name string) ([]byte, error) {
		if b, ok := files[name]; ok {
			return b, nil
		}
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	for _, tc := range []struct {
		name     string
		env      map[string]string
		endpoint string
		protocol string
		wantErr  []string // substrings; nil: no error
		secret   string   // must not appear in the error
	}{
		{name: "defaults", endpoint: "https://localhost:4318/v1/traces", protocol: "http/protobuf"},
		{name: "base endpoint gets /v1/traces",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
			endpoint: "http://collector:4318/v1/traces", protocol: "http/protobuf"},
		{name: "base endpoint with a path",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otlp.example.com/otel/"},
			endpoint: "https://otlp.example.com/otel/v1/traces"},
		{name: "traces endpoint as it is, over the base",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:9999/ingest"},
			endpoint: "http://b:9999/ingest"},
		{name: "traces endpoint without a path",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:9999"},
			endpoint: "http://b:9999/"},
		{name: "credentials and query are never shown",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://user:hunter2@collector:4318?token=hunter2"},
			endpoint: "https://collector:4318/v1/traces"},
		{name: "insecure over https",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318", "OTEL_EXPORTER_OTLP_INSECURE": "TRUE"},
			endpoint: "http://collector:4318/v1/traces"},
		{name: "traces insecure wins",
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_INSECURE": "true",
				"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "false"},
			endpoint: "https://collector:4318/v1/traces"},
		{name: "grpc default", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			endpoint: "https://localhost:4317", protocol: "grpc"},
		{name: "grpc takes the host only",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317/ignored"},
			endpoint: "http://collector:4317", protocol: "grpc"},
		{name: "traces protocol wins",
			env:      map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
			endpoint: "https://localhost:4318/v1/traces", protocol: "http/json"},
		{name: "everything valid", env: map[string]string{
			"OTEL_EXPORTER_OTLP_HEADERS": "api-key=s%20e,x-tenant=7", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": " authorization = Bearer%20t ",
			"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_BSP_SCHEDULE_DELAY": "200",
			"OTEL_EXPORTER_OTLP_CERTIFICATE": "/ca.pem", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/client.pem",
			"OTEL_EXPORTER_OTLP_CLIENT_KEY": "/client.key", "OTEL_TRACES_SAMPLER": "ParentBased_TraceIdRatio", "OTEL_TRACES_SAMPLER_ARG": "0.25",
		}, endpoint: "https://localhost:4318/v1/traces"},

		{name: "unknown protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "thrift", "http/protobuf"}},
		{name: "endpoint without a scheme", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "not an http:// or https:// URL"}},
		{name: "endpoint that does not parse, password hidden", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://u:hunter2@[::1"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "REDACTED"}, secret: "hunter2"},
		{name: "insecure not a boolean", env: map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "yes"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_INSECURE", "true or false"}},
		{name: "header without =, value not shown", env: map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cret,Bearer s3cret"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_HEADERS", "entry 2"}, secret: "s3cret"},
		{name: "header value not URL-encoded, value not shown", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "api-key=s3cret%zz"},
			wantErr: []string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS", "api-key", "URL-encoded"}, secret: "s3cret"},
		{name: "bad header name", env: map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a b=c"},
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
			d, err := checkEnv(func(k string) string { return tc.env[k] }, readFile)
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
			if want := tc.protocol; want != "" && d.protocol != want {
				t.Errorf("protocol %q, want %q", d.protocol, want)
			}
		})
	}
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
