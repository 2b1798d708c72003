#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a bounded time (seconds, default 60).
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTOPOCOLL_BUILD_FUZZ=ON \
  -DTOPOCOLL_BUILD_TESTS=OFF -DTOPOCOLL_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz --target fuzz_topology_xml fuzz_bootstrap_message -j"$(nproc)"
mkdir -p build-fuzz/corpus
cp fuzz/corpus/* build-fuzz/corpus/
./build-fuzz/fuzz/fuzz_topology_xml -max_total_time="$SECS" -max_len=16384 -timeout=20 -rss_limit_mb=4096 \
  -print_final_stats=1 build-fuzz/corpus 2>&1 | tail -n 15
mkdir -p build-fuzz/corpus-bootstrap
./build-fuzz/fuzz/fuzz_bootstrap_message -max_total_time="$(( SECS / 3 + 1 ))" -max_len=4096 -timeout=10 \
  -print_final_stats=1 build-fuzz/corpus-bootstrap 2>&1 | tail -n 6
