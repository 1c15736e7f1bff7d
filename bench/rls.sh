#!/usr/bin/env bash
# bench/rls.sh — Tollgate as Envoy's rate limit service ([rls], #37 §4), on loopback
# (127.0.0.1) only, bounded in time, everything it starts stopped on exit, Ctrl-C or failure.
#
#   bash bench/rls.sh                       # DURATION=5 ROUNDS=3 WARMUP=1: about 7 min
#   QUICK=1 bash bench/rls.sh               # DURATION=2 ROUNDS=1 WARMUP=0 DESCRIPTORS=1: < 1 min
#   SERVICE=0 bash bench/rls.sh             # the Envoy block alone
#   BUILD=1 bash bench/rls.sh               # cargo build --profile dist + the release load client first
#
# What it starts (free ports of 127.0.0.1 from bench/ports.sh, one temporary directory):
#   upstream   nginx, 1 worker, `return 200 "ok\n"` (bench/compare.sh's upstream)
#   redis      its own redis-server (--save '' --appendonly no)
#   tollgate   two gateways, `[server] workers = 2`: one on the in-process store ("mem"), one on
#              the Redis ("redis", store timeout 500ms); each serves
#                [rls] domain `bench`: api_key gcra 1,000,000/1s (never refuses),
#                  generic_key=deny gcra 1/1h (refuses all but the first), user gcra 1,000,000/1s
#                  (the load client's); [[rls.quota]] `bench`: fixed_window 10^12 a day,
#                  subject the bucket's `key`, lease_max RLQS_LEASE_MAX, assignment_ttl 10s
#                [[routes]] `/deny`: gcra global 1/1h; `/`: gcra header:x-api-key 1,000,000/1s
#                  (the same limits, in-process: scenario d)
#   envoy      five Envoys (ENVOY_BIN, `--concurrency ENVOY_CONCURRENCY`), one listener, route
#              `/deny` with the action generic_key=deny, `/` with x-api-key → api_key:
#                base       no global limit (scenario a)
#                rl-mem     envoy.filters.http.ratelimit on tollgate mem (b), timeout 1s,
#                rl-redis   ... on tollgate redis        failure_mode_deny: true (an error is a 500)
#                rlqs-mem   envoy.filters.http.rate_limit_quota on tollgate mem (c): bucket
#                rlqs-redis ... on tollgate redis        {route: api, key: <x-api-key>},
#                           reporting_interval 1s (Envoy 1.40 reports every 5 s whatever it
#                           says), no_assignment and expired behaviour DENY_ALL (so a request
#                           decided without the service's assignment is a 429 and is counted)
#
# 1. Through Envoy (ENVOY=1): for ROUNDS interleaved rounds, `wrk -t1 -cCONNECTIONS
#    -dDURATIONs` with bench/wrk-keys.lua (each request one of 10,000 API keys, at random):
#      a          Envoy alone                     b-mem, b-redis    Envoy + ratelimit filter
#      d-mem      Tollgate as the proxy           d-redis           (same limits, in-process)
#      c1-mem, c1-redis       Envoy + RLQS, every request in one bucket (one key)
#      c100-mem, c100-redis   Envoy + RLQS, 100 keys: 100 buckets
#    and the "half" variant (`-- 10000 /deny`: every other request to /deny, refused):
#      a-half, b-half-mem, b-half-redis, d-half-mem, d-half-redis
#    Reported (medians over the rounds): req/s, its ratio to a (a-half for the half rows), p99,
#    the share of non-2xx answers, and CPU per request of Envoy, Tollgate and Redis
#    (utime + stime of /proc/PID/stat before and after, all threads; the upstream's excluded).
#    For RLQS also the share of requests decided without an assignment from the service
#    (answered by the DENY_ALL fallback, or by an assignment too small): over the whole run
#    (wrk's non-2xx), and in steady state from Envoy's own counters (`/stats`
#    http.in.downstream_rq_2xx / _4xx) between RLQS_SETTLE seconds into the run and its end.
#    RLQS runs last RLQS_DURATION s: Envoy reports every 5 s, and a bucket idle since the
#    previous round holds a 1-unit assignment until its next report.
#    Envoy 1.40's quota filter never holds a request for the service: every request is decided
#    in Envoy, from the bucket's assignment or from its fallback.
# 2. The service alone (SERVICE=1): examples/rls_load (STREAMS gRPC connections, IN_FLIGHT calls
#    in flight on each, DESCRIPTORS descriptors user=<one of KEYS> a call, each call Envoy's own
#    shape: its headers, HEADERS then one DATA frame) against each gateway's
#    [rls] listener for DURATION s, ROUNDS interleaved rounds, once per value in DESCRIPTORS:
#    calls/s, descriptors/s, Tollgate's CPU per descriptor and so descriptors per CPU-second
#    (target ≥ 50,000 on memory), Redis's CPU per descriptor.
#
# Environment:
#   DURATION          seconds per run (default 5; QUICK: 2)
#   ROUNDS            interleaved rounds (default 3; QUICK: 1)
#   WARMUP            seconds of one warm-up run per scenario before round 1 (default 1; QUICK: 0)
#   QUICK             1: DURATION=2 ROUNDS=1 WARMUP=0 DESCRIPTORS=1 RLQS_DURATION=2 unless set
#                     (under a minute; the RLQS rows then show a bucket's first seconds only)
#   ENVOY, SERVICE    1 (default): run the block; 0: skip it
#   CONNECTIONS       wrk connections (default 64)
#   ENVOY_CONCURRENCY Envoy's worker threads (default 2, as Tollgate's workers)
#   STREAMS, KEYS     the load client's connections (default 8) and distinct users (10000)
#   IN_FLIGHT         calls in flight per connection (default 1: every call pays its own read
#                     and write; Envoy multiplexes its calls on one connection per worker:
#                     STREAMS=2 IN_FLIGHT=32 is that shape)
#   DESCRIPTORS       descriptors per call, a list (default "1 4"; QUICK: 1)
#   RLQS_LEASE_MAX    the quota's lease_max (default 1000000: a bucket is assigned twice its
#                     reported rate for TTL + 2 s = 12 s, 240,000 units at 10,000 requests a
#                     second, mostly as refill; docs/src/reference/rls.md says why)
#   RLQS_DURATION     seconds per RLQS run (default 12; QUICK: 2)
#   RLQS_SETTLE       seconds into an RLQS run where the steady-state count starts (default 6,
#                     at most RLQS_DURATION / 2; 0: none)
#   TOLLGATE_BIN      default target/dist/tollgate (cargo build --profile dist --bin tollgate)
#   LOAD_BIN          default target/release/examples/rls_load (cargo build --release --example rls_load)
#   ENVOY_BIN         default target/envoy-venv/bin/envoy (scripts/test --install-only), else `envoy`
#   BUILD             1: build TOLLGATE_BIN and LOAD_BIN's defaults first (default 0)
#   KEEP_TMP          1: keep the temporary directory (configs, logs, raw wrk output)
#
# Needs nginx, wrk, redis-server, redis-cli, curl, envoy; installs nothing. Exit 0 when every
# scenario answered as expected (allow: only 2xx; half: 40-60 % refused; no socket errors; the
# load client without errors), targets met or not; 1 on a missing tool or a setup failure; 2
# when a scenario answered wrong. Everything shares the machine's cores: compare within a run.
set -euo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH="$ROOT/bench"
if [[ ${QUICK:-0} == 1 ]]; then
    DURATION=${DURATION:-2} ROUNDS=${ROUNDS:-1} WARMUP=${WARMUP:-0} DESCRIPTORS=${DESCRIPTORS:-1}
    RLQS_DURATION=${RLQS_DURATION:-2}
