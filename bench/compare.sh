#!/usr/bin/env bash
# bench/compare.sh — Tollgate side by side with nginx (limit_req), HAProxy (stick table) and the
# Kong / APISIX architecture (nginx + lua-nginx-module on Redis), on loopback (127.0.0.1) only,
# bounded in time.
#
#   bash bench/compare.sh                     # DURATION=5 ROUNDS=3: 6-7 minutes after the build
#   DURATION=10 ROUNDS=5 bash bench/compare.sh
#   DURATION=2 ROUNDS=1 WARMUP=0 SKIP_BUILD=1 bash bench/compare.sh   # a quick check, < 1 min
#
# What it starts (all on free ports of 127.0.0.1, all in one temporary directory, all stopped on
# exit, Ctrl-C or failure):
#   upstream        nginx, 1 worker, `return 200` (its own prefix and config; the system nginx is
#                   not touched)
#   nginx           reverse proxy, 2 workers, keep-alive to the upstream, limit_req:
#                   /allow  zone by $binary_remote_addr rate=10000000r/s burst=1000000 nodelay
#                   /keys   zone by $http_x_api_key, same numbers                 (both never fire)
#                   /reject zone rate=1r/m, limit_req_status 429          (rejects all but the 1st)
#   HAProxy         nbthread 2, http-reuse always, stick tables with http_req_rate(10s):
#                   /allow tracks src (type ip), /keys tracks req.hdr(x-api-key) (type string),
#                   both deny above 10^9 (never); /reject tracks src, denies above 1 (429)
#   lua-peer        the Kong / APISIX architecture: nginx, 2 workers, with Debian's
#                   libnginx-mod-http-lua deciding every request on the same redis-server from
#                   its access phase over a keepalive cosocket pool (bench/lua-peer/peer.lua):
#                   /allow  GCRA per client address by EVALSHA + Kong's fixed window (INCRBY and
#                           EXPIRE, pipelined) global, both never fire
#                   /keys   GCRA per X-Api-Key by EVALSHA (never fires)
#                   /reject GCRA global 1 per 1h (every request after the first is rejected)
#   Tollgate        in-process store ("memory")
#   Tollgate        on its own redis-server (--save '' --appendonly no)
#                   /allow : gcra per-ip 1000000 per 1s + fixed_window global 10^9 per 1s
#                   /keys  : gcra subject "header:x-api-key" 1000000 per 1s (never fires)
#                   /reject: gcra global 1 per 1h (every request after the first is rejected)
#
# 1. Throughput: for ROUNDS interleaved rounds, `wrk -t1 -c64 -dDURATIONs --latency` against
#    every (scenario, proxy): allow, keys (bench/wrk-keys.lua: each request carries one of 10,000
#    API keys, picked at random) and reject, on nginx, HAProxy, Tollgate memory and Tollgate Redis
#    (plus the upstream alone). Medians of req/s and p99, the ratio against the faster peer
#    (nginx or HAProxy) per scenario, and the CPU each proxy spent per request: utime + stime
#    ticks of /proc/PID/stat before and after each run (nginx: master + workers; HAProxy and
#    Tollgate: the one process, all threads), divided by the requests wrk counted.
#    Redis scenarios also get Redis's CPU per request (INFO cpu used_cpu_sys + used_cpu_user
#    deltas), script calls (EVAL/EVALSHA/FCALL) per request and all commands per request
#    (INFO commandstats deltas), and Tollgate's peak RSS (VmRSS under load, VmHWM).
# 2. Latency at a fixed rate (LATENCY=1): 50 % of nginx's median allow req/s from step 1, sent
#    open-loop by bench/fixed-rate.rs (64 keep-alive connections, each on its own fixed schedule;
#    latency from the *scheduled* send time, as wrk2 does, so a stall is not hidden by the client
#    backing off) to each proxy's /allow, ROUNDS interleaved rounds of LAT_DURATION s: p50/p99
#    and Tollgate's p99 / nginx's p99. The client is compiled with a bare `rustc -O` (standard
#    library only) into target/bench/ when missing or older than its source.
# 3. Scale (SCALE=1): Tollgate memory with one catch-all route (the /allow limits) alone, and
#    behind SCALE_ROUTES dummy routes /svc0/api ... (one limit each): req/s of both (interleaved,
#    ROUNDS × DURATION) and their ratio, the idle RSS and the idle /metrics size of both.
# 4. TLS (TLS=1): bench/tls.sh's block (see there) once per certificate in TLS_KEYS.
#
# Environment:
#   DURATION       seconds per wrk run (default 5)
#   ROUNDS         interleaved rounds (default 3)
#   WARMUP         seconds of one warm-up wrk run per scenario before round 1 (default 1; 0 = none)
#   LATENCY        1 (default): run the fixed-rate latency block; 0: skip it
#   LAT_DURATION   seconds per fixed-rate run (default DURATION)
#   LAT_CONNECTIONS connections of the fixed-rate client (default 64)
#   SCALE          1 (default): run the scale block; 0: skip it
#   SCALE_ROUTES   dummy routes in the scale block (default 10000)
#   TLS            1 (default): run the TLS block (bench/tls.sh on the same binary, DURATION and
#                  ROUNDS: keep-alive, full and resumed handshakes, HTTP/2 against nginx); 0: skip
#   TLS_KEYS       the certificates of the TLS block (default "ecdsa rsa")
#   SKIP_BUILD     1: do not run cargo, use the existing target/$PROFILE/tollgate
#   PROFILE        the cargo profile built and run (default dist: fat LTO, one codegen unit,
#                  as the Dockerfile ships; `release` measures what `cargo run --release` gives)
#   VS_PROFILE     a second profile measured beside it in the same run (e.g. PROFILE=dist
#                  VS_PROFILE=release): its binary (built too, unless SKIP_BUILD=1) runs the memory
#                  gateway's allow, keys and reject scenarios interleaved with everything else
#                  (proxy `tollgate-vs`), and the ratios say VS_PROFILE / PROFILE (issue #52 item
#                  1: `release` within 3 % of `dist`). Default: none.
#   BUILD_TRIES    attempts at `cargo build --profile $PROFILE`, 60 s apart (default 1)
#   KEEP_TMP       1: keep the temporary directory (configs, logs, raw wrk output)
#
# Run time after the build, defaults: 21 scenarios × (1 s warm-up + 3 × 5 s) ≈ 6 min, the
# fixed-rate block 4 × 3 × 5 s = 1 min, the scale block 2 × 3 × 5 s plus starting the
# 10,000-route gateway ≈ 40 s, plus per-run overhead: 6-7 minutes in all (the script prints
# its estimate at the start).
#
# Exit status: 0 when every scenario ran and answered as expected (200 for allow and keys, 429
# for reject) — whether or not the performance targets are met; 1 on a missing tool or a setup
# failure; 2 when a scenario (throughput, fixed rate or scale) answered with the wrong status
# codes or socket errors.
#
# wrk, the servers and Redis share the machine's cores: every scenario runs the same way in one
# run, so compare numbers within a run, not across machines or runs.

set -euo pipefail

export PATH="$PATH:/usr/sbin:/sbin"
export LC_ALL=C

DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-1}
SKIP_BUILD=${SKIP_BUILD:-0}
BUILD_TRIES=${BUILD_TRIES:-1}
KEEP_TMP=${KEEP_TMP:-0}
LATENCY=${LATENCY:-1}
LAT_DURATION=${LAT_DURATION:-$DURATION}
LAT_CONNECTIONS=${LAT_CONNECTIONS:-64}
SCALE=${SCALE:-1}
SCALE_ROUTES=${SCALE_ROUTES:-10000}
TLS=${TLS:-1}
TLS_KEYS=${TLS_KEYS:-ecdsa rsa}
THREADS=1
CONNECTIONS=64

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH="$ROOT/bench"
LUA="$BENCH/wrk-report.lua"
KEYS_LUA="$BENCH/wrk-keys.lua"
FIXED_RATE_SRC="$BENCH/fixed-rate.rs"

log() { printf '[compare] %s\n' "$*" >&2; }
die() {
    printf '[compare] error: %s\n' "$*" >&2
    exit 1
}

for v in DURATION ROUNDS WARMUP BUILD_TRIES LATENCY LAT_DURATION LAT_CONNECTIONS SCALE SCALE_ROUTES TLS; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a whole number (got '${!v}')"
done
((DURATION >= 1)) || die "DURATION must be at least 1"
((ROUNDS >= 1)) || die "ROUNDS must be at least 1"
((BUILD_TRIES >= 1)) || BUILD_TRIES=1
((LAT_DURATION >= 1)) || die "LAT_DURATION must be at least 1"
((LAT_CONNECTIONS >= 1)) || die "LAT_CONNECTIONS must be at least 1"
((SCALE_ROUTES >= 1)) || die "SCALE_ROUTES must be at least 1"

