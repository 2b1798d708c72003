#!/usr/bin/env bash
# Builds (if needed) and runs the whole test suite: unit, golden, property and conformance tests.
# Usage: scripts/test.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
[ -f "$BUILD_DIR/build.ninja" ] || scripts/setup.sh "$BUILD_DIR"
cmake --build "$BUILD_DIR" -j"$(nproc)"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)"
