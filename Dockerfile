# syntax=docker/dockerfile:1
# Tollgate container image: the gateway plus the demo upstream (examples/upstream.rs), so
# docker-compose.yaml runs both from one build.
#
#   docker build -t tollgate .
#   docker run -p 8080:8080 -p 9090:9090 -v $PWD/my.toml:/etc/tollgate/gateway.toml:ro tollgate

# ---- build ------------------------------------------------------------------------------------
FROM rust:1-bookworm AS builder
WORKDIR /src

# Dependencies first, against stub sources, so this layer is rebuilt only when Cargo.toml or
# Cargo.lock change. (Building an example also builds the dev-dependencies it may use.)
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src examples \
 && echo 'fn main() {}' > src/main.rs \
 && : > src/lib.rs \
 && echo 'fn main() {}' > examples/upstream.rs \
 && cargo build --release --locked --bin tollgate --example upstream \
 && rm -rf src examples

COPY src ./src
COPY examples ./examples
# COPY keeps the files' own mtimes, which can be older than the stub build: touch them so cargo
# rebuilds the real crate instead of keeping the stubs.
RUN find src examples -name '*.rs' -exec touch {} + \
 && cargo build --release --locked --bin tollgate --example upstream \
 && cp target/release/tollgate target/release/examples/upstream /usr/local/bin/

# ---- run --------------------------------------------------------------------------------------
FROM debian:bookworm-slim

# ca-certificates for https:// upstreams and rediss://; curl for the HEALTHCHECK.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system tollgate \
 && useradd --system --gid tollgate --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin tollgate

COPY --from=builder /usr/local/bin/tollgate /usr/local/bin/upstream /usr/local/bin/
# The default config: in-process store, admin on 0.0.0.0:9090 so the HEALTHCHECK and Prometheus
# reach it. Mount your own over it.
COPY examples/configs/single-instance.toml /etc/tollgate/gateway.toml

USER tollgate
# 8080: the proxy. 9090: admin (/metrics, /healthz, /readyz, POST /-/reload).
EXPOSE 8080 9090

HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["curl", "--fail", "--silent", "--show-error", "--output", "/dev/null", "http://127.0.0.1:9090/healthz"]

ENTRYPOINT ["tollgate", "--config", "/etc/tollgate/gateway.toml"]
