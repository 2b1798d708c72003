#!/usr/bin/env bash
# Collectives side by side on this machine: topocoll (build/topocoll-perf, the C API), Open MPI 4.1.4 and Gloo
# (the peers' harnesses), interleaved in one run: every round, for each rank count and collective, MPI, then Gloo,
# then topocoll, on the same sizes with the peers' timing protocol (-T: time = max over ranks of a back-to-back
# loop, fp32 sum, the peers' size conventions), plus the memory bandwidth (peers' membw) the bound is computed from:
# once at the start of each round (the plot's bound line) and again just before each of topocoll's runs (its "of
# bound" column).
# Writes rows.txt, env.txt, summary.md (medians, ratios per round, the bound) and busbw.svg into the results folder.
#
#   bench/coll_compare.sh -p PEERS_DIR [--quick] [-r ROUNDS] [-T SECONDS] [-l SIZES] [-n "2 4"] [-o RESULTS_DIR]
#                         [-c "allreduce allgather reduce_scatter broadcast"] [--svg FILE]
#
# PEERS_DIR (or env PEERS_DIR) is the peers' folder (shared/peers of the workspace: it is not part of this
# repository, so the script never guesses where it is). Its binaries are built with `make -C PEERS_DIR BUILD=...`
# into PEERS_BUILD (default /tmp/topocoll-peers-build), never inside PEERS_DIR. Results default to
# /tmp/topocoll-coll-compare. --quick: 1 round, T 0.05 s, sizes 8, 1M, 16M, 64M (about 3 minutes on 2 idle cores).
# Open MPI binds its ranks to cores at np <= CPUs; topocoll-perf -np does the same; Gloo's ranks float.
set -u
cd "$(dirname "$0")/.."
ROUNDS=3 T=0.1 OUT=/tmp/topocoll-coll-compare SIZES=8,1K,64K,1M,16M,64M NPS="2 4" SVG=""
COLLS="allreduce allgather reduce_scatter broadcast"
PEERS=${PEERS_DIR:-}
while [ $# -gt 0 ]; do
  case $1 in
    -p) PEERS=$2; shift ;;
    -r) ROUNDS=$2; shift ;;
    -T) T=$2; shift ;;
    -l) SIZES=$2; shift ;;
    -n) NPS=$2; shift ;;
    -o) OUT=$2; shift ;;
    -c) COLLS=$2; shift ;;
    --svg) SVG=$2; shift ;;
    --quick) ROUNDS=1 T=0.05 SIZES=8,1M,16M,64M ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "coll_compare.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$PEERS" ] || [ ! -f "$PEERS/Makefile" ]; then
  echo "coll_compare.sh: give the peers' folder: -p DIR or PEERS_DIR (e.g. ../shared/peers)" >&2
  exit 2
fi
PB=${PEERS_BUILD:-/tmp/topocoll-peers-build}
shared=$(cd "$PEERS/.." && pwd -P)
for d in "$OUT" "$PB"; do  # results and builds stay out of the shared folder that holds the peers
  case $(realpath -m "$d")/ in
    "$shared"/*) echo "coll_compare.sh: $d lies inside $shared: choose a folder outside it" >&2; exit 2 ;;
  esac
done
[ -x "$PB/mpi_coll_bench" ] && [ -x "$PB/gloo_coll_bench" ] && [ -x "$PB/membw" ] ||
  make -C "$PEERS" BUILD="$PB" > /dev/null || exit 1
PERF=${TOPOCOLL_PERF:-build/topocoll-perf}
[ -x "$PERF" ] || { echo "coll_compare.sh: $PERF missing (cmake --build build)" >&2; exit 1; }
MPI=(mpirun --allow-run-as-root --oversubscribe)
mkdir -p "$OUT"
rm -f "$OUT"/rows.txt "$OUT"/*.log
{
  echo "$(date -u) $(uname -r), $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  echo "topocoll $(git rev-parse --short HEAD 2> /dev/null)$(git diff --quiet 2> /dev/null || echo +changes);" \
    "rounds $ROUNDS, T $T s, sizes $SIZES, np $NPS"
  echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  ps -eo pcpu,comm --sort=-pcpu | sed -n 2,4p | tr -s ' ' | paste -sd';'
} > "$OUT/env.txt"

# lib coll np round size time_us busbw (out-of-place columns of nccl-tests rows; topocoll's Broadcast: its in-place
# columns, since MPI_Bcast and gloo::broadcast have one buffer: an out-of-place Broadcast also copies the root's input
# into its output, a copy neither peer makes and the bound's traffic leaves out).
row() {
  local t=6 b=8
  [ "$1" = topocoll ] && [ "$2" = broadcast ] && t=10 b=12
  grep -v '^#' | awk -v lib="$1" -v c="$2" -v np="$3" -v r="$4" -v t=$t -v b=$b \
    'NF >= 9 {print lib, c, np, r, $1, $t, $b}'
}
perfname() { case $1 in allreduce) echo all_reduce_perf ;; allgather) echo all_gather_perf ;;
  reduce_scatter) echo reduce_scatter_perf ;; broadcast) echo broadcast_perf ;; esac; }
# membw's memcpy rates (1 and 2 threads, 64 MiB) as rows of round $1, tagged with "np coll" ($2) when given.
membw_rows() {
  "$PB/membw" -s 64 -r 5 2>> "$OUT/errors.log" |
    awk -v r="$1" -v tag="${2:-}" \
      '$1 == "memcpy" {print "membw memcpy", $2, r, 67108864, $3 (tag == "" ? "" : " " tag)}' >> "$OUT/rows.txt"
}
for ((r = 1; r <= ROUNDS; r++)); do
  membw_rows "$r"
  for np in $NPS; do
    for c in $COLLS; do
      timeout 300 "${MPI[@]}" -np "$np" "$PB/mpi_coll_bench" -c "$c" -l "$SIZES" -T "$T" 2>> "$OUT/errors.log" |
        row mpi "$c" "$np" "$r" >> "$OUT/rows.txt"
      timeout 300 "$PB/gloo_coll_bench" -n "$np" -c "$([ "$c" = allreduce ] && echo allreduce_fn || echo "$c")" \
        -l "$SIZES" -T "$T" 2>> "$OUT/errors.log" | row gloo "$c" "$np" "$r" >> "$OUT/rows.txt"
      # The memory rate again just before topocoll's run: its "of bound" uses this one (the VM's rate moves by 2x
      # within seconds; the round's first measurement can be minutes away).
      membw_rows "$r" "$np $c"
      timeout 300 "$PERF" "$(perfname "$c")" -np "$np" -l "$SIZES" --target-time "$T" -a 3 2>> "$OUT/errors.log" |
        row topocoll "$c" "$np" "$r" >> "$OUT/rows.txt"
    done
  done
done
{
  echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  ps -eo pcpu,comm --sort=-pcpu | sed -n 2,4p | tr -s ' ' | paste -sd';'
} >> "$OUT/env.txt"
python3 bench/coll_summary.py "$OUT" ${SVG:+--svg "$SVG"} | tee "$OUT/summary.md"
