# cdc-relay developer tasks. Everything here is plain `go` underneath; CI runs .ci/run,
# which calls `make test`.

GO ?= go
# Version stamped into the binary (main.version): the git description of the work tree,
# or "dev" outside a git checkout / before the first commit.
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# staticcheck, installed into bin/ from the Go module proxy at this version.
STATICCHECK_VERSION ?= v0.8.2

# The benchmark (bench/) and the fault injector (chaos/) are Go modules of their own, so
# that their heavy libraries (charts, pprof, toxiproxy) stay out of the relay's go.mod;
# each replaces the relay with this repository's. test and lint cover all three modules.
TOOL_MODULES := bench chaos
# go test runs at most -p programs at once, compilers and test binaries alike, and -p
# defaults to the number of CPUs. Most of our test binaries wait (on Postgres, Kafka,
# the relay's processes) rather than compute, so on a 2-core machine two of them held
# both slots while the compiles and the other packages queued: at least 4.
TEST_PARALLEL ?= $(shell n=$$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1); [ "$$n" -ge 4 ] || n=4; echo $$n)
TESTFLAGS ?= -race -count=1 -timeout 20m -p $(TEST_PARALLEL)

.PHONY: build test test-relay test-pg-versions $(TOOL_MODULES:%=test-%) demo docs bench chaos lint vet staticcheck check-migrations clean

# Build the relay into bin/cdc-relay: static (no cgo), as the Dockerfile builds it.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/cdc-relay ./cmd/cdc-relay

# All tests, with the race detector. Integration tests start their own PostgreSQL
# clusters (needs postgresql-15 installed; see .ci/run). The three modules are tested
# at once (their tests mostly wait on Postgres, Kafka and the relay's processes); each
# module's results print as one block when its tests end (make test-relay streams).
test:
	@echo "make test: compiling every package and test of the relay, bench/ and chaos/ with -race, which prints nothing for a while on a cold build cache, then running them; each module's results print as a block when its tests end"
	@$(MAKE) --no-print-directory -j3 --output-sync=line test-relay $(TOOL_MODULES:%=test-%)

test-relay:
	$(GO) test $(TESTFLAGS) ./...

$(TOOL_MODULES:%=test-%): test-%:
	$(GO) -C $* test $(TESTFLAGS) ./...

# The Postgres-facing tests on every other supported major (13, 14, 16, 17, 18; `make
# test` is 15), with server binaries fetched once into a cache by .ci/pg-versions.
# PG_VERSIONS='13 17' narrows it; PG_MATRIX_JOBS=2 runs two majors at once.
# See docs/postgres.md#supported-versions.
PG_VERSIONS ?= 13 14 16 17 18
test-pg-versions:
	GO=$(GO) PG_VERSIONS='$(PG_VERSIONS)' TEST_PARALLEL=$(TEST_PARALLEL) bash .ci/pg-matrix

# End-to-end demo: Postgres -> relay -> Kafka, all local. Flags go in DEMOFLAGS, e.g.
# make demo DEMOFLAGS='-events 0' (insert your own rows; it prints the psql command).
# Built, then run, not `go run`: go run exits 1 when interrupted, whatever the program
# does, so Ctrl-C ended in "make: *** Error 1"; the demo itself exits 0 on Ctrl-C.
# bin/cdc-relay is built too, for the `cdc-relay status` line the demo prints.
demo:
	$(GO) build -o bin/cdc-relay-demo ./cmd/cdc-relay-demo
	$(GO) build -o bin/cdc-relay ./cmd/cdc-relay
	bin/cdc-relay-demo $(DEMOFLAGS)

# Regenerate the flag reference in docs/configuration.md from the command line's own
# flag definitions (internal/cli), by internal/clidoc; a test fails when it is stale.
docs:
	$(GO) run ./internal/clidoc/gendocs

# Throughput/latency benchmark over a matrix of cells: the limit reader (the relay's read
# path, producer discarding) vs the relay (effectively-once and at-least-once, alternating)
# vs the poller, the walsender's CPU, steady loads and start-up after kill -9. Results go to
# bench/results/; `make bench BENCHFLAGS=-quick` is a smoke check (under two minutes),
# `BENCHFLAGS='-cell drain/txn=1'` one cell alone (-list-cells names them).
# The benchmark is a module of its own (bench/go.mod), so its chart and profile
# libraries stay out of the relay's; it is built, then run from here so that path flags
# (-chart-only, -profile, -relay-bin) are relative to the repository root as before.
bench:
	$(GO) -C bench build -o ../bin/bench ./cmd/bench
	bin/bench $(BENCHFLAGS)

# Fault injection: the built relay under SIGKILLs, Postgres restarts, network faults
# (toxiproxy) and broker faults (kfake); prints faults, committed, lost, duplicated and
# order violations per scenario and fails on any loss, order violation or duplicate the
# scenario gives no reason for (effectively-once is the default). Flags, e.g.
# `make chaos CHAOSFLAGS='-only sigkill -kills 50'`; `-list` names the scenarios.
# A module of its own too (chaos/go.mod: toxiproxy stays out of the relay's).
chaos:
	$(GO) -C chaos build -o ../bin/cdc-relay-chaos ./cmd/cdc-relay-chaos
	bin/cdc-relay-chaos $(CHAOSFLAGS)

# Formatting (fails listing the files gofmt would change), go vet and staticcheck.
lint:
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then \
		echo "gofmt needed on:"; echo "$$unformatted"; exit 1; \
	fi
	$(MAKE) --no-print-directory vet staticcheck

# Build flags of vet and staticcheck. Both type-check against compiled packages; given
# the flags the tests build with (CI: CHECKFLAGS=-race), they compile every package once
# for all three steps instead of once without -race and again with it.
CHECKFLAGS ?=

# go vet of every module.
vet:
	$(GO) vet $(CHECKFLAGS) ./...
	for m in $(TOOL_MODULES); do $(GO) -C $$m vet $(CHECKFLAGS) ./... || exit 1; done

# staticcheck with its default checks, of every module (CI runs this too). It is
# installed into bin/ from the Go module proxy, then run with CHECKFLAGS in GOFLAGS
# (which the go list it runs reads), so that the flags do not build staticcheck itself.
staticcheck:
	GOBIN=$(CURDIR)/bin $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	GOFLAGS="$(strip $(GOFLAGS) $(CHECKFLAGS))" bin/staticcheck ./...
	for m in $(TOOL_MODULES); do \
		(cd $$m && GOFLAGS="$(strip $(GOFLAGS) $(CHECKFLAGS))" ../bin/staticcheck ./...) || exit 1; \
	done

# Apply migrations/*.sql twice to a throwaway PostgreSQL 15 cluster and check the
# cdc_relay role's privileges (see deploy/postgres/check-migrations.sh).
check-migrations:
	bash deploy/postgres/check-migrations.sh

# Build output and coverage files.
clean:
	rm -rf bin/ coverage.out coverage.html *.coverprofile
