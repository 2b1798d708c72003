#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a bounded, reproducible amount of work (fixed seed and
# run count, so CI gives the same answer every time). Usage: scripts/fuzz.sh [XML_RUNS] [SEED]
# For open-ended fuzzing: ./build-fuzz/fuzz/fuzz_topology_xml -max_total_time=600 build-fuzz/corpus
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-8000}
SEED=${2:-1}
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTOPOCOLL_BUILD_FUZZ=ON \
  -DTOPOCOLL_BUILD_TESTS=OFF -DTOPOCOLL_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz --target fuzz_topology_xml fuzz_bootstrap_message -j"$(nproc)"
rm -rf build-fuzz/corpus build-fuzz/corpus-bootstrap
mkdir -p build-fuzz/corpus build-fuzz/corpus-bootstrap
cp fuzz/corpus/* build-fuzz/corpus/
./build-fuzz/fuzz/fuzz_topology_xml -seed="$SEED" -runs="$RUNS" -max_len=16384 -timeout=20 -rss_limit_mb=4096 \
  -print_final_stats=1 build-fuzz/corpus 2>&1 | tail -n 6
./build-fuzz/fuzz/fuzz_bootstrap_message -seed="$SEED" -runs=$((RUNS * 200)) -max_len=4096 -timeout=10 \
  -print_final_stats=1 build-fuzz/corpus-bootstrap 2>&1 | tail -n 4
