# cdc-relay developer tasks. Everything here is plain `go` underneath; CI runs .ci/run,
# which calls `make test`.

GO ?= go
# Version stamped into the binary (main.version): the git description of the work tree,
# or "dev" outside a git checkout / before the first commit.
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# staticcheck, run from the Go module proxy at this version (no separate install).
STATICCHECK_VERSION ?= v0.8.2

.PHONY: build test demo docs bench chaos lint staticcheck check-migrations clean

# Build the relay into bin/cdc-relay: static (no cgo), as the Dockerfile builds it.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/cdc-relay ./cmd/cdc-relay

# All tests, with the race detector. Integration tests start their own PostgreSQL
# clusters (needs postgresql-15 installed; see .ci/run).
test:
	$(GO) test -race -count=1 -timeout 20m ./...

# End-to-end demo: Postgres -> relay -> Kafka, all local. Flags go in DEMOFLAGS, e.g.
# make demo DEMOFLAGS='-events 0' (insert your own rows; it prints the psql command).
demo:
	$(GO) run ./cmd/cdc-relay-demo $(DEMOFLAGS)

# Regenerate the flag reference in docs/configuration.md from the command line's own
# flag definitions (internal/cli); a test fails when it is stale.
docs:
	$(GO) run ./internal/cli/gendocs

# Throughput/latency benchmark over a matrix of cells: the limit reader (the relay's read
# path, producer discarding) vs the relay (effectively-once and at-least-once, alternating)
# vs the poller, the walsender's CPU, steady loads and start-up after kill -9. Results go to
# bench/results/; `make bench BENCHFLAGS=-quick` is a smoke check (under two minutes),
# `BENCHFLAGS='-cell drain/txn=1'` one cell alone (-list-cells names them).
bench:
	$(GO) run ./bench/cmd/bench $(BENCHFLAGS)

# Fault injection: the built relay under SIGKILLs, Postgres restarts, network faults
# (toxiproxy) and broker faults (kfake); prints faults, committed, lost, duplicated and
# order violations per scenario and fails on any loss, order violation or duplicate the
# scenario gives no reason for (effectively-once is the default). Flags, e.g.
# `make chaos CHAOSFLAGS='-only sigkill -kills 50'`; `-list` names the scenarios.
chaos:
	$(GO) run ./cmd/cdc-relay-chaos $(CHAOSFLAGS)

# Formatting (fails listing the files gofmt would change), go vet and staticcheck.
lint:
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then \
		echo "gofmt needed on:"; echo "$$unformatted"; exit 1; \
	fi
	$(GO) vet ./...
	$(MAKE) --no-print-directory staticcheck

# staticcheck with its default checks (CI runs this too).
staticcheck:
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

# Apply migrations/*.sql twice to a throwaway PostgreSQL 15 cluster and check the
# cdc_relay role's privileges (see deploy/postgres/check-migrations.sh).
check-migrations:
	bash deploy/postgres/check-migrations.sh

# Build output and coverage files.
clean:
	rm -rf bin/ coverage.out coverage.html *.coverprofile
