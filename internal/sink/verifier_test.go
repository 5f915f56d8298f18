package sink_test

import (
	"github.com/cdc-relay/cdc-relay/internal/dedup"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

// The relay's Verifier for the tests of package sink (see TestVerifier).
func init() { sink.TestVerifier = dedup.Decider{} }
