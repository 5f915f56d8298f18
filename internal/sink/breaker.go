package sink

// The circuit breaker over produce requests.

// Circuit breaker states.
const (
	circuitClosed   = 0
	circuitOpen     = 1
	circuitHalfOpen = 2
)

// breaker updates the circuit after a request: ok means some partition of it
// was acknowledged; probing means a request (a retry, while open) is in flight.
func (k *Kafka) breaker(ok, probing bool) {
	prev := k.circuit.Load()
	next := prev
	switch {
	case ok:
		k.failedRun = 0
		next = circuitClosed
	default:
		k.failedRun++
		if k.failedRun >= k.cfg.BreakerThreshold {
			next = circuitOpen
		}
	}
	if next == circuitOpen && probing {
		next = circuitHalfOpen
	}
	if next == prev {
		return
	}
	k.circuitMu.Lock()
	k.circuit.Store(next)
	switch {
	case prev == circuitClosed:
		k.closing = make(chan struct{})
	case next == circuitClosed:
		close(k.closing)
		k.closing = nil
	}
	k.circuitMu.Unlock()
	k.cfg.Metrics.CircuitState.Set(float64(next))
	switch {
	case next == circuitClosed:
		k.log.Info().Msg("circuit closed: Kafka accepts events again; replication reading resumes")
	case prev == circuitClosed:
		k.log.Warn().Int("failed_requests", k.failedRun).Msg("circuit open: Kafka keeps failing; replication reading paused, retrying with backoff")
	}
}

// CircuitOpen reports whether the circuit breaker is open or half-open: Kafka
// failed BreakerThreshold requests in a row and has not accepted one since.
func (k *Kafka) CircuitOpen() bool { return k.circuit.Load() != circuitClosed }

// CircuitClosed returns nil while the circuit is closed, and otherwise a
// channel that is closed when it closes again.
func (k *Kafka) CircuitClosed() <-chan struct{} {
	if k.circuit.Load() == circuitClosed {
		return nil
	}
	k.circuitMu.Lock()
	defer k.circuitMu.Unlock()
	if k.closing == nil {
		return nil
	}
	return k.closing
}
