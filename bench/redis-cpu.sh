#!/usr/bin/env bash
# Redis CPU per decided request (issue #24 item 4), two ways:
#
#   bash bench/redis-cpu.sh script [REV…]   # the decide script alone, the gateway's batches
#   bash bench/redis-cpu.sh gateway [BIN…]  # release binaries behind wrk, as bench/compare.sh
#
# script: the decide script of each REV (a git revision, or `.` for the working tree: default
#   `.`; a directory: the checkout under it) is assembled as limit/src/store/redis/script.rs does and
#   loaded side by side into one private redis-server; redis-benchmark then sends the batches
#   the gateway sends under the bench's load (mode `r`, Redis TIME; the runs as the REV's
#   script reads them: decimal arguments, or one argument of two-character numbers):
#     allow  one run of BATCH (10) identical requests on 2 keys: gcra per IP + fixed window
#            global (bench/compare.sh's /allow), so each call decides BATCH requests
#     keys   KEYS_BATCH (20) runs of one request each, on as many keys picked among 10,000
#            (`__rand_int__`)
#   (the batch sizes the gateway sends under the bench's load: 0.09 and 0.05 script calls per
#   request, measured with the gateway mode below)
#   For each (shape, REV), ROUNDS interleaved rounds of CALLS calls on CONNS connections; the
#   figure is `INFO cpu` (used_cpu_sys + used_cpu_user) delta ÷ (calls × batch) in µs, plus
#   `INFO commandstats` usec_per_call of EVALSHA (the script's own time, per call). Medians.
#   No build needed: only the Lua files are read. The script's reply is read but not checked.
#   CALLGRIND=1 runs redis-server under valgrind's callgrind and reports its user-space
#   instructions per request instead (CPU times are then meaningless): exact and repeatable
#   whatever else runs on the machine, so the figure to rank Lua levers by on a shared machine
#   (system time — network reads and writes — is not in it). CALLS defaults to 2000 then.
#
# gateway: each BIN (default target/dist/tollgate) behind wrk (-t1 -c64, DURATION s) on the
#   bench's /allow and /keys routes (bench/wrk-keys.lua: 10,000 random API keys) over its own
#   redis-server and an nginx upstream; ROUNDS interleaved rounds; Redis CPU per request (and
#   its system part) and script calls per request from INFO deltas, as bench/compare.sh
#   computes them. Build each binary first (cargo build --profile dist, then copy it away).
#
# Needs redis-server, redis-cli, redis-benchmark (script); plus wrk and nginx (gateway).
set -euo pipefail

MODE=${1:-script}
shift || true
ROUNDS=${ROUNDS:-3}
CALLS_SET=${CALLS:-}
CALLS=${CALLS:-20000}
CONNS=${CONNS:-3}
BATCH=${BATCH:-10}
KEYS_BATCH=${KEYS_BATCH:-20}
DURATION=${DURATION:-5}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

log() { printf '[redis-cpu] %s\n' "$*" >&2; }
die() {
    printf '[redis-cpu] error: %s\n' "$*" >&2
    exit 1
}

