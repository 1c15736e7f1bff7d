#!/usr/bin/env bash
# bench/instructions.sh — user-space instructions per proxied request, counted by callgrind.
#
#   bash bench/instructions.sh [BIN ...]      # default: target/dist/tollgate
#   N=4000 ROUTE=/allow bash bench/instructions.sh old/tollgate target/dist/tollgate
#   KEEP=/tmp/cg bash bench/instructions.sh A B   # also keep each callgrind file (KEEP/<n>.out)
#   HTTP1=hyper bash bench/instructions.sh        # `[server] http1` of the gateway (default: its own)
#   EXTRA=fronted bash bench/instructions.sh      # the gateway also has a route with 5 header rules
#                                                 # and CORS (served by the hyper front), which the
#                                                 # measured route does not use: the cost of an
#                                                 # unused feature is the difference with EXTRA unset
#   EXTRA=routes bash bench/instructions.sh       # ROUTES (10,000) more routes in front, the scale
#                                                 # block's (SCALE_MIX=mixed: of every kind): what
#                                                 # routing costs is the difference with EXTRA unset
#   ROUTE=/reject bash bench/instructions.sh      # the rejected row of compare.sh: a route whose
#                                                 # one limit (gcra global, 1 per 1h) refuses every
#                                                 # request but the first (429 problem+json)
#   EXTRA=tokens ROUTE=/tokjson bash bench/instructions.sh   # the token routes of compare.sh:
#                                                 # /tokjson, /plainjson (a 16 KB chat completion,
#                                                 # with and without cost_from), /toksse, /plainsse
#                                                 # (a 200-event stream): the scan's cost is tok - plain
#   STORE=redis bash bench/instructions.sh        # the same on its own redis-server (compare.sh's
#                                                 # Redis exact rows): the gateway's side of the Redis
#                                                 # path is the difference with STORE unset (Redis's
#                                                 # own CPU is bench/redis-cpu.sh's)
#
# This VM has no hardware counters (`perf stat -e instructions` is "not supported") and its
# req/s and CPU per request move by ±10-15 % between runs, so a lever worth 3 % cannot be seen by
# wrk. Counting instructions under valgrind is exact to 0.1 % run to run: each binary serves the
# bench's /allow route (gcra per IP + a global fixed window, in-process store, one worker) to an
# upstream nginx; after 500 warm-up requests callgrind starts counting, h2load sends N requests
# on 8 connections, and the count is divided by N. Only user space is counted (the kernel's
# half of the CPU is not), and glibc's memcpy is counted in its AVX2 form. It ranks levers; it
# does not replace bench/compare.sh, which measures what a user sees.
#
# Needs: valgrind, h2load (nghttp2-client), nginx. Loopback only; bounded by N.
set -euo pipefail

N=${N:-4000}
ROUTE=${ROUTE:-/allow}
HTTP1=${HTTP1:-}
EXTRA=${EXTRA:-}
STORE=${STORE:-memory}
case "$STORE" in memory|redis) ;; *) echo "STORE: memory or redis" >&2; exit 1 ;; esac
case "$EXTRA" in ""|fronted|tokens|routes) ;; *) echo "EXTRA: fronted, tokens, routes or unset" >&2; exit 1 ;; esac
HTTP1_LINE=""
[[ -z "$HTTP1" ]] || HTTP1_LINE="http1 = \"$HTTP1\""
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[[ $# -gt 0 ]] || set -- "$ROOT/target/dist/tollgate"
for tool in valgrind callgrind_control callgrind_annotate h2load nginx curl; do
    command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install valgrind nghttp2-client nginx curl)" >&2; exit 1; }
done

TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT

die() { echo "instructions.sh: $*" >&2; exit 1; }
# shellcheck source=bench/ports.sh
source "$ROOT/bench/ports.sh"

free_port UP
cat >"$TMP/up.conf" <<EOF
worker_processes 1;
daemon off;
pid $TMP/up.pid;
error_log $TMP/up.err;
events { worker_connections 1024; }
http { access_log off; server { listen 127.0.0.1:$UP; keepalive_requests 1000000; location / { return 200 "ok"; }
  location ~ ^/(tok|plain)json { root $TMP/files; default_type application/json; try_files /body.json =404; }
  location ~ ^/(tok|plain)sse { root $TMP/files; default_type text/event-stream; try_files /body.sse =404; } } }
EOF
# The token scenarios' bodies, as bench/compare.sh writes them.
mkdir -p "$TMP/files"
chmod 755 "$TMP" # nginx's worker (nobody) reads the bodies
awk 'BEGIN {
    c = ""; for (i = 0; i < 4000; i++) c = c "tok ";
    printf "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"%s\"}}],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":4000,\"total_tokens\":4010}}", c
}' >"$TMP/files/body.json"
awk 'BEGIN {
    for (i = 0; i < 199; i++) printf "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"}}]}\n\n";
    printf "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":199,\"total_tokens\":209}}\n\n";
    printf "data: [DONE]\n\n"
}' >"$TMP/files/body.sse"
nginx -p "$TMP" -c "$TMP/up.conf" &
PIDS+=($!)

