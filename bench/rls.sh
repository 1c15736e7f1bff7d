#!/usr/bin/env bash
# bench/rls.sh — Tollgate as Envoy's rate limit service ([rls]): decisions per second and CPU per
# decision of the service, on the in-process store and on Redis, with a small gRPC load client
# (examples/rls_load.rs: STREAMS connections, one call in flight each, DESCRIPTORS descriptors
# per call over KEYS distinct users). Loopback only, bounded in time, everything stopped on exit.
#
#   bash bench/rls.sh                               # DURATION=10 STREAMS=8 DESCRIPTORS=1
#   DURATION=3 SKIP_BUILD=1 bash bench/rls.sh       # a quick check
#
# CPU per decision: utime + stime ticks of the tollgate process (/proc/PID/stat, all threads)
# before and after the run, divided by the descriptors decided. The client runs on the same
# machine and competes for the same cores: on a 2-core machine the numbers are a floor.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION="${DURATION:-10}"
STREAMS="${STREAMS:-8}"
DESCRIPTORS="${DESCRIPTORS:-1}"
KEYS="${KEYS:-10000}"
PROFILE="${PROFILE:-release}"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cargo build --profile "$PROFILE" --bin tollgate --example rls_load
fi
dir_of() { [ "$1" = dev ] && echo debug || echo "$1"; }
# TOLLGATE_BIN / LOAD_BIN: binaries built elsewhere (e.g. target/dist/tollgate; SKIP_BUILD=1).
bin="${TOLLGATE_BIN:-target/$(dir_of "$PROFILE")/tollgate}"
load="${LOAD_BIN:-target/$(dir_of "$PROFILE")/examples/rls_load}"

tmp="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz="$(getconf CLK_TCK)"

redis_port="$(free_port)"
redis-server --port "$redis_port" --save '' --appendonly no --dir "$tmp" >/dev/null &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done

run() { # NAME STORE_BODY
  local name="$1" store="$2" port cfg pid before after line calls descs secs
  port="$(free_port)"
  cfg="$tmp/$name.toml"
  cat > "$cfg" <<TOML
[server]
listen = "127.0.0.1:0"
[admin]
listen = "127.0.0.1:0"
[store]
$store
[rls]
listen = "127.0.0.1:$port"
[[rls.domains]]
domain = "bench"
[[rls.domains.descriptors]]
key = "user"
rate_limit = { requests_per_unit = 1000000, period = "1s", algorithm = "gcra" }
TOML
  RUST_LOG=warn "$bin" --config "$cfg" > "$tmp/$name.out" 2>&1 &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 100); do grep -q "tollgate listening" "$tmp/$name.out" && break; sleep 0.1; done
  # Warm up (connections, Redis scripts), then measure.
  "$load" "127.0.0.1:$port" "$STREAMS" 1 "$DESCRIPTORS" "$KEYS" >/dev/null
  before="$(ticks "$pid")"
  line="$("$load" "127.0.0.1:$port" "$STREAMS" "$DURATION" "$DESCRIPTORS" "$KEYS")"
  after="$(ticks "$pid")"
  kill "$pid"
  calls="$(sed -E 's/.*calls=([0-9]+).*/\1/' <<<"$line")"
  descs="$(sed -E 's/.*descriptors=([0-9]+).*/\1/' <<<"$line")"
  secs="$(sed -E 's/.*seconds=([0-9.]+).*/\1/' <<<"$line")"
  awk -v n="$name" -v c="$calls" -v d="$descs" -v s="$secs" -v t=$((after - before)) -v hz="$hz" -v line="$line" 'BEGIN {
    cpu = t / hz
    printf "%-8s %10.0f calls/s %10.0f descriptors/s  CPU %.2f s of %.1f s (%.2f cores)  %.1f us CPU per descriptor\n",
      n, c / s, d / s, cpu, s, cpu / s, (d > 0 ? cpu * 1e6 / d : 0)
    print "         " line
  }'
}

echo "bench/rls.sh: DURATION=$DURATION STREAMS=$STREAMS DESCRIPTORS=$DESCRIPTORS KEYS=$KEYS profile=$PROFILE, $(nproc) cores"
run memory 'backend = "memory"'
run redis "backend = \"redis\"
url = \"redis://127.0.0.1:$redis_port\""
