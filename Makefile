# cdc-relay developer tasks. Everything here is plain `go` underneath; CI runs .ci/run,
# which calls `make test`.

GO ?= go
# Version stamped into the binary (main.version): the git description of the work tree,
# or "dev" outside a git checkout / before the first commit.
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: build test demo bench lint check-migrations clean

# Build the relay into bin/cdc-relay.
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/cdc-relay ./cmd/cdc-relay

# All tests, with the race detector. Integration tests start their own PostgreSQL
# clusters (needs postgresql-15 installed; see .ci/run).
test:
	$(GO) test -race -count=1 -timeout 20m ./...

# End-to-end demo: Postgres -> relay -> Kafka, all local.
demo:
	$(GO) run ./cmd/cdc-relay-demo

# Throughput/latency benchmark: bare reader vs relay vs poller, in one run.
# Results go to bench/results/; e.g. `make bench BENCHFLAGS=-quick` for a smoke check.
bench:
	$(GO) run ./bench/cmd/bench $(BENCHFLAGS)

# Formatting (fails listing the files gofmt would change) and go vet.
lint:
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then \
		echo "gofmt needed on:"; echo "$$unformatted"; exit 1; \
	fi
	$(GO) vet ./...

# Apply migrations/*.sql twice to a throwaway PostgreSQL 15 cluster and check the
# cdc_relay role's privileges (see deploy/postgres/check-migrations.sh).
check-migrations:
	bash deploy/postgres/check-migrations.sh

# Build output and coverage files.
clean:
	rm -rf bin/ coverage.out coverage.html *.coverprofile
