package sink

// Pipes: produce requests pipelined on one connection per broker. Kafka
// handles a connection's requests one after another and answers them in
// order, so requests written back to back on one connection reach the log in
// the order they were written; kafka-go's Transport would instead give each
// concurrent request a connection of its own, and requests on different
// connections may overtake each other.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/segmentio/kafka-go/protocol"
)

// pipeIdle is how long a pipe with nothing in flight stays open: below
// Kafka's connections.max.idle.ms (10 minutes), so the broker does not close
// it under a request.
const pipeIdle = 5 * time.Minute

// errPipeClosed ends the requests a pipe never wrote when it closes.
var errPipeClosed = errors.New("produce connection closed")

// pipe is one connection to a broker carrying up to Config.MaxInFlight
// produce requests at a time. The dispatcher sends requests into it; every
// request comes back on done exactly once: answered, or with the error that
// ended it (unsent when it was never written).
type pipe struct {
	k      *Kafka
	broker int32
	done   chan<- *request
	queue  chan *request // to the writer; its capacity is the in-flight limit

	mu   sync.Mutex
	dead bool // send refuses: the dispatcher opens another pipe

	version  int16 // the Produce version the connection negotiated
	lastUsed time.Time
}

// openPipe starts a pipe to broker carrying first; limit bounds its
// requests in flight. first is queued before the pipe's connection is
// tried: a pipe whose connection fails at once (a broker down refuses it)
// hands it back with that error, where a send after the start could find
// the pipe retired already, and the request would never come back.
func (k *Kafka) openPipe(broker int32, limit int, done chan<- *request, first *request) *pipe {
	pp := &pipe{k: k, broker: broker, done: done, queue: make(chan *request, limit), lastUsed: time.Now()}
	pp.queue <- first
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		// The exchange holds one of the Transport's connections (dialled,
		// TLS, SASL and API versions done) for as long as the pipe lives.
		_, err := k.transport.RoundTrip(k.ctx, k.addr, &pipeExchange{pp})
		if err == nil {
			err = errPipeClosed
		}
		pp.retire(err)
	}()
	return pp
}

// send queues r on the pipe; false when the pipe is closing and r was not
// taken. It never blocks: the dispatcher keeps at most the queue's capacity
// in flight per broker.
func (pp *pipe) send(r *request) bool {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if pp.dead {
		return false
	}
	pp.lastUsed = time.Now()
	pp.queue <- r
	return true
}

// close retires the pipe once its queued requests are written and answered.
func (pp *pipe) close() {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if !pp.dead {
		pp.dead = true
		close(pp.queue)
	}
}

// idle reports whether the pipe has been unused for pipeIdle.
func (pp *pipe) idle(now time.Time) bool {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return !pp.dead && now.Sub(pp.lastUsed) > pipeIdle
}

// retire stops the pipe and hands back every request it has not written,
// unsent, with err.
func (pp *pipe) retire(err error) {
	pp.mu.Lock()
	if !pp.dead {
		pp.dead = true
		close(pp.queue)
	}
	pp.mu.Unlock()
	for r := range pp.queue {
		r.err, r.unsent = fmt.Errorf("produce to broker %d: %w", pp.broker, err), true
		pp.done <- r
	}
}

// pipeExchange runs a pipe on the connection kafka-go's Transport gives it
// (protocol.RawExchanger): the writer writes requests as they come, the
// reader reads their answers in the same order.
type pipeExchange struct{ pp *pipe }

// ApiKey is Produce's.
func (x *pipeExchange) ApiKey() protocol.ApiKey { return protocol.Produce }

// Broker routes the exchange to the pipe's broker.
func (x *pipeExchange) Broker(c protocol.Cluster) (protocol.Broker, error) {
	b, ok := c.Brokers[x.pp.broker]
	if !ok {
		return protocol.Broker{ID: -1}, &noRouteError{fmt.Errorf("broker %d is not in the cluster's metadata", x.pp.broker)}
	}
	return b, nil
}

// Required takes the Produce version the connection negotiated.
func (x *pipeExchange) Required(versions map[protocol.ApiKey]int16) bool {
	x.pp.version = min(versions[protocol.Produce], maxProduceVersion)
	return true
}

