#!/usr/bin/env bash
# Old build against new build, interleaved in one run: for each round, each collective and each rank count, the old
# topocoll-perf then the new one (the order alternates between rounds), sizes from -l; then, per cell, the median
# ratio old time / new time (> 1: the new build is faster) with its range over the rounds, out of place and in place.
#   bench/ab_perf.sh OLD_TOPOCOLL_PERF NEW_TOPOCOLL_PERF [-r ROUNDS] [-l SIZES] [-c "COLLS"] [-p "RANKS"] [-T SECONDS]
# e.g. build an old commit with `git worktree add /tmp/old REV && cmake -S /tmp/old -B /tmp/old/build ...
# --target topocoll_perf`, then bench/ab_perf.sh /tmp/old/build/topocoll-perf build/topocoll-perf -r 5.
set -euo pipefail
OLD=${1:?old topocoll-perf}
NEW=${2:?new topocoll-perf}
shift 2
ROUNDS=3 SIZES=8,1M,64M COLLS="all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf sendrecv_perf" RANKS="2 4"
T=0.15
while [ $# -gt 0 ]; do
  case $1 in
    -r) ROUNDS=$2 ;;
    -l) SIZES=$2 ;;
    -c) COLLS=$2 ;;
    -p) RANKS=$2 ;;
    -T) T=$2 ;;
    *) echo "unknown flag $1 (see the header of $0)"; exit 2 ;;
  esac
  shift 2
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) old=$OLD new=$NEW rounds=$ROUNDS sizes=$SIZES -T $T, load $(cut -d' ' -f1-3 /proc/loadavg)"
for ((round = 1; round <= ROUNDS; round++)); do
  for c in $COLLS; do
    for np in $RANKS; do
      order="old new"
      [ $((round % 2)) = 0 ] && order="new old"
      for which in $order; do
        bin=$OLD
        [ $which = new ] && bin=$NEW
        # sendrecv between 2 ranks only (its pairs are the ring's neighbours at 4 as at 2).
        [ $c = sendrecv_perf ] && [ "$np" != 2 ] && continue
        "$bin" "$c" -np "$np" -l "$SIZES" --target-time "$T" 2>&1 | awk -v r=$round -v c=$c -v np=$np -v w=$which \
          '/^ +[0-9]/ { print r, c, np, w, $1, $6, $10 }' >> "$out/rows"
      done
    done
  done
done
python3 - "$out/rows" <<'EOF'
import collections, statistics, sys
rows = collections.defaultdict(dict)  # (coll, np, size) -> {round: {which: (oop, ip)}}
for line in open(sys.argv[1]):
    r, c, np, w, size, oop, ip = line.split()
    rows[(c, int(np), int(size))].setdefault(int(r), {})[w] = (float(oop), float(ip))
print(f"{'collective':<22}{'ranks':>6}{'bytes':>11}   {'old/new out of place':>24}   {'old/new in place':>24}")
for (c, np, size), rounds in sorted(rows.items()):
    cells = []
    for k in (0, 1):
        ratios = [v["old"][k] / v["new"][k] for v in rounds.values() if "old" in v and "new" in v and v["new"][k] > 0]
        cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f})" if ratios else "-")
    print(f"{c:<22}{np:>6}{size:>11}   {cells[0]:>24}   {cells[1]:>24}")
EOF
