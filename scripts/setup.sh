#!/usr/bin/env bash
# Installs every Debian package the build needs (idempotent), then configures and builds topocoll.
# Usage: scripts/setup.sh [BUILD_DIR] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
shift || true
PKGS=(build-essential cmake ninja-build pkg-config
      libpugixml-dev libcli11-dev libssl-dev nlohmann-json3-dev libfmt-dev
      libgtest-dev libgmock-dev googletest libbenchmark-dev librapidcheck-dev
      clang libclang-rt-14-dev python3 graphviz openmpi-bin iproute2
      python3-torch libtorch-dev python3-dev pybind11-dev python3-pytest python3-venv python3-setuptools python3-wheel)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-Release} "$@" >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
