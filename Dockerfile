# Tollgate container image: the gateway plus the demo upstream (examples/upstream.rs), so
# docker-compose.yaml runs both from one build.
#
#   docker build -t tollgate .
#   docker run -p 8080:8080 -p 9090:9090 -v $PWD/my.toml:/etc/tollgate/gateway.toml:ro tollgate

# ---- build ------------------------------------------------------------------------------------
# The gateway is built with the `dist` profile (fat LTO, one codegen unit: Cargo.toml), the demo
# upstream with plain `--release`.
FROM rust:1-bookworm AS builder
WORKDIR /src

# Dependencies first, against stub sources, so this layer is rebuilt only when Cargo.toml or
# Cargo.lock change. (Building an example also builds the dev-dependencies it may use.)
# The workspace: the gateway and its limiting core (limit/, crate tollgate-limit).
COPY Cargo.toml Cargo.lock ./
COPY limit/Cargo.toml ./limit/
RUN mkdir -p src examples limit/src \
 && echo 'fn main() {}' > src/main.rs \
 && : > src/lib.rs \
 && : > limit/src/lib.rs \
 && echo 'fn main() {}' > examples/upstream.rs \
 && cargo build --profile dist --locked --bin tollgate \
 && cargo build --release --locked --example upstream \
 && rm -rf src examples limit/src

COPY limit/src ./limit/src
COPY src ./src
COPY examples ./examples
# COPY keeps the files' own mtimes, which can be older than the stub build: touch them so cargo
# rebuilds the real crate instead of keeping the stubs.
# The gateway on its own: building an example in the same command would turn on the crate's
# test-only `test-clock` feature (through its dev-dependency on itself) in the gateway too.
RUN find src examples limit/src -name '*.rs' -exec touch {} + \
 && cargo build --profile dist --locked --bin tollgate \
 && cargo build --release --locked --example upstream \
 && cp target/dist/tollgate target/release/examples/upstream /usr/local/bin/

# ---- run --------------------------------------------------------------------------------------
FROM debian:bookworm-slim

# ca-certificates for https:// upstreams and rediss://. No curl: the HEALTHCHECK is
# `tollgate health`, which reads the config to find the admin port.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system tollgate \
 && useradd --system --gid tollgate --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin tollgate

COPY --from=builder /usr/local/bin/tollgate /usr/local/bin/upstream /usr/local/bin/
# The default config: in-process store, admin on 0.0.0.0:9090 so Prometheus and a published
# port reach it. Mount your own over it; the HEALTHCHECK follows its admin.listen.
COPY examples/configs/single-instance.toml /etc/tollgate/gateway.toml

USER tollgate
# 8080: the proxy. 9090: admin (/metrics, /healthz, /readyz, POST /-/reload).
EXPOSE 8080 9090

# GET /healthz on the admin listener of the mounted config (0.0.0.0 and :: are asked on
# loopback), 2 s deadline; exit 0 on a 200.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["tollgate", "health", "--config", "/etc/tollgate/gateway.toml"]

ENTRYPOINT ["tollgate", "--config", "/etc/tollgate/gateway.toml"]
