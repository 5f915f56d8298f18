// Package cpusplit splits a Go CPU profile of the relay by what the time was
// spent on: reading the replication stream, decoding, encoding and producing
// to Kafka, the checkpoint, the garbage collector and the rest. It answers
// the benchmark's question "what do encoding and producing cost", from the
// profile rather than by subtracting rates.
package cpusplit

import (
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"

	"github.com/google/pprof/profile"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/connectjson"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// Share is one part of the profile.
type Share struct {
	Part    string  // one of Parts
	Seconds float64 // CPU time
	Percent float64 // of the profile's total
}

// Parts are the parts a sample can belong to, in the order Split returns
// them.
var Parts = []string{"read", "decode", "encode+produce", "checkpoint+ack", "gc", "other"}

// owners map a function-name prefix to its part. A sample belongs to the part
// of the frame nearest its leaf that has an owner, so an allocation made while
// decoding is decoding's, and the garbage collector's own goroutines are "gc".
// The relay's own packages are named by a type each declares, so the import
// paths come from the compiler: a package that is moved or renamed breaks this
// build instead of silently moving its CPU time to "other".
var owners = []struct{ prefix, part string }{
	{pkgOf[replication.Coverage](), "read"},
	{"github.com/jackc/pglogrepl.", "read"},
	{"github.com/jackc/pgx/v5/pgconn.", "read"},
	{"github.com/jackc/pgx/v5/pgproto3.", "read"},
	{pkgOf[decoder.Decoder](), "decode"},
	{pkgOf[connectjson.Options](), "decode"},
	{pkgOf[route.Router](), "decode"},
	{pkgOf[sink.Kafka](), "encode+produce"},
	{"github.com/segmentio/kafka-go", "encode+produce"},
	{"github.com/klauspost/compress", "encode+produce"},
	{pkgOf[checkpoint.Tracker](), "checkpoint+ack"},
	{"runtime.gcBgMarkWorker", "gc"},
	{"runtime.gcAssistAlloc", "gc"},
	{"runtime.bgsweep", "gc"},
	{"runtime.bgscavenge", "gc"},
	{"runtime.markroot", "gc"},
	{"runtime.gcDrain", "gc"},
}

// pkgOf is the prefix of every function name in the package that declares T:
// its import path and a dot, as a profile names functions
// ("example.com/m/pkg.(*T).Method").
func pkgOf[T any]() string { return reflect.TypeFor[T]().PkgPath() + "." }

// Split reads a CPU profile (the pprof protobuf, gzipped or not) and returns
// the share of every part in Parts, and the profile's total CPU seconds.
func Split(r io.Reader) ([]Share, float64, error) {
	p, err := profile.Parse(r)
	if err != nil {
		return nil, 0, fmt.Errorf("parse CPU profile: %w", err)
	}
	idx := slices.IndexFunc(p.SampleType, func(t *profile.ValueType) bool { return t.Type == "cpu" })
	if idx < 0 {
		return nil, 0, fmt.Errorf("parse CPU profile: no cpu sample type (is it a CPU profile?)")
	}
	unit := 1e-9 // nanoseconds
	if u := p.SampleType[idx].Unit; u != "nanoseconds" {
		return nil, 0, fmt.Errorf("parse CPU profile: cpu unit %q, want nanoseconds", u)
	}
	byPart := map[string]float64{}
	total := 0.0
	for _, s := range p.Sample {
		v := float64(s.Value[idx]) * unit
		total += v
		byPart[partOf(s)] += v
	}
	out := make([]Share, 0, len(Parts))
	for _, part := range Parts {
		sh := Share{Part: part, Seconds: byPart[part]}
		if total > 0 {
			sh.Percent = 100 * sh.Seconds / total
		}
		out = append(out, sh)
	}
	return out, total, nil
}

// partOf is the part of the frame nearest the sample's leaf that has an
// owner; "other" when none has.
func partOf(s *profile.Sample) string {
	for _, loc := range s.Location { // leaf first
		for _, line := range loc.Line { // inlined frames: innermost first
			if line.Function == nil {
				continue
			}
			if part := ownerOf(line.Function.Name); part != "" {
				return part
			}
		}
	}
	return "other"
}

func ownerOf(fn string) string {
	for _, o := range owners {
		if strings.HasPrefix(fn, o.prefix) {
			return o.part
		}
	}
	return ""
}

// Format renders shares on one line: "read 12.0%, decode 8.1%, …".
func Format(shares []Share) string {
	parts := make([]string, 0, len(shares))
	for _, s := range shares {
		parts = append(parts, fmt.Sprintf("%s %.1f%%", s.Part, s.Percent))
	}
	return strings.Join(parts, ", ")
}