fi
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-1}
ENVOY=${ENVOY:-1}
SERVICE=${SERVICE:-1}
CONNECTIONS=${CONNECTIONS:-64}
ENVOY_CONCURRENCY=${ENVOY_CONCURRENCY:-2}
STREAMS=${STREAMS:-8}
IN_FLIGHT=${IN_FLIGHT:-1}
KEYS=${KEYS:-10000}
DESCRIPTORS=${DESCRIPTORS:-1 4}
# Envoy starts an assignment's token bucket only if max_tokens ÷ fill rate is under its host's
# uptime (its monotonic clock); Tollgate's shape keeps that to a few seconds.
UPTIME_S=$(cut -d. -f1 /proc/uptime)
RLQS_LEASE_MAX=${RLQS_LEASE_MAX:-1000000}
RLQS_DURATION=${RLQS_DURATION:-12}
RLQS_SETTLE=${RLQS_SETTLE:-6}
KEEP_TMP=${KEEP_TMP:-0}
TOLLGATE_BIN=${TOLLGATE_BIN:-$ROOT/target/dist/tollgate}
LOAD_BIN=${LOAD_BIN:-$ROOT/target/release/examples/rls_load}
if [[ -z ${ENVOY_BIN:-} ]]; then
    ENVOY_BIN=$ROOT/target/envoy-venv/bin/envoy
    [[ -x $ENVOY_BIN ]] || ENVOY_BIN=$(command -v envoy || echo "$ENVOY_BIN")
