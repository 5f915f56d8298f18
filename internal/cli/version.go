package cli

import (
	"fmt"
	"runtime"
)

// VersionCmd is "cdc-relay version".
type VersionCmd struct{}

// Run prints the version and the Go version it was built with.
func (VersionCmd) Run(env Env) error {
	fmt.Fprintf(env.Stdout, "cdc-relay %s (%s)\n", env.Version, runtime.Version())
	return nil
}