STORE_LINES='backend = "memory"'
if [[ "$STORE" == redis ]]; then
    command -v redis-server >/dev/null || die "missing redis-server (apt-get install redis-server)"
    free_port REDIS
    redis-server --port "$REDIS" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" \
        --daemonize no --logfile "$TMP/redis.log" </dev/null >/dev/null 2>&1 &
    PIDS+=($!)
    STORE_LINES="backend = \"redis\"
url = \"redis://127.0.0.1:$REDIS\""
fi

free_port PROXY
free_port ADMIN
cat >"$TMP/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:$PROXY"
workers = 1
$HTTP1_LINE
[admin]
listen = "127.0.0.1:$ADMIN"
[store]
$STORE_LINES
$( [[ "$EXTRA" != fronted ]] || cat <<EOR
[[routes]]
name = "fronted"
path_prefix = "/fronted"
upstream = "http://127.0.0.1:$UP"

[routes.request_headers]
remove = ["Cookie"]
set = { "X-Env" = "bench", "X-Client-Ip" = "\$client_ip" }

[routes.response_headers]
remove = ["Server"]
set = { "X-Served-By" = "tollgate/\$route" }

[routes.cors]
allow_origins = ["*"]
max_age = "10m"

EOR
)
$( [[ "$EXTRA" != routes ]] || (UP_PORT=$UP; source "$ROOT/bench/scale-config.sh"; dummy_routes "${ROUTES:-10000}") )
$( [[ "$EXTRA" != tokens ]] || for kind in json sse; do for r in tok plain; do
    printf '[[routes]]\nname = "%s%s"\npath_prefix = "/%s%s"\nupstream = "http://127.0.0.1:%s"\n\n' "$r" "$kind" "$r" "$kind" "$UP"
    printf '[[routes.limits]]\nname = "tokens"\nalgorithm = "fixed_window"\nlimit = 1000000000000\nperiod = "1s"\nsubject = "global"\n'
    [[ $r == tok ]] && printf 'cost_from = "json:usage.total_tokens"\n'
    printf '\n'
done; done )
$( [[ "$ROUTE" != /reject* ]] || cat <<EOR
[[routes]]
name = "reject"
path_prefix = "/reject"
upstream = "http://127.0.0.1:$UP"

[[routes.limits]]
name = "global"
algorithm = "gcra"
limit = 1
period = "1h"
subject = "global"

EOR
)
[[routes]]
name = "allow"
path_prefix = "/"
upstream = "http://127.0.0.1:$UP"
[[routes.limits]]
name = "per-ip"
algorithm = "gcra"
limit = 1000000
period = "1s"
subject = "ip"
[[routes.limits]]
name = "global"
algorithm = "fixed_window"
limit = 1000000000
period = "1s"
subject = "global"
EOF

for bin in "$@"; do
    out="$TMP/cg.out"
    rm -f "$out"*
    RUST_LOG=warn valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out.%p" \
        "$bin" --config "$TMP/gateway.toml" >"$TMP/vg.log" 2>&1 &
    vg=$!
    PIDS+=("$vg")
    for _ in $(seq 100); do
        curl -s -o /dev/null "http://127.0.0.1:$PROXY$ROUTE" && break
        sleep 0.3
    done
    h2load --h1 -n 500 -c 8 "http://127.0.0.1:$PROXY$ROUTE" >/dev/null 2>&1
    callgrind_control -i on "$vg" >/dev/null 2>&1
    # Every request answered: 2xx (h2load's "succeeded"), or 4xx on the rejected route.
    want="$N succeeded"
    [[ "$ROUTE" != /reject* ]] || want="$N 4xx"
    h2load --h1 -n "$N" -c 8 "http://127.0.0.1:$PROXY$ROUTE" 2>&1 | grep -q "$want" ||
        { echo "$bin: not every request was answered as expected ($want)" >&2; exit 1; }
    callgrind_control -d "$vg" >/dev/null 2>&1
    kill "$vg"
    wait "$vg" 2>/dev/null || true
    total=$(callgrind_annotate "$out.$vg.1" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
    printf '%-50s %8d instructions per request (N=%d)\n' "$bin" $((total / N)) "$N"
    if [[ -n "${KEEP:-}" ]]; then
        mkdir -p "$KEEP"
        n=$(( ${n:-0} + 1 ))
        cp "$out.$vg.1" "$KEEP/$n.out"
    fi
done