fi

log() { printf '[rls] %s\n' "$*" >&2; }
die() {
    printf '[rls] error: %s\n' "$*" >&2
    exit 1
}
for v in DURATION ROUNDS WARMUP CONNECTIONS ENVOY_CONCURRENCY STREAMS KEYS RLQS_LEASE_MAX RLQS_DURATION RLQS_SETTLE; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a whole number (got '${!v}')"
done
((DURATION >= 1 && ROUNDS >= 1 && CONNECTIONS >= 1 && STREAMS >= 1)) ||
    die "DURATION, ROUNDS, CONNECTIONS and STREAMS must be at least 1"
for d in $DESCRIPTORS; do [[ $d =~ ^[1-9][0-9]*$ ]] || die "DESCRIPTORS: '$d' is not a count"; done
((RLQS_DURATION >= 1)) || die "RLQS_DURATION must be at least 1"
((RLQS_SETTLE * 2 <= RLQS_DURATION)) || RLQS_SETTLE=$((RLQS_DURATION / 2))

if [[ ${BUILD:-0} == 1 ]]; then
    (cd "$ROOT" && cargo build --profile dist --bin tollgate && cargo build --release --example rls_load) ||
        die "the build failed"
fi
missing=()
for t in nginx wrk redis-server redis-cli curl; do command -v "$t" >/dev/null || missing+=("$t"); done
((${#missing[@]} == 0)) || die "missing tools: ${missing[*]} (Debian: apt-get install -y nginx wrk redis-server redis-tools curl)"
[[ -x $TOLLGATE_BIN ]] || die "no $TOLLGATE_BIN (cargo build --profile dist --bin tollgate, or TOLLGATE_BIN=...)"
[[ $SERVICE == 0 || -x $LOAD_BIN ]] || die "no $LOAD_BIN (cargo build --release --example rls_load, or LOAD_BIN=...)"
[[ $ENVOY == 0 || -x $ENVOY_BIN ]] || die "no Envoy at $ENVOY_BIN (scripts/test --install-only, or ENVOY_BIN=...)"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-rls.XXXXXX")
chmod 755 "$TMP" # nginx's workers may run as another user
PIDS=()
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill -TERM "${PIDS[i]}" 2>/dev/null; done
    for _ in $(seq 50); do
        local alive=0
        for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
    wait 2>/dev/null
    if [[ $KEEP_TMP == 1 || $rc -ne 0 ]]; then log "logs and configs kept in $TMP"; else rm -rf "$TMP"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# shellcheck source=bench/ports.sh
source "$BENCH/ports.sh"

wait_port() { # PORT PID NAME LOG
    for _ in $(seq 600); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || die "$3 exited at start: $(tail -n 20 "$4" 2>/dev/null)"
        sleep 0.05
    done
    die "$3 did not listen on 127.0.0.1:$1 within 30 s; log: $4"
}
HZ=$(getconf CLK_TCK)
ticks() { # utime + stime of the given pids (none: 0)
    local t=0 p
    for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
    echo "$t"
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR] = $1} END {print (NR ? a[int((NR + 1) / 2)] : "")}'; }
compilers() { ps -eo comm= 2>/dev/null | grep -cE '^(rustc|cargo|cc|cc1|ld|clang|rust-lld)$' || true; }

# ----------------------------------------------------------------------------------------------
# The servers.
# ----------------------------------------------------------------------------------------------
free_port UP_PORT
free_port REDIS_PORT
mkdir -p "$TMP/upstream"
cat >"$TMP/upstream/nginx.conf" <<EOF
worker_processes 1;
pid $TMP/upstream/nginx.pid;
error_log $TMP/upstream/error.log warn;
daemon off;
events { worker_connections 4096; }
http {
    access_log off;
    default_type text/plain;
    keepalive_timeout 120s;
    keepalive_requests 100000000;
    client_body_temp_path $TMP/upstream/body;
    proxy_temp_path $TMP/upstream/proxy;
    fastcgi_temp_path $TMP/upstream/fastcgi;
    uwsgi_temp_path $TMP/upstream/uwsgi;
    scgi_temp_path $TMP/upstream/scgi;
    server { listen 127.0.0.1:$UP_PORT; location / { return 200 "ok\n"; } }
}
EOF
nginx -p "$TMP/upstream" -c "$TMP/upstream/nginx.conf" >"$TMP/upstream/out.log" 2>&1 &
PIDS+=($!)
wait_port "$UP_PORT" "$!" upstream "$TMP/upstream/error.log"

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" \
    >"$TMP/redis.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
wait_port "$REDIS_PORT" "$REDIS_PID" redis "$TMP/redis.log"

declare -A TG_PID TG_PORT TG_ADMIN TG_RLS
start_tollgate() { # NAME STORE-BODY
    local name=$1 port admin rls
    free_port port
    free_port admin
    free_port rls
    cat >"$TMP/tollgate-$name.toml" <<EOF
[server]
listen = "127.0.0.1:$port"
workers = 2

[admin]
listen = "127.0.0.1:$admin"

[store]
$2

[rls]
listen = "127.0.0.1:$rls"

[[rls.domains]]
domain = "bench"

[[rls.domains.descriptors]]
key = "api_key"
rate_limit = { requests_per_unit = 1000000, period = "1s", algorithm = "gcra" }

[[rls.domains.descriptors]]
key = "generic_key"
value = "deny"
rate_limit = { requests_per_unit = 1, period = "1h", algorithm = "gcra" }

[[rls.domains.descriptors]]
key = "user"
rate_limit = { requests_per_unit = 1000000, period = "1s", algorithm = "gcra" }

[[rls.quota]]
name = "bench"
domain = "bench"
match = { route = "api" }
subject = ["key"]
algorithm = "fixed_window"
limit = 1000000000000
period = "1d"
lease_max = $RLQS_LEASE_MAX
assignment_ttl = "10s"

[[routes]]
name = "deny"
path_prefix = "/deny"
upstream = "http://127.0.0.1:$UP_PORT"

[[routes.limits]]
name = "global"
algorithm = "gcra"
limit = 1
period = "1h"
subject = "global"

[[routes]]
name = "api"
path_prefix = "/"
upstream = "http://127.0.0.1:$UP_PORT"

[[routes.limits]]
name = "per-key"
algorithm = "gcra"
limit = 1000000
period = "1s"
subject = "header:x-api-key"
EOF
    RUST_LOG=warn "$BIN" --config "$TMP/tollgate-$name.toml" >"$TMP/tollgate-$name.log" 2>&1 &
    TG_PID[$name]=$!
    PIDS+=("$!")
    TG_PORT[$name]=$port
    TG_ADMIN[$name]=$admin
    TG_RLS[$name]=$rls
    wait_port "$rls" "$!" "tollgate $name" "$TMP/tollgate-$name.log"
    wait_port "$port" "$!" "tollgate $name" "$TMP/tollgate-$name.log"
}

# Run a private copy, so a rebuild during the run cannot swap the binary.
BIN="$TMP/tollgate"
cp "$TOLLGATE_BIN" "$BIN"
start_tollgate mem 'backend = "memory"'
# A store timeout of 500 ms, not 50: on a shared 2-core machine Redis answers late now and
# then, and the service would answer UNAVAILABLE (Envoy's failure_mode_deny: a 500).
start_tollgate redis "backend = \"redis\"
url = \"redis://127.0.0.1:$REDIS_PORT\"
timeout = \"500ms\""

declare -A EV_PID EV_PORT EV_ADMIN
envoy_filter() { # KIND: base, rl, rlqs
    case $1 in
    rl)
        cat <<'EOF'
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: bench
              timeout: 1s
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {cluster_name: rls}
EOF
        ;;
    rlqs)
        cat <<'EOF'
          - name: envoy.filters.http.rate_limit_quota
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
              domain: bench
              rlqs_server:
                envoy_grpc: {cluster_name: rls}
              bucket_matchers:
                matcher_list:
                  matchers:
                  - predicate:
                      single_predicate:
                        input:
                          name: key
                          typed_config:
                            "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                            header_name: x-api-key
                        value_match: {safe_regex: {google_re2: {}, regex: ".+"}}
                    on_match:
                      action:
                        name: rate_limit_quota
                        typed_config:
                          "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                          bucket_id_builder:
                            bucket_id_builder:
                              route: {string_value: api}
                              key:
                                custom_value:
                                  name: key
                                  typed_config:
                                    "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                    header_name: x-api-key
                          reporting_interval: 1s
                          no_assignment_behavior: {fallback_rate_limit: {blanket_rule: DENY_ALL}}
                          expired_assignment_behavior:
                            expired_assignment_behavior_timeout: 60s
                            fallback_rate_limit: {blanket_rule: DENY_ALL}
EOF
        ;;
    esac
}
start_envoy() { # NAME KIND TOLLGATE
    local name=$1 port admin cfg=$TMP/envoy-$1.yaml
    free_port port
    free_port admin
    cat >"$cfg" <<EOF
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: $admin}}
static_resources:
  listeners:
  - name: in
    address: {socket_address: {address: 127.0.0.1, port_value: $port}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: in
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/deny"}
                route:
                  cluster: upstream
                  rate_limits: [{actions: [{generic_key: {descriptor_value: deny}}]}]
              - match: {prefix: "/"}
                route:
                  cluster: upstream
                  rate_limits: [{actions: [{request_headers: {header_name: x-api-key, descriptor_key: api_key}}]}]
          http_filters:
$(envoy_filter "$2")
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: upstream
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $UP_PORT}}}}]}]
  - name: rls
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    load_assignment:
      cluster_name: rls
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: ${TG_RLS[$3]}}}}}]}]
EOF
    "$ENVOY_BIN" -c "$cfg" --concurrency "$ENVOY_CONCURRENCY" --disable-hot-restart \
        --log-level warn --log-path "$TMP/envoy-$name.log" >/dev/null 2>>"$TMP/envoy-$name.log" &
    EV_PID[$name]=$!
    PIDS+=("$!")
    EV_PORT[$name]=$port
    EV_ADMIN[$name]=$admin
}
envoy_ready() { # NAME
    for _ in $(seq 600); do
        [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${EV_ADMIN[$1]}/ready") == 200 ]] && return 0
        kill -0 "${EV_PID[$1]}" 2>/dev/null || die "envoy $1 exited at start: $(tail -n 20 "$TMP/envoy-$1.log")"
        sleep 0.05
    done
    die "envoy $1 not ready within 30 s; log: $TMP/envoy-$1.log"
}
envoy_stat() { # NAME STAT: its value now
    curl -s "http://127.0.0.1:${EV_ADMIN[$1]}/stats?filter=downstream_rq_" |
        awk -F': ' -v k="$2" '$1 == k {print $2 + 0; f = 1} END {if (!f) print 0}'
}

if [[ $ENVOY == 1 ]]; then
    start_envoy base base mem
    start_envoy rl-mem rl mem
    start_envoy rl-redis rl redis
    start_envoy rlqs-mem rlqs mem
    start_envoy rlqs-redis rlqs redis
    for e in base rl-mem rl-redis rlqs-mem rlqs-redis; do envoy_ready "$e"; done
fi

# ----------------------------------------------------------------------------------------------
# Header.
# ----------------------------------------------------------------------------------------------
echo "== bench/rls.sh: Tollgate as Envoy's rate limit service"
echo "date:     $(date -u '+%F %T UTC')"
echo "machine:  $(nproc) cores, $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
echo "load:     $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min, before the run); $(compilers) compiler process(es) running"
echo "tollgate: $TOLLGATE_BIN ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') checked out; the binary's own build may differ)"
[[ $ENVOY == 1 ]] && echo "envoy:    $("$ENVOY_BIN" --version 2>/dev/null | grep -o 'version: [^ ]*' | cut -d/ -f2), --concurrency $ENVOY_CONCURRENCY"
echo "wrk:      -t1 -c$CONNECTIONS -d${DURATION}s, ROUNDS=$ROUNDS WARMUP=${WARMUP}s; load client STREAMS=$STREAMS KEYS=$KEYS DESCRIPTORS='$DESCRIPTORS'"
echo "rlqs:     lease_max $RLQS_LEASE_MAX, assignment_ttl 10s, runs of ${RLQS_DURATION}s, steady state from ${RLQS_SETTLE}s; uptime ${UPTIME_S}s"
if ((UPTIME_S <= 22)); then
    echo "WARNING:  uptime ${UPTIME_S} s ≤ 22 s: Envoy starts assignments empty"
fi
echo

# ----------------------------------------------------------------------------------------------
# 1. Through Envoy.
# ----------------------------------------------------------------------------------------------
RC=0
declare -A RPS P99 BAD CPU_E CPU_T CPU_R STEADY
busy_runs=0
runs=0
# scenario NAME: sets port, wrk args, the pids whose CPU counts, the Envoy (for /stats)
scenario() {
    S_EPID="" S_TPID="" S_RPID="" S_ENVOY="" S_ARGS=(10000)
    case $1 in
    *-half*) S_ARGS=(10000 /deny) ;;
    c1-*) S_ARGS=(1) ;;
    c100-*) S_ARGS=(100) ;;
    esac
    local store=${1##*-}
    case $store in mem | redis) S_TPID=${TG_PID[$store]} ;; esac
    [[ $store == redis ]] && S_RPID=$REDIS_PID
    case $1 in
    a | a-half) S_ENVOY=base ;;
    b-*) S_ENVOY=rl-$store ;;
    c*) S_ENVOY=rlqs-$store ;;
    d-*) S_PORT=${TG_PORT[$store]} ;;
    esac
    if [[ -n $S_ENVOY ]]; then
        S_PORT=${EV_PORT[$S_ENVOY]}
        S_EPID=${EV_PID[$S_ENVOY]}
    fi
}
run_wrk() { # NAME SECONDS RECORD(0/1)
    local name=$1 secs=$2 out=$TMP/wrk-$1.$runs.txt e0 t0 r0 e1 t1 r1 s2 s4 steady=""
    scenario "$name"
    (($(compilers) > 0)) && busy_runs=$((busy_runs + 1))
    runs=$((runs + 1))
    e0=$(ticks $S_EPID) t0=$(ticks $S_TPID) r0=$(ticks $S_RPID)
    wrk -t1 -c"$CONNECTIONS" -d"${secs}s" --latency -s "$BENCH/wrk-keys.lua" \
        "http://127.0.0.1:$S_PORT/" -- "${S_ARGS[@]}" >"$out" 2>&1 &
    local wrk_pid=$!
    if [[ $name == c* && $RLQS_SETTLE -gt 0 ]]; then
        sleep "$RLQS_SETTLE"
        s2=$(envoy_stat "$S_ENVOY" 'http.in.downstream_rq_2xx') s4=$(envoy_stat "$S_ENVOY" 'http.in.downstream_rq_4xx')
    fi
    wait "$wrk_pid" || die "wrk failed on $name: $(tail -n 5 "$out")"
    e1=$(ticks $S_EPID) t1=$(ticks $S_TPID) r1=$(ticks $S_RPID)
    if [[ $name == c* && $RLQS_SETTLE -gt 0 ]]; then
        steady=$(awk -v a="$s2" -v b="$s4" -v c="$(envoy_stat "$S_ENVOY" 'http.in.downstream_rq_2xx')" \
            -v d="$(envoy_stat "$S_ENVOY" 'http.in.downstream_rq_4xx')" \
            'BEGIN {n = (c - a) + (d - b); printf "%.3f", (n > 0 ? 100 * (d - b) / n : 0)}')
    fi
    [[ $3 == 1 ]] || return 0
    local line
    line=$(grep '^WRKRESULT' "$out") || die "no WRKRESULT from wrk on $name: $(tail -n 5 "$out")"
    # shellcheck disable=SC2046 # the line is key=value words
    local $(sed 's/^WRKRESULT //' <<<"$line")
    RPS[$name]+="$(awk -v n="$requests" -v d="$duration_us" 'BEGIN {printf "%.0f", n / (d / 1e6)}') "
    P99[$name]+="$(awk -v p="$p99_us" 'BEGIN {printf "%.2f", p / 1000}') "
    BAD[$name]+="$(awk -v b="$non2xx" -v n="$requests" 'BEGIN {printf "%.3f", n ? 100 * b / n : 0}') "
    local us="awk -v hz=$HZ -v n=$requests"
    CPU_E[$name]+="$($us -v t=$((e1 - e0)) 'BEGIN {printf "%.2f", t / hz * 1e6 / n}') "
    CPU_T[$name]+="$($us -v t=$((t1 - t0)) 'BEGIN {printf "%.2f", t / hz * 1e6 / n}') "
    CPU_R[$name]+="$($us -v t=$((r1 - r0)) 'BEGIN {printf "%.2f", t / hz * 1e6 / n}') "
    [[ -n $steady ]] && STEADY[$name]+="$steady "
    # Checks: allow rows only 2xx; half rows 40-60 % refused; no socket errors anywhere.
    if ((connect + read + write + timeout > 0)); then
        log "$name: socket errors (connect $connect, read $read, write $write, timeout $timeout)"
        RC=2
    fi
    case $name in
    c*) ;;
    b-half* | d-half*) awk -v b="$non2xx" -v n="$requests" 'BEGIN {exit !(b >= 0.4 * n && b <= 0.6 * n)}' ||
        {
            log "$name: $non2xx of $requests refused, not about half"
            RC=2
        } ;;
    *) ((non2xx == 0)) || {
        log "$name: $non2xx of $requests answered non-2xx"
        RC=2
    } ;;
    esac
}

