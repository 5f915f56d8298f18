# cdc-relay container image.
#
#   docker build --build-arg VERSION=$(git describe --always --dirty) -t cdc-relay .
#   docker run --rm -e CDC_RELAY_PG_URL=... -e CDC_RELAY_KAFKA_BROKERS=... \
#     -e CDC_RELAY_METRICS_ADDR=0.0.0.0:9187 -p 127.0.0.1:9187:9187 cdc-relay
#
# Stage 1 builds a static binary (no cgo) with the Go toolchain; stage 2 is a distroless
# image with no shell or package manager that runs it as the unprivileged "nonroot" user.
# The .git directory is not sent to the build (.dockerignore), so pass VERSION explicitly.

# Build on the builder's own platform and cross-compile for the target (fast multi-arch
# builds with buildx); TARGETOS/TARGETARCH are set by BuildKit.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src

# Dependencies first, so that this layer is reused while only sources change.
COPY go.mod go.sum ./
RUN go mod download

COPY . .
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /cdc-relay ./cmd/cdc-relay

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /cdc-relay /cdc-relay
USER nonroot:nonroot
# Prometheus metrics, /healthz and /readyz. The relay listens on 127.0.0.1:9187 by default,
# which in a container only the container (or its pod) reaches: set CDC_RELAY_METRICS_ADDR,
# e.g. to 0.0.0.0:9187, to scrape or probe it from outside, and preferably a token
# (CDC_RELAY_METRICS_TOKEN_FILE; see docs/operations.md, "Securing the HTTP endpoints").
EXPOSE 9187
ENTRYPOINT ["/cdc-relay"]
CMD ["run"]
