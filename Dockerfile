# syntax=docker/dockerfile:1
#
# fcd's image: authzd and fencecheck, static (CGO_ENABLED=0, -trimpath),
# on distroless static (CA certificates, tzdata, /etc/passwd with the
# nonroot user 65532), run as that user. docs/deploy.md says how to build
# and run it; deploy/dockerfile_test.go checks this file's rules.
#
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) -t fcd:0.1.0 .
#   docker run -v fcd-data:/var/lib/fcd -v ./fcd:/etc/fcd:ro -p 8080:8080 fcd:0.1.0
#
# Pin the bases by digest for a reproducible build:
#   --build-arg GO_IMAGE=docker.io/library/golang:1.26.8-bookworm@sha256:… --build-arg BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot@sha256:…
ARG GO_IMAGE=docker.io/library/golang:1.26.8-bookworm
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${GO_IMAGE} AS build
WORKDIR /src
# The modules first (go.work ties the server to fencecheck, client and
# host), so that a source change reuses the downloaded modules.
COPY go.work go.work.sum go.mod go.sum ./
COPY fencecheck/go.mod fencecheck/go.sum fencecheck/
COPY client/go.mod client/go.sum client/
COPY host/go.mod host/go.sum host/
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# The context holds no .git (.dockerignore): the version and revision come
# from the build arguments (internal/cli/version.go).
ARG VERSION=0.1.0-dev
ARG REVISION=unknown
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/fcd-authz/fcd/internal/cli.version=${VERSION} -X github.com/fcd-authz/fcd/internal/cli.revision=${REVISION}" \
      -o /out/bin/ ./cmd/authzd ./cmd/fencecheck \
 && /out/bin/authzd --version && /out/bin/fencecheck --version \
 && mkdir -p /out/data /out/config

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0-dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="fcd" \
      org.opencontainers.image.description="formation-consistent dispatch: authzd, the authorization server for MCP tool calls, and fencecheck, the backend's guard" \
      org.opencontainers.image.source="https://github.com/fcd-authz/fcd" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/bin/authzd /out/bin/fencecheck /usr/local/bin/
# The data directory (the embedded etcd member, the audit trail) belongs to
# the user authzd runs as; mount a volume there. /etc/fcd holds the
# configuration (authzd init's directory, or a Kubernetes Secret).
COPY --from=build --chown=65532:65532 /out/data /var/lib/fcd
COPY --from=build /out/config /etc/fcd
USER 65532:65532
WORKDIR /var/lib/fcd
VOLUME ["/var/lib/fcd"]
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/authzd"]
CMD ["serve", "--config", "/etc/fcd/authzd.yaml", "--data-dir", "/var/lib/fcd", "--listen", "0.0.0.0:8080"]
