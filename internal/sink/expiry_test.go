package sink

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"

	"github.com/cdc-relay/cdc-relay/internal/metrics"
)

// expiryModel drives one partition's dispatcher decisions (nextFlight,
// stamp, settle, drain) without a broker and checks each batch sent beside
// others against Kafka's rule for forgetting a producer (brokerExpires).
type expiryModel struct {
	t   *testing.T
	k   *Kafka
	p   *partition
	now time.Time
	// maxTs: the greatest record timestamp (Unix ms) of each batch sent, as
	// the broker reads it: the row's, else the batch's (when it was built).
	maxTs map[*flight]int64
	// last: maxTs of the last batch the broker appended; known: it appended one.
	last  int64
	known bool
	peak  int // the most batches in flight at once
	n     int // events queued so far
}

func newExpiryModel(t *testing.T, idle time.Duration) *expiryModel {
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	k := &Kafka{
		cfg:  Config{ProducerIdle: idle, BatchMaxEvents: 2, Metrics: metrics.New(prometheus.NewRegistry())},
		ctx:  ctx,
		sess: session{gen: 1, id: 7, epoch: 0},
		wake: make(chan struct{}, 1),
	}
	k.cfg.setDefaults()
	k.idempotent.Store(true)
	return &expiryModel{t: t, k: k, p: newPartition(k, "outbox.model", 0, 1), now: modelStart, maxTs: map[*flight]int64{}}
}

// modelStart is the model's clock when it starts.
var modelStart = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// rows queues one event per age: a record timestamp age before the model's
// clock, or none (the record then takes the batch's) for noTimestamp.
func (m *expiryModel) rows(ages ...time.Duration) {
	for _, age := range ages {
		ev := testEvent("agg-000", m.n, uint64(m.n))
		if age != noTimestamp {
			ev.Timestamp = m.now.Add(-age)
		}
		m.n++
		m.p.push(item{m: Message{Topic: m.p.topic, Event: ev}, done: func(Message, Stored, error) error { return nil }}, m.now.UnixNano())
	}
}

const noTimestamp = time.Duration(-1)

// send sends every batch the sink lets go now, as collect does, and fails
// the test for a batch sent beside others in flight to a broker that may
// have forgotten the producer before it arrives: if one of those others
// then failed, the broker would take this one first.
func (m *expiryModel) send() {
	limit := m.k.maxInFlight()
	for {
		var ahead []*flight
		for _, f := range m.p.out {
			if f.state == flying {
				ahead = append(ahead, f)
			}
		}
		f := m.k.nextFlight(m.p, m.now, 1<<20, limit)
		if f == nil {
			return
		}
		m.k.stamp(m.p, &f.b, m.now)
		f.state, f.start = flying, m.now
		m.k.updateSending(m.p, limit)
		ts := int64(0)
		for _, it := range f.b.items {
			t := m.now.UnixMilli()
			if !it.m.Event.Timestamp.IsZero() {
				t = it.m.Event.Timestamp.UnixMilli()
			}
			ts = max(ts, t)
		}
		m.maxTs[f] = ts
		m.peak = max(m.peak, len(ahead)+1)
		if len(ahead) == 0 {
			continue
		}
		// The broker's last batch before a failed one ahead: the last it
		// appended, or one ahead of that one.
		if !m.known {
			m.t.Errorf("at %v: a batch sent beside %d in flight to a broker that never appended one of the producer", m.at(), len(ahead))
			continue
		}
		lasts := []int64{m.last}
		for _, g := range ahead[:len(ahead)-1] {
			lasts = append(lasts, m.maxTs[g])
		}
		for _, l := range lasts {
			if brokerExpires(time.UnixMilli(l), m.now, m.k.cfg.ProducerIdle) {
				m.t.Errorf("at %v: a batch sent beside %d in flight while a batch the broker may have appended last has records of %v, %v old: it may have forgotten the producer",
					m.at(), len(ahead), time.UnixMilli(l).UTC().Format(time.TimeOnly), m.now.Sub(time.UnixMilli(l)))
				break
			}
		}
	}
}

// ack makes the broker append and acknowledge the first batch in flight, n
// times, each time sending what the sink then lets go.
func (m *expiryModel) ack(n int) {
	for ; n > 0; n-- {
		var f *flight
		for _, g := range m.p.out {
			if g.state == flying {
				f = g
				break
			}
		}
		if f == nil {
			m.t.Fatalf("at %v: no batch in flight to acknowledge", m.at())
		}
		res := &produceAPI.Response{Topics: []produceAPI.ResponseTopic{{Topic: m.p.topic,
			Partitions: []produceAPI.ResponsePartition{{Partition: int32(m.p.id), BaseOffset: int64(f.b.pf.seq)}}}}}
		var answers responseIndex
		answers.init(res)
		var refresh, ok bool
		m.k.settle(m.p, f, &request{parts: []*partition{m.p}, flights: []*flight{f}, res: res}, &answers, m.now, &refresh, &ok)
		m.k.drain(m.p)
		m.k.updateSending(m.p, m.k.maxInFlight())
		m.last, m.known = m.maxTs[f], true
		m.send()
	}
}

