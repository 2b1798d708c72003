#!/usr/bin/env bash
# Collectives on this machine: topocoll (bench/coll_bench, C API, forked ranks bound to cores) against Open MPI 4.1.4
# and Gloo from ../shared/peers, interleaved round by round with the peers' timing protocol (-T, time = max over
# ranks, out of place, float sum), plus the memory-bandwidth bound (peers' membw). Prints medians over the rounds and
# the per-round ratios (peer time / topocoll time: > 1, topocoll faster).
#
#   bench/coll_bench_compare.sh [-r ROUNDS] [-T SECONDS] [-n "2 4"] [-c allreduce,...] [-l 8,1M,16M] [-o DIR]
set -u
cd "$(dirname "$0")/.."
ROUNDS=3 T=0.2 NS="2 4" COLLS=allreduce SIZES=8,64K,1M,16M,64M OUT=/tmp/topocoll-coll-compare
while getopts "r:T:n:c:l:o:" o; do
  case $o in
    r) ROUNDS=$OPTARG ;;
    T) T=$OPTARG ;;
    n) NS=$OPTARG ;;
    c) COLLS=$OPTARG ;;
    l) SIZES=$OPTARG ;;
    o) OUT=$OPTARG ;;
    *) exit 2 ;;
  esac
done
PB=${PEERS_BUILD:-/tmp/peers-build}
[ -x "$PB/mpi_coll_bench" ] || make -C ../shared/peers BUILD="$PB" > /dev/null || exit 1
mkdir -p "$OUT"
rm -f "$OUT"/rows.txt
echo "# $(date -u), $(nproc) CPUs, load at start: $(cut -d' ' -f1-3 /proc/loadavg)" > "$OUT/env.txt"
# rows: lib n coll round size us
row() { awk -v lib="$1" -v n="$2" -v r="$3" '!/^#/ && NF >= 9 {print lib, n, $NF, r, $1, $6}'; }
for ((r = 1; r <= ROUNDS; r++)); do
  "$PB/membw" -s 64 -r 5 | awk -v r=$r '$1 == "memcpy" && $2 == 1 {print "membw", 1, "memcpy", r, 67108864, $3}' >> "$OUT/rows.txt"
  for n in $NS; do
    for c in ${COLLS//,/ }; do
      mpirun --allow-run-as-root --oversubscribe -np "$n" "$PB/mpi_coll_bench" -c "$c" -l "$SIZES" -T "$T" 2> /dev/null |
        awk -v c=$c '!/^#/ && NF >= 9 {print $0, c}' | row mpi "$n" $r >> "$OUT/rows.txt"
      "$PB/gloo_coll_bench" -n "$n" -p 1 -c "$([ $c = allreduce ] && echo allreduce_fn || echo $c)" -l "$SIZES" -T "$T" 2> /dev/null |
        awk -v c=$c '!/^#/ && NF >= 9 {print $0, c}' | row gloo "$n" $r >> "$OUT/rows.txt"
      build/bench/coll_bench -np "$n" -c "$c" -l "$SIZES" -T "$T" 2> /dev/null | row topocoll "$n" $r >> "$OUT/rows.txt"
    done
  done
done
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/env.txt"
python3 - "$OUT" << 'PY'
import collections, statistics, sys
out = sys.argv[1]
t = collections.defaultdict(dict)
mem = []
for line in open(f"{out}/rows.txt"):
    lib, n, coll, r, size, us = line.split()
    if lib == "membw":
        mem.append(float(us)); continue
    t[(lib, int(n), coll, int(size))][int(r)] = float(us)
print(open(f"{out}/env.txt").read().strip().replace("\n", "; "))
bw = statistics.median(mem) if mem else float("nan")
print(f"\nsingle-thread memcpy (membw, 64 MiB, read + write counted): median {bw:.2f} GB/s\n")
print("| ranks | coll | size | Open MPI us | Gloo us | topocoll us | topocoll busbw GB/s | vs MPI | vs Gloo |")
print("|---:|---|---:|---:|---:|---:|---:|---|---|")
def med(d): return statistics.median(d.values()) if d else float("nan")
def ratio(a, b):
    rs = [a[r] / b[r] for r in a if r in b and b[r] > 0]
    return f"{statistics.median(rs):.2f} ({min(rs):.2f}..{max(rs):.2f})" if rs else "-"
for (lib, n, coll, size) in sorted(k for k in t if k[0] == "topocoll"):
    mine = t[(lib, n, coll, size)]
    f = {"allreduce": 2 * (n - 1) / n, "broadcast": 1, "reduce": 1}.get(coll, (n - 1) / n)
    us = med(mine)
    busbw = size / us / 1e3 * f
    mpi, gloo = t.get(("mpi", n, coll, size), {}), t.get(("gloo", n, coll, size), {})
    print(f"| {n} | {coll} | {size} | {med(mpi):.2f} | {med(gloo):.2f} | {us:.2f} | {busbw:.2f} | {ratio(mpi, mine)} | {ratio(gloo, mine)} |")
PY
