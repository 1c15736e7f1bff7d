#!/usr/bin/env bash
# bench/tls-instructions.sh — what a TLS handshake and a TLS request cost the gateway in
# instructions (issue 36 §4: the crypto provider chosen by measurement), for one or more
# binaries, counted by valgrind's callgrind over the gateway process alone.
#
#   BINS="ring=/path/tollgate-ring aws-lc=/path/tollgate-awslc" bash bench/tls-instructions.sh
#   N=20 KEYS=ecdsa BINS="debug=target/debug/tollgate" bash bench/tls-instructions.sh  # a check
#
# Why instructions, and why callgrind: on a shared machine wall time and CPU time move with the
# neighbours' load; the instructions the gateway executes for N handshakes do not. `perf stat -e
# instructions` needs a hardware counter, which a virtual machine often does not expose (perf
# answers `<not supported>`); callgrind counts in software (slowly: the gateway runs ~50× slower
# under it, which changes no count). Each phase is delimited with `callgrind_control -z` (zero)
# and `-d` (dump), so start-up is not counted.
#
# For each KEY (ecdsa: P-256; rsa: 2048) and each binary, one gateway (workers = 1, TLS, one
# route to a local nginx `return 200`), and three phases:
#   full       N connections, each a full TLS 1.3 handshake and one `GET` (openssl s_client)
#   resumed    N connections resuming one TLS 1.2 session (s_client -sess_in; each checked
#              `Reused`), one `GET` each
#   resumed13  N connections each resuming the TLS 1.3 ticket the one before received (PSK
#              with ECDHE, as browsers and wrk resume; each checked `Reused`), one `GET` each
#   keepalive  N `GET`s on keep-alive connections (wrk -c1 for a fixed time; its count is used)
# Printed per phase: instructions per connection (or per request), from the gateway's totals.
#
# Environment: BINS (label=path …; default release=target/release/tollgate), KEYS (default
# "ecdsa rsa"), N (default 200), KEEP=1 (keep the temporary directory).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BINS=${BINS:-release=$ROOT/target/release/tollgate}
KEYS=${KEYS:-ecdsa rsa}
N=${N:-200}
KEEP=${KEEP:-0}

