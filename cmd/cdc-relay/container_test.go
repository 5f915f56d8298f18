package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestContainerVersion checks, without a Docker engine, that the container
// image README.md tells to build says the version `make build` stamps:
// .dockerignore keeps .git out of the build, so the version can only come
// from the VERSION build argument; every `docker build` and `docker compose
// up` that README.md, the Dockerfile and docker-compose.yml show passes it,
// computed as the Makefile computes VERSION; and the Dockerfile stamps it into
// main.version as the Makefile does.
func TestContainerVersion(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join("..", "..", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	makefile, dockerfile, ignore := read("Makefile"), read("Dockerfile"), read(".dockerignore")
	m := regexp.MustCompile(`(?m)^VERSION \?= \$\(shell (git describe[^|)]*?)\s*(2>|\|\||\))`).FindStringSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile's VERSION is not $(shell git describe …)")
	}
	describe := "$(" + m[1] + ")"
	if !regexp.MustCompile(`(?m)^\.git$`).MatchString(ignore) {
		t.Fatal(".dockerignore does not exclude .git: then the Dockerfile could read the version itself; update this test")
	}
	wantArg := "--build-arg VERSION=" + describe
	for _, f := range []struct{ name, text, cmd, want string }{
		{"README.md", read("README.md"), "docker build ", wantArg},
		{"Dockerfile", dockerfile, "docker build ", wantArg},
		{"README.md", read("README.md"), "docker compose up", "CDC_RELAY_VERSION=" + describe + " docker compose up"},
		{"docker-compose.yml", read("docker-compose.yml"), "docker compose up", "CDC_RELAY_VERSION=" + describe + " docker compose up"},
	} {
		n := 0
		for _, line := range strings.Split(f.text, "\n") {
			if !strings.Contains(line, f.cmd) {
				continue
			}
			n++
			if !strings.Contains(line, f.want) {
				t.Errorf("%s: %q lacks %q: the image would say version dev", f.name, strings.TrimSpace(line), f.want)
			}
		}
		if n == 0 {
			t.Errorf("%s shows no %q", f.name, f.cmd)
		}
	}
	if !strings.Contains(read("docker-compose.yml"), "VERSION: ${CDC_RELAY_VERSION") {
		t.Error("docker-compose.yml does not pass CDC_RELAY_VERSION as the VERSION build argument")
	}

	// The Dockerfile stamps the argument into this package's version, as
	// the Makefile does (a build here would take minutes: -trimpath
	// compiles every package afresh).
	if !regexp.MustCompile(`(?m)^ARG VERSION\b`).MatchString(dockerfile) ||
		!regexp.MustCompile(`go build .*-X main\.version=\$\{VERSION\}.* \./cmd/cdc-relay`).MatchString(dockerfile) {
		t.Error("the Dockerfile's go build does not stamp main.version from its VERSION argument")
	}
	if !strings.Contains(makefile, "-X main.version=$(VERSION)") {
		t.Error("the Makefile does not stamp main.version from VERSION")
	}
}
