#!/usr/bin/env bash
# topocoll for shared/peers' run_all.sh --own (its README, "Comparing your library"):
#   ../shared/peers/run_all.sh --quick --own-name topocoll --own "$PWD/bench/peers_own.sh {coll} {np} {sizes} {T}"
# Every test: the collectives (allreduce, allgather, reduce_scatter, broadcast: all_reduce_perf, ... through the C
# API) at the requested rank count, the point-to-point ones (pingpong, bw, sendrecv) at 2 ranks; ranks forked by
# topocoll-perf, bound to cores as mpirun binds its ranks at np <= CPUs. TOPOCOLL_PERF_ARGS adds options
# (e.g. "--hosts 2" for NET over loopback).
set -u
if [ $# -ne 4 ]; then
  echo "usage: bench/peers_own.sh COLL NP SIZES T  (called by ../shared/peers/run_all.sh --own, see above)" >&2
  [ "${1:-}" = -h ] || [ "${1:-}" = --help ]
  exit
fi
coll=$1 np=$2 sizes=$3 T=$4
PERF=${TOPOCOLL_PERF:-$(cd "$(dirname "$0")/.." && pwd)/build/topocoll-perf}
case $coll in
  pingpong | bw | sendrecv) exec "$PERF" ${coll}_perf -np 2 -l "$sizes" --target-time "$T" -a 3 ${TOPOCOLL_PERF_ARGS:-} ;;
  allreduce) exec "$PERF" all_reduce_perf -np "$np" -l "$sizes" --target-time "$T" -a 3 ${TOPOCOLL_PERF_ARGS:-} ;;
  allgather) exec "$PERF" all_gather_perf -np "$np" -l "$sizes" --target-time "$T" -a 3 ${TOPOCOLL_PERF_ARGS:-} ;;
  reduce_scatter) exec "$PERF" reduce_scatter_perf -np "$np" -l "$sizes" --target-time "$T" -a 3 ${TOPOCOLL_PERF_ARGS:-} ;;
  # MPI_Bcast and gloo::broadcast have one buffer: run_all.sh reads columns 6-8, so they get the in-place run's.
  broadcast)
    echo "# peers_own.sh: Broadcast in place, as the peers' (columns 6-8 are the in-place run's time, algbw, busbw)"
    "$PERF" broadcast_perf -np "$np" -l "$sizes" --target-time "$T" -a 3 ${TOPOCOLL_PERF_ARGS:-} |
      awk '/^#/ || NF < 13 {print; next} {$6 = $10; $7 = $11; $8 = $12; print}'
    exit "${PIPESTATUS[0]}"
    ;;
  *) exit 0 ;;
esac