TMP=$(mktemp -d /tmp/redis-cpu.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

free_port() {
    local p
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    die "no free port"
}
wait_port() {
    for _ in $(seq 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    die "nothing listens on $1"
}

REDIS_PORT=$(free_port)
CALLGRIND=${CALLGRIND:-0}
VG=()
HZ=()
if [[ $CALLGRIND == 1 ]]; then
    [[ $MODE == script ]] || die "CALLGRIND=1 is for the script mode"
    command -v valgrind >/dev/null || die "valgrind missing"
    VG=(valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.out" --dump-instr=no)
    # Slowed down ~50-fold, Redis's timer work (serverCron, 10 a second by default) would weigh
    # 50 times what it does at full speed: once a second instead.
    HZ=(--hz 1)
    [[ -n ${CALLS_SET:-} ]] || CALLS=${CALLS_CG:-2000}
fi
"${VG[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$TMP" --daemonize no --logfile "$TMP/redis.log" "${HZ[@]}" </dev/null >"$TMP/valgrind.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
log "redis-server pid $REDIS_PID, port $REDIS_PORT (perf record -p $REDIS_PID to profile it)"
for _ in $(seq 10); do (exec 3<>"/dev/tcp/127.0.0.1/$REDIS_PORT") 2>/dev/null && break; sleep 1; done
wait_port "$REDIS_PORT"
rcli() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@"; }
for _ in $(seq 100); do [[ $(rcli PING 2>/dev/null) == PONG ]] && break; sleep 0.05; done

redis_cpu() {
    rcli INFO cpu | tr -d '\r' | awk -F: '$1 == "used_cpu_sys" || $1 == "used_cpu_user" { t += $2 }
        END { printf "%.6f", t }'
}
redis_sys() {
    rcli INFO cpu | tr -d '\r' | awk -F: '$1 == "used_cpu_sys" { printf "%.6f", $2 }'
}
# Script calls so far, and the µs spent inside them.
script_stats() {
    rcli INFO commandstats | tr -d '\r' | awk -F'[:,=]' '
        $1 ~ /^cmdstat_(evalsha|eval|fcall)$/ { c += $3; u += $5 }
        END { printf "%d %d", c, u }'
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# Lua file $2 of revision $1 (`.`: the working tree; a directory: the tree under it). The
# scripts are in limit/src/store/scripts/ since the limiter became its own crate (#35 §4), in
# src/store/scripts/ before.
lua_file() {
    local d
    for d in limit/src/store/scripts src/store/scripts; do
        if [[ $1 == . ]]; then
            cat "$ROOT/$d/$2.lua" 2>/dev/null && return
        elif [[ -d $1 ]]; then
            cat "$1/$d/$2.lua" 2>/dev/null && return
        else
            git -C "$ROOT" show "$1:$d/$2.lua" 2>/dev/null && return
        fi
    done
    return 1
}
# Whether revision $1 is a function library (main.lua: FUNCTION LOAD, FCALL) or a script
# (EVALSHA).
is_library() { lua_file "$1" main >/dev/null 2>&1; }
# The decide script of revision $1, in script.rs's order: the library's body, or the script.
script_source() {
    local f files="state runs response lease decide"
    is_library "$1" && files="state algorithms runs decide quota main"
    for f in $files; do lua_file "$1" "$f"; done
}

if [[ $MODE == script ]]; then
    command -v redis-benchmark >/dev/null || die "redis-benchmark missing (apt-get install redis-tools)"
    [[ $# -gt 0 ]] || set -- .
    # CALL: how each REV's script is called: `EVALSHA <sha>`, or `FCALL <name>` for a library
    # (loaded once under a name of its own, as the gateway does).
    declare -A CALL
    n=0
    for rev in "$@"; do
        n=$((n + 1))
        if is_library "$rev"; then
            { echo "#!lua name=tgbench_$n"; script_source "$rev"; echo "redis.register_function('tgbench_$n', main)"; } >"$TMP/script.lua"
            out=$(rcli -x FUNCTION LOAD REPLACE <"$TMP/script.lua")
            [[ $out == "tgbench_$n" ]] || die "$rev: FUNCTION LOAD said $out"
            CALL[$rev]="FCALL tgbench_$n"
        else
            script_source "$rev" >"$TMP/script.lua"
            sha=$(rcli -x SCRIPT LOAD <"$TMP/script.lua")
            [[ $sha =~ ^[0-9a-f]{40}$ ]] || die "$rev: SCRIPT LOAD said $sha"
            CALL[$rev]="EVALSHA $sha"
        fi
    done
    # Mode r's numbers as the script of $rev reads them: decimal arguments, or (RUN_DIGITS in
    # runs.lua) one argument of two characters per number, '0' + x % 64 then '0' + x / 64.
    declare -A PACKED
    for rev in "$@"; do
        PACKED[$rev]=0
        script_source "$rev" >"$TMP/script.lua"
        grep -q RUN_DIGITS "$TMP/script.lua" && PACKED[$rev]=1
    done
    enc() { # enc NUMBER…: the two-character form
        local x
        for x in "$@"; do printf "\\$(printf %03o $((48 + x % 64)))\\$(printf %03o $((48 + x / 64)))"; done
    }
    # The bench's definitions (what the gateway sends for them).
    GCRA=(gcra 1000000 1000000 1000000 1 0)
    FW=(fw 1000000000 1000000 0 1 0)
    allow_args() { # allow_args PACKED
        local BATCH=$BATCH
        local runs="1 $((BATCH * 16 + 2)) 1 1 2 2"
        [[ $1 == 1 ]] && runs="'$(printf "$(enc $((BATCH * 16 + 2)) 1 1 2 2)")'"
        echo 2 'tollgate:{allow:per-ip:7f000001}:gcra' 'tollgate:{allow:global:0}:fw' "''" r 2 \
            "${GCRA[@]}" "${FW[@]}" "$runs"
    }
    keys_args() { # keys_args PACKED
        local BATCH=$KEYS_BATCH
        local i runs="$BATCH"
        for i in $(seq "$BATCH"); do runs+=" 17 1 $i"; done
        if [[ $1 == 1 ]]; then
            runs=""
            for i in $(seq "$BATCH"); do runs+=$(enc 17 1 "$i"); done
            runs="'$(printf "$runs")'"
        fi
        printf '%s ' "$BATCH"
        for i in $(seq "$BATCH"); do printf 'tollgate:{keys:per-key:__rand_int__}:gcra '; done
        printf "'' r 1 %s %s\n" "${GCRA[*]}" "$runs"
    }
    declare -A CPU USEC INS
    # INS: instructions per request, under callgrind only ("-" otherwise).
    for round in $(seq "$ROUNDS"); do
        for shape in allow keys; do
            for rev in "$@"; do
                rcli FLUSHALL >/dev/null
                eval "args=($(${shape}_args "${PACKED[$rev]}"))"
                # One call to check the script answers.
                # shellcheck disable=SC2086 # CALL is two words
                out=$(rcli ${CALL[$rev]} "${args[@]//__rand_int__/000000000001}" 2>&1 | head -n 3)
                [[ $out == *ERR* ]] && die "$rev $shape: $out"
                read -r c1 u1 <<<"$(script_stats)"
                [[ $CALLGRIND == 1 ]] && callgrind_control -z "$REDIS_PID" >/dev/null
                t1=$(redis_cpu)
                redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c "$CONNS" -n "$CALLS" -r 10000 -q \
                    ${CALL[$rev]} "${args[@]}" >/dev/null
                t2=$(redis_cpu)
                ins=""
                if [[ $CALLGRIND == 1 ]]; then
                    rm -f "$TMP"/cg.out.*
                    callgrind_control -d "$REDIS_PID" >/dev/null
                    ins=$(awk '$1 == "summary:" { print $2 }' "$TMP"/cg.out.*)
                    # CG_KEEP=DIR keeps each profile, for callgrind_annotate.
                    [[ -n ${CG_KEEP:-} ]] && cp "$TMP"/cg.out.* "$CG_KEEP/$shape.$(basename "$rev").$round.cg"
                fi
                read -r c2 u2 <<<"$(script_stats)"
                calls=$((c2 - c1))
                k=$BATCH
                [[ $shape == keys ]] && k=$KEYS_BATCH
                cpu=$(awk -v a="$t1" -v b="$t2" -v n="$calls" -v k="$k" 'BEGIN { printf "%.2f", (b - a) * 1e6 / (n * k) }')
                usec=$(awk -v u="$((u2 - u1))" -v n="$calls" 'BEGIN { printf "%.1f", u / n }')
                ipr=-
                [[ -n $ins ]] && ipr=$(awk -v i="$ins" -v n="$calls" -v k="$k" 'BEGIN { printf "%.0f", i / (n * k) }')
                CPU[$shape $rev]+="$cpu "
                USEC[$shape $rev]+="$usec "
                INS[$shape $rev]+="$ipr "
                log "round $round $shape $rev: $cpu µs Redis CPU per request, $ipr instructions per request, $usec µs per call inside the script ($calls calls)"
            done
        done
    done
    printf '%-6s %-14s %-28s %-8s %-14s %s\n' shape rev "µs Redis CPU / req (rounds)" median "instr. / req" "µs in script / call"
    for shape in allow keys; do
        for rev in "$@"; do
            printf '%-6s %-14s %-28s %-8s %-14s %s\n' "$shape" "$rev" "${CPU[$shape $rev]}" \
                "$(echo "${CPU[$shape $rev]}" | median)" "$(echo "${INS[$shape $rev]}" | median)" \
                "$(echo "${USEC[$shape $rev]}" | median)"
        done
    done
    exit 0
fi

[[ $MODE == gateway ]] || die "mode is script or gateway (got $MODE)"
command -v wrk >/dev/null || die "wrk missing"
command -v nginx >/dev/null || die "nginx missing"
[[ $# -gt 0 ]] || set -- "$ROOT/target/dist/tollgate"

UP_PORT=$(free_port)
mkdir -p "$TMP/up/logs"
cat >"$TMP/up/nginx.conf" <<EOF
pid $TMP/up/nginx.pid;
error_log $TMP/up/error.log warn;
daemon off;
worker_processes 1;
events { worker_connections 4096; }
http {
    access_log off;
    server {
        listen 127.0.0.1:$UP_PORT;
        location / { return 200 "ok\n"; }
    }
}
EOF
nginx -p "$TMP/up" -c "$TMP/up/nginx.conf" </dev/null >/dev/null 2>&1 &
PIDS+=($!)
wait_port "$UP_PORT"

declare -A GW_PORT
i=0
for bin in "$@"; do
    i=$((i + 1))
    cp "$bin" "$TMP/tollgate$i"
    cat >"$TMP/tg$i.toml" <<EOF
[server]
listen = "127.0.0.1:0"

[admin]
listen = "127.0.0.1:0"

[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT"

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
name = "keys"
path_prefix = "/keys"
upstream = "http://127.0.0.1:$UP_PORT"

[[routes.limits]]
name = "per-key"
algorithm = "gcra"
limit = 1000000
period = "1s"
subject = "header:x-api-key"
EOF
    RUST_LOG=warn "$TMP/tollgate$i" --config "$TMP/tg$i.toml" >"$TMP/tg$i.out" 2>"$TMP/tg$i.err" </dev/null &
    PIDS+=($!)
    for _ in $(seq 200); do
        grep -q '^tollgate listening' "$TMP/tg$i.out" 2>/dev/null && break
        sleep 0.05
    done
    GW_PORT[$i]=$(sed -n 's/^tollgate listening proxy=[^ ]*:\([0-9]*\).*/\1/p' "$TMP/tg$i.out" | head -n1)
    [[ -n ${GW_PORT[$i]} ]] || die "gateway $i did not start: $(tail -n 5 "$TMP/tg$i.err")"
    [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${GW_PORT[$i]}/allow") == 200 ]] ||
        die "gateway $i: /allow is not 200"
done

declare -A CPU CALLSPER RPS SYS
for round in $(seq "$ROUNDS"); do
    for shape in allow keys; do
        for i in $(seq "$#"); do
            script=(-s "$ROOT/bench/wrk-report.lua")
            [[ $shape == keys ]] && script=(-s "$ROOT/bench/wrk-keys.lua")
            read -r c1 _ <<<"$(script_stats)"
            t1=$(redis_cpu) s1=$(redis_sys)
            out=$(wrk -t1 -c64 -d"${DURATION}s" "${script[@]}" "http://127.0.0.1:${GW_PORT[$i]}/$shape" 2>&1)
            t2=$(redis_cpu) s2=$(redis_sys)
            read -r c2 _ <<<"$(script_stats)"
            reqs=$(sed -n 's/^WRKRESULT requests=\([0-9]*\).*/\1/p' <<<"$out")
            bad=$(sed -n 's/^WRKRESULT.* non2xx=\([0-9]*\).*/\1/p' <<<"$out")
            [[ -n $reqs && $reqs -gt 0 ]] || die "wrk: $out"
            [[ $bad == 0 ]] || log "warning: $bad non-2xx answers"
            cpu=$(awk -v a="$t1" -v b="$t2" -v n="$reqs" 'BEGIN { printf "%.2f", (b - a) * 1e6 / n }')
            per=$(awk -v c="$((c2 - c1))" -v n="$reqs" 'BEGIN { printf "%.3f", c / n }')
            rps=$(awk -v n="$reqs" -v d="$DURATION" 'BEGIN { printf "%.0f", n / d }')
            sys=$(awk -v a="$s1" -v b="$s2" -v n="$reqs" 'BEGIN { printf "%.2f", (b - a) * 1e6 / n }')
            CPU[$shape $i]+="$cpu " CALLSPER[$shape $i]+="$per " RPS[$shape $i]+="$rps " SYS[$shape $i]+="$sys "
            log "round $round $shape bin$i: $cpu µs Redis CPU per request (system $sys), $per script calls per request, $rps req/s"
        done
    done
done
printf '%-6s %-5s %-30s %-8s %-10s %-12s %s\n' shape bin "µs Redis CPU / request" median "of it sys" "calls / req" "req/s"
for shape in allow keys; do
    for i in $(seq "$#"); do
        printf '%-6s %-5s %-30s %-8s %-10s %-12s %s\n' "$shape" "$i" "${CPU[$shape $i]}" \
            "$(echo "${CPU[$shape $i]}" | median)" "$(echo "${SYS[$shape $i]}" | median)" \
            "$(echo "${CALLSPER[$shape $i]}" | median)" "$(echo "${RPS[$shape $i]}" | median)"
    done
done