SCENARIOS=(a b-mem b-redis c1-mem c100-mem c1-redis c100-redis d-mem d-redis
    a-half b-half-mem b-half-redis d-half-mem d-half-redis)
if [[ $ENVOY == 1 ]]; then
    log "through Envoy: ${#SCENARIOS[@]} scenarios × (${WARMUP} s + $ROUNDS × $DURATION s)"
    # Sanity: the limits answer as configured before anything is measured.
    for s in b-mem b-redis d-mem d-redis; do
        scenario "$s"
        curl -s -o /dev/null -H 'X-Api-Key: k' "http://127.0.0.1:$S_PORT/deny" # the one admitted
        code=$(curl -s -o /dev/null -w '%{http_code}' -H 'X-Api-Key: k' "http://127.0.0.1:$S_PORT/deny")
        [[ $code == 429 ]] || die "$s: /deny answered $code after its one admitted request, not 429"
        code=$(curl -s -o /dev/null -w '%{http_code}' -H 'X-Api-Key: k' "http://127.0.0.1:$S_PORT/x")
        [[ $code == 200 ]] || die "$s: / answered $code, not 200"
    done
    if ((WARMUP > 0)); then for s in "${SCENARIOS[@]}"; do run_wrk "$s" "$WARMUP" 0; done; fi
    for _ in $(seq "$ROUNDS"); do
        for s in "${SCENARIOS[@]}"; do
            if [[ $s == c* ]]; then run_wrk "$s" "$RLQS_DURATION" 1; else run_wrk "$s" "$DURATION" 1; fi
        done
    done

    echo "-- 1. Through Envoy: medians of $ROUNDS × ${DURATION}s (RLQS rows ${RLQS_DURATION}s), wrk -t1 -c$CONNECTIONS, 10,000 random API keys"
    printf '%-14s %9s %7s %8s %8s | %8s %8s %8s %8s | %s\n' scenario req/s '÷ a' 'p99 ms' 'non-2xx' \
        'Envoy' 'Tollgate' 'Redis' 'all' 'CPU µs per request; RLQS: % decided without an assignment, steady state'
    for s in "${SCENARIOS[@]}"; do
        base=a
        [[ $s == *-half* ]] && base=a-half
        rps=$(median <<<"${RPS[$s]}")
        ce=$(median <<<"${CPU_E[$s]}") ct=$(median <<<"${CPU_T[$s]}") cr=$(median <<<"${CPU_R[$s]}")
        printf '%-14s %9s %6.2f× %8s %7s%% | %8s %8s %8s %8.1f | %s\n' "$s" "$rps" \
            "$(awk -v r="$rps" -v b="$(median <<<"${RPS[$base]}")" 'BEGIN {print r / b}')" \
            "$(median <<<"${P99[$s]}")" "$(median <<<"${BAD[$s]}")" "$ce" "$ct" "$cr" \
            "$(awk -v a="$ce" -v b="$ct" -v c="$cr" 'BEGIN {print a + b + c}')" \
            "${STEADY[$s]:+steady $(median <<<"${STEADY[$s]}")% (rounds: ${STEADY[$s]% })}"
    done
    echo "runs with a compiler running: $busy_runs of $runs"
    for g in mem redis; do
        m=$(curl -s "http://127.0.0.1:${TG_ADMIN[$g]}/metrics" | grep -E '^tollgate_rlqs_(units_total|reported_requests_total|assignments_total|refused_total)' | tr '\n' ' ')
        echo "tollgate $g RLQS counters: ${m:-none}"
    done
    echo
