package testenv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
)

// NewPostgres is sandbox.StartPostgres for tests: it fails t on error, skips
// t when the external server of CDC_RELAY_TEST_PG_URL cannot honour opts,
// and closes the server when t ends.
func NewPostgres(t testing.TB, opts sandbox.PGOptions) *sandbox.Postgres {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	p, err := sandbox.StartPostgres(ctx, opts)
	if errors.Is(err, sandbox.ErrExternal) {
		t.Skipf("skip: %v", err)
	}
	if err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	t.Logf("postgres: %s", p.Describe())
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close postgres: %v", err)
		}
	})
	return p
}

// RequireLocal skips t unless p is a cluster sandbox started, for tests
// that stop, restart or reconfigure the server.
func RequireLocal(t testing.TB, p *sandbox.Postgres) {
	t.Helper()
	if p.External() {
		t.Skipf("skip: test needs a local PostgreSQL it can stop and restart, but %s points at an external server", sandbox.EnvPGURL)
	}
}

// NewKafka is sandbox.StartKafka for tests: it fails t on error and closes
// the broker when t ends.
func NewKafka(t testing.TB, opts sandbox.KafkaOptions) *sandbox.Kafka {
	t.Helper()
	k, err := sandbox.StartKafka(opts)
	if err != nil {
		t.Fatalf("start kafka: %v", err)
	}
	t.Cleanup(k.Close)
	return k
}

// RequireLocalKafka skips t unless k is a broker sandbox started, for tests
// that stop the broker or inject faults through Cluster.
func RequireLocalKafka(t testing.TB, k *sandbox.Kafka) {
	t.Helper()
	if k.External() {
		t.Skipf("skip: test needs a local kfake broker, but %s points at external brokers", sandbox.EnvKafkaBrokers)
	}
}

// MustReadAll is k.ReadAll for a test: it fails t when the records cannot be
// read within 30 s.
func MustReadAll(t testing.TB, k *sandbox.Kafka, topics ...string) []sandbox.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := k.ReadAll(ctx, topics...)
	if err != nil {
		t.Fatalf("read %v: %v", topics, err)
	}
	return recs
}
