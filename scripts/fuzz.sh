#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (the whole library instrumented, ASan + UBSan) and runs each on a copy of
# its seed corpus (fuzz/corpus/<dir>), after replaying every input that once crashed it (fuzz/regressions/<dir>).
#   scripts/fuzz.sh [RUNS] [SEED]        bounded and reproducible (CI): fixed seed, RUNS x each target's weight
#   scripts/fuzz.sh --time SECONDS       open-ended: each target for SECONDS, corpora kept in <build>/corpus
# FUZZ_BUILD names the build directory (default build-fuzz; CI shares its sanitizer build, configured with
# -DTOPOCOLL_BUILD_FUZZ=ON). FUZZ_JOBS > 1 runs that many fuzzing processes per target (open-ended runs).
# A crash stops the script with the input saved as <build>/crashes/<target>-crash-*: fix the bug, then add the
# input to fuzz/regressions/<dir>/ so that every later run replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=runs
if [ "${1:-}" = "--time" ]; then
  MODE=time
  SECONDS_EACH=${2:?seconds}
else
  RUNS=${1:-4000}
  SEED=${2:-1}
fi
# target:corpus dir:weight (runs per RUNS; cheap parsers run more):max_len
TARGETS=(fuzz_topology_xml:topology:1:16384 fuzz_graph_xml:graph:4:16384 fuzz_knobs:knobs:20:2048
         fuzz_bootstrap_message:bootstrap:100:4096 fuzz_root_registration:registration:100:4096
         fuzz_c_api:c_api:10:1024 fuzz_transport_wire:transport:20:40000 fuzz_auth_handshake:auth:50:512)
B=${FUZZ_BUILD:-build-fuzz}
JOBS=${FUZZ_JOBS:-1}
if [ ! -f "$B/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTOPOCOLL_BUILD_FUZZ=ON \
    -DTOPOCOLL_BUILD_TESTS=OFF -DTOPOCOLL_BUILD_BENCH=OFF > /dev/null
fi
grep -q "TOPOCOLL_BUILD_FUZZ:BOOL=ON" "$B/CMakeCache.txt" || { echo "$B is not configured with TOPOCOLL_BUILD_FUZZ=ON"; exit 2; }
names=()
for t in "${TARGETS[@]}"; do names+=("${t%%:*}"); done
cmake --build "$B" --target "${names[@]}" -j"$(nproc)"
mkdir -p "$B/corpus" "$B/crashes"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in "${TARGETS[@]}"; do
  IFS=: read -r name dir weight maxlen <<< "$t"
  bin=$B/fuzz/$name
  if compgen -G "fuzz/regressions/$dir/*" > /dev/null; then
    "$bin" -runs=1 fuzz/regressions/$dir/* > "$B/$name.regressions.log" 2>&1 ||
      { echo "$name: a regression input crashes again ($B/$name.regressions.log)"; exit 1; }
  fi
  # Open-ended runs may share the machine: an input that takes 3 s alone can take 20 under load.
  args=(-max_len="$maxlen" -timeout=$([ $MODE = runs ] && echo 20 || echo 120) -rss_limit_mb=4096 -print_final_stats=1
        -artifact_prefix="$B/crashes/$name-")
  if [ $MODE = runs ]; then
    rm -rf "$B/corpus/$dir"
    cp -r "fuzz/corpus/$dir" "$B/corpus/$dir"
    args+=(-seed="$SEED" -runs=$((RUNS * weight)))
  else
    [ -d "$B/corpus/$dir" ] || cp -r "fuzz/corpus/$dir" "$B/corpus/$dir"
    args+=(-max_total_time="$SECONDS_EACH")
    [ "$JOBS" -gt 1 ] && args+=(-fork="$JOBS" -ignore_crashes=0)
  fi
  start=$(date +%s)
  "$bin" "${args[@]}" "$B/corpus/$dir" > "$B/$name.log" 2>&1 ||
    { tail -n 40 "$B/$name.log"; echo "$name: crash ($B/crashes/)"; exit 1; }
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$B/$name.log" | grep -o '[0-9]*$')
  last=$(grep -E '^#[0-9]+' "$B/$name.log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' <<< "$last" | grep -o '[0-9]*')
  ft=$(grep -o 'ft: [0-9]*' <<< "$last" | grep -o '[0-9]*')
  printf '%-24s %9s runs  %6s s  cov %6s  ft %6s  corpus %5s\n' "$name" "$runs" $(($(date +%s) - start)) "$cov" "$ft" \
    "$(ls "$B/corpus/$dir" | wc -l)"
done
