#!/usr/bin/env bash
# bench/compare.sh — Tollgate side by side with nginx (limit_req) and HAProxy (stick table),
# on loopback (127.0.0.1) only, bounded in time.
#
#   bash bench/compare.sh                     # DURATION=5 ROUNDS=3: about 3 minutes after the build
#   DURATION=10 ROUNDS=5 bash bench/compare.sh
#
# What it starts (all on free ports of 127.0.0.1, all in one temporary directory, all stopped on
# exit, Ctrl-C or failure):
#   upstream        nginx, 1 worker, `return 200` (its own prefix and config; the system nginx is
#                   not touched)
#   nginx           reverse proxy, 2 workers, keep-alive to the upstream, limit_req:
#                   /allow  zone rate=10000000r/s burst=1000000 nodelay   (never fires)
#                   /reject zone rate=1r/m, limit_req_status 429          (rejects all but the 1st)
#   HAProxy         nbthread 2, http-reuse always, stick tables tracking src with
#                   http_req_rate(10s): /allow denies above 10^9 (never), /reject above 1 (429)
#   Tollgate        in-process store ("memory")
#   Tollgate        on its own redis-server (--save '' --appendonly no)
#                   /allow : gcra per-ip 1000000 per 1s + fixed_window global 10^9 per 1s
#                   /reject: gcra global 1 per 1h (every request after the first is rejected)
#
# Then, for ROUNDS interleaved rounds, `wrk -t1 -c64 -dDURATIONs --latency` against every
# scenario, and prints medians of req/s and p99, the ratios against the faster peer (nginx or
# HAProxy, per scenario, by median), Redis commands per request (INFO commandstats deltas, `info`
# excluded: both the commands Tollgate sends — EVALSHA etc., i.e. round trips — and all calls,
# which also count every redis.call() inside the Lua script) and the peak RSS of each Tollgate
# (VmRSS sampled under load, VmHWM).
#
# Environment:
#   DURATION     seconds per wrk run (default 5)
#   ROUNDS       interleaved rounds (default 3)
#   WARMUP       seconds of one warm-up wrk run per scenario before round 1 (default 1; 0 = none)
#   SKIP_BUILD   1: do not run cargo, use the existing target/release/tollgate
#   BUILD_TRIES  attempts at `cargo build --release`, 60 s apart (default 1)
#   KEEP_TMP     1: keep the temporary directory (configs, logs, raw wrk output)
#
# Exit status: 0 when every scenario ran and answered as expected (200 for allow, 429 for
# reject) — whether or not the performance targets are met; 1 on a missing tool or a setup
# failure; 2 when a scenario answered with the wrong status codes.
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
THREADS=1
CONNECTIONS=64

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH="$ROOT/bench"
LUA="$BENCH/wrk-report.lua"

log() { printf '[compare] %s\n' "$*" >&2; }
die() {
    printf '[compare] error: %s\n' "$*" >&2
    exit 1
}

