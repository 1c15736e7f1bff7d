#!/usr/bin/env bash
# bench/cache-hit.sh — the HTTP cache's hit path (#54): a cached 1 KiB response against the
# same route proxied, on Tollgate and on nginx's `proxy_cache`, on loopback only, bounded in
# time.
#
#   bash bench/cache-hit.sh                          # DURATION=5 ROUNDS=3 BODY_KB=1
#   DURATION=2 ROUNDS=1 bash bench/cache-hit.sh      # a quick check, < 30 s
#
# What it starts (free ports of 127.0.0.1, one temporary directory, all stopped on exit):
#   upstream   nginx, 1 worker, serving BODY_KB KiB with `Cache-Control: max-age=3600`
#   nginx      reverse proxy, 2 workers, keep-alive upstream: `/c/` with `proxy_cache` (a zone
#              in the temporary directory), `/p/` proxied
#   Tollgate   2 workers: route `/c` with `[routes.cache]`, route `/p` without; no limit
#              (target/release/tollgate, or TOLLGATE_BIN)
#
# For ROUNDS interleaved rounds, `wrk -t1 -cCONNECTIONS -dDURATION` against each path of each
# proxy (after one request that fills the caches). Reported, as medians: req/s and the proxy's
# CPU per request (utime + stime of /proc/PID/stat before and after; nginx: master + workers),
# and the hit ÷ proxied ratio of req/s.
#
# Environment: DURATION (s, default 5), ROUNDS (default 3), BODY_KB (default 1), CONNECTIONS
# (default 32), TOLLGATE_BIN (default target/release/tollgate).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
BODY_KB=${BODY_KB:-1}
CONNECTIONS=${CONNECTIONS:-32}
BIN=${TOLLGATE_BIN:-target/release/tollgate}
for tool in nginx wrk curl python3; do
  command -v "$tool" >/dev/null || { echo "bench/cache-hit.sh: needs $tool" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "bench/cache-hit.sh: no $BIN (cargo build --release, or TOLLGATE_BIN=...)" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-cache-hit.XXXXXX")
PIDS=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$TMP/up/nginx.pid" ] && kill "$(cat "$TMP/up/nginx.pid")" 2>/dev/null || true
  [ -f "$TMP/px/nginx.pid" ] && kill "$(cat "$TMP/px/nginx.pid")" 2>/dev/null || true
  sleep 0.2
  rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

die() { echo "cache-hit.sh: $*" >&2; exit 1; }
# shellcheck source=bench/ports.sh
source "$(dirname "${BASH_SOURCE[0]}")/ports.sh"
free_port UP; free_port NG; free_port TG; free_port TGA

mkdir -p "$TMP/up/www" "$TMP/px/cache"
python3 -c "import sys; sys.stdout.write('x' * ($BODY_KB * 1024))" > "$TMP/up/www/data.txt"
# nginx's workers run as another user when started as root: they must read the body and write
# the cache.
chmod -R a+rwX "$TMP"

common='daemon on; error_log stderr error; events { worker_connections 4096; }'
cat > "$TMP/up/nginx.conf" <<NGX
worker_processes 1; pid $TMP/up/nginx.pid; $common
http { access_log off; default_type text/plain;
  server { listen 127.0.0.1:$UP; root $TMP/up/www;
    location / { add_header Cache-Control "max-age=3600"; } } }
NGX
cat > "$TMP/px/nginx.conf" <<NGX
worker_processes 2; pid $TMP/px/nginx.pid; $common
http { access_log off;
  upstream up { server 127.0.0.1:$UP; keepalive 64; }
  proxy_cache_path $TMP/px/cache levels=1:2 keys_zone=c:8m max_size=64m;
  server { listen 127.0.0.1:$NG;
    location /c/ { proxy_pass http://up/; proxy_http_version 1.1; proxy_set_header Connection "";
                   proxy_cache c; proxy_cache_lock on; }
    location /p/ { proxy_pass http://up/; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
NGX
nginx -p "$TMP/up" -c "$TMP/up/nginx.conf"
nginx -p "$TMP/px" -c "$TMP/px/nginx.conf"
cat > "$TMP/gateway.toml" <<TOML
[server]
listen = "127.0.0.1:$TG"
workers = 2

[admin]
listen = "127.0.0.1:$TGA"

[store]
backend = "memory"

[[routes]]
name = "cached"
path_prefix = "/c"
strip_prefix = true
upstream = "http://127.0.0.1:$UP"

[routes.cache]

[[routes]]
name = "proxied"
path_prefix = "/p"
strip_prefix = true
upstream = "http://127.0.0.1:$UP"
TOML
"$BIN" --config "$TMP/gateway.toml" > "$TMP/tollgate.log" 2>&1 &
PIDS+=($!); TG_PID=$!
for _ in $(seq 50); do curl -fs "http://127.0.0.1:$TG/p/data.txt" -o /dev/null && break; sleep 0.1; done
for port in "$TG" "$NG"; do
  for _ in 1 2; do curl -fs "http://127.0.0.1:$port/c/data.txt" -o /dev/null; done
done
curl -sI "http://127.0.0.1:$TG/c/data.txt" | grep -qi '^cache-status: tollgate; hit' \
  || die "Tollgate's /c/ is no hit"

ticks() { # utime + stime of the given pids
  local t=0; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"
}
nginx_pids() { echo "$(cat "$TMP/px/nginx.pid") $(pgrep -P "$(cat "$TMP/px/nginx.pid")" | tr '\n' ' ')"; }
HZ=$(getconf CLK_TCK)

declare -A RPS CPU
run() { # name port path pids...
  local name=$1 port=$2 path=$3; shift 3
  local before after out reqs
  before=$(ticks "$@")
  out=$(wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "http://127.0.0.1:$port$path")
  after=$(ticks "$@")
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  RPS[$name]+="$(echo "$out" | awk '/Requests\/sec/ {print $2}') "
  # CPU microseconds per request.
  CPU[$name]+="$(python3 -c "print(($after-$before)/$HZ*1e6/max($reqs,1))") "
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for r in $(seq "$ROUNDS"); do
  run tollgate-hit "$TG" /c/data.txt "$TG_PID"
  run tollgate-proxied "$TG" /p/data.txt "$TG_PID"
  run nginx-hit "$NG" /c/data.txt $(nginx_pids)
  run nginx-proxied "$NG" /p/data.txt $(nginx_pids)
done

printf 'body: %s KiB, %s x %ss, %s connections\n' "$BODY_KB" "$ROUNDS" "$DURATION" "$CONNECTIONS"
printf '%-18s %10s %12s\n' proxy req/s 'CPU µs/req'
for name in tollgate-hit tollgate-proxied nginx-hit nginx-proxied; do
  printf '%-18s %10s %12.1f\n' "$name" "$(echo "${RPS[$name]}" | median)" "$(echo "${CPU[$name]}" | median)"
done
ratio() { python3 -c "print(f'{$(echo "${RPS[$1]}" | median)/$(echo "${RPS[$2]}" | median):.2f}')"; }
printf 'tollgate hit / proxied: %sx; tollgate hit / nginx hit: %sx\n' \
  "$(ratio tollgate-hit tollgate-proxied)" "$(ratio tollgate-hit nginx-hit)"