fi

# ----------------------------------------------------------------------------------------------
# 2. The service alone.
# ----------------------------------------------------------------------------------------------
if [[ $SERVICE == 1 ]]; then
    declare -A CALLS DESCS TCPU RCPU
    load_run() { # STORE N SECONDS RECORD(0/1)
        local g=$1 n=$2 t0 r0 t1 r1 line
        t0=$(ticks "${TG_PID[$g]}") r0=$(ticks "$REDIS_PID")
        line=$("$LOAD_BIN" "127.0.0.1:${TG_RLS[$g]}" "$STREAMS" "$3" "$n" "$KEYS" "$IN_FLIGHT") ||
            die "the load client failed on $g"
        t1=$(ticks "${TG_PID[$g]}") r1=$(ticks "$REDIS_PID")
        [[ $4 == 1 ]] || return 0
        # shellcheck disable=SC2046 # the line is key=value words
        local $(sed 's/^RLSLOAD //' <<<"$line")
        local k=$g/$n
        CALLS[$k]+="$(awk -v c="$calls" -v s="$seconds" 'BEGIN {printf "%.0f", c / s}') "
        DESCS[$k]+="$(awk -v c="$descriptors" -v s="$seconds" 'BEGIN {printf "%.0f", c / s}') "
        TCPU[$k]+="$(awk -v t=$((t1 - t0)) -v hz="$HZ" -v d="$descriptors" 'BEGIN {printf "%.2f", t / hz * 1e6 / d}') "
        RCPU[$k]+="$(awk -v t=$((r1 - r0)) -v hz="$HZ" -v d="$descriptors" 'BEGIN {printf "%.2f", t / hz * 1e6 / d}') "
        ((errors + over_limit == 0)) || {
            log "load client on $g: $errors errors, $over_limit over the limit"
            RC=2
        }
    }
    log "the service alone: 2 stores × '$DESCRIPTORS' descriptors × $ROUNDS × $DURATION s"
    if ((WARMUP > 0)); then for g in mem redis; do load_run "$g" 1 "$WARMUP" 0; done; fi
    for _ in $(seq "$ROUNDS"); do
        for n in $DESCRIPTORS; do for g in mem redis; do load_run "$g" "$n" "$DURATION" 1; done; done
    done
    echo "-- 2. The service alone: examples/rls_load, $STREAMS connections, $IN_FLIGHT call(s) in flight each; medians of $ROUNDS × ${DURATION}s"
    printf '%-6s %5s %10s %14s %14s %16s %12s\n' store desc/call calls/s descriptors/s 'Tollgate µs/d' 'd per CPU-second' 'Redis µs/d'
    for n in $DESCRIPTORS; do
        for g in mem redis; do
            k=$g/$n
            ct=$(median <<<"${TCPU[$k]}")
            printf '%-6s %5s %10s %14s %14s %16.0f %12s\n' "$g" "$n" "$(median <<<"${CALLS[$k]}")" \
                "$(median <<<"${DESCS[$k]}")" "$ct" "$(awk -v c="$ct" 'BEGIN {print (c > 0 ? 1e6 / c : 0)}')" \
                "$( [[ $g == redis ]] && median <<<"${RCPU[$k]}" || echo -)"
        done
    done
    echo
fi
echo "load:     $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min, after the run)"
exit "$RC"