for v in DURATION ROUNDS WARMUP BUILD_TRIES; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a whole number (got '${!v}')"
done
((DURATION >= 1)) || die "DURATION must be at least 1"
((ROUNDS >= 1)) || die "ROUNDS must be at least 1"
((BUILD_TRIES >= 1)) || BUILD_TRIES=1

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
need haproxy haproxy
need wrk wrk
need redis-server redis-server
need redis-cli redis-tools
need curl curl
need awk gawk
if [[ $SKIP_BUILD != 1 ]]; then need cargo ""; fi
if ((${#missing[@]})); then
    printf '[compare] missing tools: %s\n' "${missing[*]}" >&2
    if ((${#pkgs[@]})); then
        printf '[compare] install them with:  sudo apt-get install -y %s\n' "${pkgs[*]}" >&2
    fi
    if [[ " ${missing[*]} " == *" cargo "* ]]; then
        printf '[compare] cargo: install a Rust toolchain (https://rustup.rs), or run with SKIP_BUILD=1\n' >&2
    fi
    printf '[compare] nothing was installed; exiting.\n' >&2
    exit 1
fi
[[ -f $LUA ]] || die "missing $LUA"

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

# A free TCP port on 127.0.0.1, not handed out before in this run.
USED_PORTS=" "
free_port() {
    local p
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 40000))
        [[ $USED_PORTS == *" $p "* ]] && continue
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            USED_PORTS+="$p "
            echo "$p"
            return 0
        fi
    done
    die "no free port found"
}

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
echo "haproxy:    $(haproxy -v 2>&1 | head -n1)"
echo "wrk:        $(wrk -v 2>&1 | head -n1)"
echo "redis:      $(redis-server --version)"
echo "rustc:      $(rustc --version 2>/dev/null || echo n/a)"
echo "tollgate:   $commit$( ((dirty > 0)) && echo " + uncommitted changes in src/ or Cargo files")"
echo "wrk args:   -t$THREADS -c$CONNECTIONS -d${DURATION}s --latency; ROUNDS=$ROUNDS WARMUP=${WARMUP}s"
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
if [[ $SKIP_BUILD != 1 ]]; then
    for try in $(seq "$BUILD_TRIES"); do
        log "cargo build --release (attempt $try/$BUILD_TRIES)"
        if (cd "$ROOT" && cargo build --release >"$TMP/build.log" 2>&1); then
            break
        fi
        tail -n 30 "$TMP/build.log" >&2
        ((try < BUILD_TRIES)) || die "cargo build --release failed (log: $TMP/build.log)"
        log "build failed; retrying in 60 s"
        sleep 60
    done
fi
[[ -x $TARGET_DIR/release/tollgate ]] || die "no $TARGET_DIR/release/tollgate (build it, or drop SKIP_BUILD)"
# Run a private copy, so a rebuild by someone else during the run cannot swap the binary.
BIN="$TMP/tollgate"
cp "$TARGET_DIR/release/tollgate" "$BIN"

# ----------------------------------------------------------------------------------------------
# Ports and configs.
# ----------------------------------------------------------------------------------------------
UP_PORT=$(free_port)
NGX_PORT=$(free_port)
HAP_PORT=$(free_port)
REDIS_PORT=$(free_port)
TGM_PORT=$(free_port)
TGM_ADMIN=$(free_port)
TGR_PORT=$(free_port)
TGR_ADMIN=$(free_port)

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
    }
}
EOF
} >"$TMP/upstream/nginx.conf"

{
    echo "worker_processes 2;"
    nginx_common nginx
    echo "http {"
    nginx_http_common nginx
    cat <<EOF
    limit_req_zone \$binary_remote_addr zone=allow:10m rate=10000000r/s;
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
        location /reject { limit_req zone=reject; proxy_pass http://up; }
    }
}
EOF
} >"$TMP/nginx/nginx.conf"

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

backend st_reject
    stick-table type ip size 100k expire 60s store http_req_rate(10s)

frontend gw
    bind 127.0.0.1:$HAP_PORT
    http-request track-sc0 src table st_allow if { path_beg /allow }
    http-request track-sc1 src table st_reject if { path_beg /reject }
    http-request deny deny_status 429 if { path_beg /allow } { sc_http_req_rate(0,st_allow) gt 1000000000 }
    http-request deny deny_status 429 if { path_beg /reject } { sc_http_req_rate(1,st_reject) gt 1 }
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

# ----------------------------------------------------------------------------------------------
# Start everything.
# ----------------------------------------------------------------------------------------------
start_nginx() { # start_nginx NAME PORT
    nginx -t -q -p "$TMP/$1" -c "$TMP/$1/nginx.conf" >"$TMP/$1.check.log" 2>&1 ||
        die "nginx config $1 is invalid: $(cat "$TMP/$1.check.log")"
    nginx -p "$TMP/$1" -c "$TMP/$1/nginx.conf" >"$TMP/$1.out" 2>&1 </dev/null &
    local pid=$!
    PIDS+=("$pid")
    wait_port "$2" "$pid" "nginx ($1)" "$TMP/$1.error.log"
    local w
    for w in $(children_of "$pid"); do PIDS+=("$w"); done
}

log "starting upstream (nginx return 200) on 127.0.0.1:$UP_PORT"
start_nginx upstream "$UP_PORT"
log "starting nginx proxy on 127.0.0.1:$NGX_PORT"
start_nginx nginx "$NGX_PORT"

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

start_tollgate() { # start_tollgate NAME PORT; sets TG_PID
    RUST_LOG=warn "$BIN" --config "$TMP/$1.toml" >"$TMP/$1.out" 2>"$TMP/$1.err" </dev/null &
    TG_PID=$!
    PIDS+=("$TG_PID")
    for _ in $(seq 400); do
        grep -q '^tollgate listening' "$TMP/$1.out" 2>/dev/null && break
        kill -0 "$TG_PID" 2>/dev/null || die "$1 exited at start: $(tail -n 20 "$TMP/$1.err")"
        sleep 0.05
    done
    grep -q '^tollgate listening' "$TMP/$1.out" || die "$1 did not print 'tollgate listening' within 20 s"
    wait_port "$2" "$TG_PID" "$1" "$TMP/$1.err"
}
log "starting Tollgate (memory) on 127.0.0.1:$TGM_PORT"
start_tollgate tollgate-memory "$TGM_PORT"
TGM_PID=$TG_PID
log "starting Tollgate (Redis) on 127.0.0.1:$TGR_PORT"
start_tollgate tollgate-redis "$TGR_PORT"
TGR_PID=$TG_PID

