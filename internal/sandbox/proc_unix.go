//go:build unix

package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
)

// serverUser is the OS identity initdb and pg_ctl run as. PostgreSQL refuses
// to run as root, so when we are root we switch to the "postgres" OS user.
// The nil *serverUser means "the current user" and its methods do nothing.
type serverUser struct {
	uid, gid uint32
}

// lookupServerUser returns nil when the current user may run PostgreSQL, and
// the "postgres" OS user when running as root.
func lookupServerUser() (*serverUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("look up OS user postgres (PostgreSQL refuses to run as root): %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parse uid %q of OS user postgres: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parse gid %q of OS user postgres: %w", u.Gid, err)
	}
	return &serverUser{uid: uint32(uid), gid: uint32(gid)}, nil
}

// apply makes cmd run as u.
func (u *serverUser) apply(cmd *exec.Cmd) {
	if u == nil {
		return
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid},
	}
}

// chown gives path to u.
func (u *serverUser) chown(path string) error {
	if u == nil {
		return nil
	}
	if err := os.Chown(path, int(u.uid), int(u.gid)); err != nil {
		return fmt.Errorf("chown %s to postgres: %w", path, err)
	}
	return nil
}