log() { printf '[tls-instructions] %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}
for tool in nginx wrk openssl valgrind callgrind_control; do
    command -v "$tool" >/dev/null || die "$tool is needed (apt-get install -y nginx-light wrk openssl valgrind)"
done

TMP=$(mktemp -d /tmp/tollgate-tls-instructions.XXXXXX)
PIDS=()
cleanup() {
    local rc=$?
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    [[ -f $TMP/upstream/nginx.pid ]] && kill "$(cat "$TMP/upstream/nginx.pid")" 2>/dev/null || true
    if [[ $KEEP == 1 || $rc != 0 ]]; then log "logs kept in $TMP"; else rm -rf "$TMP"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# shellcheck source=bench/ports.sh
source "$(dirname "${BASH_SOURCE[0]}")/ports.sh"
wait_port() {
    for _ in $(seq 1200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    die "$2 did not listen on 127.0.0.1:$1 within 60 s (logs in $TMP)"
}

free_port UP_PORT
mkdir -p "$TMP/upstream"
cat >"$TMP/upstream/nginx.conf" <<EOF
worker_processes 1;
pid $TMP/upstream/nginx.pid;
error_log $TMP/upstream/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $TMP/upstream/body;
    proxy_temp_path $TMP/upstream/proxy;
    fastcgi_temp_path $TMP/upstream/fastcgi;
    uwsgi_temp_path $TMP/upstream/uwsgi;
    scgi_temp_path $TMP/upstream/scgi;
    keepalive_requests 1000000;
    server { listen 127.0.0.1:$UP_PORT; location / { return 200 "ok\n"; } }
}
EOF
nginx -p "$TMP/upstream" -c "$TMP/upstream/nginx.conf" -e "$TMP/upstream/error.log" ||
    die "the upstream nginx did not start"
wait_port "$UP_PORT" upstream

REQ=$'GET / HTTP/1.1\r\nHost: bench.test\r\nConnection: close\r\n\r\n'

# The instructions callgrind counted for PID since the last zeroing (dumps and reads them).
dump() {
    local pid=$1 label=$2
    callgrind_control -d "$label" "$pid" >/dev/null 2>&1
    sleep 1
    # Each dump file's `summary:` (or `totals:`) line is its event count (Ir).
    local f
    f=$(ls -t "$TMP"/callgrind.out."$pid".* 2>/dev/null | head -1)
    [[ -n $f ]] || die "no callgrind dump for $pid"
    awk '/^(summary|totals):/ { print $2; exit }' "$f"
}

printf '%-8s %-6s %-10s %16s %8s\n' binary key phase instructions/op ops
for key in $KEYS; do
    case $key in
    ecdsa) openssl ecparam -name prime256v1 -genkey -noout -out "$TMP/key.ec" 2>/dev/null
        openssl pkcs8 -topk8 -nocrypt -in "$TMP/key.ec" -out "$TMP/$key.key" ;;
    rsa) openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$TMP/$key.key" 2>/dev/null ;;
    *) die "KEYS are ecdsa and/or rsa" ;;
    esac
    openssl req -x509 -key "$TMP/$key.key" -out "$TMP/$key.pem" -days 2 -subj "/CN=bench.test" \
        -addext "subjectAltName=DNS:bench.test" 2>/dev/null
    for entry in $BINS; do
        label=${entry%%=*}
        bin=${entry#*=}
        [[ -x $bin ]] || die "no binary at $bin ($label)"
        free_port TG_PORT
        free_port ADMIN_PORT
        cat >"$TMP/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:$TG_PORT"
workers = 1

[server.tls]
cert = "$TMP/$key.pem"
key = "$TMP/$key.key"

[admin]
listen = "127.0.0.1:$ADMIN_PORT"

[store]
backend = "memory"

[[routes]]
name = "all"
path_prefix = "/"
upstream = "http://127.0.0.1:$UP_PORT"
EOF
        (cd "$TMP" && RUST_LOG=warn exec valgrind --tool=callgrind --callgrind-out-file="$TMP/callgrind.out.%p" \
            "$bin" --config "$TMP/gateway.toml" >"$TMP/$label-$key.out" 2>"$TMP/$label-$key.log") &
        pid=$!
        PIDS+=("$pid")
        wait_port "$TG_PORT" "tollgate ($label) under valgrind"
        # Warm up (a first handshake loads and initialises what later ones reuse).
        printf '%s' "$REQ" | openssl s_client -connect "127.0.0.1:$TG_PORT" -servername bench.test \
            -quiet >/dev/null 2>&1 || true

        callgrind_control -z "$pid" >/dev/null 2>&1
        for _ in $(seq "$N"); do
            printf '%s' "$REQ" | openssl s_client -connect "127.0.0.1:$TG_PORT" -servername bench.test \
                -tls1_3 -quiet >/dev/null 2>&1 || true
        done
        ir=$(dump "$pid" full)
        printf '%-8s %-6s %-10s %16d %8d\n' "$label" "$key" full $((ir / N)) "$N"

        printf '%s' "$REQ" | openssl s_client -connect "127.0.0.1:$TG_PORT" -servername bench.test \
            -tls1_2 -sess_out "$TMP/session" >/dev/null 2>&1 </dev/null || true
        callgrind_control -z "$pid" >/dev/null 2>&1
        reused=0
        for _ in $(seq "$N"); do
            out=$(printf '%s' "$REQ" | openssl s_client -connect "127.0.0.1:$TG_PORT" -servername bench.test \
                -tls1_2 -sess_in "$TMP/session" -ign_eof 2>/dev/null || true)
            [[ $out == *Reused,* ]] && reused=$((reused + 1))
        done
        ir=$(dump "$pid" resumed)
        ((reused == N)) || log "$label $key: only $reused of $N connections resumed"
        printf '%-8s %-6s %-10s %16d %8d\n' "$label" "$key" resumed $((ir / N)) "$reused"

        # TLS 1.3 resumption (PSK with (EC)DHE, what browsers and wrk do): each connection
        # resumes the ticket the previous one received (s_client writes the last one it got).
        printf '%s' "$REQ" | openssl s_client -connect "127.0.0.1:$TG_PORT" -servername bench.test \
            -tls1_3 -sess_out "$TMP/session13" -ign_eof >/dev/null 2>&1 </dev/null || true
        callgrind_control -z "$pid" >/dev/null 2>&1
        reused=0
        for _ in $(seq "$N"); do
            out=$(printf '%s' "$REQ" | openssl s_client -connect "127.0.0.1:$TG_PORT" -servername bench.test \
                -tls1_3 -sess_in "$TMP/session13" -sess_out "$TMP/session13" -ign_eof 2>/dev/null || true)
            [[ $out == *Reused,* ]] && reused=$((reused + 1))
        done
        ir=$(dump "$pid" resumed13)
        ((reused == N)) || log "$label $key: only $reused of $N TLS 1.3 connections resumed"
        printf '%-8s %-6s %-10s %16d %8d\n' "$label" "$key" resumed13 $((ir / N)) "$reused"

        callgrind_control -z "$pid" >/dev/null 2>&1
        out=$(wrk -t1 -c1 -d5s "https://127.0.0.1:$TG_PORT/" 2>&1)
        ir=$(dump "$pid" keepalive)
        n=$(awk '/requests in/ { print $1 }' <<<"$out")
        ((n > 0)) || die "wrk made no request: $out"
        printf '%-8s %-6s %-10s %16d %8d\n' "$label" "$key" keepalive $((ir / n)) "$n"

        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        rm -f "$TMP"/callgrind.out."$pid"*
    done
done
