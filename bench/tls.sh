#!/usr/bin/env bash
# bench/tls.sh — the edge's TLS: Tollgate against nginx, both terminating TLS with the same
# certificate and proxying to the same upstream (issue 36 §5), on loopback only, bounded in time.
#
#   bash bench/tls.sh                                   # DURATION=5 ROUNDS=3, ECDSA P-256
#   KEY=rsa bash bench/tls.sh                           # the same with an RSA 2048 certificate
#   DURATION=2 ROUNDS=1 SKIP_BUILD=1 BIN=target/debug/tollgate bash bench/tls.sh   # a quick check
#
# What it starts (free ports of 127.0.0.1, one temporary directory, all stopped on exit):
#   upstream   nginx, 1 worker, `return 200` (its own prefix; the system nginx is not touched)
#   nginx      2 workers, `listen ssl http2`, ssl_session_cache shared:SSL:10m, session
#              tickets on, keep-alive to the upstream
#   Tollgate   workers = 2, [server.tls] with the same certificate, one route, no limits
# The certificate: `openssl req -x509` with an ECDSA P-256 key (KEY=ecdsa, default) or RSA 2048
# (KEY=rsa), made in the temporary directory.
#
# Measures, for ROUNDS interleaved rounds (nginx, then Tollgate), medians reported:
#   keepalive   wrk -t1 -c64 against https:// (keep-alive: one handshake per connection)
#   full        wrk -t1 -c64 with `Connection: close`: every request a new TCP connection and a
#               full handshake (wrk does not resume sessions)
#   resumed     openssl s_time -tls1_2 -reuse: one session, resumed on every new connection
#               (TLS 1.2: s_time cannot resume TLS 1.3 sessions)
#               (connections per second; s_time is single-threaded, so both proxies are far from
#               saturated — compare the ratio, not the absolute number)
#   h2          h2load -c64 -m10 over TLS (ALPN h2), when h2load is installed
# and the CPU each proxy spent per request (utime + stime of /proc/PID/stat, all processes).
#
# Environment: DURATION (s per run, default 5), ROUNDS (default 3), KEY (ecdsa|rsa),
# PROFILE (cargo profile, default dist), SKIP_BUILD=1 with BIN=path (an existing binary),
# KEEP=1 (keep the temporary directory).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
KEY=${KEY:-ecdsa}
PROFILE=${PROFILE:-dist}
SKIP_BUILD=${SKIP_BUILD:-0}
BIN=${BIN:-$ROOT/target/$PROFILE/tollgate}
KEEP=${KEEP:-0}
CLK_TCK=$(getconf CLK_TCK)

log() { printf '[tls] %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}
for tool in nginx wrk openssl; do
    command -v "$tool" >/dev/null || die "$tool is needed (apt-get install -y nginx-light wrk openssl)"
done
HAVE_H2LOAD=0
command -v h2load >/dev/null && HAVE_H2LOAD=1

TMP=$(mktemp -d /tmp/tollgate-tls-bench.XXXXXX)
PIDS=()
cleanup() {
    local rc=$?
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    [[ -f $TMP/upstream/nginx.pid ]] && kill "$(cat "$TMP/upstream/nginx.pid")" 2>/dev/null || true
    [[ -f $TMP/nginx/nginx.pid ]] && kill "$(cat "$TMP/nginx/nginx.pid")" 2>/dev/null || true
    if [[ $KEEP == 1 || $rc != 0 ]]; then log "logs and configs kept in $TMP"; else rm -rf "$TMP"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# shellcheck source=bench/ports.sh
source "$(dirname "${BASH_SOURCE[0]}")/ports.sh"
wait_port() {
    for _ in $(seq 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    die "$2 did not listen on 127.0.0.1:$1 within 10 s (logs in $TMP)"
}

if [[ $SKIP_BUILD != 1 ]]; then
    log "cargo build --profile $PROFILE"
    (cd "$ROOT" && cargo build --profile "$PROFILE" --bin tollgate >"$TMP/build.log" 2>&1) ||
        die "cargo build failed (log: $TMP/build.log)"
fi
[[ -x $BIN ]] || die "no tollgate binary at $BIN"

# The certificate both serve.
case $KEY in
ecdsa) openssl ecparam -name prime256v1 -genkey -noout -out "$TMP/key.ec" 2>/dev/null
    openssl pkcs8 -topk8 -nocrypt -in "$TMP/key.ec" -out "$TMP/key.pem" ;;
rsa) openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$TMP/key.pem" 2>/dev/null ;;
*) die "KEY is ecdsa or rsa" ;;
esac
openssl req -x509 -key "$TMP/key.pem" -out "$TMP/cert.pem" -days 2 -subj "/CN=bench.test" \
    -addext "subjectAltName=DNS:bench.test" 2>/dev/null