# ----------------------------------------------------------------------------------------------
# Tools: say what is missing and how to install it; install nothing.
# ----------------------------------------------------------------------------------------------
missing=()
pkgs=()
need() { # need TOOL DEBIAN-PACKAGE
    if ! command -v "$1" >/dev/null 2>&1; then
        missing+=("$1")
        [[ -n $2 ]] && pkgs+=("$2")
    fi
    return 0
}
need nginx nginx
[[ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ]] || {
    missing+=("ngx_http_lua_module")
    pkgs+=("libnginx-mod-http-lua")
}
need haproxy haproxy
need wrk wrk
need redis-server redis-server
need redis-cli redis-tools
need curl curl
need awk gawk
if [[ $SKIP_BUILD != 1 ]]; then need cargo ""; fi
if [[ $LATENCY == 1 ]]; then need rustc ""; fi
if ((${#missing[@]})); then
    printf '[compare] missing tools: %s\n' "${missing[*]}" >&2
    if ((${#pkgs[@]})); then
        printf '[compare] install them with:  sudo apt-get install -y %s\n' "${pkgs[*]}" >&2
    fi
    if [[ " ${missing[*]} " == *" cargo "* ]]; then
        printf '[compare] cargo: install a Rust toolchain (https://rustup.rs), or run with SKIP_BUILD=1\n' >&2
    fi
    if [[ " ${missing[*]} " == *" rustc "* ]]; then
        printf '[compare] rustc (builds the fixed-rate client): install a Rust toolchain (https://rustup.rs), or run with LATENCY=0\n' >&2
    fi
    printf '[compare] nothing was installed; exiting.\n' >&2
    exit 1
fi
for f in "$LUA" "$KEYS_LUA" "$FIXED_RATE_SRC"; do [[ -f $f ]] || die "missing $f"; done
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)

# ----------------------------------------------------------------------------------------------
# Processes and cleanup.
# ----------------------------------------------------------------------------------------------
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-bench.XXXXXX")
chmod 755 "$TMP" # nginx workers may run as an unprivileged user
PIDS=()          # every process this script started, in start order
WRK_PID=""

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    [[ -n $WRK_PID ]] && kill -TERM "$WRK_PID" 2>/dev/null
    local i pid alive
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        kill -TERM "${PIDS[i]}" 2>/dev/null
    done
    for _ in $(seq 50); do
        alive=0
        for pid in "${PIDS[@]}" $WRK_PID; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        ((alive)) || break
        sleep 0.1
    done
    for pid in "${PIDS[@]}" $WRK_PID; do
        kill -KILL "$pid" 2>/dev/null
    done
    wait 2>/dev/null
    if [[ $KEEP_TMP == 1 || $rc -ne 0 ]]; then
        log "logs and configs kept in $TMP"
    else
        rm -rf "$TMP"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# shellcheck source=bench/ports.sh
source "$(dirname "${BASH_SOURCE[0]}")/ports.sh"
# shellcheck source=bench/scale-config.sh
source "$(dirname "${BASH_SOURCE[0]}")/scale-config.sh"

# wait_port PORT PID NAME LOGFILE
wait_port() {
    for _ in $(seq 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        kill -0 "$2" 2>/dev/null || die "$3 exited at start; its log ($4):
$(tail -n 20 "$4" 2>/dev/null)"
        sleep 0.05
    done
    die "$3 did not listen on 127.0.0.1:$1 within 10 s; log: $4"
}

# Children of a process (nginx workers), by parent id.
children_of() {
    if command -v pgrep >/dev/null 2>&1; then
        pgrep -P "$1" || true
    else
        awk -v p="$1" '$4 == p { print $1 }' /proc/[0-9]*/stat 2>/dev/null || true
    fi
}

# ----------------------------------------------------------------------------------------------
# Machine and versions.
# ----------------------------------------------------------------------------------------------
cpu_model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$ROOT" --no-optional-locks status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null | wc -l || true)
echo "== Tollgate comparison benchmark"
echo "date:       $(date)"
echo "machine:    $(nproc) cores, ${cpu_model:-unknown CPU}"
echo "load:       $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min, before the run)"
echo "nginx:      $(nginx -v 2>&1 | sed 's/^nginx version: //')"
echo "lua-nginx:  $(dpkg-query -W -f '${Package} ${Version}' libnginx-mod-http-lua 2>/dev/null || echo 'ngx_http_lua_module')"
echo "haproxy:    $(haproxy -v 2>&1 | head -n1)"
echo "wrk:        $(wrk -v 2>&1 | head -n1)"
echo "redis:      $(redis-server --version)"
echo "rustc:      $(rustc --version 2>/dev/null || echo n/a)"
echo "tollgate:   $commit$( ((dirty > 0)) && echo " + uncommitted changes in src/ or Cargo files")"
echo "wrk args:   -t$THREADS -c$CONNECTIONS -d${DURATION}s --latency; ROUNDS=$ROUNDS WARMUP=${WARMUP}s"
nsc=21
[[ -n ${VS_PROFILE:-} && ${VS_PROFILE:-} != "${PROFILE:-dist}" ]] && nsc=24
echo "blocks:     throughput ($nsc scenarios); fixed-rate latency LATENCY=$LATENCY (${LAT_DURATION}s, $LAT_CONNECTIONS conns); scale SCALE=$SCALE ($SCALE_ROUTES routes)"
est=$((nsc * (WARMUP + ROUNDS * DURATION) + nsc * (ROUNDS + 1) / 2))
((LATENCY == 1)) && est=$((est + 4 * ROUNDS * (LAT_DURATION + 1)))
((SCALE == 1)) && est=$((est + 2 * ROUNDS * DURATION + 4 + SCALE_ROUTES / 2000))
((TLS == 1)) && est=$((est + $(wc -w <<<"$TLS_KEYS") * (8 * ROUNDS * DURATION + 10)))
echo "estimate:   about $(((est + 59) / 60)) min after the build ($est s)"
# shellcheck disable=SC2009 # counting several names at once
compilers() { ps -eo comm= 2>/dev/null | grep -cE '^(rustc|cargo|cc|cc1|ld|clang|rust-lld)$' || true; }
busy=$(compilers)
load1=$(cut -d' ' -f1 /proc/loadavg)
if ((busy > 0)) || awk -v l="$load1" 'BEGIN { exit !(l > 0.5) }'; then
    echo "WARNING:    the machine is busy (load $load1, $busy compiler process(es) running): numbers are noisy"
fi
echo

# ----------------------------------------------------------------------------------------------
# Build.
# ----------------------------------------------------------------------------------------------
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
PROFILE=${PROFILE:-dist}
VS_PROFILE=${VS_PROFILE:-}
[[ $VS_PROFILE != "$PROFILE" ]] || VS_PROFILE=""
for prof in "$PROFILE" ${VS_PROFILE:+"$VS_PROFILE"}; do
    [[ $SKIP_BUILD != 1 ]] || break
    for try in $(seq "$BUILD_TRIES"); do
        log "cargo build --profile $prof (attempt $try/$BUILD_TRIES)"
        if (cd "$ROOT" && cargo build --profile "$prof" --bin tollgate >"$TMP/build.log" 2>&1); then
            break
        fi
        tail -n 30 "$TMP/build.log" >&2
        ((try < BUILD_TRIES)) || die "cargo build --profile $prof failed (log: $TMP/build.log)"
        log "build failed; retrying in 60 s"
        sleep 60
    done
done
[[ -x $TARGET_DIR/$PROFILE/tollgate ]] || die "no $TARGET_DIR/$PROFILE/tollgate (build it, or drop SKIP_BUILD)"
# Run a private copy, so a rebuild by someone else during the run cannot swap the binary.
BIN="$TMP/tollgate"
cp "$TARGET_DIR/$PROFILE/tollgate" "$BIN"
VS_BIN=""
if [[ -n $VS_PROFILE ]]; then
    [[ -x $TARGET_DIR/$VS_PROFILE/tollgate ]] || die "no $TARGET_DIR/$VS_PROFILE/tollgate (build it, or drop SKIP_BUILD)"
    VS_BIN="$TMP/tollgate-vs-bin"
    cp "$TARGET_DIR/$VS_PROFILE/tollgate" "$VS_BIN"
fi

# The fixed-rate client: standard library only, one `rustc -O`, cached next to cargo's output.
FIXED_RATE=""
if [[ $LATENCY == 1 ]]; then
    fr_cached="$TARGET_DIR/bench/fixed-rate"
    if [[ ! -x $fr_cached || $FIXED_RATE_SRC -nt $fr_cached ]]; then
        log "rustc -O bench/fixed-rate.rs"
        mkdir -p "$TARGET_DIR/bench"
        rustc -O --edition 2021 "$FIXED_RATE_SRC" -o "$TMP/fixed-rate.new" >"$TMP/fixed-rate.build.log" 2>&1 ||
            die "rustc bench/fixed-rate.rs failed: $(tail -n 20 "$TMP/fixed-rate.build.log")"
        mv -f "$TMP/fixed-rate.new" "$fr_cached"
    fi
    FIXED_RATE="$TMP/fixed-rate"
    cp "$fr_cached" "$FIXED_RATE"
fi

# ----------------------------------------------------------------------------------------------
# Ports and configs.
# ----------------------------------------------------------------------------------------------
free_port UP_PORT
free_port NGX_PORT
free_port HAP_PORT
free_port REDIS_PORT
free_port LP_PORT
# Tollgate binds port 0 and prints the ports it got (a port picked here could be taken by a
# client's ephemeral port before Tollgate starts).
TGM_PORT=0
TGM_ADMIN=0
TGR_PORT=0
TGR_ADMIN=0

nginx_common() { # nginx_common NAME
    cat <<EOF
pid $TMP/$1.pid;
error_log $TMP/$1.error.log warn;
daemon off;
master_process on;
events { worker_connections 4096; }
EOF
}
nginx_http_common() { # nginx_http_common NAME
    cat <<EOF
    access_log off;
    default_type text/plain;
    keepalive_timeout 120s;
    keepalive_requests 100000000;
    client_body_temp_path $TMP/$1-body;
    proxy_temp_path $TMP/$1-proxy;
    fastcgi_temp_path $TMP/$1-fastcgi;
    uwsgi_temp_path $TMP/$1-uwsgi;
    scgi_temp_path $TMP/$1-scgi;
EOF
}

mkdir -p "$TMP/upstream" "$TMP/nginx"
{
    echo "worker_processes 1;"
    nginx_common upstream
    echo "http {"
    nginx_http_common upstream
    cat <<EOF
    server {
        listen 127.0.0.1:$UP_PORT;
        location / { return 200 "ok\n"; }
        # The token scenarios (issue 26): a 16 KB chat completion with usage at its end, and a
        # 200-event stream whose last event before [DONE] carries usage.
        location ~ ^/(tok|plain)json { root $TMP/upstream/files; default_type application/json; try_files /body.json =404; }
        location ~ ^/(tok|plain)sse { root $TMP/upstream/files; default_type text/event-stream; try_files /body.sse =404; }
    }
}
EOF
} >"$TMP/upstream/nginx.conf"
mkdir -p "$TMP/upstream/files"
awk 'BEGIN {
    c = ""; for (i = 0; i < 4000; i++) c = c "tok ";
    printf "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"%s\"}}],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":4000,\"total_tokens\":4010}}", c
}' >"$TMP/upstream/files/body.json"
awk 'BEGIN {
    for (i = 0; i < 199; i++) printf "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"}}]}\n\n";
    printf "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":199,\"total_tokens\":209}}\n\n";
    printf "data: [DONE]\n\n"
}' >"$TMP/upstream/files/body.sse"