// at is how long the model has run, for messages.
func (m *expiryModel) at() time.Duration { return m.now.Sub(modelStart) }

// flying counts the batches in flight.
func (m *expiryModel) flying() int { return m.p.flying() }

// TestExpiryModel: schedules of rows, acknowledgements and clock steps,
// each batch the sink sends beside others checked against the broker's
// rule (brokerExpires, with producer.id.expiration.ms at ProducerIdle, the
// most the sink may assume). peak, when set, is how many batches must go
// in flight at once: where the broker cannot have forgotten the producer
// the sink keeps pipelining.
func TestExpiryModel(t *testing.T) {
	const idle = 10 * time.Second
	fresh := []time.Duration{0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	none := []time.Duration{noTimestamp, noTimestamp, noTimestamp, noTimestamp, noTimestamp, noTimestamp, noTimestamp, noTimestamp, noTimestamp, noTimestamp}
	old := func(age time.Duration) []time.Duration {
		a := make([]time.Duration, 10)
		for i := range a {
			a[i] = age - time.Duration(i)*time.Millisecond
		}
		return a
	}
	type step struct {
		wait time.Duration   // the clock moves on first
		rows []time.Duration // then these rows are queued (record ages) and sent
		ack  int             // then this many batches are acknowledged, one by one
	}
	tests := []struct {
		name  string
		steps []step
		peak  int
	}{
		{"rows without timestamps", []step{{rows: none[:2], ack: 1}, {rows: none, ack: 5}}, 5},
		{"fresh row timestamps", []step{{rows: fresh[:2], ack: 1}, {rows: fresh, ack: 5}}, 5},
		{"idle by the relay's clock", []step{{rows: none[:2], ack: 1}, {wait: idle, rows: none, ack: 5}}, 0},
		{"a backlog of old rows from the start", []step{{rows: old(2 * idle), ack: 5}}, 0},
		{"a replay of old rows after fresh ones", []step{{rows: fresh[:2], ack: 1}, {rows: old(2 * idle), ack: 5}}, 0},
		{"rows just under the bound", []step{{rows: old(idle / 2)[:2], ack: 1}, {rows: old(idle / 2), ack: 5}}, 5},
		{"fresh rows after old ones", []step{{rows: old(2 * idle)[:2], ack: 1}, {rows: fresh, ack: 5}}, 0},
		{"batches in flight outlive the bound", []step{{rows: none[:2], ack: 1}, {rows: none[:4]}, {wait: idle, rows: none[:4], ack: 4}}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newExpiryModel(t, idle)
			for i, s := range tt.steps {
				m.now = m.now.Add(s.wait)
				m.rows(s.rows...)
				m.send()
				m.ack(s.ack)
				if t.Failed() {
					t.Fatalf("step %d", i+1)
				}
			}
			if len(m.p.out) != 0 || m.p.hasQueued() {
				t.Errorf("%d batches not acknowledged, events queued: %v", len(m.p.out), m.p.hasQueued())
			}
			if tt.peak > 0 && m.peak != tt.peak {
				t.Errorf("at most %d batches in flight at once, want %d", m.peak, tt.peak)
			}
		})
	}
}

// TestExpiryModelRandom: random schedules of clock steps, rows of every age
// (none, fresh, under and over the bound) and acknowledgements, each batch
// sent beside others checked against the broker's rule as in
// TestExpiryModel.
func TestExpiryModelRandom(t *testing.T) {
	const idle = 10 * time.Second
	ages := []time.Duration{noTimestamp, 0, idle / 2, idle - time.Millisecond, idle, 2 * idle, 48 * time.Hour}
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 43))
		m := newExpiryModel(t, idle)
		for step := 0; step < 40 && !t.Failed(); step++ {
			m.now = m.now.Add(time.Duration(rng.Int64N(int64(2 * idle))))
			rows := make([]time.Duration, rng.IntN(7))
			for i := range rows {
				rows[i] = ages[rng.IntN(len(ages))]
			}
			m.rows(rows...)
			m.send()
			m.ack(rng.IntN(m.flying() + 1))
		}
		for m.flying() > 0 && !t.Failed() {
			m.ack(1)
		}
		if t.Failed() {
			t.Fatalf("seed %d", seed)
		}
		if len(m.p.out) != 0 || m.p.hasQueued() {
			t.Fatalf("seed %d: %d batches not acknowledged, events queued: %v", seed, len(m.p.out), m.p.hasQueued())
		}
	}
}