# ----------------------------------------------------------------------------------------------
# Scenarios: NAME URL EXPECT(allow|reject)
# ----------------------------------------------------------------------------------------------
SCENARIOS=(
    "upstream            http://127.0.0.1:$UP_PORT/allow  allow"
    "nginx-allow         http://127.0.0.1:$NGX_PORT/allow  allow"
    "haproxy-allow       http://127.0.0.1:$HAP_PORT/allow  allow"
    "tollgate-mem-allow  http://127.0.0.1:$TGM_PORT/allow  allow"
    "tollgate-redis-allow http://127.0.0.1:$TGR_PORT/allow allow"
    "nginx-reject        http://127.0.0.1:$NGX_PORT/reject reject"
    "haproxy-reject      http://127.0.0.1:$HAP_PORT/reject reject"
    "tollgate-mem-reject http://127.0.0.1:$TGM_PORT/reject reject"
    "tollgate-redis-reject http://127.0.0.1:$TGR_PORT/reject reject"
)

status_of() { curl -s -o /dev/null --noproxy '*' --max-time 5 -w '%{http_code}' "$1" || true; }

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
# client_delta BEFORE AFTER -> commands clients sent (round trips): scripts + control, plus data
# commands only when no script ran in the window (they were then sent by a client, not a script).
client_delta() {
    local a1 s1 c1 d1 a2 s2 c2 d2
    read -r a1 s1 c1 d1 <<<"$1"
    read -r a2 s2 c2 d2 <<<"$2"
    if ((s2 - s1 > 0)); then echo $((s2 - s1 + c2 - c1)); else echo $((a2 - a1)); fi
}

log "checking status codes (allow: 200; reject: the second request 429)"
for s in "${SCENARIOS[@]}"; do
    read -r name url expect <<<"$s"
    if [[ $expect == allow ]]; then
        before=$(redis_calls)
        code=$(status_of "$url")
        [[ $code == 200 ]] || die "$name: GET $url answered $code, expected 200"
        if [[ $name == tollgate-redis-* ]]; then
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
# Runs.
# ----------------------------------------------------------------------------------------------
declare -A RPS P99 REQS CMDS CLIENT_CMDS BAD RSS_MAX HWM_MAX
for s in "${SCENARIOS[@]}"; do
    read -r name _ _ <<<"$s"
    RPS[$name]=""
    P99[$name]=""
    REQS[$name]=0
    CMDS[$name]=0
    CLIENT_CMDS[$name]=0
    BAD[$name]=""
done
RSS_MAX[memory]=0
RSS_MAX[redis]=0
HWM_MAX[memory]=0
HWM_MAX[redis]=0

status_kb() { # status_kb PID FIELD -> kB (0 when the process is gone)
    local v
    v=$(awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status" 2>/dev/null || true)
    echo "${v:-0}"
}

# run_wrk NAME URL EXPECT SECONDS RECORD(0|1)
run_wrk() {
    local name=$1 url=$2 expect=$3 secs=$4 record=$5
    local out="$TMP/wrk-$name-$RUN_ID.txt"
    local gw_pid="" gw_kind="" before="0 0 0 0" after="0 0 0 0"
    case $name in
    tollgate-mem-*) gw_pid=$TGM_PID gw_kind=memory ;;
    tollgate-redis-*) gw_pid=$TGR_PID gw_kind=redis ;;
    esac
    if [[ $name == tollgate-redis-* ]]; then before=$(redis_calls); fi
    wrk -t"$THREADS" -c"$CONNECTIONS" -d"${secs}s" --latency -s "$LUA" "$url" >"$out" 2>&1 &
    WRK_PID=$!
    if ((record)) && (($(compilers) > 0)); then NOISY_RUNS=$((NOISY_RUNS + 1)); fi
    if [[ -n $gw_pid ]]; then
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
    if [[ $name == tollgate-redis-* ]]; then after=$(redis_calls); fi
    if [[ -n $gw_pid ]]; then
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
    # Status codes under load: allow must be all 2xx; reject all non-2xx but the first.
    local problem=""
    if [[ $expect == allow ]]; then
        ((non2xx == 0)) || problem="$non2xx non-2xx answers"
    else
        ((requests - non2xx <= 1)) || problem="$((requests - non2xx)) 2xx answers (expected 429)"
    fi
    ((connect + read + write + timeout == 0)) ||
        problem+="${problem:+; }socket errors connect=$connect read=$read write=$write timeout=$timeout"
    local rps
    rps=$(awk -v r="$requests" -v d="$duration_us" 'BEGIN { printf "%.0f", r / (d / 1e6) }')
    if ((record)); then
        RPS[$name]+="$rps "
        P99[$name]+="$p99_us "
        REQS[$name]=$((REQS[$name] + requests))
        if [[ $name == tollgate-redis-* ]]; then
            CMDS[$name]=$((CMDS[$name] + $(all_delta "$before" "$after")))
            CLIENT_CMDS[$name]=$((CLIENT_CMDS[$name] + $(client_delta "$before" "$after")))
        fi
        if [[ -n $problem ]]; then BAD[$name]+="round $ROUND: $problem. "; fi
        log "$(printf '%-22s round %d: %8s req/s  p99 %7.2f ms%s' "$name" "$ROUND" "$rps" \
            "$(awk -v p="$p99_us" 'BEGIN { print p / 1000 }')" "${problem:+  !! $problem}")"
    fi
    return 0
}

