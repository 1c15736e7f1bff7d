#!/usr/bin/env bash
# bench/h3.sh — Tollgate's HTTP/3 beside its own HTTP/2 and HTTP/1.1 over TLS, on loopback: one
# route `/allow` (a gcra limit that always allows) to an nginx `return 200` upstream, `workers =
# 1` (the QUIC listener is one thread: so is the TCP side here, for CPU per request on equal
# terms). For each protocol: req/s of a closed-loop client and the gateway's CPU per request
# (utime + stime of /proc/PID/stat, in microseconds).
#
#   bench/h3.sh                      # PROFILE=release SECONDS_PER_RUN=5 ROUNDS=3
#
# Clients: bench/h3load.rs (quinn + h3; Debian's h2load has no HTTP/3) for HTTP/3, h2load for
# HTTP/2 and HTTP/1.1. Shapes: "streams" (1 connection, 64 requests in flight) and
# "connections" (64 connections, 1 request in flight each).
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE="${PROFILE:-release}"
SECS="${SECONDS_PER_RUN:-5}"
ROUNDS="${ROUNDS:-3}"
need() { command -v "$1" >/dev/null || { echo "bench/h3.sh: $1 is missing (apt-get install $2)" >&2; exit 1; }; }
need h2load nghttp2-client
need nginx nginx
need openssl openssl
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
URL="https://127.0.0.1:18443/allow"
ticks() { awk '{print $14 + $15}' "/proc/$GW/stat"; }
hz=$(getconf CLK_TCK)

run() { # protocol shape -> "rps requests"
  local proto=$1 shape=$2 c m out
  if [ "$shape" = streams ]; then c=1; m=64; else c=64; m=1; fi
  case "$proto" in
    h3) out=$("$LOAD" "$URL" "$c" "$m" "$SECS")
        echo "$out" | sed -n 's/.*requests=\([0-9]*\).*rps=\([0-9]*\).*/\2 \1/p' ;;
    h2|h1) local flag=""; [ "$proto" = h1 ] && flag="--h1"
        # h2load pipelines nothing on HTTP/1.1: -m is per connection streams on HTTP/2 only.
        [ "$proto" = h1 ] && { c=$((c * m)); m=1; }
        out=$(h2load $flag -D "$SECS" -c "$c" -m "$m" -t 1 "$URL" 2>/dev/null)
        local ok rps
        ok=$(echo "$out" | sed -n 's/^status codes: \([0-9]*\) 2xx.*/\1/p')
        rps=$(echo "$out" | sed -n 's/^finished in .*, \([0-9.]*\) req\/s.*/\1/p')
        echo "${rps%.*} $ok" ;;
  esac
}

printf '%-6s %-12s %10s %16s\n' proto shape "req/s" "CPU us/request"
for shape in streams connections; do
  for proto in h3 h2 h1; do
    for r in $(seq 1 "$ROUNDS"); do
      before=$(ticks)
      read -r rps n < <(run "$proto" "$shape")
      after=$(ticks)
      cpu_us=$(( (after - before) * 1000000 / hz / (n > 0 ? n : 1) ))
      printf '%-6s %-12s %10s %16s\n' "$proto" "$shape" "$rps" "$cpu_us"
    done
  done
done
