package sandbox

import "crypto/x509"

// PGServerBinaries are the server binaries FindPGBin requires, for the
// external tests.
var PGServerBinaries = pgServerBinaries

// DefaultPartitions is how many partitions a topic gets when none are given.
const DefaultPartitions = defaultPartitions

// StartLocal starts a cluster from bin, never attaching to CDC_RELAY_TEST_PG_URL.
var StartLocal = startLocal

// CAPool is f's CA as a certificate pool.
func (f TLSFiles) CAPool() (*x509.CertPool, error) { return f.caPool() }
