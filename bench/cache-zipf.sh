#!/usr/bin/env bash
# bench/cache-zipf.sh — the cache's eviction policy on a Zipf workload (#54, BENCHMARKS.md
# "Stop 52"): quick_cache (the gateway's memory tier), moka (TinyLFU) and a plain LRU at the
# same capacity, 1M requests over 100k keys, s = 0.9, 1.0, 1.1, capacities of 1 %, 5 %, 10 %;
# hit ratio and ns per request, with Bélády's optimal hit ratio as the bound. ~30 s.
#
#   bash bench/cache-zipf.sh [REQUESTS] [KEYS] [SEED]
#
# bench/cache-zipf/ is a crate of its own (its own workspace and lock file): moka is never a
# dependency of the gateway. Built with `cargo build --release` into target/cache-zipf/.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="$PWD/target/cache-zipf"
cargo build --quiet --release --manifest-path bench/cache-zipf/Cargo.toml
exec "$CARGO_TARGET_DIR/release/cache-zipf" "$@"
