//go:build !unix

package sandbox

import "os/exec"

// serverUser is the OS identity initdb and pg_ctl run as; on this platform it
// is always the current user, represented by nil.
type serverUser struct{}

// lookupServerUser returns nil: the current user runs PostgreSQL.
func lookupServerUser() (*serverUser, error) { return nil, nil }

// apply does nothing: commands run as the current user.
func (u *serverUser) apply(*exec.Cmd) {}

// chown does nothing: files already belong to the current user.
func (u *serverUser) chown(string) error { return nil }
