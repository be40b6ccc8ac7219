# syntax=docker/dockerfile:1
# Build: docker build -t tessel-kafka:0.1.0 --build-arg VERSION=0.1.0 \
#          --build-arg REVISION=$(git rev-parse HEAD) --build-arg CREATED=$(date -u +%FT%TZ) .
# Debug info of the same build: docker build --target debuginfo --output type=local,dest=out .
#
# Base images are build arguments. Pin them by digest for a release, for example
#   --build-arg RUST_IMAGE=rust:1-bookworm@sha256:<digest>
#   --build-arg RUNTIME_IMAGE=debian:bookworm-slim@sha256:<digest>
# (the digests are the registry's current ones: `docker buildx imagetools inspect <image>`),
# so a rebuild of the same commit gets the same bases.
ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
# Where the runtime stage takes the binary from: the build stage, or `prebuilt`, a stripped
# binary built outside (scripts/image-test builds the release binary on the host and passes
# a context holding only it, with --build-arg BINARY_STAGE=prebuilt --target runtime; the
# build stage is then skipped).
ARG BINARY_STAGE=build

FROM ${RUST_IMAGE} AS build
RUN apt-get update && apt-get install -y --no-install-recommends \
      cmake pkg-config libssl-dev libsasl2-dev libzstd-dev libcurl4-openssl-dev zlib1g-dev binutils \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, in their own layer: it is rebuilt only when Cargo.toml or Cargo.lock
# change, not on every source edit. The stand-in sources only satisfy the manifest's targets.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src tests/it \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs tests/it/main.rs \
    && cargo build --release --locked --bin tessel-kafka \
    && rm -rf src target/release/tessel-kafka* target/release/deps/tessel_kafka-* \
       target/release/deps/libtessel_kafka-* target/release/.fingerprint/tessel-kafka-*
COPY src ./src
# The image gets a binary without debug sections (symbols stay, so panic backtraces name
# functions); its debug info (line tables) goes to a separate file, tied to the binary by
# a debug link and its GNU build id, for symbolising crash backtraces and profiles later.
# Measured (with aws-config): 173 MB as built, 34 MB in the image, 144 MB of debug info beside
# it; the image scripts/image-test builds on a bookworm-slim-like base is 126 MB.
RUN cargo build --release --locked --bin tessel-kafka \
    && cd target/release \
    && objcopy --only-keep-debug tessel-kafka tessel-kafka.debug \
    && objcopy --strip-debug --add-gnu-debuglink=tessel-kafka.debug tessel-kafka

# `--target debuginfo` exports only the debug file.
FROM scratch AS debuginfo
COPY --from=build /src/target/release/tessel-kafka.debug /

# A binary built outside the image (see BINARY_STAGE), at the build stage's path.
FROM scratch AS prebuilt
COPY tessel-kafka /src/target/release/tessel-kafka

FROM ${BINARY_STAGE} AS binary

FROM ${RUNTIME_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
# The repository URL, for org.opencontainers.image.source.
ARG SOURCE=
LABEL org.opencontainers.image.title="tessel-kafka" \
      org.opencontainers.image.description="Tessel's Kafka connector: consumes topics, decodes through a Schema Registry, starts workflow runs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="Tessel"
RUN apt-get update && apt-get install -y --no-install-recommends \
      ca-certificates libssl3 libsasl2-2 libzstd1 libcurl4 curl \
    && apt-get clean && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --no-create-home tessel
COPY --from=binary /src/target/release/tessel-kafka /usr/local/bin/tessel-kafka
# Numeric, so Kubernetes' runAsNonRoot can verify it (deploy/kubernetes runs as 10001 too).
USER 10001
EXPOSE 9464
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s CMD curl -fsS http://127.0.0.1:9464/healthz || exit 1
# SIGTERM drains runs in flight and commits (up to drain_timeout_ms); give `docker stop` and
# Kubernetes longer than that (docker-compose.yml sets stop_grace_period).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/tessel-kafka"]
CMD ["run", "--config", "/etc/tessel-kafka/config.toml"]
