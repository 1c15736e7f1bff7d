#!/usr/bin/env bash
# bench/idle-rss.sh — the gateway's idle memory with the scale block's config (10,000 routes) and
# with one route, read from /proc/PID/status.
#
#   bash bench/idle-rss.sh [BIN ...]            # default: target/release/tollgate
#   RUNS=5 ROUTES=20000 bash bench/idle-rss.sh old/tollgate target/release/tollgate
#
# The configs are compare.sh's scale block's (bench/scale-config.sh): ROUTES dummy routes
# /svcN/api (one GCRA limit each, all to one http:// upstream that is never asked) in front of
# one catch-all route with the /allow limits, and that catch-all route alone. For RUNS interleaved rounds each binary
# starts with each config (port 0, in-process store), and once it prints "tollgate listening"
# it is left idle for SETTLE seconds; then VmRSS, RssAnon and VmHWM (the peak, reached while
# the config is parsed) are read and the gateway is stopped (SIGTERM). Printed: the medians, in
# MB (10^6 bytes), and of the start-up time (until the line, polled every 50 ms). One gateway at
# a time, on 127.0.0.1 only; bounded by RUNS.
set -euo pipefail

RUNS=${RUNS:-3}
ROUTES=${ROUTES:-10000}
SETTLE=${SETTLE:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[[ $# -gt 0 ]] || set -- "$ROOT/target/release/tollgate"

log() { printf '[idle-rss] %s\n' "$*" >&2; }
die() {
    printf '[idle-rss] error: %s\n' "$*" >&2
    exit 1
}
# shellcheck source=bench/ports.sh
source "$ROOT/bench/ports.sh"
# shellcheck source=bench/scale-config.sh
source "$ROOT/bench/scale-config.sh"
for b in "$@"; do [[ -x $b ]] || die "$b is not an executable"; done

TMP=$(mktemp -d)
PID=""
cleanup() {
    [[ -z $PID ]] || kill "$PID" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

free_port UP_PORT # named by the routes, never contacted

scale_config 0 0 0 >"$TMP/one.toml"
scale_config 0 0 "$ROUTES" >"$TMP/many.toml"
log "$ROUTES routes: $(wc -c <"$TMP/many.toml") bytes of config; $RUNS rounds, ${SETTLE}s idle each"

status_kb() { # status_kb PID FIELD -> kB
    awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"
}

# measure BIN CONFIG -> "VmRSS RssAnon VmHWM" in kB, then the start-up time in ms
measure() {
    local out="$TMP/out" err="$TMP/err" t0=$EPOCHREALTIME t1
    RUST_LOG=warn "$1" --config "$2" >"$out" 2>"$err" </dev/null &
    PID=$!
    for _ in $(seq 1200); do # 60 s
        grep -q '^tollgate listening' "$out" 2>/dev/null && break
        kill -0 "$PID" 2>/dev/null || die "$1 exited at start: $(tail -n 20 "$err")"
        sleep 0.05
    done
    grep -q '^tollgate listening' "$out" || die "$1 did not start within 60 s"
    t1=$EPOCHREALTIME
    sleep "$SETTLE"
    echo "$(status_kb "$PID" VmRSS) $(status_kb "$PID" RssAnon) $(status_kb "$PID" VmHWM)" \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%d", (b - a) * 1000 }')"
    kill -TERM "$PID"
    wait "$PID" || true
    PID=""
}

median() { sort -n | awk '{ v[NR] = $1 } END { printf "%.1f", v[int((NR + 1) / 2)] / 1000 }'; }

declare -A SAMPLES
for round in $(seq "$RUNS"); do
    for b in "$@"; do
        for cfg in many one; do
            s=$(measure "$b" "$TMP/$cfg.toml")
            SAMPLES["$b $cfg"]+="$s"$'\n'
            log "round $round: $b $cfg: $s (kB: VmRSS RssAnon VmHWM; start ms)"
        done
    done
done

printf '\n%-40s %-7s %9s %9s %9s %9s   (MB, s; medians of %d)\n' binary routes VmRSS RssAnon VmHWM start "$RUNS"
for b in "$@"; do
    for cfg in many one; do
        n=$ROUTES
        [[ $cfg == one ]] && n=1
        col() { printf '%s' "${SAMPLES["$b $cfg"]}" | awk -v c="$1" 'NF { print $c }' | median; }
        printf '%-40s %-7s %9s %9s %9s %9s\n' "$b" "$n" "$(col 1)" "$(col 2)" "$(col 3)" "$(col 4)"
    done
done