free_port UP_PORT
free_port NGINX_PORT
free_port TG_PORT
free_port ADMIN_PORT

nginx_conf() { # NAME WORKERS SERVER-BLOCK
    cat <<EOF
worker_processes $2;
pid $TMP/$1/nginx.pid;
error_log $TMP/$1/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $TMP/$1/body;
    proxy_temp_path $TMP/$1/proxy;
    fastcgi_temp_path $TMP/$1/fastcgi;
    uwsgi_temp_path $TMP/$1/uwsgi;
    scgi_temp_path $TMP/$1/scgi;
    keepalive_requests 1000000;
$3
}
EOF
}
mkdir -p "$TMP/upstream" "$TMP/nginx"
nginx_conf upstream 1 "    server { listen 127.0.0.1:$UP_PORT; location / { return 200 \"ok\\n\"; } }" \
    >"$TMP/upstream/nginx.conf"
nginx_conf nginx 2 "    upstream up { server 127.0.0.1:$UP_PORT; keepalive 64; }
    server {
        # \`listen … http2\` rather than \`http2 on\`: Debian's nginx may predate 1.25.1.
        listen 127.0.0.1:$NGINX_PORT ssl http2;
        ssl_certificate $TMP/cert.pem;
        ssl_certificate_key $TMP/key.pem;
        ssl_session_cache shared:SSL:10m;
        ssl_session_tickets on;
        # Debian's nginx 1.22 offers TLS 1.0-1.2 unless told: without this line nginx would be
        # measured on TLS 1.2 against Tollgate's TLS 1.3.
        ssl_protocols TLSv1.2 TLSv1.3;
        location / {
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }
    }" >"$TMP/nginx/nginx.conf"
nginx -p "$TMP/upstream" -c "$TMP/upstream/nginx.conf" -e "$TMP/upstream/error.log" ||
    die "the upstream nginx did not start"
wait_port "$UP_PORT" upstream
nginx -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -e "$TMP/nginx/error.log" || die "nginx did not start"
wait_port "$NGINX_PORT" nginx

cat >"$TMP/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:$TG_PORT"
workers = 2

[server.tls]
cert = "$TMP/cert.pem"
key = "$TMP/key.pem"

[admin]
listen = "127.0.0.1:$ADMIN_PORT"

[store]
backend = "memory"

[[routes]]
name = "all"
path_prefix = "/"
upstream = "http://127.0.0.1:$UP_PORT"
EOF
RUST_LOG=warn "$BIN" --config "$TMP/gateway.toml" >"$TMP/tollgate.out" 2>"$TMP/tollgate.log" &
PIDS+=($!)
TG_PID=$!
wait_port "$TG_PORT" tollgate

nginx_pids() {
    local master
    master=$(cat "$TMP/nginx/nginx.pid")
    echo "$master" $(pgrep -P "$master" || true)
}
cpu_ticks() {
    local pid
    for pid in "$@"; do cat "/proc/$pid/stat" 2>/dev/null || true; done |
        awk '{ sub(/^.*\) /, ""); t += $12 + $13 } END { printf "%d\n", t }'
}

