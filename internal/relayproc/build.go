package relayproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// relayModule is the module whose ./cmd/cdc-relay Build builds.
const relayModule = "github.com/cdc-relay/cdc-relay"

// BuildOptions say how to build the relay binary.
type BuildOptions struct {
	// Version is stamped into the binary (-X main.version); "" leaves the
	// default.
	Version string
	// Race builds with the race detector (cgo, so gcc must be installed).
	Race bool
	// Release builds as the Dockerfile builds the shipped binary:
	// CGO_ENABLED=0, -trimpath, without symbol tables (-s -w). Not with Race.
	Release bool
}

// Build builds ./cmd/cdc-relay of the relay's module into dir and returns the
// binary's path. Call it once per process (TestMain, a tool's start): the
// packages come from Go's build cache, which CI warms with
// `go build -o /dev/null ./cmd/cdc-relay` (same flags, so the same cache
// entries), and only the link is done again. It builds in the relay's module
// directory, so the binary has the relay's dependency versions even when the
// caller is another module (bench/, chaos/) that requires it.
func Build(ctx context.Context, dir string, opts BuildOptions) (string, error) {
	if opts.Race && opts.Release {
		return "", errors.New("build cdc-relay: Race and Release exclude each other")
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", fmt.Errorf("build cdc-relay: %w", err)
	}
	gobin, err := exec.LookPath("go") // go test and go run put their toolchain first on PATH
	if err != nil {
		return "", fmt.Errorf("build cdc-relay: find the go command: %w", err)
	}
	bin := filepath.Join(dir, "cdc-relay")
	args := []string{"build", "-o", bin}
	ldflags := ""
	if opts.Version != "" {
		ldflags = "-X main.version=" + opts.Version
	}
	if opts.Race {
		args = append(args, "-race")
	}
	env := os.Environ()
	if opts.Release {
		args = append(args, "-trimpath")
		ldflags = strings.TrimSpace("-s -w " + ldflags)
		env = append(env, "CGO_ENABLED=0")
	}
	if ldflags != "" {
		args = append(args, "-ldflags", ldflags)
	}
	cmd := exec.CommandContext(ctx, gobin, append(args, "./cmd/cdc-relay")...)
	cmd.Dir = root
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build cdc-relay: %w\n%s", err, out)
	}
	return bin, nil
}

// ModuleRoot returns the relay module's directory: found from this source
// file (go test, go run) or else from the working directory upwards.
func ModuleRoot() (string, error) {
	var starts []string
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, dir := range starts {
		for {
			b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
			if err == nil && bytes.Contains(b, []byte("module "+relayModule+"\n")) {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", errors.New("find the relay's module directory: no go.mod of " + relayModule + " above this source file or the working directory")
}
