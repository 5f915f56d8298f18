package sink

// TestVerifier is the Verifier this package's tests give the producers they
// open: internal/dedup's Decider, the relay's, set by verifier_test.go before
// any test runs. The tests of package sink cannot import dedup themselves
// (dedup imports sink), and must not match records with a rule of their own.
var TestVerifier Verifier

// PeakInFlight returns the most produce requests k had in flight to one
// broker at once.
func PeakInFlight(k *Kafka) int { return int(k.peakInFlight.Load()) }