# run MEASURE PORT -> "requests_per_second cpu_us_per_request"
run() {
    local measure=$1 port=$2 pids t1 t2 n rps out
    if [[ $port == "$NGINX_PORT" ]]; then pids=$(nginx_pids); else pids=$TG_PID; fi
    t1=$(cpu_ticks $pids)
    case $measure in
    keepalive | full)
        local hdr=()
        [[ $measure == full ]] && hdr=(-H "Connection: close")
        out=$(wrk -t1 -c64 -d"${DURATION}s" "${hdr[@]}" "https://127.0.0.1:$port/" 2>&1)
        n=$(awk '/requests in/ { print $1 }' <<<"$out")
        rps=$(awk '/^Requests\/sec/ { print $2 }' <<<"$out")
        ;;
    resumed)
        # TLS 1.2: openssl s_time resumes only TLS 1.2 sessions (with TLS 1.3 it never reads
        # the ticket before closing, so every connection is a full handshake, on both proxies).
        out=$(openssl s_time -connect "127.0.0.1:$port" -tls1_2 -reuse -time "$DURATION" 2>&1 </dev/null || true)
        n=$(awk '/connections in/ && /real/ { print $1; exit }' <<<"$out")
        # s_time prints `*` for a full handshake and `r` for a resumed one: a run that did not
        # resume measured the wrong thing.
        if ! grep -q 'r' <<<"$(grep -E '^[*r]+$' <<<"$out" | tail -1)"; then
            die "openssl s_time did not resume a session on port $port"
        fi
        rps=$(awk -v d="$DURATION" -v n="${n:-0}" 'BEGIN { printf "%.1f", n / d }')
        ;;
    h2)
        out=$(h2load -c64 -m10 -D "$DURATION" "https://127.0.0.1:$port/" 2>&1 || true)
        n=$(awk '/^requests:/ { print $8 }' <<<"$out")
        rps=$(awk '/^finished in/ { gsub(",", ""); print $4 }' <<<"$out")
        ;;
    esac
    t2=$(cpu_ticks $pids)
    awk -v r="${rps:-0}" -v n="${n:-0}" -v dt=$((t2 - t1)) -v hz="$CLK_TCK" 'BEGIN {
        printf "%s %.1f\n", r, (n > 0 ? dt * 1e6 / hz / n : 0) }'
}

MEASURES=(keepalive full resumed)
((HAVE_H2LOAD)) && MEASURES+=(h2)
declare -A RES
for round in $(seq "$ROUNDS"); do
    for m in "${MEASURES[@]}"; do
        for who in nginx tollgate; do
            port=$NGINX_PORT
            [[ $who == tollgate ]] && port=$TG_PORT
            r=$(run "$m" "$port")
            RES[$m.$who]+="$r;"
            log "round $round $m $who: $r (req/s, CPU µs/req)"
        done
    done
done

median() { tr ';' '\n' | awk 'NF' | sort -n | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : 0) }'; }
col() { tr ';' '\n' | awk -v c="$1" 'NF { printf "%s;", $c }'; }
printf '\nTLS (%s certificate), %s rounds of %s s, medians\n\n' "$KEY" "$ROUNDS" "$DURATION"
printf '| measure | nginx req/s | Tollgate req/s | Tollgate / nginx | nginx CPU µs/req | Tollgate CPU µs/req |\n'
printf '|---|---:|---:|---:|---:|---:|\n'
for m in "${MEASURES[@]}"; do
    n_rps=$(col 1 <<<"${RES[$m.nginx]}" | median)
    t_rps=$(col 1 <<<"${RES[$m.tollgate]}" | median)
    n_cpu=$(col 2 <<<"${RES[$m.nginx]}" | median)
    t_cpu=$(col 2 <<<"${RES[$m.tollgate]}" | median)
    ratio=$(awk -v a="$t_rps" -v b="$n_rps" 'BEGIN { printf "%.2f×", (b > 0 ? a / b : 0) }')
    printf '| %s | %s | %s | %s | %s | %s |\n' "$m" "$n_rps" "$t_rps" "$ratio" "$n_cpu" "$t_cpu"
done
