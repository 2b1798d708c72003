#!/usr/bin/env bash
# Builds (if needed) and runs the whole test suite: unit, golden, property and conformance tests.
# Usage: scripts/test.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
[ -f "$BUILD_DIR/build.ninja" ] || scripts/setup.sh "$BUILD_DIR"
cmake --build "$BUILD_DIR" -j"$(nproc)"
# A fresh build has no test times yet: start from the committed ones (tests/ctest_costs.txt, a local run's
# CTestCostData.txt), so that CTest starts the longest tests first instead of finding them last.
costs="$BUILD_DIR/Testing/Temporary/CTestCostData.txt"
[ -f "$costs" ] || { mkdir -p "$(dirname "$costs")" && cp tests/ctest_costs.txt "$costs"; }
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)"
