#!/usr/bin/env bash
# Installs a built tree and uses it as a user would, from outside the source and build folders:
#   1. cmake --install into a temporary prefix; no installed file names the source or build folder;
#   2. the CMake consumer (examples/cmake-consumer: find_package, topocoll::c, ::topocoll, ::nccl) and the pkg-config
#      builds of the C and NCCL examples compile against that prefix alone and run correctly at 2 ranks;
#   3. pip installs the Python package into a venv (--system-site-packages, for Debian's torch) and a 2-rank
#      all_reduce runs from another folder; `python -m topocoll --version` runs the CLI;
#   4. with --deb: cpack -G DEB, `apt-get install ./topocoll_*.deb` on this machine (then removed again), and the CLI,
#      a C program against /usr and the Python backend work from it.
# Usage: scripts/install_check.sh [BUILD_DIR] [--deb | --deb-only]
#   (the ctest `install_tree` runs 1-3; CI's `package` stage runs 4 alone, with --deb-only)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
DEB=0 PREFIX_CHECKS=1
[ "${2:-}" = "--deb" ] && DEB=1
[ "${2:-}" = "--deb-only" ] && DEB=1 PREFIX_CHECKS=0
WORK=$(mktemp -d /tmp/topocoll-install.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
PREFIX=$WORK/prefix
export TOPOCOLL_JOB_SECRET=install-check-$$-$RANDOM$RANDOM
step() { echo "---- $*"; }
die() { echo "FAIL: $*" >&2; exit 1; }

# run2 PROGRAM...: 2 ranks of a program that joins with Communicator::initFromEnv (RANK/WORLD_SIZE/MASTER_*), on a
# port the kernel reports free (a random one between 20000 and 40000 once met a connection's port, EADDRINUSE).
run2() {
  local port rc=0
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=1 timeout 60 "$@" > "$WORK/rank1.out" 2>&1 &
  local other=$!
  WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=0 timeout 60 "$@" || rc=1
  wait $other || rc=1
  cat "$WORK/rank1.out"
  return $rc
}

# pyJob DIR WHERE: writes DIR/job.py (a 2-rank all_reduce that checks topocoll came from under WHERE) and enters DIR.
pyJob() {
  mkdir -p "$1" && cd "$1"
  cat > job.py <<EOF
import os, torch, torch.distributed as dist
import topocoll.torch  # noqa: F401
assert topocoll.torch.__file__.startswith("$2"), topocoll.torch.__file__
dist.init_process_group("topocoll")
t = torch.full((1000,), float(dist.get_rank() + 1))
dist.all_reduce(t)
assert t.eq(3.0).all(), t[:4]
print(f"rank {dist.get_rank()}: all_reduce from {os.getcwd()} with {topocoll.torch.__file__}: ok")
dist.destroy_process_group()
EOF
}

if [ $PREFIX_CHECKS = 1 ]; then
step "install into $PREFIX"
cmake --install "$BUILD" --prefix "$PREFIX" > "$WORK/install.log" || { cat "$WORK/install.log"; die "cmake --install"; }
for f in lib/libtopocoll.so.0 lib/libtopocoll_nccl.so lib/topocoll/nccl/libnccl.so.2 bin/topocoll bin/all_reduce_perf \
         include/topocoll/topocoll.h include/topocoll/version.h include/topocoll/nccl_compat/nccl.h \
         lib/cmake/topocoll/topocollConfig.cmake lib/pkgconfig/topocoll.pc; do
  [ -e "$PREFIX/$f" ] || die "the install lacks $f"
done
# Nothing installed points back into the source or build tree (RPATHs, CMake files, .pc files, scripts).
if leaks=$(grep -rlF -e "$ROOT" -e "$BUILD" "$PREFIX" --exclude-dir=doc 2>/dev/null); then
  die "installed files name the source or build folder: $leaks"
fi
"$PREFIX/bin/topocoll" --version

step "CMake consumer against the prefix"
cmake -S "$ROOT/examples/cmake-consumer" -B "$WORK/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PREFIX" > "$WORK/consumer.log" || { cat "$WORK/consumer.log"; die "configure the consumer"; }
cmake --build "$WORK/consumer" > "$WORK/consumer-build.log" || { cat "$WORK/consumer-build.log"; die "build the consumer"; }
cd "$WORK"
export LD_LIBRARY_PATH=$PREFIX/lib  # the consumer's binaries carry no RPATH into the prefix (CMake's default)
consumer/allreduce_c 2
consumer/allreduce_nccl 2
run2 consumer/allreduce_cpp
unset LD_LIBRARY_PATH

step "pkg-config builds against the prefix"
export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
cp -r "$ROOT/examples/c" "$ROOT/examples/nccl" "$WORK/"
make -s -C "$WORK/c" && "$WORK/c/allreduce" 2
make -s -C "$WORK/nccl" && "$WORK/nccl/allreduce_nccl" 2
unset PKG_CONFIG_PATH

if grep -q "TOPOCOLL_BUILD_PYTHON:BOOL=ON" "$BUILD/CMakeCache.txt"; then
  step "pip install into a venv, then a 2-rank all_reduce from another folder"
  python=$(sed -n 's/^TOPOCOLL_PYTHON:FILEPATH=//p' "$BUILD/CMakeCache.txt")
  "$python" -m venv --system-site-packages "$WORK/venv"
  cp -r "$ROOT/python" "$WORK/python-src"  # pip builds in place: keep the checkout clean
  TOPOCOLL_BUILD_DIR=$BUILD "$WORK/venv/bin/pip" install -q --no-build-isolation --no-index "$WORK/python-src" \
    > "$WORK/pip.log" 2>&1 || { cat "$WORK/pip.log"; die "pip install"; }
  pyJob "$WORK/elsewhere" "$WORK/venv/"
  run2 "$WORK/venv/bin/python" job.py
  "$WORK/venv/bin/python" -m topocoll --version
  "$WORK/venv/bin/topocoll" --version
  cd "$WORK"
fi
fi  # PREFIX_CHECKS

if [ $DEB = 1 ]; then
  step "Debian package: cpack, apt-get install, use, remove"
  (cd "$BUILD" && cpack -G DEB > "$WORK/cpack.log" 2>&1) || { cat "$WORK/cpack.log"; die "cpack -G DEB"; }
  deb=$(ls -t "$BUILD"/topocoll_*.deb | head -1)
  dpkg-deb -I "$deb" | sed -n '/Package:/,/Description:/p'
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$deb" > "$WORK/apt.log" 2>&1 ||
    { cat "$WORK/apt.log"; die "apt-get install $deb"; }
  removeDeb() { DEBIAN_FRONTEND=noninteractive $SUDO apt-get purge -y -qq topocoll > /dev/null 2>&1 || true; }
  trap 'removeDeb; rm -rf "$WORK"' EXIT
  /usr/bin/topocoll plan --topo /usr/share/topocoll/topologies/seed-h100-8gpu-8nic-nvswitch.xml --nodes 2 \
    > "$WORK/plan.txt"
  head -3 "$WORK/plan.txt"
  mkdir -p "$WORK/deb-c" && cp "$ROOT/examples/c/allreduce.c" "$WORK/deb-c/"
  cc -O2 "$WORK/deb-c/allreduce.c" $(pkg-config --cflags --libs topocoll) -o "$WORK/deb-c/allreduce"
  "$WORK/deb-c/allreduce" 2
  if [ -d /usr/lib/python3/dist-packages/topocoll ]; then
    pyJob "$WORK/deb-py" /usr/lib/python3/dist-packages/
    run2 /usr/bin/python3 job.py
  fi
fi
echo "install check: ok"