// deadliner is the connection's deadlines: the read deadline bounds each
// answer, the write deadline each request's writing.
type deadliner interface {
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// errWaitedTooLong ends a request that waited in the pipe's queue for the
// request timeout while earlier ones were being written: the connection does
// not take what is written to it.
var errWaitedTooLong = errors.New("produce request waited the request timeout to be written")

// RawExchange serves the pipe until its queue closes (idle, or the producer
// closing) or the connection fails. Every request taken from the queue is
// handed back on done: answered, or with the error that ended it. An error
// makes kafka-go close the connection.
//
// Every request fails at the request timeout from when it was sent, whether
// it is still being written or its answer is awaited: a broker that stops
// reading (wedged, or a network black hole) fills the socket buffers and
// would otherwise block the writer for ever, with the reader waiting for an
// answer to a request never written.
func (x *pipeExchange) RawExchange(rw io.ReadWriter) (protocol.Message, error) {
	pp := x.pp
	d, _ := rw.(deadliner)
	written := make(chan *request, cap(pp.queue))
	var (
		brokenMu sync.Mutex            // orders the reader's failure and the writer's next write
		broken   = make(chan struct{}) // the reader failed
	)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		var rerr error
		for r := range written {
			if rerr == nil {
				rerr = pp.answer(rw, r)
				if rerr != nil {
					brokenMu.Lock()
					close(broken)
					if d != nil {
						// Ends a write blocked on a connection that no longer
						// answers.
						_ = d.SetWriteDeadline(time.Now())
					}
					brokenMu.Unlock()
				}
			}
			if rerr != nil {
				r.err = rerr
			}
			pp.done <- r
		}
	}()
	var werr error
	defer func() {
		close(written)
		<-readerDone
		if d != nil && werr == nil {
			// The connection goes back to kafka-go's pool.
			_ = d.SetReadDeadline(time.Time{})
			_ = d.SetWriteDeadline(time.Time{})
		}
	}()
	for werr == nil {
		select {
		case r, ok := <-pp.queue:
			if !ok {
				return nil, nil
			}
			werr = pp.write(rw, d, r, &brokenMu, broken)
			if werr == nil {
				written <- r
			}
		case <-broken:
			werr = errors.New("produce connection broken")
		case <-pp.k.ctx.Done():
			werr = pp.k.ctx.Err()
		}
	}
	pp.mu.Lock()
	if !pp.dead {
		pp.dead = true
		close(pp.queue)
	}
	pp.mu.Unlock()
	return nil, werr
}

// write writes r within the request timeout from when r was sent. On an
// error r has been handed back on done: unsent when nothing of it was
// written, else of unknown fate; the connection is then of no further use.
func (pp *pipe) write(rw io.ReadWriter, d deadliner, r *request, brokenMu *sync.Mutex, broken <-chan struct{}) error {
	deadline := r.start.Add(pp.k.cfg.RequestTimeout)
	brokenMu.Lock()
	var err error
	select {
	case <-broken:
		err = errors.New("produce connection broken")
	default:
		if !time.Now().Before(deadline) {
			err = fmt.Errorf("%w (%v)", errWaitedTooLong, pp.k.cfg.RequestTimeout)
		} else if d != nil {
			if derr := d.SetWriteDeadline(deadline); derr != nil {
				err = fmt.Errorf("set write deadline: %w", derr)
			}
		}
	}
	brokenMu.Unlock()
	if err != nil {
		pp.k.dropIdle(err)
		r.err, r.unsent = fmt.Errorf("produce to broker %d: %w", pp.broker, err), true
		pp.done <- r
		return err
	}
	if err := r.x.write(rw, pp.version); err != nil {
		// Part of it may have been written: its fate is unknown.
		pp.k.dropIdle(err)
		r.err = fmt.Errorf("produce to broker %d: %w", pp.broker, err)
		pp.done <- r
		return err
	}
	return nil
}

// answer reads r's answer, within the request timeout from when r was sent.
func (pp *pipe) answer(rw io.ReadWriter, r *request) error {
	if d, ok := rw.(deadliner); ok {
		if err := d.SetReadDeadline(r.start.Add(pp.k.cfg.RequestTimeout)); err != nil {
			return fmt.Errorf("produce to broker %d: set read deadline: %w", pp.broker, err)
		}
	}
	res, err := r.x.read(rw)
	if err != nil {
		pp.k.dropIdle(err)
		return fmt.Errorf("produce to broker %d: %w", pp.broker, err)
	}
	r.res = res
	return nil
}

// dropIdle closes the Transport's idle connections when err says a
// connection did not answer within the request timeout. A broker that stops
// reading the connections open at some moment (its network thread hung on
// them, a black-holed route) still serves new ones; kafka-go hands out idle
// connections first, so each one opened before the hang would cost the next
// request or pipe a request timeout of its own (TestBrokerHangsOnOpenConnections:
// 11 hung connections, 9.7 s to recover with a 1 s request timeout; the
// circuit stayed open 26 s in chaos seed 4247's run with 5 s). Dropping
// them makes the next requests dial anew. A refused or reset connection
// needs nothing: the idle ones fail at once.
func (k *Kafka) dropIdle(err error) {
	if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, errWaitedTooLong) {
		return
	}
	k.transport.CloseIdleConnections()
	k.log.Debug().Err(err).Msg("a Kafka connection did not answer within the request timeout: closed the idle connections, the next requests dial new ones")
}

var _ protocol.RawExchanger = (*pipeExchange)(nil)
