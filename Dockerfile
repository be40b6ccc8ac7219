# syntax=docker/dockerfile:1
# Build: docker build -t tessel-kafka .
FROM rust:1-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends \
      cmake pkg-config libssl-dev libsasl2-dev libzstd-dev libcurl4-openssl-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# Line tables stay in the release profile for local profiling; the image does not need them.
RUN cargo build --release --locked --bin tessel-kafka \
    && strip --strip-debug target/release/tessel-kafka

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
      ca-certificates libssl3 libsasl2-2 libzstd1 libcurl4 curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home tessel
COPY --from=build /src/target/release/tessel-kafka /usr/local/bin/tessel-kafka
USER 10001
EXPOSE 9464
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s CMD curl -fsS http://127.0.0.1:9464/healthz || exit 1
ENTRYPOINT ["/usr/local/bin/tessel-kafka"]
CMD ["run", "--config", "/etc/tessel-kafka/config.toml"]
