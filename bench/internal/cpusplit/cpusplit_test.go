package cpusplit

import (
	"bytes"
	"math"
	"reflect"
	"runtime"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
	"github.com/cdc-relay/cdc-relay/internal/connectjson"
	"github.com/cdc-relay/cdc-relay/internal/decoder"
	"github.com/cdc-relay/cdc-relay/internal/replication"
	"github.com/cdc-relay/cdc-relay/internal/route"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// TestSplit: each sample goes to the part of the owned frame nearest its
// leaf, inlined frames included, and the shares add up to the total.
func TestSplit(t *testing.T) {
	fns := map[string]*profile.Function{}
	fn := func(name string) *profile.Function {
		if f, ok := fns[name]; ok {
			return f
		}
		f := &profile.Function{ID: uint64(len(fns) + 1), Name: name}
		fns[name] = f
		return f
	}
	var locs []*profile.Location
	loc := func(names ...string) *profile.Location { // innermost first, as inlined
		l := &profile.Location{ID: uint64(len(locs) + 1)}
		for _, n := range names {
			l.Line = append(l.Line, profile.Line{Function: fn(n)})
		}
		locs = append(locs, l)
		return l
	}
	stack := func(frames ...*profile.Location) []*profile.Location { return frames }
	samples := []struct {
		stack []*profile.Location // leaf first
		ns    int64
		want  string
	}{
		{stack(loc("syscall.Syscall"), loc("github.com/jackc/pgx/v5/pgconn.(*PgConn).ReceiveMessage"), loc("github.com/cdc-relay/cdc-relay/internal/relay.(*Relay).run")), 3e9, "read"},
		{stack(loc("runtime.mallocgc"), loc("github.com/cdc-relay/cdc-relay/internal/decoder.(*Decoder).Decode")), 2e9, "decode"},
		{stack(loc("runtime.memmove", "github.com/segmentio/kafka-go/protocol.(*encoder).Write"), loc("main.main")), 1e9, "encode+produce"},
		{stack(loc("runtime.gcAssistAlloc"), loc("runtime.mallocgc"), loc("github.com/cdc-relay/cdc-relay/internal/sink.(*Kafka).Publish")), 1e9, "gc"},
		{stack(loc("runtime.scanobject"), loc("runtime.gcDrain"), loc("runtime.gcBgMarkWorker")), 2e9, "gc"},
		{stack(loc("github.com/cdc-relay/cdc-relay/internal/checkpoint.(*Tracker).Ack")), 5e8, "checkpoint+ack"},
		{stack(loc("runtime.futex"), loc("runtime.schedule")), 5e8, "other"},
	}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		Location:   locs,
	}
	for _, f := range fns {
		p.Function = append(p.Function, f)
	}
	want := map[string]float64{}
	for _, s := range samples {
		p.Sample = append(p.Sample, &profile.Sample{Location: s.stack, Value: []int64{1, s.ns}})
		want[s.want] += float64(s.ns) / 1e9
	}
	var buf bytes.Buffer
	if err := p.Write(&buf); err != nil {
		t.Fatal(err)
	}
	shares, total, err := Split(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if total != 10 {
		t.Errorf("total %v s, want 10", total)
	}
	if len(shares) != len(Parts) {
		t.Fatalf("%d shares, want %d", len(shares), len(Parts))
	}
	sum := 0.0
	for i, sh := range shares {
		if sh.Part != Parts[i] {
			t.Errorf("share %d is %q, want %q", i, sh.Part, Parts[i])
		}
		if math.Abs(sh.Seconds-want[sh.Part]) > 1e-9 {
			t.Errorf("%s: %v s, want %v", sh.Part, sh.Seconds, want[sh.Part])
		}
		sum += sh.Percent
	}
	if math.Abs(sum-100) > 1e-9 {
		t.Errorf("percentages add to %v", sum)
	}
}

// TestSplitNotCPU: a heap profile is refused, naming what is wrong.
func TestSplitNotCPU(t *testing.T) {
	p := &profile.Profile{SampleType: []*profile.ValueType{{Type: "alloc_space", Unit: "bytes"}}}
	var buf bytes.Buffer
	if err := p.Write(&buf); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Split(&buf); err == nil {
		t.Fatal("Split of a heap profile: no error")
	}
}

// TestOwnersNameRealFunctions: the relay's functions, named as the runtime (and
// so a CPU profile) names them, go to their part. It fails when an owner's
// package path no longer matches the functions it is meant to own.
func TestOwnersNameRealFunctions(t *testing.T) {
	for _, c := range []struct {
		fn   any
		want string
	}{
		{replication.ReadCoverage, "read"},
		{(*decoder.Decoder).Decode, "decode"},
		{connectjson.ParseEncoding, "decode"},
		{(*route.Router).Topic, "decode"},
		{(*sink.Kafka).Produce, "encode+produce"},
		{(*checkpoint.Tracker).Ack, "checkpoint+ack"},
	} {
		f := runtime.FuncForPC(reflect.ValueOf(c.fn).Pointer())
		if f == nil {
			t.Fatalf("no runtime name for %T", c.fn)
		}
		if got := ownerOf(f.Name()); got != c.want {
			t.Errorf("%s: part %q, want %q", f.Name(), got, c.want)
		}
	}
}