RUN_ID=0
NOISY_RUNS=0
if ((WARMUP > 0)); then
    log "warm-up: ${WARMUP}s per scenario"
    ROUND=0
    for s in "${SCENARIOS[@]}"; do
        read -r name url expect <<<"$s"
        RUN_ID=$((RUN_ID + 1))
        run_wrk "$name" "$url" "$expect" "$WARMUP" 0
    done
fi
for ROUND in $(seq "$ROUNDS"); do
    log "round $ROUND/$ROUNDS"
    for s in "${SCENARIOS[@]}"; do
        read -r name url expect <<<"$s"
        RUN_ID=$((RUN_ID + 1))
        run_wrk "$name" "$url" "$expect" "$DURATION" 1
    done
done

# ----------------------------------------------------------------------------------------------
# Report.
# ----------------------------------------------------------------------------------------------
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ a[NR] = $1 } END {
    if (NR == 0) { print 0; exit }
    if (NR % 2) print a[(NR + 1) / 2]; else printf "%.0f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

declare -A MED_RPS MED_P99
echo
echo "== Results: medians of $ROUNDS round(s), wrk -t$THREADS -c$CONNECTIONS -d${DURATION}s"
printf '%-22s %12s %10s  %-30s %s\n' scenario "req/s" "p99 ms" "req/s per round" status
printf '%-22s %12s %10s  %-30s %s\n' "----------------------" "------------" "----------" \
    "------------------------------" "------"
failed=0
for s in "${SCENARIOS[@]}"; do
    read -r name _ expect <<<"$s"
    MED_RPS[$name]=$(echo "${RPS[$name]}" | median)
    MED_P99[$name]=$(echo "${P99[$name]}" | median)
    st="ok ($([[ $expect == allow ]] && echo 200 || echo 429))"
    if [[ -n ${BAD[$name]} ]]; then
        st="WRONG: ${BAD[$name]}"
        failed=1
    fi
    printf '%-22s %12s %10.2f  %-30s %s\n' "$name" "${MED_RPS[$name]}" \
        "$(awk -v p="${MED_P99[$name]}" 'BEGIN { print p / 1000 }')" "${RPS[$name]% }" "$st"
done

# peer NAME-SUFFIX -> "value name" of the faster of nginx and HAProxy (by median req/s)
peer() {
    local n=${MED_RPS[nginx-$1]} h=${MED_RPS[haproxy-$1]}
    if ((n >= h)); then echo "$n nginx-$1"; else echo "$h haproxy-$1"; fi
}
read -r peer_allow peer_allow_name <<<"$(peer allow)"
read -r peer_reject peer_reject_name <<<"$(peer reject)"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "n/a" && a + 0 >= b) }'; }
verdict() { if "$@"; then echo "met"; else echo "NOT met"; fi; }

