#!/usr/bin/env bash
# bench/jwt.sh — what a JWT-keyed limit costs per request with a warm token cache, next to an
# API-key limit (issue #25's benchmark row). Loopback only, bounded in time, in-process store.
#
#   bash bench/jwt.sh                          # DURATION=5 ROUNDS=3: about 40 s after the build
#   DURATION=2 ROUNDS=1 SKIP_BUILD=1 bash bench/jwt.sh
#
# Starts (on free ports of 127.0.0.1, in one temporary directory, all stopped on exit):
#   upstream   the demo upstream (examples/upstream.rs, release build)
#   Tollgate   memory store, 2 workers, two routes with the same limit, never reached:
#              /keys  gcra 1000000 per 1s, subject "header:x-api-key"
#              /jwt   gcra 1000000 per 1s, subject "jwt:sub", jwt = "required", [jwt] HS256 with
#                     the secret in TOLLGATE_BENCH_JWT_SECRET
# Then, for ROUNDS interleaved rounds, `wrk -tTHREADS -cCONNECTIONS -dDURATIONs --latency` on
# /keys with one `X-Api-Key` and on /jwt with one bearer token (HS256, made here with openssl:
# every request after a worker's first is a cache hit, so this is the warm-cache cost: the token
# lookup, the claim read, the hash of the subject). Prints the medians of req/s, p99 and
# Tollgate's CPU per request (utime + stime of /proc/PID/stat around each run ÷ the requests wrk
# counted), and the JWT row's ratio to the API-key row.
#
# Not run when it was written (the helper that added it was asked not to run benchmarks): check
# its first output before quoting it.
# Needs: wrk, openssl, curl, cargo (unless SKIP_BUILD=1 and target/dist/tollgate and target/release/examples/upstream are built).
# Environment: DURATION (5), ROUNDS (3), THREADS (1), CONNECTIONS (64), SKIP_BUILD (0).

set -euo pipefail

DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-1}
CONNECTIONS=${CONNECTIONS:-64}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/target/dist/tollgate"
UPSTREAM="$ROOT/target/release/examples/upstream"
CLK_TCK=$(getconf CLK_TCK)

for tool in wrk openssl curl; do
    command -v "$tool" >/dev/null || { echo "bench/jwt.sh: needs $tool" >&2; exit 1; }
done
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    # Two commands: an example built with the gateway would give it the test-only `test-clock`
    # feature (docs/src/development/index.md, "Tests on injected time").
    cargo build --profile dist --manifest-path "$ROOT/Cargo.toml" --bin tollgate
    cargo build --release --manifest-path "$ROOT/Cargo.toml" --example upstream
fi

TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

# shellcheck source=bench/ports.sh
source "$(dirname "${BASH_SOURCE[0]}")/ports.sh"
wait_http() { # wait_http URL
    for _ in $(seq 200); do
        curl -s -o /dev/null "$1" && return 0
        sleep 0.05
    done
    echo "bench/jwt.sh: $1 never answered" >&2
    exit 1
}

free_port UP_PORT
free_port TG_PORT
free_port TG_ADMIN
"$UPSTREAM" --listen "127.0.0.1:$UP_PORT" >"$TMP/upstream.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$UP_PORT/"

SECRET=$(openssl rand -hex 32)
cat >"$TMP/gateway.toml" <<TOML
[server]
listen = "127.0.0.1:$TG_PORT"
workers = 2

[admin]
listen = "127.0.0.1:$TG_ADMIN"

[store]
backend = "memory"

[jwt]
secret_env = "TOLLGATE_BENCH_JWT_SECRET"
algorithms = ["HS256"]

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
name = "jwt"
path_prefix = "/jwt"
upstream = "http://127.0.0.1:$UP_PORT"
jwt = "required"

[[routes.limits]]
name = "per-user"
algorithm = "gcra"
limit = 1000000
period = "1s"
subject = "jwt:sub"
TOML
TOLLGATE_BENCH_JWT_SECRET=$SECRET RUST_LOG=warn "$BIN" --config "$TMP/gateway.toml" \
    >"$TMP/tollgate.out" 2>"$TMP/tollgate.err" &
TG_PID=$!
PIDS+=("$TG_PID")
wait_http "http://127.0.0.1:$TG_ADMIN/readyz"

b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
HEAD=$(printf '%s' '{"alg":"HS256","typ":"JWT"}' | b64url)
BODY=$(printf '{"sub":"bench-user","exp":%d}' "$(($(date +%s) + 86400))" | b64url)
SIG=$(printf '%s' "$HEAD.$BODY" | openssl dgst -sha256 -hmac "$SECRET" -binary | b64url)
TOKEN="$HEAD.$BODY.$SIG"

declare -A URL HDR
URL[keys]="http://127.0.0.1:$TG_PORT/keys/x"
HDR[keys]="X-Api-Key: bench-key-1"
URL[jwt]="http://127.0.0.1:$TG_PORT/jwt/x"
HDR[jwt]="Authorization: Bearer $TOKEN"
for s in keys jwt; do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "${HDR[$s]}" "${URL[$s]}")
    [[ $code == 200 ]] || { echo "bench/jwt.sh: $s answered $code, expected 200" >&2; exit 2; }
done

ticks() { awk '{ print $14 + $15 }' "/proc/$TG_PID/stat"; }
declare -A RPS P99 CPU
for round in $(seq "$ROUNDS"); do
    for s in keys jwt; do
        t1=$(ticks)
        out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --latency -H "${HDR[$s]}" "${URL[$s]}")
        t2=$(ticks)
        reqs=$(awk '/requests in/ { print $1 }' <<<"$out")
        rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
        p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
        non2xx=$(awk '/Non-2xx/ { print $NF }' <<<"$out")
        [[ -z $non2xx ]] || { echo "bench/jwt.sh: $s: $non2xx non-2xx answers" >&2; exit 2; }
        cpu=$(awk -v t=$((t2 - t1)) -v n="$reqs" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", (n > 0 ? t * 1e6 / hz / n : 0) }')
        RPS[$s]+="$rps " P99[$s]+="$p99 " CPU[$s]+="$cpu "
        echo "round $round $s: $rps req/s, p99 $p99, $cpu µs CPU/request"
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
printf '%-28s %10s %14s  %s\n' "limit (medians of $ROUNDS)" "req/s" "CPU µs/req" "p99 per round"
for s in keys jwt; do
    label=$([[ $s == keys ]] && echo "API key (header:x-api-key)" || echo "JWT jwt:sub, warm cache")
    printf '%-28s %10s %14s  %s\n' "$label" "$(median <<<"${RPS[$s]}")" \
        "$(median <<<"${CPU[$s]}")" "${P99[$s]}"
done
awk -v j="$(median <<<"${RPS[jwt]}")" -v k="$(median <<<"${RPS[keys]}")" \
    'BEGIN { if (k > 0) printf "JWT / API key throughput: %.2fx\n", j / k }'
