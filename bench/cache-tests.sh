#!/usr/bin/env bash
# The HTTP Working Group's cache test suite (http-tests/cache-tests) against Tollgate with a
# caching route and against nginx with the suite's own nginx config (docker/nginx/nginx.conf),
# side by side on loopback (#54): the number of tests each passes, and the tests nginx passes
# that Tollgate does not.
#
#   bench/cache-tests.sh                 # suite from $CACHE_TESTS_DIR, else a git clone
#   CACHE_TESTS_DIR=/path/to/cache-tests bench/cache-tests.sh
#   TOLLGATE_BIN=target/release/tollgate bench/cache-tests.sh
#
# The suite runs as a client against a proxy in front of its own test server (node); its node
# packages come from npm (`npm install` in a copy under target/cache-tests). Results (the
# suite's JSON, one per cache) are left in target/cache-tests/results/.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
work="$root/target/cache-tests"
suite="$work/suite"
results="$work/results"
bin="${TOLLGATE_BIN:-$root/target/debug/tollgate}"
mkdir -p "$work" "$results"

if [[ ! -f "$suite/package.json" ]]; then
  rm -rf "$suite"
  if [[ -n "${CACHE_TESTS_DIR:-}" ]]; then
    cp -r "$CACHE_TESTS_DIR" "$suite"
  else
    git clone --depth 1 https://github.com/http-tests/cache-tests "$suite"
  fi
fi
if [[ ! -d "$suite/node_modules" ]]; then
  (cd "$suite" && npm install --omit=dev --no-audit --no-fund >/dev/null)
fi
[[ -x "$bin" ]] || (cd "$root" && cargo build --bin tollgate)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

wait_port() {
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nothing listens on $1" >&2
  return 1
}

# The suite's server (its state is per test id: one server serves both runs).
origin=$(free_port)
(cd "$suite" && npm_config_port="$origin" npm_config_pidfile="$work/server.pid" \
  npm run --silent server >"$work/server.log" 2>&1) &
pids+=($!)
wait_port "$origin"

run_suite() { # name base-url
  (cd "$suite" && npm run --silent cli --base="$2") >"$results/$1.json"
}

# Tollgate: one route to the suite's server, cached with the defaults.
tg=$(free_port)
cat >"$work/tollgate.toml" <<EOF
[server]
listen = "127.0.0.1:$tg"

[admin]
listen = "127.0.0.1:0"

[store]
backend = "memory"

[[routes]]
name = "cache-tests"
path_prefix = "/"
upstream = "http://127.0.0.1:$origin"

[routes.cache]
EOF
"$bin" --config "$work/tollgate.toml" >"$work/tollgate.log" 2>&1 &
pids+=($!)
wait_port "$tg"
run_suite tollgate "http://127.0.0.1:$tg"

# nginx with the suite's config (its paths moved under $work).
if command -v nginx >/dev/null; then
  ng=$(free_port)
  mkdir -p "$work/nginx/cache/tmp" "$work/nginx/logs"
  cat >"$work/nginx/nginx.conf" <<EOF
daemon off;
worker_processes 1;
error_log $work/nginx/logs/error.log;
pid $work/nginx/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $work/nginx/cache/tmp/body;
  proxy_cache_path $work/nginx/cache levels=1:2 keys_zone=my-cache:8m max_size=1000m inactive=600m;
  proxy_temp_path $work/nginx/cache/tmp;
  server {
    listen 127.0.0.1:$ng;
    location / {
      proxy_pass http://127.0.0.1:$origin;
      proxy_cache my-cache;
      proxy_cache_revalidate on;
      proxy_http_version 1.1;
    }
  }
}
EOF
  rm -rf "$work/nginx/cache/"[0-9a-f]
  nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" &
  pids+=($!)
  wait_port "$ng"
  run_suite nginx "http://127.0.0.1:$ng"
fi

node - "$results" <<'EOF'
const fs = require('fs')
const dir = process.argv[2]
const load = n => { try { return JSON.parse(fs.readFileSync(`${dir}/${n}.json`)) } catch { return null } }
const tg = load('tollgate'), ng = load('nginx')
const passed = r => Object.keys(r).filter(k => r[k] === true)
const total = Object.keys(tg).length
console.log(`cache-tests: ${total} tests`)
console.log(`  tollgate: ${passed(tg).length} passed`)
if (ng) {
  console.log(`  nginx:    ${passed(ng).length} passed`)
  const lost = passed(ng).filter(k => tg[k] !== true)
  const won = passed(tg).filter(k => ng[k] !== true)
  console.log(`  nginx passes, tollgate does not (${lost.length}): ${lost.join(' ')}`)
  console.log(`  tollgate passes, nginx does not (${won.length})`)
}
EOF
