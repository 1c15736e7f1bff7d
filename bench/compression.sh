#!/usr/bin/env bash
# bench/compression.sh — Tollgate's response compression beside nginx's `gzip on`, at the same
# gzip level, on one JSON body, on loopback (127.0.0.1) only, bounded in time (#38 §1).
#
#   bash bench/compression.sh                          # DURATION=5 ROUNDS=3 LEVEL=6
#   DURATION=2 ROUNDS=1 bash bench/compression.sh      # a quick check, < 30 s
#
# What it starts (free ports of 127.0.0.1, one temporary directory, all stopped on exit):
#   upstream   nginx, 1 worker, serving BODY_KB KiB of JSON (default 16) as is (no gzip)
#   nginx      reverse proxy, 2 workers, keep-alive upstream, `gzip on; gzip_comp_level LEVEL;
#              gzip_types application/json; gzip_min_length 256`
#   Tollgate   2 workers, one route with [routes.compression] algorithms = ["gzip"], level =
#              LEVEL, no limit (target/dist/tollgate, or TOLLGATE_BIN)
#
# For ROUNDS interleaved rounds, `wrk -t1 -c32 -dDURATION -H 'Accept-Encoding: gzip'` against
# each proxy (and once with no Accept-Encoding, for the uncompressed baseline). Reported, as
# medians: req/s, the proxy's CPU per request and per KB of uncompressed body (utime + stime of
# /proc/PID/stat before and after; nginx: master + workers), and the ratio (compressed bytes /
# body bytes, measured with curl).
#
# Environment: DURATION (s, default 5), ROUNDS (default 3), LEVEL (1–9, default 6), BODY_KB
# (default 16), CONNECTIONS (default 32), TOLLGATE_BIN (default target/dist/tollgate).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
LEVEL=${LEVEL:-6}
BODY_KB=${BODY_KB:-16}
CONNECTIONS=${CONNECTIONS:-32}
BIN=${TOLLGATE_BIN:-target/dist/tollgate}
for tool in nginx wrk curl python3; do
  command -v "$tool" >/dev/null || { echo "bench/compression.sh: needs $tool" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "bench/compression.sh: no $BIN (cargo build --profile dist, or TOLLGATE_BIN=...)" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-compression.XXXXXX")
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

die() { echo "compression.sh: $*" >&2; exit 1; }
# shellcheck source=bench/ports.sh
source "$(dirname "${BASH_SOURCE[0]}")/ports.sh"
free_port UP; free_port NG; free_port TG; free_port TGA

# A JSON body of BODY_KB KiB: records with repeated keys and varied values, as an API answers.
mkdir -p "$TMP/up/www" "$TMP/px"
python3 - "$BODY_KB" > "$TMP/up/www/data.json" <<'PY'
import json, random, sys
random.seed(7)
items, size = [], int(sys.argv[1]) * 1024
while len(json.dumps({"items": items})) < size:
    i = len(items)
    items.append({"id": i, "name": f"item {i}", "price": round(random.uniform(1, 500), 2),
                  "tags": random.sample(["red", "green", "blue", "new", "sale", "eu", "us"], 3),
                  "in_stock": random.random() < 0.7, "sku": f"SKU-{random.randrange(10**8):08d}"})
print(json.dumps({"items": items}))
PY
BYTES=$(stat -c %s "$TMP/up/www/data.json")
# nginx's workers run as another user when started as root: they must read the body.
chmod -R a+rX "$TMP"

common='daemon on; error_log stderr error; events { worker_connections 4096; }'
cat > "$TMP/up/nginx.conf" <<NGX
worker_processes 1; pid $TMP/up/nginx.pid; $common
http { access_log off; default_type application/json; types { application/json json; }
  server { listen 127.0.0.1:$UP; root $TMP/up/www; location / { } } }
NGX
cat > "$TMP/px/nginx.conf" <<NGX
worker_processes 2; pid $TMP/px/nginx.pid; $common
http { access_log off;
  upstream up { server 127.0.0.1:$UP; keepalive 64; }
  gzip on; gzip_comp_level $LEVEL; gzip_types application/json; gzip_min_length 256; gzip_proxied any;
  server { listen 127.0.0.1:$NG;
    location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
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
name = "api"
path_prefix = "/"
upstream = "http://127.0.0.1:$UP"

[routes.compression]
algorithms = ["gzip"]
level = $LEVEL
TOML
"$BIN" --config "$TMP/gateway.toml" > "$TMP/tollgate.log" 2>&1 &
PIDS+=($!); TG_PID=$!
for _ in $(seq 50); do curl -fs "http://127.0.0.1:$TG/data.json" -o /dev/null && break; sleep 0.1; done

ticks() { # utime + stime of the given pids
  local t=0; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"
}
nginx_pids() { echo "$(cat "$TMP/px/nginx.pid") $(pgrep -P "$(cat "$TMP/px/nginx.pid")" | tr '\n' ' ')"; }
HZ=$(getconf CLK_TCK)
size_of() { curl -s -H 'Accept-Encoding: gzip' "http://127.0.0.1:$1/data.json" | wc -c; }

declare -A RPS CPU
run() { # name port accept pids...
  local name=$1 port=$2 accept=$3; shift 3
  local before after out reqs
  before=$(ticks "$@")
  if [ -n "$accept" ]; then
    out=$(wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" -H "Accept-Encoding: $accept" "http://127.0.0.1:$port/data.json")
  else
    out=$(wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "http://127.0.0.1:$port/data.json")
  fi
  after=$(ticks "$@")
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  RPS[$name]+="$(echo "$out" | awk '/Requests\/sec/ {print $2}') "
  # CPU microseconds per request.
  CPU[$name]+="$(python3 -c "print(($after-$before)/$HZ*1e6/max($reqs,1))") "
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for r in $(seq "$ROUNDS"); do
  run nginx-gzip "$NG" gzip $(nginx_pids)
  run tollgate-gzip "$TG" gzip "$TG_PID"
  run nginx-plain "$NG" "" $(nginx_pids)
  run tollgate-plain "$TG" "" "$TG_PID"
done

KB=$(python3 -c "print($BYTES/1024)")
printf 'body: %s bytes of JSON, gzip level %s, %s x %ss, %s connections\n' "$BYTES" "$LEVEL" "$ROUNDS" "$DURATION" "$CONNECTIONS"
printf '%-16s %10s %12s %12s %8s\n' proxy req/s 'CPU µs/req' 'CPU µs/KB' ratio
for name in nginx-gzip tollgate-gzip nginx-plain tollgate-plain; do
  rps=$(echo "${RPS[$name]}" | median); cpu=$(echo "${CPU[$name]}" | median)
  case $name in nginx*) port=$NG ;; *) port=$TG ;; esac
  case $name in *gzip) ratio=$(python3 -c "print(f'{$(size_of "$port")/$BYTES:.3f}')") ;; *) ratio=1 ;; esac
  printf '%-16s %10s %12.1f %12.2f %8s\n' "$name" "$rps" "$cpu" "$(python3 -c "print($cpu/$KB)")" "$ratio"
done
