#!/usr/bin/env bash
# topocoll for shared/peers' run_all.sh --own (its README, "Comparing your library"):
#   ../shared/peers/run_all.sh --quick --own-name topocoll --own "$PWD/bench/peers_own.sh {coll} {np} {sizes} {T}"
# Point-to-point tests only (pingpong, bw, sendrecv: 2 ranks forked by topocoll-perf, bound to cores as mpirun binds
# its ranks); the collectives print nothing until the collectives land. TOPOCOLL_PERF_ARGS adds options
# (e.g. "--hosts 2" for NET over loopback).
set -u
coll=$1 np=$2 sizes=$3 T=$4
PERF=${TOPOCOLL_PERF:-$(cd "$(dirname "$0")/.." && pwd)/build/topocoll-perf}
case $coll in
  pingpong | bw | sendrecv) exec "$PERF" ${coll}_perf -np 2 -l "$sizes" -T "$T" -a 3 ${TOPOCOLL_PERF_ARGS:-} ;;
  *) exit 0 ;;
esac