{
    echo "worker_processes 2;"
    nginx_common nginx
    echo "http {"
    nginx_http_common nginx
    cat <<EOF
    limit_req_zone \$binary_remote_addr zone=allow:10m rate=10000000r/s;
    limit_req_zone \$http_x_api_key zone=keys:10m rate=10000000r/s;
    limit_req_zone \$binary_remote_addr zone=reject:10m rate=1r/m;
    limit_req_status 429;
    upstream up {
        server 127.0.0.1:$UP_PORT;
        keepalive 64;
        keepalive_requests 100000000;
    }
    server {
        listen 127.0.0.1:$NGX_PORT;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        # nginx counts excess in 1/1000 requests per millisecond: without a burst, a second
        # request in the same millisecond would be rejected even at 10^7 r/s.
        location /allow  { limit_req zone=allow burst=1000000 nodelay; proxy_pass http://up; }
        location /keys   { limit_req zone=keys burst=1000000 nodelay; proxy_pass http://up; }
        location /reject { limit_req zone=reject; proxy_pass http://up; }
    }
}
EOF
} >"$TMP/nginx/nginx.conf"

# The Kong-style peer: lua-nginx-module on Redis (bench/lua-peer/peer.lua).
mkdir -p "$TMP/lua-peer"
{
    echo "load_module /usr/lib/nginx/modules/ndk_http_module.so;"
    echo "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;"
    echo "worker_processes 2;"
    nginx_common lua-peer
    echo "http {"
    nginx_http_common lua-peer
    cat <<EOF
    lua_package_path "$BENCH/lua-peer/?.lua;;";
    init_worker_by_lua_block { require("peer").init("127.0.0.1", $REDIS_PORT) }
    upstream up {
        server 127.0.0.1:$UP_PORT;
        keepalive 64;
        keepalive_requests 100000000;
    }
    server {
        listen 127.0.0.1:$LP_PORT;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        location /allow {
            access_by_lua_block {
                require("peer").decide({ "lp:ip:" .. ngx.var.remote_addr, 1000000, 1000000, 1000000 },
                    { "lp:global", 1000000000, 1 })
            }
            proxy_pass http://up;
        }
        location /keys {
            access_by_lua_block {
                require("peer").decide({ "lp:key:" .. (ngx.var.http_x_api_key or ""), 1000000, 1000000, 1000000 })
            }
            proxy_pass http://up;
        }
        location /reject {
            access_by_lua_block { require("peer").decide({ "lp:reject", 1, 3600000000, 1 }) }
            proxy_pass http://up;
        }
    }
}
EOF
} >"$TMP/lua-peer/nginx.conf"

cat >"$TMP/haproxy.cfg" <<EOF
global
    nbthread 2
    maxconn 4000
    log stdout format raw local0 warning

defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
    option http-keep-alive
    http-reuse always

backend st_allow
    stick-table type ip size 100k expire 60s store http_req_rate(10s)

backend st_keys
    stick-table type string len 32 size 100k expire 60s store http_req_rate(10s)

backend st_reject
    stick-table type ip size 100k expire 60s store http_req_rate(10s)

frontend gw
    bind 127.0.0.1:$HAP_PORT
    http-request track-sc0 src table st_allow if { path_beg /allow }
    http-request track-sc1 src table st_reject if { path_beg /reject }
    http-request track-sc2 req.hdr(x-api-key) table st_keys if { path_beg /keys }
    http-request deny deny_status 429 if { path_beg /allow } { sc_http_req_rate(0,st_allow) gt 1000000000 }
    http-request deny deny_status 429 if { path_beg /reject } { sc_http_req_rate(1,st_reject) gt 1 }
    http-request deny deny_status 429 if { path_beg /keys } { sc_http_req_rate(2,st_keys) gt 1000000000 }
    default_backend up

backend up
    http-reuse always
    server s1 127.0.0.1:$UP_PORT
EOF

tollgate_config() { # tollgate_config PORT ADMIN STORE-BODY
    cat <<EOF
[server]
listen = "127.0.0.1:$1"

[admin]
listen = "127.0.0.1:$2"

[store]
$3

[[routes]]
name = "allow"
path_prefix = "/allow"
upstream = "http://127.0.0.1:$UP_PORT"

$(allow_limits)

# The /allow route with what fronting an API adds (issue 27): five header rules and CORS. Its
# row against tollgate-mem-allow is their cost.
[[routes]]
name = "fronted"
path_prefix = "/fronted"
upstream = "http://127.0.0.1:$UP_PORT"

[routes.request_headers]
remove = ["Cookie"]
set = { "X-Env" = "bench", "X-Client-Ip" = "\$client_ip" }

[routes.response_headers]
remove = ["Server"]
set = { "X-Served-By" = "tollgate/\$route" }

[routes.cors]
allow_origins = ["*"]
max_age = "10m"

$(allow_limits)

# Token limits (issue 26): the same limit with and without cost_from, on a 16 KB JSON body and
# on a 200-event stream; each pair's rows against each other are the cost of the scan and of
# the charge made when the body ends.
$(for kind in json sse; do for r in tok plain; do
    printf '[[routes]]\nname = "%s%s"\npath_prefix = "/%s%s"\nupstream = "http://127.0.0.1:%s"\n\n' "$r" "$kind" "$r" "$kind" "$UP_PORT"
    printf '[[routes.limits]]\nname = "tokens"\nalgorithm = "fixed_window"\nlimit = 1000000000000\nperiod = "1s"\nsubject = "global"\n'
    [[ $r == tok ]] && printf 'cost_from = "json:usage.total_tokens"\n'
    printf '\n'
done; done)

[[routes]]
name = "keys"
path_prefix = "/keys"
upstream = "http://127.0.0.1:$UP_PORT"

[[routes.limits]]
name = "per-key"
algorithm = "gcra"
limit = 1000000
period = "1s"
subject = "header:x-api-key"

[[routes]]
name = "reject"
path_prefix = "/reject"
upstream = "http://127.0.0.1:$UP_PORT"

[[routes.limits]]
name = "global"
algorithm = "gcra"
limit = 1
period = "1h"
subject = "global"
EOF
}
tollgate_config "$TGM_PORT" "$TGM_ADMIN" 'backend = "memory"' >"$TMP/tollgate-memory.toml"
tollgate_config "$TGR_PORT" "$TGR_ADMIN" "backend = \"redis\"
url = \"redis://127.0.0.1:$REDIS_PORT\"" >"$TMP/tollgate-redis.toml"

# Scale block: scale_config (bench/scale-config.sh). These gateways start late, when wrk's
# ephemeral ports may hold any port picked now: they listen on port 0 and print the ports they got.
if [[ $SCALE == 1 ]]; then
    scale_config 0 0 0 >"$TMP/tollgate-scale-1.toml"
    scale_config 0 0 "$SCALE_ROUTES" >"$TMP/tollgate-scale-n.toml"
fi

# ----------------------------------------------------------------------------------------------
# Start everything.
# ----------------------------------------------------------------------------------------------
start_nginx() { # start_nginx NAME PORT WORKERS; sets NGINX_PIDS (master and workers)
    nginx -t -q -p "$TMP/$1" -c "$TMP/$1/nginx.conf" >"$TMP/$1.check.log" 2>&1 ||
        die "nginx config $1 is invalid: $(cat "$TMP/$1.check.log")"
    nginx -p "$TMP/$1" -c "$TMP/$1/nginx.conf" >"$TMP/$1.out" 2>&1 </dev/null &
    local pid=$!
    PIDS+=("$pid")
    wait_port "$2" "$pid" "nginx ($1)" "$TMP/$1.error.log"
    local w workers=()
    for _ in $(seq 100); do
        mapfile -t workers < <(children_of "$pid")
        ((${#workers[@]} >= $3)) && break
        sleep 0.05
    done
    ((${#workers[@]} >= $3)) || die "nginx ($1): expected $3 worker(s), found ${#workers[@]}"
    for w in "${workers[@]}"; do PIDS+=("$w"); done
    NGINX_PIDS="$pid ${workers[*]}"
}

log "starting upstream (nginx return 200) on 127.0.0.1:$UP_PORT"
start_nginx upstream "$UP_PORT" 1
UP_PIDS=$NGINX_PIDS
log "starting nginx proxy on 127.0.0.1:$NGX_PORT"
start_nginx nginx "$NGX_PORT" 2
NGX_PIDS=$NGINX_PIDS

log "starting HAProxy on 127.0.0.1:$HAP_PORT"
haproxy -c -q -f "$TMP/haproxy.cfg" >"$TMP/haproxy.check.log" 2>&1 ||
    die "haproxy config is invalid: $(cat "$TMP/haproxy.check.log")"
haproxy -db -f "$TMP/haproxy.cfg" >"$TMP/haproxy.log" 2>&1 </dev/null &
HAP_PID=$!
PIDS+=("$HAP_PID")
wait_port "$HAP_PORT" "$HAP_PID" haproxy "$TMP/haproxy.log"

log "starting redis-server on 127.0.0.1:$REDIS_PORT"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$TMP" --daemonize no --logfile "$TMP/redis.log" </dev/null >/dev/null 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
wait_port "$REDIS_PORT" "$REDIS_PID" redis-server "$TMP/redis.log"
rcli() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@"; }
for _ in $(seq 100); do [[ $(rcli PING 2>/dev/null) == PONG ]] && break; sleep 0.05; done

log "starting the Kong-style peer (nginx + lua on Redis) on 127.0.0.1:$LP_PORT"
start_nginx lua-peer "$LP_PORT" 2
LP_PIDS=$NGINX_PIDS

start_tollgate() { # start_tollgate NAME PORT|0 [TIMEOUT-S [BINARY]]; sets TG_PID, TG_PORT, TG_ADMIN
    local tries=$((${3:-20} * 20))
    RUST_LOG=warn "${4:-$BIN}" --config "$TMP/$1.toml" >"$TMP/$1.out" 2>"$TMP/$1.err" </dev/null &
    TG_PID=$!
    PIDS+=("$TG_PID")
    for _ in $(seq "$tries"); do
        grep -q '^tollgate listening' "$TMP/$1.out" 2>/dev/null && break
        kill -0 "$TG_PID" 2>/dev/null || die "$1 exited at start: $(tail -n 20 "$TMP/$1.err")"
        sleep 0.05
    done
    grep -q '^tollgate listening' "$TMP/$1.out" || die "$1 did not print 'tollgate listening' within ${3:-20} s"
    # "tollgate listening proxy=127.0.0.1:PORT admin=127.0.0.1:PORT"
    TG_PORT=$(sed -n 's/^tollgate listening proxy=[^ ]*:\([0-9]*\).*/\1/p' "$TMP/$1.out" | head -n1)
    TG_ADMIN=$(sed -n 's/^tollgate listening .*admin=[^ ]*:\([0-9]*\).*/\1/p' "$TMP/$1.out" | head -n1)
    [[ $2 == 0 ]] || TG_PORT=$2
    [[ -n $TG_PORT ]] || die "$1: no proxy port in: $(head -n1 "$TMP/$1.out")"
    wait_port "$TG_PORT" "$TG_PID" "$1" "$TMP/$1.err"
}
log "starting Tollgate (memory)"
start_tollgate tollgate-memory 0
TGM_PID=$TG_PID TGM_PORT=$TG_PORT
log "starting Tollgate (Redis)"
start_tollgate tollgate-redis 0
TGR_PID=$TG_PID TGR_PORT=$TG_PORT
TGV_PID="" TGV_PORT=""
if [[ -n $VS_PROFILE ]]; then
    log "starting Tollgate (memory) built by the $VS_PROFILE profile"
    cp "$TMP/tollgate-memory.toml" "$TMP/tollgate-vs.toml"
    start_tollgate tollgate-vs 0 20 "$VS_BIN"
    TGV_PID=$TG_PID TGV_PORT=$TG_PORT
fi

# ----------------------------------------------------------------------------------------------
# Scenarios: NAME PROXY SCENARIO URL EXPECT(allow|reject) WRK-SCRIPT(report|keys)
# ----------------------------------------------------------------------------------------------
SCENARIOS=(
    "upstream              upstream       allow  http://127.0.0.1:$UP_PORT/allow   allow  report"
    "nginx-allow           nginx          allow  http://127.0.0.1:$NGX_PORT/allow  allow  report"
    "haproxy-allow         haproxy        allow  http://127.0.0.1:$HAP_PORT/allow  allow  report"
    "tollgate-mem-allow    tollgate-mem   allow  http://127.0.0.1:$TGM_PORT/allow  allow  report"
    "tollgate-redis-allow  tollgate-redis allow  http://127.0.0.1:$TGR_PORT/allow  allow  report"
    "tollgate-mem-fronted  tollgate-mem   fronted http://127.0.0.1:$TGM_PORT/fronted allow report"
    "tollgate-mem-plainjson tollgate-mem  plainjson http://127.0.0.1:$TGM_PORT/plainjson allow report"
    "tollgate-mem-tokjson  tollgate-mem   tokjson http://127.0.0.1:$TGM_PORT/tokjson allow report"
    "tollgate-mem-plainsse tollgate-mem   plainsse http://127.0.0.1:$TGM_PORT/plainsse allow report"
    "tollgate-mem-toksse   tollgate-mem   toksse http://127.0.0.1:$TGM_PORT/toksse allow report"
    "lua-peer-allow        lua-peer       allow  http://127.0.0.1:$LP_PORT/allow   allow  report"
    "nginx-keys            nginx          keys   http://127.0.0.1:$NGX_PORT/keys   allow  keys"
    "haproxy-keys          haproxy        keys   http://127.0.0.1:$HAP_PORT/keys   allow  keys"
    "tollgate-mem-keys     tollgate-mem   keys   http://127.0.0.1:$TGM_PORT/keys   allow  keys"
    "tollgate-redis-keys   tollgate-redis keys   http://127.0.0.1:$TGR_PORT/keys   allow  keys"
    "lua-peer-keys         lua-peer       keys   http://127.0.0.1:$LP_PORT/keys    allow  keys"
    "nginx-reject          nginx          reject http://127.0.0.1:$NGX_PORT/reject reject report"
    "haproxy-reject        haproxy        reject http://127.0.0.1:$HAP_PORT/reject reject report"
    "tollgate-mem-reject   tollgate-mem   reject http://127.0.0.1:$TGM_PORT/reject reject report"
    "tollgate-redis-reject tollgate-redis reject http://127.0.0.1:$TGR_PORT/reject reject report"
    "lua-peer-reject       lua-peer       reject http://127.0.0.1:$LP_PORT/reject  reject report"
)
NAMES=()
declare -A PROXY SCEN URL EXPECT SCRIPT
add_scenario() { # add_scenario NAME PROXY SCENARIO URL EXPECT SCRIPT
    NAMES+=("$1")
    PROXY[$1]=$2 SCEN[$1]=$3 URL[$1]=$4 EXPECT[$1]=$5 SCRIPT[$1]=$6
}
if [[ -n $VS_PROFILE ]]; then
    SCENARIOS+=(
        "tollgate-vs-allow     tollgate-vs    allow  http://127.0.0.1:$TGV_PORT/allow  allow  report"
        "tollgate-vs-keys      tollgate-vs    keys   http://127.0.0.1:$TGV_PORT/keys   allow  keys"
        "tollgate-vs-reject    tollgate-vs    reject http://127.0.0.1:$TGV_PORT/reject reject report"
    )
fi
for s in "${SCENARIOS[@]}"; do
    # shellcheck disable=SC2086 # the fields are whitespace-separated on purpose
    add_scenario $s
done
THROUGHPUT_NAMES=("${NAMES[@]}")

# The processes whose CPU counts as the proxy's: nginx master + workers, HAProxy and Tollgate
# (one process each, all threads).
declare -A PROXY_PIDS=(
    [upstream]=$UP_PIDS
    [nginx]=$NGX_PIDS
    [haproxy]=$HAP_PID
    [tollgate-mem]=$TGM_PID
    [tollgate-redis]=$TGR_PID
    [tollgate-vs]=$TGV_PID
    [lua-peer]=$LP_PIDS
)
# The proxies that decide on Redis: their runs also measure Redis (calls, CPU).
on_redis() { [[ $1 == tollgate-redis || $1 == lua-peer ]]; }

# status_of URL [HEADER]
status_of() {
    curl -s -o /dev/null --noproxy '*' --max-time 5 ${2:+-H "$2"} -w '%{http_code}' "$1" || true
}

# Redis calls so far, every command but INFO, as "ALL SCRIPTS CONTROL DATA":
#   SCRIPTS  EVAL/EVALSHA/FCALL (and _RO): one client round trip each;
#   CONTROL  commands a client sends itself (PING, HELLO, SCRIPT|*, CLIENT|*, CLUSTER|*, ...);
#   DATA     everything else. INFO commandstats also counts the redis.call()s that run *inside* a
#            script, so DATA is attributed to the scripts when scripts ran (see client_delta).
redis_calls() {
    rcli INFO commandstats | tr -d '\r' | awk -F'[:,=]' '
        /^cmdstat_/ {
            c = $1; sub(/^cmdstat_/, "", c)
            if (c == "info") next
            all += $3
            if (c ~ /^(eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro)$/) scripts += $3
            else if (c ~ /^(ping|hello|select|auth|readonly|readwrite|multi|exec|discard|watch|unwatch|quit|reset)$/ ||
                     c ~ /^(script|client|cluster|command|config|function|latency|slowlog|memory)([|]|$)/) control += $3
            else data += $3
        }
        END { printf "%d %d %d %d\n", all, scripts, control, data }'
}
# all_delta BEFORE AFTER -> every call (incl. the ones inside scripts)
all_delta() {
    local a b
    read -r a _ _ _ <<<"$1"
    read -r b _ _ _ <<<"$2"
    echo $((b - a))
}
# script_delta BEFORE AFTER -> EVAL/EVALSHA/FCALL calls
script_delta() {
    local a b
    read -r _ a _ _ <<<"$1"
    read -r _ b _ _ <<<"$2"
    echo $((b - a))
}
# client_delta BEFORE AFTER -> commands clients sent (round trips): scripts + control, plus data
# commands only when no script ran in the window (they were then sent by a client, not a script).
client_delta() {
    local a1 s1 c1 a2 s2 c2
    read -r a1 s1 c1 _ <<<"$1"
    read -r a2 s2 c2 _ <<<"$2"
    if ((s2 - s1 > 0)); then echo $((s2 - s1 + c2 - c1)); else echo $((a2 - a1)); fi
}
# Redis's own CPU so far, seconds: used_cpu_sys + used_cpu_user (all its threads).
redis_cpu() {
    rcli INFO cpu | tr -d '\r' | awk -F: '$1 == "used_cpu_sys" || $1 == "used_cpu_user" { t += $2 }
        END { printf "%.6f\n", t }'
}
# CPU ticks (utime stime) so far, summed over the given processes (/proc/PID/stat fields 14, 15;
# the command name in field 2 may hold spaces, so fields are counted after its closing paren).
cpu_ticks() {
    local pid
    for pid in "$@"; do cat "/proc/$pid/stat" 2>/dev/null || true; done |
        awk '{ sub(/^.*\) /, ""); u += $12; s += $13 } END { printf "%d %d\n", u, s }'
}
# cpu_per_req BEFORE AFTER REQUESTS -> "total user sys" in µs per request
cpu_per_req() {
    local u1 s1 u2 s2
    read -r u1 s1 <<<"$1"
    read -r u2 s2 <<<"$2"
    awk -v u=$((u2 - u1)) -v s=$((s2 - s1)) -v n="$3" -v hz="$CLK_TCK" 'BEGIN {
        if (n <= 0) { print "0 0 0"; exit }
        f = 1e6 / hz / n; printf "%.2f %.2f %.2f\n", (u + s) * f, u * f, s * f }'
}

log "checking status codes (allow, keys: 200; reject: the second request 429)"
for name in "${NAMES[@]}"; do
    url=${URL[$name]}
    hdr=""
    [[ ${SCRIPT[$name]} == keys ]] && hdr="X-Api-Key: key-check"
    if [[ ${EXPECT[$name]} == allow ]]; then
        before=$(redis_calls)
        code=$(status_of "$url" "$hdr")
        [[ $code == 200 ]] || die "$name: GET $url answered $code, expected 200"
        if on_redis "${PROXY[$name]}"; then
            after=$(redis_calls)
            (($(all_delta "$before" "$after") > 0)) || die "$name: the request did not reach Redis (is Tollgate failing open?)"
        fi
    else
        status_of "$url" >/dev/null
        code=$(status_of "$url")
        [[ $code == 429 ]] || die "$name: the second GET $url answered $code, expected 429"
    fi
done

# ----------------------------------------------------------------------------------------------
# Throughput runs.
# ----------------------------------------------------------------------------------------------
declare -A RPS P99 CPU CPU_U CPU_S REQS CMDS CLIENT_CMDS SCRIPT_CMDS REDIS_CPU BAD RSS_MAX HWM_MAX
init_name() {
    RPS[$1]="" P99[$1]="" CPU[$1]="" CPU_U[$1]="" CPU_S[$1]="" REDIS_CPU[$1]="" BAD[$1]=""
    REQS[$1]=0 CMDS[$1]=0 CLIENT_CMDS[$1]=0 SCRIPT_CMDS[$1]=0
}
for name in "${NAMES[@]}"; do init_name "$name"; done
RSS_MAX[memory]=0
RSS_MAX[redis]=0
HWM_MAX[memory]=0
HWM_MAX[redis]=0

status_kb() { # status_kb PID FIELD -> kB (0 when the process is gone)
    local v
    v=$(awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status" 2>/dev/null || true)
    echo "${v:-0}"
}

# run_wrk NAME SECONDS RECORD(0|1)
run_wrk() {
    local name=$1 secs=$2 record=$3
    local url=${URL[$name]} expect=${EXPECT[$name]} script=$LUA
    [[ ${SCRIPT[$name]} == keys ]] && script=$KEYS_LUA
    local out="$TMP/wrk-$name-$RUN_ID.txt"
    local gw_pid="" gw_kind="" before="0 0 0 0" after="0 0 0 0" rcpu1=0 rcpu2=0
    local pids
    read -r -a pids <<<"${PROXY_PIDS[${PROXY[$name]}]}"
    case ${PROXY[$name]} in
    tollgate-mem) gw_pid=$TGM_PID gw_kind=memory ;;
    tollgate-redis) gw_pid=$TGR_PID gw_kind=redis ;;
    esac
    if on_redis "${PROXY[$name]}"; then
        before=$(redis_calls)
        rcpu1=$(redis_cpu)
    fi
    local t1 t2
    t1=$(cpu_ticks "${pids[@]}")
    wrk -t"$THREADS" -c"$CONNECTIONS" -d"${secs}s" --latency -s "$script" "$url" >"$out" 2>&1 &
    WRK_PID=$!
    if ((record)) && (($(compilers) > 0)); then NOISY_RUNS=$((NOISY_RUNS + 1)); fi
    if [[ -n $gw_kind ]]; then
        # Sample the gateway's RSS in the middle of the load and near its end.
        local rss
        sleep "$(awk -v d="$secs" 'BEGIN { print d / 2 }')"
        rss=$(status_kb "$gw_pid" VmRSS)
        if ((rss > RSS_MAX[$gw_kind])); then RSS_MAX[$gw_kind]=$rss; fi
        sleep "$(awk -v d="$secs" 'BEGIN { x = d / 2 - 0.3; print (x > 0 ? x : 0) }')"
        rss=$(status_kb "$gw_pid" VmRSS)
        if ((rss > RSS_MAX[$gw_kind])); then RSS_MAX[$gw_kind]=$rss; fi
    fi
    wait "$WRK_PID" || die "wrk failed against $url: $(tail -n 5 "$out")"
    WRK_PID=""
    t2=$(cpu_ticks "${pids[@]}")
    if on_redis "${PROXY[$name]}"; then
        rcpu2=$(redis_cpu)
        after=$(redis_calls)
    fi
    if [[ -n $gw_kind ]]; then
        local hwm
        hwm=$(status_kb "$gw_pid" VmHWM)
        if ((hwm > HWM_MAX[$gw_kind])); then HWM_MAX[$gw_kind]=$hwm; fi
    fi
    local line
    line=$(grep '^WRKRESULT' "$out" || true)
    [[ -n $line ]] || die "no result from wrk against $url: $(tail -n 5 "$out")"
    local requests duration_us p99_us non2xx connect read write timeout
    eval "$(echo "$line" | sed 's/^WRKRESULT //' | tr ' ' '\n' | grep -E '^[a-z0-9_]+=[0-9]+$' |
        grep -E '^(requests|duration_us|p99_us|non2xx|connect|read|write|timeout)=')"
    ((requests > 0)) || die "wrk completed no request against $url"
    # Status codes under load: allow/keys must be all 2xx; reject all non-2xx but the first.
    local problem=""
    if [[ $expect == allow ]]; then
        ((non2xx == 0)) || problem="$non2xx non-2xx answers"
    else
        ((requests - non2xx <= 1)) || problem="$((requests - non2xx)) 2xx answers (expected 429)"
    fi
    ((connect + read + write + timeout == 0)) ||
        problem+="${problem:+; }socket errors connect=$connect read=$read write=$write timeout=$timeout"
    local rps cpu cpu_u cpu_s
    rps=$(awk -v r="$requests" -v d="$duration_us" 'BEGIN { printf "%.0f", r / (d / 1e6) }')
    read -r cpu cpu_u cpu_s <<<"$(cpu_per_req "$t1" "$t2" "$requests")"
    if ((record)); then
        RPS[$name]+="$rps "
        P99[$name]+="$p99_us "
        CPU[$name]+="$cpu "
        CPU_U[$name]+="$cpu_u "
        CPU_S[$name]+="$cpu_s "
        REQS[$name]=$((REQS[$name] + requests))
        local extra=""
        if on_redis "${PROXY[$name]}"; then
            CMDS[$name]=$((CMDS[$name] + $(all_delta "$before" "$after")))
            CLIENT_CMDS[$name]=$((CLIENT_CMDS[$name] + $(client_delta "$before" "$after")))
            SCRIPT_CMDS[$name]=$((SCRIPT_CMDS[$name] + $(script_delta "$before" "$after")))
            local r
            r=$(awk -v a="$rcpu1" -v b="$rcpu2" -v n="$requests" 'BEGIN { printf "%.2f", (b - a) * 1e6 / n }')
            REDIS_CPU[$name]+="$r "
            extra="  redis cpu $r µs/req"
        fi
        if [[ -n $problem ]]; then BAD[$name]+="round $ROUND: $problem. "; fi
        log "$(printf '%-22s round %d: %8s req/s  p99 %7.2f ms  cpu %6.2f µs/req%s%s' "$name" "$ROUND" "$rps" \
            "$(awk -v p="$p99_us" 'BEGIN { print p / 1000 }')" "$cpu" "$extra" "${problem:+  !! $problem}")"
    fi
    return 0
}

RUN_ID=0
NOISY_RUNS=0
MEASURED_RUNS=0
if ((WARMUP > 0)); then
    log "warm-up: ${WARMUP}s per scenario"
    ROUND=0
    for name in "${THROUGHPUT_NAMES[@]}"; do
        RUN_ID=$((RUN_ID + 1))
        run_wrk "$name" "$WARMUP" 0
    done
fi
for ROUND in $(seq "$ROUNDS"); do
    log "round $ROUND/$ROUNDS"
    for name in "${THROUGHPUT_NAMES[@]}"; do
        RUN_ID=$((RUN_ID + 1))
        MEASURED_RUNS=$((MEASURED_RUNS + 1))
        run_wrk "$name" "$DURATION" 1
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END {
    if (NR == 0) { print 0; exit }
    if (NR % 2) print a[(NR + 1) / 2]; else printf "%.0f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# median_f: the same for fractional values (µs), two decimals.
median_f() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END {
    if (NR == 0) { print "n/a"; exit }
    if (NR % 2) printf "%.2f\n", a[(NR + 1) / 2]; else printf "%.2f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ms() { awk -v p="$1" 'BEGIN { printf "%.2f", p / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0 && a != "n/a") printf "%.2f", a / b; else print "n/a" }'; }

# ----------------------------------------------------------------------------------------------
# Latency at a fixed rate: 50 % of nginx's median allow req/s, open loop.
# ----------------------------------------------------------------------------------------------
declare -A FR_RATE FR_P50 FR_P99 FR_P999 FR_SVC99 FR_CPU FR_LATE FR_REQS FR_BAD
LAT_NAMES=(nginx-allow haproxy-allow tollgate-mem-allow tollgate-redis-allow)
NGX_ALLOW_MED=$(echo "${RPS[nginx-allow]}" | median)
LAT_RATE=$((NGX_ALLOW_MED / 2))

# run_fixed NAME RATE SECONDS
run_fixed() {
    local name=$1 rate=$2 secs=$3
    local url=${URL[$name]} out="$TMP/fixed-$name-$RUN_ID.txt"
    local pids
    read -r -a pids <<<"${PROXY_PIDS[${PROXY[$name]}]}"
    local t1 t2
    t1=$(cpu_ticks "${pids[@]}")
    "$FIXED_RATE" "$url" "$rate" "$LAT_CONNECTIONS" "$secs" >"$out" 2>&1 &
    WRK_PID=$!
    if (($(compilers) > 0)); then NOISY_RUNS=$((NOISY_RUNS + 1)); fi
    wait "$WRK_PID" || die "fixed-rate client failed against $url: $(tail -n 5 "$out")"
    WRK_PID=""
    t2=$(cpu_ticks "${pids[@]}")
    local line
    line=$(grep '^FIXEDRATE' "$out" || true)
    [[ -n $line ]] || die "no result from the fixed-rate client against $url: $(tail -n 5 "$out")"
    local requests rate_got p50_us p99_us p999_us svc_p99_us non2xx errors late_sends
    eval "$(echo "$line" | sed 's/^FIXEDRATE //' | tr ' ' '\n' | grep -E '^[a-z0-9_]+=[0-9]+$' |
        sed 's/^rate=/rate_got=/' |
        grep -E '^(requests|rate_got|p50_us|p99_us|p999_us|svc_p99_us|non2xx|errors|late_sends)=')"
    ((requests > 0)) || die "the fixed-rate client completed no request against $url"
    local problem=""
    ((non2xx == 0)) || problem="$non2xx non-2xx answers"
    ((errors == 0)) || problem+="${problem:+; }$errors socket errors"
    local cpu
    read -r cpu _ _ <<<"$(cpu_per_req "$t1" "$t2" "$requests")"
    FR_RATE[$name]+="$rate_got "
    FR_P50[$name]+="$p50_us "
    FR_P99[$name]+="$p99_us "
    FR_P999[$name]+="$p999_us "
    FR_SVC99[$name]+="$svc_p99_us "
    FR_CPU[$name]+="$cpu "
    FR_LATE[$name]=$((${FR_LATE[$name]:-0} + late_sends))
    FR_REQS[$name]=$((${FR_REQS[$name]:-0} + requests))
    if [[ -n $problem ]]; then FR_BAD[$name]+="round $ROUND: $problem. "; fi
    log "$(printf '%-22s round %d: %8s req/s  p50 %6.2f ms  p99 %7.2f ms  cpu %6.2f µs/req  late sends %s%s' \
        "$name" "$ROUND" "$rate_got" "$(ms "$p50_us")" "$(ms "$p99_us")" "$cpu" "$late_sends" \
        "${problem:+  !! $problem}")"
}

if [[ $LATENCY == 1 ]] && ((LAT_RATE < 1)); then
    log "fixed-rate block skipped: nginx's allow rate is 0"
    LATENCY=0
fi
if [[ $LATENCY == 1 ]]; then
    log "fixed rate: $LAT_RATE req/s (50 % of nginx's median allow $NGX_ALLOW_MED req/s), $LAT_CONNECTIONS connections, ${LAT_DURATION}s"
    for ROUND in $(seq "$ROUNDS"); do
        log "fixed-rate round $ROUND/$ROUNDS"
        for name in "${LAT_NAMES[@]}"; do
            RUN_ID=$((RUN_ID + 1))
            MEASURED_RUNS=$((MEASURED_RUNS + 1))
            run_fixed "$name" "$LAT_RATE" "$LAT_DURATION"
        done
    done
fi

# ----------------------------------------------------------------------------------------------
# Scale: one catch-all route alone vs behind SCALE_ROUTES dummy routes (in-process store).
# ----------------------------------------------------------------------------------------------
declare -A SC_IDLE_RSS SC_METRICS SC_START
SCALE_NAMES=(scale-1 scale-n)
if [[ $SCALE == 1 ]]; then
    # metrics_bytes ADMIN-PORT -> size of GET /metrics in bytes
    metrics_bytes() { curl -s --noproxy '*' --max-time 20 "http://127.0.0.1:$1/metrics" | wc -c; }
    start_scale() { # start_scale KIND; sets TG_PID, TG_PORT
        local t0 t1
        t0=$(date +%s.%N)
        start_tollgate "tollgate-scale-$1" 0 180
        t1=$(date +%s.%N)
        SC_START[$1]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
        sleep 1 # idle: let start-up allocations settle
        SC_IDLE_RSS[$1]=$(status_kb "$TG_PID" VmRSS)
        SC_METRICS[$1]=$(metrics_bytes "$TG_ADMIN")
    }
    log "starting Tollgate scale gateways: 1 route, and $SCALE_ROUTES dummy routes + 1 ($(wc -c <"$TMP/tollgate-scale-n.toml") bytes of config)"
    start_scale 1
    SC1_PID=$TG_PID SC1_PORT=$TG_PORT
    start_scale n
    SCN_PID=$TG_PID SCN_PORT=$TG_PORT
    PROXY_PIDS[tollgate-scale-1]=$SC1_PID
    PROXY_PIDS[tollgate-scale-n]=$SCN_PID
    add_scenario scale-1 tollgate-scale-1 scale "http://127.0.0.1:$SC1_PORT/allow" allow report
    add_scenario scale-n tollgate-scale-n scale "http://127.0.0.1:$SCN_PORT/allow" allow report
    for name in "${SCALE_NAMES[@]}"; do
        init_name "$name"
        code=$(status_of "${URL[$name]}")
        [[ $code == 200 ]] || die "$name: GET ${URL[$name]} answered $code, expected 200"
    done
    for ROUND in $(seq "$ROUNDS"); do
        log "scale round $ROUND/$ROUNDS"
        for name in "${SCALE_NAMES[@]}"; do
            RUN_ID=$((RUN_ID + 1))
            MEASURED_RUNS=$((MEASURED_RUNS + 1))
            run_wrk "$name" "$DURATION" 1
        done
    done
    # Done with them: give their memory back before the report.
    kill -TERM "$SC1_PID" "$SCN_PID" 2>/dev/null || true
fi

# ----------------------------------------------------------------------------------------------
# Report.
# ----------------------------------------------------------------------------------------------
declare -A MED_RPS MED_P99 MED_CPU
failed=0
for name in "${NAMES[@]}"; do
    MED_RPS[$name]=$(echo "${RPS[$name]}" | median)
    MED_P99[$name]=$(echo "${P99[$name]}" | median)
    MED_CPU[$name]=$(echo "${CPU[$name]}" | median_f)
done

# peer SCENARIO -> "value name" of the faster of nginx and HAProxy (by median req/s)
peer() {
    local n=${MED_RPS[nginx-$1]} h=${MED_RPS[haproxy-$1]}
    if ((n >= h)); then echo "$n nginx-$1"; else echo "$h haproxy-$1"; fi
}
declare -A PEER PEER_NAME
for sc in allow keys reject; do
    read -r "PEER[$sc]" "PEER_NAME[$sc]" <<<"$(peer "$sc")"
done
# The fronted route has no nginx/HAProxy twin: it is compared with the allow peers.
PEER[fronted]=${PEER[allow]} PEER_NAME[fronted]=${PEER_NAME[allow]}
# Nor have the token routes: each is compared with its twin without cost_from (below).
for sc in plainjson tokjson plainsse toksse; do
    PEER[$sc]=${PEER[allow]} PEER_NAME[$sc]=${PEER_NAME[allow]}
done

echo
echo "== Throughput: medians of $ROUNDS round(s), wrk -t$THREADS -c$CONNECTIONS -d${DURATION}s"
echo "   (CPU = the proxy's own utime+stime per request, µs; vs peer = req/s / the faster of nginx"
echo "    and HAProxy in that scenario)"
fmt='%-8s %-15s %9s %8s %8s %7s %7s %8s  %-24s %s\n'
# shellcheck disable=SC2059 # the format is a variable on purpose
printf "$fmt" scenario proxy "req/s" "p99 ms" "CPU µs" usr sys "vs peer" "req/s per round" status
# shellcheck disable=SC2059
printf "$fmt" -------- --------------- --------- -------- -------- ------- ------- -------- \
    ------------------------ ------
for name in "${THROUGHPUT_NAMES[@]}"; do
    sc=${SCEN[$name]}
    st="ok ($([[ ${EXPECT[$name]} == allow ]] && echo 200 || echo 429))"
    if [[ -n ${BAD[$name]} ]]; then
        st="WRONG: ${BAD[$name]}"
        failed=1
    fi
    vs="-"
    [[ ${PROXY[$name]} != upstream ]] && vs="$(ratio "${MED_RPS[$name]}" "${PEER[$sc]}")x"
    sc_label=$sc
    [[ ${PROXY[$name]} == upstream ]] && sc_label="direct"
    # shellcheck disable=SC2059
    printf "$fmt" "$sc_label" "${PROXY[$name]}" "${MED_RPS[$name]}" "$(ms "${MED_P99[$name]}")" \
        "${MED_CPU[$name]}" "$(echo "${CPU_U[$name]}" | median_f)" "$(echo "${CPU_S[$name]}" | median_f)" \
        "$vs" "${RPS[$name]% }" "$st"
done

ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "n/a" && a + 0 >= b) }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "n/a" && a + 0 <= b) }'; }
verdict() { if "$@"; then echo "met"; else echo "NOT met"; fi; }
per_req() { awk -v c="$1" -v r="$2" 'BEGIN { if (r > 0) printf "%.4f", c / r; else print "n/a" }'; }
mb() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

r_redis_allow=$(ratio "${MED_RPS[tollgate-redis-allow]}" "${PEER[allow]}")
r_mem_allow=$(ratio "${MED_RPS[tollgate-mem-allow]}" "${PEER[allow]}")
r_redis_keys=$(ratio "${MED_RPS[tollgate-redis-keys]}" "${PEER[keys]}")
r_mem_keys=$(ratio "${MED_RPS[tollgate-mem-keys]}" "${PEER[keys]}")
r_redis_reject=$(ratio "${MED_RPS[tollgate-redis-reject]}" "${PEER[reject]}")
r_mem_reject=$(ratio "${MED_RPS[tollgate-mem-reject]}" "${PEER[reject]}")
r_redis_mem_allow=$(ratio "${MED_RPS[tollgate-redis-allow]}" "${MED_RPS[tollgate-mem-allow]}")
r_redis_mem_keys=$(ratio "${MED_RPS[tollgate-redis-keys]}" "${MED_RPS[tollgate-mem-keys]}")
r_redis_lua_allow=$(ratio "${MED_RPS[tollgate-redis-allow]}" "${MED_RPS[lua-peer-allow]}")
r_redis_lua_keys=$(ratio "${MED_RPS[tollgate-redis-keys]}" "${MED_RPS[lua-peer-keys]}")
r_redis_lua_reject=$(ratio "${MED_RPS[tollgate-redis-reject]}" "${MED_RPS[lua-peer-reject]}")
cpu_redis_extra=$(awk -v a="${MED_CPU[tollgate-redis-allow]}" -v b="${MED_CPU[tollgate-mem-allow]}" 'BEGIN { printf "%.2f", a - b }')
rss_mem=$(mb "${RSS_MAX[memory]}")
hwm_mem=$(mb "${HWM_MAX[memory]}")
rss_redis=$(mb "${RSS_MAX[redis]}")
hwm_redis=$(mb "${HWM_MAX[redis]}")

mfmt='%-50s %10s %10s  %s\n'
echo
echo "== Ratios (peer = the faster of nginx and HAProxy by median req/s in this run)"
# shellcheck disable=SC2059
printf "$mfmt" measure value target verdict
# shellcheck disable=SC2059
printf "$mfmt" "--------------------------------------------------" "----------" "----------" "-------"
# shellcheck disable=SC2059
{
    # Targets as the performance issues state them (Performance I: in-process; II: Redis).
    printf "$mfmt" "Tollgate memory allow / ${PEER_NAME[allow]}" "${r_mem_allow}x" ">= 1.0x" "$(verdict ge "$r_mem_allow" 1.0) (stretch 1.2x)"
    printf "$mfmt" "Tollgate memory keys / ${PEER_NAME[keys]}" "${r_mem_keys}x" ">= 1.0x" "$(verdict ge "$r_mem_keys" 1.0)"
    printf "$mfmt" "Tollgate memory reject / ${PEER_NAME[reject]}" "${r_mem_reject}x" ">= 1.0x" "$(verdict ge "$r_mem_reject" 1.0)"
    if [[ -n $VS_PROFILE ]]; then
        # The two builds of one gateway side by side (issue #52 item 1): `release`, what
        # `cargo run --release` builds, within 3 % of `dist`, the image's fat LTO.
        for scen in allow keys reject; do
            a=${MED_RPS[tollgate-vs-$scen]} b=${MED_RPS[tollgate-mem-$scen]}
            rel=$a dst=$b
            [[ $PROFILE == release ]] && rel=$b dst=$a
            if [[ "$PROFILE $VS_PROFILE" =~ ^(release dist|dist release)$ ]]; then
                printf "$mfmt" "Tollgate memory $scen: release / dist (req/s)" "$(ratio "$rel" "$dst")x" ">= 0.97x" "$(verdict ge "$(ratio "$rel" "$dst")" 0.97)"
            else
                printf "$mfmt" "Tollgate memory $scen: $VS_PROFILE / $PROFILE (req/s)" "$(ratio "$a" "$b")x" "(info)" "-"
            fi
            printf "$mfmt" "CPU µs/req Tollgate memory $scen: $VS_PROFILE / $PROFILE" "${MED_CPU[tollgate-vs-$scen]} / ${MED_CPU[tollgate-mem-$scen]}" "(info)" "-"
        done
    fi
    printf "$mfmt" "Tollgate+Redis allow / ${PEER_NAME[allow]}" "${r_redis_allow}x" ">= 1.0x" "$(verdict ge "$r_redis_allow" 1.0)"
    printf "$mfmt" "Tollgate+Redis allow / Tollgate memory allow" "${r_redis_mem_allow}x" ">= 0.9x" "$(verdict ge "$r_redis_mem_allow" 0.9)"
    printf "$mfmt" "Tollgate+Redis keys / Tollgate memory keys" "${r_redis_mem_keys}x" ">= 0.85x" "$(verdict ge "$r_redis_mem_keys" 0.85)"
    printf "$mfmt" "Tollgate+Redis reject / ${PEER_NAME[reject]}" "${r_redis_reject}x" ">= 1.0x" "$(verdict ge "$r_redis_reject" 1.0)"
    # The distributed peer (issue #24): the Kong / APISIX architecture on the same Redis.
    printf "$mfmt" "Tollgate+Redis allow / Kong-style peer (lua-peer)" "${r_redis_lua_allow}x" ">= 2.0x" "$(verdict ge "$r_redis_lua_allow" 2.0)"
    printf "$mfmt" "Tollgate+Redis keys / Kong-style peer (lua-peer)" "${r_redis_lua_keys}x" "(info)" "-"
    printf "$mfmt" "Tollgate+Redis reject / Kong-style peer (lua-peer)" "${r_redis_lua_reject}x" "(info)" "-"
    for scen in allow keys reject; do
        printf "$mfmt" "CPU µs/req Tollgate memory $scen / nginx" "${MED_CPU[tollgate-mem-$scen]} / ${MED_CPU[nginx-$scen]}" "<= 1.0x" \
            "$(verdict awk -v a="${MED_CPU[tollgate-mem-$scen]}" -v b="${MED_CPU[nginx-$scen]}" 'BEGIN { exit !(a != "" && b != "" && a <= b) }')"
    done
    printf "$mfmt" "CPU µs/req Tollgate Redis allow - memory allow" "$cpu_redis_extra" "<= 3" "$(verdict le "$cpu_redis_extra" 3)"
    # What five header rules and CORS cost (issue 27): no target, stated.
    printf "$mfmt" "Tollgate memory fronted / memory allow" "$(ratio "${MED_RPS[tollgate-mem-fronted]}" "${MED_RPS[tollgate-mem-allow]}")x" "-" "the cost of 5 header rules + CORS"
    printf "$mfmt" "CPU µs/req Tollgate memory fronted - allow" "$(awk -v a="${MED_CPU[tollgate-mem-fronted]}" -v b="${MED_CPU[tollgate-mem-allow]}" 'BEGIN { printf "%.2f", a - b }')" "-" "the same, in CPU"
    for kind in json sse; do
        printf "$mfmt" "Tollgate memory cost_from $kind / without" "$(ratio "${MED_RPS[tollgate-mem-tok$kind]}" "${MED_RPS[tollgate-mem-plain$kind]}")x" "-" "scanning the body (16 KB JSON; 200 events)"
        printf "$mfmt" "CPU µs/req Tollgate memory cost_from $kind - without" "$(awk -v a="${MED_CPU[tollgate-mem-tok$kind]}" -v b="${MED_CPU[tollgate-mem-plain$kind]}" 'BEGIN { printf "%.2f", a - b }')" "-" "the same, in CPU"
    done
    printf "$mfmt" "Tollgate memory: max RSS under load (MB)" "$rss_mem" "<= 50" \
        "$(verdict awk -v x="$rss_mem" -v y="$hwm_mem" 'BEGIN { exit !(x <= 50 && y <= 50) }') (VmHWM $hwm_mem MB)"
    printf "$mfmt" "Tollgate Redis: max RSS under load (MB)" "$rss_redis" "<= 50" \
        "$(verdict awk -v x="$rss_redis" -v y="$hwm_redis" 'BEGIN { exit !(x <= 50 && y <= 50) }') (VmHWM $hwm_redis MB)"
}

echo
echo "== Redis (Tollgate+Redis scenarios; INFO deltas around each run ÷ the requests wrk counted)"
# shellcheck disable=SC2059
printf "$mfmt" measure value target verdict
# shellcheck disable=SC2059
printf "$mfmt" "--------------------------------------------------" "----------" "----------" "-------"
for name in tollgate-redis-allow tollgate-redis-keys tollgate-redis-reject lua-peer-allow lua-peer-keys lua-peer-reject; do
    sc=${SCEN[$name]}
    cmd=$(per_req "${CLIENT_CMDS[$name]}" "${REQS[$name]}")
    scr=$(per_req "${SCRIPT_CMDS[$name]}" "${REQS[$name]}")
    all=$(per_req "${CMDS[$name]}" "${REQS[$name]}")
    rcpu=$(echo "${REDIS_CPU[$name]}" | median_f)
    both=$(awk -v a="$rcpu" -v b="${MED_CPU[$name]}" 'BEGIN { printf "%.2f", a + b }')
    if [[ ${PROXY[$name]} == lua-peer ]]; then
        # The Kong-style peer, for comparison (its pipelined INCRBY/EXPIRE are inside "all calls").
        # shellcheck disable=SC2059
        {
            printf "$mfmt" "[lua-peer $sc] script calls per request" "$scr" "(info)" "-"
            printf "$mfmt" "[lua-peer $sc]   all calls per request" "$all" "(info)" "-"
            printf "$mfmt" "[lua-peer $sc]   Redis CPU µs per request" "$rcpu" "(info)" "-"
            printf "$mfmt" "[lua-peer $sc]   nginx + Redis CPU µs per request" "$both" "(info)" "-"
        }
        continue
    fi
    # shellcheck disable=SC2059
    if [[ $sc == reject ]]; then
        printf "$mfmt" "[$sc] Redis commands sent per request" "$cmd" "<= 0.01" \
            "$(verdict le "$cmd" 0.01)"
        printf "$mfmt" "[$sc] Redis CPU µs per request (INFO cpu)" "$rcpu" "(info)" "-"
    else
        # One round trip per request for a route with two limits (not one per limit); concurrent
        # requests share EVALSHAs (the store batches them), so under load it is below 1.0.
        printf "$mfmt" "[$sc] Redis commands sent per request" "$cmd" "<= 1.0" \
            "$(verdict awk -v x="$cmd" 'BEGIN { exit !(x != "n/a" && x > 0 && x <= 1.01) }')"
        printf "$mfmt" "[$sc] Redis CPU µs per decided request (INFO cpu)" "$rcpu" "<= 3" \
            "$(verdict le "$rcpu" 3)"
    fi
    # shellcheck disable=SC2059
    {
        printf "$mfmt" "[$sc]   script calls per request" "$scr" "(info)" "-"
        printf "$mfmt" "[$sc]   all calls per request (incl. inside Lua)" "$all" "(info)" "-"
        printf "$mfmt" "[$sc]   Tollgate + Redis CPU µs per request" "$both" "(info)" "-"
    }
done
echo "(\"sent\" = EVAL/EVALSHA/FCALL and control commands, i.e. client round trips, 'info' excluded;"
echo " \"script calls\" = EVAL/EVALSHA/FCALL (and _RO) only;"
echo " \"all calls\" also counts each redis.call() inside the script, which INFO commandstats reports"
echo " as a command of its own. Redis CPU = used_cpu_sys + used_cpu_user delta, median of the rounds."
echo " Requests: ${REQS[tollgate-redis-allow]} allow, ${REQS[tollgate-redis-keys]} keys, ${REQS[tollgate-redis-reject]} reject.)"

if [[ $LATENCY == 1 ]]; then
    echo
    echo "== Latency at a fixed rate: $LAT_RATE req/s = 50 % of nginx's median allow ($NGX_ALLOW_MED req/s),"
    echo "   open loop (bench/fixed-rate.rs, $LAT_CONNECTIONS connections, ${LAT_DURATION}s, medians of $ROUNDS round(s));"
    echo "   latency from each request's scheduled send time (no coordinated omission)"
    lfmt='%-15s %9s %8s %8s %9s %12s %8s %7s  %s\n'
    # shellcheck disable=SC2059
    printf "$lfmt" proxy "req/s" "p50 ms" "p99 ms" "p99.9 ms" "p99 svc ms" "CPU µs" "late %" status
    # shellcheck disable=SC2059
    printf "$lfmt" --------------- --------- -------- -------- --------- ------------ -------- ------- ------
    declare -A FR_MED_P99
    for name in "${LAT_NAMES[@]}"; do
        FR_MED_P99[$name]=$(echo "${FR_P99[$name]}" | median)
        st="ok (200)"
        if [[ -n ${FR_BAD[$name]:-} ]]; then
            st="WRONG: ${FR_BAD[$name]}"
            failed=1
        fi
        got=$(echo "${FR_RATE[$name]}" | median)
        if awk -v g="$got" -v r="$LAT_RATE" 'BEGIN { exit !(g < 0.95 * r) }'; then
            st+="; could not sustain the rate"
        fi
        late=$(awk -v l="${FR_LATE[$name]:-0}" -v n="${FR_REQS[$name]:-0}" 'BEGIN { printf "%.1f", (n > 0 ? 100 * l / n : 0) }')
        # shellcheck disable=SC2059
        printf "$lfmt" "${PROXY[$name]}" "$got" "$(ms "$(echo "${FR_P50[$name]}" | median)")" \
            "$(ms "${FR_MED_P99[$name]}")" "$(ms "$(echo "${FR_P999[$name]}" | median)")" \
            "$(ms "$(echo "${FR_SVC99[$name]}" | median)")" "$(echo "${FR_CPU[$name]}" | median_f)" "$late" "$st"
    done
    r_mem_p99=$(ratio "${FR_MED_P99[tollgate-mem-allow]}" "${FR_MED_P99[nginx-allow]}")
    r_redis_p99=$(ratio "${FR_MED_P99[tollgate-redis-allow]}" "${FR_MED_P99[nginx-allow]}")
    echo
    # shellcheck disable=SC2059
    {
        printf "$mfmt" "Tollgate memory p99 / nginx p99 at $LAT_RATE req/s" "${r_mem_p99}x" "<= 1.0x" "$(verdict le "$r_mem_p99" 1.0)"
        printf "$mfmt" "Tollgate+Redis p99 / nginx p99 at $LAT_RATE req/s" "${r_redis_p99}x" "<= 1.0x" "$(verdict le "$r_redis_p99" 1.0)"
    }
    echo "(p99 svc = from the actual send, as a closed-loop client would report it; late % = sends more"
    echo " than 1 ms behind schedule: the proxy, or the client on this shared machine, fell behind.)"
fi

if [[ $SCALE == 1 ]]; then
    echo
    echo "== Scale: Tollgate memory, one catch-all route (the /allow limits) alone vs behind $SCALE_ROUTES"
    echo "   dummy routes /svcI/api (one limit each); wrk as above, medians of $ROUNDS interleaved round(s)"
    sfmt='%-22s %9s %8s %8s %10s %13s %9s  %-24s %s\n'
    # shellcheck disable=SC2059
    printf "$sfmt" routes "req/s" "p99 ms" "CPU µs" "idle RSS" "idle /metrics" "start s" "req/s per round" status
    # shellcheck disable=SC2059
    printf "$sfmt" ---------------------- --------- -------- -------- ---------- ------------- --------- \
        ------------------------ ------
    for name in "${SCALE_NAMES[@]}"; do
        kind=${name#scale-}
        label="1"
        [[ $kind == n ]] && label="$SCALE_ROUTES + 1"
        st="ok (200)"
        if [[ -n ${BAD[$name]} ]]; then
            st="WRONG: ${BAD[$name]}"
            failed=1
        fi
        # shellcheck disable=SC2059
        printf "$sfmt" "$label" "${MED_RPS[$name]}" "$(ms "${MED_P99[$name]}")" "${MED_CPU[$name]}" \
            "$(mb "${SC_IDLE_RSS[$kind]}") MB" "${SC_METRICS[$kind]} B" "${SC_START[$kind]}" "${RPS[$name]% }" "$st"
    done
    r_scale=$(ratio "${MED_RPS[scale-n]}" "${MED_RPS[scale-1]}")
    r_scale_cpu=$(ratio "${MED_CPU[scale-n]}" "${MED_CPU[scale-1]}")
    echo
    # shellcheck disable=SC2059
    {
        printf "$mfmt" "req/s with $SCALE_ROUTES + 1 routes / with 1 route" "${r_scale}x" ">= 0.95x" "$(verdict ge "$r_scale" 0.95)"
        printf "$mfmt" "CPU µs/req with $SCALE_ROUTES + 1 routes / with 1 route" "${r_scale_cpu}x" "(info)" "-"
    }
fi

if [[ $TLS == 1 ]]; then
    for key in $TLS_KEYS; do
        echo
        echo "== TLS ($key): bench/tls.sh on the same binary, nginx and Tollgate terminating TLS"
        log "TLS block ($key)"
        if ! KEY=$key DURATION=$DURATION ROUNDS=$ROUNDS SKIP_BUILD=1 BIN="$BIN" bash "$BENCH/tls.sh"; then
            echo "TLS block ($key): FAILED (see the log above)"
            failed=1
        fi
    done
fi

echo
echo "load after the run: $(cut -d' ' -f1-3 /proc/loadavg) (wrk and the servers alone keep 2 cores busy)"
echo "runs during which a compiler (rustc/cargo/cc/ld) was running on the machine: $NOISY_RUNS of $MEASURED_RUNS"

if ((failed)); then
    log "some scenarios answered with the wrong status codes (see the status columns)"
    exit 2
fi