r_redis_allow=$(ratio "${MED_RPS[tollgate-redis-allow]}" "$peer_allow")
r_mem_allow=$(ratio "${MED_RPS[tollgate-mem-allow]}" "$peer_allow")
r_redis_reject=$(ratio "${MED_RPS[tollgate-redis-reject]}" "$peer_reject")
r_mem_reject=$(ratio "${MED_RPS[tollgate-mem-reject]}" "$peer_reject")
per_req() { awk -v c="$1" -v r="$2" 'BEGIN { if (r > 0) printf "%.4f", c / r; else print "n/a" }'; }
cmd_allow=$(per_req "${CLIENT_CMDS[tollgate-redis-allow]}" "${REQS[tollgate-redis-allow]}")
cmd_reject=$(per_req "${CLIENT_CMDS[tollgate-redis-reject]}" "${REQS[tollgate-redis-reject]}")
all_allow=$(per_req "${CMDS[tollgate-redis-allow]}" "${REQS[tollgate-redis-allow]}")
all_reject=$(per_req "${CMDS[tollgate-redis-reject]}" "${REQS[tollgate-redis-reject]}")
mb() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
rss_mem=$(mb "${RSS_MAX[memory]}")
hwm_mem=$(mb "${HWM_MAX[memory]}")
rss_redis=$(mb "${RSS_MAX[redis]}")
hwm_redis=$(mb "${HWM_MAX[redis]}")

echo
echo "== Ratios (peer = the faster of nginx and HAProxy by median req/s in this run)"
printf '%-44s %10s %10s  %s\n' measure value target verdict
printf '%-44s %10s %10s  %s\n' "--------------------------------------------" "----------" "----------" "-------"
printf '%-44s %9sx %10s  %s\n' "Tollgate+Redis allow / $peer_allow_name" "$r_redis_allow" ">= 1.0x" \
    "$(verdict ge "$r_redis_allow" 1.0)"
printf '%-44s %9sx %10s  %s\n' "Tollgate memory allow / $peer_allow_name" "$r_mem_allow" ">= 1.2x" \
    "$(verdict ge "$r_mem_allow" 1.2)"
printf '%-44s %9sx %10s  %s\n' "Tollgate+Redis reject / $peer_reject_name" "$r_redis_reject" ">= 1.0x" \
    "$(verdict ge "$r_redis_reject" 1.0)"
printf '%-44s %9sx %10s  %s\n' "Tollgate memory reject / $peer_reject_name" "$r_mem_reject" "(info)" "-"
# The target is one round trip per request for a route with two limits (not one per limit).
# Concurrent requests share EVALSHAs (the store batches them), so under load it is below 1.0.
printf '%-44s %10s %10s  %s\n' "Redis commands sent per allowed request" "$cmd_allow" "<= 1.0" \
    "$(verdict awk -v x="$cmd_allow" 'BEGIN { exit !(x != "n/a" && x > 0 && x <= 1.01) }')"
printf '%-44s %10s %10s  %s\n' "Redis commands sent per rejected request" "$cmd_reject" "<= 0.01" \
    "$(verdict awk -v x="$cmd_reject" 'BEGIN { exit !(x != "n/a" && x <= 0.01) }')"
printf '%-44s %10s %10s  %s\n' "  all calls (incl. inside Lua) per allowed" "$all_allow" "(info)" "-"
printf '%-44s %10s %10s  %s\n' "  all calls (incl. inside Lua) per rejected" "$all_reject" "(info)" "-"
printf '%-44s %10s %10s  %s\n' "Tollgate memory: max RSS under load (MB)" "$rss_mem" "<= 30" \
    "$(verdict awk -v x="$rss_mem" -v y="$hwm_mem" 'BEGIN { exit !(x <= 30 && y <= 30) }') (VmHWM $hwm_mem MB)"
printf '%-44s %10s %10s  %s\n' "Tollgate Redis: max RSS under load (MB)" "$rss_redis" "<= 30" \
    "$(verdict awk -v x="$rss_redis" -v y="$hwm_redis" 'BEGIN { exit !(x <= 30 && y <= 30) }') (VmHWM $hwm_redis MB)"
echo
echo "(Redis commands: INFO commandstats deltas around each Tollgate+Redis run, 'info' excluded, over"
echo " ${REQS[tollgate-redis-allow]} allowed and ${REQS[tollgate-redis-reject]} rejected requests that wrk counted. \"sent\" = EVAL/EVALSHA/FCALL and"
echo " control commands, i.e. client round trips; \"all calls\" also counts each redis.call() inside the"
echo " script, which INFO commandstats reports as a command of its own.)"
echo "load after the run: $(cut -d' ' -f1-3 /proc/loadavg) (wrk and the servers alone keep 2 cores busy)"
echo "runs during which a compiler (rustc/cargo/cc/ld) was running on the machine: $NOISY_RUNS of $((ROUNDS * ${#SCENARIOS[@]}))"

if ((failed)); then
    log "some scenarios answered with the wrong status codes (see the status column)"
    exit 2
fi
